/* test_backend_cpu.c: every op of the CPU backend against a double-precision
 * reference written here.
 *
 * For each op: the fp32 forward must match the double reference forward,
 * and the fp32 backward must match the central-difference gradient (step
 * 1e-6, in double) of L = sum(w * ref_forward(inputs)) for random weights w.
 * Errors are norm-wise: ||ours - ref||_2 / ||ref||_2 <= 1e-4 (fp32 rounding is
 * ~1e-7). Inputs are random (seeded), never zero. Accumulating outputs are
 * pre-filled with random values to check they accumulate. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/backend/backend.h"
#include "tests/unit/helpers.h"

#define TOL 1e-4
#define FD_H 1e-6

static const backend_t *be;
static void setup(void) { be = backend_cpu(2); }
/* The backend's own GEMM kernel, which runs where OpenBLAS does not load
 * (each test runs in its own process, so the choice holds for that test). */
static void setup_builtin(void) { setenv("BALLAST_CPU_GEMM", "builtin", 1); setup(); }
static void misspelt_gemm(void) { setenv("BALLAST_CPU_GEMM", "openblass", 1); }

/* A BALLAST_CPU_GEMM that names no GEMM stops the program (with a message
 * naming the three choices) instead of running on a guess. */
Test(backend_cpu, bad_gemm_choice_exits, .init = misspelt_gemm, .exit_code = 1) {
    backend_cpu(1);
    cr_assert_fail("backend_cpu accepted BALLAST_CPU_GEMM=openblass");
}

/* Test buffers come from here and are all released after each test, so a
 * failing assertion mid-test leaks nothing either (LeakSanitizer, valgrind). */
#define MAX_TEST_BUFS 512
static void *test_bufs[MAX_TEST_BUFS];
static int n_test_bufs;
static void *track(void *p) {
    cr_assert_not_null(p, "out of memory in a test buffer");
    for (int i = 0; i < n_test_bufs; i++)
        if (!test_bufs[i]) return test_bufs[i] = p;
    cr_assert(n_test_bufs < MAX_TEST_BUFS, "too many test buffers");
    return test_bufs[n_test_bufs++] = p;
}
static void *tmalloc(size_t n) { return track(malloc(n)); }
static void *tcalloc(size_t n, size_t size) { return track(calloc(n, size)); }
static void tfree(void *p) {
    for (int i = 0; i < n_test_bufs; i++)
        if (test_bufs[i] == p) { free(p); test_bufs[i] = NULL; return; }
}
static void teardown(void) {
    for (int i = 0; i < n_test_bufs; i++) free(test_bufs[i]);
    n_test_bufs = 0;
}

/* ---- helpers ---- */

static uint64_t rng_state = 12345;
static double urand(void) { return ((th_lcg64(&rng_state) >> 11) + 0.5) / 9007199254740992.0; }
static double nrand(void) { return sqrt(-2 * log(urand())) * cos(2 * M_PI * urand()); }

static double *drand_vec(size_t n, double scale) {
    double *x = tmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = scale * nrand();
    return x;
}
static float *to_f(const double *x, size_t n) {
    float *f = tmalloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}
/* round the double inputs to fp32 so both sides see the same values */
static void round_f(double *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = (float)x[i]; }

static double rel_err_fd(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1);
}

/* Central differences of f with respect to x[0..n). */
typedef double (*loss_fn)(void *ctx);
static void fd_grad(double *x, size_t n, loss_fn f, void *ctx, double *g) {
    for (size_t i = 0; i < n; i++) {
        double s = x[i];
        x[i] = s + FD_H; double lp = f(ctx);
        x[i] = s - FD_H; double lm = f(ctx);
        x[i] = s;
        g[i] = (lp - lm) / (2 * FD_H);
    }
}

#define CHECK_REL(ours, ref, n, what)                                                   \
    do {                                                                                \
        double e_ = rel_err_fd((ours), (ref), (n));                                     \
        cr_assert(e_ <= TOL, "%s: relative error %.3e > %.0e", (what), e_, TOL);        \
    } while (0)

/* ---- double reference forwards ---- */

static void ref_rmsnorm(double *out, const double *x, const double *w, int N, int D, double eps) {
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int j = 0; j < D; j++) ss += x[i * D + j] * x[i * D + j];
        double r = 1 / sqrt(ss / D + eps);
        for (int j = 0; j < D; j++) out[i * D + j] = w[j] * x[i * D + j] * r;
    }
}

