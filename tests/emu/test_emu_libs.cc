/* test_emu_libs.cc: the emulation tier's libraries on their own: bf16 and
 * FP8 conversions (cuda_bf16.h, cuda_fp8.h), the device math of
 * emu_math.h, the reference cuBLASLt (cublaslt.cc) and, when its path is
 * given, the NCCL (nccl.cc, loaded with dlopen as workers/comm/nccl.c
 * loads it): one rank, and two ranks as two threads. The emulator's core
 * is replaced by the stubs below: emu_enqueue runs a job at once (or
 * queues it, for the timing checks), emu_enqueue_when once its condition
 * holds, emu_is_device looks pointers up in a table the test fills,
 * emu_fatal returns to the test when a fault is expected, cudaGetDevice
 * gives the calling thread's device.
 *
 * Build and run (from the repository root):
 *   g++ -std=c++17 -O1 -g -Wall -Wextra -Werror -Itests/emu/include -I. -rdynamic \
 *       tests/emu/test_emu_libs.cc tests/emu/cublaslt.cc -ldl -o /tmp/t && \
 *   g++ -std=c++17 -O1 -g -Wall -Wextra -Werror -shared -fPIC -Itests/emu/include \
 *       tests/emu/nccl.cc -o /tmp/libnccl_emu.so && /tmp/t /tmp/libnccl_emu.so
 * Without the argument the NCCL checks are reported as skipped. Output is
 * TAP (ok N - name / not ok N - name: why); the exit status is 1 when a
 * check failed. Expected error lines of the libraries are captured and
 * checked, not shown. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <emu_math.h>

#include <dlfcn.h>
#include <fenv.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <thread>
#include <type_traits>
#include <unistd.h>

/* ---- TAP ---- */

static int g_tests, g_failed;

static void tap(bool ok, const char *name, const char *why_fmt = NULL, ...) __attribute__((format(printf, 3, 4)));
static void tap(bool ok, const char *name, const char *why_fmt, ...) {
    g_tests++;
    if (ok) {
        printf("ok %d - %s\n", g_tests, name);
        return;
    }
    g_failed++;
    printf("not ok %d - %s", g_tests, name);
    if (why_fmt) {
        va_list ap;
        va_start(ap, why_fmt);
        printf(": ");
        vprintf(why_fmt, ap);
        va_end(ap);
    }
    printf("\n");
}

static void skip(const char *name, const char *why) { printf("ok %d - %s # SKIP %s\n", ++g_tests, name, why); }

/* ---- the core's four functions, stubbed ---- */

#define MAX_DEV 64
static struct { const char *p; size_t n; } g_dev[MAX_DEV];
static int g_ndev;

/* "cudaMalloc": 256-aligned host memory registered as device memory. */
static void *dev_alloc(size_t n) {
    size_t r = (n + 255) / 256 * 256;
    void *p = aligned_alloc(256, r ? r : 256);
    if (!p || g_ndev == MAX_DEV) {
        fprintf(stderr, "test: out of memory or device slots\n");
        exit(2);
    }
    g_dev[g_ndev].p = (const char *)p;
    g_dev[g_ndev].n = n;
    g_ndev++;
    return p;
}

static void dev_free(void *p) {
    for (int i = 0; i < g_ndev; i++)
        if (g_dev[i].p == p) {
            g_dev[i] = g_dev[--g_ndev];
            free(p);
            return;
        }
}

extern "C" int emu_is_device(const void *p, size_t bytes) {
    const char *c = (const char *)p;
    for (int i = 0; i < g_ndev; i++)
        if (c >= g_dev[i].p && c <= g_dev[i].p + g_dev[i].n && bytes <= (size_t)(g_dev[i].p + g_dev[i].n - c)) return 1;
    return 0;
}

extern "C" int emu_is_pinned(const void *p, size_t bytes) {
    (void)p, (void)bytes;
    return 0;
}

typedef struct { cudaStream_t s; void (*fn)(void *); void *arg; void (*free_arg)(void *); } job_t;
static job_t g_queue[16];
static int g_nqueue;
static bool g_defer;             /* queue jobs instead of running them */
static cudaStream_t g_last_stream;
static char g_last_what[64];

extern "C" void emu_enqueue(cudaStream_t s, const char *what, void (*fn)(void *), void *arg, void (*free_arg)(void *)) {
    g_last_stream = s;
    snprintf(g_last_what, sizeof g_last_what, "%s", what);
    if (g_defer && g_nqueue < 16) {
        g_queue[g_nqueue++] = job_t{ s, fn, arg, free_arg };
        return;
    }
    fn(arg);
    if (free_arg) free_arg(arg);
}

extern "C" void emu_enqueue_when(cudaStream_t s, const char *what, int (*can_start)(void *), void (*fn)(void *),
                                 void *arg, void (*free_arg)(void *)) {
    (void)s, (void)what;
    while (!can_start(arg)) usleep(200);
    fn(arg);
    if (free_arg) free_arg(arg);
}

static thread_local int g_thread_device;
extern "C" int cudaGetDevice(int *d) {
    *d = g_thread_device;
    return 0;
}

static void run_queue(void) {
    for (int i = 0; i < g_nqueue; i++) {
        g_queue[i].fn(g_queue[i].arg);
        if (g_queue[i].free_arg) g_queue[i].free_arg(g_queue[i].arg);
    }
    g_nqueue = 0;
}

static jmp_buf g_fatal_jmp;
static bool g_expect_fatal;
static char g_fatal_msg[512];

extern "C" void emu_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_fatal_msg, sizeof g_fatal_msg, fmt, ap);
    va_end(ap);
    if (g_expect_fatal) {
        g_expect_fatal = false;
        longjmp(g_fatal_jmp, 1);
    }
    fprintf(stderr, "gpu-emu: %s\n", g_fatal_msg);
    abort();
}

/* Run f expecting emu_fatal; true when it was called (message in g_fatal_msg). */
template <class F> static bool expect_fatal(F f) {
    g_fatal_msg[0] = 0;
    g_expect_fatal = true;
    if (setjmp(g_fatal_jmp)) return true;
    f();
    g_expect_fatal = false;
    return false;
}
#define EXPECT_FATAL(call) expect_fatal([&] { (void)(call); })

/* ---- stderr capture (the libraries' expected error lines) ---- */

static int g_saved_fd = -1;
static FILE *g_cap;

static void capture_begin(void) {
    fflush(stderr);
    g_cap = tmpfile();
    g_saved_fd = dup(2);
    dup2(fileno(g_cap), 2);
}

static const char *capture_end(void) {
    static char buf[4096];
    fflush(stderr);
    dup2(g_saved_fd, 2);
    close(g_saved_fd);
    rewind(g_cap);
    size_t n = fread(buf, 1, sizeof buf - 1, g_cap);
    buf[n] = 0;
    fclose(g_cap);
    return buf;
}

/* ---- random numbers (xorshift64*, fixed seed: reproducible) ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void) {
    g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
    return g_rng * 0x2545f4914f6cdd1dull;
}
static uint32_t rnd32(void) { return (uint32_t)(rnd64() >> 32); }
static double rnd_uniform(double lo, double hi) { return lo + (hi - lo) * (double)(rnd64() >> 11) * 0x1p-53; }

static float f_of(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }
static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }

/* ---- independent references: values, not bits ----
 * A format with p significant bits and smallest normal exponent emin: a
 * non-negative finite a rounds to a multiple of the quantum of its binade
 * (found with frexp), half to even (nearbyint in the default mode). The
 * exponent range above is unbounded: callers compare with the largest
 * finite value to find overflows. */
static double round_fmt(double a, int p, int emin) {
    if (a == 0) return 0;
    int e;
    frexp(a, &e); /* a = f 2^e, f in [0.5, 1): the leading bit has exponent e - 1 */
    int E = e - 1 < emin ? emin : e - 1;
    double q = ldexp(1.0, E - (p - 1));
    return nearbyint(a / q) * q;
}

/* bf16 bits -> value, from the format's definition. */
static double dec_bf16(uint16_t b) {
    int s = b >> 15, e = (b >> 7) & 0xff, m = b & 0x7f;
    if (e == 0xff) return m ? NAN : s ? -INFINITY : INFINITY;
    double v = e ? ldexp(128 + m, e - 127 - 7) : ldexp(m, -126 - 7);
    return s ? -v : v;
}

