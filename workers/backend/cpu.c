/* cpu.c: the fp32 CPU backend, the oracle every other backend is
 * checked against.
 *
 * Every op is a plain loop written for clarity, parallelised with OpenMP so
 * that each output element is produced by exactly one thread in a fixed
 * order: results are bit-identical for any thread count. The matmuls are
 * OpenBLAS sgemm calls on fixed tiles (cpu_gemm.c); attention runs as GEMMs
 * over query tiles and keeps log-sum-exp rows (cpu_attention.c). Loops that
 * matter are compiled twice, for AVX2+FMA and for baseline x86-64, and
 * picked at load time. */
#include "workers/backend/backend.h"
#include "workers/backend/cpu_internal.h"

#include <math.h>
#include <stdio.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "workers/backend/cpu_ring.h"

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
    /* dw: blocks of 64 columns walked row by row (rows in order for each
     * column, as one column at a time would, but along the rows' memory) */
    enum { JB = 64 };
#pragma omp parallel for schedule(static) if ((size_t)N * D > PAR_MIN)
    for (int j0 = 0; j0 < D; j0 += JB) {
        int nj = D - j0 < JB ? D - j0 : JB;
        double s[JB] = { 0 };
        for (int i = 0; i < N; i++) {
            const float *gi = dout + (size_t)i * D + j0, *xi = x + (size_t)i * D + j0;
            float r = rstd[i];
            for (int j = 0; j < nj; j++) s[j] += (double)gi[j] * (xi[j] * r);
        }
        for (int j = 0; j < nj; j++) dw[j0 + j] += (float)s[j];
    }
}

/* ---- matmul ---- */

static void cpu_matmul_fwd(float *out, const float *x, const float *w, int N, int I, int O) {
    cpu_gemm(false, true, N, O, I, 1.f, x, I, w, I, 0.f, out, O);       /* x @ w^T */
}

static void cpu_matmul_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                           int N, int I, int O, bool dx_acc) {
    if (dx) cpu_gemm(false, false, N, I, O, 1.f, dout, O, w, I, dx_acc ? 1.f : 0.f, dx, I);
    if (dw) cpu_gemm(true, false, O, I, N, 1.f, dout, O, x, I, 1.f, dw, I);   /* dout^T @ x */
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

/* ---- attention: cpu_attention.c ---- */

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


/* ---- SwiGLU ---- */

/* h = silu(g) * u on elements [0, n) of one chunk */
__attribute__((target_clones("arch=x86-64-v3", "default")))
static void swiglu_fwd_chunk(float *h, const float *g, const float *u, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f g8, u8;
        V8_LD(g8, g + i);
        V8_LD(u8, u + i);
        v8f s = -g8;
        cpu_expf8(&s);
        s = 1.f / (1.f + s);
        v8f h8 = g8 * s * u8;
        V8_ST(h + i, h8);
    }
    for (; i < n; i++) {
        float s = 1.f / (1.f + cpu_expf(-g[i]));
        h[i] = g[i] * s * u[i];
    }
}

static void cpu_swiglu_fwd(float *h, const float *g, const float *u, size_t n) {
    size_t nch = (n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t c = 0; c < nch; c++) {
        size_t i0 = c * CPU_CHUNK, m = n - i0 < CPU_CHUNK ? n - i0 : CPU_CHUNK;
        swiglu_fwd_chunk(h + i0, g + i0, u + i0, m);
    }
}

/* dg, du of h = silu(g) * u on one chunk */
__attribute__((target_clones("arch=x86-64-v3", "default")))
static void swiglu_bwd_chunk(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f g8, u8, d8;
        V8_LD(g8, g + i);
        V8_LD(u8, u + i);
        V8_LD(d8, dh + i);
        v8f s = -g8;
        cpu_expf8(&s);
        s = 1.f / (1.f + s);
        v8f dg8 = d8 * u8 * s * (1.f + g8 * (1.f - s)), du8 = d8 * (g8 * s);
        V8_ST(dg + i, dg8);
        V8_ST(du + i, du8);
    }
    for (; i < n; i++) {
        float s = 1.f / (1.f + cpu_expf(-g[i]));
        dg[i] = dh[i] * u[i] * s * (1.f + g[i] * (1.f - s));
        du[i] = dh[i] * (g[i] * s);
    }
}

static void cpu_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n) {
    size_t nch = (n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t c = 0; c < nch; c++) {
        size_t i0 = c * CPU_CHUNK, m = n - i0 < CPU_CHUNK ? n - i0 : CPU_CHUNK;
        swiglu_bwd_chunk(dg + i0, du + i0, dh + i0, g + i0, u + i0, m);
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
static size_t cpu_attention_state_numel(int B, int T, int H) { return (size_t)B * H * T; }   /* log-sum-exp rows */

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
    .attn_block_fwd = cpu_attn_block_fwd, .attn_merge = cpu_attn_merge, .attn_block_bwd = cpu_attn_block_bwd,
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
    static bool init;
    if (!init) { cpu_gemm_init(); init = true; }
    if (threads > 0) omp_set_num_threads(threads);
    return &cpu_backend;
}
