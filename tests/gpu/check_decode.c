/* check_decode.c: KV-cached decoding on the GPU against the CPU oracle.
 *   1. attention_decode (decode.cu) on random bf16 queries and caches: one
 *      new row at position 0, one row over a cache of several chunks, a
 *      prompt of several rows, grouped-query heads, head widths 64 and 128.
 *   2. greedy generation (workers/model/generate.h) of a small random
 *      Llama, the same bf16-rounded weights on both backends: the GPU's
 *      tokens equal the CPU's token for token. bf16 activations move the
 *      logits a little (rel L2 under 1%), so at a step whose two best CPU
 *      logits are closer than GEN_TIE the two may pick differently: the
 *      sequences must be equal up to their first difference, which is
 *      allowed only at such a near tie and only after GEN_MIN_STEPS equal
 *      tokens; the logits of the compared steps must agree within
 *      4 * GC_BF16_TOL of (|cpu| + rms): two blocks of bf16-rounded
 *      activations, each op rounding once. */
#include "tests/gpu/gpucheck.h"
#include "workers/model/generate.h"
#include "workers/model/model.h"

#define GEN_TIE 0.15        /* logit gap under which bf16 may swap the two best */
#define GEN_MIN_STEPS 12

static void run_op(int n, int p0, int H, int Hkv, int Dh) {
    if (!gc_case("op_n%d_p0%d_H%d_Hkv%d_Dh%d", n, p0, H, Hkv, Dh)) return;
    int P = p0 + n;
    size_t nq = (size_t)n * H * Dh, nc = (size_t)P * Hkv * Dh;
    float *q = gc_host(nq), *kc = gc_host(nc), *vc = gc_host(nc), *out = gc_host(nq);
    gc_rand(q, nq, -2, 2); gc_rand(kc, nc, -2, 2); gc_rand(vc, nc, -1, 1);
    gc_round_bf16(q, nq); gc_round_bf16(kc, nc); gc_round_bf16(vc, nc);
    act_t *gq = gc_dev_act(q, nq), *gk = gc_dev_act(kc, nc), *gv = gc_dev_act(vc, nc), *go = gc_dev_act(out, nq);
    gc_poison_act(go, nq);
    GC.cpu->attention_decode(out, q, kc, vc, n, p0, H, Hkv, Dh);
    GC.gpu->attention_decode(go, gq, gk, gv, n, p0, H, Hkv, Dh);
    float *got = gc_get_act(go, nq);
    gc_compare("out", got, out, nq, GC_BF16_TOL);
    GC.gpu->free(gq); GC.gpu->free(gk); GC.gpu->free(gv); GC.gpu->free(go);
    free(q); free(kc); free(vc); free(out); free(got);
}

/* Greedy continuation of prompt on backend be: new tokens into toks,
 * their logits (steps, V) into logits. */
static int generate(const backend_t *be, const llama_config_t *c, const float *params, const int32_t *prompt, int np,
                    int steps, int32_t *toks, float *logits) {
    model_t m;
    gen_t g;
    char err[512];
    if (model_create(&m, c, be, 1, 1, false, err, sizeof err)) { printf("# model_create: %s\n", err); return -1; }
    model_set_params(&m, params);
    if (gen_create(&g, &m, np + steps, np, err, sizeof err)) { printf("# gen_create: %s\n", err); model_destroy(&m); return -1; }
    gen_sampling_t greedy = { 0 };
    uint64_t rng = 1;
    int rc = gen_feed(&g, prompt, np, logits, err, sizeof err);
    for (int i = 0; rc == 0 && i < steps; i++) {
        toks[i] = gen_sample(logits + (size_t)i * c->vocab, c->vocab, &greedy, &rng);
        if (i + 1 < steps) rc = gen_feed(&g, &toks[i], 1, logits + (size_t)(i + 1) * c->vocab, err, sizeof err);
    }
    if (rc) printf("# gen_feed: %s\n", err);
    gen_destroy(&g);
    model_destroy(&m);
    return rc;
}

/* The gap between the two largest of x (V). */
static double top2_gap(const float *x, int V) {
    double a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (x[i] > a) { b = a; a = x[i]; }
        else if (x[i] > b) b = x[i];
    }
    return a - b;
}