/* fp8 bits -> value, from the format's definition. */
static double dec_fp8(uint8_t b, bool e4m3) {
    int M = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, s = b >> 7;
    int e = (b & 0x7f) >> M, m = b & ((1 << M) - 1);
    if (e4m3 && (b & 0x7f) == 0x7f) return NAN;
    if (!e4m3 && e == 31) return m ? NAN : s ? -INFINITY : INFINITY;
    double v = e ? ldexp((1 << M) + m, e - bias - M) : ldexp(m, 1 - bias - M);
    return s ? -v : v;
}

/* Does bf16 result r match fp32 -> bf16 of x by the reference? */
static bool bf16_ref_ok(float x, uint16_t r) {
    if (isnan(x)) return r == 0x7fff;
    double a = fabs((double)x);
    double v = isinf(x) ? INFINITY : round_fmt(a, 8, -126);
    if (v >= 0x1p128) v = INFINITY;
    double got = dec_bf16(r);
    return !isnan(got) && fabs(got) == v && (signbit(got) != 0) == (signbit(x) != 0);
}

/* Does fp8 result r match fp32 -> fp8 of x by the reference? */
static bool fp8_ref_ok(float x, bool sat, bool e4m3, uint8_t r) {
    if (isnan(x)) return r == 0x7f;
    int M = e4m3 ? 3 : 2, emin = e4m3 ? -6 : -14;
    double fmax = e4m3 ? 448.0 : 57344.0;
    double a = fabs((double)x);
    double v = isinf(x) ? INFINITY : round_fmt(a, M + 1, emin);
    bool neg = signbit(x) != 0;
    if (v > fmax) {
        if (sat) v = fmax;
        else if (e4m3) return r == (neg ? 0xff : 0x7f); /* no infinity: NaN, sign kept */
        else v = INFINITY;
    }
    double got = dec_fp8(r, e4m3);
    return !isnan(got) && fabs(got) == v && (signbit(got) != 0) == neg;
}

/* ---- bf16 ---- */

static void test_bf16(void) {
    static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__nv_bfloat162) == 4, "sizes");
    static_assert(std::is_trivially_copyable<__nv_bfloat16>::value &&
                  std::is_trivially_copyable<__nv_bfloat162>::value, "trivially copyable");
    /* hand-picked: the rounding rule of the real header, spelled out (keep
     * the upper half, add one when the dropped half exceeds 0x8000 or is
     * 0x8000 with an odd kept half; any NaN -> 0x7fff) */
    static const struct { uint32_t in; uint16_t out; const char *what; } cases[] = {
        { 0x00000000u, 0x0000, "+0" },
        { 0x80000000u, 0x8000, "-0" },
        { 0x3f800000u, 0x3f80, "1" },
        { 0x3f808000u, 0x3f80, "1 + half ulp: tie to even (down)" },
        { 0x3f818000u, 0x3f82, "tie to even (up)" },
        { 0x3f808001u, 0x3f81, "just above the tie" },
        { 0x3f807fffu, 0x3f80, "just below the tie" },
        { 0xbf818000u, 0xbf82, "negative tie to even" },
        { 0x7f7f7fffu, 0x7f7f, "largest bf16 plus less than half an ulp" },
        { 0x7f7f8000u, 0x7f80, "largest bf16 plus half an ulp: tie to even is infinity" },
        { 0x7f7fffffu, 0x7f80, "FLT_MAX overflows to infinity" },
        { 0xff7fffffu, 0xff80, "-FLT_MAX overflows to -infinity" },
        { 0x7f800000u, 0x7f80, "+inf" },
        { 0xff800000u, 0xff80, "-inf" },
        { 0x7fc00000u, 0x7fff, "quiet NaN" },
        { 0xffc00001u, 0x7fff, "negative NaN: canonical, sign dropped" },
        { 0x7f800001u, 0x7fff, "NaN whose payload sits in the dropped half stays NaN" },
        { 0x7fbfffffu, 0x7fff, "signalling NaN" },
        { 0x00000001u, 0x0000, "smallest fp32 subnormal -> +0" },
        { 0x80000001u, 0x8000, "-smallest fp32 subnormal -> -0" },
        { 0x00008000u, 0x0000, "subnormal tie to even (0)" },
        { 0x00008001u, 0x0001, "subnormal above the tie" },
        { 0x00018000u, 0x0002, "subnormal tie to even (up)" },
        { 0x807fffffu, 0x8080, "largest negative subnormal rounds to -smallest normal" },
        { 0x00800000u, 0x0080, "smallest normal" },
    };
    int bad = 0;
    char why[256] = "";
    for (const auto &c : cases) {
        uint16_t r = __bfloat16_as_ushort(__float2bfloat16(f_of(c.in)));
        uint16_t rn = __bfloat16_as_ushort(__float2bfloat16_rn(f_of(c.in)));
        __nv_bfloat16 implicit = f_of(c.in);
        if (r != c.out || rn != c.out || implicit.__x != c.out || !bf16_ref_ok(f_of(c.in), r)) {
            if (!bad++) snprintf(why, sizeof why, "%s: 0x%08x -> 0x%04x, want 0x%04x", c.what, c.in, r, c.out);
        }
    }
    tap(!bad, "bf16: fp32 -> bf16 on the edge cases (RNE, overflow, NaN, subnormals)", "%d wrong; first %s", bad, why);

    bad = 0;
    for (uint32_t b = 0; b < 0x10000u; b++) {
        float f = __bfloat162float(__ushort_as_bfloat16((unsigned short)b));
        double want = dec_bf16((uint16_t)b);
        bool same = isnan(want) ? (isnan(f) && (bits_of(f) >> 16) == b) : ((double)f == want && signbit(f) == signbit(want));
        if (!same || (!isnan(want) && __bfloat16_as_ushort(__float2bfloat16(f)) != b)) bad++;
    }
    tap(!bad, "bf16: all 65536 bf16 -> fp32 exact (payloads kept) and back unchanged", "%d wrong", bad);

    static const struct { uint32_t in; uint16_t out; } rz[] = {
        { 0x3f81ffffu, 0x3f81 }, { 0xbf81ffffu, 0xbf81 }, { 0x7f7fffffu, 0x7f7f }, { 0x7f800001u, 0x7fff },
        { 0x00008001u, 0x0000 },
    };
    bad = 0;
    for (const auto &c : rz) bad += __bfloat16_as_ushort(__float2bfloat16_rz(f_of(c.in))) != c.out;
    tap(!bad, "bf16: __float2bfloat16_rz truncates, NaN -> 0x7fff", "%d wrong", bad);

    __nv_bfloat162 two = __floats2bfloat162_rn(f_of(0x3f818000u), -2.0f);
    unsigned char raw[4];
    memcpy(raw, &two, 4);
    bool ok2 = two.x.__x == 0x3f82 && two.y.__x == 0xc000 && raw[0] == 0x82 && raw[1] == 0x3f && raw[2] == 0x00 &&
               raw[3] == 0xc0 && __low2float(two) == (float)dec_bf16(0x3f82) && __high2float(two) == -2.0f;
    tap(ok2, "bf16: __floats2bfloat162_rn rounds each, .x at the lower address");

    /* random: every bit pattern class, and values placed on and next to ties */
    bad = 0;
    uint32_t first = 0;
    const int NR = 100000;
    for (int i = 0; i < NR; i++) {
        uint32_t u = rnd32();
        if (i % 2) { /* a tie or its neighbours: kept half random, dropped half 0x8000 +- 0/1 */
            uint32_t d = 0x8000u + (uint32_t)(rnd32() % 3) - 1u;
            u = (u & 0xffff0000u) | d;
        }
        float x = f_of(u);
        uint16_t r = __bfloat16_as_ushort(__float2bfloat16(x));
        if (!bf16_ref_ok(x, r) && !bad++) first = u;
    }
    tap(!bad, "bf16: 100000 random fp32 (random bits, ties) against the frexp/nearbyint reference",
        "%d wrong; first 0x%08x", bad, first);
}

/* ---- FP8 ---- */

