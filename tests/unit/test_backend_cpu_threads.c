/* test_backend_cpu_threads.c: the CPU backend's determinism contract. The
 * same inputs give the same bits at 1, 2 and 4 threads (checkpoint resume,
 * activation checkpointing and the layout-equality tests rely on it), for
 * the matmuls (forward, dx overwritten and accumulated, dw accumulated) on
 * the model's shapes, their tensor-parallel halves and quarters, random
 * shapes across the GEMM's tile edges, and weight gradients over enough
 * tokens that the GEMM cuts them along K; for attention forward and backward
 * (grouped-query, several query tiles, ragged last tile); and for the
 * element-wise and row ops. The matmuls and attention run twice: on
 * OpenBLAS (when it loads here) and on the backend's own kernel
 * (BALLAST_CPU_GEMM=builtin; each test is its own process). Inputs are
 * random (seeded: $BALLAST_TEST_SEED repeats a run); accumulating outputs
 * start from random values. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "workers/backend/backend.h"
#include "tests/unit/helpers.h"

static const int THREADS[] = { 1, 2, 4 };
#define NTH 3

static uint64_t rs;
static void seed(uint64_t dflt) { rs = th_seed(dflt); cr_log_info("seed %llu", (unsigned long long)rs); }
static int rnd(int lo, int hi) { return lo + (int)(th_unit(th_lcg64(&rs)) * (hi - lo + 1)); }
static float *rvec(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)(2 * th_unit(th_lcg64(&rs)) - 1);
    return x;
}
static float *copyv(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(y);
    memcpy(y, x, n * sizeof(float));
    return y;
}
/* outputs of run t against those of run 0, bit for bit */
static void same(float *const out[NTH], size_t n, const char *what) {
    for (int t = 1; t < NTH; t++) {
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (memcmp(&out[t][i], &out[0][i], sizeof(float)) != 0) bad = i;
        cr_assert(bad == n, "%s: element %zu differs between %d and %d threads (%.9g vs %.9g)", what, bad,
                  THREADS[t], THREADS[0], bad < n ? out[t][bad] : 0.f, bad < n ? out[0][bad] : 0.f);
    }
}
static void freeall(float *const v[NTH]) { for (int t = 0; t < NTH; t++) free(v[t]); }

static void check_matmul(int N, int I, int O) {
    float *x = rvec((size_t)N * I, 1), *w = rvec((size_t)O * I, 0.1f), *g = rvec((size_t)N * O, 1);
    float *dx0 = rvec((size_t)N * I, 1), *dw0 = rvec((size_t)O * I, 1);
    float *y[NTH], *dx[NTH], *dxa[NTH], *dw[NTH];
    for (int t = 0; t < NTH; t++) {
        const backend_t *be = backend_cpu(THREADS[t]);
        y[t] = malloc((size_t)N * O * sizeof(float));
        dx[t] = malloc((size_t)N * I * sizeof(float));
        dxa[t] = copyv(dx0, (size_t)N * I);
        dw[t] = copyv(dw0, (size_t)O * I);
        be->matmul_fwd(y[t], x, w, N, I, O);
        be->matmul_bwd(dx[t], dw[t], g, x, w, N, I, O, false);
        be->matmul_bwd(dxa[t], NULL, g, x, w, N, I, O, true);
    }
    char what[96];
    snprintf(what, sizeof what, "matmul N %d I %d O %d: forward", N, I, O);
    same(y, (size_t)N * O, what);
    snprintf(what, sizeof what, "matmul N %d I %d O %d: dx", N, I, O);
    same(dx, (size_t)N * I, what);
    snprintf(what, sizeof what, "matmul N %d I %d O %d: dx accumulated", N, I, O);
    same(dxa, (size_t)N * I, what);
    snprintf(what, sizeof what, "matmul N %d I %d O %d: dw accumulated", N, I, O);
    same(dw, (size_t)O * I, what);
    freeall(y); freeall(dx); freeall(dxa); freeall(dw);
    free(x); free(w); free(g); free(dx0); free(dw0);
}

static void builtin(void) { setenv("BALLAST_CPU_GEMM", "builtin", 1); }

/* The matmuls of the small preset and the two benchmark models (dim, MLP
 * width, kv width, vocab), whole and split for tensor parallelism up to
 * tp_max, on N = 544 rows: a 512-row tile (cpu_gemm.c's TILE_M) and a
 * ragged one. */
