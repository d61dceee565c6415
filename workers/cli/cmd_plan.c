/* cmd_plan.c: `ballast plan`, the layout planner's command line.
 *
 * Lists the feasible (S, T, checkpointing, activation offload, optimizer
 * offload, micro-batch) layouts for a model on a cluster, best first, with
 * the predicted memory per GPU and model TFLOP/s per GPU, and the excluded
 * ones with their reasons; or sweeps the node count (--sweep-nodes); or
 * refits and prints the calibration (--calibrate). The model is plan.c. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "options.h"
#include "workers/cli/cli.h"
#include "workers/plan/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ---- options ---- */

static const char *o_model, *o_gpu, *o_sweep;
static int64_t o_nodes, o_gpn, o_seq, o_top, o_tp;
static uint64_t o_batch;
static double o_net;
static bool o_json, o_show_excluded, o_no_accum, o_published, o_calibrate;
static int o_ckpt, o_aoff, o_ooff;

static const opt_t options[] = {
    { "model", OPT_STRING, NULL, 0, 0, NULL, "preset name or Hugging Face config.json (file or directory)", &o_model },
    { "nodes", OPT_INT, "1", 0, 0, NULL, "nodes in the cluster", &o_nodes },
    { "gpus-per-node", OPT_INT, "8", 0, 0, NULL, "GPUs per node (G)", &o_gpn },
    { "gpu", OPT_STRING, "a100-40gb", 0, 0, NULL, "GPU type: a100-40gb|a100-80gb|h100-80gb|h200-141gb", &o_gpu },
    { "net-gbps", OPT_DOUBLE, "400", 0, 0, NULL, "inter-node network per node, Gb/s (p4d: 4 x 100 EFA = 400)", &o_net },
    { "seq-len", OPT_INT, "4096", 0, 0, NULL, "tokens per sequence", &o_seq },
    { "global-batch-tokens", OPT_SIZE, "4M", 0, 0, NULL, "tokens per optimizer step over the cluster (4M = 4194304)", &o_batch },
    { "tp", OPT_INT, "0", 0, 8, NULL, "only this tensor-parallel degree (0 = try 1, 2, 4, 8)", &o_tp },
    { "ckpt", OPT_ENUM, "any", 0, 0, "any|on|off", "activation checkpointing", &o_ckpt },
    { "act-offload", OPT_ENUM, "any", 0, 0, "any|on|off", "activation offload (needs checkpointing)", &o_aoff },
    { "opt-offload", OPT_ENUM, "any", 0, 0, "any|on|off", "optimizer-state offload", &o_ooff },
    { "no-grad-accum", OPT_BOOL, "false", 0, 0, NULL, "one micro-batch per step (micro-batch = sequences per rank)", &o_no_accum },
    { "published-grid", OPT_BOOL, "false", 0, 0, NULL,
      "the published runs' grid: no accumulation, checkpointing on, no optimizer offload", &o_published },
    { "top", OPT_INT, "10", 0, 1e9, NULL, "feasible layouts to print (0 = all)", &o_top },
    { "show-excluded", OPT_BOOL, "false", 0, 0, NULL, "also print the excluded layouts and why", &o_show_excluded },
    { "sweep-nodes", OPT_STRING, NULL, 0, 0, NULL, "comma-separated node counts: best layout and scaling efficiency per count", &o_sweep },
    { "json", OPT_BOOL, "false", 0, 0, NULL, "print JSON instead of tables", &o_json },
    { "calibrate", OPT_BOOL, "false", 0, 0, NULL, "refit the model's parameters to the published rows and print residuals", &o_calibrate },
};
#define N_OPTIONS (sizeof options / sizeof options[0])

static const char *usage_text =
    "usage: ballast plan --model NAME|config.json --nodes N --gpus-per-node G --gpu TYPE --net-gbps X\n"
    "                    --seq-len T --global-batch-tokens M [--json] [--top K] [--show-excluded]\n"
    "       ballast plan --model NAME ... --sweep-nodes 16,32,64,128\n"
    "       ballast plan --calibrate\n"
    "Predicts memory per GPU and model TFLOP/s per GPU for every parallel layout (docs/plan.md).";

/* ---- helpers ---- */

static const char *yes_no(bool b) { return b ? "yes" : "no"; }