static void test_fp8(void) {
    const float inf = INFINITY, nan = NAN;
    /* hand-picked: what NVIDIA documents for __nv_cvt_float_to_fp8 (RNE,
     * |x| <= half the smallest subnormal -> signed zero, overflow past
     * max + half ulp, SATFINITE to max, NOSAT to NaN / inf, NaN -> 0x7f) */
    static const struct { float in; bool e4m3; uint8_t sat, nosat; const char *what; } cases[] = {
        { 0.0f, true, 0x00, 0x00, "e4m3 +0" },
        { -0.0f, true, 0x80, 0x80, "e4m3 -0" },
        { 1.0f, true, 0x38, 0x38, "e4m3 1" },
        { 1.0625f, true, 0x38, 0x38, "e4m3 1 + half ulp: tie to even (down)" },
        { 1.1875f, true, 0x3a, 0x3a, "e4m3 tie to even (up)" },
        { 448.0f, true, 0x7e, 0x7e, "e4m3 largest finite" },
        { 449.0f, true, 0x7e, 0x7e, "e4m3 449 rounds to 448" },
        { 464.0f, true, 0x7e, 0x7e, "e4m3 448 + half ulp: tie to even, not NaN" },
        { 464.00003f, true, 0x7e, 0x7f, "e4m3 just past 464 overflows" },
        { -500.0f, true, 0xfe, 0xff, "e4m3 -500: -max / NaN (sign kept)" },
        { inf, true, 0x7e, 0x7f, "e4m3 +inf" },
        { -inf, true, 0xfe, 0xff, "e4m3 -inf" },
        { nan, true, 0x7f, 0x7f, "e4m3 NaN" },
        { -nan, true, 0x7f, 0x7f, "e4m3 -NaN: canonical 0x7f" },
        { 0x1p-9f, true, 0x01, 0x01, "e4m3 smallest subnormal" },
        { 0x1p-10f, true, 0x00, 0x00, "e4m3 half the smallest subnormal: tie to 0" },
        { -0x1p-10f, true, 0x80, 0x80, "e4m3 -half the smallest subnormal: -0" },
        { 0x1.000002p-10f, true, 0x01, 0x01, "e4m3 just above half the smallest subnormal" },
        { 0x3p-10f, true, 0x02, 0x02, "e4m3 subnormal tie to even (up)" },
        { 0x7p-9f, true, 0x07, 0x07, "e4m3 largest subnormal" },
        { 0xfp-10f, true, 0x08, 0x08, "e4m3 largest subnormal + half step: tie to the smallest normal" },
        { 0x1p-6f, true, 0x08, 0x08, "e4m3 smallest normal" },
        { 1e-45f, true, 0x00, 0x00, "e4m3 fp32 subnormal -> 0" },
        { -1e-45f, true, 0x80, 0x80, "e4m3 -fp32 subnormal -> -0" },
        { 0.0f, false, 0x00, 0x00, "e5m2 +0" },
        { 1.0f, false, 0x3c, 0x3c, "e5m2 1" },
        { 1.125f, false, 0x3c, 0x3c, "e5m2 tie to even (down)" },
        { 1.375f, false, 0x3e, 0x3e, "e5m2 tie to even (up)" },
        { 57344.0f, false, 0x7b, 0x7b, "e5m2 largest finite" },
        { 61439.996f, false, 0x7b, 0x7b, "e5m2 just below max + half ulp" },
        { 61440.0f, false, 0x7b, 0x7c, "e5m2 max + half ulp: tie to even is infinity" },
        { -70000.0f, false, 0xfb, 0xfc, "e5m2 -70000: -max / -inf" },
        { inf, false, 0x7b, 0x7c, "e5m2 +inf: SATFINITE gives max" },
        { -inf, false, 0xfb, 0xfc, "e5m2 -inf" },
        { nan, false, 0x7f, 0x7f, "e5m2 NaN" },
        { 0x1p-16f, false, 0x01, 0x01, "e5m2 smallest subnormal" },
        { 0x1p-17f, false, 0x00, 0x00, "e5m2 half the smallest subnormal: tie to 0" },
        { 0x3p-17f, false, 0x02, 0x02, "e5m2 subnormal tie to even (up)" },
        { 0x1p-14f, false, 0x04, 0x04, "e5m2 smallest normal" },
    };
    int bad = 0;
    char why[256] = "";
    for (const auto &c : cases) {
        __nv_fp8_interpretation_t k = c.e4m3 ? __NV_E4M3 : __NV_E5M2;
        uint8_t s = __nv_cvt_float_to_fp8(c.in, __NV_SATFINITE, k), n = __nv_cvt_float_to_fp8(c.in, __NV_NOSAT, k);
        uint8_t ds = __nv_cvt_double_to_fp8((double)c.in, __NV_SATFINITE, k);
        if (s != c.sat || n != c.nosat || (ds != c.sat && !isnan(c.in)) || !fp8_ref_ok(c.in, true, c.e4m3, s) ||
            !fp8_ref_ok(c.in, false, c.e4m3, n)) {
            if (!bad++)
                snprintf(why, sizeof why, "%s: %a -> sat 0x%02x nosat 0x%02x, want 0x%02x 0x%02x", c.what, (double)c.in,
                         s, n, c.sat, c.nosat);
        }
    }
    tap(!bad, "fp8: fp32 -> e4m3/e5m2 on the edge cases, both saturation modes", "%d wrong; first %s", bad, why);

    /* doubles that are not floats round once, not through float; NaN keeps
     * its sign (E5M2: and its two leading payload bits), as the header's */
    double nan_neg = -NAN;
    bool dok = __nv_cvt_double_to_fp8(464.0 + 1e-9, __NV_SATFINITE, __NV_E4M3) == 0x7e &&
               __nv_cvt_double_to_fp8(464.0 + 1e-9, __NV_NOSAT, __NV_E4M3) == 0x7f &&
               __nv_cvt_double_to_fp8(-0x1.0000000001p-10, __NV_NOSAT, __NV_E4M3) == 0x81 &&
               __nv_cvt_double_to_fp8(61440.0 - 1e-9, __NV_NOSAT, __NV_E5M2) == 0x7b &&
               __nv_cvt_double_to_fp8(1e300, __NV_NOSAT, __NV_E5M2) == 0x7c &&
               __nv_cvt_double_to_fp8(nan_neg, __NV_SATFINITE, __NV_E4M3) == 0xff &&
               __nv_cvt_double_to_fp8(nan_neg, __NV_SATFINITE, __NV_E5M2) == 0xfe;
    tap(dok, "fp8: __nv_cvt_double_to_fp8 rounds doubles once; NaN keeps its sign");

    /* every code decodes exactly and converts back to itself */
    bad = 0;
    for (int e4 = 0; e4 < 2; e4++)
        for (int b = 0; b < 256; b++) {
            __nv_fp8_interpretation_t k = e4 ? __NV_E4M3 : __NV_E5M2;
            float f = emu_fp8_to_float((uint8_t)b, k);
            double want = dec_fp8((uint8_t)b, e4);
            if (isnan(want)) { bad += !isnan(f); continue; }
            bad += (double)f != want || signbit(f) != signbit(want);
            uint8_t back = __nv_cvt_float_to_fp8(f, __NV_NOSAT, k);
            bad += back != b;
            if (!isinf(want)) bad += __nv_cvt_float_to_fp8(f, __NV_SATFINITE, k) != b;
        }
    tap(!bad, "fp8: all 2 x 256 codes decode exactly and round-trip", "%d wrong", bad);

    /* random: magnitudes around each format's range, ties between codes */
    bad = 0;
    char first[160] = "";
    const int NR = 100000;
    for (int i = 0; i < NR; i++) {
        bool e4m3 = i & 1, sat = (i >> 1) & 1;
        float x;
        if (i % 4 == 3) { /* on a tie: midpoint of two neighbouring codes (as double, rounded to float: exact) */
            uint8_t c = (uint8_t)(rnd32() % (e4m3 ? 0x7e : 0x7b));
            double lo = dec_fp8(c, e4m3), hi = dec_fp8((uint8_t)(c + 1), e4m3);
            x = (float)((lo + hi) / 2);
            if (rnd32() & 1) x = nextafterf(x, (rnd32() & 1) ? INFINITY : 0.0f);
            if (rnd32() & 1) x = -x;
        } else if (i % 97 == 0) {
            x = f_of(rnd32()); /* any pattern: NaN, inf, fp32 subnormals */
        } else {
            int e = (int)(rnd32() % 44) - 26; /* 2^-26 .. 2^17 */
            x = (float)ldexp(rnd_uniform(1.0, 2.0), e);
            if (rnd32() & 1) x = -x;
        }
        uint8_t r = __nv_cvt_float_to_fp8(x, sat ? __NV_SATFINITE : __NV_NOSAT, e4m3 ? __NV_E4M3 : __NV_E5M2);
        if (!fp8_ref_ok(x, sat, e4m3, r) && !bad++)
            snprintf(first, sizeof first, "%a (%s, %s) -> 0x%02x", (double)x, e4m3 ? "e4m3" : "e5m2",
                     sat ? "satfinite" : "nosat", r);
    }
    tap(!bad, "fp8: 100000 random fp32 against the frexp/nearbyint reference", "%d wrong; first %s", bad, first);
}

/* ---- emu_math.h ---- */

