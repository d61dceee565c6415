/* gpucheck.h: the harness of the GPU kernel checks (tests/gpu/check_*.c).
 *
 * Each check runs one op family of the CUDA backend and of the CPU oracle
 * (backend_cpu) on the same fresh random inputs (seeded, never all zeros),
 * rounded to bf16 first wherever the GPU stores bf16, so that both sides
 * see identical numbers. GPU outputs are poisoned with NaN before every
 * run; results pass when every element satisfies
 *     |gpu - cpu| <= rtol * (|cpu| + rms(cpu))
 * with rtol = GC_BF16_TOL (bf16 outputs) or GC_F32_TOL (fp32 outputs).
 * Output is TAP; without a GPU every case prints "ok - NAME # SKIP no GPU".
 * Header-only: each check program includes it once. */
#ifndef BALLAST_GPUCHECK_H
#define BALLAST_GPUCHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/backend/backend.h"
#include "workers/backend/cuda/backend_cuda.h"

#define GC_BF16_TOL 1e-2
#define GC_F32_TOL 1e-5

typedef struct {
    const char *family;
    const backend_t *cpu, *gpu;
    bool have_gpu;
    char why[300];
    char name[200];     /* current case */
    int cases, failed;  /* TAP lines printed, failed among them */
    uint64_t rng;
} gc_state_t;

static gc_state_t GC;

/* ---- set-up ---- */

static inline void gc_init(const char *family) {
    memset(&GC, 0, sizeof GC);
    GC.family = family;
    GC.rng = 0x9E3779B97F4A7C15ull;
    for (const char *p = family; *p; p++) GC.rng = (GC.rng ^ (uint8_t)*p) * 0x100000001B3ull;
    char err[256];
    if (cuda_device_count(err, sizeof err) <= 0) snprintf(GC.why, sizeof GC.why, "%s", err);
    else if (!(GC.gpu = backend_cuda(0, err, sizeof err))) snprintf(GC.why, sizeof GC.why, "%s", err);
    else GC.have_gpu = true;
    GC.cpu = backend_cpu(0);
    printf("TAP version 13\n# %s: %s%s\n", family, GC.have_gpu ? "GPU 0 against the CPU oracle" : "no GPU: ",
           GC.have_gpu ? "" : GC.why);
}

/* True on the emulated GPU of tests/emu (its device name says gpu-emu):
 * the checks then run smaller shapes, since the emulator runs kernels on
 * the CPU, and rely on its random stream order, not on long kernels, to
 * expose missing ordering. */
static inline bool gc_emulated(void) {
    const char *n = GC.have_gpu ? be_device_name(GC.gpu) : NULL;
    return n && strstr(n, "gpu-emu") != NULL;
}

/* Start a case; false (and a SKIP line) when there is no GPU. */
static inline bool gc_case(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(GC.name, sizeof GC.name, fmt, ap);
    va_end(ap);
    if (!GC.have_gpu) { GC.cases++; printf("ok - %s/%s # SKIP no GPU\n", GC.family, GC.name); return false; }
    return true;
}

static inline int gc_done(void) {
    printf("1..%d\n", GC.cases);
    if (GC.have_gpu) printf("# %s: %d of %d checks failed\n", GC.family, GC.failed, GC.cases);
    return GC.failed ? 1 : 0;
}

/* ---- data ---- */

static inline uint64_t gc_next(void) {
    GC.rng ^= GC.rng >> 12;
    GC.rng ^= GC.rng << 25;
    GC.rng ^= GC.rng >> 27;
    return GC.rng * 0x2545F4914F6CDD1Dull;
}

/* uniform in [lo, hi) */
static inline void gc_rand(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)((gc_next() >> 40) * (1.0 / 16777216.0));
}

static inline void gc_rand_tokens(int32_t *t, size_t n, int V) {
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)(gc_next() % (uint64_t)V);
}

static inline void gc_round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = cuda_bf16_to_f32(cuda_f32_to_bf16(x[i]));
}

static inline float *gc_host(size_t n) {
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    if (!p) { fprintf(stderr, "gpucheck: out of host memory (%zu floats)\n", n); exit(1); }
    return p;
}

/* ---- device buffers ---- */

/* act (bf16) copy of host values, which must already be bf16-rounded */
static inline act_t *gc_dev_act(const float *host, size_t n) {
    uint16_t *b = (uint16_t *)malloc((n ? n : 1) * 2);
    for (size_t i = 0; i < n; i++) b[i] = cuda_f32_to_bf16(host[i]);
    act_t *d = (act_t *)GC.gpu->alloc(n * 2);
    if (!d) { fprintf(stderr, "gpucheck: GPU out of memory\n"); exit(1); }
    GC.gpu->from_host(d, b, n * 2);
    free(b);
    return d;
}

static inline float *gc_dev_f32(const float *host, size_t n) {
    float *d = (float *)GC.gpu->alloc(n * sizeof(float));
    if (!d) { fprintf(stderr, "gpucheck: GPU out of memory\n"); exit(1); }
    GC.gpu->from_host(d, host, n * sizeof(float));
    return d;
}

static inline void *gc_dev_bytes(const void *host, size_t bytes) {
    void *d = GC.gpu->alloc(bytes);
    if (!d) { fprintf(stderr, "gpucheck: GPU out of memory\n"); exit(1); }
    GC.gpu->from_host(d, host, bytes);
    return d;
}