static void ref_matmul(double *out, const double *x, const double *w, int N, int I, int O) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double s = 0;
            for (int i = 0; i < I; i++) s += x[n * I + i] * w[o * I + i];
            out[n * O + o] = s;
        }
}

/* Frequencies written as one clamped blend (the Llama 3 paper's form): with
 * s = clamp((C / wavelength - low) / (high - low), 0, 1), f' = s f + (1 - s) f / factor. */
static void ref_inv_freq(double *f, int Dh, const be_rope_t *r) {
    for (int i = 0; i < Dh / 2; i++) {
        f[i] = pow(r->theta, -2.0 * i / Dh);
        if (r->type == BE_ROPE_LINEAR) f[i] /= r->factor;
        if (r->type == BE_ROPE_LLAMA3) {
            double s = (r->original_max_pos * f[i] / (2 * M_PI) - r->low_freq_factor) /
                       (r->high_freq_factor - r->low_freq_factor);
            s = s < 0 ? 0 : s > 1 ? 1 : s;
            f[i] = s * f[i] + (1 - s) * f[i] / r->factor;
        }
    }
}

static const be_rope_t *g_ref_rope;
static int g_ref_pos0;

static void ref_rope(double *out, const double *x, int B, int T, int nh, int Dh, double theta) {
    int half = Dh / 2;
    be_rope_t plain = { .theta = (float)theta };
    double inv[64];
    ref_inv_freq(inv, Dh, g_ref_rope ? g_ref_rope : &plain);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++) {
                const double *p = x + (((size_t)b * T + t) * nh + h) * Dh;
                double *o = out + (((size_t)b * T + t) * nh + h) * Dh;
                for (int d = 0; d < Dh; d++) {
                    int i = d % half;
                    double ang = (t + g_ref_pos0) * inv[i];
                    double rot = d < half ? -p[d + half] : p[d - half];   /* rotate_half */
                    o[d] = p[d] * cos(ang) + rot * sin(ang);
                }
            }
}

static void ref_attention(double *out, const double *q, const double *k, const double *v, int B, int T, int H,
                          int Hkv, int Dh) {
    double *s = tmalloc((size_t)T * sizeof *s);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / Hkv);
            for (int t = 0; t < T; t++) {
                double mx = -1e300, sum = 0;
                for (int u = 0; u <= t; u++) {
                    double d = 0;
                    for (int e = 0; e < Dh; e++)
                        d += q[((b * T + t) * H + h) * Dh + e] * k[((b * T + u) * Hkv + kh) * Dh + e];
                    s[u] = d / sqrt((double)Dh);
                    if (s[u] > mx) mx = s[u];
                }
                for (int u = 0; u <= t; u++) { s[u] = exp(s[u] - mx); sum += s[u]; }
                for (int e = 0; e < Dh; e++) {
                    double o = 0;
                    for (int u = 0; u <= t; u++) o += s[u] / sum * v[((b * T + u) * Hkv + kh) * Dh + e];
                    out[((b * T + t) * H + h) * Dh + e] = o;
                }
            }
        }
    tfree(s);
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- embedding ---- */

Test(backend_cpu, embedding, .init = setup, .fini = teardown) {
    int N = 9, D = 7, V = 5;
    int32_t tok[9] = { 3, 1, 3, 0, 4, 4, 2, 3, 1 };
    double *wte = drand_vec((size_t)V * D, 1), *w = drand_vec((size_t)N * D, 1);
    round_f(wte, (size_t)V * D); round_f(w, (size_t)N * D);
    float *fw = to_f(wte, (size_t)V * D), *out = tcalloc((size_t)N * D, sizeof(float));
    be->embedding_fwd(out, tok, fw, N, D);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++) cr_assert_eq(out[i * D + j], fw[tok[i] * D + j]);
    /* dL/dwte[v] = sum of w rows whose token is v (L linear, so exact) */
    double *base = drand_vec((size_t)V * D, 1);
    round_f(base, (size_t)V * D);
    float *dwte = to_f(base, (size_t)V * D), *fdw = to_f(w, (size_t)N * D);
    be->embedding_bwd(dwte, fdw, tok, N, D);
    double *ref = tmalloc((size_t)V * D * sizeof *ref);
    memcpy(ref, base, (size_t)V * D * sizeof *ref);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++) ref[tok[i] * D + j] += w[i * D + j];
    CHECK_REL(dwte, ref, (size_t)V * D, "embedding dwte (accumulated)");
    tfree(wte); tfree(w); tfree(fw); tfree(out); tfree(base); tfree(dwte); tfree(fdw); tfree(ref);
}