static void test_math(void) {
    bool ok = __float_as_int(1.0f) == 0x3f800000 && __int_as_float(0x40000000) == 2.0f &&
              __float_as_uint(-0.0f) == 0x80000000u && __uint_as_float(0x7f800000u) == INFINITY;
    tap(ok, "math: bit casts");
    volatile float a = 1.0f + 0x1p-23f, b = 1.0f - 0x1p-24f;
    ok = __fmul_rn(a, b) == a * b && __fadd_rn(a, b) == a + b && __fsub_rn(a, b) == a - b &&
         __fdiv_rn(a, b) == a / b && __fsqrt_rn(2.0f) == sqrtf(2.0f) && __frcp_rn(3.0f) == 1.0f / 3.0f;
    tap(ok, "math: the _rn operations are the IEEE ones");
    ok = cospif(0.5f) == 0.0f && cospif(1.0f) == -1.0f && cospif(2.0f) == 1.0f && cospif(-3.0f) == -1.0f &&
         sinpif(1.0f) == 0.0f && sinpif(0.5f) == 1.0f && sinpif(-0.5f) == -1.0f && isnan(cospif(INFINITY)) &&
         fabsf(cospif(0.25f) - 0.70710677f) < 1e-7f;
    tap(ok, "math: cospif / sinpif exact at integers and half-integers");
    ok = __saturatef(NAN) == 0.0f && __saturatef(-1.0f) == 0.0f && __saturatef(2.0f) == 1.0f &&
         __saturatef(0.25f) == 0.25f && fabsf(rsqrtf(4.0f) - 0.5f) == 0.0f && __expf(0.0f) == 1.0f &&
         __logf(1.0f) == 0.0f && __fdividef(1.0f, 4.0f) == 0.25f;
    tap(ok, "math: __saturatef (NaN -> 0), rsqrtf, __expf, __logf, __fdividef");
    ok = min(3, 5) == 3 && max(-3, 5) == 5 && min(-1, 1u) == 1u && max(2u, -1) == 0xffffffffu &&
         min((size_t)7, (size_t)9) == 7 && min(1.0f, NAN) == 1.0f && max(NAN, 2.0f) == 2.0f &&
         min(1.5, 0.5) == 0.5 && max(1ll, 2ll) == 2ll;
    tap(ok, "math: min / max overloads (mixed signedness compares unsigned, NaN loses)");
}

/* ---- cuBLASLt ---- */

static size_t tsize(cudaDataType t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 1; }

/* Element i of X of type t, decoded independently of the library. */
static double val(const void *X, cudaDataType t, size_t i) {
    switch (t) {
    case CUDA_R_16BF: { uint16_t b; memcpy(&b, (const char *)X + 2 * i, 2); return dec_bf16(b); }
    case CUDA_R_32F: { float f; memcpy(&f, (const char *)X + 4 * i, 4); return f; }
    case CUDA_R_8F_E4M3: return dec_fp8(((const uint8_t *)X)[i], true);
    default: return dec_fp8(((const uint8_t *)X)[i], false);
    }
}

/* A random non-zero element of type t, stored at X[i]; bf16 in [-1, 1],
 * fp8 any finite code but zero (products stay far inside fp32). */
static void put_random(void *X, cudaDataType t, size_t i) {
    if (t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2) {
        uint8_t c;
        do c = (uint8_t)rnd32();
        while ((c & 0x7f) == 0 || (t == CUDA_R_8F_E4M3 ? (c & 0x7f) == 0x7f : (c & 0x7f) >= 0x7c));
        ((uint8_t *)X)[i] = c;
        return;
    }
    float f;
    do f = (float)rnd_uniform(-1.0, 1.0);
    while (f == 0.0f);
    if (t == CUDA_R_32F) memcpy((char *)X + 4 * i, &f, 4);
    else { __nv_bfloat16 h = __float2bfloat16(f); memcpy((char *)X + 2 * i, &h, 2); }
}

typedef struct {
    const char *name;
    cublasOperation_t ta, tb;
    cudaDataType at, bt, dt;
    int m, n, k;
    float alpha, beta;
    int pad;          /* extra rows in every leading dimension */
    bool separate_c;  /* C in its own buffer (the backend passes D) */
} gemm_case_t;

static cublasLtHandle_t g_lt;
static void *g_ws;
#define WS_BYTES (1u << 20)

/* Column-major D = (alpha sa sb) op(A) op(B) + beta C through the library,
 * laid out as cublaslt.cu does (ld = rows + pad); checked against a double
 * triple loop within the fp32-summation bound, bit for bit against an fp32
 * k-order loop (the documented contract), and for untouched padding. */
static void run_gemm_case(const gemm_case_t *g) {
    const int m = g->m, n = g->n, k = g->k;
    const bool fp8 = g->at != CUDA_R_16BF;
    int ar = g->ta == CUBLAS_OP_N ? m : k, ac = g->ta == CUBLAS_OP_N ? k : m;
    int br = g->tb == CUBLAS_OP_N ? k : n, bc = g->tb == CUBLAS_OP_N ? n : k;
    int lda = ar + g->pad, ldb = br + g->pad, ldd = m + g->pad;
    size_t nA = (size_t)lda * ac, nB = (size_t)ldb * bc, nD = (size_t)ldd * n;
    void *A = dev_alloc(nA * tsize(g->at)), *B = dev_alloc(nB * tsize(g->bt)), *D = dev_alloc(nD * tsize(g->dt));
    void *C = g->separate_c ? dev_alloc(nD * tsize(g->dt)) : D;
    float *scales = (float *)dev_alloc(2 * sizeof(float));
    scales[0] = 0.37f, scales[1] = 3.1f; /* not powers of two: their product rounds */
    for (size_t i = 0; i < nA; i++) put_random(A, g->at, i);
    for (size_t i = 0; i < nB; i++) put_random(B, g->bt, i);
    for (size_t i = 0; i < nD; i++) put_random(C, g->dt, i);
    if (g->separate_c) for (size_t i = 0; i < nD; i++) put_random(D, g->dt, i);
    if (g->beta == 0.0f) /* D must not be read: fill it with NaN */
        for (size_t i = 0; i < nD; i++) {
            if (g->dt == CUDA_R_32F) ((float *)D)[i] = NAN;
            else ((uint16_t *)D)[i] = 0x7fc0;
        }
    unsigned char *before = (unsigned char *)malloc(nD * tsize(g->dt));
    memcpy(before, D, nD * tsize(g->dt));
    unsigned char *c_copy = (unsigned char *)malloc(nD * tsize(g->dt));
    memcpy(c_copy, C, nD * tsize(g->dt));

    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    bool ok = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta, sizeof g->ta) == 0 &&
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb, sizeof g->tb) == 0 &&
              cublasLtMatrixLayoutCreate(&la, g->at, ar, ac, lda) == 0 &&
              cublasLtMatrixLayoutCreate(&lb, g->bt, br, bc, ldb) == 0 &&
              cublasLtMatrixLayoutCreate(&lc, g->dt, m, n, ldd) == 0 && cublasLtMatmulPreferenceCreate(&pref) == 0;
    if (fp8) {
        const float *sa = scales, *sb = scales + 1;
        ok = ok && cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa) == 0 &&
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb) == 0;
    }
    size_t ws = WS_BYTES;
    uint32_t al = 16;
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) == 0;
    for (int i = 0; i < 4; i++)
        ok = ok && cublasLtMatmulPreferenceSetAttribute(
                       pref, (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i), &al,
                       sizeof al) == 0;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t hs = ok ? cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, lc, lc, pref, 1, &res, &found)
                           : CUBLAS_STATUS_INTERNAL_ERROR;
    cublasStatus_t ms = CUBLAS_STATUS_INTERNAL_ERROR;
    cudaStream_t stream = (cudaStream_t)(uintptr_t)0x5000;
    if (hs == CUBLAS_STATUS_SUCCESS && found == 1)
        ms = cublasLtMatmul(g_lt, desc, &g->alpha, A, la, B, lb, &g->beta, C, lc, D, lc, &res.algo, g_ws, WS_BYTES,
                            stream);

    /* references */
    double s = (double)g->alpha * (fp8 ? (double)scales[0] * scales[1] : 1.0);
    float s32 = g->alpha * (fp8 ? scales[0] : 1.0f) * (fp8 ? scales[1] : 1.0f);
    const double u = 0x1p-24, uD = g->dt == CUDA_R_16BF ? 0x1p-8 : 0.0;
    double gamma = (k + 4) * u / (1 - (k + 4) * u);
    int bad_tol = 0, bad_exact = 0, bad_pad = 0;
    double worst = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double dot = 0, mag = 0;
            float acc = 0.0f;
            for (int l = 0; l < k; l++) {
                size_t ia = g->ta == CUBLAS_OP_N ? i + (size_t)l * lda : l + (size_t)i * lda;
                size_t ib = g->tb == CUBLAS_OP_N ? l + (size_t)j * ldb : j + (size_t)l * ldb;
                double x = val(A, g->at, ia), y = val(B, g->bt, ib);
                dot += x * y;
                mag += fabs(x * y);
                acc += (float)x * (float)y;
            }
            size_t o = i + (size_t)j * ldd;
            double cval = g->beta != 0.0f ? val(c_copy, g->dt, o) : 0.0;
            double ref = s * dot + (double)g->beta * cval;
            /* fp32: k-1 additions in the sum, the scale product (2 roundings),
             * its product with the sum, beta C and the final add: gamma_{k+4}
             * of the magnitudes; then the output's own rounding (bf16: 2^-8
             * relative, fp32 covered by the above) */
            double err = gamma * (fabs(s) * mag + fabs((double)g->beta * cval));
            double tol = err + uD * (fabs(ref) + err) + 1e-30;
            double got = val(D, g->dt, o);
            double e = fabs(got - ref);
            if (!(e <= tol)) bad_tol++;
            if (e / tol > worst) worst = e / tol;
            float v = s32 * acc;
            if (g->beta != 0.0f) v += g->beta * (float)cval;
            double exact = g->dt == CUDA_R_16BF ? dec_bf16(__bfloat16_as_ushort(__float2bfloat16_rn(v))) : (double)v;
            if (got != exact) bad_exact++;
        }
    for (int j = 0; j < n; j++) /* the padding rows of D are not written */
        for (int i = m; i < ldd; i++) {
            size_t o = (i + (size_t)j * ldd) * tsize(g->dt);
            bad_pad += memcmp((char *)D + o, before + o, tsize(g->dt)) != 0;
        }
    char name[200];
    snprintf(name, sizeof name, "cublasLt: %s (m=%d n=%d k=%d, %s%s, alpha=%g beta=%g%s%s)", g->name, m, n, k,
             g->ta == CUBLAS_OP_N ? "N" : "T", g->tb == CUBLAS_OP_N ? "N" : "T", (double)g->alpha, (double)g->beta,
             g->pad ? ", padded ld" : "", g->separate_c ? ", separate C" : "");
    bool pass = hs == CUBLAS_STATUS_SUCCESS && found == 1 && ms == CUBLAS_STATUS_SUCCESS && !bad_tol && !bad_exact &&
                !bad_pad && g_last_stream == stream;
    tap(pass, name, "heuristic %s (%d found), matmul %s, %d beyond tolerance (worst %.3g of it), %d unlike the fp32 "
        "k-order loop, %d padding elements written", cublasLtGetStatusName(hs), found, cublasLtGetStatusName(ms),
        bad_tol, worst, bad_exact, bad_pad);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    free(before);
    free(c_copy);
    if (C != D) dev_free(C);
    dev_free(A), dev_free(B), dev_free(D), dev_free(scales);
}

