/* cmd_plan.c: `ballast plan`, the layout planner's command line.
 *
 * Lists the feasible (S, T, C, checkpointing, activation offload, optimizer
 * offload, micro-batch) layouts for a model on a cluster, best first, with
 * the predicted memory per GPU and model TFLOP/s per GPU, the `ballast
 * train` command line of the best one, each term of its prediction
 * (--explain), and the excluded ones with their reasons; or sweeps the node
 * count (--sweep-nodes); or refits and prints the fitted and held-out rows
 * (--fit). --calibrate FILE takes a measured block time instead of the
 * estimate. The model is plan.c. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "options.h"
#include "workers/cli/cli.h"
#include "workers/plan/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ---- options ---- */

static const char *o_model, *o_gpu, *o_sweep, *o_calib;
static int64_t o_nodes, o_gpn, o_seq, o_top, o_tp, o_cp;
static uint64_t o_batch;
static double o_net;
static bool o_json, o_show_excluded, o_no_accum, o_published, o_fit, o_explain;
static int o_ckpt, o_aoff, o_ooff;

static const opt_t options[] = {
    { "model", OPT_STRING, NULL, 0, 0, NULL, "preset name or Hugging Face config.json (file or directory)", &o_model },
    { "nodes", OPT_INT, "1", 0, 0, NULL, "nodes in the cluster", &o_nodes },
    { "gpus-per-node", OPT_INT, "8", 0, 0, NULL, "GPUs per node (G)", &o_gpn },
    { "gpu", OPT_STRING, "a100-40gb", 0, 0, NULL,
      "GPU type (any case): a100-40gb|a100-80gb|h100-80gb (h100)|h200-141gb (h200)|b200-180gb (b200)|l40s-48gb (l40s)", &o_gpu },
    { "net-gbps", OPT_DOUBLE, "400", 0, 0, NULL, "inter-node network per node, Gb/s (p4d: 4 x 100 EFA = 400)", &o_net },
    { "seq-len", OPT_INT, "4096", 0, 0, NULL, "tokens per sequence", &o_seq },
    { "global-batch-tokens", OPT_SIZE, "4M", 0, 0, NULL, "tokens per optimizer step over the cluster (4M = 4194304)", &o_batch },
    { "tensor-parallel-degree", OPT_INT, "0", 0, 8, NULL, "only this tensor-parallel degree (0 = try 1, 2, 4, 8)", &o_tp, "tp" },
    { "cp", OPT_INT, "0", 0, 32, NULL, "only this context-parallel degree (0 = try 1, 2, 4, ..., 32)", &o_cp },
    { "activation-checkpointing", OPT_ENUM, "any", 0, 0, "any|on|off|full|selective|all",
      "activation checkpointing: any (none or full), on or full, off, selective (only), all (none, full or selective)",
      &o_ckpt, "ckpt" },
    { "activation-offload", OPT_ENUM, "any", 0, 0, "any|on|off", "activation offload (needs checkpointing)", &o_aoff, "act-offload" },
    { "optimizer-offload", OPT_ENUM, "any", 0, 0, "any|on|off", "optimizer-state offload (on: the trainer's --optimizer-offload host)", &o_ooff, "opt-offload" },
    { "no-grad-accum", OPT_BOOL, "false", 0, 0, NULL, "one micro-batch per step (micro-batch = sequences per rank)", &o_no_accum },
    { "published-grid", OPT_BOOL, "false", 0, 0, NULL,
      "the published runs' grid: no accumulation, checkpointing on, no optimizer offload", &o_published },
    { "top", OPT_INT, "10", 0, 1e9, NULL, "feasible layouts to print (0 = all)", &o_top },
    { "show-excluded", OPT_BOOL, "false", 0, 0, NULL, "also print the excluded layouts and why", &o_show_excluded },
    { "sweep-nodes", OPT_STRING, NULL, 0, 0, NULL, "comma-separated node counts: best layout and scaling efficiency per count", &o_sweep },
    { "json", OPT_BOOL, "false", 0, 0, NULL, "print JSON instead of tables", &o_json },
    { "explain", OPT_BOOL, "false", 0, 0, NULL, "print every term of the best layout's prediction (time and memory)", &o_explain },
    { "calibrate", OPT_STRING, NULL, 0, 0, NULL,
      "FILE with a measured 'Step time per layer' table (docs/plan.md): use it instead of the block time estimate", &o_calib },
    { "fit", OPT_BOOL, "false", 0, 0, NULL, "refit the parameters to the fitted published rows; print fitted and held-out errors", &o_fit },
};
#define N_OPTIONS (sizeof options / sizeof options[0])

