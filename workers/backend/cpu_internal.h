/* cpu_internal.h: what the files of the fp32 CPU backend share (cpu.c,
 * cpu_gemm.c, cpu_attention.c). Not part of the backend interface.
 *
 * Determinism: every op produces each output element in exactly one place
 * (one OpenMP iteration, one sgemm call on a tile of C) whose inputs and
 * order of operations depend only on the shapes, never on the thread count
 * or on which thread runs it. */
#ifndef BALLAST_BACKEND_CPU_INTERNAL_H
#define BALLAST_BACKEND_CPU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Below these sizes an op runs on the calling thread: forking a team
 * costs more than it saves (and much more on a busy machine). */
#define PAR_MIN (1u << 15)          /* elements */
#define PAR_MIN_FLOPS (1 << 21)     /* multiply-adds */

/* Picks the GEMM (BALLAST_CPU_GEMM: auto, openblas, builtin; see
 * cpu_gemm.c) and sets OpenBLAS single-threaded: the backend's OpenMP team
 * is the only one. Exits with a message on a bad BALLAST_CPU_GEMM. */
void cpu_gemm_init(void);
/* "OpenBLAS" or "the built-in kernel": what cpu_gemm runs on. */
const char *cpu_gemm_impl(void);

/* C (M, N) = alpha * op(A) @ op(B) + beta * C, row-major; op(A) is (M, K):
 * A itself when !ta, A^T of a (K, M) matrix when ta; likewise op(B) (K, N).
 * C is cut into fixed tiles (by shape alone), one single-threaded call
 * each, spread over the OpenMP team. Inside a parallel region it runs on
 * the calling thread. */
void cpu_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc);
/* One call on the calling thread (the attention tiles). */
void cpu_gemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc);

/* exp(x) without a call, so that loops around it vectorise: Cephes' expf
 * (2^n times a degree-6 polynomial on [-ln2/2, ln2/2]), within 2 ulp of
 * expf for x in [-87, 88]; x is clamped to that range (exp(-87) ~ 1.6e-38
 * stands for 0). */
static inline float cpu_expf(float x) {
    x = x < -87.f ? -87.f : x;
    x = x > 88.f ? 88.f : x;
    float t = x * 1.44269504088896341f + 12582912.f;   /* 1.5 * 2^23: round(x log2 e) lands in the low bits */
    float n = t - 12582912.f;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    int32_t sb = (ti - 0x4b400000 + 127) << 23;          /* 2^n */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.f;
    float s;
    memcpy(&s, &sb, sizeof s);
    return y * s;
}

/* ---- 8-float vectors (GCC vector extensions) ----
 * Element-wise loops written on these vectorise whatever the compiler's
 * cost model says (-O2 vectorises none of the exp loops by itself). Used in
 * functions with target_clones("arch=x86-64-v3", "default"): AVX2 where the
 * CPU has it, SSE pairs otherwise. Loads and stores are macros so that no
 * vector value crosses a function boundary (the ABI of 32-byte vectors
 * differs without AVX). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
#define V8_LD(v, p) memcpy(&(v), (p), sizeof(v8f))
#define V8_ST(p, v) memcpy((p), &(v), sizeof(v8f))
#define V8_SPLAT(x) ((v8f){ 0 } + (float)(x))

/* *xp = cpu_expf of each of its 8 lanes, the same steps lane by lane (by
 * pointer: no vector goes by value through the ABI). */
static inline __attribute__((always_inline)) void cpu_expf8(v8f *xp) {
    v8f x = *xp;
    v8i lo = x < V8_SPLAT(-87.f), hi = x > V8_SPLAT(88.f);
    x = (v8f)(((v8i)x & ~lo) | ((v8i)V8_SPLAT(-87.f) & lo));
    x = (v8f)(((v8i)x & ~hi) | ((v8i)V8_SPLAT(88.f) & hi));
    v8f t = x * 1.44269504088896341f + 12582912.f;
    v8f n = t - 12582912.f;
    v8i sb = ((v8i)t - 0x4b400000 + 127) << 23;
    v8f r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v8f y = V8_SPLAT(1.9875691500e-4f);
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.f;
    *xp = y * (v8f)sb;
}

/* Element-wise ops run over fixed chunks of this many elements (a multiple
 * of 8), one OpenMP iteration each: which elements take the vector loop
 * and which the scalar tail depends on n alone. */
#define CPU_CHUNK 8192

/* x[i] = exp(x[i] - sub) for i < n; returns their sum, added in a fixed
 * order (8 lane sums, then the lanes pairwise, then the tail). */
float cpu_exp_sub(float *x, int n, float sub);

void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                       int B, int T, int H, int Hkv, int Dh);
void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *q,
                       const float *k, const float *v, const float *lse, int B, int T, int H, int Hkv, int Dh);

#endif
