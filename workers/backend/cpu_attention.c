/* cpu_attention.c: causal grouped-query attention of the CPU backend as
 * GEMMs over tiles.
 *
 * Forward, per (batch, head, tile of BQ queries [t0, t1)): the scores of the
 * tile against keys [0, t1) are one sgemm (BQ x t1 x Dh; the keys after the
 * tile, the causal half, are never touched), the softmax runs along each
 * row with the vectorised exp (keys after the query masked to 0), and the
 * output tile is one more sgemm (P @ V). A tile's whole row of scores fits
 * in a BQ x T scratch, so the softmax is exact per row and needs no online
 * rescaling across key tiles. What the forward keeps for the backward is
 * the log-sum-exp of each row, (B, H, T) floats, not the probabilities.
 *
 * Backward, per (batch, kv head): for each query head of the group and
 * each query tile, the probabilities are recomputed from the scores and the
 * log-sum-exp, dP = dO V^T, dS = P (dP - rowsum(dO * O)) / sqrt(Dh), and
 * dq = dS K, dk += dS^T Q, dv += P^T dO, all sgemm. The tiles and heads of
 * one kv head run in one thread in a fixed order, so dk and dv are summed
 * without races and in the same order for any thread count. */
#include "workers/backend/cpu_internal.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "log.h"

#define BQ 64   /* queries per tile */

__attribute__((target_clones("arch=x86-64-v3", "default"), optimize("fp-contract=fast")))
float cpu_exp_sub(float *x, int n, float sub) {
    v8f acc = { 0 }, vs = V8_SPLAT(sub);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f e;
        V8_LD(e, x + i);
        e -= vs;
        cpu_expf8(&e);
        V8_ST(x + i, e);
        acc += e;
    }
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) {
        float e = cpu_expf(x[i] - sub);
        x[i] = e;
        s += e;
    }
    return s;
}

__attribute__((target_clones("arch=x86-64-v3", "default")))
static float row_max(const float *x, int n) {
    v8f m8 = V8_SPLAT(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f a;
        V8_LD(a, x + i);
        m8 = (v8f)(((v8i)a & (a > m8)) | ((v8i)m8 & ~(a > m8)));
    }
    float m = -INFINITY;
    for (int l = 0; l < 8; l++) m = m8[l] > m ? m8[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

__attribute__((target_clones("arch=x86-64-v3", "default")))
static float dot(const float *a, const float *b, int n) {
    v8f acc = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f x, y;
        V8_LD(x, a + i);
        V8_LD(y, b + i);
        acc += x * y;
    }
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* dr[u] = pr[u] * (dr[u] - d) * sc: the softmax backward of one row. */
__attribute__((target_clones("arch=x86-64-v3", "default")))
static void softmax_bwd_row(float *dr, const float *pr, float d, float sc, int n) {
    v8f vd = V8_SPLAT(d), vsc = V8_SPLAT(sc);
    int u = 0;
    for (; u + 8 <= n; u += 8) {
        v8f p8, d8;
        V8_LD(p8, pr + u);
        V8_LD(d8, dr + u);
        d8 = p8 * (d8 - vd) * vsc;
        V8_ST(dr + u, d8);
    }
    for (; u < n; u++) dr[u] = pr[u] * (dr[u] - d) * sc;
}

void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                       int B, int T, int H, int Hkv, int Dh) {
    int rep = H / Hkv, nqt = (T + BQ - 1) / BQ;
    float sc = (float)(1.0 / sqrt((double)Dh));
    int qs = H * Dh, ks = Hkv * Dh;
#pragma omp parallel if ((double)B * H * T * T * Dh > PAR_MIN_FLOPS)
    {
        float *s = malloc((size_t)BQ * T * sizeof(float));
        CHECK_ALLOC(s);
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int qt = 0; qt < nqt; qt++) {
                    int t0 = qt * BQ, t1 = t0 + BQ < T ? t0 + BQ : T, m = t1 - t0, n = t1;
                    const float *qb = q + ((size_t)b * T + t0) * qs + (size_t)h * Dh;
                    const float *kb = k + (size_t)b * T * ks + (size_t)(h / rep) * Dh;
                    const float *vb = v + (size_t)b * T * ks + (size_t)(h / rep) * Dh;
                    cpu_gemm1(false, true, m, n, Dh, sc, qb, qs, kb, ks, 0.f, s, n);
                    for (int i = 0; i < m; i++) {
                        float *row = s + (size_t)i * n;
                        int len = t0 + i + 1;    /* keys 0 .. t */
                        float mx = row_max(row, len);
                        float sum = cpu_exp_sub(row, len, mx);
                        float inv = 1.f / sum;
                        for (int u = 0; u < len; u++) row[u] *= inv;
                        for (int u = len; u < n; u++) row[u] = 0.f;
                        lse[((size_t)b * H + h) * T + t0 + i] = mx + logf(sum);
                    }
                    cpu_gemm1(false, false, m, Dh, n, 1.f, s, n, vb, ks, 0.f,
                              out + ((size_t)b * T + t0) * qs + (size_t)h * Dh, qs);
                }
        free(s);
    }
}

