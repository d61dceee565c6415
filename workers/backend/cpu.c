/* cpu.c: the fp32 CPU backend, the oracle every other backend is
 * checked against.
 *
 * Every op is a plain loop written for clarity, parallelised with OpenMP so
 * that each output element is produced by exactly one thread in a fixed
 * order: results are bit-identical for any thread count. The matmuls go
 * through one register-blocked GEMM (C += A @ B, row-major) whose 4x16 inner
 * kernel is compiled twice, for AVX2+FMA and for baseline x86-64, and picked
 * at load time. Attention materialises the (T, T) probabilities per head. */
#include "workers/backend/backend.h"

#include <math.h>
#include <stdio.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Below these sizes an op runs on the calling thread: forking a team
 * costs more than it saves (and much more on a busy machine). */
#define PAR_MIN (1u << 15)          /* elements */
#define PAR_MIN_FLOPS (1 << 21)     /* multiply-adds */

/* ---- memory ---- */

static void *cpu_alloc(size_t bytes) {
    void *p = NULL;
    size_t sz = (bytes + 63) & ~(size_t)63;
    if (sz == 0) sz = 64;
    if (posix_memalign(&p, 64, sz) != 0) return NULL;
    memset(p, 0, sz);
    return p;
}
static void cpu_free(void *p) { free(p); }
static void cpu_memset0(void *p, size_t n) { memset(p, 0, n); }
static void cpu_copy(void *d, const void *s, size_t n) { if (d != s) memmove(d, s, n); }

/* ---- scratch ---- */

/* One growing scratch area for transposes; the backend is driven by one
 * thread (OpenMP parallelism lives inside each op). */
static float *scratch_get(size_t n) {
    static float *buf;
    static size_t cap;
    if (n > cap) {
        free(buf);
        cap = n + n / 4;
        buf = cpu_alloc(cap * sizeof(float));
        CHECK_ALLOC(buf);
    }
    return buf;
}

/* out (C, R) = in (R, C)^T */
static void transpose(float *out, const float *in, int R, int C) {
    const int BS = 32;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)R * C > PAR_MIN)
    for (int r0 = 0; r0 < R; r0 += BS)
        for (int c0 = 0; c0 < C; c0 += BS) {
            int r1 = r0 + BS < R ? r0 + BS : R, c1 = c0 + BS < C ? c0 + BS : C;
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) out[(size_t)c * R + r] = in[(size_t)r * C + c];
        }
}

/* ---- GEMM ---- */

typedef float v8f __attribute__((vector_size(32)));

/* Unaligned 8-float loads and stores, as macros so no vector value crosses
 * a function boundary (the ABI of 32-byte vectors differs without AVX). */
#define V8_LD(v, p) memcpy(&(v), (p), sizeof(v8f))
#define V8_ST(p, v) memcpy((p), &(v), sizeof(v8f))

/* C[0..4)[0..16) += A[0..4)[0..K) @ B[0..K)[0..16). The eight accumulators
 * are named variables so that they live in registers. */
__attribute__((target_clones("arch=x86-64-v3", "default"), optimize("fp-contract=fast")))
static void kernel_4x16(int K, const float *A, size_t lda, const float *B, size_t ldb, float *C, size_t ldc) {
    v8f c00, c01, c10, c11, c20, c21, c30, c31;
    V8_LD(c00, C); V8_LD(c01, C + 8);
    V8_LD(c10, C + ldc); V8_LD(c11, C + ldc + 8);
    V8_LD(c20, C + 2 * ldc); V8_LD(c21, C + 2 * ldc + 8);
    V8_LD(c30, C + 3 * ldc); V8_LD(c31, C + 3 * ldc + 8);
    const float *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda;
    for (int k = 0; k < K; k++) {
        v8f b0, b1;
        V8_LD(b0, B + (size_t)k * ldb);
        V8_LD(b1, B + (size_t)k * ldb + 8);
        v8f x0 = (v8f){0} + a0[k], x1 = (v8f){0} + a1[k], x2 = (v8f){0} + a2[k], x3 = (v8f){0} + a3[k];
        c00 += x0 * b0; c01 += x0 * b1;
        c10 += x1 * b0; c11 += x1 * b1;
        c20 += x2 * b0; c21 += x2 * b1;
        c30 += x3 * b0; c31 += x3 * b1;
    }
    V8_ST(C, c00); V8_ST(C + 8, c01);
    V8_ST(C + ldc, c10); V8_ST(C + ldc + 8, c11);
    V8_ST(C + 2 * ldc, c20); V8_ST(C + 2 * ldc + 8, c21);
    V8_ST(C + 3 * ldc, c30); V8_ST(C + 3 * ldc + 8, c31);
}

