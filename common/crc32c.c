/* crc32c.c: CRC-32C, see crc32c.h.
 *
 * Two paths: the SSE4.2 crc32 instruction (compiled with a target attribute
 * so the rest of the tree needs no -msse4.2, chosen at run time with
 * __builtin_cpu_supports) and a slicing-by-8 table for other CPUs. Both take
 * and return the crc in its final (post-inverted) form so calls chain.
 * Large buffers on the hardware path run three interleaved chains. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u /* reflected Castagnoli polynomial */

/* ---- table path (slicing-by-8) ---- */

static uint32_t crc_table[8][256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xff];
}

/* Little-endian 64-bit load from any alignment. */
static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len) {
    pthread_once(&crc_table_once, crc_table_init);
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        uint64_t v = load_le64(p) ^ c;
        c = crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^
            crc_table[5][(v >> 16) & 0xff] ^ crc_table[4][(v >> 24) & 0xff] ^
            crc_table[3][(v >> 32) & 0xff] ^ crc_table[2][(v >> 40) & 0xff] ^
            crc_table[1][(v >> 48) & 0xff] ^ crc_table[0][v >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    return ~c;
}

/* ---- hardware path (SSE4.2) ---- */

#if defined(__x86_64__)
#include <nmmintrin.h>

/* The crc32 instruction has a latency of 3 cycles and a throughput of 1, so
 * one dependency chain uses a third of it. Large buffers run three chains
 * over three adjacent blocks of BLK bytes and join them: the raw (uninverted)
 * CRC is linear, so crc(A||B) = shift_BLK(crc(A)) ^ crc_from_zero(B), where
 * shift_BLK (feeding BLK zero bytes) is a 32x32 bit matrix applied here as
 * four 256-entry tables. Two block sizes: long for bulk, short for the rest. */
#define CRC_LONG 8192
#define CRC_SHORT 256

static uint32_t shift_long[4][256], shift_short[4][256];
static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

static uint32_t feed_zeros(uint32_t x, size_t n) {
    while (n--) x = (x >> 8) ^ crc_table[0][x & 0xff];
    return x;
}

static void make_shift(uint32_t t[4][256], size_t n) {
    uint32_t basis[32];
    for (int i = 0; i < 32; i++) basis[i] = feed_zeros(1u << i, n);
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int j = 0; j < 8; j++)
                if ((b >> j) & 1) v ^= basis[8 * k + j];
            t[k][b] = v;
        }
}

static void shift_init(void) {
    pthread_once(&crc_table_once, crc_table_init);
    make_shift(shift_long, CRC_LONG);
    make_shift(shift_short, CRC_SHORT);
}

static inline uint32_t shift(const uint32_t t[4][256], uint32_t x) {
    return t[0][x & 0xff] ^ t[1][(x >> 8) & 0xff] ^ t[2][(x >> 16) & 0xff] ^ t[3][x >> 24];
}

static inline uint64_t load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Raw crc c0 continued over 3 x blk bytes at p, as three parallel chains. */
__attribute__((target("sse4.2")))
static inline uint32_t crc3(uint32_t c0, const unsigned char *p, size_t blk, const uint32_t t[4][256]) {
    uint64_t a = c0, b = 0, c = 0;
    for (const unsigned char *e = p + blk; p < e; p += 8) {
        a = _mm_crc32_u64(a, load64(p));
        b = _mm_crc32_u64(b, load64(p + blk));
        c = _mm_crc32_u64(c, load64(p + 2 * blk));
    }
    uint32_t r = shift(t, (uint32_t)a) ^ (uint32_t)b;
    return shift(t, r) ^ (uint32_t)c;
}

__attribute__((target("sse4.2")))
uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t len) {
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8(c, *p++);
        len--;
    }
    if (len >= 3 * CRC_SHORT) {
        pthread_once(&shift_once, shift_init);
        for (; len >= 3 * CRC_LONG; p += 3 * CRC_LONG, len -= 3 * CRC_LONG) c = crc3(c, p, CRC_LONG, shift_long);
        for (; len >= 3 * CRC_SHORT; p += 3 * CRC_SHORT, len -= 3 * CRC_SHORT) c = crc3(c, p, CRC_SHORT, shift_short);
    }
    uint64_t c64 = c;
    for (; len >= 8; p += 8, len -= 8) c64 = _mm_crc32_u64(c64, load64(p));
    c = (uint32_t)c64;
    while (len--) c = _mm_crc32_u8(c, *p++);
    return ~c;
}

bool crc32c_hw_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
#else
uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t len) { return crc32c_sw(crc, buf, len); }
bool crc32c_hw_available(void) { return false; }
#endif

/* ---- dispatch ---- */

static int crc_forced_sw; /* atomic flag: set by crc32c_force_sw */
static int crc_hw = -1;   /* -1 unknown, 0 no, 1 yes; benign race: every thread computes the same */

static bool use_hw(void) {
    int hw = __atomic_load_n(&crc_hw, __ATOMIC_RELAXED);
    if (hw < 0) {
        hw = crc32c_hw_available() ? 1 : 0;
        __atomic_store_n(&crc_hw, hw, __ATOMIC_RELAXED);
    }
    return hw && !__atomic_load_n(&crc_forced_sw, __ATOMIC_RELAXED);
}

uint32_t crc32c(uint32_t crc, const void *buf, size_t len) {
    if (len == 0) return crc;
    return use_hw() ? crc32c_hw(crc, buf, len) : crc32c_sw(crc, buf, len);
}

void crc32c_force_sw(bool force) { __atomic_store_n(&crc_forced_sw, force ? 1 : 0, __ATOMIC_RELAXED); }

const char *crc32c_impl(void) { return use_hw() ? "sse4.2" : "table"; }