static const char *usage_text =
    "usage: ballast plan --model NAME|config.json --nodes N --gpus-per-node G --gpu TYPE --net-gbps X\n"
    "                    --seq-len T --global-batch-tokens M [--json] [--top K] [--show-excluded]\n"
    "       ballast plan --model NAME ... --sweep-nodes 16,32,64,128\n"
    "       ballast plan --model NAME ... --calibrate RESULTS.md [--explain]\n"
    "       ballast plan --fit\n"
    "Predicts memory per GPU and model TFLOP/s per GPU for every parallel layout (docs/plan.md).";

/* ---- helpers ---- */

static const char *yes_no(bool b) { return b ? "yes" : "no"; }
/* The ckpt column: no, yes (full) or sel (selective). */
static const char *ckpt_word(const plan_layout_t *l) { return !l->ckpt ? "no" : l->ckpt_sel ? "sel" : "yes"; }

static json_t *layout_json(const plan_result_t *r) {
    const plan_layout_t *l = &r->layout;
    json_t *o = json_pack("{s:i,s:i,s:i,s:i,s:b,s:b,s:b,s:b,s:i,s:i,s:i}", "S", l->S, "T", l->T, "C", l->C ? l->C : 1,
                          "R", l->R, "ckpt", l->ckpt, "ckpt_selective", l->ckpt_sel, "act_offload", l->act_offload,
                          "opt_offload", l->opt_offload,
                          "micro_batch", l->micro_batch, "n_micro", l->n_micro, "seqs_per_rank", l->seqs_per_rank);
    if (r->feasible || r->mem.capacity > 0) {
        const plan_mem_t *m = &r->mem;
        json_object_set_new(o, "memory_gib", json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}",
            "params", m->params / GIB, "grads", m->grads / GIB, "optimizer", m->optim / GIB,
            "activations", m->acts / GIB, "attention_working_set", m->attn_ws / GIB, "comm_buffers", m->comm / GIB,
            "overhead", m->overhead / GIB, "total", m->total / GIB, "capacity", m->capacity / GIB));
    }
    if (r->feasible) {
        const plan_time_t *t = &r->time;
        json_object_set_new(o, "tflops_per_gpu", json_real(t->tflops));
        json_object_set_new(o, "tflops_per_gpu_causal", json_real(t->tflops_causal));
        json_object_set_new(o, "tokens_per_gpu_s", json_real(t->tokens_per_gpu_s));
        json_t *ts = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "step", t->step, "compute", t->compute,
                               "gemm", t->gemm, "attention_fwd", t->attn_fwd, "attention_bwd", t->attn_bwd,
                               "elementwise", t->elementwise, "recompute", t->recompute, "tp_comm", t->tp_comm,
                               "cp_comm", t->cp_comm);
        json_t *t2 = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "cp_exposed", t->cp_exposed, "shard_comm",
                               t->shard_comm, "replica_comm", t->replica_comm, "offload", t->offload, "optimizer",
                               t->optimizer, "interference", t->interference, "fill", t->fill, "exposed", t->exposed);
        json_object_update(ts, t2);
        json_decref(t2);
        json_object_set_new(o, "time_s", ts);
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
    printf("%4s %5s %2s %2s %5s %4s %4s %4s %4s %4s  %8s %6s %8s %8s  %7s %6s %6s %6s %6s %6s %7s\n", "#", "S", "T",
           "C", "R", "ckpt", "aoff", "ooff", "mb", "nmb", "TFLOP/s", "MFU%", "tok/s", "step_s", "params", "grads",
           "optim", "acts", "comm", "ovh", "total");
}

static void print_row(int rank, const plan_result_t *r, const plan_cluster_t *c) {
    const plan_layout_t *l = &r->layout;
    const plan_mem_t *m = &r->mem;
    printf("%4d %5d %2d %2d %5d %4s %4s %4s %4d %4d  %8.2f %6.1f %8.0f %8.3f  %7.2f %6.2f %6.2f %6.2f %6.2f %6.2f %7.2f\n",
           rank, l->S, l->T, l->C, l->R, ckpt_word(l), yes_no(l->act_offload), yes_no(l->opt_offload), l->micro_batch,
           l->n_micro, r->time.tflops, 100.0 * r->time.tflops / c->gpu->bf16_tflops, r->time.tokens_per_gpu_s,
           r->time.step, m->params / GIB,
           m->grads / GIB, m->optim / GIB, m->acts / GIB, m->comm / GIB, m->overhead / GIB, m->total / GIB);
}