void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *q,
                       const float *k, const float *v, const float *lse, int B, int T, int H, int Hkv, int Dh) {
    int rep = H / Hkv, nqt = (T + BQ - 1) / BQ;
    float sc = (float)(1.0 / sqrt((double)Dh));
    int qs = H * Dh, ks = Hkv * Dh;
#pragma omp parallel if ((double)B * H * T * T * Dh > PAR_MIN_FLOPS)
    {
        float *p = malloc((size_t)BQ * T * sizeof(float)), *dp = malloc((size_t)BQ * T * sizeof(float));
        CHECK_ALLOC(p);
        CHECK_ALLOC(dp);
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < Hkv; kh++) {
                const float *kb = k + (size_t)b * T * ks + (size_t)kh * Dh;
                const float *vb = v + (size_t)b * T * ks + (size_t)kh * Dh;
                float *dkb = dk + (size_t)b * T * ks + (size_t)kh * Dh;
                float *dvb = dv + (size_t)b * T * ks + (size_t)kh * Dh;
                for (int t = 0; t < T; t++) {
                    memset(dkb + (size_t)t * ks, 0, (size_t)Dh * sizeof(float));
                    memset(dvb + (size_t)t * ks, 0, (size_t)Dh * sizeof(float));
                }
                for (int h = kh * rep; h < (kh + 1) * rep; h++)
                    for (int qt = 0; qt < nqt; qt++) {
                        int t0 = qt * BQ, t1 = t0 + BQ < T ? t0 + BQ : T, m = t1 - t0, n = t1;
                        size_t qoff = ((size_t)b * T + t0) * qs + (size_t)h * Dh;
                        const float *lrow = lse + ((size_t)b * H + h) * T + t0;
                        /* P from the scores and the log-sum-exp, keys after the query 0 */
                        cpu_gemm1(false, true, m, n, Dh, sc, q + qoff, qs, kb, ks, 0.f, p, n);
                        for (int i = 0; i < m; i++) {
                            float *row = p + (size_t)i * n;
                            int len = t0 + i + 1;
                            cpu_exp_sub(row, len, lrow[i]);
                            for (int u = len; u < n; u++) row[u] = 0.f;
                        }
                        /* dP = dO V^T, then dS = P (dP - rowsum(dO * O)) * sc in place */
                        cpu_gemm1(false, true, m, n, Dh, 1.f, dout + qoff, qs, vb, ks, 0.f, dp, n);
                        for (int i = 0; i < m; i++) {
                            float d = dot(dout + qoff + (size_t)i * qs, out + qoff + (size_t)i * qs, Dh);
                            softmax_bwd_row(dp + (size_t)i * n, p + (size_t)i * n, d, sc, n);
                        }
                        cpu_gemm1(false, false, m, Dh, n, 1.f, dp, n, kb, ks, 0.f, dq + qoff, qs);
                        cpu_gemm1(true, false, n, Dh, m, 1.f, dp, n, q + qoff, qs, 1.f, dkb, ks);
                        cpu_gemm1(true, false, n, Dh, m, 1.f, p, n, dout + qoff, qs, 1.f, dvb, ks);
                    }
            }
        free(p);
        free(dp);
    }
}
