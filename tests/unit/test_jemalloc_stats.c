/* test_jemalloc_stats.c: common/jemalloc_stats.h. The test programs link
 * jemalloc as ballastd and ballast-worker do (Makefile, JEMALLOC_LIBS), so
 * these check the real binding: plain malloc, and libc's own allocations,
 * land in jemalloc; its statistics follow allocations once refreshed; the
 * fragmentation figure follows a heap made sparse on purpose; and the
 * /metrics gauges mirror all of it at every render.
 *
 * Sanitizer builds leave jemalloc out (the sanitizer owns malloc): the
 * tests that need it skip there, saying so. */
#include <criterion/criterion.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "jemalloc_stats.h"
#include "metrics.h"
#include "tests/unit/helpers.h"

#include <jemalloc/jemalloc.h>
#ifdef BALLAST_NO_JEMALLOC
/* sanitizer builds link no jemalloc: every test skips at need_jemalloc()
 * before it would call these */
static int no_mallctl(const char *n, void *o, size_t *ol, void *nv, size_t nl) {
    (void)n, (void)o, (void)ol, (void)nv, (void)nl;
    return -1;
}
static size_t no_sallocx(void *p, int flags) { (void)p, (void)flags; return 0; }
#define mallctl no_mallctl
#define sallocx no_sallocx
#endif

#define BIG ((size_t)64 << 20)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { return th_splitmix64(&rng); }

/* Skip (loudly) where jemalloc is not this process's malloc. */
static void need_jemalloc(void) {
    char why[JEMALLOC_STATS_ERR_LEN];
    if (jemalloc_stats_is_malloc(why, sizeof why)) return;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    cr_skip_test("sanitizer build: %s", why);
#else
    cr_assert_fail("this test program should run on jemalloc: %s", why);
#endif
}

static uint64_t thread_allocated(void) {
    uint64_t v = 0;
    size_t sz = sizeof v;
    cr_assert_eq(mallctl("thread.allocated", &v, &sz, NULL, 0), 0, "mallctl(thread.allocated)");
    return v;
}

static uint64_t raw_stat(const char *name) { /* no epoch refresh */
    size_t v = 0, sz = sizeof v;
    cr_assert_eq(mallctl(name, &v, &sz, NULL, 0), 0, "mallctl(%s)", name);
    return v;
}

static void read_ok(jemalloc_stats_t *s) {
    char err[JEMALLOC_STATS_ERR_LEN];
    cr_assert_eq(jemalloc_stats_read(s, err, sizeof err), 0, "%s", err);
}

/* jemalloc's own invariants on one snapshot (see its manual). */
static void invariants(const jemalloc_stats_t *s) {
    cr_assert_gt(s->allocated, 0);
    cr_assert_geq(s->active, s->allocated, "active %llu < allocated %llu", (unsigned long long)s->active,
                  (unsigned long long)s->allocated);
    cr_assert_geq(s->resident, s->active, "resident %llu < active %llu", (unsigned long long)s->resident,
                  (unsigned long long)s->active);
    cr_assert_geq(s->mapped, s->active, "mapped %llu < active %llu", (unsigned long long)s->mapped,
                  (unsigned long long)s->active);
    cr_assert_gt(s->metadata, 0);
    cr_assert_eq(s->active % 4096, 0, "active is whole pages");
}

/* The value of sample `name` (name with labels, if any) in exposition t. */
static double sample(const char *t, const char *name) {
    char want[256];
    snprintf(want, sizeof want, "\n%s ", name);
    const char *p = strstr(t, want);
    cr_assert_not_null(p, "no sample %s in\n%s", name, t);
    return strtod(p + strlen(want), NULL);
}

static char *render(metrics_registry_t *r) {
    char *t = NULL;
    cr_assert_eq(metrics_render(r, &t, NULL), 0);
    return t;
}

/* ---- the binding ---- */

Test(jemalloc_stats, version_is_the_linked_jemalloc) {
    need_jemalloc();
    const char *v = jemalloc_stats_version();
    cr_assert_not_null(v);
    cr_assert_str_eq(v, JEMALLOC_VERSION, "library %s, header %s", v, JEMALLOC_VERSION);
    cr_assert(strncmp(v, "5.", 2) == 0, "jemalloc 5 expected, got %s", v);
}

