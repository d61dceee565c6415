/* test_alloc.c: balloc_* accounting stays exact under random concurrent
 * alloc/realloc/free sequences, sizes and alignments are honoured, and
 * jemalloc's own statistics see our allocations. */
#include <criterion/criterion.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <jemalloc/jemalloc.h>

#include "alloc.h"

/* Sanitizer builds and valgrind runs use the system allocator. */
static bool system_backend(void) { return strncmp(balloc_backend(), "system", 6) == 0; }

/* Usable size straight from the allocator, not through balloc. */
static size_t real_usable(void *p) { return system_backend() ? malloc_usable_size(p) : sallocx(p, 0); }

static uint64_t rnd(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* Size distribution: mostly small, some medium, a few large. */
static size_t rand_size(uint64_t *s) {
    uint64_t r = rnd(s);
    switch (r % 8) {
    case 0: return 0;
    case 1: case 2: case 3: return 1 + (r >> 8) % 256;
    case 4: case 5: return 1 + (r >> 8) % 16384;
    case 6: return 1 + (r >> 8) % (256 << 10);
    default: return 1 + (r >> 8) % (2 << 20);
    }
}

typedef struct { void *p; size_t req; alloc_cat_t cat; unsigned char tag; } blk_t;

typedef struct {
    uint64_t seed;
    int ops;
    bool free_all;      /* free every live block at the end */
    blk_t *blk;         /* live blocks of this thread */
    int nblk;
    uint64_t bytes[ALLOC_NCATEGORIES], blocks[ALLOC_NCATEGORIES], allocs[ALLOC_NCATEGORIES];
    char fail[256];     /* first failure seen, "" if none */
} worker_t;

#define MAX_LIVE 256

static void pattern(blk_t *b, size_t n) { if (n) memset(b->p, b->tag, n < 64 ? n : 64); }
static bool pattern_ok(const blk_t *b, size_t n) {
    const unsigned char *q = b->p;
    for (size_t i = 0; i < n && i < 64; i++) if (q[i] != b->tag) return false;
    return true;
}

static void *worker(void *arg) {
    worker_t *w = arg;
    w->blk = calloc(MAX_LIVE, sizeof *w->blk);
    for (int op = 0; op < w->ops && !w->fail[0]; op++) {
        uint64_t r = rnd(&w->seed);
        int kind = (int)(r % 10);
        if (w->nblk == MAX_LIVE && kind < 5) kind = 9;
        if (w->nblk == 0) kind = 0;
        if (kind < 5) { /* allocate: malloc, calloc or aligned */
            blk_t b = { .cat = (alloc_cat_t)((r >> 8) % ALLOC_NCATEGORIES), .req = rand_size(&w->seed),
                        .tag = (unsigned char)(1 + (r >> 16) % 255) };
            if (kind < 3) b.p = balloc_malloc(b.cat, b.req);
            else if (kind == 3) b.p = balloc_calloc(b.cat, 1 + b.req / 8, 8), b.req = (1 + b.req / 8) * 8;
            else b.p = balloc_aligned(b.cat, (size_t)1 << ((r >> 24) % 13), b.req);
            if (!b.p) { snprintf(w->fail, sizeof w->fail, "allocation of %zu failed", b.req); break; }
            size_t u = real_usable(b.p);
            if (u < b.req) { snprintf(w->fail, sizeof w->fail, "usable %zu < requested %zu", u, b.req); break; }
            pattern(&b, b.req);
            w->bytes[b.cat] += u; w->blocks[b.cat]++; w->allocs[b.cat]++;
            w->blk[w->nblk++] = b;
        } else if (kind < 8) { /* realloc a random live block */
            blk_t *b = &w->blk[(r >> 8) % w->nblk];
            if (!pattern_ok(b, b->req)) { snprintf(w->fail, sizeof w->fail, "block content damaged before realloc"); break; }
            size_t old = real_usable(b->p), n = 1 + rand_size(&w->seed);
            void *q = balloc_realloc(b->cat, b->p, n);
            if (!q) { snprintf(w->fail, sizeof w->fail, "realloc to %zu failed", n); break; }
            b->p = q;
            size_t keep = b->req < n ? b->req : n;
            if (!pattern_ok(b, keep)) { snprintf(w->fail, sizeof w->fail, "realloc lost the contents"); break; }
            b->req = n;
            pattern(b, n);
            w->bytes[b->cat] += real_usable(q) - old; /* modular arithmetic: fine for shrinking too */
        } else { /* free a random live block */
            int i = (int)((r >> 8) % w->nblk);
            blk_t b = w->blk[i];
            if (!pattern_ok(&b, b.req)) { snprintf(w->fail, sizeof w->fail, "block content damaged before free"); break; }
            w->bytes[b.cat] -= real_usable(b.p); w->blocks[b.cat]--;
            balloc_free(b.cat, b.p);
            w->blk[i] = w->blk[--w->nblk];
        }
    }
    if (w->free_all) {
        while (w->nblk) {
            blk_t b = w->blk[--w->nblk];
            w->bytes[b.cat] -= real_usable(b.p); w->blocks[b.cat]--;
            balloc_free(b.cat, b.p);
        }
    }
    return NULL;
}

static void run_threads(int nthreads, int ops, bool free_all, worker_t *w) {
    pthread_t th[8];
    for (int i = 0; i < nthreads; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].seed = 0x1234567ULL * (uint64_t)(i + 1) ^ 0xA5A5A5A5DEADBEEFULL;
        w[i].ops = ops;
        w[i].free_all = free_all;
        cr_assert_eq(pthread_create(&th[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < nthreads; i++) cr_assert_eq(w[i].fail[0], 0, "thread %d: %s", i, w[i].fail);
}

Test(alloc, counters_match_shadow_tally_across_threads) {
    enum { NT = 4 };
    alloc_stats_t before, mid, after;
    balloc_stats(&before);
    worker_t w[NT];
    run_threads(NT, 6000, false, w);
    balloc_stats(&mid);
    uint64_t total_live = 0;
    for (int c = 0; c < ALLOC_NCATEGORIES; c++) {
        uint64_t bytes = 0, blocks = 0, allocs = 0;
        for (int i = 0; i < NT; i++) { bytes += w[i].bytes[c]; blocks += w[i].blocks[c]; allocs += w[i].allocs[c]; }
        cr_assert_eq(mid.cat[c].live_bytes - before.cat[c].live_bytes, bytes,
                     "%s: counter says %llu live bytes, shadow tally %llu", balloc_cat_name(c),
                     (unsigned long long)(mid.cat[c].live_bytes - before.cat[c].live_bytes), (unsigned long long)bytes);
        cr_assert_eq(mid.cat[c].live_blocks - before.cat[c].live_blocks, blocks, "%s: live blocks", balloc_cat_name(c));
        cr_assert_eq(mid.cat[c].total_allocs - before.cat[c].total_allocs, allocs, "%s: allocation count", balloc_cat_name(c));
        cr_assert_geq(mid.cat[c].peak_bytes, mid.cat[c].live_bytes, "%s: peak below live", balloc_cat_name(c));
        cr_assert_gt(blocks, 0, "%s: the random sequence left no live block: test too weak", balloc_cat_name(c));
        total_live += bytes;
    }
    cr_assert_eq(mid.live_bytes - before.live_bytes, total_live);
    /* free everything: every category returns to its starting point */
    for (int i = 0; i < NT; i++) {
        for (int k = 0; k < w[i].nblk; k++) balloc_free(w[i].blk[k].cat, w[i].blk[k].p);
        free(w[i].blk);
    }
    balloc_stats(&after);
    for (int c = 0; c < ALLOC_NCATEGORIES; c++) {
        cr_assert_eq(after.cat[c].live_bytes, before.cat[c].live_bytes, "%s: bytes leaked in the counter", balloc_cat_name(c));
        cr_assert_eq(after.cat[c].live_blocks, before.cat[c].live_blocks, "%s: blocks leaked in the counter", balloc_cat_name(c));
    }
}

Test(alloc, threads_freeing_everything_return_to_zero) {
    enum { NT = 8 };
    worker_t w[NT];
    alloc_stats_t before, after;
    balloc_stats(&before);
    run_threads(NT, 3000, true, w);
    balloc_stats(&after);
    for (int c = 0; c < ALLOC_NCATEGORIES; c++) {
        cr_assert_eq(after.cat[c].live_bytes, before.cat[c].live_bytes, "%s", balloc_cat_name(c));
        cr_assert_eq(after.cat[c].live_blocks, before.cat[c].live_blocks, "%s", balloc_cat_name(c));
        cr_assert_gt(after.cat[c].total_allocs, before.cat[c].total_allocs, "%s", balloc_cat_name(c));
    }
    for (int i = 0; i < NT; i++) free(w[i].blk);
}

Test(alloc, aligned_allocations_are_aligned) {
    uint64_t s = 0xFEEDFACE12345ULL;
    for (int i = 0; i < 500; i++) {
        size_t align = (size_t)1 << (rnd(&s) % 22); /* 1 B .. 2 MiB */
        size_t size = rand_size(&s);
        void *p = balloc_aligned(ALLOC_MODEL, align, size);
        cr_assert_not_null(p, "align %zu size %zu", align, size);
        cr_assert_eq((uintptr_t)p % align, 0, "align %zu size %zu: got %p", align, size, p);
        cr_assert_geq(real_usable(p), size);
        cr_assert_eq(balloc_usable_size(p), real_usable(p));
        memset(p, 0x5A, size);
        balloc_free(ALLOC_MODEL, p);
    }
    errno = 0;
    cr_assert_null(balloc_aligned(ALLOC_MODEL, 24, 100), "alignment 24 is not a power of two");
    cr_assert_eq(errno, EINVAL);
    cr_assert_null(balloc_aligned(ALLOC_MODEL, 0, 100));
}

Test(alloc, calloc_zeroes_and_checks_overflow) {
    uint64_t s = 0xABCDEF987ULL;
    for (int i = 0; i < 50; i++) {
        size_t n = 1 + rnd(&s) % 100000;
        unsigned char *d = balloc_malloc(ALLOC_DATA, n);
        cr_assert_not_null(d);
        memset(d, 0xEE, n);
        balloc_free(ALLOC_DATA, d);
        unsigned char *z = balloc_calloc(ALLOC_DATA, n, 1);
        cr_assert_not_null(z);
        for (size_t k = 0; k < n; k++) cr_assert_eq(z[k], 0, "byte %zu of %zu not zero", k, n);
        balloc_free(ALLOC_DATA, z);
    }
    alloc_stats_t a, b;
    balloc_stats(&a);
    cr_assert_null(balloc_calloc(ALLOC_DATA, SIZE_MAX / 2, 3), "n x size overflows");
    balloc_stats(&b);
    cr_assert_eq(a.cat[ALLOC_DATA].live_bytes, b.cat[ALLOC_DATA].live_bytes);
    cr_assert_eq(a.cat[ALLOC_DATA].total_allocs, b.cat[ALLOC_DATA].total_allocs);
}

Test(alloc, realloc_edge_cases) {
    alloc_stats_t a, b;
    balloc_stats(&a);
    char *p = balloc_realloc(ALLOC_RPC, NULL, 100); /* acts as malloc */
    cr_assert_not_null(p);
    balloc_stats(&b);
    cr_assert_eq(b.cat[ALLOC_RPC].live_blocks, a.cat[ALLOC_RPC].live_blocks + 1);
    cr_assert_eq(b.cat[ALLOC_RPC].live_bytes, a.cat[ALLOC_RPC].live_bytes + real_usable(p));
    cr_assert_null(balloc_realloc(ALLOC_RPC, p, 0)); /* acts as free */
    balloc_stats(&b);
    cr_assert_eq(b.cat[ALLOC_RPC].live_blocks, a.cat[ALLOC_RPC].live_blocks);
    cr_assert_eq(b.cat[ALLOC_RPC].live_bytes, a.cat[ALLOC_RPC].live_bytes);
    balloc_free(ALLOC_RPC, NULL); /* no-op */
    char *s = balloc_strdup(ALLOC_GENERAL, "ballast");
    cr_assert_str_eq(s, "ballast");
    balloc_free(ALLOC_GENERAL, s);
    cr_assert_str_eq(balloc_cat_name(ALLOC_STORE), "store");
}

Test(alloc, jemalloc_stats_follow_a_big_allocation) {
    if (system_backend()) cr_skip_test("balloc uses the system allocator here (%s): jemalloc's stats do not see it", balloc_backend());
    cr_assert(strncmp(balloc_backend(), "jemalloc", 8) == 0, "backend %s", balloc_backend());
    const size_t big = 64u << 20;
    alloc_stats_t a, b, c;
    balloc_stats(&a);
    cr_assert_gt(a.je_resident, 0, "jemalloc reports no resident memory: stats disabled?");
    void *p = balloc_malloc(ALLOC_STORE, big);
    cr_assert_not_null(p);
    memset(p, 0x77, big); /* make it resident */
    balloc_stats(&b);
    cr_assert_geq(b.je_allocated, a.je_allocated + big, "stats.allocated %llu -> %llu after %zu bytes",
                  (unsigned long long)a.je_allocated, (unsigned long long)b.je_allocated, big);
    cr_assert_geq(b.je_resident, a.je_resident + big / 2, "stats.resident %llu -> %llu",
                  (unsigned long long)a.je_resident, (unsigned long long)b.je_resident);
    cr_assert_geq(b.je_active, b.je_allocated);
    cr_assert_geq(b.je_mapped, b.je_active);
    cr_assert_gt(b.je_metadata, 0);
    cr_assert_geq(b.cat[ALLOC_STORE].live_bytes, a.cat[ALLOC_STORE].live_bytes + big);
    balloc_free(ALLOC_STORE, p);
    balloc_stats(&c);
    cr_assert_leq(c.je_allocated + big, b.je_allocated, "stats.allocated %llu -> %llu after free",
                  (unsigned long long)b.je_allocated, (unsigned long long)c.je_allocated);
    cr_assert_geq(c.cat[ALLOC_STORE].peak_bytes, big);
}
