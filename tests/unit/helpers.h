/* helpers.h: what the unit tests share: temporary directories, whole-file
 * reads and writes, a bitwise CRC-32C, and the small random generators they
 * draw their inputs from (all independent of the code under test).
 *
 * Static inline, one copy per test program; include it after
 * <criterion/criterion.h>. The functions that assert (th_tmpdir,
 * th_read_file, th_write_file) must run in the test's own process, not in
 * a child it forks (a rank reports through its exit status instead). */
#ifndef BALLAST_TESTS_UNIT_HELPERS_H
#define BALLAST_TESTS_UNIT_HELPERS_H

#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- temporary directories ---- */

/* Make a fresh directory <base>/ballast-<name>.XXXXXX (base NULL: /tmp)
 * and put its path in dir (cap bytes). Asserts. */
static inline void th_tmpdir(char *dir, size_t cap, const char *base, const char *name) {
    int n = snprintf(dir, cap, "%s/ballast-%s.XXXXXX", base ? base : "/tmp", name);
    cr_assert(n > 0 && (size_t)n < cap, "temporary directory name for %s does not fit in %zu bytes", name, cap);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
}

static inline int th_rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)ftw;
    int rc = flag == FTW_DP || flag == FTW_DNR ? rmdir(p) : unlink(p);
    return rc != 0 && errno != ENOENT ? -1 : 0;
}

/* Remove path and everything under it, like rm -rf: depth first, symbolic
 * links removed, not followed. A missing path is fine. 0, or -1 with errno
 * set (the first entry that could not go). */
static inline int th_rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    return nftw(path, th_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Remove dir (made by th_tmpdir) with everything in it, and clear dir, so
 * that a second call (a suite's .fini after the test's own) does nothing.
 * 0, or -1 with a line on stderr naming the directory. */
static inline int th_tmpdir_remove(char *dir) {
    if (!dir[0]) return 0;
    int rc = th_rm_rf(dir);
    if (rc != 0) fprintf(stderr, "could not remove %s: %s\n", dir, strerror(errno));
    dir[0] = 0;
    return rc;
}

/* ---- whole files ---- */

/* path's bytes in a malloc'ed buffer (the caller frees it) with a NUL
 * after them, so that text can be used as a string; *len (may be NULL)
 * gets the byte count without the NUL. Asserts. */
static inline uint8_t *th_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "open %s: %s", path, strerror(errno));
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0, "size of %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
    uint8_t *b = malloc((size_t)n + 1);
    cr_assert_not_null(b);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n, "read %s", path);
    fclose(f);
    b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

/* Create or truncate path and write exactly len bytes of data. Asserts. */
static inline void th_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "create %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, len, f), len, "write %s", path);
    cr_assert_eq(fclose(f), 0, "close %s", path);
}

/* The same with a string (without its NUL). */
static inline void th_write_str(const char *path, const char *s) { th_write_file(path, s, strlen(s)); }

/* ---- checksums ---- */

/* CRC-32C bit by bit (reflected polynomial 0x82F63B78), continuing from
 * crc (0 to start): the reference the fast paths are checked against. */
static inline uint32_t th_crc32c_ref(uint32_t crc, const void *p, size_t n) {
    const uint8_t *b = p;
    crc = ~crc;
    while (n--) {
        crc ^= *b++;
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1)));
    }
    return ~crc;
}

/* ---- random numbers ---- */

/* Each steps the state *s and returns the next value; the state must not
 * be 0 for the xorshifts. A test keeps its own state (seeded, so that a
 * failure repeats) and, usually, a one-line rnd() around one of these. */

/* Marsaglia's xorshift64 (13, 7, 17): returns the new state. */
static inline uint64_t th_xorshift64(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

/* Vigna's xorshift64* (12, 25, 27, then a multiply). */
static inline uint64_t th_xorshift64s(uint64_t *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* splitmix64 (any state, 0 included). */
static inline uint64_t th_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Knuth's MMIX linear congruential step: returns the new state (its low
 * bits are weak: use the high ones). */
static inline uint64_t th_lcg64(uint64_t *s) { return *s = *s * 6364136223846793005ull + 1442695040888963407ull; }

/* A double in [0, 1) from the top 53 bits of r. */
static inline double th_unit(uint64_t r) { return (double)(r >> 11) / 9007199254740992.0; }

/* The seed of a randomized test: $BALLAST_TEST_SEED when set (to repeat a
 * failure), else dflt; never 0. */
static inline uint64_t th_seed(uint64_t dflt) {
    const char *e = getenv("BALLAST_TEST_SEED");
    uint64_t s = e ? strtoull(e, NULL, 0) : dflt;
    return s ? s : 1;
}

#endif
