/* bench_cpu_gemm.c: the CPU backend's matmuls against one OpenBLAS sgemm
 * call threaded by OpenBLAS itself, on the GEMMs of a training step
 * (forward, dx, dw of every weight) of the two benchmark models, at 1 and 2
 * threads. Rounds alternate which side runs first; each figure is the
 * median over the rounds with the min-max beside it. Also says whether
 * OpenBLAS's own threading gives the same bits at 1, 2 and 4 threads on
 * these shapes (the backend does not rely on it: it runs OpenBLAS
 * single-threaded on fixed tiles). Not a test: prints figures only.
 *
 *   build/tests/bench/bench_cpu_gemm [ROUNDS]   (default 5) */
#include <cblas.h>
#undef I   /* OpenBLAS's cblas.h brings <complex.h> */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "workers/backend/backend.h"

typedef struct { const char *name; int M, N, K; bool ta, tb; } shape_t;   /* C (M, N) = op(A) (M, K) op(B) (K, N) */

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) { qsort(v, n, sizeof *v, cmpd); return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2; }

static float *rvec(size_t n, uint64_t *s) {
    float *x = malloc(n * sizeof(float));
    if (!x) { fprintf(stderr, "bench_cpu_gemm: out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) { *s = *s * 6364136223846793005ull + 1442695040888963407ull; x[i] = (float)((*s >> 40) / 16777216.0 - 0.5); }
    return x;
}

/* what a matmul op computes, through the backend (ours) or one sgemm (ref) */
typedef enum { FWD, DX, DW } kind_t;
static void ours(const backend_t *be, kind_t k, int N, int I, int O, const float *x, const float *w, const float *g,
                 float *out) {
    if (k == FWD) be->matmul_fwd(out, x, w, N, I, O);
    else if (k == DX) be->matmul_bwd(out, NULL, g, x, w, N, I, O, false);
    else be->matmul_bwd(NULL, out, g, x, w, N, I, O, false);
}
static void ref(kind_t k, int N, int I, int O, const float *x, const float *w, const float *g, float *out) {
    if (k == FWD) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, O, I, 1, x, I, w, I, 0, out, O);
    else if (k == DX) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, I, O, 1, g, O, w, I, 0, out, I);
    else cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, N, 1, g, O, x, I, 1, out, I);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (rounds < 1 || rounds > 99) { fprintf(stderr, "bench_cpu_gemm: ROUNDS must be 1..99\n"); return 2; }
    /* (label, N tokens, I, O): dim 256 / MLP 688 / kv 128 / vocab 512 at 8 x 256 tokens,
     * dim 512 / MLP 1376 / kv 256 / vocab 512 at 4 x 512 */
    struct { const char *name; int N, I, O; } mm[] = {
        { "d256 q,o", 2048, 256, 256 }, { "d256 k,v", 2048, 256, 128 }, { "d256 gate,up", 2048, 256, 688 },
        { "d256 down", 2048, 688, 256 }, { "d256 head", 2048, 256, 512 },
        { "d512 q,o", 2048, 512, 512 }, { "d512 k,v", 2048, 512, 256 }, { "d512 gate,up", 2048, 512, 1376 },
        { "d512 down", 2048, 1376, 512 }, { "d512 head", 2048, 512, 512 },
    };
    const int nmm = (int)(sizeof mm / sizeof mm[0]);
    const char *kname[] = { "fwd", "dx", "dw" };
    uint64_t s = 42;
    printf("bench_cpu_gemm: OpenBLAS %s, core %s; %d rounds, alternated; GF/s median [min-max]\n",
           openblas_get_config(), openblas_get_corename(), rounds);
    const int ths[] = { 1, 2 };
    bool all_same = true;
    for (int ti = 0; ti < 2; ti++) {
        int th = ths[ti];
        double tot_ours = 0, tot_ref = 0;
        printf("%-14s %-4s %7s %7s %7s   %-20s %-20s %s\n", "shape", "op", "M", "N", "K", "ballast", "openblas", "ratio");
        for (int i = 0; i < nmm; i++)
            for (int k = 0; k < 3; k++) {
                int N = mm[i].N, I = mm[i].I, O = mm[i].O;
                float *x = rvec((size_t)N * I, &s), *w = rvec((size_t)O * I, &s), *g = rvec((size_t)N * O, &s);
                size_t no = k == FWD ? (size_t)N * O : k == DX ? (size_t)N * I : (size_t)O * I;
                float *out = calloc(no, sizeof(float));
                double flop = 2.0 * N * I * O, a[99], b[99];
                const backend_t *be = backend_cpu(th);
                for (int r = 0; r < rounds; r++)
                    for (int side = 0; side < 2; side++) {
                        bool mine = (side == 0) == (r % 2 == 0);
                        if (mine) openblas_set_num_threads(1);   /* the backend's setting */
                        else openblas_set_num_threads(th);
                        double t0 = clock_now_s();
                        for (int rep = 0; rep < 3; rep++) {
                            if (mine) ours(be, (kind_t)k, N, I, O, x, w, g, out);
                            else ref((kind_t)k, N, I, O, x, w, g, out);
                        }
                        double gf = 3 * flop / (clock_now_s() - t0) / 1e9;
                        if (mine) a[r] = gf; else b[r] = gf;
                    }
                openblas_set_num_threads(1);
                double ma = median(a, rounds), mb = median(b, rounds);
                tot_ours += flop / ma / 1e9;
                tot_ref += flop / mb / 1e9;
                int M = k == FWD ? N : k == DX ? N : O, NN = k == FWD ? O : I, K = k == FWD ? I : k == DX ? O : N;
                char sa[32], sb[32];
                snprintf(sa, sizeof sa, "%.1f [%.1f-%.1f]", ma, a[0], a[rounds - 1]);
                snprintf(sb, sizeof sb, "%.1f [%.1f-%.1f]", mb, b[0], b[rounds - 1]);
                printf("%-14s %-4s %7d %7d %7d   %-20s %-20s %.2f\n", mm[i].name, kname[k], M, NN, K, sa, sb, ma / mb);
                if (ti == 0) {   /* OpenBLAS's own threading: the same bits at 1, 2, 4? */
                    float *o1 = calloc(no, sizeof(float)), *o2 = calloc(no, sizeof(float));
                    for (int t = 1; t <= 4; t *= 2) {
                        openblas_set_num_threads(t);
                        float *o = t == 1 ? o1 : o2;
                        memset(o, 0, no * sizeof(float));
                        ref((kind_t)k, N, I, O, x, w, g, o);
                        if (t > 1 && memcmp(o1, o2, no * sizeof(float)) != 0) {
                            printf("  openblas's own threads: %s %s differs between 1 and %d threads\n", mm[i].name, kname[k], t);
                            all_same = false;
                        }
                    }
                    openblas_set_num_threads(1);
                    free(o1); free(o2);
                }
                free(x); free(w); free(g); free(out);
            }
        printf("all GEMMs of both models, %d thread%s: ballast %.3f s, openblas %.3f s per pass\n", th, th > 1 ? "s" : "",
               tot_ours, tot_ref);
        printf("RATIO CPU GEMM %d thread%s ballast/openblas sgemm %.2f (time of the model's GEMMs, medians)\n", th,
               th > 1 ? "s" : "", tot_ref / tot_ours);
    }
    printf("openblas's own threading, 1 vs 2 vs 4 threads on these shapes: %s\n",
           all_same ? "bit-identical" : "differs (see above)");
    return 0;
}