/* ---- RMSNorm ---- */

typedef struct { double *x, *w, *wo, *tmp; int N, D; double eps; } rms_ctx;
static double rms_loss(void *p) {
    rms_ctx *c = p;
    ref_rmsnorm(c->tmp, c->x, c->w, c->N, c->D, c->eps);
    return dot(c->tmp, c->wo, (size_t)c->N * c->D);
}

Test(backend_cpu, rmsnorm, .init = setup, .fini = teardown) {
    int N = 5, D = 13;
    size_t n = (size_t)N * D;
    rms_ctx c = { drand_vec(n, 1.5), drand_vec(D, 1), drand_vec(n, 1), tmalloc(n * sizeof(double)), N, D, 1e-5 };
    round_f(c.x, n); round_f(c.w, D); round_f(c.wo, n);
    for (int j = 0; j < D; j++) c.w[j] += 1; /* gains near 1 */
    round_f(c.w, D);
    float *fx = to_f(c.x, n), *fw = to_f(c.w, D), *out = tmalloc(n * sizeof(float)), *rstd = tmalloc(N * sizeof(float));
    be->rmsnorm_fwd(out, rstd, fx, fw, N, D, (float)c.eps);
    ref_rmsnorm(c.tmp, c.x, c.w, N, D, c.eps);
    CHECK_REL(out, c.tmp, n, "rmsnorm forward");

    double *pre_dx = drand_vec(n, 1), *pre_dw = drand_vec(D, 1);
    round_f(pre_dx, n); round_f(pre_dw, D);
    float *dx = to_f(pre_dx, n), *dw = to_f(pre_dw, D), *fdo = to_f(c.wo, n);
    be->rmsnorm_bwd(dx, dw, fdo, fx, fw, rstd, N, D);
    double *gx = tmalloc(n * sizeof(double)), *gw = tmalloc(D * sizeof(double));
    fd_grad(c.x, n, rms_loss, &c, gx);
    fd_grad(c.w, D, rms_loss, &c, gw);
    for (size_t i = 0; i < n; i++) gx[i] += pre_dx[i];
    for (int j = 0; j < D; j++) gw[j] += pre_dw[j];
    CHECK_REL(dx, gx, n, "rmsnorm dx (accumulated)");
    CHECK_REL(dw, gw, D, "rmsnorm dw (accumulated)");
}

/* ---- matmul ---- */

typedef struct { double *x, *w, *wo, *tmp; int N, I, O; } mm_ctx;
static double mm_loss(void *p) {
    mm_ctx *c = p;
    ref_matmul(c->tmp, c->x, c->w, c->N, c->I, c->O);
    return dot(c->tmp, c->wo, (size_t)c->N * c->O);
}

