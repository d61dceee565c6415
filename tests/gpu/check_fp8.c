/* check_fp8.c: the FP8 GEMMs (--precision fp8, gemm_fp8.cu) against the
 * bf16 GEMMs of the same table, and the delayed-scaling recipe.
 *
 * For each shape, seeded random x (N, I), w (O, I) and dout (N, O) with
 * magnitudes far from 1 (so an unscaled FP8 cast would under- or
 * overflow), bf16-rounded: forward, dx and dw once in bf16 and once in
 * FP8. The tolerance comes from the formats. A value v quantized to a
 * format with m mantissa bits at scale s has a rounding error of at most
 * u|v| (u = 2^-(m+1): 2^-4 for E4M3, 2^-3 for E5M2) or, below the
 * smallest normal, half a subnormal step divided by s (a: 2^-10/s for
 * E4M3, 2^-17/s for E5M2); round to nearest makes it about uniform, so
 * its variance is at most (u v)^2/3 + a^2/3. An output
 * sum_k p_k q_k then errs by a sum of independent terms with variance
 *     sigma^2 = sum_k [q_k^2 var(p_k) + p_k^2 var(q_k)]
 * and each element must satisfy
 *     |fp8 - bf16| <= 6 sigma + 2^-8 |bf16|
 * (the last term: both outputs rounded to bf16, half an ulp each; dw is
 * fp32, so it has none). The whole output's L2 error must also stay below
 * 1.1 x the L2 norm of the sigmas: a check at the scale of the expected
 * error, not only at its tail.
 *
 * The recipe: after a first use, each operand's scale is FMAX / amax
 * (448 E4M3 for weights and inputs, 57344 E5M2 for gradients); a 4x
 * larger input is quantized with the old scale (it saturates, stays
 * finite), the next call uses 448 / (4 amax) and is accurate again; the
 * large amax leaves the history after exactly CUDA_FP8_HISTORY uses.
 * Shapes that are not multiples of 16 run in bf16 (counted). On a GPU
 * below compute capability 8.9 --precision fp8 must be refused with a
 * message naming the capability. */
#include <cuda_runtime.h>

#include "tests/gpu/gpucheck.h"

#define U_E4M3 0.0625       /* 2^-4 */
#define U_E5M2 0.125        /* 2^-3 */
#define SUB_E4M3 0x1p-10    /* half the subnormal step, scaled domain */
#define SUB_E5M2 0x1p-17
#define MAX_E4M3 448.0
#define MAX_E5M2 57344.0

static float amax_of(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* variance bound of quantizing v with relative u and absolute a */
static inline double qvar(double v, double u, double a) { return (v * v * u * u + a * a) / 3.0; }

/* One TAP line: per-element |got - ref| <= 6 sigma + rel |ref|, and the
 * L2 error <= 1.1 x sqrt(sum sigma^2 + (rel/2)^2 ref^2 / 3 * 2). */
static bool compare_fp8(const char *what, const float *got, const float *ref, const double *sig2, size_t n, double rel) {
    double e2 = 0, s2 = 0, worst = 0;
    size_t bad = 0, wi = 0;
    bool nan = false;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) { nan = true; bad++; wi = i; continue; }
        double e = fabs((double)got[i] - ref[i]), sd = sqrt(sig2[i]);
        double tol = 6 * sd + rel * fabs(ref[i]) + 1e-30;
        e2 += e * e;
        s2 += sig2[i] + 2 * (rel / 2) * (rel / 2) * ref[i] * ref[i] / 3;
        if (e / tol > worst) { worst = e / tol; wi = i; }
        if (e > tol) bad++;
    }
    double l2 = sqrt(e2), l2_exp = sqrt(s2);
    bool ok = !nan && bad == 0 && l2 <= 1.1 * l2_exp && n > 0;
    GC.cases++;
    printf("%s - %s/%s %s\n", ok ? "ok" : "not ok", GC.family, GC.name, what);
    printf("#   n=%zu worst |err|/tol=%.3f, L2 error %.4g vs expected <= %.4g (ratio %.3f)%s\n", n, worst, l2, l2_exp,
           l2_exp > 0 ? l2 / l2_exp : 0.0, nan ? " NaN/Inf present" : "");
    if (!ok) {
        printf("#   %zu elements out of tolerance; worst at %zu: fp8 %.6g bf16 %.6g sigma %.3g\n", bad, wi, got[wi], ref[wi],
               sqrt(sig2[wi]));
        GC.failed++;
    }
    return ok;
}

