/* test_pool.c: the pool's per-owner segments and its extent allocator:
 * random alloc/free sequences of three owners never overlap, stay aligned
 * and never share a segment, freeing everything coalesces back to one extent
 * per segment, exhaustion is reported cleanly and never hands one owner
 * another's memory, retired segments are emptied and their ids not reused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "services/offload/extent.h"
#include "services/offload/pool.h"
#include "shm.h"
#include "tests/unit/helpers.h"

static uint64_t rng_state;
static uint64_t rnd(void) { return th_xorshift64(&rng_state); }

typedef struct { pool_region_t r; uint8_t tag; } live_t;

static int cmp_region(const void *a, const void *b) {
    const pool_region_t *x = &((const live_t *)a)->r, *y = &((const live_t *)b)->r;
    if (x->seg != y->seg) return x->seg < y->seg ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

static void check_no_overlap(pool_t *p, live_t *v, size_t n) {
    live_t *c = malloc((n ? n : 1) * sizeof *c);
    memcpy(c, v, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_region);
    uint64_t used = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t owner = c[i].tag % 3 + 1;
        cr_assert(pool_range_ok(p, owner, c[i].r.seg, c[i].r.off, c[i].r.len), "region outside its owner's segment");
        cr_assert(!pool_range_ok(p, owner % 3 + 1, c[i].r.seg, c[i].r.off, c[i].r.len),
                  "another owner's range check accepts segment %u", c[i].r.seg);
        cr_assert_eq(c[i].r.off % POOL_ALIGN, 0, "offset %llu not 4 KiB aligned", (unsigned long long)c[i].r.off);
        cr_assert_eq(c[i].r.len % POOL_ALIGN, 0);
        cr_assert_eq((uintptr_t)pool_ptr(p, &c[i].r) % POOL_ALIGN, 0);
        if (i && c[i].r.seg == c[i - 1].r.seg) {
            cr_assert_leq(c[i - 1].r.off + c[i - 1].r.len, c[i].r.off, "regions overlap in segment %u",
                          c[i].r.seg);
            cr_assert_eq(c[i - 1].tag % 3, c[i].tag % 3, "two owners share segment %u", c[i].r.seg);
        }
        used += c[i].r.len;
    }
    pool_stats_t st;
    pool_stats(p, &st);
    cr_assert_eq(st.used_bytes, used, "stats say %llu used, regions sum to %llu",
                 (unsigned long long)st.used_bytes, (unsigned long long)used);
    cr_assert_eq(st.used_regions, n);
    cr_assert_leq(st.segment_bytes, st.total_bytes, "segments exceed the budget");
    free(c);
}

/* Three owners share a budget of 32 MiB in 8 MiB segments. */
Test(pool, random_alloc_free_never_overlap_and_coalesce) {
    rng_state = 0x5eed1234abcdull;
    pool_config_t cfg = { .pool_bytes = 32u << 20, .segment_bytes = 8u << 20, .mlock = false };
    pool_t *p;
    char err[256];
    cr_assert_eq(pool_open(&p, &cfg, err, sizeof err), 0, "%s", err);
    pool_stats_t st;
    pool_stats(p, &st);
    cr_assert_eq(st.nsegs, 0, "segments before any allocation");
    enum { CAP = 512 };
    live_t v[CAP];
    size_t n = 0;
    int fails = 0;
    for (int it = 0; it < 4000; it++) {
        bool do_alloc = n == 0 || (n < CAP && rnd() % 100 < 55);
        if (do_alloc) {
            /* Mostly small, sometimes up to a whole segment; lengths not 4 KiB multiples. */
            uint64_t len = rnd() % 8 == 0 ? 1 + rnd() % (8u << 20) : 1 + rnd() % (300u << 10);
            live_t l;
            l.tag = (uint8_t)(rnd() | 1);
            uint64_t owner = l.tag % 3 + 1;
            int rc = pool_alloc(p, owner, len, &l.r);
            if (rc == -ENOMEM) {
                pool_stats(p, &st);
                cr_assert_lt(st.total_bytes - st.segment_bytes, (len + 4095) / 4096 * 4096,
                             "alloc of %llu failed with %llu bytes of budget unassigned",
                             (unsigned long long)len, (unsigned long long)(st.total_bytes - st.segment_bytes));
                fails++;
                continue;
            }
            cr_assert_eq(rc, 0);
            cr_assert_geq(l.r.len, len);
            cr_assert_lt(l.r.len - len, POOL_ALIGN);
            memset(pool_ptr(p, &l.r), l.tag, l.r.len);
            v[n++] = l;
        } else {
            size_t i = rnd() % n;
            /* The bytes are intact: nobody else was handed this region. */
            const uint8_t *q = pool_ptr(p, &v[i].r);
            for (uint64_t k = 0; k < v[i].r.len; k += 509)
                cr_assert_eq(q[k], v[i].tag, "region overwritten at %llu", (unsigned long long)k);
            cr_assert_eq(pool_free(p, &v[i].r), 0);
            v[i] = v[--n];
        }
        if (it % 50 == 0) check_no_overlap(p, v, n);
    }
    check_no_overlap(p, v, n);
    cr_assert_gt(fails, 0, "the sequence never exhausted the pool; test too weak");
    while (n) cr_assert_eq(pool_free(p, &v[--n].r), 0);
    pool_stats(p, &st);
    cr_assert_eq(st.used_bytes, 0);
    cr_assert_gt(st.nsegs, 0);
    cr_assert_eq(st.free_extents, st.nsegs, "after a full free, %llu free extents in %u segments (want one each)",
                 (unsigned long long)st.free_extents, st.nsegs);
    cr_assert_eq(pool_trim(p, 0), st.nsegs, "trim left segments");
    pool_stats(p, &st);
    cr_assert_eq(st.nsegs, 0);
    cr_assert_eq(st.free_bytes, 32u << 20);
    /* The whole budget fits again, as one segment of one owner. */
    pool_region_t r;
    cr_assert_eq(pool_alloc(p, 2, 32u << 20, &r), 0);
    cr_assert_eq(r.off, 0);
    pool_close(p);
}