/* A small problem for the refusal checks: descriptor, layouts as the
 * backend makes them, preference with the given alignment. */
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulPreference_t pref;
} plan_t;

static void plan_make(plan_t *p, cublasOperation_t ta, cublasOperation_t tb, cudaDataType at, cudaDataType bt,
                      cudaDataType dt, int m, int n, int k, uint32_t align) {
    cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    cublasLtMatrixLayoutCreate(&p->a, at, ar, ac, ar);
    cublasLtMatrixLayoutCreate(&p->b, bt, br, bc, br);
    cublasLtMatrixLayoutCreate(&p->c, dt, m, n, m);
    cublasLtMatmulPreferenceCreate(&p->pref);
    for (int i = 0; i < 4; i++)
        cublasLtMatmulPreferenceSetAttribute(
            p->pref, (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i), &align,
            sizeof align);
}

static void plan_free(plan_t *p) {
    cublasLtMatmulPreferenceDestroy(p->pref);
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->desc);
}

static cublasStatus_t plan_heuristic(plan_t *p, cublasLtMatmulHeuristicResult_t *res, int *found) {
    return cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->a, p->b, p->c, p->c, p->pref, 1, res, found);
}

static void test_lt_refusals(void) {
    static const struct {
        const char *what;
        cublasOperation_t ta, tb;
        cudaDataType at, bt, dt;
        int m, n, k;
        uint32_t align;
        const char *msg; /* a word the stderr line must contain */
    } refused[] = {
        { "FP8 NN", CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 32, 32, 32, 256, "TN" },
        { "FP8 NT", CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 32, 32, 32, 256, "TN" },
        { "FP8 TT", CUBLAS_OP_T, CUBLAS_OP_T, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_16BF, 32, 32, 32, 256, "TN" },
        { "FP8 k = 24", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 32, 32, 24, 256, "16" },
        { "FP8 m = 40", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_32F, 40, 32, 32, 256, "16" },
        { "FP8 n = 8", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_16BF, 32, 8, 32, 256, "16" },
        { "FP8 E5M2 x E5M2", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E5M2, CUDA_R_8F_E5M2, CUDA_R_16BF, 32, 32, 32, 256, "E5M2" },
        { "FP8 with 8-byte alignment", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 32, 32, 32, 8,
          "MIN_ALIGNMENT_A" },
        { "FP8 x bf16", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, 32, 32, 32, 256, "CUDA_R_16BF" },
        { "fp32 A and B", CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 8, 8, 8, 256, "CUDA_R_32F" },
        { "bf16 with an E4M3 output", CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_8F_E4M3, 8, 8, 8, 256,
          "CUDA_R_8F_E4M3" },
    };
    for (const auto &r : refused) {
        plan_t p;
        plan_make(&p, r.ta, r.tb, r.at, r.bt, r.dt, r.m, r.n, r.k, r.align);
        cublasLtMatmulHeuristicResult_t res;
        int found = -1;
        capture_begin();
        cublasStatus_t s = plan_heuristic(&p, &res, &found);
        const char *err = capture_end();
        char name[160];
        snprintf(name, sizeof name, "cublasLt: heuristic refuses %s (NOT_SUPPORTED, reason on stderr)", r.what);
        tap(s == CUBLAS_STATUS_NOT_SUPPORTED && found == 0 && strstr(err, r.msg), name, "status %s, found %d, stderr "
            "\"%.200s\"", cublasLtGetStatusName(s), found, err);
        plan_free(&p);
    }

    /* what the backend asks for is accepted */
    static const struct { cublasOperation_t ta, tb; cudaDataType at, bt, dt; int m, n, k; uint32_t align; } taken[] = {
        { CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 17, 33, 5, 2 },
        { CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 1, 1, 1, 2 },
        { CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, 7, 3, 9, 2 },
        { CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 16, 16, 16, 16 },
        { CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_32F, 48, 32, 16, 16 },
        { CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_16BF, 16, 32, 64, 256 },
    };
    int bad = 0;
    for (const auto &t : taken) {
        plan_t p;
        plan_make(&p, t.ta, t.tb, t.at, t.bt, t.dt, t.m, t.n, t.k, t.align);
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        bad += plan_heuristic(&p, &res, &found) != CUBLAS_STATUS_SUCCESS || found != 1 || res.workspaceSize != 0;
        plan_free(&p);
    }
    tap(!bad, "cublasLt: heuristic takes the backend's bf16 and FP8 combinations, odd bf16 sizes included",
        "%d refused", bad);

    /* attributes outside the model are refused by name, wrong sizes are invalid */
    cublasLtMatmulDesc_t d;
    cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t epi = 1;
    capture_begin();
    cublasStatus_t s1 = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    const char *e1 = capture_end();
    tap(s1 == CUBLAS_STATUS_NOT_SUPPORTED && strstr(e1, "CUBLASLT_MATMUL_DESC_EPILOGUE"),
        "cublasLt: DESC_EPILOGUE is refused, named on stderr", "status %s, stderr \"%.200s\"", cublasLtGetStatusName(s1), e1);
    const void *ptr = NULL;
    capture_begin();
    cublasStatus_t s2 = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &ptr, sizeof ptr);
    const char *e2 = capture_end();
    tap(s2 == CUBLAS_STATUS_NOT_SUPPORTED && strstr(e2, "CUBLASLT_MATMUL_DESC_D_SCALE_POINTER"),
        "cublasLt: DESC_D_SCALE_POINTER is refused, named on stderr", "status %s", cublasLtGetStatusName(s2));
    int64_t wide = CUBLAS_OP_T;
    capture_begin();
    cublasStatus_t s3 = cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide);
    capture_end();
    tap(s3 == CUBLAS_STATUS_INVALID_VALUE, "cublasLt: TRANSA with 8 bytes is INVALID_VALUE (it is an int32_t)");
    cublasLtMatmulDescDestroy(d);
    cublasLtMatmulPreference_t pr;
    cublasLtMatmulPreferenceCreate(&pr);
    uint32_t mode = 0;
    capture_begin();
    cublasStatus_t s4 = cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode, sizeof mode);
    const char *e4 = capture_end();
    tap(s4 == CUBLAS_STATUS_NOT_SUPPORTED && strstr(e4, "CUBLASLT_MATMUL_PREF_SEARCH_MODE"),
        "cublasLt: PREF_SEARCH_MODE is refused, named on stderr", "status %s", cublasLtGetStatusName(s4));
    uint64_t al64 = 16;
    capture_begin();
    cublasStatus_t s5 = cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al64, 8);
    capture_end();
    tap(s5 == CUBLAS_STATUS_INVALID_VALUE, "cublasLt: MIN_ALIGNMENT_A_BYTES with 8 bytes is INVALID_VALUE (a uint32_t)");
    cublasLtMatmulPreferenceDestroy(pr);

    /* layouts that disagree with the descriptor */
    plan_t p;
    plan_make(&p, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 8, 4, 6, 256);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, 8, 6, 8); /* (m, k) stored, but TRANSA = T wants (k, m) */
    cublasLtMatmulHeuristicResult_t res;
    int found = -1;
    capture_begin();
    cublasStatus_t s6 = plan_heuristic(&p, &res, &found);
    const char *e6 = capture_end();
    tap(s6 == CUBLAS_STATUS_INVALID_VALUE && strstr(e6, "disagree"), "cublasLt: A's shape against TRANSA is INVALID_VALUE",
        "status %s", cublasLtGetStatusName(s6));
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, 6, 8, 5); /* ld < rows */
    capture_begin();
    cublasStatus_t s7 = plan_heuristic(&p, &res, &found);
    const char *e7 = capture_end();
    tap(s7 == CUBLAS_STATUS_INVALID_VALUE && strstr(e7, "lda"), "cublasLt: lda < rows is INVALID_VALUE", "status %s",
        cublasLtGetStatusName(s7));
    plan_free(&p);
}