static json_t *layout_json(const plan_result_t *r) {
    const plan_layout_t *l = &r->layout;
    json_t *o = json_pack("{s:i,s:i,s:i,s:b,s:b,s:b,s:i,s:i,s:i}", "S", l->S, "T", l->T, "R", l->R,
                          "ckpt", l->ckpt, "act_offload", l->act_offload, "opt_offload", l->opt_offload,
                          "micro_batch", l->micro_batch, "n_micro", l->n_micro, "seqs_per_rank", l->seqs_per_rank);
    if (r->feasible || r->mem.capacity > 0) {
        const plan_mem_t *m = &r->mem;
        json_object_set_new(o, "memory_gib", json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}",
            "params", m->params / GIB, "grads", m->grads / GIB, "optimizer", m->optim / GIB,
            "activations", m->acts / GIB, "comm_buffers", m->comm / GIB, "overhead", m->overhead / GIB,
            "total", m->total / GIB, "capacity", m->capacity / GIB));
    }
    if (r->feasible) {
        const plan_time_t *t = &r->time;
        json_object_set_new(o, "tflops_per_gpu", json_real(t->tflops));
        json_object_set_new(o, "time_s", json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}",
            "step", t->step, "compute", t->compute, "recompute", t->recompute, "tp_comm", t->tp_comm,
            "shard_comm", t->shard_comm, "replica_comm", t->replica_comm, "offload", t->offload,
            "optimizer", t->optimizer, "exposed", t->exposed));
        json_object_set_new(o, "tokens_per_step", json_real(t->tokens));
    } else {
        json_object_set_new(o, "reason", json_string(r->reason));
    }
    return o;
}

static json_t *cluster_json(const llama_config_t *cfg, const plan_cluster_t *c) {
    return json_pack("{s:s,s:I,s:i,s:i,s:s,s:f,s:i,s:I}", "model", cfg->name,
                     "params", (json_int_t)llama_total_params(cfg), "nodes", c->nodes, "gpus_per_node",
                     c->gpus_per_node, "gpu", c->gpu->name, "net_gbps", c->net_gbps, "seq_len", c->seq_len,
                     "global_batch_tokens", (json_int_t)c->global_batch_tokens);
}

static json_t *params_json(const plan_params_t *p) {
    return json_pack("{s:f,s:f,s:f,s:f}", "gemm_eff", p->gemm_eff, "interference", p->interference,
                     "net_eff", p->net_eff, "net_latency_us", p->net_latency_us);
}

static void print_json(json_t *o) {
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    if (s) { puts(s); free(s); }
    json_decref(o);
}

static void print_table_header(void) {
    printf("%4s %5s %2s %5s %4s %4s %4s %4s %4s  %8s %6s %8s  %7s %6s %6s %6s %6s %6s %7s\n", "rank", "S", "T", "R",
           "ckpt", "aoff", "ooff", "mb", "nmb", "TFLOP/s", "MFU%", "step_s", "params", "grads", "optim", "acts",
           "comm", "ovh", "total");
}

static void print_row(int rank, const plan_result_t *r, const plan_cluster_t *c) {
    const plan_layout_t *l = &r->layout;
    const plan_mem_t *m = &r->mem;
    printf("%4d %5d %2d %5d %4s %4s %4s %4d %4d  %8.2f %6.1f %8.3f  %7.2f %6.2f %6.2f %6.2f %6.2f %6.2f %7.2f\n", rank,
           l->S, l->T, l->R, yes_no(l->ckpt), yes_no(l->act_offload), yes_no(l->opt_offload), l->micro_batch, l->n_micro,
           r->time.tflops, 100.0 * r->time.tflops / c->gpu->bf16_tflops, r->time.step, m->params / GIB,
           m->grads / GIB, m->optim / GIB, m->acts / GIB, m->comm / GIB, m->overhead / GIB, m->total / GIB);
}

/* Parse "16,32,64" into a malloc'd array; -1 with a message on bad input. */
static int parse_node_list(const char *s, int **out, int *n, char *err, size_t errlen) {
    *out = NULL; *n = 0;
    int cap = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1000000 || (*end && *end != ',')) {
            snprintf(err, errlen, "--sweep-nodes: '%s' is not a comma-separated list of positive node counts "
                     "(e.g. 16,32,64,128)", s);
            free(*out); *out = NULL;
            return -1;
        }
        if (*n == cap) {
            cap = cap ? cap * 2 : 8;
            int *nv = realloc(*out, sizeof(int) * (size_t)cap);
            if (!nv) { free(*out); *out = NULL; snprintf(err, errlen, "out of memory"); return -1; }
            *out = nv;
        }
        (*out)[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            snprintf(err, errlen, "--sweep-nodes: '%s' ends with a comma", s);
            free(*out); *out = NULL;
            return -1;
        }
    }
    if (*n == 0) { snprintf(err, errlen, "--sweep-nodes: empty list (e.g. 16,32,64,128)"); return -1; }
    return 0;
}