static void check_matmul(int N, int I, int O, bool fd) {
    size_t nx = (size_t)N * I, nw = (size_t)O * I, no = (size_t)N * O;
    mm_ctx c = { drand_vec(nx, 1), drand_vec(nw, 0.3), drand_vec(no, 1), tmalloc(no * sizeof(double)), N, I, O };
    round_f(c.x, nx); round_f(c.w, nw); round_f(c.wo, no);
    float *fx = to_f(c.x, nx), *fw = to_f(c.w, nw), *out = tmalloc(no * sizeof(float));
    be->matmul_fwd(out, fx, fw, N, I, O);
    ref_matmul(c.tmp, c.x, c.w, N, I, O);
    char what[96];
    snprintf(what, sizeof what, "matmul forward %dx%dx%d", N, I, O);
    CHECK_REL(out, c.tmp, no, what);
    if (!fd) return;
    double *pre_dx = drand_vec(nx, 1), *pre_dw = drand_vec(nw, 1);
    round_f(pre_dx, nx); round_f(pre_dw, nw);
    float *dx = to_f(pre_dx, nx), *dw = to_f(pre_dw, nw), *fdo = to_f(c.wo, no);
    double *gx = tmalloc(nx * sizeof(double)), *gw = tmalloc(nw * sizeof(double));
    fd_grad(c.x, nx, mm_loss, &c, gx);
    fd_grad(c.w, nw, mm_loss, &c, gw);
    for (size_t i = 0; i < nw; i++) gw[i] += pre_dw[i];
    /* dx accumulated */
    be->matmul_bwd(dx, dw, fdo, fx, fw, N, I, O, true);
    for (size_t i = 0; i < nx; i++) gx[i] += pre_dx[i];
    CHECK_REL(dx, gx, nx, "matmul dx (accumulated)");
    CHECK_REL(dw, gw, nw, "matmul dw (accumulated)");
    /* dx overwritten */
    be->matmul_bwd(dx, NULL, fdo, fx, fw, N, I, O, false);
    for (size_t i = 0; i < nx; i++) gx[i] -= pre_dx[i];
    CHECK_REL(dx, gx, nx, "matmul dx (overwritten)");
}

Test(backend_cpu, matmul, .init = setup, .fini = teardown) {
    check_matmul(7, 37, 21, true);      /* odd sizes */
    check_matmul(8, 16, 32, true);      /* powers of two */
    check_matmul(67, 300, 70, false);   /* longer K */
    check_matmul(1, 5, 3, true);
}
Test(backend_cpu, matmul_builtin_gemm, .init = setup_builtin, .fini = teardown) {
    check_matmul(7, 37, 21, true);      /* odd sizes */
    check_matmul(8, 16, 32, true);      /* powers of two */
    check_matmul(67, 300, 70, false);   /* longer K */
    check_matmul(1, 5, 3, true);
}

/* Same bits for 1 and 2 threads: resume and activation checkpointing rely on
 * it (test_backend_cpu_threads.c checks every op at 1, 2 and 4 threads). */
Test(backend_cpu, matmul_deterministic_across_threads, .init = setup, .fini = teardown) {
    int N = 45, I = 300, O = 77;
    double *x = drand_vec((size_t)N * I, 1), *w = drand_vec((size_t)O * I, 1);
    float *fx = to_f(x, (size_t)N * I), *fw = to_f(w, (size_t)O * I);
    float *a = tmalloc((size_t)N * O * sizeof(float)), *b = tmalloc((size_t)N * O * sizeof(float));
    backend_cpu(1)->matmul_fwd(a, fx, fw, N, I, O);
    backend_cpu(2)->matmul_fwd(b, fx, fw, N, I, O);
    cr_assert(memcmp(a, b, (size_t)N * O * sizeof(float)) == 0);
    float *da = tcalloc((size_t)O * I, sizeof(float)), *db = tcalloc((size_t)O * I, sizeof(float));
    backend_cpu(1)->matmul_bwd(NULL, da, a, fx, fw, N, I, O, false);
    backend_cpu(2)->matmul_bwd(NULL, db, a, fx, fw, N, I, O, false);
    cr_assert(memcmp(da, db, (size_t)O * I * sizeof(float)) == 0);
    backend_cpu(2);
}

/* ---- RoPE ---- */

typedef struct { double *x, *wo, *tmp; int B, T, nh, Dh; double theta; } rope_ctx;
static double rope_loss(void *p) {
    rope_ctx *c = p;
    ref_rope(c->tmp, c->x, c->B, c->T, c->nh, c->Dh, c->theta);
    return dot(c->tmp, c->wo, (size_t)c->B * c->T * c->nh * c->Dh);
}

/* forward and backward of one rope setting, rows starting at position pos0 */
static void check_rope(int B, int T, int nh, int Dh, int pos0, const be_rope_t *r, const char *what) {
    size_t n = (size_t)B * T * nh * Dh;
    rope_ctx c = { drand_vec(n, 1), drand_vec(n, 1), tmalloc(n * sizeof(double)), B, T, nh, Dh, r->theta };
    g_ref_rope = r;
    g_ref_pos0 = pos0;
    round_f(c.x, n); round_f(c.wo, n);
    float *x = to_f(c.x, n);
    be->rope_fwd(x, B, T, nh, Dh, pos0, r);
    ref_rope(c.tmp, c.x, B, T, nh, Dh, c.theta);
    char name[128];
    snprintf(name, sizeof name, "rope forward (%s)", what);
    CHECK_REL(x, c.tmp, n, name);
    float *g = to_f(c.wo, n);
    be->rope_bwd(g, B, T, nh, Dh, pos0, r);
    double *gx = tmalloc(n * sizeof(double));
    fd_grad(c.x, n, rope_loss, &c, gx);
    snprintf(name, sizeof name, "rope backward (%s)", what);
    CHECK_REL(g, gx, n, name);
    g_ref_rope = NULL;
    g_ref_pos0 = 0;
}