/* Faults and timing: what cublasLtMatmul checks before queueing, and what
 * it reads when. */
static void test_lt_matmul_checks(void) {
    const int m = 16, n = 16, k = 16;
    plan_t p;
    plan_make(&p, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, m, n, k, 16);
    char *buf = (char *)dev_alloc(4096);
    uint8_t *A = (uint8_t *)buf, *B = (uint8_t *)buf + 512;
    __nv_bfloat16 *D = (__nv_bfloat16 *)(buf + 1024);
    float *sc = (float *)(buf + 2048); /* sc[0], sc[1] the scales, sc[2] another */
    for (int i = 0; i < k * m; i++) A[i] = __nv_cvt_float_to_fp8(1.0f, __NV_SATFINITE, __NV_E4M3);
    for (int i = 0; i < k * n; i++) B[i] = __nv_cvt_float_to_fp8(0.5f, __NV_SATFINITE, __NV_E4M3);
    sc[0] = 2.0f, sc[1] = 3.0f, sc[2] = 1000.0f;
    const float *sa = sc, *sb = sc + 1, *other = sc + 2;
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t hs = plan_heuristic(&p, &res, &found);
    float alpha = 1.0f, beta = 0.0f;
    cudaStream_t st = (cudaStream_t)(uintptr_t)0x7000;

    /* timing: queued, then the scale values, alpha and the descriptor change */
    g_defer = true;
    cublasStatus_t ms = cublasLtMatmul(g_lt, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.c, D, p.c, &res.algo, NULL, 0, st);
    bool queued = g_nqueue == 1 && !strcmp(g_last_what, "cublasLtMatmul") && g_last_stream == st;
    sc[0] = 0.5f;  /* a kernel on the stream updates the dequantization factor */
    alpha = 100.0f;
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &other, sizeof other);
    run_queue();
    g_defer = false;
    /* each output: sum of k products 1 x 0.5 = 8, times alpha 1, a_scale 0.5 (as at run time), b_scale 3 */
    int bad = 0;
    for (int i = 0; i < m * n; i++) bad += __bfloat162float(D[i]) != 12.0f;
    tap(hs == CUBLAS_STATUS_SUCCESS && ms == CUBLAS_STATUS_SUCCESS && queued && !bad,
        "cublasLt: scale values read when the job runs; alpha and the scale pointers when it is queued",
        "heuristic %s, matmul %s, queued %d, %d outputs not 12 (D[0] = %g)", cublasLtGetStatusName(hs),
        cublasLtGetStatusName(ms), queued, bad, (double)__bfloat162float(D[0]));
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);

    /* faults: a pointer less aligned than promised, memory that is not the device's */
    bool f1 = EXPECT_FATAL(cublasLtMatmul(g_lt, p.desc, &alpha, A + 8, p.a, B, p.b, &beta, D, p.c, D, p.c, &res.algo,
                                          NULL, 0, st));
    tap(f1 && strstr(g_fatal_msg, "A = ") && strstr(g_fatal_msg, "MIN_ALIGNMENT_A_BYTES = 16"),
        "cublasLt: A 8-byte aligned under a 16-byte promise is fatal, naming A", "fatal %d: %s", f1, g_fatal_msg);
    bool f2 = EXPECT_FATAL(cublasLtMatmul(g_lt, p.desc, &alpha, A, p.a, B, p.b, &beta, (void *)(buf + 1032), p.c,
                                          (void *)(buf + 1032), p.c, &res.algo, NULL, 0, st));
    tap(f2 && strstr(g_fatal_msg, "C = ") && strstr(g_fatal_msg, "ALIGNMENT_C"),
        "cublasLt: C/D 8-byte aligned under a 16-byte promise is fatal, naming the operand", "fatal %d: %s", f2,
        g_fatal_msg);
    static uint8_t host_A[512] __attribute__((aligned(256)));
    bool f3 = EXPECT_FATAL(cublasLtMatmul(g_lt, p.desc, &alpha, host_A, p.a, B, p.b, &beta, D, p.c, D, p.c, &res.algo,
                                          NULL, 0, st));
    tap(f3 && strstr(g_fatal_msg, "A = ") && strstr(g_fatal_msg, "device"), "cublasLt: host memory as A is fatal",
        "fatal %d: %s", f3, g_fatal_msg);
    bool f4 = EXPECT_FATAL(cublasLtMatmul(g_lt, p.desc, &alpha, buf + 4096 - 128, p.a, B, p.b, &beta, D, p.c, D, p.c,
                                          &res.algo, NULL, 0, st));
    tap(f4 && strstr(g_fatal_msg, "A = "), "cublasLt: A running past its allocation is fatal", "fatal %d: %s", f4,
        g_fatal_msg);
    static float host_scale = 1.0f;
    const float *hs_ptr = &host_scale;
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &hs_ptr, sizeof hs_ptr);
    bool f5 = EXPECT_FATAL(cublasLtMatmul(g_lt, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.c, D, p.c, &res.algo, NULL, 0,
                                          st));
    tap(f5 && strstr(g_fatal_msg, "A_SCALE_POINTER"), "cublasLt: a host scale pointer is fatal", "fatal %d: %s", f5,
        g_fatal_msg);
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    bool f6 = EXPECT_FATAL(cublasLtMatmul(g_lt, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.c, D, p.c, &res.algo,
                                          (void *)host_A, sizeof host_A, st));
    tap(f6 && strstr(g_fatal_msg, "workspace"), "cublasLt: a host workspace is fatal", "fatal %d: %s", f6, g_fatal_msg);
    bool f8 = EXPECT_FATAL(cublasLtMatmul(g_lt, p.desc, sc + 3, A, p.a, B, p.b, &beta, D, p.c, D, p.c, &res.algo,
                                          NULL, 0, st));
    tap(f8 && strstr(g_fatal_msg, "POINTER_MODE_HOST"), "cublasLt: alpha in device memory is fatal (host pointer mode)",
        "fatal %d: %s", f8, g_fatal_msg);
    bool f7 = EXPECT_FATAL(cublasLtMatmul(g_lt, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.c, (void *)A, p.c,
                                          &res.algo, NULL, 0, st));
    tap(f7 && strstr(g_fatal_msg, "overlaps"), "cublasLt: D overlapping A is fatal", "fatal %d: %s", f7, g_fatal_msg);

    /* the algorithm belongs to its problem: changing TRANSA afterwards */
    cublasOperation_t nn = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &nn, sizeof nn);
    capture_begin();
    cublasStatus_t s8 = cublasLtMatmul(g_lt, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.c, D, p.c, &res.algo, NULL, 0, st);
    capture_end();
    tap(s8 == CUBLAS_STATUS_INVALID_VALUE, "cublasLt: an algorithm used for another problem is INVALID_VALUE",
        "status %s", cublasLtGetStatusName(s8));
    plan_free(&p);

    /* a scale pointer on a bf16 matmul */
    plan_make(&p, CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 4, 4, 4, 256);
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    plan_heuristic(&p, &res, &found);
    capture_begin();
    cublasStatus_t s9 = cublasLtMatmul(g_lt, p.desc, &alpha, buf, p.a, buf + 256, p.b, &beta, buf + 1024, p.c,
                                       buf + 1024, p.c, &res.algo, NULL, 0, st);
    capture_end();
    tap(s9 == CUBLAS_STATUS_INVALID_VALUE, "cublasLt: a scale pointer for bf16 operands is INVALID_VALUE", "status %s",
        cublasLtGetStatusName(s9));
    /* no algorithm: the implicit heuristic assumes 256-byte alignment */
    const float *none = NULL;
    cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &none, sizeof none);
    bool f10 = EXPECT_FATAL(cublasLtMatmul(g_lt, p.desc, &alpha, buf + 2, p.a, buf + 256, p.b, &beta, buf + 1024, p.c,
                                           buf + 1024, p.c, NULL, NULL, 0, st));
    tap(f10 && strstr(g_fatal_msg, "256"), "cublasLt: without an algorithm, pointers must be 256-byte aligned",
        "fatal %d: %s", f10, g_fatal_msg);
    plan_free(&p);
    dev_free(buf);
}

