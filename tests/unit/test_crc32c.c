/* test_crc32c.c: CRC-32C against published check values (RFC 3720 B.4 and
 * the "123456789" check), hardware path against table path and against a
 * bit-at-a-time reference written here, and the chaining property. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "tests/unit/helpers.h"

/* Independent reference: th_crc32c_ref, one bit at a time, straight from
 * the definition. */

static uint64_t rng_state;
static uint64_t rnd(void) { return th_xorshift64s(&rng_state); }
static void fill(unsigned char *b, size_t n) { for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(rnd() >> 56); }

/* Both paths, whichever this CPU has. */
typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);
static uint32_t via_default(uint32_t c, const void *b, size_t n) { crc32c_force_sw(false); return crc32c(c, b, n); }
static uint32_t via_forced_sw(uint32_t c, const void *b, size_t n) { crc32c_force_sw(true); uint32_t r = crc32c(c, b, n); crc32c_force_sw(false); return r; }
static const struct { const char *name; crc_fn fn; } paths[] = {
    { "crc32c()", via_default }, { "crc32c() forced table", via_forced_sw }, { "crc32c_sw", crc32c_sw },
};

static void check_vector(const void *buf, size_t n, uint32_t want, const char *what) {
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        uint32_t got = paths[i].fn(0, buf, n);
        cr_assert_eq(got, want, "%s via %s: got 0x%08X, want 0x%08X", what, paths[i].name, got, want);
    }
    if (crc32c_hw_available()) {
        uint32_t got = crc32c_hw(0, buf, n);
        cr_assert_eq(got, want, "%s via crc32c_hw: got 0x%08X, want 0x%08X", what, got, want);
    }
    cr_assert_eq(th_crc32c_ref(0, buf, n), want, "%s: the bitwise reference disagrees", what);
}

Test(crc32c, published_check_values) {
    unsigned char b[48];
    check_vector("123456789", 9, 0xE3069283u, "\"123456789\"");
    memset(b, 0x00, 32); check_vector(b, 32, 0x8A9136AAu, "32 x 0x00");
    memset(b, 0xFF, 32); check_vector(b, 32, 0x62A8AB43u, "32 x 0xFF");
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
    check_vector(b, 32, 0x46DD794Eu, "32 incrementing bytes");
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
    check_vector(b, 32, 0x113FDB5Cu, "32 decrementing bytes");
    /* RFC 3720 B.4: an iSCSI SCSI Read (10) command PDU. */
    static const unsigned char pdu[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00 };
    check_vector(pdu, 48, 0xD9963A56u, "iSCSI read PDU");
}

Test(crc32c, empty_input_keeps_crc) {
    cr_assert_eq(crc32c(0, NULL, 0), 0u);
    cr_assert_eq(crc32c(0xDEADBEEFu, NULL, 0), 0xDEADBEEFu);
    cr_assert_eq(crc32c_sw(0x12345678u, NULL, 0), 0x12345678u);
}

Test(crc32c, impl_name_follows_forcing) {
    crc32c_force_sw(true);
    cr_assert_str_eq(crc32c_impl(), "table");
    crc32c_force_sw(false);
    cr_assert_str_eq(crc32c_impl(), crc32c_hw_available() ? "sse4.2" : "table");
}