/* NaN everywhere: an op that skips an element leaves a NaN behind */
static inline void gc_poison_act(act_t *d, size_t n) {
    uint16_t *b = (uint16_t *)malloc((n ? n : 1) * 2);
    for (size_t i = 0; i < n; i++) b[i] = 0x7fc1;
    GC.gpu->from_host(d, b, n * 2);
    free(b);
}

static inline void gc_poison_f32(float *d, size_t n) {
    float *b = gc_host(n);
    for (size_t i = 0; i < n; i++) b[i] = NAN;
    GC.gpu->from_host(d, b, n * sizeof(float));
    free(b);
}

static inline float *gc_get_act(const act_t *d, size_t n) {
    float *h = gc_host(n);
    GC.gpu->act_to_host(h, d, n);
    return h;
}

static inline float *gc_get_f32(const float *d, size_t n) {
    float *h = gc_host(n);
    GC.gpu->to_host(h, d, n * sizeof(float));
    return h;
}

/* ---- comparison ---- */

/* One TAP line for output `what` of the current case. */
static inline bool gc_compare(const char *what, const float *got, const float *ref, size_t n, double rtol) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)ref[i] * ref[i];
    double rms = n ? sqrt(ss / n) : 0, worst = 0, err2 = 0;
    size_t wi = 0, bad = 0;
    bool nan = false;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i])) { if (!nan) wi = i; nan = true; bad++; continue; }
        double e = fabs((double)got[i] - ref[i]);
        err2 += e * e;
        double r = e / (fabs(ref[i]) + rms + 1e-30);
        if (r > worst) { worst = r; if (!nan) wi = i; }
        if (r > rtol) bad++;
    }
    bool ok = bad == 0 && n > 0 && rms > 0;
    GC.cases++;
    printf("%s - %s/%s %s\n", ok ? "ok" : "not ok", GC.family, GC.name, what);
    printf("#   n=%zu rms(ref)=%.4g max rel err=%.3g (tol %.0e) rel L2=%.3g%s\n", n, rms, worst, rtol,
           ss > 0 ? sqrt(err2 / ss) : 0.0, nan ? " NaN/Inf present" : "");
    if (!ok) {
        if (rms == 0) printf("#   the reference is all zeros: the check would prove nothing\n");
        printf("#   %zu elements out of tolerance; first worst at %zu: gpu %.6g cpu %.6g\n", bad, wi, got[wi], ref[wi]);
        GC.failed++;
    }
    return ok;
}

/* For outputs whose GPU path rounds intermediates to bf16 (attention's
 * gradients: P and dS are bf16 operands of fp32 products): the error is a
 * sum of many independent roundings, so it is judged as a whole, relative
 * L2 = ||gpu - cpu|| / ||cpu|| <= l2tol, with a bound on the worst element,
 * max |gpu - cpu| <= maxtol * max |cpu|, that a systematic error in a few
 * rows or columns cannot hide under. */
static inline bool gc_compare_l2(const char *what, const float *got, const float *ref, size_t n, double l2tol,
                                 double maxtol) {
    double ss = 0, err2 = 0, mref = 0, worst = 0;
    size_t wi = 0;
    bool nan = false;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i])) { if (!nan) wi = i; nan = true; continue; }
        double e = fabs((double)got[i] - ref[i]);
        ss += (double)ref[i] * ref[i];
        err2 += e * e;
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
        if (e > worst) { worst = e; if (!nan) wi = i; }
    }
    double l2 = ss > 0 ? sqrt(err2 / ss) : 0, wrel = mref > 0 ? worst / mref : 0;
    bool ok = !nan && n > 0 && ss > 0 && l2 <= l2tol && wrel <= maxtol;
    GC.cases++;
    printf("%s - %s/%s %s\n", ok ? "ok" : "not ok", GC.family, GC.name, what);
    printf("#   n=%zu rel L2=%.3g (tol %.0e) max err/max|ref|=%.3g (tol %.0e)%s\n", n, l2, l2tol, wrel, maxtol,
           nan ? " NaN/Inf present" : "");
    if (!ok) {
        if (ss == 0) printf("#   the reference is all zeros: the check would prove nothing\n");
        printf("#   worst at %zu: gpu %.6g cpu %.6g\n", wi, got[wi], ref[wi]);
        GC.failed++;
    }
    return ok;
}

/* For outputs that are exactly zero in exact arithmetic (e.g. dq and dk of
 * a one-token sequence): every |gpu| must stay below atol. */
static inline bool gc_compare_zero(const char *what, const float *got, size_t n, double atol) {
    double worst = 0;
    bool nan = false;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) nan = true;
        else if (fabs(got[i]) > worst) worst = fabs(got[i]);
    }
    bool ok = !nan && worst <= atol;
    GC.cases++;
    printf("%s - %s/%s %s (exactly zero in exact arithmetic)\n", ok ? "ok" : "not ok", GC.family, GC.name, what);
    printf("#   n=%zu max |gpu|=%.3g (atol %.0e)%s\n", n, worst, atol, nan ? " NaN/Inf present" : "");
    if (!ok) GC.failed++;
    return ok;
}

#endif
