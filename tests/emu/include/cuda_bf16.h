/* cuda_bf16.h (emulation tier): bfloat16 for the backend's .cu files built
 * as host C++ (tests/emu). C++ only.
 *
 * __nv_bfloat16 holds the 16 bits of the real type in the same layout (the
 * upper half of an IEEE fp32: sign, 8 exponent bits, 7 mantissa bits), is
 * 2 bytes, 2-aligned and trivially copyable; __nv_bfloat162 is two of them
 * (.x at the lower address), 4 bytes. Both are may_alias: the kernels read
 * and write bf16 elements through pointers into uint4 (16-byte loads), as
 * CUDA code does; with g++ that is type punning, which may_alias makes
 * defined.
 *
 * Conversions follow CUDA's (the sm_80+ cvt.rn.bf16.f32 and the header's
 * host path agree): fp32 -> bf16 rounds to nearest, ties to even, with
 * gradual underflow (fp32 subnormals round like any value, nothing is
 * flushed), overflow past the largest bf16 to infinity, and every NaN to
 * the canonical quiet NaN 0x7fff (sign dropped). bf16 -> fp32 is exact
 * (the bits shifted up). Only what the backend uses is here, plus the
 * implicit float conversions the real header also offers (the build does
 * not define __CUDA_NO_BFLOAT16_CONVERSIONS__); bf16 arithmetic operators
 * are deleted (see below). */
#ifndef BALLAST_EMU_CUDA_BF16_H
#define BALLAST_EMU_CUDA_BF16_H

#ifndef __cplusplus
#error "cuda_bf16.h (emulation tier) is C++ only"
#endif

#include <stdint.h>
#include <string.h>

#include "emu_defs.h"

typedef struct __align__(2) { unsigned short x; } __nv_bfloat16_raw;
typedef struct __align__(4) { unsigned short x, y; } __nv_bfloat162_raw;

/* ---- bit-level conversions ---- */

/* fp32 bits -> bf16 bits, round to nearest even; NaN -> 0x7fff. */
static inline unsigned short emu_f32_bits_to_bf16_rn(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    /* adding 0x7fff plus the kept lsb rounds the dropped half to nearest,
     * a tie towards the even neighbour; a carry may ripple into the
     * exponent (the largest finite values then become infinity) */
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* fp32 bits -> bf16 bits, round towards zero; NaN -> 0x7fff. */
static inline unsigned short emu_f32_bits_to_bf16_rz(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return (unsigned short)(u >> 16);
}

struct __align__(2) __attribute__((may_alias)) __nv_bfloat16 {
    unsigned short __x; /* the bits; public here (the real one's is protected) for the emulator's own libraries */

    __nv_bfloat16() = default;
    constexpr __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
    /* implicit conversions, as in the real header */
    __nv_bfloat16(float f) {
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        __x = emu_f32_bits_to_bf16_rn(u);
    }
    operator float() const {
        uint32_t u = (uint32_t)__x << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    operator __nv_bfloat16_raw() const {
        __nv_bfloat16_raw r;
        r.x = __x;
        return r;
    }
};

struct __align__(4) __attribute__((may_alias)) __nv_bfloat162 {
    __nv_bfloat16 x; /* lower address (the low 16 bits of a 32-bit load) */
    __nv_bfloat16 y;

    __nv_bfloat162() = default;
    constexpr __nv_bfloat162(const __nv_bfloat16 &a, const __nv_bfloat16 &b) : x(a), y(b) {}
};

/* bf16 arithmetic is refused rather than approximated: the real operators
 * round once to bf16, while fp32 arithmetic through the implicit
 * conversions and a conversion back can round twice. Comparisons go
 * through float, which is exact. */
__nv_bfloat16 operator+(const __nv_bfloat16 &, const __nv_bfloat16 &) = delete;
__nv_bfloat16 operator-(const __nv_bfloat16 &, const __nv_bfloat16 &) = delete;
__nv_bfloat16 operator*(const __nv_bfloat16 &, const __nv_bfloat16 &) = delete;
__nv_bfloat16 operator/(const __nv_bfloat16 &, const __nv_bfloat16 &) = delete;

static_assert(sizeof(__nv_bfloat16) == 2 && alignof(__nv_bfloat16) == 2, "__nv_bfloat16 is 2 bytes");
static_assert(sizeof(__nv_bfloat162) == 4 && alignof(__nv_bfloat162) == 4, "__nv_bfloat162 is 4 bytes");

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

/* ---- the intrinsics ---- */

static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) {
    __nv_bfloat16_raw r;
    r.x = b;
    return __nv_bfloat16(r);
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return __ushort_as_bfloat16(emu_f32_bits_to_bf16_rn(u));
}
/* The default conversion rounds to nearest even too. */
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return __ushort_as_bfloat16(emu_f32_bits_to_bf16_rz(u));
}

static inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }

static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(b));
}
static inline __nv_bfloat162 __float2bfloat162_rn(float a) {
    return __nv_bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(a));
}
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
static inline float __low2float(__nv_bfloat162 v) { return (float)v.x; }
static inline float __high2float(__nv_bfloat162 v) { return (float)v.y; }

#endif
