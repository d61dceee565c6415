/* emu_math.h: the CUDA device math the backend's .cu files use that
 * <math.h> lacks, for the emulation tier (tests/emu), which builds those
 * files as host C++. The core's cuda_runtime.h includes it; C++ only.
 *
 * Accuracy. The "_rn" intrinsics are IEEE-exact on the GPU and exact here.
 * The fast ones are not exact on the GPU: __expf and __logf go through the
 * SFU (ex2.approx / lg2.approx; __expf errs by up to 2 + 1.173 |x| ulp),
 * rsqrtf by up to 2 ulp, __fdividef returns 0 for 2^126 < |y| < 2^128;
 * here they are computed with expf, logf, a correctly rounded 1/sqrt and a
 * plain division. A test comparing emulated results with a reference must
 * use a tolerance that covers the GPU's error as well as ours: bit-exact
 * agreement with the GPU is not promised for these.
 *
 * Linkage. glibc's <math.h> declares __expf and __logf (extern "C",
 * without exporting them), and newer C libraries declare the C23 rsqrtf,
 * cospif and sinpif, so those are defined here as extern "C" inline with
 * the same exception specification: they then complete the library's
 * declaration instead of clashing with it. */
#ifndef BALLAST_EMU_MATH_H
#define BALLAST_EMU_MATH_H

#ifndef __cplusplus
#error "emu_math.h is C++ only: the emulation tier builds the backend's .cu files with g++"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "emu_defs.h"

/* ---- fp32 values the compiler may not fuse or reorder ----
 * CUDA promises that __fmul_rn and __fadd_rn are never contracted into an
 * FMA. A host compiler allowed to contract (-ffp-contract=fast with FMA
 * hardware) could fuse a*b + c across an inlined call, so each operand and
 * result passes through an empty asm that hides the value from it. */
#if defined(__x86_64__) || defined(__i386__)
#define EMU_OPAQUE_F(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define EMU_OPAQUE_F(v) __asm__("" : "+w"(v))
#else
#define EMU_OPAQUE_F(v) do { volatile float emu_t_ = (v); (v) = emu_t_; } while (0)
#endif

/* ---- bit casts ---- */

inline int __float_as_int(float x) { int i; memcpy(&i, &x, sizeof i); return i; }
inline unsigned int __float_as_uint(float x) { unsigned int u; memcpy(&u, &x, sizeof u); return u; }
inline float __int_as_float(int i) { float x; memcpy(&x, &i, sizeof x); return x; }
inline float __uint_as_float(unsigned int u) { float x; memcpy(&x, &u, sizeof x); return x; }

/* ---- IEEE round-to-nearest operations (exact on both sides) ---- */

inline float __fadd_rn(float a, float b) { EMU_OPAQUE_F(a); EMU_OPAQUE_F(b); float r = a + b; EMU_OPAQUE_F(r); return r; }
inline float __fsub_rn(float a, float b) { EMU_OPAQUE_F(a); EMU_OPAQUE_F(b); float r = a - b; EMU_OPAQUE_F(r); return r; }
inline float __fmul_rn(float a, float b) { EMU_OPAQUE_F(a); EMU_OPAQUE_F(b); float r = a * b; EMU_OPAQUE_F(r); return r; }
inline float __fdiv_rn(float a, float b) { EMU_OPAQUE_F(a); EMU_OPAQUE_F(b); float r = a / b; EMU_OPAQUE_F(r); return r; }
inline float __frcp_rn(float a) { return __fdiv_rn(1.0f, a); }
inline float __fsqrt_rn(float a) { EMU_OPAQUE_F(a); float r = sqrtf(a); EMU_OPAQUE_F(r); return r; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }

/* ---- fast intrinsics (approximate on the GPU; see the top comment) ---- */

extern "C" inline float __expf(float x) noexcept { return expf(x); }
extern "C" inline float __logf(float x) noexcept { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
/* Clamp to [+0, 1]; NaN gives 0 (libdevice's documented behaviour). */
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : x > 0.0f ? x : 0.0f; }

extern "C" inline float rsqrtf(float x) noexcept { return (float)(1.0 / sqrt((double)x)); }

/* cos(pi x) and sin(pi x), exact at integers and half-integers as CUDA's:
 * x is reduced modulo 2 exactly (fmod), then the double result rounded. */
extern "C" inline float cospif(float x) noexcept {
    if (isinf(x)) return NAN;
    double r = fmod(fabs((double)x), 2.0);
    if (r == 0.5 || r == 1.5) return 0.0f;
    return (float)cos(M_PI * r);
}
extern "C" inline float sinpif(float x) noexcept {
    if (isinf(x)) return NAN;
    double r = fmod((double)x, 2.0); /* keeps the sign of x: sin is odd */
    if (r == 0.0 || r == 1.0 || r == -1.0) return copysignf(0.0f, x);
    return (float)sin(M_PI * r);
}

/* ---- min / max as CUDA overloads them ----
 * Mixed signed/unsigned arguments compare as unsigned (the usual
 * arithmetic conversions), as CUDA's overloads do; float min/max are
 * fminf/fmaxf (a NaN argument loses to a number). */
#define EMU_MINMAX(T)                                         \
    inline T min(T a, T b) { return a < b ? a : b; }          \
    inline T max(T a, T b) { return a > b ? a : b; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned int)
EMU_MINMAX(long int)
EMU_MINMAX(unsigned long int)
EMU_MINMAX(long long int)
EMU_MINMAX(unsigned long long int)
#undef EMU_MINMAX
#define EMU_MINMAX_MIXED(S, U)                                                    \
    inline U min(S a, U b) { return (U)a < b ? (U)a : b; }                        \
    inline U min(U a, S b) { return a < (U)b ? a : (U)b; }                        \
    inline U max(S a, U b) { return (U)a > b ? (U)a : b; }                        \
    inline U max(U a, S b) { return a > (U)b ? a : (U)b; }
EMU_MINMAX_MIXED(int, unsigned int)
EMU_MINMAX_MIXED(long int, unsigned long int)
EMU_MINMAX_MIXED(long long int, unsigned long long int)
#undef EMU_MINMAX_MIXED
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin((double)a, b); }
inline double min(double a, float b) { return fmin(a, (double)b); }
inline double max(float a, double b) { return fmax((double)a, b); }
inline double max(double a, float b) { return fmax(a, (double)b); }

#endif