/* Edge tiles: rows [0, mr) x cols [0, nr) of the same product. */
static void kernel_edge(int mr, int nr, int K, const float *A, size_t lda, const float *B, size_t ldb,
                        float *C, size_t ldc) {
    for (int i = 0; i < mr; i++)
        for (int k = 0; k < K; k++) {
            float a = A[i * lda + k];
            const float *b = B + (size_t)k * ldb;
            float *c = C + i * ldc;
            for (int j = 0; j < nr; j++) c[j] += a * b[j];
        }
}

/* C (M, N) = (acc ? C : 0) + A (M, K) @ B (K, N); row-major with leading
 * dimensions. Parallel over 4-row strips; K is walked in blocks so the B
 * panel stays in cache, always in the same order (determinism). */
static void gemm_nn(int M, int N, int K, const float *A, size_t lda, const float *B, size_t ldb,
                    float *C, size_t ldc, bool acc) {
    const int KB = 256, NB = 256;
    int strips = (M + 3) / 4;
#pragma omp parallel for schedule(static) if ((double)M * N * K > PAR_MIN_FLOPS)
    for (int s = 0; s < strips; s++) {
        int i = s * 4, mr = M - i < 4 ? M - i : 4;
        if (!acc)
            for (int r = 0; r < mr; r++) memset(C + (size_t)(i + r) * ldc, 0, (size_t)N * sizeof(float));
        for (int j0 = 0; j0 < N; j0 += NB) {
            int j1 = j0 + NB < N ? j0 + NB : N;
            for (int k0 = 0; k0 < K; k0 += KB) {
                int kb = K - k0 < KB ? K - k0 : KB;
                const float *a = A + (size_t)i * lda + k0;
                const float *b = B + (size_t)k0 * ldb;
                int j = j0;
                if (mr == 4)
                    for (; j + 16 <= j1; j += 16) kernel_4x16(kb, a, lda, b + j, ldb, C + (size_t)i * ldc + j, ldc);
                if (j < j1) kernel_edge(mr, j1 - j, kb, a, lda, b + j, ldb, C + (size_t)i * ldc + j, ldc);
            }
        }
    }
}

/* ---- elementwise ---- */

static void cpu_add(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_scale(float *x, float s, size_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* Fixed chunks summed in order, so the result does not depend on threads. */
static double cpu_sumsq(const float *x, size_t n) {
    const size_t CH = 1 << 16;
    size_t nch = (n + CH - 1) / CH;
    double *part = malloc((nch ? nch : 1) * sizeof(double));
    CHECK_ALLOC(part);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t c = 0; c < nch; c++) {
        size_t e = (c + 1) * CH < n ? (c + 1) * CH : n;
        double s = 0;
        for (size_t i = c * CH; i < e; i++) s += (double)x[i] * x[i];
        part[c] = s;
    }
    double s = 0;
    for (size_t c = 0; c < nch; c++) s += part[c];
    free(part);
    return s;
}

/* ---- embedding ---- */

static void cpu_embedding_fwd(float *out, const int32_t *tok, const float *wte, int N, int D) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
    for (int i = 0; i < N; i++) memcpy(out + (size_t)i * D, wte + (size_t)tok[i] * D, (size_t)D * sizeof(float));
}

/* Parallel over columns so that rows sharing a token never race and the
 * summation order (token order) is fixed. */
static void cpu_embedding_bwd(float *dwte, const float *dout, const int32_t *tok, int N, int D) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
    for (int j = 0; j < D; j++)
        for (int i = 0; i < N; i++) dwte[(size_t)tok[i] * D + j] += dout[(size_t)i * D + j];
}

/* ---- RMSNorm ---- */

static void cpu_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int D, float eps) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * D;
        float *oi = out + (size_t)i * D;
        double ss = 0;
        for (int j = 0; j < D; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / D + (double)eps));
        rstd[i] = r;
        for (int j = 0; j < D; j++) oi[j] = w[j] * (xi[j] * r);
    }
}

/* With xhat = x * r and g = dout * w:
 * dx = r * (g - xhat * mean(g * xhat)), dw = sum_i dout * xhat. */
