/* pool.h: ballastd's host memory pool.
 *
 * The pool is a byte budget (--pool-bytes) from which sealed memfd segments
 * are created on demand, each owned by one job (an opaque 64-bit owner id,
 * the store's job id). A segment is mapped whole into the service and into
 * the attached clients of its own job only, so no client can read, write or
 * punch holes in another job's memory. Segments are mlocked when
 * RLIMIT_MEMLOCK allows and optionally backed by 2 MiB huge pages. Blobs
 * live in regions carved out of their job's segments by an out-of-band
 * extent allocator per segment (extent.h): no allocator metadata is ever
 * stored inside the pool, because clients map it read-write. Every region
 * starts on a 4 KiB boundary and its length is a multiple of 4 KiB (O_DIRECT
 * and DMA need that); a region never crosses a segment boundary.
 *
 * Blobs smaller than segment_bytes share segments of segment_bytes (or of
 * what is left of the budget); a blob of segment_bytes or more gets a
 * segment of exactly its page-rounded size, which later holds only another
 * blob of that size, so no segment keeps a tail that nothing fits in. An
 * empty segment goes back to the budget when another allocation
 * needs the room (pool_alloc), or at once with pool_trim (a job's last blob
 * and session are gone); its pages are punched out first, so a client that
 * still maps it keeps only an empty file of its own job.
 *
 * Segment ids: a 32-bit id names a segment for its whole life and is never
 * given to another segment (slot + POOL_MAX_SEGS * generation), so a client
 * that maps segments by id cannot confuse a retired one with a new one.
 *
 * Clients only ever see (segment id, offset in segment, length); the
 * service turns that into a pointer with pool_ptr().
 *
 * Thread-safe: every function may be called from any thread. */
#ifndef BALLAST_POOL_H
#define BALLAST_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define POOL_ALIGN        4096u          /* region alignment and size granule, bytes */
#define POOL_MAX_SEGS     1024           /* most segments alive at once (all jobs) */
#define POOL_DEFAULT_SEG  (64ull << 20)  /* largest default segment size (segment_bytes 0) */
#define POOL_HUGE_2M      (2u << 20)     /* huge page size, bytes */

typedef struct pool pool_t;

/* Where a blob lives in the pool. */
typedef struct {
    uint32_t seg;    /* segment id (see above) */
    uint32_t _pad;   /* zero */
    uint64_t off;    /* offset inside the segment, bytes, multiple of POOL_ALIGN */
    uint64_t len;    /* region length, bytes, multiple of POOL_ALIGN (>= what was asked) */
} pool_region_t;

typedef enum {
    POOL_HUGE_OFF = 0, /* normal 4 KiB pages */
    POOL_HUGE_TRY,     /* 2 MiB huge pages when the kernel has them, else as POOL_HUGE_THP */
    POOL_HUGE_ON,      /* 2 MiB huge pages or fail */
    POOL_HUGE_THP,     /* normal pages collapsed into transparent huge pages when the kernel
                          allows (SHM_THP, common/shm.h), else normal pages */
} pool_huge_t;

typedef struct {
    uint64_t pool_bytes;    /* budget for all segments together, bytes (> 0); rounded up to the page size */
    uint64_t segment_bytes; /* size of a new segment, bytes (a larger blob gets a segment its size);
                               0 = a sixteenth of pool_bytes, at most POOL_DEFAULT_SEG and at
                               least pool_bytes / POOL_MAX_SEGS */
    pool_huge_t huge;       /* huge page policy */
    bool mlock;             /* try to mlock the segments (warn, do not fail, when refused) */
    const char *name;       /* memfd name prefix shown in /proc/PID/fd; NULL = "ballast-pool" */
} pool_config_t;

