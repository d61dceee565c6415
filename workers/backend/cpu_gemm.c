/* cpu_gemm.c: the CPU backend's GEMM: OpenBLAS's cblas_sgemm when the
 * machine has it, else the backend's own packed kernel.
 *
 * OpenBLAS is opened at run time (dlopen of libopenblas.so.0, Debian's
 * libopenblas0-pthread), not linked: a program that holds the backend then
 * loads on machines without it, such as the GPU machine, which has none of
 * our Debian packages and where carrying OpenBLAS (36 MiB) does not fit the
 * device tool's 64 MiB. BALLAST_CPU_GEMM picks: auto (default: OpenBLAS if
 * it loads, else the built-in kernel), openblas (required), builtin.
 *
 * OpenBLAS runs single-threaded (openblas_set_num_threads(1) when the
 * backend opens): the parallelism is the backend's own OpenMP team, so one
 * pool of threads runs and none oversubscribes the cores. Each GEMM cuts C
 * into tiles fixed by the shape alone (at most TILE_M x TILE_N), and
 * hands each tile to one single-threaded call; an element of C is
 * therefore always computed by the same call on the same operands, with
 * the same blocking of K, whatever the thread count or the thread that
 * runs the tile: bit-identical results for 1 or n threads, with either
 * implementation (tests/unit/test_backend_cpu_threads.c checks both at 1,
 * 2 and 4 threads). The two implementations round differently from each
 * other; a run uses one.
 *
 * A GEMM whose K is its longest side and whose C is small (the weight
 * gradients, dout^T @ x over the batch's tokens) is cut along K instead:
 * KSPLIT chunks of K, fixed by the shape, each a whole-C call; the first
 * accumulates into C with the caller's beta, the others into scratch, and
 * C then adds them in chunk order. Cutting such a C into tiles leaves
 * thin tiles that OpenBLAS runs at 0.8 of its speed on the whole product
 * (tests/bench/cpu_gemm.sh); a chunk of K keeps the whole C and runs at
 * 0.9-1.0 of it. */
#include "workers/backend/cpu_internal.h"

#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "log.h"

/* Tiles of C: at most TILE_M x TILE_N, halved (the longer side first,
 * down to TILE_MIN) until the GEMM has at least TILE_COUNT tiles, so that
 * two or four threads share it evenly. Large, because a tile packs its
 * operands again: a B panel costs about 16 / rows-per-tile of the tile's
 * multiply-adds on AVX2 (6% at 256), an A panel 16 / columns. With 256 x
 * 512 the model's GEMMs ran at 0.91-0.93 of one OpenBLAS call, with 512 x
 * 1024 at 0.94-0.96 (tests/bench/cpu_gemm.sh); larger ones leave the
 * 2048 x 1376 products in 4 uneven tiles. The choice depends on M and N
 * alone. */
#define TILE_M 512
#define TILE_N 1024
#define TILE_MIN 64
#define TILE_COUNT 4
/* The K cut: when K is the longest side, C has at most KSPLIT_MAX_C
 * elements and each chunk gets at least KSPLIT_MIN_K of K, K is cut into
 * KSPLIT chunks of a multiple of 64. */
#define KSPLIT 4
#define KSPLIT_MIN_K 256
#define KSPLIT_MAX_C (1u << 20)

/* ---- OpenBLAS, opened at run time ---- */

/* cblas_sgemm of the LP64 CBLAS interface (32-bit int indices, as
 * libopenblas0-pthread builds it); the enum values are the CBLAS
 * standard's. */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };
typedef void (*sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc);
typedef void (*set_threads_fn)(int n);

#define OPENBLAS_SONAME "libopenblas.so.0"

static sgemm_fn g_sgemm;            /* NULL: the built-in kernel */

/* Opens OpenBLAS; returns its sgemm, or NULL with the reason in why. */
static sgemm_fn open_openblas(const char **why) {
    void *lib = dlopen(OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) { *why = dlerror(); return NULL; }
    sgemm_fn f = (sgemm_fn)dlsym(lib, "cblas_sgemm");
    set_threads_fn st = (set_threads_fn)dlsym(lib, "openblas_set_num_threads");
    if (!f || !st) { *why = "no cblas_sgemm or openblas_set_num_threads in it"; dlclose(lib); return NULL; }
    st(1);
    return f;
}