static void cpu_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                            const float *rstd, int N, int D) {
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * D, *gi = dout + (size_t)i * D;
        float *dxi = dx + (size_t)i * D;
        float r = rstd[i];
        double dot = 0;
        for (int j = 0; j < D; j++) dot += (double)(gi[j] * w[j]) * (xi[j] * r);
        float mean = (float)(dot / D);
        for (int j = 0; j < D; j++) dxi[j] += r * (gi[j] * w[j] - xi[j] * r * mean);
    }
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
    for (int j = 0; j < D; j++) {
        double s = 0;
        for (int i = 0; i < N; i++) s += (double)dout[(size_t)i * D + j] * (x[(size_t)i * D + j] * rstd[i]);
        dw[j] += (float)s;
    }
}

/* ---- matmul ---- */

static void cpu_matmul_fwd(float *out, const float *x, const float *w, int N, int I, int O) {
    float *wt = scratch_get((size_t)I * O);
    transpose(wt, w, O, I);                     /* (I, O) */
    gemm_nn(N, O, I, x, I, wt, O, out, O, false);
}

static void cpu_matmul_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                           int N, int I, int O, bool dx_acc) {
    if (dx) gemm_nn(N, I, O, dout, O, w, I, dx, I, dx_acc);
    if (dw) {
        float *dt = scratch_get((size_t)N * O);
        transpose(dt, dout, N, O);              /* (O, N) */
        gemm_nn(O, I, N, dt, N, x, I, dw, I, true);
    }
}

/* ---- RoPE ---- */

/* cos/sin of angle (pos0 + t) * inv_freq(i), computed in double then rounded. */
static void rope_apply(float *x, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r, float dir) {
    int half = Dh / 2;
#pragma omp parallel for schedule(static) if ((size_t)B * T * nh * Dh > PAR_MIN)
    for (int t = 0; t < T; t++) {
        float c[half > 0 ? half : 1], s[half > 0 ? half : 1];
        for (int i = 0; i < half; i++) {
            double a = (double)(pos0 + t) * be_rope_inv_freq(r, Dh, i);
            c[i] = (float)cos(a);
            s[i] = dir * (float)sin(a);
        }
        for (int b = 0; b < B; b++)
            for (int h = 0; h < nh; h++) {
                float *p = x + (((size_t)b * T + t) * nh + h) * Dh;
                for (int i = 0; i < half; i++) {
                    float x1 = p[i], x2 = p[i + half];
                    p[i] = x1 * c[i] - x2 * s[i];
                    p[i + half] = x2 * c[i] + x1 * s[i];
                }
            }
    }
}

static void cpu_rope_fwd(float *x, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r) {
    rope_apply(x, B, T, nh, Dh, pos0, r, 1.f);
}
static void cpu_rope_bwd(float *dx, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r) {
    rope_apply(dx, B, T, nh, Dh, pos0, r, -1.f);
}

/* ---- attention ---- */

static void cpu_attention_fwd(float *out, float *att, const float *q, const float *k, const float *v,
                              int B, int T, int H, int Hkv, int Dh) {
    int rep = H / Hkv;
    float sc = (float)(1.0 / sqrt((double)Dh));
    size_t qs = (size_t)H * Dh, ks = (size_t)Hkv * Dh;
#pragma omp parallel for collapse(2) schedule(static) if ((double)B * H * T * T * Dh > PAR_MIN_FLOPS)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int kh = h / rep;
            for (int t = 0; t < T; t++) {
                const float *qt = q + ((size_t)b * T + t) * qs + (size_t)h * Dh;
                float *p = att + (((size_t)b * H + h) * T + t) * T;
                float mx = -INFINITY;
                for (int u = 0; u <= t; u++) {
                    const float *ku = k + ((size_t)b * T + u) * ks + (size_t)kh * Dh;
                    float s = 0;
#pragma omp simd reduction(+ : s)
                    for (int d = 0; d < Dh; d++) s += qt[d] * ku[d];
                    s *= sc;
                    p[u] = s;
                    if (s > mx) mx = s;
                }
                double sum = 0;
                for (int u = 0; u <= t; u++) { p[u] = expf(p[u] - mx); sum += p[u]; }
                float inv = (float)(1.0 / sum);
                for (int u = 0; u <= t; u++) p[u] *= inv;
                for (int u = t + 1; u < T; u++) p[u] = 0;
                float *o = out + ((size_t)b * T + t) * qs + (size_t)h * Dh;
                for (int d = 0; d < Dh; d++) o[d] = 0;
                for (int u = 0; u <= t; u++) {
                    const float *vu = v + ((size_t)b * T + u) * ks + (size_t)kh * Dh;
                    for (int d = 0; d < Dh; d++) o[d] += p[u] * vu[d];
                }
            }
        }
}