Test(backend_cpu, rope, .init = setup, .fini = teardown) {
    be_rope_t plain = { .theta = 10000.f };
    check_rope(2, 7, 3, 10, 0, &plain, "default");
}

/* Llama 3 scaling at head_dim 32 with original_max_position_embeddings 48:
 * its pairs fall in all three bands (kept, blended, divided by factor);
 * linear scaling; and rows starting past position 0 (KV-cached decoding). */
Test(backend_cpu, rope_scaled, .init = setup, .fini = teardown) {
    be_rope_t l3 = { .theta = 10000.f, .type = BE_ROPE_LLAMA3, .factor = 8.f, .low_freq_factor = 1.f,
                     .high_freq_factor = 4.f, .original_max_pos = 48 };
    int bands[3] = { 0, 0, 0 };
    for (int i = 0; i < 16; i++) {
        double w = 2 * M_PI * pow(10000.0, 2.0 * i / 32);
        bands[w < 12 ? 0 : w > 48 ? 2 : 1]++;
    }
    cr_assert(bands[0] && bands[1] && bands[2], "the bands kept/blended/divided hold %d/%d/%d pairs", bands[0],
              bands[1], bands[2]);
    check_rope(2, 9, 2, 32, 0, &l3, "llama3");
    check_rope(1, 3, 2, 32, 41, &l3, "llama3, from position 41");
    be_rope_t lin = { .theta = 500000.f, .type = BE_ROPE_LINEAR, .factor = 4.f };
    check_rope(2, 5, 3, 12, 0, &lin, "linear");
    check_rope(1, 2, 3, 12, 100, &lin, "linear, from position 100");
}

/* ---- attention ---- */

typedef struct { double *q, *k, *v, *wo, *tmp; int B, T, H, Hkv, Dh; } att_ctx;
static double att_loss(void *p) {
    att_ctx *c = p;
    ref_attention(c->tmp, c->q, c->k, c->v, c->B, c->T, c->H, c->Hkv, c->Dh);
    return dot(c->tmp, c->wo, (size_t)c->B * c->T * c->H * c->Dh);
}

static void check_attention(int B, int T, int H, int Hkv, int Dh) {
    size_t nq = (size_t)B * T * H * Dh, nk = (size_t)B * T * Hkv * Dh;
    att_ctx c = { drand_vec(nq, 1), drand_vec(nk, 1), drand_vec(nk, 1), drand_vec(nq, 1),
                  tmalloc(nq * sizeof(double)), B, T, H, Hkv, Dh };
    round_f(c.q, nq); round_f(c.k, nk); round_f(c.v, nk); round_f(c.wo, nq);
    float *q = to_f(c.q, nq), *k = to_f(c.k, nk), *v = to_f(c.v, nk), *out = tmalloc(nq * sizeof(float));
    cr_assert_eq(be->attention_state_numel(B, T, H), (size_t)B * H * T, "the CPU keeps log-sum-exp rows");
    float *att = tmalloc(be->attention_state_numel(B, T, H) * sizeof(float));
    be->attention_fwd(out, att, q, k, v, B, T, H, Hkv, Dh);
    ref_attention(c.tmp, c.q, c.k, c.v, B, T, H, Hkv, Dh);
    CHECK_REL(out, c.tmp, nq, "attention forward");
    float *dq = tmalloc(nq * sizeof(float)), *dk = tmalloc(nk * sizeof(float)), *dv = tmalloc(nk * sizeof(float));
    float *dout = to_f(c.wo, nq);
    be->attention_bwd(dq, dk, dv, dout, out, q, k, v, att, B, T, H, Hkv, Dh);
    double *gq = tmalloc(nq * sizeof(double)), *gk = tmalloc(nk * sizeof(double)), *gv = tmalloc(nk * sizeof(double));
    fd_grad(c.q, nq, att_loss, &c, gq);
    fd_grad(c.k, nk, att_loss, &c, gk);
    fd_grad(c.v, nk, att_loss, &c, gv);
    CHECK_REL(dq, gq, nq, "attention dq");
    CHECK_REL(dk, gk, nk, "attention dk");
    CHECK_REL(dv, gv, nk, "attention dv");
}

