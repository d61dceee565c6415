/* cpu_gemm.c: the CPU backend's GEMM, on OpenBLAS (cblas_sgemm).
 *
 * OpenBLAS runs single-threaded (openblas_set_num_threads(1) when the
 * backend opens): the parallelism is the backend's own OpenMP team, so one
 * pool of threads runs and none oversubscribes the cores. Each GEMM cuts C
 * into tiles fixed by the shape alone (at most TILE_M x TILE_N), and
 * hands each tile to one sgemm call; an element of C is therefore always
 * computed by the same call on the same operands, with the same blocking of
 * K, whatever the thread count or the thread that runs the tile:
 * bit-identical results for 1 or n threads (tests/unit/test_backend_cpu.c
 * checks it on random shapes at 1, 2 and 4 threads). */
#include "workers/backend/cpu_internal.h"

#include <cblas.h>
#include <omp.h>

/* Tiles of C: at most TILE_M x TILE_N, halved (the longer side first,
 * down to TILE_MIN) until the GEMM has at least TILE_COUNT tiles, so that
 * two or four threads share it evenly. Large, because a tile packs its
 * operands again: a B panel costs about 16 / rows-per-tile of the tile's
 * multiply-adds on AVX2 (6% at 256), an A panel 16 / columns. The choice
 * depends on M and N alone. */
#define TILE_M 256
#define TILE_N 512
#define TILE_MIN 64
#define TILE_COUNT 4

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
    int bm = TILE_M, bn = TILE_N;
    while (((M + bm - 1) / bm) * ((N + bn - 1) / bn) < TILE_COUNT && (bm > TILE_MIN || bn > TILE_MIN)) {
        if (bn >= bm && bn > TILE_MIN) bn /= 2;
        else bm /= 2;
    }
    int tm = (M + bm - 1) / bm, tn = (N + bn - 1) / bn, nt = tm * tn;
#pragma omp parallel for schedule(dynamic) if (nt > 1 && (double)M * N * K > PAR_MIN_FLOPS)
    for (int t = 0; t < nt; t++) {
        int i0 = (t / tn) * bm, j0 = (t % tn) * bn;
        int mb = M - i0 < bm ? M - i0 : bm, nb = N - j0 < bn ? N - j0 : bn;
        const float *a = ta ? A + i0 : A + (size_t)i0 * lda;    /* rows i0.. of op(A) */
        const float *b = tb ? B + (size_t)j0 * ldb : B + j0;    /* columns j0.. of op(B) */
        cpu_gemm1(ta, tb, mb, nb, K, alpha, a, lda, b, ldb, beta, C + (size_t)i0 * ldc + j0, ldc);
    }
}