/* Append s to the command, single-quoted when it holds anything a shell
 * would read specially. */
static void cmd_word(char *buf, size_t len, const char *w) {
    size_t n = strlen(buf);
    bool plain = *w != 0;
    for (const char *p = w; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+", *p)) plain = false;
    if (plain) { snprintf(buf + n, len - n, " %s", w); return; }
    n += (size_t)snprintf(buf + n, len > n ? len - n : 0, " '");
    for (const char *p = w; *p && n + 5 < len; p++) {
        if (*p == '\'') n += (size_t)snprintf(buf + n, len - n, "'\\''");
        else buf[n++] = *p, buf[n] = 0;
    }
    if (n + 1 < len) snprintf(buf + n, len - n, "'");
}

/* The `ballast train` command line of layout r: the trainer's flags
 * (workers/train/options.c), --nproc for one node's GPUs. */
static void train_command(const plan_result_t *r, const plan_cluster_t *c, const char *model, char *buf, size_t len) {
    const plan_layout_t *l = &r->layout;
    char v[64];
    snprintf(buf, len, "ballast train");
#define FLAG(name, fmt, val) do { cmd_word(buf, len, name); snprintf(v, sizeof v, fmt, val); cmd_word(buf, len, v); } while (0)
    FLAG("--nproc", "%d", c->gpus_per_node);
    cmd_word(buf, len, "--backend");
    cmd_word(buf, len, "cuda");
    cmd_word(buf, len, "--model");
    cmd_word(buf, len, model);
    cmd_word(buf, len, "--data");
    cmd_word(buf, len, "SHARDS");
    FLAG("--seq-len", "%d", c->seq_len);
    FLAG("--micro-batch", "%d", l->micro_batch);
    FLAG("--grad-accum", "%d", l->n_micro);
    FLAG("--hybrid-shard-degree", "%d", l->S);
    FLAG("--tensor-parallel-degree", "%d", l->T);
    if (l->C > 1) FLAG("--context-parallel-degree", "%d", l->C);
    if (l->ckpt) cmd_word(buf, len, "--activation-checkpointing");
    if (l->ckpt_sel) cmd_word(buf, len, "selective");
    if (l->act_offload) cmd_word(buf, len, "--activation-offload");
    if (l->opt_offload) { cmd_word(buf, len, "--optimizer-offload"); cmd_word(buf, len, "host"); }
#undef FLAG
}

static void print_train_command(const plan_result_t *r, const plan_cluster_t *c, const char *model) {
    char cmd[2048];
    train_command(r, c, model, cmd, sizeof cmd);
    printf("\nbest layout as a `ballast train` command (SHARDS: your token shards):\n  %s\n", cmd);
    if (c->nodes > 1)
        printf("  (one node's %d workers; on each of the %d nodes, with the job's rank variables set as docs/deploy.md "
               "describes)\n", c->gpus_per_node, c->nodes);
}

/* Every term of r's prediction, in ms per step and GiB per GPU. */
static void print_explain(const plan_result_t *r, const plan_cluster_t *c) {
    const plan_time_t *t = &r->time;
    const plan_mem_t *m = &r->mem;
    const plan_layout_t *l = &r->layout;
    printf("\nterms of the best layout, #1 (S=%d T=%d C=%d R=%d, mb %d x %d), ms per step per GPU:\n", l->S, l->T, l->C, l->R,
           l->micro_batch, l->n_micro);
    struct { const char *name, *what; double v; } rows[] = {
        { "gemm", "block + output GEMMs at the shape-dependent efficiency (recompute included)", t->gemm },
        { "attention_fwd", c->gpu->attn_kernel, t->attn_fwd },
        { "attention_bwd", "causal backward, 2.5 x forward FLOPs", t->attn_bwd },
        { "elementwise", "norms, RoPE, residuals, SwiGLU at HBM bandwidth", t->elementwise },
        { "  of which recompute", "checkpointed blocks' forward again", t->recompute },
        { "tp_comm", "TP all-reduces on the compute stream", t->tp_comm },
        { "cp_comm", "ring-attention K/V traffic (mostly hidden)", t->cp_comm },
        { "cp_exposed", "its part not hidden behind attention + interference", t->cp_exposed },
        { "shard_comm", "all-gathers + reduce-scatters (overlapped)", t->shard_comm },
        { "replica_comm", "gradient all-reduce over replicas and CP ranks", t->replica_comm },
        { "offload", "activation copies over PCIe (copy engines)", t->offload },
        { "interference", "compute slowed by overlapped collectives", t->interference },
        { "fill", "first gather, last reduce-scatter and all-reduce", t->fill },
        { "optimizer", "AdamW over the shard", t->optimizer },
        { "exposed", "step - compute - tp - cp_exposed - optimizer", t->exposed },
        { "step", "", t->step },
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        printf("  %-22s %12.2f  %s\n", rows[i].name, 1e3 * rows[i].v, rows[i].what);
    printf("  model TFLOP/s per GPU %.2f (attention non-causal, as SMP counts), %.2f (causal), %.0f tokens/s per GPU\n",
           t->tflops, t->tflops_causal, t->tokens_per_gpu_s);
    printf("memory, GiB per GPU: params %.2f, grads %.2f, optimizer %.2f, activations %.2f (attention working set "
           "%.2f), comm %.2f, overhead %.2f, total %.2f of %.2f\n", m->params / GIB, m->grads / GIB, m->optim / GIB,
           m->acts / GIB, m->attn_ws / GIB, m->comm / GIB, m->overhead / GIB, m->total / GIB, m->capacity / GIB);
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

static int run_fit(void) {
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
            json_t *r = json_pack("{s:s,s:i,s:f,s:i,s:i,s:b,s:f,s:f,s:i,s:b}", "model", rows[i].model, "nodes",
                                  rows[i].nodes, "published", rows[i].tflops, "S", rows[i].S, "T", rows[i].T,
                                  "act_offload", rows[i].act_offload, "predicted", ch[i].predicted, "residual",
                                  ch[i].residual, "rank", ch[i].rank, "fitted", rows[i].fitted);
            json_array_append_new(a, r);
        }
        json_object_set_new(o, "rows", a);
        print_json(o);
    } else {
        printf("parameters in use:  gemm_eff %.4f  interference %.4f  net_eff %.4f  net_latency_us %.3f\n",
               def.gemm_eff, def.interference, def.net_eff, def.net_latency_us);
        printf("refit from scratch: gemm_eff %.6f  interference %.6f  net_eff %.6f  net_latency_us %.6f  (objective %.6f)\n\n",
               fit.gemm_eff, fit.interference, fit.net_eff, fit.net_latency_us, obj);
        printf("%-11s %5s %4s %3s %5s %8s  %9s %9s %8s %5s  %s\n", "model", "nodes", "sdp", "tp", "aoff", "role",
               "published", "predicted", "residual", "rank", "predicted variant");
        for (size_t i = 0; i < n; i++)
            printf("%-11s %5d %4d %3d %5s %8s  %9.2f %9.2f %+7.2f%% %5d  mb %d, ckpt %s\n", rows[i].model,
                   rows[i].nodes, rows[i].S, rows[i].T, yes_no(rows[i].act_offload), rows[i].fitted ? "fitted" : "held-out",
                   rows[i].tflops, ch[i].predicted, 100 * ch[i].residual, ch[i].rank, ch[i].best.layout.micro_batch,
                   ckpt_word(&ch[i].best.layout));
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
        printf("%6s %8s %6s %3s %4s %4s %4s %4s %4s  %9s %8s %9s\n", "nodes", "S", "T", "C", "ckpt", "aoff", "ooff",
               "mb", "nmb", "TFLOP/s", "step_s", "scaling");
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
            printf("%6d %8d %6d %3d %4s %4s %4s %4d %4d  %9.2f %8.3f %8.1f%%\n", nodes[i], x->S, x->T, x->C,
                   ckpt_word(x), yes_no(x->act_offload), yes_no(x->opt_offload), x->micro_batch, x->n_micro, b->time.tflops,
                   b->time.step, 100 * eff);
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
        if (l.n_feasible) {
            char cmd[2048];
            train_command(&l.feasible[0], c, o_model, cmd, sizeof cmd);
            json_object_set_new(o, "train_command", json_string(cmd));
        }
        if (c->block_time_scale > 0) json_object_set_new(o, "block_time_scale", json_real(c->block_time_scale));
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
            print_train_command(&l.feasible[0], c, o_model);
            if (o_explain) print_explain(&l.feasible[0], c);
        } else {
            printf("nothing fits: more nodes, a larger GPU, a shorter sequence or the memory savers may help "
                   "(--show-excluded lists each reason)\n");
        }
        if (o_show_excluded && l.n_excluded) {
            printf("\nexcluded:\n%5s %2s %4s %4s %4s  %s\n", "S", "T", "ckpt", "aoff", "ooff", "reason");
            for (size_t i = 0; i < l.n_excluded; i++) {
                const plan_layout_t *x = &l.excluded[i].layout;
                printf("%5d %2d %4s %4s %4s  %s\n", x->S, x->T, ckpt_word(x), yes_no(x->act_offload), yes_no(x->opt_offload),
                       l.excluded[i].reason);
            }
        }
    }
    int rc = l.n_feasible ? 0 : 1;
    plan_list_free(&l);
    return rc;
}