/* Decoding: each (row, head) a softmax over its cache prefix, in double
 * (the fp32 oracle of the CUDA decode kernel). Parallel over rows x heads,
 * each with its own score buffer. */
static void cpu_attention_decode(float *out, const float *q, const float *kc, const float *vc, int n, int p0, int H,
                                 int Hkv, int Dh) {
    int rep = H / Hkv, kvd = Hkv * Dh;
    double scale = 1.0 / sqrt((double)Dh);
#pragma omp parallel for collapse(2) schedule(static) if ((double)n * H * (p0 + n) * Dh > PAR_MIN_FLOPS)
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            int len = p0 + i + 1, kh = h / rep;
            double *sc = malloc((size_t)len * sizeof *sc);
            CHECK_ALLOC(sc);
            const float *qh = q + ((size_t)i * H + h) * Dh;
            double mx = -INFINITY, z = 0;
            for (int t = 0; t < len; t++) {
                const float *kt = kc + (size_t)t * kvd + (size_t)kh * Dh;
                double a = 0;
                for (int d = 0; d < Dh; d++) a += (double)qh[d] * kt[d];
                sc[t] = a * scale;
                if (sc[t] > mx) mx = sc[t];
            }
            for (int t = 0; t < len; t++) z += sc[t] = exp(sc[t] - mx);
            float *oh = out + ((size_t)i * H + h) * Dh;
            for (int d = 0; d < Dh; d++) {
                double a = 0;
                for (int t = 0; t < len; t++) a += sc[t] * vc[(size_t)t * kvd + (size_t)kh * Dh + d];
                oh[d] = (float)(a / z);
            }
            free(sc);
        }
}

/* Parallel over (batch, kv head): the query heads sharing a kv head run in
 * one thread, so dk and dv are summed without races in a fixed order. */
static void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *q,
                              const float *k, const float *v, const float *att,
                              int B, int T, int H, int Hkv, int Dh) {
    int rep = H / Hkv;
    float sc = (float)(1.0 / sqrt((double)Dh));
    size_t qs = (size_t)H * Dh, ks = (size_t)Hkv * Dh;
#pragma omp parallel for collapse(2) schedule(static) if ((double)B * H * T * T * Dh > PAR_MIN_FLOPS)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < Hkv; kh++) {
            float *dp = malloc((size_t)T * sizeof(float));
            CHECK_ALLOC(dp);
            for (int t = 0; t < T; t++) {
                float *dkt = dk + ((size_t)b * T + t) * ks + (size_t)kh * Dh;
                float *dvt = dv + ((size_t)b * T + t) * ks + (size_t)kh * Dh;
                memset(dkt, 0, (size_t)Dh * sizeof(float));
                memset(dvt, 0, (size_t)Dh * sizeof(float));
            }
            for (int h = kh * rep; h < (kh + 1) * rep; h++)
                for (int t = 0; t < T; t++) {
                    const float *p = att + (((size_t)b * H + h) * T + t) * T;
                    const float *go = dout + ((size_t)b * T + t) * qs + (size_t)h * Dh;
                    const float *qt = q + ((size_t)b * T + t) * qs + (size_t)h * Dh;
                    float *dqt = dq + ((size_t)b * T + t) * qs + (size_t)h * Dh;
                    /* dP = dout . v ; dv += P dout */
                    double dot = 0;
                    for (int u = 0; u <= t; u++) {
                        const float *vu = v + ((size_t)b * T + u) * ks + (size_t)kh * Dh;
                        float *dvu = dv + ((size_t)b * T + u) * ks + (size_t)kh * Dh;
                        float s = 0;
#pragma omp simd reduction(+ : s)
                        for (int d = 0; d < Dh; d++) { s += go[d] * vu[d]; dvu[d] += p[u] * go[d]; }
                        dp[u] = s;
                        dot += (double)s * p[u];
                    }
                    /* dS = P (dP - sum P dP), then through the scale to q and k */
                    for (int d = 0; d < Dh; d++) dqt[d] = 0;
                    for (int u = 0; u <= t; u++) {
                        float ds = p[u] * (dp[u] - (float)dot) * sc;
                        const float *ku = k + ((size_t)b * T + u) * ks + (size_t)kh * Dh;
                        float *dku = dk + ((size_t)b * T + u) * ks + (size_t)kh * Dh;
                        for (int d = 0; d < Dh; d++) { dqt[d] += ds * ku[d]; dku[d] += ds * qt[d]; }
                    }
                }
            free(dp);
        }
}