/* ---- modes ---- */

static int run_calibrate(void) {
    char err[512];
    plan_params_t def = plan_default_params(), fit;
    double obj;
    if (plan_fit(&fit, &obj, err, sizeof err)) { fprintf(stderr, "ballast plan: %s\n", err); return 1; }
    size_t n;
    const plan_published_row_t *rows = plan_published_rows(&n);
    plan_check_t *ch = calloc(n, sizeof *ch);
    if (!ch || plan_check_published(&def, ch, err, sizeof err)) {
        fprintf(stderr, "ballast plan: %s\n", ch ? err : "out of memory");
        free(ch);
        return 1;
    }
    if (o_json) {
        json_t *o = json_pack("{s:o,s:o,s:f}", "defaults", params_json(&def), "refit", params_json(&fit), "objective", obj);
        json_t *a = json_array();
        for (size_t i = 0; i < n; i++) {
            json_t *r = json_pack("{s:s,s:i,s:f,s:i,s:i,s:b,s:f,s:f,s:i}", "model", rows[i].model, "nodes",
                                  rows[i].nodes, "published", rows[i].tflops, "S", rows[i].S, "T", rows[i].T,
                                  "act_offload", rows[i].act_offload, "predicted", ch[i].predicted, "residual",
                                  ch[i].residual, "rank", ch[i].rank);
            json_array_append_new(a, r);
        }
        json_object_set_new(o, "rows", a);
        print_json(o);
    } else {
        printf("parameters in use:  gemm_eff %.4f  interference %.4f  net_eff %.4f  net_latency_us %.3f\n",
               def.gemm_eff, def.interference, def.net_eff, def.net_latency_us);
        printf("refit from scratch: gemm_eff %.6f  interference %.6f  net_eff %.6f  net_latency_us %.6f  (objective %.6f)\n\n",
               fit.gemm_eff, fit.interference, fit.net_eff, fit.net_latency_us, obj);
        printf("%-11s %5s %4s %3s %5s  %9s %9s %8s %5s  %s\n", "model", "nodes", "sdp", "tp", "aoff", "published",
               "predicted", "residual", "rank", "predicted variant");
        for (size_t i = 0; i < n; i++)
            printf("%-11s %5d %4d %3d %5s  %9.2f %9.2f %+7.1f%% %5d  mb %d, ckpt %s\n", rows[i].model, rows[i].nodes,
                   rows[i].S, rows[i].T, yes_no(rows[i].act_offload), rows[i].tflops, ch[i].predicted,
                   100 * ch[i].residual, ch[i].rank, ch[i].best.layout.micro_batch, yes_no(ch[i].best.layout.ckpt));
    }
    free(ch);
    return 0;
}