void cpu_gemm_init(void) {
    const char *mode = getenv("BALLAST_CPU_GEMM"), *why = "";
    if (!mode || !*mode || !strcmp(mode, "auto")) {
        g_sgemm = open_openblas(&why);
        if (!g_sgemm)
            log_info("CPU GEMMs on the built-in kernel: %s did not load (%s); install libopenblas0-pthread "
                     "for faster ones", OPENBLAS_SONAME, why);
    } else if (!strcmp(mode, "openblas")) {
        g_sgemm = open_openblas(&why);
        if (!g_sgemm)
            die("BALLAST_CPU_GEMM=openblas but %s did not load (%s): install libopenblas0-pthread, or set "
                "BALLAST_CPU_GEMM=auto or builtin", OPENBLAS_SONAME, why);
    } else if (!strcmp(mode, "builtin")) {
        g_sgemm = NULL;
    } else {
        die("BALLAST_CPU_GEMM='%s': expected auto, openblas or builtin (unset means auto)", mode);
    }
    log_debug("CPU GEMMs on %s", cpu_gemm_impl());
}

const char *cpu_gemm_impl(void) { return g_sgemm ? "OpenBLAS" : "the built-in kernel"; }

/* ---- the built-in kernel ---- */

#define MR 4                /* rows of a micro-tile */
#define NR 16               /* columns of a micro-tile */
#define KC 256              /* depth of a packed block */

/* C[0..4)[0..16) (row stride ldc) += Ap @ Bp over kb steps: Ap is packed
 * (kb, 4), Bp (kb, 16). Eight named accumulators, so they stay in
 * registers. */
__attribute__((target_clones("arch=x86-64-v3", "default"), optimize("fp-contract=fast")))
static void kernel_4x16(int kb, const float *Ap, const float *Bp, float *C, size_t ldc) {
    v8f c00, c01, c10, c11, c20, c21, c30, c31;
    V8_LD(c00, C); V8_LD(c01, C + 8);
    V8_LD(c10, C + ldc); V8_LD(c11, C + ldc + 8);
    V8_LD(c20, C + 2 * ldc); V8_LD(c21, C + 2 * ldc + 8);
    V8_LD(c30, C + 3 * ldc); V8_LD(c31, C + 3 * ldc + 8);
    for (int k = 0; k < kb; k++, Ap += MR, Bp += NR) {
        v8f b0, b1;
        V8_LD(b0, Bp);
        V8_LD(b1, Bp + 8);
        v8f x0 = (v8f){0} + Ap[0], x1 = (v8f){0} + Ap[1], x2 = (v8f){0} + Ap[2], x3 = (v8f){0} + Ap[3];
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

/* Scratch of the calling thread, one buffer per purpose, grown as needed
 * and kept while the thread lives (the OpenMP team's threads usually live
 * as long as the process); freed when the thread ends (a team that shrinks,
 * a caller's own thread), through a pthread key's destructor. */
typedef struct {
    float *pack, *ksplit;
    size_t pack_cap, ksplit_cap;
} scratch_t;

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local scratch_t *g_scratch;

static void scratch_free(void *p) {
    scratch_t *sc = p;
    free(sc->pack);
    free(sc->ksplit);
    free(sc);
}

static void scratch_key_init(void) {
    if (pthread_key_create(&g_scratch_key, scratch_free) != 0) die("pthread_key_create failed");
}

static scratch_t *scratch(void) {
    if (!g_scratch) {
        pthread_once(&g_scratch_once, scratch_key_init);
        g_scratch = calloc(1, sizeof *g_scratch);
        CHECK_ALLOC(g_scratch);
        if (pthread_setspecific(g_scratch_key, g_scratch) != 0) die("pthread_setspecific failed");
    }
    return g_scratch;
}

/* n floats of one of the calling thread's buffers. */
static float *thread_buf(float **buf, size_t *cap, size_t n) {
    if (n > *cap) {
        free(*buf);
        *buf = malloc(n * sizeof(float));
        CHECK_ALLOC(*buf);
        *cap = n;
    }
    return *buf;
}

/* The packing buffer of the built-in kernel. */
static float *pack_buf(size_t n) { scratch_t *sc = scratch(); return thread_buf(&sc->pack, &sc->pack_cap, n); }

/* C = alpha * op(A) @ op(B) + beta * C on the calling thread. K in blocks
 * of KC; per block, op(B) packed in 16-column panels and each 4-row strip
 * of alpha * op(A) packed beside it, zero-padded at the edges (edge
 * micro-tiles run on a copy of C). The order of the sums depends on the
 * shape only. */
static void gemm_builtin(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        if (beta == 0.f) memset(c, 0, (size_t)N * sizeof(float));
        else if (beta != 1.f) for (int j = 0; j < N; j++) c[j] *= beta;
    }
    int np = (N + NR - 1) / NR;
    float *Bp = pack_buf((size_t)np * NR * KC + (size_t)MR * KC), *Ap = Bp + (size_t)np * NR * KC;
    for (int k0 = 0; k0 < K; k0 += KC) {
        int kb = K - k0 < KC ? K - k0 : KC;
        for (int p = 0; p < np; p++) {              /* Bp[p][k][0..16) = op(B)[k0 + k][16p + ..] */
            float *d = Bp + (size_t)p * NR * kb;
            int j0 = p * NR, nr = N - j0 < NR ? N - j0 : NR;
            for (int k = 0; k < kb; k++, d += NR) {
                int j = 0;
                if (tb) for (; j < nr; j++) d[j] = B[(size_t)(j0 + j) * ldb + k0 + k];
                else for (; j < nr; j++) d[j] = B[(size_t)(k0 + k) * ldb + j0 + j];
                for (; j < NR; j++) d[j] = 0.f;
            }
        }
        for (int i0 = 0; i0 < M; i0 += MR) {
            int mr = M - i0 < MR ? M - i0 : MR;
            for (int k = 0; k < kb; k++)            /* Ap[k][r] = alpha * op(A)[i0 + r][k0 + k] */
                for (int r = 0; r < MR; r++)
                    Ap[k * MR + r] = r >= mr ? 0.f
                                   : alpha * (ta ? A[(size_t)(k0 + k) * lda + i0 + r] : A[(size_t)(i0 + r) * lda + k0 + k]);
            for (int p = 0; p < np; p++) {
                int j0 = p * NR, nr = N - j0 < NR ? N - j0 : NR;
                float *c = C + (size_t)i0 * ldc + j0;
                if (mr == MR && nr == NR) { kernel_4x16(kb, Ap, Bp + (size_t)p * NR * kb, c, ldc); continue; }
                float t[MR * NR] = { 0 };
                for (int r = 0; r < mr; r++) memcpy(t + r * NR, c + (size_t)r * ldc, (size_t)nr * sizeof(float));
                kernel_4x16(kb, Ap, Bp + (size_t)p * NR * kb, t, NR);
                for (int r = 0; r < mr; r++) memcpy(c + (size_t)r * ldc, t + r * NR, (size_t)nr * sizeof(float));
            }
        }
    }
}

/* ---- the GEMM ---- */

void cpu_gemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   /* C = beta * C, without asking the library about an empty product */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.f ? 0.f : beta * C[(size_t)i * ldc + j];
        return;
    }
    if (!g_sgemm) { gemm_builtin(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); return; }
    g_sgemm(CBLAS_ROW_MAJOR, ta ? CBLAS_TRANS : CBLAS_NO_TRANS, tb ? CBLAS_TRANS : CBLAS_NO_TRANS, M, N, K, alpha, A,
            lda, B, ldb, beta, C, ldc);
}

