/* test_job_name.c: the one job-name rule (common/job_name.h) against a
 * reference written here: the length boundaries 0/1/63/64, every byte
 * value in every position class, and random valid and invalid names. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "job_name.h"

static const char ALLOWED[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";

/* Reference: the rule spelt out, independent of the code under test. */
static bool ref_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 63) return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr(ALLOWED, s[i])) return false;
    return true;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static void fill_valid(char *b, size_t n) {
    for (size_t i = 0; i < n; i++) b[i] = ALLOWED[rnd() % (sizeof ALLOWED - 1)];
    b[n] = 0;
}

Test(job_name, length_boundaries) {
    char b[80];
    cr_assert(!job_name_ok(NULL), "NULL is not a name");
    cr_assert(!job_name_ok(""), "0 characters");
    fill_valid(b, 1);
    cr_assert(job_name_ok(b), "1 character: '%s'", b);
    fill_valid(b, 63);
    cr_assert(job_name_ok(b), "63 characters: '%s'", b);
    fill_valid(b, 64);
    cr_assert(!job_name_ok(b), "64 characters: '%s'", b);
    fill_valid(b, 79);
    cr_assert(!job_name_ok(b), "79 characters");
    cr_assert_eq(JOB_NAME_MAX, 63);
    cr_assert(strstr(JOB_NAME_RULE, "63") && strstr(JOB_NAME_RULE, "[A-Za-z0-9._-]"));
}

Test(job_name, examples) {
    cr_assert(job_name_ok("llama-7b_run.3"));
    cr_assert(job_name_ok("ballast-train"));
    cr_assert(job_name_ok("..."), "dots alone are a name (no path meaning here)");
    cr_assert(!job_name_ok("a b"));
    cr_assert(!job_name_ok("a/b"));
    cr_assert(!job_name_ok("bad/job"));
    cr_assert(!job_name_ok("tab\there"));
    cr_assert(!job_name_ok("caf\xc3\xa9"), "non-ASCII");
}

/* Every byte 1..255 alone, and in the first, a middle and the last place
 * of a 63-character name. */
Test(job_name, every_byte_in_every_place) {
    for (int c = 1; c < 256; c++) {
        bool want = strchr(ALLOWED, c) != NULL;
        char one[2] = { (char)c, 0 };
        cr_assert_eq(job_name_ok(one), want, "byte 0x%02x alone", c);
        for (size_t pos = 0; pos < 63; pos += 31) {
            char b[64];
            fill_valid(b, 63);
            b[pos] = (char)c;
            cr_assert_eq(job_name_ok(b), want, "byte 0x%02x at %zu", c, pos);
        }
    }
}

Test(job_name, random_names_match_the_reference) {
    char b[100];
    int valid = 0, invalid = 0;
    for (int it = 0; it < 20000; it++) {
        size_t n = (size_t)(rnd() % 70);
        fill_valid(b, n);
        /* half of them get one to three random bytes anywhere (maybe still valid) */
        if (n && (rnd() & 1))
            for (int k = 0, m = 1 + (int)(rnd() % 3); k < m; k++) b[rnd() % n] = (char)(1 + rnd() % 255);
        bool want = ref_ok(b);
        cr_assert_eq(job_name_ok(b), want, "'%s' (%zu chars): want %s", b, n, want ? "valid" : "invalid");
        if (want) valid++;
        else invalid++;
    }
    cr_assert(valid > 1000 && invalid > 1000, "the draw covers both sides (%d valid, %d invalid)", valid, invalid);
}