Test(jemalloc_stats, plain_malloc_and_libc_land_in_jemalloc) {
    need_jemalloc();
    /* every block of random size from malloc is counted by jemalloc, exactly
     * at its usable size (its size class): only jemalloc's malloc does that */
    for (int i = 0; i < 300; i++) {
        size_t n = 1 + rnd() % ((rnd() & 1) ? 4096 : (4u << 20));
        uint64_t a = thread_allocated();
        char *volatile p = malloc(n);
        uint64_t b = thread_allocated();
        cr_assert_not_null(p);
        p[n - 1] = 1;
        cr_assert_eq(b - a, malloc_usable_size(p), "malloc(%zu): thread.allocated +%llu, usable %zu", n,
                     (unsigned long long)(b - a), malloc_usable_size(p));
        cr_assert_eq(sallocx(p, 0), malloc_usable_size(p));
        free(p);
    }
    /* calloc, realloc, the aligned ones, and libc's internal mallocs (strdup)
     * go the same way (volatile: the compiler may drop an unused pair) */
    uint64_t a = thread_allocated();
    void *volatile c = calloc(1000, 1000);
    cr_assert_geq(thread_allocated() - a, 1000000, "calloc");
    a = thread_allocated();
    void *volatile r = realloc(c, 3000000);
    cr_assert_geq(thread_allocated() - a, 3000000, "realloc");
    a = thread_allocated();
    void *m = NULL;
    cr_assert_eq(posix_memalign(&m, 1 << 16, 200000), 0);
    cr_assert_geq(thread_allocated() - a, 200000, "posix_memalign");
    cr_assert_eq((uintptr_t)m % (1 << 16), 0);
    a = thread_allocated();
    void *volatile al = aligned_alloc(4096, 409600);
    cr_assert_geq(thread_allocated() - a, 409600, "aligned_alloc");
    char big[70000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    a = thread_allocated();
    char *volatile d = strdup(big);
    cr_assert_geq(thread_allocated() - a, sizeof big, "strdup (inside libc)");
    cr_assert_eq(sallocx(d, 0), malloc_usable_size(d));
    free(r); free(m); free(al); free(d);
}

/* ---- reading ---- */

Test(jemalloc_stats, read_refreshes_the_snapshot) {
    need_jemalloc();
    jemalloc_stats_t a, b;
    read_ok(&a);
    uint64_t raw0 = raw_stat("stats.allocated");
    char *volatile p = malloc(BIG);
    cr_assert_not_null(p);
    p[0] = 1;
    /* without an epoch write jemalloc answers from the old snapshot */
    cr_assert_eq(raw_stat("stats.allocated"), raw0, "stats.allocated moved without an epoch refresh");
    read_ok(&b);
    cr_assert_geq(b.allocated, a.allocated + BIG, "read did not refresh: %llu -> %llu",
                  (unsigned long long)a.allocated, (unsigned long long)b.allocated);
    free(p);
}

Test(jemalloc_stats, figures_follow_a_big_allocation) {
    need_jemalloc();
    jemalloc_stats_t a, b, c;
    read_ok(&a);
    invariants(&a);
    char *p = malloc(BIG);
    cr_assert_not_null(p);
    memset(p, 0x77, BIG); /* make it resident */
    read_ok(&b);
    invariants(&b);
    cr_assert_geq(b.allocated, a.allocated + BIG, "allocated %llu -> %llu after %zu bytes",
                  (unsigned long long)a.allocated, (unsigned long long)b.allocated, BIG);
    cr_assert_geq(b.active, a.active + BIG);
    cr_assert_geq(b.resident, a.resident + BIG / 2, "resident %llu -> %llu", (unsigned long long)a.resident,
                  (unsigned long long)b.resident);
    cr_assert_geq(b.mapped, a.mapped + BIG / 2);
    free(p);
    read_ok(&c);
    invariants(&c);
    cr_assert_leq(c.allocated + BIG, b.allocated, "allocated %llu -> %llu after free",
                  (unsigned long long)b.allocated, (unsigned long long)c.allocated);
}

/* One thread of the test below: random mallocs and frees, a read after
 * each, checked against jemalloc's invariants and against this thread's
 * own count. Writes the first failure into fail.
 *
 * jemalloc merges its per-arena counters one after another while the other
 * threads go on: a block another thread allocates between two of those
 * reads shows in one figure and not yet in the other. A read takes
 * microseconds and blocks are at most 1 MiB (1.25 MiB with the size class),
 * so each of the other threads gets a block or two in: SKEW allows 2 MiB
 * per thread. (Seen: 48 KiB.) */
#define NREADERS 6
#define SKEW ((uint64_t)NREADERS * (2u << 20))
typedef struct {
    uint64_t seed;
    char fail[320];
} reader_t;

static void *reader(void *arg) {
    reader_t *w = arg;
    void *live[64] = { 0 };
    char err[JEMALLOC_STATS_ERR_LEN];
    if (!jemalloc_stats_is_malloc(err, sizeof err)) { snprintf(w->fail, sizeof w->fail, "%s", err); return NULL; }
    for (int i = 0; i < 400 && !w->fail[0]; i++) {
        th_lcg64(&w->seed);
        int k = (int)((w->seed >> 33) % 64);
        size_t n = 1 + (size_t)((w->seed >> 20) % (1u << 20));
        free(live[k]);
        uint64_t a = 0, b = 0;
        size_t sz = sizeof a;
        mallctl("thread.allocated", &a, &sz, NULL, 0);
        live[k] = malloc(n);
        mallctl("thread.allocated", &b, &sz, NULL, 0);
        if (!live[k] || b - a < n) { snprintf(w->fail, sizeof w->fail, "malloc(%zu) not seen by jemalloc", n); break; }
        jemalloc_stats_t s;
        if (jemalloc_stats_read(&s, err, sizeof err) != 0) { snprintf(w->fail, sizeof w->fail, "%s", err); break; }
        if (s.active + SKEW < s.allocated || s.resident + SKEW < s.active || s.mapped + SKEW < s.active ||
            s.allocated < n)
            snprintf(w->fail, sizeof w->fail, "snapshot breaks the invariants: allocated %llu active %llu "
                     "resident %llu mapped %llu", (unsigned long long)s.allocated, (unsigned long long)s.active,
                     (unsigned long long)s.resident, (unsigned long long)s.mapped);
    }
    for (int k = 0; k < 64; k++) free(live[k]);
    return NULL;
}

Test(jemalloc_stats, reads_from_many_threads_keep_the_invariants) {
    need_jemalloc();
    enum { NT = NREADERS };
    pthread_t th[NT];
    reader_t w[NT];
    for (int i = 0; i < NT; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].seed = rnd();
        cr_assert_eq(pthread_create(&th[i], NULL, reader, &w[i]), 0);
    }
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NT; i++) cr_assert_eq(w[i].fail[0], 0, "thread %d: %s", i, w[i].fail);
}