Test(backend_cpu, attention_grouped_query, .init = setup, .fini = teardown) { check_attention(2, 5, 4, 2, 6); }
Test(backend_cpu, attention_multi_head, .init = setup, .fini = teardown) { check_attention(1, 7, 3, 3, 4); }
Test(backend_cpu, attention_multi_query, .init = setup, .fini = teardown) { check_attention(2, 4, 4, 1, 8); }
Test(backend_cpu, attention_builtin_gemm, .init = setup_builtin, .fini = teardown) {
    check_attention(2, 5, 4, 2, 6);
    check_attention(1, 21, 2, 1, 20);     /* past one 16-column panel of the kernel */
}

/* ---- SwiGLU ---- */

typedef struct { double *g, *u, *wo; size_t n; } sw_ctx;
static double sw_loss(void *p) {
    sw_ctx *c = p;
    double s = 0;
    for (size_t i = 0; i < c->n; i++) s += c->wo[i] * c->g[i] / (1 + exp(-c->g[i])) * c->u[i];
    return s;
}

Test(backend_cpu, swiglu, .init = setup, .fini = teardown) {
    size_t n = 57;
    sw_ctx c = { drand_vec(n, 2), drand_vec(n, 1), drand_vec(n, 1), n };
    round_f(c.g, n); round_f(c.u, n); round_f(c.wo, n);
    float *g = to_f(c.g, n), *u = to_f(c.u, n), *h = tmalloc(n * sizeof(float));
    be->swiglu_fwd(h, g, u, n);
    double *ref = tmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) ref[i] = c.g[i] / (1 + exp(-c.g[i])) * c.u[i];
    CHECK_REL(h, ref, n, "swiglu forward");
    float *dg = tmalloc(n * sizeof(float)), *du = tmalloc(n * sizeof(float)), *dh = to_f(c.wo, n);
    be->swiglu_bwd(dg, du, dh, g, u, n);
    double *gg = tmalloc(n * sizeof(double)), *gu = tmalloc(n * sizeof(double));
    fd_grad(c.g, n, sw_loss, &c, gg);
    fd_grad(c.u, n, sw_loss, &c, gu);
    CHECK_REL(dg, gg, n, "swiglu dgate");
    CHECK_REL(du, gu, n, "swiglu dup");
}

/* ---- cross-entropy ---- */

typedef struct { double *l; const int32_t *y; int N, V; double scale; } xe_ctx;
static double xe_loss(void *p) {
    xe_ctx *c = p;
    double s = 0;
    for (int i = 0; i < c->N; i++) {
        double mx = -1e300, z = 0;
        for (int j = 0; j < c->V; j++) if (c->l[i * c->V + j] > mx) mx = c->l[i * c->V + j];
        for (int j = 0; j < c->V; j++) z += exp(c->l[i * c->V + j] - mx);
        s += log(z) + mx - c->l[i * c->V + c->y[i]];
    }
    return s * c->scale;
}

Test(backend_cpu, cross_entropy, .init = setup, .fini = teardown) {
    int N = 6, V = 11;
    size_t n = (size_t)N * V;
    int32_t y[6] = { 0, 10, 3, 3, 7, 5 };
    xe_ctx c = { drand_vec(n, 3), y, N, V, 1.0 / 6 };
    round_f(c.l, n);
    float *l = to_f(c.l, n), *losses = tmalloc(N * sizeof(float));
    be->xent_fwd(losses, l, y, N, V);
    double total = 0;
    for (int i = 0; i < N; i++) total += losses[i];
    double ref = xe_loss(&c) * N;
    cr_assert(fabs(total - ref) <= TOL * fabs(ref), "xent forward %.9g vs %.9g", total, ref);
    double *g = tmalloc(n * sizeof(double));
    fd_grad(c.l, n, xe_loss, &c, g);
    be->xent_bwd(l, l, y, (float)c.scale, N, V);   /* in place, as the model uses it */
    CHECK_REL(l, g, n, "xent dlogits");
}

