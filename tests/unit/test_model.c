/* test_model.c: the model's parameter layout (HF names, shapes, one
 * contiguous buffer per block, tied output), the learning-rate schedule and
 * the clipping factor, the block-level API that sharded training uses, and
 * activation checkpointing's exactness. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/model/model.h"
#include "workers/model/optim.h"

static llama_config_t small_cfg(bool tied) {
    llama_config_t c = { .dim = 24, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2, .head_dim = 6, .ffn_dim = 40,
                         .vocab = 37, .max_seq = 32, .rms_eps = 1e-5f, .rope_theta = 10000.f, .tie_embeddings = tied };
    snprintf(c.name, sizeof c.name, "test");
    return c;
}

Test(model, layout_names_shapes_and_blocks) {
    for (int tied = 0; tied <= 1; tied++) {
        llama_config_t c = small_cfg(tied);
        model_t m;
        char err[256];
        cr_assert_eq(model_layout(&m, &c, err, sizeof err), 0, "%s", err);
        cr_assert_eq((int64_t)m.n_params, llama_total_params(&c));
        cr_assert_eq(m.n_tensors, 1 + 9 * c.n_layers + 1 + (tied ? 0 : 1));
        /* tensors tile the buffer in order, without gaps or overlaps */
        size_t next = 0;
        for (int i = 0; i < m.n_tensors; i++) {
            cr_assert_eq(m.tensors[i].offset, next, "%s", m.tensors[i].name);
            next += m.tensors[i].numel;
            cr_assert_eq(m.tensors[i].decay, m.tensors[i].ndim == 2);
        }
        cr_assert_eq(next, m.n_params);
        /* each block is one contiguous run of block_numel floats */
        for (int l = 0; l < c.n_layers; l++) {
            size_t lo = (size_t)-1, hi = 0;
            for (int i = 0; i < m.n_tensors; i++)
                if (m.tensors[i].block == l) {
                    if (m.tensors[i].offset < lo) lo = m.tensors[i].offset;
                    if (m.tensors[i].offset + m.tensors[i].numel > hi) hi = m.tensors[i].offset + m.tensors[i].numel;
                }
            cr_assert_eq(lo, m.blocks_off + (size_t)l * m.block_numel);
            cr_assert_eq(hi - lo, m.block_numel);
        }
        const model_tensor_t *t = model_find(&m, "model.layers.2.self_attn.k_proj.weight");
        cr_assert_not_null(t);
        cr_assert_eq(t->shape[0], c.n_kv_heads * c.head_dim);
        cr_assert_eq(t->shape[1], c.dim);
        t = model_find(&m, "model.layers.0.mlp.down_proj.weight");
        cr_assert(t && t->shape[0] == c.dim && t->shape[1] == c.ffn_dim);
        t = model_find(&m, "model.layers.1.post_attention_layernorm.weight");
        cr_assert(t && t->ndim == 1 && t->shape[0] == c.dim && !t->decay);
        cr_assert_eq(model_find(&m, "lm_head.weight") == NULL, tied);
        cr_assert_eq(m.lm_head_off == m.embed_off, tied);
        model_destroy(&m);
    }
}