/* ---- fragmentation ---- */

Test(jemalloc_stats, fragmentation_is_active_over_allocated_minus_one) {
    jemalloc_stats_t s = { 0 };
    cr_assert_eq(jemalloc_stats_fragmentation(&s), 0.0, "nothing allocated: 0, not NaN");
    for (int i = 0; i < 1000; i++) {
        s.allocated = 1 + rnd() % (1ull << 40);
        s.active = s.allocated + rnd() % (s.allocated * 3 + 1);
        double want = (double)s.active / (double)s.allocated - 1.0;
        cr_assert_eq(jemalloc_stats_fragmentation(&s), want, "active %llu allocated %llu",
                     (unsigned long long)s.active, (unsigned long long)s.allocated);
        cr_assert_geq(jemalloc_stats_fragmentation(&s), 0.0);
    }
    s.allocated = 8192; s.active = 4096;
    cr_assert_eq(jemalloc_stats_fragmentation(&s), 0.0, "a read skewed by other threads: 0, not negative");
    s.allocated = 4096; s.active = 4096;
    cr_assert_eq(jemalloc_stats_fragmentation(&s), 0.0, "every active byte allocated: none");
    s.active = 3 * 4096;
    cr_assert_eq(jemalloc_stats_fragmentation(&s), 2.0);
}

/* A heap of 64-byte blocks with 15 of every 16 freed keeps its pages (each
 * still holds a block) while its allocated bytes drop 16-fold: the figure
 * must rise by about that much. */
