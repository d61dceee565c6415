/* test_gap.c: when ballastd expects a client's next request
 * (services/offload/gap.h): the window runs from the quickest to the
 * slowest of the last GAP_HIST gaps, scaled by the blob's KiB, at most
 * GAP_POLL_MAX_NS wide; none before 4 samples, for gaps the ring's spin
 * covers or beyond GAP_DUE_MAX_NS; GAP_MISSES misses turn a class off for
 * GAP_OFF answers. Random gaps, from a seed in the log. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "services/offload/gap.h"
#include "tests/unit/helpers.h"

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

Test(gap, window_spans_the_last_gaps_scaled_by_the_blob) {
    uint64_t seed = th_seed(0x9b05688c2b3e6c1full);
    for (int trial = 0; trial < 200; trial++) {
        gap_class_t g;
        memset(&g, 0, sizeof g);
        uint64_t scale = 1024 + rng(&seed) % 65536; /* a 1-64 MiB blob, in KiB */
        /* ns per KiB for a copy of 0.5-5 ms */
        uint64_t base = (500000 + rng(&seed) % 4500000) / scale + 1;
        int n = 4 + (int)(rng(&seed) % 20);
        uint32_t kept[64];
        int64_t from = 0, to = 0;
        for (int i = 0; i < n; i++) {
            if (i < 4) cr_assert(!gap_window(&g, scale, &from, &to), "a window after %d samples", i);
            uint64_t per = base + rng(&seed) % (base / 4 + 1);
            gap_record(&g, (int64_t)(per * scale), scale);
            kept[i] = (uint32_t)per;
        }
        uint32_t lo = UINT32_MAX, hi = 0;
        for (int i = n > (int)GAP_HIST ? n - (int)GAP_HIST : 0; i < n; i++) {
            if (kept[i] < lo) lo = kept[i];
            if (kept[i] > hi) hi = kept[i];
        }
        int64_t a = (int64_t)lo * (int64_t)scale, b = (int64_t)hi * (int64_t)scale;
        bool want = a > (int64_t)RING_SPIN_MAX_NS && a <= GAP_DUE_MAX_NS;
        cr_assert_eq(gap_window(&g, scale, &from, &to), want, "trial %d: lo %lld ns", trial, (long long)a);
        if (!want) continue;
        cr_assert_eq(from, a, "trial %d: window opens at %lld, the quickest gap was %lld", trial, (long long)from,
                     (long long)a);
        int64_t b_cap = b - a > GAP_POLL_MAX_NS ? a + GAP_POLL_MAX_NS : b;
        cr_assert_eq(to, b_cap + RING_AT_MARGIN_NS, "trial %d: window closes at %lld, want %lld", trial,
                     (long long)to, (long long)(b_cap + RING_AT_MARGIN_NS));
    }
}

Test(gap, no_window_for_short_long_or_unkept_gaps) {
    uint64_t seed = th_seed(0x510e527fade682d1ull);
    gap_class_t g;
    int64_t from = 0, to = 0;
    /* within the ring's spin */
    memset(&g, 0, sizeof g);
    for (int i = 0; i < 8; i++) gap_record(&g, 1 + (int64_t)(rng(&seed) % RING_SPIN_MAX_NS), 1);
    cr_assert(!gap_window(&g, 1, &from, &to), "a window for gaps the ring spins for");
    /* beyond GAP_DUE_MAX_NS */
    memset(&g, 0, sizeof g);
    for (int i = 0; i < 8; i++) gap_record(&g, GAP_DUE_MAX_NS + 1 + (int64_t)(rng(&seed) % GAP_DUE_MAX_NS), 1);
    cr_assert(!gap_window(&g, 1, &from, &to), "a window for gaps of over 20 ms");
    /* gaps beyond twice that, zero or negative are not kept */
    memset(&g, 0, sizeof g);
    gap_record(&g, 2 * (int64_t)GAP_DUE_MAX_NS + 1, 1);
    gap_record(&g, 0, 1);
    gap_record(&g, -5, 1);
    gap_record(&g, 1000000, 0);
    cr_assert_eq(g.n, 0, "%u samples kept out of four that should not be", g.n);
}

Test(gap, misses_turn_a_class_off_for_a_while) {
    uint64_t seed = th_seed(0x1f83d9abfb41bd6bull);
    gap_class_t g;
    memset(&g, 0, sizeof g);
    int64_t from = 0, to = 0, d = 300000 + (int64_t)(rng(&seed) % 1000000);
    for (int i = 0; i < 8; i++) gap_record(&g, d, 1);
    /* a catch between misses resets the count */
    for (unsigned i = 0; i + 1 < GAP_MISSES; i++) gap_waited(&g, false);
    gap_waited(&g, true);
    cr_assert(gap_window(&g, 1, &from, &to), "off after a catch");
    for (unsigned i = 0; i < GAP_MISSES; i++) {
        cr_assert(gap_window(&g, 1, &from, &to), "off after %u misses", i);
        gap_waited(&g, false);
    }
    for (unsigned i = 0; i < GAP_OFF; i++) cr_assert(!gap_window(&g, 1, &from, &to), "on again after %u answers", i);
    cr_assert(gap_window(&g, 1, &from, &to), "still off after %u answers", GAP_OFF);
    cr_assert_eq(from, d);
}
