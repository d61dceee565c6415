/* extent.h: an out-of-band extent allocator over offset ranges.
 *
 * Hands out [off, off+len) ranges from a set of spans (pool segments, spill
 * files) in one 64-bit offset space. All bookkeeping lives in ordinary heap
 * memory, never inside the managed ranges: the pool is mapped read-write by
 * clients, and spill files are not memory at all.
 *
 * Segregated fit in the manner of TLSF: free extents sit in size classes
 * (power-of-two ranges split into 16 linear sub-classes, one bit per class
 * in two bitmaps), so finding a fitting extent and freeing one are O(1).
 * Every extent, free or used, is linked to its address neighbours inside its
 * span, which makes coalescing on free O(1); used extents are found by
 * offset through a hash table. Extents never merge across spans.
 *
 * Not thread-safe: the owner (pool.c, tier_nvme.c) holds a lock. */
#ifndef BALLAST_EXTENT_H
#define BALLAST_EXTENT_H

#include <stdint.h>

typedef struct ext_alloc ext_alloc_t;

typedef struct {
    uint64_t total;        /* bytes in all spans */
    uint64_t used;         /* bytes in used extents */
    uint64_t free;         /* bytes in free extents */
    uint64_t largest_free; /* bytes in the largest free extent */
    uint64_t free_extents; /* number of free extents */
    uint64_t used_extents; /* number of used extents */
} ext_stats_t;

/* A new allocator whose sizes and offsets are multiples of granule (a power
 * of two >= 1). NULL when out of memory or granule is bad. */
ext_alloc_t *ext_new(uint64_t granule);
void ext_destroy(ext_alloc_t *a);

/* Add the span [base, base+len) (both multiples of granule, len > 0, not
 * overlapping an earlier span) as one free extent. Returns the span index
 * (>= 0) or -EINVAL / -ENOMEM. */
int ext_add_span(ext_alloc_t *a, uint64_t base, uint64_t len);

/* Allocate len bytes (rounded up to the granule). 0 and *off, -EINVAL when
 * len is 0, -ENOMEM when no free extent is large enough. */
int ext_alloc(ext_alloc_t *a, uint64_t len, uint64_t *off);

/* Mark exactly [off, off+len) used (after a restart: space of blobs that are
 * already on disk). The range must lie inside one free extent.
 * 0, -EINVAL (misaligned, len 0) or -EEXIST (overlaps used space or no span). */
int ext_reserve(ext_alloc_t *a, uint64_t off, uint64_t len);

/* Free the used extent that starts at off; *len (may be NULL) gets its
 * length. 0 or -EINVAL when no used extent starts at off. */
int ext_free(ext_alloc_t *a, uint64_t off, uint64_t *len);

/* Length of the used extent starting at off, 0 when there is none. */
uint64_t ext_used_len(const ext_alloc_t *a, uint64_t off);

void ext_stats(const ext_alloc_t *a, ext_stats_t *out);

/* Walk every structure and check the invariants (address lists ordered and
 * gap-free, no two free neighbours, class lists and bitmaps agree, byte
 * totals add up). 0 when consistent, else a negative line number. Tests. */
int ext_check(const ext_alloc_t *a);

#endif