/* --calibrate FILE: the measured row for this model and GPU nearest the
 * cluster's sequence length sets c->block_time_scale. */
static int calibrate_from(const char *path, const llama_config_t *cfg, plan_cluster_t *c, const plan_params_t *p) {
    char err[512];
    plan_measured_t *rows;
    int n = plan_read_measured(path, &rows, err, sizeof err);
    if (n < 0) { fprintf(stderr, "ballast plan: %s\n", err); return -1; }
    int best = -1;
    double bd = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(rows[i].gpu, c->gpu->name) || (strcmp(rows[i].model, cfg->name) && strcmp(rows[i].model, o_model)))
            continue;
        double d = fabs(log((double)rows[i].seq_len / c->seq_len));
        if (best < 0 || d < bd) { best = i; bd = d; }
    }
    if (best < 0) {
        fprintf(stderr, "ballast plan: --calibrate %s: no measured row for model %s on %s (%d measured row%s): add one, "
                "or drop --calibrate to use the estimate\n", path, cfg->name, c->gpu->name, n, n == 1 ? "" : "s");
        free(rows);
        return -1;
    }
    const plan_measured_t *m = &rows[best];
    double est = plan_block_time_estimate(cfg, c, p, m);
    c->block_time_scale = m->ms_per_layer * 1e-3 / est;
    if (!o_json)
        printf("calibrated from %s:%d (seq %d, micro-batch %d, tp %d, cp %d, ckpt %s): measured %.3f ms per layer, "
               "estimated %.3f ms: block compute x %.3f\n", path, m->line, m->seq_len, m->micro_batch, m->T, m->C,
               yes_no(m->ckpt), m->ms_per_layer, est * 1e3, c->block_time_scale);
    free(rows);
    return 0;
}