Test(crc32c, hw_equals_table_on_random_misaligned_buffers) {
    if (!crc32c_hw_available()) cr_skip_test("this CPU has no SSE4.2 crc32 instruction: only the table path exists");
    rng_state = 0x9E3779B97F4A7C15ULL;
    enum { MAXLEN = 64 << 10 };
    unsigned char *mem = malloc(MAXLEN + 16);
    cr_assert(mem);
    for (int iter = 0; iter < 400; iter++) {
        size_t len = 1 + rnd() % MAXLEN;
        if (iter < 64) len = 1 + (size_t)iter; /* every short length and its tail */
        size_t off = rnd() % 16;
        unsigned char *p = mem + off;
        fill(p, len);
        uint32_t seed = iter % 3 ? (uint32_t)rnd() : 0;
        uint32_t hw = crc32c_hw(seed, p, len), sw = crc32c_sw(seed, p, len);
        cr_assert_eq(hw, sw, "len %zu offset %zu seed 0x%08X: hw 0x%08X table 0x%08X", len, off, seed, hw, sw);
        if (iter % 8 == 0) {
            uint32_t r = th_crc32c_ref(seed, p, len);
            cr_assert_eq(sw, r, "len %zu offset %zu: table 0x%08X bitwise 0x%08X", len, off, sw, r);
        }
    }
    free(mem);
}

/* Lengths around the hardware path's block boundaries (3 x 256 and
 * 3 x 8192 bytes), where the interleaved chains are joined. */
Test(crc32c, block_boundaries_match_reference) {
    rng_state = 0xB10CB10CB10CULL;
    static const size_t bases[] = { 768, 1536, 24576, 49152, 24576 + 768 };
    enum { MAXLEN = 49152 + 64 + 16 };
    unsigned char *mem = malloc(MAXLEN + 16);
    cr_assert(mem);
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++)
        for (int d = -9; d <= 9; d++) {
            size_t len = bases[i] + d, off = rnd() % 16;
            fill(mem + off, len);
            uint32_t seed = (uint32_t)rnd(), want = th_crc32c_ref(seed, mem + off, len);
            cr_assert_eq(crc32c_sw(seed, mem + off, len), want, "table: len %zu offset %zu", len, off);
            crc32c_force_sw(false);
            cr_assert_eq(crc32c(seed, mem + off, len), want, "%s: len %zu offset %zu", crc32c_impl(), len, off);
        }
    free(mem);
}

Test(crc32c, table_equals_bitwise_reference) {
    rng_state = 0xC0FFEE1234567ULL;
    unsigned char *mem = malloc(4096 + 16);
    cr_assert(mem);
    for (int iter = 0; iter < 200; iter++) {
        size_t len = 1 + rnd() % 4096, off = rnd() % 16;
        fill(mem + off, len);
        uint32_t seed = (uint32_t)rnd();
        cr_assert_eq(crc32c_sw(seed, mem + off, len), th_crc32c_ref(seed, mem + off, len),
                     "len %zu offset %zu seed 0x%08X", len, off, seed);
    }
    free(mem);
}

Test(crc32c, chaining_over_random_splits) {
    rng_state = 0x5EED5EED1234ULL;
    enum { MAXLEN = 64 << 10 };
    unsigned char *buf = malloc(MAXLEN);
    cr_assert(buf);
    for (int iter = 0; iter < 100; iter++) {
        size_t len = 1 + rnd() % MAXLEN;
        fill(buf, len);
        for (int pi = 0; pi < 3; pi++) {
            crc_fn fn = paths[pi].fn;
            uint32_t whole = fn(0, buf, len);
            /* up to 6 random cut points, some of them empty pieces */
            size_t cuts[8]; int nc = 0;
            cuts[nc++] = 0;
            int k = (int)(rnd() % 7);
            for (int i = 0; i < k; i++) cuts[nc++] = rnd() % (len + 1);
            cuts[nc++] = len;
            for (int i = 1; i < nc; i++) /* sort */
                for (int j = i; j > 0 && cuts[j] < cuts[j - 1]; j--) { size_t t = cuts[j]; cuts[j] = cuts[j - 1]; cuts[j - 1] = t; }
            uint32_t c = 0;
            for (int i = 1; i < nc; i++) c = fn(c, buf + cuts[i - 1], cuts[i] - cuts[i - 1]);
            cr_assert_eq(c, whole, "%s: len %zu in %d pieces: chained 0x%08X whole 0x%08X",
                         paths[pi].name, len, nc - 1, c, whole);
        }
    }
    free(buf);
}
