/* jemalloc_stats.h: the process allocator's own figures (jemalloc), read
 * through mallctl, for /metrics and `ballast status`.
 *
 * ballastd and ballast-worker link jemalloc ahead of libc (Makefile,
 * JEMALLOC_LIBS), so their plain malloc/free are jemalloc's; this module
 * reads what jemalloc knows about that heap and checks that the binding
 * really happened. Programs that call into it link jemalloc; the `ballast`
 * CLI only formats figures it got over RPC (jemalloc_stats_fragmentation,
 * inline here); sanitizer builds get "not linked" answers
 * (BALLAST_NO_JEMALLOC).
 *
 * Fragmentation here is active / allocated - 1: the bytes of pages jemalloc
 * has handed blocks out of that hold no block, per byte allocated (0 = none).
 * It is redis's allocator_frag_ratio (active / allocated) minus 1; redis's
 * mem_fragmentation_ratio (RSS / allocated) also counts memory that is not
 * the allocator's and is not computed here. */
#ifndef BALLAST_JEMALLOC_STATS_H
#define BALLAST_JEMALLOC_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

#define JEMALLOC_STATS_ERR_LEN 256

typedef struct {
    uint64_t allocated; /* stats.allocated: bytes in blocks the program holds (size classes) */
    uint64_t active;    /* stats.active: bytes in pages that blocks are handed out of (>= allocated) */
    uint64_t resident;  /* stats.resident: bytes of jemalloc's memory in RAM (active, dirty, metadata) */
    uint64_t mapped;    /* stats.mapped: bytes in extents jemalloc has mapped for use (>= active) */
    uint64_t retained;  /* stats.retained: virtual memory given back to the OS but kept mapped for reuse */
    uint64_t metadata;  /* stats.metadata: jemalloc's own bookkeeping */
} jemalloc_stats_t;

/* jemalloc's version ("5.3.0-0-g54eaed1d..."), or NULL when jemalloc is not
 * linked into this program. Static string. */
const char *jemalloc_stats_version(void);

/* Refresh jemalloc's statistics (they are a snapshot taken at the last
 * "epoch" write) and read them into *out. 0, or -1 with the reason in err
 * (jemalloc not linked, or built without statistics); *out is zeroed then.
 * Safe from any thread (reads are serialized, so that each sees one
 * epoch). jemalloc merges its arenas' counters while other threads keep
 * allocating, so figures that hold for a quiet heap (active >= allocated,
 * resident and mapped >= active) can be off by the blocks allocated during
 * the read. */
int jemalloc_stats_read(jemalloc_stats_t *out, char *err, size_t errlen);

/* active / allocated - 1 (see above); 0 when nothing is allocated or when
 * a skewed read has active below allocated. */
static inline double jemalloc_stats_fragmentation(const jemalloc_stats_t *s) {
    if (s->active <= s->allocated) return 0.0; /* none, or a read skewed by other threads */
    return (double)s->active / (double)s->allocated - 1.0;
}

/* Whether this process's plain malloc() is jemalloc's: a block from malloc
 * must show up in jemalloc's per-thread count of bytes allocated
 * (thread.allocated, which other threads cannot disturb). Decided on the
 * first call (one malloc and free of 1 MiB) and remembered. When it is not,
 * false with the reason in why (may be NULL). */
bool jemalloc_stats_is_malloc(char *why, size_t len);

/* ---- /metrics ---- */

typedef struct jemalloc_metrics jemalloc_metrics_t;

/* Register in r the gauges ballast_jemalloc_{allocated,active,resident,
 * mapped,retained,metadata}_bytes, ballast_jemalloc_fragmentation_ratio and
 * ballast_jemalloc_info{version} = 1, refreshed from jemalloc_stats_read()
 * at every render (a collector). Only when jemalloc serves this process's
 * malloc: otherwise, or when the registry refuses, NULL with the reason in
 * err and nothing registered. The caller keeps the handle for
 * jemalloc_stats_metrics_free(), which unhooks the collector (the families
 * stay in r until r is freed). */
jemalloc_metrics_t *jemalloc_stats_metrics_init(metrics_registry_t *r, char *err, size_t errlen);
void jemalloc_stats_metrics_free(jemalloc_metrics_t *m);

#endif