/* ---- entry ---- */

int cmd_plan(int argc, char **argv) {
    char err[OPT_ERR_LEN];
    const char *pos[1];
    int npos = 0;
    int r = opt_parse(options, N_OPTIONS, argc, argv, pos, 0, &npos, usage_text, err, sizeof err);
    if (r == 1) return 0;
    if (r < 0) { fprintf(stderr, "ballast plan: %s\n", err); return 2; }
    if (o_fit) return run_fit();

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
        fprintf(stderr, "ballast plan: --tensor-parallel-degree must be 0 (any), 1, 2, 4 or 8 (got %lld)\n", (long long)o_tp);
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

    if (o_cp != 0 && (o_cp & (o_cp - 1))) {
        fprintf(stderr, "ballast plan: --cp must be 0 (any), 1, 2, 4, 8, 16 or 32 (got %lld)\n", (long long)o_cp);
        return 2;
    }

    plan_params_t p = plan_default_params();
    if (o_calib && calibrate_from(o_calib, &cfg, &c, &p)) return 2;
    /* any|on|off|full|selective|all */
    static const plan_choice_t ck_choice[] = { PLAN_ANY, PLAN_ON, PLAN_OFF, PLAN_ON, PLAN_ON, PLAN_ANY };
    static const plan_ckpt_mode_t ck_mode[] = { PLAN_CKPT_FULL, PLAN_CKPT_FULL, PLAN_CKPT_FULL, PLAN_CKPT_FULL,
                                                PLAN_CKPT_SELECTIVE, PLAN_CKPT_BOTH };
    plan_options_t po = { .T = (int)o_tp, .C = (int)o_cp, .no_accumulation = o_no_accum, .ckpt = ck_choice[o_ckpt],
                          .ckpt_mode = ck_mode[o_ckpt], .act_offload = (plan_choice_t)o_aoff,
                          .opt_offload = (plan_choice_t)o_ooff };
    if (o_published) {
        plan_options_t pub = plan_published_options();
        po.no_accumulation = pub.no_accumulation;
        po.ckpt = pub.ckpt;
        po.opt_offload = pub.opt_offload;
    }
    if (po.ckpt == PLAN_OFF && po.act_offload == PLAN_ON) {
        fprintf(stderr, "ballast plan: --activation-offload on needs checkpointing: drop --activation-checkpointing off\n");
        return 2;
    }
    if (o_sweep) return run_sweep(&cfg, c, &p, &po);
    return run_list(&cfg, &c, &p, &po);
}