Test(pool, one_segment_returns_to_one_extent) {
    rng_state = 0x77aa55ull;
    pool_config_t cfg = { .pool_bytes = 4u << 20, .segment_bytes = 4u << 20 };
    pool_t *p;
    char err[256];
    cr_assert_eq(pool_open(&p, &cfg, err, sizeof err), 0, "%s", err);
    pool_region_t r[300];
    int n = 0;
    while (n < 300 && pool_alloc(p, 7, 4096 * (1 + rnd() % 5), &r[n]) == 0) n++;
    /* Free in a random order: coalescing must find left and right neighbours. */
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1));
        pool_region_t t = r[i]; r[i] = r[j]; r[j] = t;
    }
    for (int i = 0; i < n; i++) cr_assert_eq(pool_free(p, &r[i]), 0);
    pool_stats_t st;
    pool_stats(p, &st);
    cr_assert_eq(st.nsegs, 1);
    cr_assert_eq(st.free_extents, 1);
    cr_assert_eq(st.largest_free, 4u << 20);
    cr_assert_float_eq(st.fragmentation, 0.0, 1e-12);
    pool_close(p);
}

Test(pool, exhaustion_and_bad_frees_are_clean) {
    pool_config_t cfg = { .pool_bytes = 1u << 20, .segment_bytes = 1u << 20 };
    pool_t *p;
    char err[256];
    cr_assert_eq(pool_open(&p, &cfg, err, sizeof err), 0, "%s", err);
    pool_region_t r[256], x;
    int n = 0;
    while (pool_alloc(p, 1, 4096, &r[n]) == 0) n++;
    cr_assert_eq(n, 256);
    cr_assert_eq(pool_alloc(p, 1, 1, &x), -ENOMEM);
    cr_assert_eq(pool_alloc(p, 2, 1, &x), -ENOMEM, "another owner was given room in a full pool");
    pool_stats_t st;
    pool_stats(p, &st);
    cr_assert_eq(st.free_bytes, 0);
    cr_assert_eq(st.alloc_failures, 3); /* the one that ended the loop, and these two */
    cr_assert_eq(pool_alloc(p, 1, 0, &x), -EINVAL);
    cr_assert_eq(pool_alloc(p, 0, 1, &x), -EINVAL, "owner 0 accepted");
    cr_assert_eq(pool_alloc(p, 1, (1u << 20) + 1, &x), -EINVAL);
    /* Free every other one: 128 KiB-worth of holes of 4 KiB, 8 KiB does not fit. */
    for (int i = 0; i < n; i += 2) cr_assert_eq(pool_free(p, &r[i]), 0);
    pool_stats(p, &st);
    cr_assert_eq(st.largest_free, 4096);
    cr_assert_eq(st.free_extents, 128);
    cr_assert_float_eq(st.fragmentation, 1.0 - 1.0 / 128, 1e-9);
    cr_assert_eq(pool_alloc(p, 1, 8192, &x), -ENOMEM);
    /* the holes are owner 1's: owner 2 gets none of them */
    cr_assert_eq(pool_alloc(p, 2, 4096, &x), -ENOMEM, "owner 2 was handed a hole in owner 1's segment");
    pool_explain(p, 2, 4096, err, sizeof err);
    cr_assert(strstr(err, "other jobs' segments 1048576 bytes") && strstr(err, "unassigned budget 0"),
              "explanation: %s", err);
    /* Double free, wrong length, wrong segment, other generation, unaligned: refused, nothing changes. */
    cr_assert_eq(pool_free(p, &r[0]), -EINVAL);
    pool_region_t bad = r[1];
    bad.len = 8192;
    cr_assert_eq(pool_free(p, &bad), -EINVAL);
    bad = r[1]; bad.seg += 1;
    cr_assert_eq(pool_free(p, &bad), -EINVAL);
    bad = r[1]; bad.seg += POOL_MAX_SEGS;
    cr_assert_eq(pool_free(p, &bad), -EINVAL);
    cr_assert_null(pool_ptr(p, &bad), "a stale generation of the slot maps");
    bad = r[1]; bad.off += 100;
    cr_assert_eq(pool_free(p, &bad), -EINVAL);
    pool_stats_t st2;
    pool_stats(p, &st2);
    cr_assert_eq(st2.used_bytes, st.used_bytes);
    for (int i = 1; i < n; i += 2) cr_assert_eq(pool_free(p, &r[i]), 0);
    pool_stats(p, &st);
    cr_assert_eq(st.free_extents, 1);
    /* owner 1's segment is empty now: it is retired for owner 2, under a new id */
    cr_assert_eq(pool_alloc(p, 2, 1u << 20, &x), 0);
    cr_assert_neq(x.seg, r[1].seg, "a segment id was reused");
    cr_assert(!pool_range_ok(p, 1, x.seg, 0, 4096), "owner 1 may touch owner 2's new segment");
    pool_stats(p, &st);
    cr_assert_eq(st.segs_retired, 1);
    cr_assert_eq(st.nsegs, 1);
    pool_close(p);
}

