/* cpu_ring.c: the fp32 CPU ops of ring attention (context parallelism):
 * the attention of one (query chunk, key/value chunk) pair with its
 * log-sum-exp rows, the exact merge of two partial results by their
 * log-sum-exp, and the backward of one pair given the full rows' output
 * and log-sum-exp (the flash-attention backward, so the pairs of a row
 * can be taken in any order and any split). Contracts in backend.h;
 * workers/model/model.c drives them around the ring. */
#include "workers/backend/cpu_ring.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* below this many multiply-adds a loop stays on one thread */
#define RING_PAR_MIN_FLOPS 2e5

/* Parallel over query heads: each (t, h) row is written by one thread. */
void cpu_attn_block_fwd(float *out, float *lse, const float *q, const float *k, const float *v, int Tq, int Tk,
                        int H, int Hkv, int Dh, bool causal) {
    int rep = H / Hkv;
    float sc = (float)(1.0 / sqrt((double)Dh));
    size_t qs = (size_t)H * Dh, ks = (size_t)Hkv * Dh;
#pragma omp parallel for schedule(static) if ((double)H * Tq * Tk * Dh > RING_PAR_MIN_FLOPS)
    for (int h = 0; h < H; h++) {
        int kh = h / rep;
        float *s = malloc((size_t)Tk * sizeof(float));
        CHECK_ALLOC(s);
        for (int t = 0; t < Tq; t++) {
            const float *qt = q + (size_t)t * qs + (size_t)h * Dh;
            int nk = causal ? t + 1 : Tk;
            float mx = -INFINITY;
            for (int u = 0; u < nk; u++) {
                const float *ku = k + (size_t)u * ks + (size_t)kh * Dh;
                float d = 0;
                for (int i = 0; i < Dh; i++) d += qt[i] * ku[i];
                s[u] = d * sc;
                if (s[u] > mx) mx = s[u];
            }
            double sum = 0;
            for (int u = 0; u < nk; u++) { s[u] = expf(s[u] - mx); sum += s[u]; }
            float inv = (float)(1.0 / sum);
            float *o = out + (size_t)t * qs + (size_t)h * Dh;
            for (int i = 0; i < Dh; i++) o[i] = 0;
            for (int u = 0; u < nk; u++) {
                const float *vu = v + (size_t)u * ks + (size_t)kh * Dh;
                float p = s[u] * inv;
                for (int i = 0; i < Dh; i++) o[i] += p * vu[i];
            }
            lse[(size_t)t * H + h] = mx + (float)log(sum);
        }
        free(s);
    }
}

void cpu_attn_merge(float *out, float *lse, const float *out_b, const float *lse_b, int Tq, int H, int Dh) {
    for (size_t r = 0; r < (size_t)Tq * H; r++) {
        float la = lse[r], lb = lse_b[r], m = la > lb ? la : lb;
        float wa = expf(la - m), wb = expf(lb - m), z = wa + wb;
        float *o = out + r * (size_t)Dh;
        const float *ob = out_b + r * (size_t)Dh;
        wa /= z, wb /= z;
        for (int i = 0; i < Dh; i++) o[i] = o[i] * wa + ob[i] * wb;
        lse[r] = m + logf(z);
    }
}

/* Parallel over kv heads: the query heads sharing one run in one thread,
 * so dk and dv are summed without races, in a fixed order. */
void cpu_attn_block_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, int Tq, int Tk, int H, int Hkv, int Dh,
                        bool causal) {
    int rep = H / Hkv;
    float sc = (float)(1.0 / sqrt((double)Dh));
    size_t qs = (size_t)H * Dh, ks = (size_t)Hkv * Dh;
#pragma omp parallel for schedule(static) if ((double)H * Tq * Tk * Dh > RING_PAR_MIN_FLOPS)
    for (int kh = 0; kh < Hkv; kh++) {
        for (int h = kh * rep; h < (kh + 1) * rep; h++)
            for (int t = 0; t < Tq; t++) {
                const float *qt = q + (size_t)t * qs + (size_t)h * Dh, *ot = out + (size_t)t * qs + (size_t)h * Dh,
                            *gt = dout + (size_t)t * qs + (size_t)h * Dh;
                float *dqt = dq + (size_t)t * qs + (size_t)h * Dh;
                float l = lse[(size_t)t * H + h], dd = 0;
                for (int i = 0; i < Dh; i++) dd += gt[i] * ot[i];
                int nk = causal ? t + 1 : Tk;
                for (int u = 0; u < nk; u++) {
                    const float *ku = k + (size_t)u * ks + (size_t)kh * Dh, *vu = v + (size_t)u * ks + (size_t)kh * Dh;
                    float *dku = dk + (size_t)u * ks + (size_t)kh * Dh, *dvu = dv + (size_t)u * ks + (size_t)kh * Dh;
                    float s = 0, dp = 0;
                    for (int i = 0; i < Dh; i++) { s += qt[i] * ku[i]; dp += gt[i] * vu[i]; }
                    float p = expf(s * sc - l), ds = p * (dp - dd) * sc;
                    for (int i = 0; i < Dh; i++) {
                        dvu[i] += p * gt[i];
                        dqt[i] += ds * ku[i];
                        dku[i] += ds * qt[i];
                    }
                }
            }
    }
}