/* ---- elementwise, reductions, AdamW ---- */

Test(backend_cpu, add_scale_sumsq, .init = setup, .fini = teardown) {
    size_t n = 100003;
    double *a = drand_vec(n, 1), *b = drand_vec(n, 1);
    round_f(a, n); round_f(b, n);
    float *fa = to_f(a, n), *fb = to_f(b, n), *o = tmalloc(n * sizeof(float));
    be->add(o, fa, fb, n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(o[i], fa[i] + fb[i]);
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += a[i] * a[i];
    double got = be->sumsq(fa, n);
    cr_assert(fabs(got - ss) <= 1e-12 * ss, "sumsq %.17g vs %.17g", got, ss);
    be->scale(fa, 0.5f, n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(fa[i], (float)a[i] * 0.5f);
}

Test(backend_cpu, adamw_matches_the_formula, .init = setup, .fini = teardown) {
    size_t n = 333;
    double *p = drand_vec(n, 1), *g = drand_vec(n, 1), *m = drand_vec(n, 0.1), *v = drand_vec(n, 0.1);
    for (size_t i = 0; i < n; i++) v[i] = fabs(v[i]);
    round_f(p, n); round_f(g, n); round_f(m, n); round_f(v, n);
    float *fp = to_f(p, n), *fg = to_f(g, n), *fm = to_f(m, n), *fv = to_f(v, n);
    double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.7;
    int t = 3;
    double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    be->adamw(fp, fg, fm, fv, n, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, (float)(lr / bc1),
              (float)sqrt(bc2), (float)gs, NULL);
    double *rp = tmalloc(n * sizeof(double)), *rm = tmalloc(n * sizeof(double)), *rv = tmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] * gs;
        rm[i] = b1 * m[i] + (1 - b1) * gi;
        rv[i] = b2 * v[i] + (1 - b2) * gi * gi;
        rp[i] = p[i] * (1 - lr * wd) - lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
    }
    CHECK_REL(fm, rm, n, "adamw exp_avg");
    CHECK_REL(fv, rv, n, "adamw exp_avg_sq");
    CHECK_REL(fp, rp, n, "adamw params");
    /* the update itself (p_new - p_old) must match too, not just p */
    for (size_t i = 0; i < n; i++) { rp[i] -= p[i]; fp[i] -= (float)p[i]; }
    double e = rel_err_fd(fp, rp, n);
    cr_assert(e <= 1e-3, "adamw update relative error %.3e", e);
    tfree(p); tfree(g); tfree(m); tfree(v); tfree(fp); tfree(fg); tfree(fm); tfree(fv);
    tfree(rp); tfree(rm); tfree(rv);
}

/* fp32 act storage: the CPU's act_t buffers are plain floats, conversions
 * are copies, and AdamW's working-copy output equals the master. */
Test(backend_cpu, act_storage_is_fp32, .init = setup, .fini = teardown) {
    cr_assert_eq(be->act_bytes, (int)sizeof(float));
    size_t n = 257;
    double *d = drand_vec(n, 3);
    float *src = to_f(d, n), *dst = tmalloc(n * sizeof(float)), *host = tmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) dst[i] = NAN;
    be->to_act(dst, src, n);
    cr_assert(memcmp(dst, src, n * sizeof(float)) == 0, "to_act must copy fp32 exactly");
    be->act_to_host(host, dst, n);
    cr_assert(memcmp(host, src, n * sizeof(float)) == 0, "act_to_host must copy fp32 exactly");
    cr_assert_eq(be_act_at(be, dst, 5), dst + 5);
    float *g = to_f(d, n), *m = tcalloc(n, sizeof(float)), *v = tcalloc(n, sizeof(float)), *pa = tmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) pa[i] = NAN;
    be->adamw(src, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1e-2f, 0.2f, 1.f, pa);
    cr_assert(memcmp(pa, src, n * sizeof(float)) == 0, "the working copy must equal the updated master");
    tfree(d); tfree(src); tfree(dst); tfree(host); tfree(g); tfree(m); tfree(v); tfree(pa);
}