Test(pool, segments_are_sealed_memfds_of_one_owner) {
    pool_config_t cfg = { .pool_bytes = 3u << 20, .segment_bytes = 2u << 20 };
    pool_t *p;
    char err[256];
    cr_assert_eq(pool_open(&p, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(pool_max_alloc(p), 3u << 20);
    pool_region_t a, b;
    cr_assert_eq(pool_alloc(p, 11, 4096, &a), 0);
    cr_assert_eq(pool_alloc(p, 22, 4096, &b), 0); /* the 1 MiB left of the budget */
    pool_seg_info_t si[4];
    cr_assert_eq(pool_owner_segs(p, 11, si, 4), 1);
    cr_assert_eq(si[0].id, a.seg);
    cr_assert_eq(si[0].bytes, 2u << 20);
    cr_assert_neq(ftruncate(si[0].fd, 4096), 0, "a sealed segment could be shrunk");
    close(si[0].fd);
    cr_assert_eq(pool_owner_segs(p, 22, si, 4), 1);
    cr_assert_eq(si[0].bytes, 1u << 20);
    close(si[0].fd);
    cr_assert_eq(pool_owner_segs(p, 33, si, 4), 0);
    cr_assert_eq(pool_owner_seg(p, 22, a.seg, &si[0]), -ENOENT, "owner 22 was handed owner 11's segment");
    cr_assert_eq(pool_owner_seg(p, 11, a.seg, &si[0]), 0);
    close(si[0].fd);
    cr_assert_eq(pool_owner_bytes(p, 11), 2u << 20);
    cr_assert(!pool_range_ok(p, 22, b.seg, (1u << 20) - 4096, 8192));
    cr_assert(pool_range_ok(p, 22, b.seg, (1u << 20) - 4096, 4096));
    cr_assert(!pool_range_ok(p, 11, b.seg, 0, 4096), "owner 11 may touch owner 22's segment");
    cr_assert(!pool_range_ok(p, 22, b.seg, UINT64_MAX - 10, 20), "offset overflow accepted");
    cr_assert(!pool_range_ok(p, 22, b.seg + 7, 0, 4096), "an unknown segment id accepted");
    /* a full budget: neither owner grows, and a segment in use is not retired */
    pool_region_t c;
    cr_assert_eq(pool_alloc(p, 22, 2u << 20, &c), -ENOMEM);
    cr_assert_eq(pool_trim(p, 0), 0, "a segment holding a region was retired");
    pool_close(p);
}

/* segment_bytes 0: a sixteenth of the budget, so that jobs share a pool */
Test(pool, default_segment_size_lets_jobs_share) {
    pool_config_t cfg = { .pool_bytes = 64u << 20 };
    pool_t *p;
    char err[256];
    cr_assert_eq(pool_open(&p, &cfg, err, sizeof err), 0, "%s", err);
    pool_region_t r;
    for (uint64_t job = 1; job <= 16; job++) cr_assert_eq(pool_alloc(p, job, 4096, &r), 0, "job %llu", (unsigned long long)job);
    cr_assert_eq(pool_alloc(p, 17, 4096, &r), -ENOMEM, "a 17th job found room in a full budget");
    cr_assert_eq(pool_owner_bytes(p, 5), 4u << 20);
    pool_close(p);
}

/* A retired segment's pages are punched out: a client that still maps it
 * sees zeros, never a later owner's bytes (it is another memfd anyway). */
Test(pool, retired_segment_is_emptied) {
    pool_config_t cfg = { .pool_bytes = 2u << 20 };
    pool_t *p;
    char err[256];
    cr_assert_eq(pool_open(&p, &cfg, err, sizeof err), 0, "%s", err);
    pool_region_t a, b;
    cr_assert_eq(pool_alloc(p, 1, 1u << 20, &a), 0);
    memset(pool_ptr(p, &a), 0xa5, 1u << 20);
    pool_seg_info_t si;
    cr_assert_eq(pool_owner_seg(p, 1, a.seg, &si), 0);
    uint8_t *m = mmap(NULL, si.bytes, PROT_READ, MAP_SHARED, si.fd, 0);
    cr_assert_neq(m, MAP_FAILED);
    cr_assert_eq(m[4095], 0xa5);
    cr_assert_eq(pool_free(p, &a), 0);
    cr_assert_eq(pool_alloc(p, 2, 2u << 20, &b), 0, "owner 2 did not get the retired budget");
    memset(pool_ptr(p, &b), 0x5a, 2u << 20);
    for (uint64_t k = 0; k < si.bytes; k += 4096)
        cr_assert_eq(m[k], 0, "a retired segment still holds bytes at %llu", (unsigned long long)k);
    munmap(m, si.bytes);
    close(si.fd);
    pool_close(p);
}

Test(pool, huge_pages_try_falls_back_and_on_fails_cleanly) {
    pool_config_t cfg = { .pool_bytes = 4u << 20, .huge = POOL_HUGE_TRY };
    pool_t *p;
    char err[256] = "";
    cr_assert_eq(pool_open(&p, &cfg, err, sizeof err), 0, "%s", err);
    pool_region_t r;
    cr_assert_eq(pool_alloc(p, 1, 4u << 20, &r), 0);
    pool_stats_t st;
    pool_stats(p, &st);
    bool had_huge = st.huge;
    if (!had_huge) /* TRY without huge pages goes on to transparent ones, or says why not */
        cr_assert(st.thp ? st.thp_bytes == (4u << 20) : st.thp_errno != 0, "thp %d, %llu bytes, errno %d", st.thp,
                  (unsigned long long)st.thp_bytes, st.thp_errno);
    pool_close(p);
    cfg.huge = POOL_HUGE_ON;
    cr_assert_eq(pool_open(&p, &cfg, err, sizeof err), 0, "%s", err);
    int rc = pool_alloc(p, 1, 4096, &r);
    if (had_huge) cr_assert_eq(rc, 0);
    else cr_assert_lt(rc, 0, "huge pages unavailable to TRY but ON succeeded");
    pool_close(p);
}

/* Fill len bytes at p from a seed; the first differing byte offset of a
 * check, or -1. */
static void fill_seeded(uint8_t *p, uint64_t len, uint64_t seed) {
    uint64_t s = seed | 1;
    for (uint64_t i = 0; i < len; i++) p[i] = (uint8_t)(th_xorshift64(&s) >> 32);
}
static long long differs(const uint8_t *p, uint64_t len, uint64_t seed) {
    uint64_t s = seed | 1;
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != (uint8_t)(th_xorshift64(&s) >> 32)) return (long long)i;
    return -1;
}

Test(pool, thp_segments_are_counted_used_and_retired) {
    pool_config_t cfg = { .pool_bytes = 16u << 20, .segment_bytes = 8u << 20, .huge = POOL_HUGE_THP };
    pool_t *p;
    char err[256] = "";
    cr_assert_eq(pool_open(&p, &cfg, err, sizeof err), 0, "%s", err);
    pool_stats_t st;
    pool_stats(p, &st);
    cr_assert_not(st.huge);
    cr_assert_eq(st.thp_bytes, 0, "no segment yet");
    if (!st.thp) {
        cr_assert_neq(st.thp_errno, 0, "refused without a reason");
        char why[256];
        snprintf(why, sizeof why, "the kernel refused transparent huge pages: %s", shm_thp_why(st.thp_errno));
        pool_close(p);
        cr_skip_test("%s", why);
    }
    rng_state = th_seed(0x7e1f00d5ull ^ (uint64_t)getpid());
    uint64_t seed = rnd();
    pool_region_t a, b, c, d;
    cr_assert_eq(pool_alloc(p, 1, 3u << 20, &a), 0);
    cr_assert_eq(pool_alloc(p, 1, 5u << 20, &b), 0);
    cr_assert_eq(pool_alloc(p, 2, 8u << 20, &c), 0);
    pool_stats(p, &st);
    cr_assert_eq(st.nsegs, 2);
    cr_assert(st.thp, "refused: %s", shm_thp_why(st.thp_errno));
    cr_assert_eq(st.thp_bytes, st.segment_bytes, "%llu of %llu segment bytes on huge pages",
                 (unsigned long long)st.thp_bytes, (unsigned long long)st.segment_bytes);
    pool_region_t *all[] = { &a, &b, &c };
    for (int i = 0; i < 3; i++) fill_seeded(pool_ptr(p, all[i]), all[i]->len, seed + (uint64_t)i);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(differs(pool_ptr(p, all[i]), all[i]->len, seed + (uint64_t)i), -1, "region %d", i);
    /* owner 1 lets go; owner 3 gets its budget in a fresh segment, on huge pages again */
    cr_assert_eq(pool_free(p, &a), 0);
    cr_assert_eq(pool_free(p, &b), 0);
    cr_assert_eq(pool_alloc(p, 3, 8u << 20, &d), 0, "owner 3 did not get the retired budget");
    fill_seeded(pool_ptr(p, &d), d.len, ~seed);
    cr_assert_eq(differs(pool_ptr(p, &d), d.len, ~seed), -1);
    cr_assert_eq(differs(pool_ptr(p, &c), c.len, seed + 2), -1, "owner 2's bytes changed");
    pool_stats(p, &st);
    cr_assert_geq(st.segs_retired, 1);
    cr_assert_eq(st.nsegs, 2);
    cr_assert_eq(st.thp_bytes, st.segment_bytes, "%llu of %llu segment bytes on huge pages after a retire",
                 (unsigned long long)st.thp_bytes, (unsigned long long)st.segment_bytes);
    pool_close(p);
}

/* The allocator alone, with its internal invariants checked after every step. */
Test(extent, random_ops_keep_invariants) {
    rng_state = 0xfeedbeef01ull;
    ext_alloc_t *a = ext_new(4096);
    cr_assert_not_null(a);
    cr_assert_eq(ext_add_span(a, 0, 64 * 4096), 0);
    cr_assert_eq(ext_add_span(a, 1000 * 4096, 200 * 4096), 1);
    cr_assert_eq(ext_add_span(a, 10 * 4096, 4096), -EINVAL, "overlapping span accepted");
    uint64_t offs[400];
    int n = 0;
    for (int it = 0; it < 3000; it++) {
        if (n < 400 && (n == 0 || rnd() % 2)) {
            uint64_t off;
            if (ext_alloc(a, 4096 * (1 + rnd() % 40) - rnd() % 4096, &off) == 0) offs[n++] = off;
        } else {
            int i = (int)(rnd() % (uint64_t)n);
            cr_assert_eq(ext_free(a, offs[i], NULL), 0);
            offs[i] = offs[--n];
        }
        int c = ext_check(a);
        cr_assert_eq(c, 0, "invariant broken (check line %d) at step %d", -c, it);
    }
    while (n) cr_assert_eq(ext_free(a, offs[--n], NULL), 0);
    cr_assert_eq(ext_check(a), 0);
    /* Reserve exact ranges (restart path), then they cannot be reserved twice. */
    cr_assert_eq(ext_reserve(a, 1010 * 4096, 3 * 4096), 0);
    cr_assert_eq(ext_reserve(a, 1011 * 4096, 4096), -EEXIST);
    cr_assert_eq(ext_reserve(a, 1199 * 4096, 2 * 4096), -EEXIST, "range past the span accepted");
    cr_assert_eq(ext_used_len(a, 1010 * 4096), 3 * 4096);
    cr_assert_eq(ext_check(a), 0);
    ext_stats_t st;
    ext_stats(a, &st);
    cr_assert_eq(st.used, 3 * 4096);
    cr_assert_eq(st.free_extents, 3);
    cr_assert_eq(ext_free(a, 1010 * 4096, NULL), 0);
    ext_stats(a, &st);
    cr_assert_eq(st.free_extents, 2);
    cr_assert_eq(st.largest_free, 200 * 4096);
    ext_destroy(a);
}

/* An exact-size request that no rounded-up class guarantees must still be
 * found (the pool's last free extent of precisely that size). */
Test(extent, exact_fit_of_odd_sizes) {
    for (uint64_t g = 17; g < 5000; g = g * 3 + 1) {
        ext_alloc_t *a = ext_new(4096);
        cr_assert_geq(ext_add_span(a, 0, g * 4096), 0);
        uint64_t off;
        cr_assert_eq(ext_alloc(a, g * 4096, &off), 0, "exact fit of %llu pages failed", (unsigned long long)g);
        cr_assert_eq(ext_alloc(a, 1, &off), -ENOMEM);
        ext_destroy(a);
    }
}

/* With RLIMIT_MEMLOCK too low (and no CAP_IPC_LOCK to override it) the pool
 * still opens, unlocked, with one warning that names the fix. */
Test(pool, mlock_refused_warns_with_the_fix) {
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("AddressSanitizer replaces mlock with a no-op that always succeeds");
#endif
    struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
    struct __user_cap_data_struct caps[2];
    if (syscall(SYS_capget, &hdr, caps) == 0) {
        caps[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
        if (syscall(SYS_capset, &hdr, caps) != 0) cr_skip_test("cannot drop CAP_IPC_LOCK: %s", strerror(errno));
    }
    struct rlimit rl = { 64 << 10, 64 << 10 };
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) cr_skip_test("cannot lower RLIMIT_MEMLOCK: %s", strerror(errno));
    char tmpl[] = "/tmp/ballast-test-pool-log-XXXXXX";
    int lfd = mkstemp(tmpl);
    cr_assert_geq(lfd, 0);
    unlink(tmpl);
    int saved = dup(2);
    dup2(lfd, 2);
    pool_config_t cfg = { .pool_bytes = 4u << 20, .mlock = true };
    pool_t *p;
    char err[256];
    int rc = pool_open(&p, &cfg, err, sizeof err);
    pool_region_t r;
    int arc = rc ? -1 : pool_alloc(p, 1, 4u << 20, &r); /* the first segment is mlocked (or not) here */
    dup2(saved, 2);
    close(saved);
    cr_assert_eq(rc, 0, "pool refused to start unlocked: %s", err);
    cr_assert_eq(arc, 0, "no segment without mlock");
    pool_stats_t st;
    pool_stats(p, &st);
    cr_assert(!st.mlocked);
    memset(pool_ptr(p, &r), 0x3c, 4u << 20);
    pool_close(p);
    char log[2048] = "";
    ssize_t n = pread(lfd, log, sizeof log - 1, 0);
    close(lfd);
    cr_assert_gt(n, 0, "no warning logged");
    log[n] = 0;
    cr_assert(strstr(log, "RLIMIT_MEMLOCK is 65536 bytes") != NULL, "warning lacks the limit: %s", log);
    cr_assert(strstr(log, "--ulimit memlock=-1") != NULL, "warning lacks the docker fix: %s", log);
    cr_assert(strstr(log, "LimitMEMLOCK=infinity") != NULL, "warning lacks the systemd fix: %s", log);
}