/* The scratch of the K cut. */
static float *ksplit_buf(size_t n) { scratch_t *sc = scratch(); return thread_buf(&sc->ksplit, &sc->ksplit_cap, n); }

/* C = alpha op(A) op(B) + beta C with K in nk chunks of kc (see the top). */
static void gemm_ksplit(bool ta, bool tb, int M, int N, int K, int kc, int nk, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc) {
    size_t mn = (size_t)M * N;
    float *P = ksplit_buf((size_t)(nk - 1) * mn);
#pragma omp parallel for schedule(dynamic) if ((double)M * N * K > PAR_MIN_FLOPS)
    for (int c = 0; c < nk; c++) {
        int k0 = c * kc, kb = K - k0 < kc ? K - k0 : kc;
        const float *a = ta ? A + (size_t)k0 * lda : A + k0;    /* columns k0.. of op(A) */
        const float *b = tb ? B + k0 : B + (size_t)k0 * ldb;    /* rows k0.. of op(B) */
        if (c == 0) cpu_gemm1(ta, tb, M, N, kb, alpha, a, lda, b, ldb, beta, C, ldc);
        else cpu_gemm1(ta, tb, M, N, kb, alpha, a, lda, b, ldb, 0.f, P + (size_t)(c - 1) * mn, N);
    }
#pragma omp parallel for schedule(static) if ((double)M * N * nk > PAR_MIN_FLOPS)
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        const float *p = P + (size_t)i * N;
        for (int j = 0; j < N; j++) {
            float s = p[j];
            for (int q = 1; q < nk - 1; q++) s += p[(size_t)q * mn + j];
            c[j] += s;
        }
    }
}

void cpu_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K > M && K > N && (size_t)M * N <= KSPLIT_MAX_C && K >= KSPLIT * KSPLIT_MIN_K) {
        int kc = (K + KSPLIT - 1) / KSPLIT;
        kc = (kc + 63) / 64 * 64;
        gemm_ksplit(ta, tb, M, N, K, kc, (K + kc - 1) / kc, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
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