static int run_sweep(const llama_config_t *cfg, plan_cluster_t c, const plan_params_t *p, const plan_options_t *po) {
    char err[512];
    int *nodes, n;
    if (parse_node_list(o_sweep, &nodes, &n, err, sizeof err)) { fprintf(stderr, "ballast plan: %s\n", err); return 2; }
    json_t *rows = o_json ? json_array() : NULL;
    double base = 0;
    int base_nodes = 0;
    if (!o_json) {
        printf("%s on %s x %d per node, %.0f Gb/s, seq %d, %lld tokens per step\n", cfg->name, c.gpu->name,
               c.gpus_per_node, c.net_gbps, c.seq_len, (long long)c.global_batch_tokens);
        printf("%6s %8s %6s %3s %4s %4s %4s %4s  %9s %8s %9s\n", "nodes", "S", "T", "ckpt", "aoff", "ooff", "mb",
               "nmb", "TFLOP/s", "step_s", "scaling");
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        c.nodes = nodes[i];
        plan_list_t l;
        if (plan_enumerate(cfg, &c, p, po, &l, err, sizeof err)) {
            fprintf(stderr, "ballast plan: %d nodes: %s\n", nodes[i], err);
            rc = 2;
            break;
        }
        if (l.n_feasible == 0) {
            if (o_json) json_array_append_new(rows, json_pack("{s:i,s:s}", "nodes", nodes[i], "reason", "no layout fits"));
            else printf("%6d  no layout fits (ballast plan --nodes %d --show-excluded says why)\n", nodes[i], nodes[i]);
            plan_list_free(&l);
            continue;
        }
        const plan_result_t *b = &l.feasible[0];
        if (base == 0) { base = b->time.tflops; base_nodes = nodes[i]; }
        double eff = b->time.tflops / base;
        if (o_json) {
            json_t *r = layout_json(b);
            json_object_set_new(r, "nodes", json_integer(nodes[i]));
            json_object_set_new(r, "scaling_efficiency", json_real(eff));
            json_array_append_new(rows, r);
        } else {
            const plan_layout_t *x = &b->layout;
            printf("%6d %8d %6d %3s %4s %4s %4d %4d  %9.2f %8.3f %8.1f%%\n", nodes[i], x->S, x->T, yes_no(x->ckpt),
                   yes_no(x->act_offload), yes_no(x->opt_offload), x->micro_batch, x->n_micro, b->time.tflops, b->time.step,
                   100 * eff);
        }
        plan_list_free(&l);
    }
    if (rc == 0) {
        if (o_json) {
            c.nodes = base_nodes;
            json_t *o = json_pack("{s:o,s:o,s:i,s:o}", "cluster", cluster_json(cfg, &c), "params", params_json(p),
                                  "base_nodes", base_nodes, "sweep", rows);
            print_json(o);
            rows = NULL;
        } else if (base_nodes) {
            printf("scaling efficiency: TFLOP/s per GPU relative to %d nodes\n", base_nodes);
        }
    }
    json_decref(rows);
    free(nodes);
    return rc;
}

static int run_list(const llama_config_t *cfg, const plan_cluster_t *c, const plan_params_t *p, const plan_options_t *po) {
    char err[512];
    plan_list_t l;
    if (plan_enumerate(cfg, c, p, po, &l, err, sizeof err)) { fprintf(stderr, "ballast plan: %s\n", err); return 2; }
    size_t top = o_top == 0 || (size_t)o_top > l.n_feasible ? l.n_feasible : (size_t)o_top;
    if (o_json) {
        json_t *f = json_array(), *x = json_array();
        for (size_t i = 0; i < top; i++) json_array_append_new(f, layout_json(&l.feasible[i]));
        if (o_show_excluded)
            for (size_t i = 0; i < l.n_excluded; i++) json_array_append_new(x, layout_json(&l.excluded[i]));
        json_t *o = json_pack("{s:o,s:o,s:I,s:I,s:o}", "cluster", cluster_json(cfg, c), "params", params_json(p),
                              "n_feasible", (json_int_t)l.n_feasible, "n_excluded", (json_int_t)l.n_excluded,
                              "layouts", f);
        if (o_show_excluded) json_object_set_new(o, "excluded", x);
        else json_decref(x);
        print_json(o);
    } else {
        printf("%s (%.2fB parameters) on %d node%s x %d %s, %.0f Gb/s per node, seq %d, %lld tokens per step\n",
               cfg->name, llama_total_params(cfg) / 1e9, c->nodes, c->nodes == 1 ? "" : "s", c->gpus_per_node,
               c->gpu->name, c->net_gbps, c->seq_len, (long long)c->global_batch_tokens);
        printf("%zu feasible layouts, %zu excluded; memory in GiB per GPU of %.1f\n\n", l.n_feasible, l.n_excluded,
               c->gpu->mem_bytes / GIB);
        if (l.n_feasible) {
            print_table_header();
            for (size_t i = 0; i < top; i++) print_row((int)i + 1, &l.feasible[i], c);
        } else {
            printf("nothing fits: more nodes, a larger GPU, a shorter sequence or the memory savers may help "
                   "(--show-excluded lists each reason)\n");
        }
        if (o_show_excluded && l.n_excluded) {
            printf("\nexcluded:\n%5s %2s %4s %4s %4s  %s\n", "S", "T", "ckpt", "aoff", "ooff", "reason");
            for (size_t i = 0; i < l.n_excluded; i++) {
                const plan_layout_t *x = &l.excluded[i].layout;
                printf("%5d %2d %4s %4s %4s  %s\n", x->S, x->T, yes_no(x->ckpt), yes_no(x->act_offload), yes_no(x->opt_offload),
                       l.excluded[i].reason);
            }
        }
    }
    int rc = l.n_feasible ? 0 : 1;
    plan_list_free(&l);
    return rc;
}