static void run_gen(int np, int steps) {
    if (!gc_case("greedy_prompt%d_new%d", np, steps)) return;
    llama_config_t c = { .dim = 128, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .head_dim = 64, .ffn_dim = 256,
                         .vocab = 384, .max_seq = 64, .rms_eps = 1e-5f, .rope_theta = 10000.f };
    snprintf(c.name, sizeof c.name, "decode-check");
    model_t lay;
    char err[512];
    if (model_layout(&lay, &c, err, sizeof err)) { printf("not ok - %s/%s # %s\n", GC.family, GC.name, err); GC.cases++; GC.failed++; return; }
    /* weights of unit gain (uniform, variance 1/in), norms
     * around 1, the head scaled so the logits spread over several units:
     * the greedy choice is then decided by margins bf16 keeps */
    float *p = gc_host(lay.n_params);
    for (int i = 0; i < lay.n_tensors; i++) {
        const model_tensor_t *t = &lay.tensors[i];
        float *x = p + t->offset;
        if (t->ndim == 1) { gc_rand(x, t->numel, 0.8f, 1.2f); continue; }
        float a = (float)sqrt(3.0 / (double)t->shape[1]) * (t->offset == lay.lm_head_off ? 4.f : 1.f);
        gc_rand(x, t->numel, -a, a);
    }
    gc_round_bf16(p, lay.n_params);
    int32_t prompt[64], tc[64], tg[64];
    gc_rand_tokens(prompt, (size_t)np, c.vocab);
    float *lc = gc_host((size_t)steps * c.vocab), *lg = gc_host((size_t)steps * c.vocab);
    if (generate(GC.cpu, &c, p, prompt, np, steps, tc, lc) || generate(GC.gpu, &c, p, prompt, np, steps, tg, lg)) {
        GC.cases++; GC.failed++;
        printf("not ok - %s/%s # generation failed\n", GC.family, GC.name);
    } else {
        /* equal up to the first difference; a difference is excused only at
         * a near tie of the CPU's logits, and ends the comparison there */
        int same = 0;
        while (same < steps && tc[same] == tg[same]) same++;
        bool tie = same < steps && top2_gap(lc + (size_t)same * c.vocab, c.vocab) < GEN_TIE;
        int decided = same;
        printf("# greedy: %d new tokens, %d equal%s; cpu:", steps, same,
               same == steps ? "" : tie ? ", then a near tie" : ", then a decided step differs");
        for (int i = 0; i < steps; i++) printf(" %d", tc[i]);
        printf("\n#   gpu:");
        for (int i = 0; i < steps; i++) printf(" %d", tg[i]);
        printf("\n");
        GC.cases++;
        if (same < steps && !tie) {
            GC.failed++;
            printf("not ok - %s/%s/tokens # token %d differs (gpu %d, cpu %d) where the CPU's two best logits are "
                   "%.3f apart\n", GC.family, GC.name, same, tg[same], tc[same],
                   top2_gap(lc + (size_t)same * c.vocab, c.vocab));
        } else if (same < GEN_MIN_STEPS) {
            GC.failed++;
            printf("not ok - %s/%s/tokens # a near tie at step %d leaves fewer than %d steps compared\n", GC.family,
                   GC.name, same, GEN_MIN_STEPS);
        } else {
            printf("ok - %s/%s/tokens\n", GC.family, GC.name);
        }
        /* then the compared steps' logits themselves */
        /* (the logits of the step that differs were computed from the same tokens too) */
        if (decided > 0) gc_compare("logits", lg, lc, (size_t)(decided < steps ? decided + 1 : steps) * c.vocab, GC_BF16_TOL * 4);
    }
    free(p); free(lc); free(lg);
    model_destroy(&lay);
}

int main(void) {
    gc_init("decode");
    bool emu = gc_emulated();
    run_op(1, 0, 2, 1, 64);
    run_op(1, emu ? 300 : 4000, 4, 2, 64);
    run_op(5, 37, 4, 4, 128);
    run_op(3, 129, 6, 2, 64);
    run_gen(emu ? 6 : 16, emu ? 20 : 48);
    run_gen(1, emu ? 16 : 48);
    return gc_done();
}