static void rand_bf16(float *x, size_t n, float mag) {
    gc_rand(x, n, -mag, mag);
    gc_round_bf16(x, n);
}

typedef struct {
    float *y, *dx, *dw;
} outs_t;

/* forward + backward on the GPU with the current precision; host results */
static outs_t run_gemms(act_t *x, act_t *w, act_t *dout, int N, int I, int O) {
    const backend_t *g = GC.gpu;
    act_t *y = g->alloc((size_t)N * O * 2), *dx = g->alloc((size_t)N * I * 2);
    float *dw = g->alloc((size_t)O * I * 4);
    gc_poison_act(y, (size_t)N * O);
    gc_poison_act(dx, (size_t)N * I);
    g->matmul_fwd(y, x, w, N, I, O);
    g->matmul_bwd(dx, dw, dout, x, w, N, I, O, false); /* dw starts at zero (alloc) */
    outs_t o = { gc_get_act(y, (size_t)N * O), gc_get_act(dx, (size_t)N * I), gc_get_f32(dw, (size_t)O * I) };
    g->free(y), g->free(dx), g->free(dw);
    return o;
}

static void free_outs(outs_t *o) { free(o->y), free(o->dx), free(o->dw); }

static double *sig_fwd(const float *x, const float *w, int N, int I, int O, double ax, double aw) {
    double *s = calloc((size_t)N * O, sizeof *s);
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double acc = 0;
            for (int i = 0; i < I; i++) {
                double p = x[(size_t)n * I + i], q = w[(size_t)o * I + i];
                acc += q * q * qvar(p, U_E4M3, ax) + p * p * qvar(q, U_E4M3, aw);
            }
            s[(size_t)n * O + o] = acc;
        }
    return s;
}

static double *sig_dx(const float *g, const float *w, int N, int I, int O, double ag, double aw) {
    double *s = calloc((size_t)N * I, sizeof *s);
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            double acc = 0;
            for (int o = 0; o < O; o++) {
                double p = g[(size_t)n * O + o], q = w[(size_t)o * I + i];
                acc += q * q * qvar(p, U_E5M2, ag) + p * p * qvar(q, U_E4M3, aw);
            }
            s[(size_t)n * I + i] = acc;
        }
    return s;
}

static double *sig_dw(const float *g, const float *x, int N, int I, int O, double ag, double ax) {
    double *s = calloc((size_t)O * I, sizeof *s);
#pragma omp parallel for
    for (int o = 0; o < O; o++)
        for (int i = 0; i < I; i++) {
            double acc = 0;
            for (int n = 0; n < N; n++) {
                double p = g[(size_t)n * O + o], q = x[(size_t)n * I + i];
                acc += q * q * qvar(p, U_E5M2, ag) + p * p * qvar(q, U_E4M3, ax);
            }
            s[(size_t)o * I + i] = acc;
        }
    return s;
}

static bool set_prec(cuda_precision_t p) {
    char err[300];
    if (cuda_set_precision(p, err, sizeof err)) {
        printf("not ok - fp8/%s set precision: %s\n", GC.name, err);
        GC.cases++, GC.failed++;
        return false;
    }
    return true;
}

/* state check: scale == fmax / expect_amax and history max == expect_amax */
static void check_state(const char *what, const void *w, int role, double fmax, float expect_amax) {
    float scale = 0, hmax = 0;
    int rc = cuda_fp8_state(w, role, &scale, &hmax);
    double want = fmax / expect_amax;
    bool ok = rc == 0 && hmax == expect_amax && fabs(scale - want) <= 1e-6 * want;
    GC.cases++;
    printf("%s - fp8/%s %s: scale %.6g (want %.6g = %.0f / %.6g), history max %.6g\n", ok ? "ok" : "not ok", GC.name,
           what, scale, want, fmax, expect_amax, hmax);
    if (!ok) GC.failed++;
}

