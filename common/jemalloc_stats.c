/* jemalloc_stats.c: jemalloc's figures through mallctl, the check that
 * malloc is jemalloc's, and their /metrics gauges. See jemalloc_stats.h.
 *
 * Debian's libjemalloc2 exports its API unprefixed (malloc, mallctl, ...).
 * A program that links this file links jemalloc (Makefile, JEMALLOC_LIBS);
 * sanitizer builds, whose malloc is the sanitizer's, compile it with
 * BALLAST_NO_JEMALLOC and get "not linked" answers. */
#include "jemalloc_stats.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef BALLAST_NO_JEMALLOC
#include <jemalloc/jemalloc.h>
#define HAVE_JEMALLOC true
#else
#include <errno.h>
#define HAVE_JEMALLOC false
static int mallctl(const char *name, void *old, size_t *oldlen, void *new, size_t newlen) {
    (void)name, (void)old, (void)oldlen, (void)new, (void)newlen;
    return ENOENT;
}
#endif

#define PROBE_BYTES ((size_t)1 << 20) /* the is-malloc check's block: above the tcache limit */

static const char NOT_LINKED[] =
    "jemalloc is not linked into this program (ballastd and ballast-worker link it; sanitizer builds leave it out)";

/* ---- reading ---- */

const char *jemalloc_stats_version(void) {
    if (!HAVE_JEMALLOC) return NULL;
    const char *v = NULL;
    size_t sz = sizeof v;
    return mallctl("version", &v, &sz, NULL, 0) == 0 ? v : NULL;
}

/* One size_t statistic into *v; -1 when jemalloc does not know it. */
static int stat_read(const char *name, uint64_t *v) {
    size_t x = 0, sz = sizeof x;
    if (mallctl(name, &x, &sz, NULL, 0) != 0) return -1;
    *v = x;
    return 0;
}

/* The epoch write and the reads after it make one snapshot only if no
 * other thread writes the epoch in between (a scrape and a Stats call). */
static pthread_mutex_t g_read_lock = PTHREAD_MUTEX_INITIALIZER;

static int read_locked(jemalloc_stats_t *out, char *err, size_t errlen) {
    /* Statistics are a snapshot taken when "epoch" is written. */
    uint64_t epoch = 1;
    size_t esz = sizeof epoch;
    if (mallctl("epoch", &epoch, &esz, &epoch, esz) != 0) {
        snprintf(err, errlen, "jemalloc refused mallctl(\"epoch\"): cannot refresh its statistics");
        return -1;
    }
    struct { const char *name; uint64_t *v; } f[] = {
        { "stats.allocated", &out->allocated }, { "stats.active", &out->active },
        { "stats.resident", &out->resident },   { "stats.mapped", &out->mapped },
        { "stats.retained", &out->retained },   { "stats.metadata", &out->metadata },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (stat_read(f[i].name, f[i].v) != 0) {
            snprintf(err, errlen, "jemalloc has no %s: it was built without statistics (--enable-stats); "
                     "use a jemalloc that has them (Debian's libjemalloc2 does)", f[i].name);
            memset(out, 0, sizeof *out);
            return -1;
        }
    }
    return 0;
}

int jemalloc_stats_read(jemalloc_stats_t *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (!HAVE_JEMALLOC) { snprintf(err, errlen, "%s", NOT_LINKED); return -1; }
    pthread_mutex_lock(&g_read_lock);
    int rc = read_locked(out, err, errlen);
    pthread_mutex_unlock(&g_read_lock);
    return rc;
}

/* ---- is malloc jemalloc's? ---- */

static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static bool g_is_malloc;
static char g_why[JEMALLOC_STATS_ERR_LEN];

static int thread_allocated(uint64_t *v) {
    size_t sz = sizeof *v;
    return mallctl("thread.allocated", v, &sz, NULL, 0);
}

static void probe(void) {
    if (!HAVE_JEMALLOC) { snprintf(g_why, sizeof g_why, "%s", NOT_LINKED); return; }
    uint64_t before = 0, after = 0;
    if (thread_allocated(&before) != 0) {
        snprintf(g_why, sizeof g_why, "jemalloc has no thread.allocated: it was built without statistics");
        return;
    }
    char *volatile p = malloc(PROBE_BYTES); /* volatile: the compiler may not drop the pair */
    if (!p) { snprintf(g_why, sizeof g_why, "malloc of %zu bytes failed", PROBE_BYTES); return; }
    p[0] = 1;
    int rc = thread_allocated(&after);
    free(p);
    if (rc != 0 || after - before < PROBE_BYTES) {
        snprintf(g_why, sizeof g_why, "malloc is not jemalloc's in this process: a %zu-byte malloc did not show in "
                 "jemalloc's thread.allocated (another allocator comes first: a sanitizer, LD_PRELOAD, or "
                 "jemalloc linked after libc)", PROBE_BYTES);
        return;
    }
    g_is_malloc = true;
}