static void test_cublaslt(void) {
    if (cublasLtCreate(&g_lt) != CUBLAS_STATUS_SUCCESS) {
        tap(false, "cublasLt: cublasLtCreate");
        return;
    }
    g_ws = dev_alloc(WS_BYTES);
    const float one = 1.0f;
    /* every (transposes, types, beta) the backend uses (gemm.cu, gemm_fp8.cu), odd bf16 sizes */
    const gemm_case_t cases[] = {
        { "bf16 forward y = W x", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 17, 33, 5, one, 0, 0, false },
        { "bf16 forward y = W x", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 64, 48, 200, one, 0, 0, false },
        { "bf16 dx = W^T dout", CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 33, 17, 5, one, 0, 0, false },
        { "bf16 dx += W^T dout", CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 5, 17, 33, one, 1, 0, false },
        { "bf16 dw += x^T dout (fp32)", CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, 17, 5, 33, one, 1, 0, false },
        { "bf16 dw += x^T dout (fp32)", CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, 1, 1, 1, one, 1, 0, false },
        { "bf16 TT", CUBLAS_OP_T, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 9, 7, 13, -0.5f, 0.25f, 3, true },
        { "bf16 fp32-out NN", CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, 31, 3, 129, one, 0, 2, false },
        { "FP8 forward (e4m3 x e4m3, bf16)", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, 48, 16, 64, one, 0, 0, false },
        { "FP8 dx (e4m3 x e5m2, bf16)", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_16BF, 32, 48, 16, one, 0, 0, false },
        { "FP8 dx += (e4m3 x e5m2, bf16)", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_16BF, 16, 32, 48, one, 1, 0, false },
        { "FP8 dw += (e4m3 x e5m2, fp32)", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_32F, 32, 16, 80, one, 1, 0, false },
        { "FP8 padded (e5m2 x e4m3, fp32)", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_32F, 16, 16, 32, 2.0f, 0.5f, 16, true },
    };
    for (const auto &c : cases) run_gemm_case(&c);
    test_lt_refusals();
    test_lt_matmul_checks();
    dev_free(g_ws);
    cublasLtDestroy(g_lt);
}

/* ---- NCCL (nccl.cc through dlopen) ---- */

typedef struct { char internal[128]; } nccl_id_t;
typedef void *nccl_comm_t;