typedef struct {
    uint64_t total_bytes;    /* the budget, bytes */
    uint64_t used_bytes;     /* bytes in allocated regions */
    uint64_t free_bytes;     /* total - used, bytes (free space of segments + unassigned budget) */
    uint64_t segment_bytes;  /* bytes in segments (assigned to jobs) */
    uint64_t largest_free;   /* largest free extent in any segment, or the unassigned budget if larger */
    uint64_t free_extents;   /* number of free extents in segments */
    uint64_t used_regions;   /* number of allocated regions */
    double fragmentation;    /* 1 - largest_free / free_bytes; 0 when nothing or one extent is free */
    uint64_t allocs;         /* successful pool_alloc calls since open */
    uint64_t alloc_failures; /* pool_alloc calls that found no room */
    uint64_t segs_created;   /* segments created since open */
    uint64_t segs_retired;   /* segments given back to the budget */
    uint32_t nsegs;          /* segments alive */
    uint32_t owners;         /* distinct owners holding segments */
    bool mlocked;            /* all segments mlocked */
    bool huge;               /* segments backed by 2 MiB huge pages */
    bool thp;                /* segments on transparent huge pages: asked for (POOL_HUGE_THP, or
                                TRY without huge pages) and refused by none so far (a 2 MiB probe at
                                open, then every segment) */
    int thp_errno;           /* the last refusal (shm_thp_why explains it); 0: none */
    uint64_t thp_bytes;      /* bytes of live segments on transparent huge pages */
} pool_stats_t;

/* Check the configuration and set up an empty pool (no segment exists
 * until the first allocation). Returns 0 and *out, or -errno with a message
 * in err: -EINVAL (sizes), -ENOMEM. */
int pool_open(pool_t **out, const pool_config_t *cfg, char *err, size_t errlen);

/* Unmap and close every segment; NULL is a no-op. Regions still allocated
 * become invalid. */
void pool_close(pool_t *p);

/* Allocate a region of at least len bytes (len > 0), rounded up to
 * POOL_ALIGN, in a segment of owner (!= 0): first in its segments (good fit,
 * O(1) per segment, extent.h), else in a new segment of owner made from the
 * unassigned budget (empty segments of any owner are retired for it when
 * needed). A new segment is sealed, mapped and, with cfg.mlock, mlocked
 * (when RLIMIT_MEMLOCK forbids it: one warning that names the limit and the
 * fix, `--ulimit memlock=-1` for docker or `LimitMEMLOCK=infinity` for
 * systemd, and the pool works unlocked). Returns 0 and *r; -ENOMEM when
 * neither owner's segments nor the budget have room (the caller may evict
 * and retry; pool_explain says why); -EINVAL when len is 0, larger than the
 * budget, or owner is 0; -EMFILE when POOL_MAX_SEGS segments exist. */
int pool_alloc(pool_t *p, uint64_t owner, uint64_t len, pool_region_t *r);

/* A one-line reason why a len-byte allocation for owner fails now, into err. */
void pool_explain(pool_t *p, uint64_t owner, uint64_t len, char *err, size_t errlen);

/* Return a region from pool_alloc; neighbours that are free are coalesced.
 * Returns 0, or -EINVAL when r is not an allocated region of this pool
 * (start and length must match what pool_alloc gave; nothing is changed). */
int pool_free(pool_t *p, const pool_region_t *r);

/* Retire every empty segment of owner (0: of every owner) to the budget;
 * the number retired. */
uint32_t pool_trim(pool_t *p, uint64_t owner);

/* Pointer to the start of r in the service's mapping; NULL when r lies
 * outside a live segment. Does not check that r is allocated. */
void *pool_ptr(const pool_t *p, const pool_region_t *r);

/* Whether [off, off+len) lies inside live segment seg and seg belongs to
 * owner (len > 0). For validating offsets that come from clients. */
bool pool_range_ok(pool_t *p, uint64_t owner, uint32_t seg, uint64_t off, uint64_t len);

/* One live segment, for handing it to a client of its owner (SCM_RIGHTS). */
typedef struct {
    uint32_t id;      /* segment id */
    int fd;           /* the memfd: dup() it before the pool may retire it */
    uint64_t bytes;   /* size, bytes */
} pool_seg_info_t;

/* The live segments of owner, at most max, ids ascending, each fd dup()ed
 * (close them); returns how many (also when more exist). -errno when dup
 * fails (none left open). */
int pool_owner_segs(pool_t *p, uint64_t owner, pool_seg_info_t *out, int max);

/* Segment seg if it is live and belongs to owner: 0 and *out with a dup()ed
 * fd (close it); -ENOENT otherwise (also for another owner's segment). */
int pool_owner_seg(pool_t *p, uint64_t owner, uint32_t seg, pool_seg_info_t *out);

/* Bytes in owner's segments (0 when it has none). */
uint64_t pool_owner_bytes(pool_t *p, uint64_t owner);

/* Largest allocation that can ever succeed (the budget), bytes. */
uint64_t pool_max_alloc(const pool_t *p);

void pool_stats(pool_t *p, pool_stats_t *out);

#endif
