/* pool.h: ballastd's host memory pool.
 *
 * The pool is one or more sealed memfd segments (each mapped whole into the
 * service and, after OpenSession, into every client), mlocked when
 * RLIMIT_MEMLOCK allows, optionally backed by 2 MiB huge pages. Blobs live in
 * regions carved out of the segments by an out-of-band extent allocator
 * (extent.h): no allocator metadata is ever stored inside the pool, because
 * clients map it read-write. Every region starts on a 4 KiB boundary and its
 * length is a multiple of 4 KiB (O_DIRECT and DMA need that); a region never
 * crosses a segment boundary.
 *
 * Clients only ever see (segment index, offset in segment, length); the
 * service turns that into a pointer with pool_ptr().
 *
 * Thread-safe: every function may be called from any thread. */
#ifndef BALLAST_POOL_H
#define BALLAST_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define POOL_ALIGN        4096u          /* region alignment and size granule, bytes */
#define POOL_MAX_SEGS     64             /* most segments in one pool */
#define POOL_HUGE_2M      (2u << 20)     /* huge page size, bytes */

typedef struct pool pool_t;

/* Where a blob lives in the pool. */
typedef struct {
    uint32_t seg;    /* segment index, 0 .. pool_nsegs()-1 */
    uint32_t _pad;   /* zero */
    uint64_t off;    /* offset inside the segment, bytes, multiple of POOL_ALIGN */
    uint64_t len;    /* region length, bytes, multiple of POOL_ALIGN (>= what was asked) */
} pool_region_t;

typedef enum {
    POOL_HUGE_OFF = 0, /* normal 4 KiB pages */
    POOL_HUGE_TRY,     /* 2 MiB huge pages when the kernel has them, else normal pages */
    POOL_HUGE_ON,      /* 2 MiB huge pages or fail */
} pool_huge_t;

typedef struct {
    uint64_t pool_bytes;    /* total size, bytes (> 0); rounded up to the page size */
    uint64_t segment_bytes; /* size of one segment, bytes; 0 = one segment for all */
    pool_huge_t huge;       /* huge page policy */
    bool mlock;             /* try to mlock the segments (warn, do not fail, when refused) */
    const char *name;       /* memfd name prefix shown in /proc/PID/fd; NULL = "ballast-pool" */
} pool_config_t;

typedef struct {
    uint64_t total_bytes;    /* sum of segment sizes, bytes */
    uint64_t used_bytes;     /* bytes in allocated regions */
    uint64_t free_bytes;     /* total - used, bytes */
    uint64_t largest_free;   /* largest free extent, bytes (the biggest allocation that fits now) */
    uint64_t free_extents;   /* number of free extents */
    uint64_t used_regions;   /* number of allocated regions */
    double fragmentation;    /* 1 - largest_free / free_bytes; 0 when nothing or one extent is free */
    uint64_t allocs;         /* successful pool_alloc calls since open */
    uint64_t alloc_failures; /* pool_alloc calls that found no room */
    uint32_t nsegs;          /* segments */
    bool mlocked;            /* all segments mlocked */
    bool huge;               /* segments backed by 2 MiB huge pages */
} pool_stats_t;

/* Create the segments, seal them, map them, mlock them when cfg->mlock (when
 * RLIMIT_MEMLOCK forbids it: one warning that names the limit and the fix,
 * `--ulimit memlock=-1` for docker or `LimitMEMLOCK=infinity` for systemd,
 * and the pool works unlocked). Returns 0 and *out, or -errno with a message
 * in err: -EINVAL (sizes), -ENOMEM (no memory or no huge pages with
 * POOL_HUGE_ON), other -errno of memfd_create/ftruncate/mmap. */
int pool_open(pool_t **out, const pool_config_t *cfg, char *err, size_t errlen);

/* Unmap and close every segment; NULL is a no-op. Regions still allocated
 * become invalid. */
void pool_close(pool_t *p);

/* Allocate a region of at least len bytes (len > 0), rounded up to
 * POOL_ALIGN. Returns 0 and *r, -ENOMEM when no free extent is large enough
 * (the caller may evict and retry), -EINVAL when len is 0 or larger than a
 * segment. Good-fit in O(1): the region comes from the smallest size class
 * that is guaranteed to hold it (extent.h). */
int pool_alloc(pool_t *p, uint64_t len, pool_region_t *r);

/* Return a region from pool_alloc; neighbours that are free are coalesced.
 * Returns 0, or -EINVAL when r is not an allocated region of this pool
 * (start and length must match what pool_alloc gave; nothing is changed). */
int pool_free(pool_t *p, const pool_region_t *r);

/* Pointer to the start of r in the service's mapping; NULL when r lies
 * outside the pool. Does not check that r is allocated. */
void *pool_ptr(const pool_t *p, const pool_region_t *r);

/* Whether [off, off+len) lies inside segment seg (len > 0). For validating
 * offsets that come from clients. */
bool pool_range_ok(const pool_t *p, uint32_t seg, uint64_t off, uint64_t len);

/* Segments, for handing them to clients (SCM_RIGHTS) and registering them
 * with io_uring. fd and base stay owned by the pool. */
uint32_t pool_nsegs(const pool_t *p);
int pool_seg_fd(const pool_t *p, uint32_t seg);         /* -1 when seg is out of range */
void *pool_seg_base(const pool_t *p, uint32_t seg);     /* NULL when out of range */
uint64_t pool_seg_bytes(const pool_t *p, uint32_t seg); /* 0 when out of range */

/* Largest allocation that can ever succeed (one segment), bytes. */
uint64_t pool_max_alloc(const pool_t *p);

void pool_stats(pool_t *p, pool_stats_t *out);

#endif