/* ---- SwiGLU ---- */

static void cpu_swiglu_fwd(float *h, const float *g, const float *u, size_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float s = 1.f / (1.f + expf(-g[i]));
        h[i] = g[i] * s * u[i];
    }
}

static void cpu_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float s = 1.f / (1.f + expf(-g[i]));
        float silu = g[i] * s;
        float gd = dh[i];
        dg[i] = gd * u[i] * s * (1.f + g[i] * (1.f - s));
        du[i] = gd * silu;
    }
}

/* ---- cross-entropy ---- */

static void cpu_xent_fwd(float *losses, const float *logits, const int32_t *tgt, int N, int V) {
#pragma omp parallel for schedule(static) if ((size_t)N * V > PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) if (l[j] > mx) mx = l[j];
        double s = 0;
        for (int j = 0; j < V; j++) s += exp((double)(l[j] - mx));
        losses[i] = (float)(log(s) + mx - l[tgt[i]]);
    }
}

static void cpu_xent_bwd(float *dl, const float *logits, const int32_t *tgt, float scale, int N, int V) {
#pragma omp parallel for schedule(static) if ((size_t)N * V > PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * V;
        float *d = dl + (size_t)i * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) if (l[j] > mx) mx = l[j];
        double s = 0;
        for (int j = 0; j < V; j++) s += exp((double)(l[j] - mx));
        float inv = (float)(1.0 / s);
        int y = tgt[i];
        for (int j = 0; j < V; j++) {
            float p = expf(l[j] - mx) * inv;
            d[j] = (p - (j == y ? 1.f : 0.f)) * scale;
        }
    }
}

/* ---- AdamW ---- */

static void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                      float beta2, float eps, float wd, float step_size, float bc2_sqrt, float grad_scale,
                      act_t *p_act) {
    float decay = 1.f - lr * wd;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float pi = p[i] * decay;
        float mi = m[i] * beta1 + (1.f - beta1) * gi;
        float vi = v[i] * beta2 + (1.f - beta2) * (gi * gi);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step_size * (mi / denom);
    }
    if (p_act && p_act != p) memcpy(p_act, p, n * sizeof(float)); /* fp32: the working copy is the master */
}

/* ---- sharded and tensor-parallel training ---- */

static void cpu_acc(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* fp32 -> bf16 bits, round to nearest, ties to even (NaN stays NaN) */
static uint16_t f32_to_bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_bits_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static void cpu_to_bf16(void *dst, const float *src, size_t n) {
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16_bits(src[i]);
}
static void cpu_acc_bf16(float *y, const void *x, size_t n) {
    const uint16_t *s = x;
    for (size_t i = 0; i < n; i++) y[i] += bf16_bits_to_f32(s[i]);
}
static void cpu_from_bf16(float *y, const void *x, size_t n) {
    const uint16_t *s = x;
    for (size_t i = 0; i < n; i++) y[i] = bf16_bits_to_f32(s[i]);
}

static void *cpu_host_alloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }

static void cpu_vp_embedding_fwd(float *out, const int32_t *tok, const float *wte, int N, int D, int64_t lo, int Vt) {
    for (int i = 0; i < N; i++) {
        int64_t j = tok[i] - lo;
        float *o = out + (size_t)i * D;
        if (j >= 0 && j < Vt) memcpy(o, wte + (size_t)j * D, (size_t)D * sizeof(float));
        else memset(o, 0, (size_t)D * sizeof(float));
    }
}

static void cpu_vp_embedding_bwd(float *dwte, const float *dout, const int32_t *tok, int N, int D, int64_t lo,
                                 int Vt) {
    for (int i = 0; i < N; i++) {
        int64_t j = tok[i] - lo;
        if (j < 0 || j >= Vt) continue;
        float *g = dwte + (size_t)j * D;
        const float *d = dout + (size_t)i * D;
        for (int k = 0; k < D; k++) g[k] += d[k];
    }
}