static void model_shapes(int ncfg, int tp_max) {
    const int cfg[][4] = { { 256, 688, 128, 512 }, { 512, 1376, 256, 512 } };
    for (int c = 0; c < ncfg; c++) {
        int D = cfg[c][0], F = cfg[c][1], Dkv = cfg[c][2], V = cfg[c][3];
        for (int tp = 1; tp <= tp_max; tp *= 2) {
            /* column-parallel (output split) and row-parallel (input split) */
            check_matmul(544, D, D / tp);          /* q, o as column-parallel */
            check_matmul(544, D, Dkv / tp);        /* k, v */
            check_matmul(544, D, F / tp);          /* gate, up */
            check_matmul(544, F / tp, D);          /* down, row-parallel */
            if (tp == 1) check_matmul(544, D, V);  /* output head */
        }
    }
}

/* Random shapes, a quarter of them at a tile edge (cpu_gemm.c's TILE_M 512
 * rows, TILE_N 1024 columns, and their halves). */
static void random_shapes(int rounds) {
    for (int r = 0; r < rounds; r++) {
        int N = rnd(1, 600), I = rnd(1, 500), O = rnd(1, 1100);
        if (r % 4 == 0) N = 256 * rnd(1, 4) + rnd(-1, 1);   /* at a tile edge */
        if (r % 4 == 1) O = 512 * rnd(1, 4) + rnd(-1, 1);
        check_matmul(N, I, O);
    }
    check_matmul(1, 1, 1);
    check_matmul(3, 1, 2000);
}

/* Weight gradients over many tokens: K (the tokens) is the GEMM's longest
 * side, which the GEMM cuts along K (cpu_gemm.c). dw accumulated onto random
 * values is also checked against a double-precision sum, norm-wise. */
