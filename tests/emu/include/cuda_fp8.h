/* cuda_fp8.h (emulation tier): the FP8 storage types and conversions of
 * gemm_fp8.cu, built as host C++ (tests/emu), plus the decoding the
 * emulated cuBLASLt (tests/emu/cublaslt.cc) uses. C++ only.
 *
 * Formats (OCP FP8, as CUDA implements them):
 *   E4M3: bias 7, 3 mantissa bits, no infinity; S.1111.111 is the only NaN;
 *         largest finite 448 (0x7e), smallest subnormal 2^-9.
 *   E5M2: bias 15, 2 mantissa bits, IEEE-like; S.11111.00 is infinity,
 *         S.11111.{01,10,11} NaN; largest finite 57344 (0x7b), smallest
 *         subnormal 2^-16.
 *
 * __nv_cvt_float_to_fp8 as NVIDIA documents it: round to nearest, ties to
 * even, subnormals produced (nothing flushed), the sign kept (so -0 and
 * values that underflow from below give 0x80). A magnitude beyond the
 * largest finite value plus half its ulp (464 for E4M3, >= 61440 for E5M2,
 * where the tie rounds to the "even" next binade) overflows: with
 * __NV_SATFINITE to +-largest finite, with __NV_NOSAT to NaN (E4M3, which
 * has no infinity) or +-infinity (E5M2). Infinite inputs are overflows like
 * any other (SATFINITE turns them into +-largest finite). Every NaN input
 * gives 0x7f, the canonical NaN with the sign dropped, as the header's
 * software path returns; the sm_89+ instruction also returns a NaN, whose
 * sign bit is not documented: callers test for NaN, not for a byte. */
#ifndef BALLAST_EMU_CUDA_FP8_H
#define BALLAST_EMU_CUDA_FP8_H

#ifndef __cplusplus
#error "cuda_fp8.h (emulation tier) is C++ only"
#endif

#include <stdint.h>
#include <string.h>

#include "emu_defs.h"

typedef unsigned char __nv_fp8_storage_t;
typedef unsigned short int __nv_fp8x2_storage_t;
typedef unsigned int __nv_fp8x4_storage_t;

typedef enum __nv_saturation_t {
    __NV_NOSAT,     /* overflow: NaN (E4M3) or infinity (E5M2) */
    __NV_SATFINITE, /* overflow: the largest finite value of that sign */
} __nv_saturation_t;

typedef enum __nv_fp8_interpretation_t {
    __NV_E4M3,
    __NV_E5M2,
} __nv_fp8_interpretation_t;

/* ---- the two formats ---- */

typedef struct {
    int mant;          /* mantissa bits */
    int emin;          /* exponent of the smallest normal */
    unsigned maxcode;  /* bits of the largest finite value, sign clear */
    unsigned ovf_nosat;/* what an overflow gives without saturation */
} emu_fp8_format_t;

static inline emu_fp8_format_t emu_fp8_format(__nv_fp8_interpretation_t k) {
    if (k == __NV_E4M3) return emu_fp8_format_t{ 3, -6, 0x7eu, 0x7fu };
    return emu_fp8_format_t{ 2, -14, 0x7bu, 0x7cu };
}

/* ---- fp32 -> fp8 ---- */

/* |x| = sig * 2^(e - 23) with sig < 2^24 an integer. The result, in units
 * of the fp8 quantum 2^(max(e, emin) - mant), is sig shifted right with
 * the dropped bits rounded to nearest even; counting those units from the
 * binade's base gives the code directly (a carry moves into the exponent
 * field by itself). */
static inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t saturate,
                                                       __nv_fp8_interpretation_t fp8_interpretation) {
    emu_fp8_format_t f = emu_fp8_format(fp8_interpretation);
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    unsigned sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fu;
    unsigned code;
    if (a == 0x7f800000u) {
        code = f.maxcode + 1; /* an overflow */
    } else {
        int be = (int)(a >> 23);
        uint32_t sig = a & 0x7fffffu;
        int e = be ? be - 127 : -126;
        if (be) sig |= 0x800000u;
        int eq = e > f.emin ? e : f.emin;     /* exponent of the binade in fp8 */
        int shift = (eq - f.mant) - (e - 23); /* low bits of sig below the fp8 quantum, >= 20 */
        uint32_t r;
        if (shift > 25) {
            r = 0; /* below a quarter of the smallest subnormal */
        } else {
            r = sig >> shift;
            uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
            if (rem > half || (rem == half && (r & 1u))) r++;
        }
        /* the binade's base code: exponent field (eq + bias - 1) with the
         * implicit bit counted in r; 0 in the subnormal range */
        int bias = 1 - f.emin;
        code = (unsigned)((eq + bias - 1) << f.mant) + r;
    }
    if (code > f.maxcode) code = saturate == __NV_SATFINITE ? f.maxcode : f.ovf_nosat;
    return (__nv_fp8_storage_t)(code | sign);
}

/* Double input: a double that is a float converts as that float; others
 * are first rounded to float to odd, which keeps the final rounding correct
 * (fp8 has far fewer bits than fp32). NaN differs from the float version,
 * as in CUDA's header: the sign is kept, and E5M2 keeps the two leading
 * payload bits (0x7e | those). */
static inline __nv_fp8_storage_t __nv_cvt_double_to_fp8(double x, __nv_saturation_t saturate,
                                                        __nv_fp8_interpretation_t fp8_interpretation) {
    if (x != x) {
        uint64_t b;
        memcpy(&b, &x, sizeof b);
        unsigned sign = (unsigned)(b >> 56) & 0x80u;
        unsigned nan = fp8_interpretation == __NV_E4M3 ? 0x7fu : 0x7eu | (unsigned)((b >> 50) & 3u);
        return (__nv_fp8_storage_t)(nan | sign);
    }
    float f = (float)x;
    if ((double)f != x) {
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        if (x < 0 ? (double)f < x : (double)f > x) u--; /* towards zero (also turns an overflow to inf into FLT_MAX) */
        u |= 1u;                                        /* sticky: inexact */
        memcpy(&f, &u, sizeof f);
    }
    return __nv_cvt_float_to_fp8(f, saturate, fp8_interpretation);
}

/* ---- fp8 -> fp32 (exact; the emulator's decoding) ---- */

static inline float emu_fp8_to_float(__nv_fp8_storage_t v, __nv_fp8_interpretation_t k) {
    emu_fp8_format_t f = emu_fp8_format(k);
    unsigned mag = v & 0x7fu;
    float s = (v & 0x80u) ? -1.0f : 1.0f;
    if (k == __NV_E4M3 && mag == 0x7fu) return __builtin_nanf("");
    if (k == __NV_E5M2 && mag >= 0x7cu) return mag == 0x7cu ? s * __builtin_inff() : __builtin_nanf("");
    unsigned ef = mag >> f.mant, m = mag & ((1u << f.mant) - 1u);
    /* value = (m + 2^mant [if normal]) * 2^(max(ef, 1) - bias - mant) */
    int bias = 1 - f.emin;
    int p = (ef ? (int)ef : 1) - bias - f.mant;
    float frac = (float)(ef ? m + (1u << f.mant) : m);
    /* 2^p is a normal float for both formats (p >= -17) */
    uint32_t pb = (uint32_t)(p + 127) << 23;
    float scale;
    memcpy(&scale, &pb, sizeof scale);
    return s * frac * scale;
}

#endif