Test(model, lr_schedule_and_clip) {
    optim_config_t c = { .lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .total_steps = 24, .schedule = LR_COSINE };
    cr_assert_float_eq(optim_lr(&c, 0), 0.25, 1e-12);
    cr_assert_float_eq(optim_lr(&c, 3), 1.0, 1e-12);
    cr_assert_float_eq(optim_lr(&c, 4), 1.0, 1e-12);                  /* cosine starts at the peak */
    cr_assert_float_eq(optim_lr(&c, 14), 0.55, 1e-12);                /* halfway: (peak + min) / 2 */
    cr_assert_float_eq(optim_lr(&c, 24), 0.1, 1e-12);
    cr_assert_float_eq(optim_lr(&c, 99), 0.1, 1e-12);                 /* stays at the floor */
    cr_assert(optim_lr(&c, 10) > optim_lr(&c, 11));
    c.schedule = LR_CONSTANT;
    cr_assert_float_eq(optim_lr(&c, 1), 0.5, 1e-12);
    cr_assert_float_eq(optim_lr(&c, 20), 1.0, 1e-12);
    c.warmup_steps = 0;
    cr_assert_float_eq(optim_lr(&c, 0), 1.0, 1e-12);
    cr_assert_float_eq(optim_clip_coef(4.0, 1.0), (float)(1.0 / (4.0 + 1e-6)), 1e-9);
    cr_assert_eq(optim_clip_coef(0.5, 1.0), 1.0f);
    cr_assert_eq(optim_clip_coef(50.0, 0.0), 1.0f);
}

/* The linear and warmup-stable-decay schedules against their formulas,
 * written here step by step for random settings: warmup, then (linear) a
 * straight line from the peak to the floor over the steps after warmup,
 * or (wsd) the peak until the last round(f * S) steps, which fall in a
 * straight line to the floor. */
Test(model, lr_schedule_linear_wsd) {
    srand(20261201);
    for (int trial = 0; trial < 200; trial++) {
        optim_config_t c = { .lr = 1e-4 + (double)rand() / RAND_MAX, .total_steps = 1 + rand() % 300 };
        c.min_lr = c.lr * (double)rand() / RAND_MAX * 0.5;
        c.warmup_steps = rand() % (c.total_steps + 1);
        c.decay_fraction = 0.01 + 0.99 * (double)rand() / RAND_MAX;
        int64_t S = c.total_steps, W = c.warmup_steps;
        int64_t dd = (int64_t)floor(c.decay_fraction * S + 0.5);
        if (dd > S - W) dd = S - W;
        for (int64_t k = 0; k < S + 3; k++) {
            double want_lin, want_wsd;
            if (k < W) {
                want_lin = want_wsd = c.lr * (k + 1) / W;
            } else {
                double span = S - W > 1 ? (double)(S - W) : 1.0, p = (k - W) / span;
                want_lin = c.lr - (c.lr - c.min_lr) * (p < 1 ? p : 1);
                if (k < S - dd) want_wsd = c.lr;
                else {
                    double q = (k - (S - dd)) / (dd > 1 ? (double)dd : 1.0);
                    want_wsd = c.lr - (c.lr - c.min_lr) * (q < 1 ? q : 1);
                }
            }
            c.schedule = LR_LINEAR;
            double got = optim_lr(&c, k);
            cr_assert(fabs(got - want_lin) <= 1e-12 * c.lr, "linear S %lld W %lld k %lld: %.17g vs %.17g",
                      (long long)S, (long long)W, (long long)k, got, want_lin);
            c.schedule = LR_WSD;
            got = optim_lr(&c, k);
            cr_assert(fabs(got - want_wsd) <= 1e-12 * c.lr, "wsd S %lld W %lld f %g k %lld: %.17g vs %.17g",
                      (long long)S, (long long)W, c.decay_fraction, (long long)k, got, want_wsd);
        }
    }
    /* a worked case: 10 steps, warmup 2, decay over the last 4 */
    optim_config_t c = { .lr = 1.0, .min_lr = 0.2, .warmup_steps = 2, .total_steps = 10, .schedule = LR_WSD,
                         .decay_fraction = 0.4 };
    double want[10] = { 0.5, 1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4 };
    for (int k = 0; k < 10; k++) cr_assert_float_eq(optim_lr(&c, k), want[k], 1e-12, "wsd step %d", k);
    cr_assert_eq(optim_schedule_parse("wsd"), LR_WSD);
    cr_assert_eq(optim_schedule_parse("linear"), LR_LINEAR);
    cr_assert_eq(optim_schedule_parse("cosine"), LR_COSINE);
    cr_assert_eq(optim_schedule_parse("step"), -1);
    cr_assert_str_eq(optim_schedule_name(LR_WSD), "wsd");
}

