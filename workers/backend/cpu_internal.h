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

/* x[i] = exp(x[i] - sub) for i < n; returns their sum, added in a fixed
 * order. */
float cpu_exp_sub(float *x, int n, float sub);

void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                       int B, int T, int H, int Hkv, int Dh);
void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *q,
                       const float *k, const float *v, const float *lse, int B, int T, int H, int Hkv, int Dh);

#endif
