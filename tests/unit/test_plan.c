/* test_plan.c: the layout planner against the published SMP rows, and
 * sanity properties of its memory and time model on random clusters. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/plan/plan.h"
#include "tests/unit/helpers.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Deterministic generator for the random cases (seeded, never zero). */
static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s ? s : 0x9e3779b97f4a7c15ull; }
static uint64_t rng_next(void) { return th_xorshift64(&rng_state); }
static int rng_pick(const int *v, int n) { return v[rng_next() % (uint64_t)n]; }

static const char *gpu_names[] = { "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "b200-180gb", "l40s-48gb" };
#define N_GPU_NAMES (sizeof gpu_names / sizeof gpu_names[0])

/* A random cluster: 1..128 nodes of 8 (or 4) GPUs, a GPU type, a network,
 * a sequence length and a batch of 1..16 sequences per GPU. */
static plan_cluster_t random_cluster(void) {
    static const int nodes[] = { 1, 2, 4, 8, 16, 32, 64, 128 }, gpn[] = { 4, 8 }, seqs[] = { 1024, 2048, 4096, 8192 };
    static const int per_gpu[] = { 1, 2, 4, 8, 16 };
    plan_cluster_t c = { .nodes = rng_pick(nodes, 8), .gpus_per_node = rng_pick(gpn, 2),
                         .gpu = plan_gpu_lookup(gpu_names[rng_next() % N_GPU_NAMES]),
                         .net_gbps = 100.0 * (double)(1 + rng_next() % 32), .seq_len = rng_pick(seqs, 4) };
    c.global_batch_tokens = (int64_t)c.nodes * c.gpus_per_node * c.seq_len * rng_pick(per_gpu, 5);
    return c;
}

/* ---- calibration against the published rows ---- */

Test(plan, published_rows_within_10_percent_and_top_three) {
    size_t n;
    const plan_published_row_t *rows = plan_published_rows(&n);
    cr_assert_eq(n, 8, "the published table has 8 rows (7B and 13B at 16..128 nodes)");
    plan_params_t p = plan_default_params();
    plan_check_t ch[8];
    char err[512];
    cr_assert_eq(plan_check_published(&p, ch, err, sizeof err), 0, "%s", err);
    for (size_t i = 0; i < n; i++) {
        fprintf(stderr, "# %-10s %3d nodes  sdp %3d tp %d aoff %d  published %7.2f  predicted %7.2f  residual %+5.1f%%  rank %d\n",
                rows[i].model, rows[i].nodes, rows[i].S, rows[i].T, rows[i].act_offload, rows[i].tflops,
                ch[i].predicted, 100 * ch[i].residual, ch[i].rank);
        cr_expect(ch[i].rank >= 1, "%s at %d nodes: the published layout (sdp %d, tp %d) is not feasible",
                  rows[i].model, rows[i].nodes, rows[i].S, rows[i].T);
        cr_expect(fabs(ch[i].residual) < 0.10, "%s at %d nodes: predicted %.2f vs published %.2f TFLOP/s (%+.1f%%)",
                  rows[i].model, rows[i].nodes, ch[i].predicted, rows[i].tflops, 100 * ch[i].residual);
        cr_expect(ch[i].rank >= 1 && ch[i].rank <= 3, "%s at %d nodes: published layout ranked %d",
                  rows[i].model, rows[i].nodes, ch[i].rank);
        /* the prediction is of the published layout itself */
        cr_expect_eq(ch[i].best.layout.S, rows[i].S);
        cr_expect_eq(ch[i].best.layout.T, rows[i].T);
        cr_expect_eq(ch[i].best.layout.act_offload, rows[i].act_offload);
        cr_expect(!ch[i].best.layout.opt_offload);
    }
}

/* The defaults are what the fit produces, not hand-set numbers. */
Test(plan, refit_reproduces_the_default_parameters) {
    plan_params_t fit, def = plan_default_params();
    double obj;
    char err[512];
    cr_assert_eq(plan_fit(&fit, &obj, err, sizeof err), 0, "%s", err);
    double a[PLAN_NUM_PARAMS] = { fit.gemm_eff, fit.interference, fit.net_eff, fit.net_latency_us };
    double b[PLAN_NUM_PARAMS] = { def.gemm_eff, def.interference, def.net_eff, def.net_latency_us };
    for (int i = 0; i < PLAN_NUM_PARAMS; i++)
        cr_expect(fabs(a[i] - b[i]) <= 1e-3 * fabs(b[i]), "parameter %d: refit %.6f, default %.6f", i, a[i], b[i]);
    /* physically meaningful ranges */
    cr_expect(fit.gemm_eff > 0.3 && fit.gemm_eff < 0.95);
    cr_expect(fit.interference >= 0 && fit.interference < 0.6);
    cr_expect(fit.net_eff > 0.4 && fit.net_eff <= 1.0);
    cr_expect(fit.net_latency_us >= 1 && fit.net_latency_us <= 60);
    cr_expect(obj < 0.01, "objective %.5f", obj);
}

/* A deliberately wrong parameter set must fail the acceptance: the check
 * can fail. */
Test(plan, acceptance_fails_with_wrong_parameters) {
    plan_params_t p = plan_default_params();
    p.gemm_eff *= 0.7;
    plan_check_t ch[8];
    char err[512];
    cr_assert_eq(plan_check_published(&p, ch, err, sizeof err), 0, "%s", err);
    int outside = 0;
    for (int i = 0; i < 8; i++) outside += fabs(ch[i].residual) >= 0.10;
    cr_expect(outside == 8, "only %d of 8 rows moved past 10%% with 30%% less GEMM efficiency", outside);
}

/* ---- memory ---- */

static plan_result_t eval(const char *model, const plan_cluster_t *c, int S, int T, bool ckpt, bool aoff, bool ooff,
                          int mb) {
    plan_params_t p = plan_default_params();
    plan_layout_t l = { .S = S, .T = T, .ckpt = ckpt, .act_offload = aoff, .opt_offload = ooff, .micro_batch = mb };
    plan_result_t r;
    plan_evaluate(llama_preset(model), c, &p, &l, &r);
    return r;
}

Test(plan, memory_grows_with_model_size_and_falls_with_S) {
    rng_seed(0x5eed1234);
    /* one family (same vocabulary): Llama 3's 128K vocabulary makes a 1B
     * model's logits outweigh a 7B Llama 2's, so sizes compare within one */
    static const char *models[] = { "llama2-7b", "llama2-13b", "llama2-70b" };
    for (int iter = 0; iter < 200; iter++) {
        plan_cluster_t c = random_cluster();
        if (c.nodes < 16) { /* room for S up to 64 */
            c.global_batch_tokens = c.global_batch_tokens / c.nodes * 16;
            c.nodes = 16;
        }
        int W = c.nodes * c.gpus_per_node;
        static const int Ts[] = { 1, 2, 4 };
        int T = rng_pick(Ts, 3);
        bool ckpt = rng_next() & 1, aoff = ckpt && (rng_next() & 1), ooff = rng_next() & 1;
        int S = 2 << (rng_next() % 5); /* 2..32 */
        if ((W / T) % (2 * S)) continue;
        double prev = 0;
        for (int m = 0; m < 3; m++) {
            plan_result_t r = eval(models[m], &c, S, T, ckpt, aoff, ooff, 1);
            cr_assert(r.mem.total > 0, "%s: %s", models[m], r.reason);
            cr_expect(r.mem.total > prev, "%s S=%d T=%d: %.2f GiB not above the smaller model's %.2f GiB", models[m],
                      S, T, r.mem.total / GIB, prev / GIB);
            prev = r.mem.total;
            /* doubling S shrinks the sharded state and the total */
            plan_result_t r2 = eval(models[m], &c, 2 * S, T, ckpt, aoff, ooff, 1);
            double st1 = r.mem.params + r.mem.grads + r.mem.optim, st2 = r2.mem.params + r2.mem.grads + r2.mem.optim;
            cr_expect(st2 < st1, "%s: state %.3f GiB at S=%d, %.3f at S=%d", models[m], st1 / GIB, S, st2 / GIB, 2 * S);
            cr_expect(r2.mem.total < r.mem.total, "%s: total did not fall from S=%d to %d", models[m], S, 2 * S);
            /* activations do not depend on S but grow with the micro-batch */
            cr_expect(fabs(r2.mem.acts - r.mem.acts) < 1.0);
            plan_result_t r4 = eval(models[m], &c, S, T, ckpt, aoff, ooff, 2);
            if (r4.mem.total > 0) cr_expect(r4.mem.acts > 1.9 * r.mem.acts - 1e6, "%s: activations at mb 2", models[m]);
        }
    }
}

Test(plan, savers_reduce_memory) {
    plan_cluster_t c = plan_published_cluster(16);
    plan_result_t none = eval("llama2-13b", &c, 32, 1, false, false, false, 4);
    plan_result_t ck = eval("llama2-13b", &c, 32, 1, true, false, false, 4);
    plan_result_t ao = eval("llama2-13b", &c, 32, 1, true, true, false, 4);
    plan_result_t oo = eval("llama2-13b", &c, 32, 1, true, true, true, 4);
    cr_expect(ck.mem.acts < none.mem.acts / 3, "checkpointing: %.1f vs %.1f GiB", ck.mem.acts / GIB, none.mem.acts / GIB);
    cr_expect(ao.mem.acts < ck.mem.acts);
    cr_expect(oo.mem.optim < ao.mem.optim && oo.mem.params < ao.mem.params);
    /* and cost time: recompute with checkpointing, nothing but PCIe with offload */
    cr_expect(ck.time.recompute > 0 && none.time.recompute == 0);
    cr_expect(ao.time.offload > 0 && ck.time.offload == 0);
}

/* Selective checkpointing: on random clusters and layouts, its activations
 * lie strictly between full checkpointing's and none's, by exactly the kept
 * attention outputs and log-sum-exp rows over full; its recompute is full's
 * GEMMs without the attention forward; an enumeration lists it only when
 * asked for. */
Test(plan, selective_checkpointing_between_full_and_none) {
    rng_seed(0x5e1ec7);
    static const char *models[] = { "llama2-7b", "llama2-13b", "llama3.2-1b" };
    static const int Ss[] = { 1, 2, 4, 8 }, Ts[] = { 1, 2, 4 }, mbs[] = { 1, 2 };
    plan_params_t p = plan_default_params();
    for (int iter = 0; iter < 100; iter++) {
        plan_cluster_t c = random_cluster();
        const llama_config_t *cfg = llama_preset(models[rng_next() % 3]);
        plan_layout_t l = { .S = rng_pick(Ss, 4), .T = rng_pick(Ts, 3), .micro_batch = rng_pick(mbs, 2) };
        if (l.S * l.T > c.nodes * c.gpus_per_node) l.S = 1;
        plan_result_t none, full, sel;
        plan_evaluate(cfg, &c, &p, &l, &none);
        l.ckpt = true;
        plan_evaluate(cfg, &c, &p, &l, &full);
        l.ckpt_sel = true;
        plan_evaluate(cfg, &c, &p, &l, &sel);
        if (none.mem.capacity <= 0 || sel.mem.capacity <= 0) continue; /* excluded before the memory model */
        double tl = (double)l.micro_batch * c.seq_len, q = (double)cfg->n_heads * cfg->head_dim;
        double kept = cfg->n_layers * tl * (2 * q + 4 * cfg->n_heads) / l.T;
        cr_expect(full.mem.acts < sel.mem.acts && sel.mem.acts < none.mem.acts, "iter %d: full %.3f sel %.3f none %.3f GiB",
                  iter, full.mem.acts / GIB, sel.mem.acts / GIB, none.mem.acts / GIB);
        cr_expect(fabs(sel.mem.acts - full.mem.acts - kept) <= 1e-9 * kept, "iter %d: %.6g vs %.6g", iter,
                  sel.mem.acts - full.mem.acts, kept);
        cr_expect(sel.time.recompute > 0 && sel.time.recompute < full.time.recompute, "iter %d", iter);
        cr_expect(sel.time.attn_fwd < full.time.attn_fwd && fabs(sel.time.attn_fwd - none.time.attn_fwd) <=
                  1e-9 * none.time.attn_fwd, "iter %d: attention forward %.6g %.6g %.6g", iter, none.time.attn_fwd,
                  sel.time.attn_fwd, full.time.attn_fwd);
    }
    plan_cluster_t c = plan_published_cluster(16);
    char err[256];
    for (int mode = PLAN_CKPT_FULL; mode <= PLAN_CKPT_BOTH; mode++) {
        plan_options_t o = { .ckpt = PLAN_ON, .ckpt_mode = (plan_ckpt_mode_t)mode };
        plan_list_t list;
        cr_assert_eq(plan_enumerate(llama_preset("llama2-13b"), &c, &p, &o, &list, err, sizeof err), 0, "%s", err);
        size_t nsel = 0;
        for (size_t i = 0; i < list.n_feasible; i++) {
            cr_expect(list.feasible[i].layout.ckpt);
            nsel += list.feasible[i].layout.ckpt_sel;
        }
        cr_expect(list.n_feasible > 0);
        if (mode == PLAN_CKPT_FULL) cr_expect_eq(nsel, 0);
        if (mode == PLAN_CKPT_SELECTIVE) cr_expect_eq(nsel, list.n_feasible);
        if (mode == PLAN_CKPT_BOTH) cr_expect(nsel > 0 && nsel < list.n_feasible);
        plan_list_free(&list);
    }
}

Test(plan, llama2_70b_without_sharding_does_not_fit_on_40gb) {
    plan_cluster_t c = plan_published_cluster(16);
    for (int T = 1; T <= 8; T *= 2)
        for (int s = 0; s < 8; s++) {
            bool ckpt = s & 1, aoff = (s & 2) && ckpt, ooff = s & 4;
            plan_result_t r = eval("llama2-70b", &c, 1, T, ckpt, aoff, ooff, 1);
            cr_expect(!r.feasible, "70B with S=1 T=%d fits in %.1f GiB?", T, r.mem.total / GIB);
            cr_expect(strstr(r.reason, "does not fit") != NULL, "reason: %s", r.reason);
        }
    /* while sharding it over the cluster does fit */
    plan_result_t r = eval("llama2-70b", &c, 128, 1, true, false, false, 1);
    cr_expect(r.feasible, "%s", r.reason);
    /* on 80 GB without sharding or TP it still does not, with every saver on */
    c.gpu = plan_gpu_lookup("a100-80gb");
    r = eval("llama2-70b", &c, 1, 1, true, true, true, 1);
    cr_expect(!r.feasible);
}

/* ---- exclusions ---- */

Test(plan, tensor_parallel_degree_must_divide_heads) {
    rng_seed(0xbadc0ffee);
    plan_params_t p = plan_default_params();
    for (int iter = 0; iter < 40; iter++) {
        llama_config_t cfg = *llama_preset("demo");
        static const int heads[] = { 3, 5, 6, 10, 12, 20, 24 };
        cfg.n_heads = rng_pick(heads, 7);
        cfg.n_kv_heads = cfg.n_heads;
        cfg.head_dim = 32;
        cfg.dim = cfg.n_heads * cfg.head_dim;
        plan_cluster_t c = { .nodes = 2, .gpus_per_node = 8, .gpu = plan_gpu_lookup("a100-80gb"), .net_gbps = 400,
                             .seq_len = 512, .global_batch_tokens = 512 * 64 };
        plan_list_t l;
        char err[512];
        cr_assert_eq(plan_enumerate(&cfg, &c, &p, NULL, &l, err, sizeof err), 0, "%s", err);
        cr_assert(l.n_feasible > 0);
        for (size_t i = 0; i < l.n_feasible; i++)
            cr_expect_eq(cfg.n_heads % l.feasible[i].layout.T, 0, "H=%d T=%d listed", cfg.n_heads, l.feasible[i].layout.T);
        for (int T = 2; T <= 8; T *= 2) {
            bool excluded = false;
            for (size_t i = 0; i < l.n_excluded; i++)
                if (l.excluded[i].layout.T == T && strstr(l.excluded[i].reason, "heads")) excluded = true;
            cr_expect_eq(excluded, cfg.n_heads % T != 0, "H=%d T=%d: excluded for heads %d", cfg.n_heads, T, excluded);
        }
        plan_list_free(&l);
    }
}

Test(plan, batch_too_small_per_rank_and_tp_rescues_long_sequences) {
    /* published observation: seq 32768 on 32 nodes with a 4M-token batch gives
     * each GPU half a sequence; tp = 2 makes it possible */
    plan_cluster_t c = plan_published_cluster(32);
    c.seq_len = 32768;
    plan_params_t p = plan_default_params();
    plan_list_t l;
    char err[512];
    cr_assert_eq(plan_enumerate(llama_preset("llama2-13b"), &c, &p, NULL, &l, err, sizeof err), 0, "%s", err);
    int small = 0;
    for (size_t i = 0; i < l.n_excluded; i++)
        if (l.excluded[i].layout.T == 1 && l.excluded[i].layout.C == 1) {
            cr_expect(strstr(l.excluded[i].reason, "batch too small per rank") != NULL, "%s", l.excluded[i].reason);
            small++;
        }
    cr_expect(small > 0);
    cr_expect(l.n_feasible > 0);
    for (size_t i = 0; i < l.n_feasible; i++) cr_expect(l.feasible[i].layout.T >= 2 || l.feasible[i].layout.C >= 2);
    plan_list_free(&l);

    plan_layout_t bad = { .S = 3, .T = 1, .micro_batch = 1 };
    plan_result_t r;
    plan_evaluate(llama_preset("llama2-7b"), &c, &p, &bad, &r);
    cr_expect(!r.feasible && strstr(r.reason, "does not divide"), "%s", r.reason);
}

/* ---- time model properties on random layouts ---- */

Test(plan, time_model_is_monotone_and_bounded) {
    rng_seed(0x0ddba11);
    plan_params_t p = plan_default_params();
    static const char *models[] = { "llama3.2-1b", "llama2-7b", "llama3-8b", "llama2-13b" };
    int checked = 0;
    for (int iter = 0; iter < 400; iter++) {
        plan_cluster_t c = random_cluster();
        const llama_config_t *cfg = llama_preset(models[rng_next() % 4]);
        plan_list_t l;
        char err[512];
        cr_assert_eq(plan_enumerate(cfg, &c, &p, NULL, &l, err, sizeof err), 0, "%s", err);
        for (size_t i = 1; i < l.n_feasible; i++)
            cr_expect(l.feasible[i - 1].time.tflops >= l.feasible[i].time.tflops, "not sorted best first");
        if (l.n_feasible == 0) { plan_list_free(&l); continue; }
        plan_result_t r = l.feasible[rng_next() % l.n_feasible];
        plan_list_free(&l);
        checked++;
        cr_expect(r.time.tflops > 0 && r.time.tflops < c.gpu->bf16_tflops, "%.1f TFLOP/s", r.time.tflops);
        cr_expect(r.time.step >= r.time.compute, "step %.3f < compute %.3f", r.time.step, r.time.compute);
        cr_expect(r.mem.total <= r.mem.capacity);
        /* a faster network, less interference or a better GEMM never slow a layout down */
        plan_cluster_t c2 = c;
        c2.net_gbps *= 2;
        plan_result_t r2;
        plan_evaluate(cfg, &c2, &p, &r.layout, &r2);
        cr_expect(r2.time.step <= r.time.step * (1 + 1e-12), "2x network: %.4f > %.4f s", r2.time.step, r.time.step);
        plan_params_t q = p;
        q.interference = 0;
        plan_evaluate(cfg, &c, &q, &r.layout, &r2);
        cr_expect(r2.time.step <= r.time.step * (1 + 1e-12));
        q = p;
        q.gemm_eff = p.gemm_eff * 1.2;
        plan_evaluate(cfg, &c, &q, &r.layout, &r2);
        cr_expect(r2.time.step < r.time.step);
        /* tokens per step: whole sequences, at most the global batch */
        cr_expect(r.time.tokens <= (double)c.global_batch_tokens && r.time.tokens >= c.seq_len);
    }
    cr_expect(checked > 100, "only %d random clusters had a feasible layout", checked);
}

Test(plan, gemm_efficiency_falls_with_tensor_parallel_degree) {
    plan_cluster_t c = plan_published_cluster(16);
    plan_result_t t1 = eval("llama2-7b", &c, 16, 1, true, false, false, 1);
    plan_result_t t8 = eval("llama2-7b", &c, 16, 8, true, false, false, 8);
    cr_assert(t1.feasible && t8.feasible, "%s / %s", t1.reason, t8.reason);
    /* the same work per GPU per step; T = 8 runs narrower GEMMs */
    cr_expect(t8.time.compute > t1.time.compute * 1.05, "T=8 %.3f s vs T=1 %.3f s", t8.time.compute, t1.time.compute);
    cr_expect(t8.time.tp_comm > 0 && t1.time.tp_comm == 0);
}

/* ---- API for the worker and validation ---- */

Test(plan, choose_shard_degree) {
    plan_params_t p = plan_default_params();
    char err[512];
    plan_cluster_t c = plan_published_cluster(16);
    int S = plan_choose_shard_degree(llama_preset("llama2-7b"), &c, 1, &p, err, sizeof err);
    cr_assert(S > 0, "%s", err);
    cr_expect_eq(128 % S, 0);
    plan_list_t l;
    plan_options_t o = { .T = 1 };
    cr_assert_eq(plan_enumerate(llama_preset("llama2-7b"), &c, &p, &o, &l, err, sizeof err), 0);
    cr_expect_eq(S, l.feasible[0].layout.S);
    for (size_t i = 0; i < l.n_feasible; i++) cr_expect(l.feasible[0].time.tflops >= l.feasible[i].time.tflops);
    plan_list_free(&l);

    plan_cluster_t one = plan_published_cluster(1);
    int bad = plan_choose_shard_degree(llama_preset("llama2-70b"), &one, 0, &p, err, sizeof err);
    cr_expect_eq(bad, -1);
    cr_expect(strstr(err, "fits") != NULL, "%s", err);
}

Test(plan, cluster_validation_names_the_field) {
    plan_cluster_t ok = plan_published_cluster(16);
    char err[512];
    cr_expect_eq(plan_cluster_validate(&ok, NULL, err, sizeof err), 0, "%s", err);
    struct { plan_cluster_t c; const char *needle; } bad[6];
    for (int i = 0; i < 6; i++) bad[i].c = ok;
    bad[0].c.gpu = NULL; bad[0].needle = "unknown GPU";
    bad[1].c.nodes = 0; bad[1].needle = "--nodes";
    bad[2].c.seq_len = 0; bad[2].needle = "--seq-len";
    bad[3].c.global_batch_tokens = 4095; bad[3].needle = "smaller than one sequence";
    bad[4].c.gpus_per_node = 0; bad[4].needle = "--gpus-per-node";
    bad[5].c.net_gbps = 0; bad[5].needle = "--net-gbps";
    for (int i = 0; i < 6; i++) {
        cr_expect_eq(plan_cluster_validate(&bad[i].c, NULL, err, sizeof err), -1, "case %d accepted", i);
        cr_expect(strstr(err, bad[i].needle) != NULL, "case %d: '%s' lacks '%s'", i, err, bad[i].needle);
    }
    cr_expect_null(plan_gpu_lookup("v100"));
    for (size_t i = 0; i < N_GPU_NAMES; i++) cr_expect_not_null(plan_gpu_lookup(gpu_names[i]));
    cr_expect_eq(plan_gpu_lookup("H100"), plan_gpu_lookup("h100-80gb"));
    cr_expect_eq(plan_gpu_lookup("B200-180GB"), plan_gpu_lookup("b200"));
}

/* ---- attention, context parallelism, calibration ---- */

static plan_result_t eval_c(const char *model, const plan_cluster_t *c, int S, int T, int C, bool ckpt, int mb) {
    plan_params_t p = plan_default_params();
    plan_layout_t l = { .S = S, .T = T, .C = C, .ckpt = ckpt, .micro_batch = mb };
    plan_result_t r;
    plan_evaluate(llama_preset(model), c, &p, &l, &r);
    return r;
}

/* Causal attention is quadratic in the sequence: at a fixed number of
 * tokens per micro-batch, doubling the sequence doubles its time, while the
 * GEMMs stay the same. */
Test(plan, attention_time_is_quadratic_gemm_linear) {
    rng_seed(0xa77e);
    for (int iter = 0; iter < 40; iter++) {
        plan_cluster_t c = plan_published_cluster(8);
        c.gpu = plan_gpu_lookup(gpu_names[rng_next() % N_GPU_NAMES]);
        int seq = 1024 << (rng_next() % 4), mb = 2 << (rng_next() % 3);
        c.seq_len = seq;
        c.global_batch_tokens = (int64_t)64 * seq * mb;
        plan_result_t a = eval_c("llama2-7b", &c, 64, 1, 1, true, mb);
        c.seq_len = 2 * seq;
        plan_result_t b = eval_c("llama2-7b", &c, 64, 1, 1, true, mb / 2);
        cr_assert(a.mem.total > 0 && b.mem.total > 0, "%s / %s", a.reason, b.reason);
        double ta = a.time.attn_fwd + a.time.attn_bwd, tb = b.time.attn_fwd + b.time.attn_bwd;
        cr_expect(fabs(tb / ta - 2) < 1e-9, "attention %.4f s at seq %d, %.4f s at %d", ta, seq, tb, 2 * seq);
        cr_expect(fabs(b.time.gemm / a.time.gemm - 1) < 1e-9, "GEMMs %.4f vs %.4f", a.time.gemm, b.time.gemm);
        /* backward over forward: 2.5 x the FLOPs at the kernels' two rates (forward counted twice with recompute) */
        double ratio = a.time.attn_bwd / (a.time.attn_fwd / 2);
        cr_expect(fabs(ratio - 2.5 * c.gpu->attn_fwd_tflops / c.gpu->attn_bwd_tflops) < 1e-9, "bwd/fwd %.4f", ratio);
    }
}

/* Context parallelism splits a sequence's activations over C ranks and
 * costs ring traffic; more C, less memory. */
Test(plan, context_parallel_divides_activations_and_costs_ring_traffic) {
    rng_seed(0xc0ffee);
    for (int iter = 0; iter < 40; iter++) {
        plan_cluster_t c = plan_published_cluster(16);
        c.gpu = plan_gpu_lookup(gpu_names[rng_next() % N_GPU_NAMES]);
        c.seq_len = 8192 << (rng_next() % 3);
        c.global_batch_tokens = (int64_t)128 * c.seq_len;
        int C = 2 << (rng_next() % 3); /* 2..8 */
        bool ckpt = rng_next() & 1;
        plan_result_t one = eval_c("llama2-7b", &c, 16, 1, 1, ckpt, 1);
        plan_result_t cp = eval_c("llama2-7b", &c, 16 / C, 1, C, ckpt, 1);
        cr_assert(one.mem.total > 0 && cp.mem.total > 0, "%s / %s", one.reason, cp.reason);
        cr_expect(cp.mem.acts < one.mem.acts / C * 1.25, "C=%d: activations %.2f GiB vs %.2f at C=1", C,
                  cp.mem.acts / GIB, one.mem.acts / GIB);
        cr_expect(cp.mem.attn_ws > 0 && one.mem.attn_ws > 0);
        cr_expect(one.time.cp_comm == 0 && cp.time.cp_comm > 0);
        cr_expect(cp.time.cp_exposed >= 0 && cp.time.cp_exposed <= cp.time.cp_comm * 1.0001 + 1e-12);
        /* the same attention work per GPU in total: 1/C of each sequence, C times the sequences */
        double ta = one.time.attn_fwd + one.time.attn_bwd, tc = cp.time.attn_fwd + cp.time.attn_bwd;
        cr_expect(fabs(tc / ta - 1) < 1e-6, "attention %.4f s vs %.4f s", tc, ta);
        /* across nodes the ring is slower than inside one */
        plan_result_t wide = eval_c("llama2-7b", &c, 1, 1, 16, ckpt, 1);
        plan_result_t in8 = eval_c("llama2-7b", &c, 2, 1, 8, ckpt, 1);
        if (wide.mem.total > 0 && in8.mem.total > 0)
            cr_expect(wide.time.cp_comm / 15 > in8.time.cp_comm / 7, "per-step ring time across nodes not above in-node");
    }
    plan_cluster_t c = plan_published_cluster(16);
    plan_result_t r = eval_c("llama2-7b", &c, 1, 1, 3, true, 1);
    cr_expect(!r.feasible && strstr(r.reason, "C=3") == NULL && strstr(r.reason, "does not divide"), "%s", r.reason);
    c.seq_len = 4100;
    c.global_batch_tokens = 4100 * 128;
    r = eval_c("llama2-7b", &c, 32, 1, 4, true, 1);
    cr_expect(!r.feasible && strstr(r.reason, "equal chunks"), "%s", r.reason);
}

/* A measured block time equal to k x the estimate scales every block term
 * by k and leaves communication alone. */
Test(plan, calibration_scale_multiplies_block_terms) {
    rng_seed(0x5ca1e);
    plan_params_t p = plan_default_params();
    for (int iter = 0; iter < 20; iter++) {
        plan_cluster_t c = plan_published_cluster(4);
        c.gpu = plan_gpu_lookup(gpu_names[rng_next() % N_GPU_NAMES]);
        plan_measured_t m = { .seq_len = c.seq_len, .micro_batch = 1 + (int)(rng_next() % 4), .T = 1, .C = 1,
                              .ckpt = rng_next() & 1 };
        const llama_config_t *cfg = llama_preset("llama2-7b");
        double est = plan_block_time_estimate(cfg, &c, &p, &m);
        cr_assert(est > 0);
        double k = 1.2 + (double)(rng_next() % 1000) / 1000.0;
        plan_result_t a = eval_c("llama2-7b", &c, 32, 1, 1, m.ckpt, 1);
        c.block_time_scale = k * est / est;
        plan_result_t b = eval_c("llama2-7b", &c, 32, 1, 1, m.ckpt, 1);
        cr_expect(fabs(b.time.attn_fwd / a.time.attn_fwd - k) < 1e-9);
        cr_expect(fabs(b.time.elementwise / a.time.elementwise - k) < 1e-9);
        cr_expect(b.time.gemm > a.time.gemm && b.time.gemm < k * a.time.gemm, "output GEMM is not a block term");
        cr_expect(fabs(b.time.shard_comm - a.time.shard_comm) < 1e-12);
        cr_expect(b.time.step > a.time.step);
    }
}