Test(jemalloc_stats, fragmentation_follows_a_sparse_heap) {
    need_jemalloc();
    enum { N = 1 << 18 };
    /* the block table outside jemalloc, so that it does not count */
    void **b = mmap(NULL, N * sizeof *b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(b, MAP_FAILED);
    jemalloc_stats_t full, sparse, after;
    for (int i = 0; i < N; i++) cr_assert_not_null(b[i] = malloc(64));
    read_ok(&full);
    for (int i = 0; i < N; i++) if (i % 16) { free(b[i]); b[i] = NULL; }
    read_ok(&sparse);
    double f0 = jemalloc_stats_fragmentation(&full), f1 = jemalloc_stats_fragmentation(&sparse);
    /* 16 MiB of blocks over a base heap of about 1 MiB: with 1 MiB of them
     * left the figure is near 17 / 2 - 1 = 7.5 */
    cr_assert_lt(f0, 0.5, "a dense heap of equal blocks: fragmentation %.3f", f0);
    cr_assert_gt(f1, 4.0, "15/16 of the blocks freed, pages kept: fragmentation only %.3f (allocated %llu, active %llu)",
                 f1, (unsigned long long)sparse.allocated, (unsigned long long)sparse.active);
    cr_assert_geq(sparse.active + (1u << 20), full.active - (1u << 20), "pages with a live block stay active");
    for (int i = 0; i < N; i++) free(b[i]);
    munmap(b, N * sizeof *b);
    read_ok(&after);
    cr_assert_lt(after.active, sparse.active, "freeing the rest gives pages back");
}

/* ---- /metrics ---- */

static const char *const FAMILIES[] = {
    "ballast_jemalloc_allocated_bytes", "ballast_jemalloc_active_bytes",   "ballast_jemalloc_resident_bytes",
    "ballast_jemalloc_mapped_bytes",    "ballast_jemalloc_retained_bytes", "ballast_jemalloc_metadata_bytes",
    "ballast_jemalloc_fragmentation_ratio", "ballast_jemalloc_info",
};

Test(jemalloc_stats, metrics_mirror_the_heap_at_every_render) {
    need_jemalloc();
    char err[JEMALLOC_STATS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    jemalloc_metrics_t *m = jemalloc_stats_metrics_init(r, err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    char *t = render(r);
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++) {
        char want[128];
        snprintf(want, sizeof want, "# TYPE %s gauge\n", FAMILIES[i]);
        cr_assert(strstr(t, want), "no %s in\n%s", want, t);
    }
    char info[160];
    snprintf(info, sizeof info, "ballast_jemalloc_info{version=\"%s\"}", jemalloc_stats_version());
    cr_assert_eq(sample(t, info), 1.0);
    /* one snapshot per render: the ratio is exactly that of the two gauges */
    double al = sample(t, "ballast_jemalloc_allocated_bytes"), ac = sample(t, "ballast_jemalloc_active_bytes");
    cr_assert_eq(sample(t, "ballast_jemalloc_fragmentation_ratio"), ac / al - 1.0);
    cr_assert_geq(sample(t, "ballast_jemalloc_resident_bytes"), ac);
    cr_assert_geq(sample(t, "ballast_jemalloc_mapped_bytes"), ac);
    cr_assert_gt(sample(t, "ballast_jemalloc_metadata_bytes"), 0);
    free(t);
    char *volatile p = malloc(BIG);
    p[0] = 1;
    t = render(r);
    cr_assert_geq(sample(t, "ballast_jemalloc_allocated_bytes"), al + (double)BIG, "the render did not refresh");
    free(t);
    free(p);
    t = render(r);
    cr_assert_lt(sample(t, "ballast_jemalloc_allocated_bytes"), al + (double)BIG, "the free did not show");
    free(t);
    jemalloc_stats_metrics_free(m);
    metrics_registry_free(r);
}

Test(jemalloc_stats, metrics_carry_the_rank_and_stop_on_free) {
    need_jemalloc();
    char err[JEMALLOC_STATS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    cr_assert_eq(metrics_set_const_label(r, "rank", "3", err, sizeof err), 0, "%s", err);
    jemalloc_metrics_t *m = jemalloc_stats_metrics_init(r, err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    char *t = render(r);
    double before = sample(t, "ballast_jemalloc_allocated_bytes{rank=\"3\"}");
    cr_assert_gt(before, 0);
    free(t);
    jemalloc_stats_metrics_free(m); /* unhooked: the gauges keep their last values */
    char *volatile p = malloc(BIG);
    p[0] = 1;
    t = render(r);
    cr_assert_eq(sample(t, "ballast_jemalloc_allocated_bytes{rank=\"3\"}"), before, "updated after free");
    free(t);
    free(p);
    metrics_registry_free(r);
}
