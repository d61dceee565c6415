/* alloc.h: allocation through jemalloc with per-category usage accounting.
 *
 * Every balloc_* call goes to jemalloc's explicit API (mallocx, rallocx,
 * sallocx, sdallocx), never to whatever malloc the process happens to have,
 * and charges the usable size of each block to one category. The counters are
 * atomic and exact: live bytes and live blocks per category, plus the total
 * number of allocations made. balloc_stats() also reports jemalloc's own
 * process-wide figures (stats.allocated, stats.resident, ...).
 *
 * Blocks from balloc_* must be released with balloc_free / balloc_realloc of
 * the same category, never with free(). Builds with ASan or TSan, and runs
 * under valgrind, use the system allocator so the tool sees every block. */
#ifndef BALLAST_ALLOC_H
#define BALLAST_ALLOC_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ALLOC_GENERAL = 0, /* anything without a better home */
    ALLOC_RPC,         /* gRPC messages, protobuf-c buffers */
    ALLOC_STORE,       /* ballastd index, sessions, staging buffers */
    ALLOC_MODEL,       /* host copies of parameters, activations, optimizer state */
    ALLOC_DATA,        /* token shards, batches */
    ALLOC_NCATEGORIES
} alloc_cat_t;

typedef struct {
    uint64_t live_bytes;  /* bytes now allocated (usable sizes) */
    uint64_t live_blocks; /* blocks now allocated */
    uint64_t total_allocs;/* allocations ever made (a realloc of a live block counts none) */
    uint64_t peak_bytes;  /* highest live_bytes seen since start */
} alloc_cat_stats_t;

typedef struct {
    alloc_cat_stats_t cat[ALLOC_NCATEGORIES];
    uint64_t live_bytes;  /* sum over categories */
    /* jemalloc's process-wide figures (bytes; 0 when unavailable). */
    uint64_t je_allocated; /* stats.allocated: bytes in use by the application */
    uint64_t je_active;    /* stats.active: bytes in active pages */
    uint64_t je_resident;  /* stats.resident: bytes in physically resident pages */
    uint64_t je_mapped;    /* stats.mapped: bytes in mapped chunks */
    uint64_t je_metadata;  /* stats.metadata: allocator bookkeeping */
} alloc_stats_t;

/* malloc / calloc / realloc / free charged to cat. They return NULL on
 * failure (size 0 allocates a minimal block; overflow in calloc fails).
 * balloc_realloc(cat, NULL, n) allocates; balloc_realloc(cat, p, 0) frees p
 * and returns NULL. */
void *balloc_malloc(alloc_cat_t cat, size_t size);
void *balloc_calloc(alloc_cat_t cat, size_t n, size_t size);
void *balloc_realloc(alloc_cat_t cat, void *p, size_t size);
void balloc_free(alloc_cat_t cat, void *p);

/* An allocation aligned to align bytes (a power of two; up to 1 GiB).
 * Release it with balloc_free. NULL on a bad alignment or out of memory. */
void *balloc_aligned(alloc_cat_t cat, size_t align, size_t size);

/* Usable size of a block from balloc_* (>= the size asked for). */
size_t balloc_usable_size(const void *p);

/* Duplicate a string into cat; NULL on failure. */
char *balloc_strdup(alloc_cat_t cat, const char *s);

/* Snapshot of all counters; refreshes jemalloc's statistics first. */
void balloc_stats(alloc_stats_t *out);

/* Short name of a category ("general", "rpc", ...). */
const char *balloc_cat_name(alloc_cat_t cat);

/* "jemalloc 5.3.0-...", or "system (...)" with the reason. Static string. */
const char *balloc_backend(void);

#endif