static void check_dw_reference(int N, int I, int O) {
    float *x = rvec((size_t)N * I, 1), *w = rvec((size_t)O * I, 0.1f), *g = rvec((size_t)N * O, 1);
    float *dw = rvec((size_t)O * I, 1);
    double *ref = malloc((size_t)O * I * sizeof(double));
    cr_assert_not_null(ref);
    for (size_t i = 0; i < (size_t)O * I; i++) ref[i] = dw[i];
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int i = 0; i < I; i++) ref[(size_t)o * I + i] += (double)g[(size_t)n * O + o] * x[(size_t)n * I + i];
    backend_cpu(2)->matmul_bwd(NULL, dw, g, x, w, N, I, O, false);
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)O * I; i++) {
        num += (dw[i] - ref[i]) * (dw[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    /* fp32 sums of N products: relative error about 2^-24 sqrt(N) per element, 1e-6 at N = 4096 */
    cr_assert(sqrt(num / den) < 1e-5, "dw over N %d I %d O %d: relative L2 error %.3g against the double sum", N, I, O,
              sqrt(num / den));
    free(x); free(w); free(g); free(dw); free(ref);
}

static void kcut_shapes(int rounds) {
    check_matmul(2048, 256, 256);            /* the benchmark model's q, o weight gradient */
    check_matmul(1024, 255, 257);            /* the smallest K that is cut */
    for (int r = 0; r < rounds; r++) check_matmul(rnd(1025, 4200), rnd(1, 700), rnd(1, 700));
    check_dw_reference(rnd(1100, 3000), rnd(40, 300), rnd(40, 300));
}

static void check_attention(int B, int T, int H, int Hkv, int Dh) {
    size_t nq = (size_t)B * T * H * Dh, nk = (size_t)B * T * Hkv * Dh;
    float *q = rvec(nq, 2), *k = rvec(nk, 2), *v = rvec(nk, 1), *g = rvec(nq, 1);
    float *out[NTH], *st[NTH], *dq[NTH], *dk[NTH], *dv[NTH];
    size_t ns = 0;
    for (int t = 0; t < NTH; t++) {
        const backend_t *be = backend_cpu(THREADS[t]);
        ns = be->attention_state_numel(B, T, H);
        out[t] = malloc(nq * sizeof(float));
        st[t] = malloc(ns * sizeof(float));
        dq[t] = malloc(nq * sizeof(float));
        dk[t] = malloc(nk * sizeof(float));
        dv[t] = malloc(nk * sizeof(float));
        be->attention_fwd(out[t], st[t], q, k, v, B, T, H, Hkv, Dh);
        be->attention_bwd(dq[t], dk[t], dv[t], g, out[t], q, k, v, st[t], B, T, H, Hkv, Dh);
    }
    char what[96];
    snprintf(what, sizeof what, "attention B %d T %d H %d Hkv %d Dh %d: out", B, T, H, Hkv, Dh);
    same(out, nq, what);
    snprintf(what, sizeof what, "attention B %d T %d H %d Hkv %d Dh %d: state", B, T, H, Hkv, Dh);
    same(st, ns, what);
    snprintf(what, sizeof what, "attention B %d T %d H %d Hkv %d Dh %d: dq", B, T, H, Hkv, Dh);
    same(dq, nq, what);
    snprintf(what, sizeof what, "attention B %d T %d H %d Hkv %d Dh %d: dk", B, T, H, Hkv, Dh);
    same(dk, nk, what);
    snprintf(what, sizeof what, "attention B %d T %d H %d Hkv %d Dh %d: dv", B, T, H, Hkv, Dh);
    same(dv, nk, what);
    freeall(out); freeall(st); freeall(dq); freeall(dk); freeall(dv);
    free(q); free(k); free(v); free(g);
}

static void attention_shapes(void) {
    check_attention(2, 256, 8, 4, 32);    /* the small preset, four query tiles */
    check_attention(1, 200, 4, 1, 64);    /* ragged last tile, multi-query */
    check_attention(3, 1, 2, 2, 8);
    for (int r = 0; r < 6; r++) {
        int Hkv = rnd(1, 4), H = Hkv * rnd(1, 3);
        check_attention(rnd(1, 3), rnd(1, 160), H, Hkv, rnd(1, 40));
    }
}

Test(backend_cpu_threads, matmul_model_shapes) { seed(71); model_shapes(2, 4); }
Test(backend_cpu_threads, matmul_random_shapes) { seed(72); random_shapes(12); }
Test(backend_cpu_threads, attention) { seed(73); attention_shapes(); }
Test(backend_cpu_threads, matmul_weight_grads_cut_along_k) { seed(74); kcut_shapes(4); }
/* the built-in kernel: fewer shapes (it is slower), the same edges */
Test(backend_cpu_threads, matmul_builtin, .init = builtin) { seed(75); model_shapes(1, 2); random_shapes(6); }
Test(backend_cpu_threads, attention_builtin, .init = builtin) { seed(77); attention_shapes(); }

Test(backend_cpu_threads, row_and_elementwise_ops) {
    seed(74);
    int N = rnd(300, 700), D = rnd(200, 300);
    size_t n = (size_t)N * D;
    float *x = rvec(n, 2), *w = rvec(D, 1), *g = rvec(n, 1), *u = rvec(n, 2), *dx0 = rvec(n, 1), *dw0 = rvec(D, 1);
    float *m0 = rvec(n, 0.1f), *v0 = rvec(n, 0.1f);
    for (size_t i = 0; i < n; i++) v0[i] *= v0[i];
    int32_t *tgt = malloc((size_t)N * sizeof *tgt);
    for (int i = 0; i < N; i++) tgt[i] = rnd(0, D - 1);
    float *o[NTH], *rs_[NTH], *dx[NTH], *dw[NTH], *h[NTH], *dg[NTH], *du[NTH], *p[NTH], *m[NTH], *v[NTH], *ls[NTH],
          *dl[NTH];
    for (int t = 0; t < NTH; t++) {
        const backend_t *be = backend_cpu(THREADS[t]);
        o[t] = malloc(n * sizeof(float)); rs_[t] = malloc((size_t)N * sizeof(float));
        dx[t] = copyv(dx0, n); dw[t] = copyv(dw0, D);
        be->rmsnorm_fwd(o[t], rs_[t], x, w, N, D, 1e-5f);
        be->rmsnorm_bwd(dx[t], dw[t], g, x, w, rs_[t], N, D);
        h[t] = malloc(n * sizeof(float)); dg[t] = malloc(n * sizeof(float)); du[t] = malloc(n * sizeof(float));
        be->swiglu_fwd(h[t], x, u, n);
        be->swiglu_bwd(dg[t], du[t], g, x, u, n);
        p[t] = copyv(x, n); m[t] = copyv(m0, n); v[t] = copyv(v0, n);
        be->adamw(p[t], g, m[t], v[t], n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1e-2f, 0.3f, 0.7f, NULL);
        ls[t] = malloc((size_t)N * sizeof(float)); dl[t] = malloc(n * sizeof(float));
        be->xent_fwd(ls[t], x, tgt, N, D);
        be->xent_bwd(dl[t], x, tgt, 0.01f, N, D);
    }
    same(o, n, "rmsnorm out"); same(rs_, N, "rmsnorm rstd"); same(dx, n, "rmsnorm dx"); same(dw, D, "rmsnorm dw");
    same(h, n, "swiglu h"); same(dg, n, "swiglu dgate"); same(du, n, "swiglu dup");
    same(p, n, "adamw p"); same(m, n, "adamw m"); same(v, n, "adamw v");
    same(ls, N, "xent losses"); same(dl, n, "xent dlogits");
    float **all[] = { o, rs_, dx, dw, h, dg, du, p, m, v, ls, dl };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) freeall(all[i]);
    free(x); free(w); free(g); free(u); free(dx0); free(dw0); free(m0); free(v0); free(tgt);
}