/* Chaining model_block_forward from the embedding reproduces the model's
 * last block output bit for bit, and activation checkpointing (recompute in
 * backward) gives bit-identical loss and gradients. */
Test(model, block_chain_and_activation_checkpointing) {
    llama_config_t c = small_cfg(false);
    const backend_t *be = backend_cpu(1);
    model_t m, mc;
    char err[256];
    int B = 2, T = 7, N = B * T;
    cr_assert_eq(model_create(&m, &c, be, B, T, false, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_create(&mc, &c, be, B, T, true, err, sizeof err), 0, "%s", err);
    model_init_random(&m, 42);
    model_init_random(&mc, 42);
    int32_t tok[14], tgt[14];
    for (int i = 0; i < N; i++) { tok[i] = (i * 7 + 3) % c.vocab; tgt[i] = (i * 11 + 5) % c.vocab; }
    model_zero_grads(&m);
    model_zero_grads(&mc);
    double loss = model_forward(&m, tok, tgt), lossc = model_forward(&mc, tok, tgt);
    cr_assert(loss > 0 && isfinite(loss));
    cr_assert_eq(loss, lossc);
    model_backward(&m, 1.0f / N);
    model_backward(&mc, 1.0f / N);
    cr_assert(memcmp(m.grads, mc.grads, m.n_params * sizeof(float)) == 0,
              "activation checkpointing changed the gradients");
    double gn = be->sumsq(m.grads, m.n_params);
    cr_assert(gn > 0 && isfinite(gn));

    float *x[4];
    for (int l = 0; l <= c.n_layers; l++) x[l] = calloc((size_t)N * c.dim, sizeof(float));
    be->embedding_fwd(x[0], tok, m.params + m.embed_off, N, c.dim);
    block_acts_t *a = &mc.acts[0];
    for (int l = 0; l < c.n_layers; l++) model_block_forward(&mc, model_block_params(&mc, l), x[l], x[l + 1], a);
    cr_assert(memcmp(x[c.n_layers], m.xs[c.n_layers], (size_t)N * c.dim * sizeof(float)) == 0,
              "block-by-block output differs from model_forward");
    for (int l = 0; l <= c.n_layers; l++) free(x[l]);
    model_destroy(&m);
    model_destroy(&mc);
}

/* The CPU backend with its allocations tracked: which buffers are live,
 * and frees of buffers that are not. */
enum { TRACK_MAX = 512 };
static const backend_t *g_cpu;
static void *g_live[TRACK_MAX];
static int g_bad_frees;

static void *track_alloc(size_t bytes) {
    void *p = g_cpu->alloc(bytes);
    for (int i = 0; p && i < TRACK_MAX; i++)
        if (!g_live[i]) { g_live[i] = p; return p; }
    cr_assert_fail("more than %d live buffers", TRACK_MAX);
    return NULL;
}
static void track_free(void *p) {
    for (int i = 0; i < TRACK_MAX; i++)
        if (p && g_live[i] == p) { g_live[i] = NULL; g_cpu->free(p); return; }
    g_bad_frees++;   /* not live: freed twice, or not this backend's */
}
static bool track_is_live(const void *p) {
    for (int i = 0; i < TRACK_MAX; i++) if (p && g_live[i] == p) return true;
    return false;
}
static int track_count(void) {
    int n = 0;
    for (int i = 0; i < TRACK_MAX; i++) n += g_live[i] != NULL;
    return n;
}

/* A memory saver's view of the block inputs (workers/offload/act.c): it
 * keeps the model's first buffers, frees the others, points inputs at
 * buffers of its own, and hands them back; the model computes the same
 * loss wherever the inputs are, and frees only the buffers it allocated. */
Test(model, block_inputs_a_saver_may_replace) {
    llama_config_t c = small_cfg(false);
    g_cpu = backend_cpu(1);
    backend_t tracked = *g_cpu;
    tracked.alloc = track_alloc;
    tracked.free = track_free;
    const backend_t *be = &tracked;
    model_t m;
    char err[256];
    int B = 2, T = 5, N = B * T, L = c.n_layers;
    size_t bytes = (size_t)N * c.dim * sizeof(float);
    cr_assert_eq(model_create(&m, &c, be, B, T, true, err, sizeof err), 0, "%s", err);
    model_init_random(&m, 1234);
    int32_t tok[10], tgt[10];
    for (int i = 0; i < N; i++) { tok[i] = (i * 13 + 1) % c.vocab; tgt[i] = (i * 5 + 2) % c.vocab; }
    double ref = model_forward(&m, tok, tgt);
    cr_assert(ref > 0 && isfinite(ref));
    act_t *own[4];
    for (int l = 0; l <= L; l++) {
        own[l] = model_block_input(&m, l);
        cr_assert_not_null(own[l]);
        for (int j = 0; j < l; j++) cr_assert_neq(own[j], own[l], "block inputs %d and %d share a buffer", j, l);
    }
    /* keep 2 of the 4 buffers; the saver brings its own for inputs 2 and 3 */
    int live = track_count();
    model_drop_block_inputs(&m, 2);
    cr_assert(model_block_input(&m, 0) == own[0] && model_block_input(&m, 1) == own[1]);
    cr_assert(model_block_input(&m, 2) == NULL && model_block_input(&m, 3) == NULL);
    cr_assert(!track_is_live(own[2]) && !track_is_live(own[3]) && track_count() == live - 2,
              "the dropped buffers were not freed");
    act_t *mine[2] = { be->alloc(bytes), be->alloc(bytes) };
    cr_assert(mine[0] && mine[1]);
    memset(mine[0], 0, bytes);
    memset(mine[1], 0, bytes);
    model_set_block_input(&m, 2, mine[0]);
    model_set_block_input(&m, 3, mine[1]);
    cr_assert_eq(model_block_input(&m, 3), mine[1]);
    double loss = model_forward(&m, tok, tgt);
    cr_assert_eq(loss, ref, "loss %.9g with the inputs moved, %.9g in the model's buffers", loss, ref);
    cr_assert_gt(be->sumsq((float *)mine[1], (size_t)N * c.dim), 0, "the last block's output went elsewhere");
    model_reset_block_inputs(&m);
    cr_assert(model_block_input(&m, 0) == own[0] && model_block_input(&m, 1) == own[1]);
    cr_assert(model_block_input(&m, 2) == NULL && model_block_input(&m, 3) == NULL);
    /* an input left on the saver's buffer: model_destroy frees the model's only */
    model_set_block_input(&m, 3, mine[1]);
    model_destroy(&m);
    cr_assert_eq(g_bad_frees, 0, "%d frees of buffers that were not live", g_bad_frees);
    cr_assert(track_is_live(mine[0]) && track_is_live(mine[1]), "model_destroy freed the saver's buffer");
    cr_assert_eq(track_count(), 2, "model_destroy left %d of its own buffers", track_count() - 2);
    be->free(mine[0]);
    be->free(mine[1]);
    cr_assert_eq(g_bad_frees, 0);
}

/* Tensor parallelism: every TP rank's local elements map onto the full
 * tensor so that together they cover each element once (vocab padding
 * maps nowhere), with the split the table declares. */
Test(model, tp_split_covers_every_element_once) {
    llama_config_t c = small_cfg(false);   /* vocab 37: padded at T = 2 and 4 */
    c.n_kv_heads = 4;
    c.ffn_dim = 44;
    model_t m;
    char err[256];
    cr_assert_eq(model_layout(&m, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(model_find(&m, "model.layers.0.self_attn.q_proj.weight")->tp_dim, 0);
    cr_assert_eq(model_find(&m, "model.layers.0.self_attn.o_proj.weight")->tp_dim, 1);
    cr_assert_eq(model_find(&m, "model.layers.0.mlp.down_proj.weight")->tp_dim, 1);
    cr_assert_eq(model_find(&m, "model.layers.0.mlp.up_proj.weight")->tp_dim, 0);
    cr_assert_eq(model_find(&m, "model.norm.weight")->tp_dim, -1);
    cr_assert_eq(model_find(&m, "lm_head.weight")->tp_dim, 0);
    for (int T = 1; T <= 4; T *= 2) {
        for (int i = 0; i < m.n_tensors; i++) {
            const model_tensor_t *t = &m.tensors[i];
            int64_t ls[2] = { t->shape[0], t->shape[1] };
            if (t->tp_dim == 0) ls[0] = t->block < 0 ? (t->shape[0] + T - 1) / T : t->shape[0] / T;
            if (t->tp_dim == 1) ls[1] /= T;
            int *seen = calloc(t->numel, sizeof *seen);
            int pads = 0;
            for (int r = 0; r < T; r++)
                for (size_t j = 0; j < (size_t)(ls[0] * ls[1]); j++) {
                    int64_t k = model_tp_full_index(t, ls, r, j);
                    if (k < 0) { pads++; continue; }
                    cr_assert(k < (int64_t)t->numel, "%s: index %lld out of range", t->name, (long long)k);
                    seen[k]++;
                    /* the split dimension moves with the rank, the other stays */
                    int64_t row = k / t->shape[1], col = k % t->shape[1];
                    if (t->tp_dim == 0) cr_assert_eq(row / ls[0], r, "%s", t->name);
                    if (t->tp_dim == 1) cr_assert_eq(col / ls[1], r, "%s", t->name);
                }
            int want = t->tp_dim < 0 ? T : 1;
            for (size_t k = 0; k < t->numel; k++) cr_assert_eq(seen[k], want, "%s element %zu, T %d", t->name, k, T);
            if (t->block < 0 && t->tp_dim == 0)
                cr_assert_eq(pads, (int)((ls[0] * T - t->shape[0]) * t->shape[1]), "%s padding at T %d", t->name, T);
            else
                cr_assert_eq(pads, 0);
            free(seen);
        }
    }
    model_destroy(&m);
}

/* Degrees that do not divide the heads, kv heads, MLP rows or tokens are
 * refused with the numbers named, before any communicator is needed. */
Test(model, tp_degree_that_does_not_divide_is_named) {
    llama_config_t c = small_cfg(false);   /* 4 heads, 2 kv heads, ffn 40 */
    model_t m;
    char err[512];
    cr_assert_neq(model_create_tp(&m, &c, backend_cpu(1), 2, 8, false, 4, 0, NULL, err, sizeof err), 0);
    cr_assert(strstr(err, "--tensor-parallel-degree 4 does not divide num_key_value_heads 2"), "%s", err);
    c.n_kv_heads = 4;
    c.ffn_dim = 42;
    cr_assert_neq(model_create_tp(&m, &c, backend_cpu(1), 2, 8, false, 4, 0, NULL, err, sizeof err), 0);
    cr_assert(strstr(err, "does not divide intermediate_size 42"), "%s", err);
    c.ffn_dim = 40;
    cr_assert_neq(model_create_tp(&m, &c, backend_cpu(1), 1, 6, false, 4, 0, NULL, err, sizeof err), 0);
    cr_assert(strstr(err, "does not divide the 1 x 6 = 6 tokens"), "%s", err);
    cr_assert_neq(model_create_tp(&m, &c, backend_cpu(1), 1, 8, false, 4, 0, NULL, err, sizeof err), 0);
    cr_assert(strstr(err, "communicator"), "%s", err);
}