static void test_nccl(const char *path) {
    if (!path) {
        skip("nccl: one-rank collectives", "no library path given (run with the path of the built libnccl .so)");
        return;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        tap(false, "nccl: dlopen", "%s", dlerror());
        return;
    }
    int (*get_id)(nccl_id_t *) = (int (*)(nccl_id_t *))dlsym(h, "ncclGetUniqueId");
    int (*init)(nccl_comm_t *, int, nccl_id_t, int) = (int (*)(nccl_comm_t *, int, nccl_id_t, int))dlsym(h, "ncclCommInitRank");
    int (*destroy)(nccl_comm_t) = (int (*)(nccl_comm_t))dlsym(h, "ncclCommDestroy");
    int (*abort_)(nccl_comm_t) = (int (*)(nccl_comm_t))dlsym(h, "ncclCommAbort");
    int (*ag)(const void *, void *, size_t, int, nccl_comm_t, cudaStream_t) =
        (int (*)(const void *, void *, size_t, int, nccl_comm_t, cudaStream_t))dlsym(h, "ncclAllGather");
    int (*rs)(const void *, void *, size_t, int, int, nccl_comm_t, cudaStream_t) =
        (int (*)(const void *, void *, size_t, int, int, nccl_comm_t, cudaStream_t))dlsym(h, "ncclReduceScatter");
    int (*ar)(const void *, void *, size_t, int, int, nccl_comm_t, cudaStream_t) =
        (int (*)(const void *, void *, size_t, int, int, nccl_comm_t, cudaStream_t))dlsym(h, "ncclAllReduce");
    int (*bc)(const void *, void *, size_t, int, int, nccl_comm_t, cudaStream_t) =
        (int (*)(const void *, void *, size_t, int, int, nccl_comm_t, cudaStream_t))dlsym(h, "ncclBroadcast");
    const char *(*errstr)(int) = (const char *(*)(int))dlsym(h, "ncclGetErrorString");
    int (*async_err)(nccl_comm_t, int *) = (int (*)(nccl_comm_t, int *))dlsym(h, "ncclCommGetAsyncError");
    bool syms = get_id && init && destroy && abort_ && ag && rs && ar && bc && errstr && async_err;
    tap(syms, "nccl: every function workers/comm/nccl.c resolves, and ncclCommGetAsyncError");
    if (!syms) return;

    int (*send_)(const void *, size_t, int, int, nccl_comm_t, cudaStream_t) =
        (int (*)(const void *, size_t, int, int, nccl_comm_t, cudaStream_t))dlsym(h, "ncclSend");
    int (*recv_)(void *, size_t, int, int, nccl_comm_t, cudaStream_t) =
        (int (*)(void *, size_t, int, int, nccl_comm_t, cudaStream_t))dlsym(h, "ncclRecv");
    int (*gstart)(void) = (int (*)(void))dlsym(h, "ncclGroupStart");
    int (*gend)(void) = (int (*)(void))dlsym(h, "ncclGroupEnd");
    tap(send_ && recv_ && gstart && gend, "nccl: ncclSend, ncclRecv, ncclGroupStart, ncclGroupEnd");
    if (!send_ || !recv_ || !gstart || !gend) return;

    nccl_id_t id;
    nccl_comm_t comm = NULL;
    int rc = get_id(&id);

    /* two ranks (threads) on one device: refused by both, as NCCL refuses them */
    {
        nccl_comm_t c[2] = { (nccl_comm_t)1, (nccl_comm_t)1 };
        int r[2] = { -1, -1 };
        get_id(&id);
        capture_begin();
        std::thread t0([&]() { g_thread_device = 0; r[0] = init(&c[0], 2, id, 0); });
        std::thread t1([&]() { g_thread_device = 0; r[1] = init(&c[1], 2, id, 1); });
        t0.join();
        t1.join();
        const char *e2 = capture_end();
        tap(r[0] == 5 && r[1] == 5 && !c[0] && !c[1] && strstr(e2, "Duplicate GPU detected"),
            "nccl: two ranks on one device are ncclInvalidUsage (Duplicate GPU)", "rc %d %d, stderr \"%.200s\"", r[0],
            r[1], e2);
    }
    /* two ranks on two devices: a ring shift in a group (each rank lists its
     * receive first: the group must not deadlock), then every collective,
     * against sums computed here */
    {
        const size_t M = 777; /* odd */
        float *snd[2], *rcv[2], *big[2];
        for (int r = 0; r < 2; r++) {
            snd[r] = (float *)dev_alloc(M * 4);
            rcv[r] = (float *)dev_alloc(2 * M * 4);
            big[r] = (float *)dev_alloc(2 * M * 4);
            for (size_t i = 0; i < M; i++) snd[r][i] = (float)rnd_uniform(-4, 4);
            for (size_t i = 0; i < 2 * M; i++) big[r][i] = (float)rnd_uniform(-4, 4);
        }
        float *shift[2] = { (float *)dev_alloc(M * 4), (float *)dev_alloc(M * 4) };
        float *sum[2] = { (float *)dev_alloc(M * 4), (float *)dev_alloc(M * 4) };
        float *rs_out[2] = { (float *)dev_alloc(M * 4), (float *)dev_alloc(M * 4) };
        float *bc_buf[2] = { (float *)dev_alloc(M * 4), (float *)dev_alloc(M * 4) };
        memcpy(bc_buf[1], snd[1], M * 4);
        get_id(&id);
        int bad_rc[2] = { 0, 0 }, n_seen[2] = { 0, 0 };
        auto rank = [&](int r) {
            g_thread_device = r;
            nccl_comm_t c = NULL;
            cudaStream_t st = (cudaStream_t)(uintptr_t)(0x9100 + r);
            if (init(&c, 2, id, r)) { bad_rc[r]++; return; }
            int (*count)(nccl_comm_t, int *) = (int (*)(nccl_comm_t, int *))dlsym(h, "ncclCommCount");
            if (count) count(c, &n_seen[r]);
            int peer = 1 - r;
            bad_rc[r] += gstart() != 0;
            bad_rc[r] += recv_(shift[r], M, 7, peer, c, st) != 0;
            bad_rc[r] += send_(snd[r], M, 7, peer, c, st) != 0;
            bad_rc[r] += gend() != 0;
            bad_rc[r] += ar(snd[r], sum[r], M, 7, 0, c, st) != 0;
            bad_rc[r] += ag(snd[r], rcv[r], M, 7, c, st) != 0;
            bad_rc[r] += rs(big[r], rs_out[r], M, 7, 4 /* avg */, c, st) != 0;
            bad_rc[r] += bc(bc_buf[r], bc_buf[r], M, 7, 1, c, st) != 0;
            bad_rc[r] += destroy(c) != 0;
        };
        std::thread t0(rank, 0), t1(rank, 1);
        t0.join();
        t1.join();
        int bad = 0;
        for (int r = 0; r < 2; r++)
            for (size_t i = 0; i < M; i++) {
                bad += memcmp(&shift[r][i], &snd[1 - r][i], 4) != 0;
                float s = snd[0][i] + snd[1][i];
                bad += memcmp(&sum[r][i], &s, 4) != 0;
                bad += memcmp(&rcv[r][i], &snd[0][i], 4) != 0 || memcmp(&rcv[r][M + i], &snd[1][i], 4) != 0;
                float a = (big[0][r * M + i] + big[1][r * M + i]) / 2.0f;
                bad += memcmp(&rs_out[r][i], &a, 4) != 0;
                bad += memcmp(&bc_buf[r][i], &snd[1][i], 4) != 0;
            }
        tap(!bad && !bad_rc[0] && !bad_rc[1] && n_seen[0] == 2 && n_seen[1] == 2,
            "nccl: two ranks: send/recv in a group (receive listed first), all_reduce sum, all_gather, reduce_scatter "
            "avg, broadcast from rank 1 give the serial results bit for bit",
            "%d values differ, %d + %d calls failed, counts %d %d", bad, bad_rc[0], bad_rc[1], n_seen[0], n_seen[1]);
        for (int r = 0; r < 2; r++) {
            dev_free(snd[r]), dev_free(rcv[r]), dev_free(big[r]), dev_free(shift[r]), dev_free(sum[r]);
            dev_free(rs_out[r]), dev_free(bc_buf[r]);
        }
    }

    get_id(&id);
    int rc1 = init(&comm, 1, id, 0);
    int aerr = -1;
    tap(rc == 0 && rc1 == 0 && comm && async_err(comm, &aerr) == 0 && aerr == 0 && errstr(0) && errstr(5),
        "nccl: one rank initializes; no asynchronous error");

    const size_t N = 1001; /* odd */
    float *send = (float *)dev_alloc(N * 4), *recv = (float *)dev_alloc(N * 4);
    for (size_t i = 0; i < N; i++) send[i] = (float)rnd_uniform(-10, 10);
    send[0] = -0.0f;
    memcpy(&send[1], "\x01\x00\xc0\x7f", 4); /* a NaN with a payload */
    send[2] = INFINITY;
    cudaStream_t st = (cudaStream_t)(uintptr_t)0x9000;
    struct { const char *name; int rc; } runs[6];
    int nr = 0, bad = 0;
    const int ops[2] = { 0 /* sum */, 4 /* avg */ };
    for (int o = 0; o < 2; o++) {
        memset(recv, 0xff, N * 4);
        runs[nr].name = o ? "all_reduce avg" : "all_reduce sum";
        runs[nr++].rc = ar(send, recv, N, 7 /* ncclFloat32 */, ops[o], comm, st);
        bad += memcmp(send, recv, N * 4) != 0 || g_last_stream != st;
        memset(recv, 0xff, N * 4);
        runs[nr].name = o ? "reduce_scatter avg" : "reduce_scatter sum";
        runs[nr++].rc = rs(send, recv, N, 7, ops[o], comm, st);
        bad += memcmp(send, recv, N * 4) != 0;
    }
    memset(recv, 0xff, N * 4);
    runs[nr].name = "all_gather bf16";
    runs[nr++].rc = ag(send, recv, 2 * N, 9 /* ncclBfloat16: 2N bf16 in N floats */, comm, st);
    bad += memcmp(send, recv, N * 4) != 0;
    memcpy(recv, send, N * 4);
    runs[nr].name = "broadcast in place";
    runs[nr++].rc = bc(recv, recv, N, 7, 0, comm, st);
    bad += memcmp(send, recv, N * 4) != 0;
    int bad_rc = 0;
    for (int i = 0; i < nr; i++) bad_rc += runs[i].rc != 0;
    tap(!bad && !bad_rc, "nccl: one-rank all_reduce / reduce_scatter (sum, avg), all_gather, broadcast copy bit for bit "
        "(-0, NaN payload, inf) on the given stream", "%d results differ, %d calls failed", bad, bad_rc);

    capture_begin();
    static float host[16];
    int r1 = ar(host, recv, 16, 7, 0, comm, st);
    int r2 = bc(recv, recv, N, 7, 1, comm, st);
    int r3 = ar(send, recv, N, 42, 0, comm, st);
    int r4 = ar(send, recv, N, 7, 9, comm, st);
    const char *e = capture_end();
    tap(r1 == 4 && r2 == 4 && r3 == 4 && r4 == 4 && strstr(e, "sendbuff"),
        "nccl: host buffer, root 1, unknown type, unknown op are ncclInvalidArgument",
        "rc %d %d %d %d, stderr \"%.200s\"", r1, r2, r3, r4, e);
    bool f1 = EXPECT_FATAL(ar(send, recv, N + 1, 7, 0, comm, st));
    tap(f1 && strstr(g_fatal_msg, "past the end"), "nccl: a count past the allocation is fatal", "fatal %d: %s", f1,
        g_fatal_msg);
    bool f2 = EXPECT_FATAL(ar(send, send + 1, N - 1, 7, 0, comm, st));
    tap(f2 && strstr(g_fatal_msg, "overlap"), "nccl: overlapping send and receive buffers are fatal", "fatal %d: %s", f2,
        g_fatal_msg);
    tap(ar(send, recv, 0, 7, 0, comm, st) == 0, "nccl: count 0 succeeds");
    nccl_comm_t c2 = NULL;
    get_id(&id);
    tap(destroy(comm) == 0 && init(&c2, 1, id, 0) == 0 && abort_(c2) == 0, "nccl: destroy and abort");
    dev_free(send);
    dev_free(recv);
    dlclose(h);
}

int main(int argc, char **argv) {
    if (fegetround() != FE_TONEAREST) fesetround(FE_TONEAREST);
    test_bf16();
    test_fp8();
    test_math();
    test_cublaslt();
    test_nccl(argc > 1 ? argv[1] : NULL);
    printf("1..%d\n", g_tests);
    if (g_failed) printf("# %d of %d failed\n", g_failed, g_tests);
    return g_failed ? 1 : 0;
}
