/* test_model.c: the model's parameter layout (HF names, shapes, one
 * contiguous buffer per block, tied output), the learning-rate schedule and
 * the clipping factor, the block-level API that sharded training uses, and
 * activation checkpointing's exactness. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/model.h"
#include "workers/optim.h"

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
