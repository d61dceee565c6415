/* test_ring_attention.c: the CPU backend's ring-attention ops (attn_block_fwd,
 * attn_merge, attn_block_bwd) put together as context parallelism does
 * must give the backend's whole-sequence causal attention.
 *
 * One row of T = K * Tc tokens (K chunks; grouped-query heads H 4 / Hkv 2,
 * Dh 16, random q, k, v, dout): for each query chunk, its key chunks
 * (earlier ones whole, its own causally) in a random order, each pair's
 * output merged into the row's by log-sum-exp; then each pair's backward
 * from the merged output and log-sum-exp, in another random order. Output,
 * dq, dk and dv must match attention_fwd / attention_bwd within
 * 2e-5 + 1e-4 |ref| per element: both are fp32 with sums of at most T
 * terms in different orders and splits, so they differ by a few fp32
 * roundings (about 1e-6 here). The chunk sizes are odd and the chunk
 * counts those of C = 1, 2, 3 (K = 2C), so every pair kind occurs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "workers/backend/backend.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}
static float *rand_buf(size_t n) {
    float *p = malloc(n * sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++) p[i] = urand();
    return p;
}
static void shuffle(int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)((urand() + 1.f) * 0.5f * (float)(i + 1)) % (i + 1), t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

static void check_close(const char *what, const float *got, const float *ref, size_t n, int K) {
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(got[i] - ref[i]) <= 2e-5f + 1e-4f * fabsf(ref[i]),
                  "%d chunks: %s[%zu] = %.9g, whole-sequence attention %.9g", K, what, i, got[i], ref[i]);
}

static void run(int K, int Tc) {
    const backend_t *be = backend_cpu(2);
    const int H = 4, Hkv = 2, Dh = 16, T = K * Tc;
    size_t qn = (size_t)T * H * Dh, kn = (size_t)T * Hkv * Dh, qs = (size_t)H * Dh, ks = (size_t)Hkv * Dh;
    float *q = rand_buf(qn), *k = rand_buf(kn), *v = rand_buf(kn), *dout = rand_buf(qn);
    float *ref = malloc(qn * 4), *att = malloc(be->attention_state_numel(1, T, H) * 4);
    float *rdq = malloc(qn * 4), *rdk = malloc(kn * 4), *rdv = malloc(kn * 4);
    be->attention_fwd(ref, att, q, k, v, 1, T, H, Hkv, Dh);
    be->attention_bwd(rdq, rdk, rdv, dout, ref, q, k, v, att, 1, T, H, Hkv, Dh);

    float *out = malloc(qn * 4), *lse = malloc((size_t)T * H * 4), *ob = malloc((size_t)Tc * qs * 4),
          *lb = malloc((size_t)Tc * H * 4);
    int *order = malloc(sizeof(int) * (size_t)K);
    for (int qc = 0; qc < K; qc++) {
        for (int i = 0; i <= qc; i++) order[i] = i;
        shuffle(order, qc + 1);
        for (int i = 0; i <= qc; i++) {
            int kc = order[i];
            float *o = out + (size_t)qc * Tc * qs, *l = lse + (size_t)qc * Tc * H;
            const float *qp = q + (size_t)qc * Tc * qs, *kp = k + (size_t)kc * Tc * ks, *vp = v + (size_t)kc * Tc * ks;
            if (i == 0) be->attn_block_fwd(o, l, qp, kp, vp, Tc, Tc, H, Hkv, Dh, kc == qc);
            else {
                be->attn_block_fwd(ob, lb, qp, kp, vp, Tc, Tc, H, Hkv, Dh, kc == qc);
                be->attn_merge(o, l, ob, lb, Tc, H, Dh);
            }
        }
    }
    check_close("out", out, ref, qn, K);

    /* backward: every pair (qc, kc <= qc) once, in a random order */
    float *dq = calloc(qn, 4), *dk = calloc(kn, 4), *dv = calloc(kn, 4);
    int np = K * (K + 1) / 2, *pairs = malloc(sizeof(int) * (size_t)np), n = 0;
    for (int qc = 0; qc < K; qc++)
        for (int kc = 0; kc <= qc; kc++) pairs[n++] = qc * K + kc;
    shuffle(pairs, np);
    for (int p = 0; p < np; p++) {
        int qc = pairs[p] / K, kc = pairs[p] % K;
        size_t qo = (size_t)qc * Tc * qs, ko = (size_t)kc * Tc * ks;
        be->attn_block_bwd(dq + qo, dk + ko, dv + ko, dout + qo, out + qo, lse + (size_t)qc * Tc * H, q + qo, k + ko,
                           v + ko, Tc, Tc, H, Hkv, Dh, kc == qc);
    }
    check_close("dq", dq, rdq, qn, K);
    check_close("dk", dk, rdk, kn, K);
    check_close("dv", dv, rdv, kn, K);
    free(q), free(k), free(v), free(dout), free(ref), free(att), free(rdq), free(rdk), free(rdv);
    free(out), free(lse), free(ob), free(lb), free(order), free(dq), free(dk), free(dv), free(pairs);
}

Test(ring_attention, chunks_of_one_rank) { run(2, 7); }
Test(ring_attention, chunks_of_two_ranks) { run(4, 5); }
Test(ring_attention, chunks_of_three_ranks) { run(6, 3); }
