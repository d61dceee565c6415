/* cpu_gemm.c: the CPU backend's GEMM, on OpenBLAS (cblas_sgemm).
 *
 * OpenBLAS runs single-threaded (openblas_set_num_threads(1) when the
 * backend opens): the parallelism is the backend's own OpenMP team, so one
 * pool of threads runs and none oversubscribes the cores. Each GEMM cuts C
 * into tiles of at most TILE_M x TILE_N, fixed by the shape alone, and
 * hands each tile to one sgemm call; an element of C is therefore always
 * computed by the same call on the same operands, with the same blocking of
 * K, whatever the thread count or the thread that runs the tile:
 * bit-identical results for 1 or n threads (tests/unit/test_backend_cpu.c
 * checks it on random shapes at 1, 2 and 4 threads). */
#include "workers/backend/cpu_internal.h"

#include <cblas.h>
#include <omp.h>

/* Tiles of C: large enough that packing the operands per tile costs about
 * 1% (an A panel is packed once per TILE_N columns, a B panel once per
 * TILE_M rows), small enough that the model's GEMMs (a few thousand
 * tokens by a few hundred to a few thousand features) give every thread
 * several tiles. */
#define TILE_M 128
#define TILE_N 512

void cpu_gemm_init(void) { openblas_set_num_threads(1); }

void cpu_gemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   /* C = beta * C, without asking the library about an empty product */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.f ? 0.f : beta * C[(size_t)i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

void cpu_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    int tm = (M + TILE_M - 1) / TILE_M, tn = (N + TILE_N - 1) / TILE_N, nt = tm * tn;
#pragma omp parallel for schedule(dynamic) if (nt > 1 && (double)M * N * K > PAR_MIN_FLOPS)
    for (int t = 0; t < nt; t++) {
        int i0 = (t / tn) * TILE_M, j0 = (t % tn) * TILE_N;
        int mb = M - i0 < TILE_M ? M - i0 : TILE_M, nb = N - j0 < TILE_N ? N - j0 : TILE_N;
        const float *a = ta ? A + i0 : A + (size_t)i0 * lda;    /* rows i0.. of op(A) */
        const float *b = tb ? B + (size_t)j0 * ldb : B + j0;    /* columns j0.. of op(B) */
        cpu_gemm1(ta, tb, mb, nb, K, alpha, a, lda, b, ldb, beta, C + (size_t)i0 * ldc + j0, ldc);
    }
}