static void case_shape(int N, int I, int O, float mx, float mw, float mg, bool recipe) {
    if (!gc_case("N%d_I%d_O%d", N, I, O)) return;
    const backend_t *g = GC.gpu;
    cuda_fp8_reset(); /* this case's weight may reuse a freed address of the last one */
    float *x = gc_host((size_t)N * I), *w = gc_host((size_t)O * I), *gr = gc_host((size_t)N * O);
    rand_bf16(x, (size_t)N * I, mx);
    rand_bf16(w, (size_t)O * I, mw);
    rand_bf16(gr, (size_t)N * O, mg);
    act_t *dx_ = gc_dev_act(x, (size_t)N * I), *dw_ = gc_dev_act(w, (size_t)O * I), *dg_ = gc_dev_act(gr, (size_t)N * O);
    if (!set_prec(CUDA_PRECISION_BF16)) return;
    outs_t ref = run_gemms(dx_, dw_, dg_, N, I, O);
    if (!set_prec(CUDA_PRECISION_FP8)) return;
    long n8a, nfa, n8b, nfb;
    cuda_fp8_counts(&n8a, &nfa);
    outs_t got = run_gemms(dx_, dw_, dg_, N, I, O);
    cuda_fp8_counts(&n8b, &nfb);
    float ax = amax_of(x, (size_t)N * I), aw = amax_of(w, (size_t)O * I), ag = amax_of(gr, (size_t)N * O);
    /* absolute floor of each operand: half a subnormal step at scale fmax / amax */
    double fx = SUB_E4M3 * ax / MAX_E4M3, fw = SUB_E4M3 * aw / MAX_E4M3, fg = SUB_E5M2 * ag / MAX_E5M2;
    bool aligned = N % 16 == 0 && I % 16 == 0 && O % 16 == 0;
    if (!aligned) {
        bool same = !memcmp(got.y, ref.y, (size_t)N * O * 4) && !memcmp(got.dx, ref.dx, (size_t)N * I * 4) &&
                    !memcmp(got.dw, ref.dw, (size_t)O * I * 4);
        bool ok = same && n8b == n8a && nfb - nfa == 2;
        GC.cases++;
        printf("%s - fp8/%s not multiples of 16: bf16 fallback, bit-identical (%ld fallbacks, %ld fp8)\n", ok ? "ok" : "not ok",
               GC.name, nfb - nfa, n8b - n8a);
        if (!ok) GC.failed++;
    } else {
        GC.cases++;
        bool ok = n8b - n8a == 3 && nfb == nfa;
        printf("%s - fp8/%s ran in fp8 (%ld fp8 GEMMs, %ld fallbacks)\n", ok ? "ok" : "not ok", GC.name, n8b - n8a, nfb - nfa);
        if (!ok) GC.failed++;
        double *s = sig_fwd(x, w, N, I, O, fx, fw);
        compare_fp8("forward y (e4m3 x e4m3, bf16 out)", got.y, ref.y, s, (size_t)N * O, 0x1p-8);
        free(s);
        s = sig_dx(gr, w, N, I, O, fg, fw);
        compare_fp8("dx (e5m2 x e4m3, bf16 out)", got.dx, ref.dx, s, (size_t)N * I, 0x1p-8);
        free(s);
        s = sig_dw(gr, x, N, I, O, fg, fx);
        compare_fp8("dw (e5m2 x e4m3, fp32 accumulate)", got.dw, ref.dw, s, (size_t)O * I, 1e-6);
        free(s);
        check_state("weight scale after first use", dw_, CUDA_FP8_WEIGHT, MAX_E4M3, aw);
        check_state("input scale after first use", dw_, CUDA_FP8_INPUT, MAX_E4M3, ax);
        check_state("gradient scale after first use", dw_, CUDA_FP8_GRAD, MAX_E5M2, ag);
    }
    if (recipe && aligned) {
        /* a 4x jump of the input: delayed scaling quantizes it with the old scale */
        float *x4 = gc_host((size_t)N * I);
        for (size_t i = 0; i < (size_t)N * I; i++) x4[i] = 4.f * x[i]; /* exact in bf16 */
        act_t *dx4 = gc_dev_act(x4, (size_t)N * I), *y = g->alloc((size_t)N * O * 2);
        g->matmul_fwd(y, dx4, dw_, N, I, O);
        float *yj = gc_get_act(y, (size_t)N * O);
        bool fin = true;
        for (size_t i = 0; i < (size_t)N * O; i++) fin = fin && isfinite(yj[i]);
        GC.cases++;
        printf("%s - fp8/%s 4x input with the old scale saturates but stays finite\n", fin ? "ok" : "not ok", GC.name);
        if (!fin) GC.failed++;
        check_state("input scale after the jump (history max 4 amax)", dw_, CUDA_FP8_INPUT, MAX_E4M3, 4 * ax);
        g->matmul_fwd(y, dx4, dw_, N, I, O);
        float *y2 = gc_get_act(y, (size_t)N * O);
        if (set_prec(CUDA_PRECISION_BF16)) {
            g->matmul_fwd(y, dx4, dw_, N, I, O);
            float *r2 = gc_get_act(y, (size_t)N * O);
            double *s = sig_fwd(x4, w, N, I, O, SUB_E4M3 * 4 * ax / MAX_E4M3, fw);
            compare_fp8("4x input, next call: accurate again", y2, r2, s, (size_t)N * O, 0x1p-8);
            free(s), free(r2);
            set_prec(CUDA_PRECISION_FP8);
        }
        /* the 4 amax entries (two uses) leave the history CUDA_FP8_HISTORY uses later */
        for (int k = 0; k < CUDA_FP8_HISTORY - 1; k++) g->matmul_fwd(y, dx_, dw_, N, I, O);
        check_state("input scale one use before the window passes", dw_, CUDA_FP8_INPUT, MAX_E4M3, 4 * ax);
        g->matmul_fwd(y, dx_, dw_, N, I, O);
        check_state("input scale after CUDA_FP8_HISTORY uses", dw_, CUDA_FP8_INPUT, MAX_E4M3, ax);
        free(x4), free(yj), free(y2);
        g->free(dx4), g->free(y);
    }
    set_prec(CUDA_PRECISION_BF16);
    free_outs(&ref), free_outs(&got);
    g->free(dx_), g->free(dw_), g->free(dg_);
    free(x), free(w), free(gr);
}

