/* alloc.c: jemalloc-backed allocation with per-category accounting, see
 * alloc.h.
 *
 * Debian's jemalloc exports its API unprefixed (mallocx, sallocx, ...), and
 * since every program links it, plain malloc is jemalloc too. We still call
 * the explicit API so the accounting does not depend on which malloc won the
 * symbol race, and charge sallocx() (the usable size) so that a free takes
 * back exactly what its allocation added. Under ASan/TSan the sanitizer owns
 * malloc; jemalloc would hide blocks from it (and make reuse look like races),
 * so those builds use the system allocator and malloc_usable_size; so do runs
 * under valgrind, which cannot see mallocx blocks. */
#include "alloc.h"

#include <assert.h>
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BALLOC_SANITIZER 1
#else
#define BALLOC_SANITIZER 0
#endif
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#include <jemalloc/jemalloc.h>

/* ---- counters ---- */

typedef struct {
    uint64_t live_bytes, live_blocks, total_allocs, peak_bytes;
} __attribute__((aligned(64))) cat_counters_t; /* one cache line per category */

static cat_counters_t g_cat[ALLOC_NCATEGORIES];

static const char *cat_names[ALLOC_NCATEGORIES] = { "general", "rpc", "store", "model", "data" };

static inline cat_counters_t *cat_of(alloc_cat_t cat) {
    assert((unsigned)cat < ALLOC_NCATEGORIES && "balloc: category out of range");
    return &g_cat[(unsigned)cat < ALLOC_NCATEGORIES ? cat : ALLOC_GENERAL];
}

static void charge(alloc_cat_t cat, size_t bytes, int new_block) {
    cat_counters_t *c = cat_of(cat);
    uint64_t now = __atomic_add_fetch(&c->live_bytes, bytes, __ATOMIC_RELAXED);
    if (new_block) {
        __atomic_add_fetch(&c->live_blocks, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&c->total_allocs, 1, __ATOMIC_RELAXED);
    }
    uint64_t peak = __atomic_load_n(&c->peak_bytes, __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&c->peak_bytes, &peak, now, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void discharge(alloc_cat_t cat, size_t bytes, int drop_block) {
    cat_counters_t *c = cat_of(cat);
    __atomic_sub_fetch(&c->live_bytes, bytes, __ATOMIC_RELAXED);
    if (drop_block) __atomic_sub_fetch(&c->live_blocks, 1, __ATOMIC_RELAXED);
}

/* ---- backend: jemalloc's explicit API, or the system allocator ---- */

/* 1 when blocks go to the system allocator: sanitizer builds, and runs under
 * valgrind (which tracks malloc but not mallocx). Decided on first use and
 * fixed for the life of the process, so every block is freed by the
 * allocator that made it. */
static int g_system = -1;

static inline bool use_system(void) {
    int s = __atomic_load_n(&g_system, __ATOMIC_RELAXED);
    if (s < 0) {
        s = (BALLOC_SANITIZER || RUNNING_ON_VALGRIND) ? 1 : 0;
        __atomic_store_n(&g_system, s, __ATOMIC_RELAXED);
    }
    return s;
}

static void *be_alloc(size_t size, size_t align, bool zero) {
    if (!use_system()) return mallocx(size, (align > 1 ? MALLOCX_ALIGN(align) : 0) | (zero ? MALLOCX_ZERO : 0));
    void *p = NULL;
    if (align <= 16) p = zero ? calloc(size, 1) : malloc(size);
    else if (posix_memalign(&p, align, size) == 0 && zero) memset(p, 0, size);
    return p;
}
static void *be_realloc(void *p, size_t size) { return use_system() ? realloc(p, size) : rallocx(p, size, 0); }
static void be_free(void *p) {
    if (use_system()) free(p);
    else dallocx(p, 0);
}
static size_t be_usable(const void *p) { return use_system() ? malloc_usable_size((void *)p) : sallocx(p, 0); }

/* ---- public API ---- */

void *balloc_aligned(alloc_cat_t cat, size_t align, size_t size) {
    if (align == 0 || (align & (align - 1)) || align > ((size_t)1 << 30)) {
        errno = EINVAL;
        return NULL;
    }
    void *p = be_alloc(size ? size : 1, align, false);
    if (!p) { errno = ENOMEM; return NULL; }
    charge(cat, be_usable(p), 1);
    return p;
}

void *balloc_malloc(alloc_cat_t cat, size_t size) { return balloc_aligned(cat, 1, size); }

void *balloc_calloc(alloc_cat_t cat, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) { errno = ENOMEM; return NULL; }
    void *p = be_alloc(total ? total : 1, 1, true);
    if (!p) { errno = ENOMEM; return NULL; }
    charge(cat, be_usable(p), 1);
    return p;
}

void *balloc_realloc(alloc_cat_t cat, void *p, size_t size) {
    if (!p) return balloc_malloc(cat, size);
    if (size == 0) { balloc_free(cat, p); return NULL; }
    size_t old = be_usable(p);
    void *q = be_realloc(p, size);
    if (!q) { errno = ENOMEM; return NULL; } /* p is untouched and still charged */
    size_t now = be_usable(q);
    if (now >= old) charge(cat, now - old, 0);
    else discharge(cat, old - now, 0);
    return q;
}

void balloc_free(alloc_cat_t cat, void *p) {
    if (!p) return;
    discharge(cat, be_usable(p), 1);
    be_free(p);
}

size_t balloc_usable_size(const void *p) { return p ? be_usable(p) : 0; }

char *balloc_strdup(alloc_cat_t cat, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = balloc_malloc(cat, n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Read one size_t jemalloc statistic; 0 when absent (stats disabled). */
static uint64_t je_stat(const char *name) {
    size_t v = 0, sz = sizeof v;
    return mallctl(name, &v, &sz, NULL, 0) == 0 ? v : 0;
}

void balloc_stats(alloc_stats_t *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < ALLOC_NCATEGORIES; i++) {
        out->cat[i].live_bytes = __atomic_load_n(&g_cat[i].live_bytes, __ATOMIC_RELAXED);
        out->cat[i].live_blocks = __atomic_load_n(&g_cat[i].live_blocks, __ATOMIC_RELAXED);
        out->cat[i].total_allocs = __atomic_load_n(&g_cat[i].total_allocs, __ATOMIC_RELAXED);
        out->cat[i].peak_bytes = __atomic_load_n(&g_cat[i].peak_bytes, __ATOMIC_RELAXED);
        out->live_bytes += out->cat[i].live_bytes;
    }
    /* jemalloc caches its statistics; writing "epoch" refreshes them. */
    uint64_t epoch = 1;
    size_t esz = sizeof epoch;
    if (mallctl("epoch", &epoch, &esz, &epoch, esz) != 0) return;
    out->je_allocated = je_stat("stats.allocated");
    out->je_active = je_stat("stats.active");
    out->je_resident = je_stat("stats.resident");
    out->je_mapped = je_stat("stats.mapped");
    out->je_metadata = je_stat("stats.metadata");
}

const char *balloc_cat_name(alloc_cat_t cat) {
    return (unsigned)cat < ALLOC_NCATEGORIES ? cat_names[cat] : "invalid";
}

const char *balloc_backend(void) {
    if (!use_system()) return "jemalloc " JEMALLOC_VERSION;
    return BALLOC_SANITIZER ? "system (sanitizer build)" : "system (running under valgrind)";
}