bool jemalloc_stats_is_malloc(char *why, size_t len) {
    pthread_once(&g_probe_once, probe);
    if (!g_is_malloc && why && len) snprintf(why, len, "%s", g_why);
    return g_is_malloc;
}

/* ---- /metrics ---- */

struct jemalloc_metrics {
    metrics_registry_t *reg;
    metric_t *allocated, *active, *resident, *mapped, *retained, *metadata; /* bytes */
    metric_t *frag;                                                         /* ratio */
};

static void collect(void *arg) {
    jemalloc_metrics_t *m = arg;
    jemalloc_stats_t s;
    char err[JEMALLOC_STATS_ERR_LEN];
    if (jemalloc_stats_read(&s, err, sizeof err) != 0) return; /* keep the last figures */
    metric_set(m->allocated, (double)s.allocated);
    metric_set(m->active, (double)s.active);
    metric_set(m->resident, (double)s.resident);
    metric_set(m->mapped, (double)s.mapped);
    metric_set(m->retained, (double)s.retained);
    metric_set(m->metadata, (double)s.metadata);
    metric_set(m->frag, jemalloc_stats_fragmentation(&s));
}

jemalloc_metrics_t *jemalloc_stats_metrics_init(metrics_registry_t *r, char *err, size_t errlen) {
    if (!r) { snprintf(err, errlen, "jemalloc_stats_metrics_init: no registry"); return NULL; }
    char why[JEMALLOC_STATS_ERR_LEN];
    if (!jemalloc_stats_is_malloc(why, sizeof why)) {
        snprintf(err, errlen, "no allocator figures in /metrics: %s", why);
        return NULL;
    }
    const char *version = jemalloc_stats_version();
    jemalloc_metrics_t *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, errlen, "out of memory"); return NULL; }
    m->reg = r;
#define GAUGE(f, name, help) if (!(m->f = metrics_gauge(r, name, help, err, errlen))) goto fail
    GAUGE(allocated, "ballast_jemalloc_allocated_bytes",
          "Bytes in heap blocks the process holds (jemalloc stats.allocated, size classes)");
    GAUGE(active, "ballast_jemalloc_active_bytes",
          "Bytes in the pages jemalloc hands blocks out of (stats.active; at least allocated)");
    GAUGE(resident, "ballast_jemalloc_resident_bytes",
          "Bytes of jemalloc's memory resident in RAM: active and dirty pages, metadata (stats.resident)");
    GAUGE(mapped, "ballast_jemalloc_mapped_bytes", "Bytes in the extents jemalloc has mapped for use (stats.mapped)");
    GAUGE(retained, "ballast_jemalloc_retained_bytes",
          "Virtual memory jemalloc returned to the OS but keeps mapped for reuse (stats.retained; not resident)");
    GAUGE(metadata, "ballast_jemalloc_metadata_bytes", "Bytes of jemalloc's own bookkeeping (stats.metadata)");
    GAUGE(frag, "ballast_jemalloc_fragmentation_ratio",
          "Bytes of active pages holding no block per byte allocated (active / allocated - 1)");
#undef GAUGE
    metric_family_t *info = metrics_register(r, METRIC_GAUGE, "ballast_jemalloc_info",
                                             "jemalloc serves this process's malloc; its version (always 1)",
                                             (const char *[]){ "version" }, 1, NULL, 0, err, errlen);
    metric_t *one = info ? metrics_series(info, (const char *[]){ version ? version : "unknown" }) : NULL;
    if (!one) {
        if (info) snprintf(err, errlen, "out of memory creating ballast_jemalloc_info");
        goto fail;
    }
    metric_set(one, 1);
    collect(m); /* figures from the start, even before the first scrape */
    if (metrics_add_collector(r, collect, m) != 0) {
        snprintf(err, errlen, "too many collectors on this metrics registry");
        goto fail;
    }
    return m;
fail:
    free(m);
    return NULL;
}

void jemalloc_stats_metrics_free(jemalloc_metrics_t *m) {
    if (!m) return;
    metrics_remove_collector(m->reg, collect, m);
    free(m);
}