int main(void) {
    gc_init("fp8");
    int major = 0, minor = 0;
    if (GC.have_gpu) {
        int dev = 0;
        struct cudaDeviceProp prop;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
            major = prop.major, minor = prop.minor;
    }
    if (GC.have_gpu && major * 10 + minor < 89) {
        char err[300] = "";
        int rc = cuda_set_precision(CUDA_PRECISION_FP8, err, sizeof err);
        bool ok = rc != 0 && strstr(err, "8.9") && cuda_precision() == CUDA_PRECISION_BF16;
        GC.cases++;
        printf("%s - fp8/refused_below_8.9 (GPU %d.%d): %s\n", ok ? "ok" : "not ok", major, minor, err);
        if (!ok) GC.failed++;
        GC.have_gpu = false; /* the cases below need FP8: skip them */
        snprintf(GC.why, sizeof GC.why, "GPU %d.%d has no FP8 tensor cores", major, minor);
    } else if (gc_case("accepted_on_8.9_plus")) {
        char err[300] = "";
        int rc = cuda_set_precision(CUDA_PRECISION_FP8, err, sizeof err);
        bool ok = rc == 0 && cuda_precision() == CUDA_PRECISION_FP8;
        GC.cases++;
        printf("%s - fp8/accepted_on_8.9_plus (GPU %d.%d)%s%s\n", ok ? "ok" : "not ok", major, minor, rc ? ": " : "", err);
        if (!ok) GC.failed++;
        set_prec(CUDA_PRECISION_BF16);
    }
    /* magnitudes: activations ~30, weights ~0.02, gradients ~1e-4 (the last
     * underflows E5M2 unscaled: smallest subnormal 1.5e-5) */
    case_shape(256, 512, 384, 30.f, 0.02f, 1e-4f, true);
    case_shape(128, 1024, 768, 2.f, 0.05f, 3e-3f, false);
    case_shape(64, 2048, 128, 0.5f, 1.f, 1e-6f, false);
    case_shape(100, 64, 48, 1.f, 1.f, 1.f, false);
    return gc_done();
}