/* ---- entry ---- */

int cmd_plan(int argc, char **argv) {
    char err[OPT_ERR_LEN];
    const char *pos[1];
    int npos = 0;
    int r = opt_parse(options, N_OPTIONS, argc, argv, pos, 0, &npos, usage_text, err, sizeof err);
    if (r == 1) return 0;
    if (r < 0) { fprintf(stderr, "ballast plan: %s\n", err); return 2; }
    if (o_calibrate) return run_calibrate();

    if (!o_model || !*o_model) {
        fprintf(stderr, "ballast plan: --model is required: a preset (%s) or a config.json path\n", llama_preset_names());
        return 2;
    }
    llama_config_t cfg;
    if (llama_config_resolve(o_model, &cfg, err, sizeof err)) { fprintf(stderr, "ballast plan: --model: %s\n", err); return 2; }
    const plan_gpu_t *gpu = plan_gpu_lookup(o_gpu);
    if (!gpu) { fprintf(stderr, "ballast plan: unknown GPU '%s': use --gpu %s\n", o_gpu, plan_gpu_names()); return 2; }
    if (o_nodes < 1 || o_nodes > 1000000) {
        fprintf(stderr, "ballast plan: --nodes must be between 1 and 1000000 (got %lld)\n", (long long)o_nodes);
        return 2;
    }
    if (o_gpn < 1 || o_gpn > 64) {
        fprintf(stderr, "ballast plan: --gpus-per-node must be between 1 and 64 (got %lld)\n", (long long)o_gpn);
        return 2;
    }
    if (o_seq < 1 || o_seq > (1 << 24)) {
        fprintf(stderr, "ballast plan: --seq-len must be positive and at most 16777216 (got %lld)\n", (long long)o_seq);
        return 2;
    }
    if (o_tp != 0 && o_tp != 1 && o_tp != 2 && o_tp != 4 && o_tp != 8) {
        fprintf(stderr, "ballast plan: --tp must be 0 (any), 1, 2, 4 or 8 (got %lld)\n", (long long)o_tp);
        return 2;
    }
    if (o_batch > (uint64_t)INT64_MAX / 2) {
        fprintf(stderr, "ballast plan: --global-batch-tokens is too large\n");
        return 2;
    }
    plan_cluster_t c = { .nodes = (int)o_nodes, .gpus_per_node = (int)o_gpn, .gpu = gpu, .net_gbps = o_net,
                         .seq_len = (int)o_seq, .global_batch_tokens = (int64_t)o_batch };
    if (o_net < 0) { fprintf(stderr, "ballast plan: --net-gbps must not be negative (got %g)\n", o_net); return 2; }
    if (plan_cluster_validate(&c, &cfg, err, sizeof err)) { fprintf(stderr, "ballast plan: %s\n", err); return 2; }
    if (c.seq_len > cfg.max_seq)
        log_warn("--seq-len %d is past %s's max_position_embeddings (%d): the model needs RoPE scaling for it",
                 c.seq_len, cfg.name, cfg.max_seq);
    if (o_sweep && o_net <= 0) {
        fprintf(stderr, "ballast plan: --sweep-nodes needs --net-gbps > 0 (p4d has 400)\n");
        return 2;
    }

    plan_params_t p = plan_default_params();
    plan_options_t po = { .T = (int)o_tp, .no_accumulation = o_no_accum, .ckpt = (plan_choice_t)o_ckpt,
                          .act_offload = (plan_choice_t)o_aoff, .opt_offload = (plan_choice_t)o_ooff };
    if (o_published) {
        plan_options_t pub = plan_published_options();
        po.no_accumulation = pub.no_accumulation;
        po.ckpt = pub.ckpt;
        po.opt_offload = pub.opt_offload;
    }
    if (po.ckpt == PLAN_OFF && po.act_offload == PLAN_ON) {
        fprintf(stderr, "ballast plan: --act-offload on needs checkpointing: drop --ckpt off\n");
        return 2;
    }
    if (o_sweep) return run_sweep(&cfg, c, &p, &po);
    return run_list(&cfg, &c, &p, &po);
}