static void cpu_vp_xent_max(float *mx, const float *logits, int N, int Vt, int nv) {
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * Vt;
        float m = -INFINITY;
        for (int j = 0; j < nv; j++) if (l[j] > m) m = l[j];
        mx[i] = m;
    }
}

static void cpu_vp_xent_stats(float *st, float *mx, const float *all, int T, const float *logits, const int32_t *tgt,
                              int N, int Vt, int nv, int64_t lo) {
    for (int i = 0; i < N; i++) {
        float m = -INFINITY;
        for (int t = 0; t < T; t++) if (all[(size_t)t * N + i] > m) m = all[(size_t)t * N + i];
        mx[i] = m;
    }
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * Vt;
        double s = 0;
        for (int j = 0; j < nv; j++) s += exp((double)(l[j] - mx[i]));
        int64_t y = tgt[i] - lo;
        st[i] = (float)s;
        st[N + i] = y >= 0 && y < nv ? l[y] : 0.f;
    }
}

static void cpu_vp_xent_finish(float *losses, float *lse, const float *st, const float *mx, int N) {
    for (int i = 0; i < N; i++) {
        lse[i] = (float)(log((double)st[i]) + mx[i]);
        losses[i] = (float)(log((double)st[i]) + mx[i] - st[N + i]);
    }
}

static void cpu_vp_xent_bwd(float *dl, const float *logits, const float *lse, const int32_t *tgt, float scale, int N,
                            int Vt, int nv, int64_t lo) {
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * Vt;
        float *d = dl + (size_t)i * Vt;
        int64_t y = tgt[i] - lo;
        for (int j = 0; j < nv; j++) {
            float p = expf(l[j] - lse[i]);
            d[j] = (p - (j == y ? 1.f : 0.f)) * scale;
        }
        for (int j = nv; j < Vt; j++) d[j] = 0.f;
    }
}

/* ---- table ---- */

/* fp32 everywhere: act storage is the backend's own float memory */
static void cpu_to_act(act_t *dst, const float *src, size_t n) { cpu_copy(dst, src, n * sizeof(float)); }
static void cpu_act_to_host(float *dst, const act_t *src, size_t n) { cpu_copy(dst, src, n * sizeof(float)); }
static size_t cpu_attention_state_numel(int B, int T, int H) { return (size_t)B * H * T * T; }

static const backend_t cpu_backend = {
    .name = "cpu",
    .act_bytes = sizeof(float),
    .host_memory = true,
    .to_act = cpu_to_act, .act_to_host = cpu_act_to_host,
    .attention_state_numel = cpu_attention_state_numel,
    .alloc = cpu_alloc, .free = cpu_free, .memset0 = cpu_memset0,
    .copy = cpu_copy, .to_host = cpu_copy, .from_host = cpu_copy,
    .add = cpu_add, .scale = cpu_scale, .sumsq = cpu_sumsq,
    .embedding_fwd = cpu_embedding_fwd, .embedding_bwd = cpu_embedding_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd, .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .matmul_fwd = cpu_matmul_fwd, .matmul_bwd = cpu_matmul_bwd,
    .rope_fwd = cpu_rope_fwd, .rope_bwd = cpu_rope_bwd,
    .attention_fwd = cpu_attention_fwd, .attention_bwd = cpu_attention_bwd,
    .attention_decode = cpu_attention_decode,
    .swiglu_fwd = cpu_swiglu_fwd, .swiglu_bwd = cpu_swiglu_bwd,
    .xent_fwd = cpu_xent_fwd, .xent_bwd = cpu_xent_bwd,
    .adamw = cpu_adamw,
    .to_bf16 = cpu_to_bf16, .acc_bf16 = cpu_acc_bf16, .from_bf16 = cpu_from_bf16,
    .acc = cpu_acc, .host_alloc = cpu_host_alloc, .host_free = cpu_free,
    .vp_embedding_fwd = cpu_vp_embedding_fwd, .vp_embedding_bwd = cpu_vp_embedding_bwd,
    .vp_xent_max = cpu_vp_xent_max, .vp_xent_stats = cpu_vp_xent_stats, .vp_xent_finish = cpu_vp_xent_finish,
    .vp_xent_bwd = cpu_vp_xent_bwd,
    /* copies are synchronous: no xfer ops (be_xfer_* copy at once); no
     * host_register (host memory needs no pinning) */
};

const backend_t *backend_cpu(int threads) {
    if (threads > 0) omp_set_num_threads(threads);
    return &cpu_backend;
}
