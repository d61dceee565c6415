/* pool.c: sealed memfd segments plus an extent allocator over them.
 *
 * Why not a jemalloc arena with custom extent hooks: jemalloc would own the
 * pool's address space only through hooks, but it (a) rounds large requests
 * to its size classes and keeps freed extents in dirty/muzzy/retained caches
 * whose reuse and splitting policy we cannot see, so "largest free extent"
 * and "does this blob fit without evicting" have no exact answer; (b) grows
 * an arena by asking its extent hook for ever larger extents, which a fixed
 * pool can only refuse, turning exhaustion into allocation failures of
 * jemalloc's own choosing instead of a clean "no room, evict first"; and (c)
 * ties extent merging to its own rules, so a full free does not provably
 * return the pool to one extent. Blobs are large (KiB..GiB) and few compared
 * with malloc traffic, so a segregated-fit allocator with out-of-band
 * metadata (extent.c, TLSF-style, O(1) alloc and free, coalescing) gives
 * exact accounting and exact exhaustion with no metadata in memory that
 * clients map read-write.
 *
 * Segments come from common/shm.h (create, size, seal, map, mlock).
 *
 * Offsets: segment i occupies [base_i, base_i + bytes_i) of the allocator's
 * offset space, base_i = sum of the sizes before it. */
#include "pool.h"
#include "errbuf.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "extent.h"
#include "log.h"
#include "shm.h"

typedef struct {
    shm_seg_t shm;   /* sealed memfd and its mapping (common/shm.h) */
    uint64_t start;  /* offset of the segment in the allocator's space, bytes */
} seg_t;

struct pool {
    pthread_mutex_t mu;
    ext_alloc_t *ext;          /* guarded by mu */
    seg_t seg[POOL_MAX_SEGS];
    uint32_t nsegs;
    uint64_t seg_max;          /* largest segment, bytes */
    uint64_t allocs, failures; /* guarded by mu */
    bool mlocked, huge;
};

/* ---- segments ---- */

/* mlock every segment; on refusal warn once with the limit and the fix
 * (shm_lock's message) and unlock what was locked. */
static bool lock_segments(pool_t *p) {
    for (uint32_t i = 0; i < p->nsegs; i++) {
        char err[SHM_ERR_LEN];
        if (shm_lock(&p->seg[i].shm, err, sizeof err) != 0) {
            log_warn("pool: %s. Docker: docker run --ulimit memlock=-1; systemd: LimitMEMLOCK=infinity", err);
            for (uint32_t j = 0; j < i; j++) {
                munlock(p->seg[j].shm.base, p->seg[j].shm.bytes);
                p->seg[j].shm.locked = false;
            }
            return false;
        }
    }
    return true;
}

/* ---- lifetime ---- */

int pool_open(pool_t **out, const pool_config_t *cfg, char *err, size_t errlen) {
    *out = NULL;
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) pg = 4096;
    if (cfg->pool_bytes == 0) {
        errbuf_set(err, errlen, "pool size is 0: give --pool-bytes a size such as 256M");
        return -EINVAL;
    }
    uint64_t segb = cfg->segment_bytes ? cfg->segment_bytes : cfg->pool_bytes;
    if (segb > cfg->pool_bytes) segb = cfg->pool_bytes;
    pool_t *p = calloc(1, sizeof *p);
    if (!p) { errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    pthread_mutex_init(&p->mu, NULL);
    for (int i = 0; i < POOL_MAX_SEGS; i++) p->seg[i].shm.fd = -1;
    p->ext = ext_new(POOL_ALIGN);
    if (!p->ext) { free(p); errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }

    bool huge = cfg->huge != POOL_HUGE_OFF;
    const char *name = cfg->name ? cfg->name : "ballast-pool";
    uint64_t left = cfg->pool_bytes;
    uint64_t nseg_needed = (cfg->pool_bytes + segb - 1) / segb;
    if (nseg_needed > POOL_MAX_SEGS) {
        errbuf_set(err, errlen, "pool of %llu bytes in segments of %llu bytes needs %llu segments; "
               "at most %d: raise --segment-bytes", (unsigned long long)cfg->pool_bytes,
               (unsigned long long)segb, (unsigned long long)nseg_needed, POOL_MAX_SEGS);
        pool_close(p);
        return -EINVAL;
    }
    int rc = 0;
    while (left > 0) {
        uint64_t want = left < segb ? left : segb;
        uint64_t unit = huge ? POOL_HUGE_2M : (uint64_t)pg;
        uint64_t bytes = (want + unit - 1) / unit * unit;
        char nm[64];
        snprintf(nm, sizeof nm, "%s-%u", name, p->nsegs);
        seg_t *s = &p->seg[p->nsegs];
        rc = shm_create(&s->shm, nm, bytes, huge ? SHM_HUGE : 0, err, errlen);
        if (rc && huge && cfg->huge == POOL_HUGE_TRY) {
            log_warn("pool: 2 MiB huge pages unavailable (%s); using normal pages", err);
            huge = false;
            /* Start over with normal pages so all segments are alike. */
            for (uint32_t i = 0; i < p->nsegs; i++) shm_destroy(&p->seg[i].shm);
            p->nsegs = 0;
            left = cfg->pool_bytes;
            continue;
        }
        if (rc) { pool_close(p); return rc; }
        s->start = p->nsegs ? p->seg[p->nsegs - 1].start + p->seg[p->nsegs - 1].shm.bytes : 0;
        p->nsegs++;
        if (bytes > p->seg_max) p->seg_max = bytes;
        left -= want;
    }
    /* Spans are added once all segments exist (a huge-page retry rebuilds them). */
    for (uint32_t i = 0; i < p->nsegs; i++) {
        rc = ext_add_span(p->ext, p->seg[i].start, p->seg[i].shm.bytes);
        if (rc < 0) {
            errbuf_set(err, errlen, "pool allocator: %s", strerror(-rc));
            pool_close(p);
            return rc;
        }
    }
    p->huge = huge;
    if (cfg->mlock) p->mlocked = lock_segments(p);
    *out = p;
    return 0;
}

void pool_close(pool_t *p) {
    if (!p) return;
    for (uint32_t i = 0; i < p->nsegs; i++) shm_destroy(&p->seg[i].shm); /* munlocks too */
    ext_destroy(p->ext);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* ---- allocation ---- */

/* Segment holding allocator offset g (segments are few: linear search). */
static uint32_t seg_of(const pool_t *p, uint64_t g) {
    for (uint32_t i = 0; i < p->nsegs; i++)
        if (g >= p->seg[i].start && g < p->seg[i].start + p->seg[i].shm.bytes) return i;
    return UINT32_MAX;
}

int pool_alloc(pool_t *p, uint64_t len, pool_region_t *r) {
    if (len == 0 || len > p->seg_max) return -EINVAL;
    uint64_t g;
    pthread_mutex_lock(&p->mu);
    int rc = ext_alloc(p->ext, len, &g);
    if (rc == 0) p->allocs++;
    else p->failures++;
    pthread_mutex_unlock(&p->mu);
    if (rc) return rc;
    uint32_t s = seg_of(p, g);
    r->seg = s;
    r->_pad = 0;
    r->off = g - p->seg[s].start;
    r->len = (len + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    return 0;
}

int pool_free(pool_t *p, const pool_region_t *r) {
    if (r->seg >= p->nsegs || r->off >= p->seg[r->seg].shm.bytes) return -EINVAL;
    uint64_t g = p->seg[r->seg].start + r->off;
    pthread_mutex_lock(&p->mu);
    int rc = -EINVAL;
    if (ext_used_len(p->ext, g) == r->len) rc = ext_free(p->ext, g, NULL);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void *pool_ptr(const pool_t *p, const pool_region_t *r) {
    if (!pool_range_ok(p, r->seg, r->off, r->len ? r->len : 1)) return NULL;
    return (char *)p->seg[r->seg].shm.base + r->off;
}

bool pool_range_ok(const pool_t *p, uint32_t seg, uint64_t off, uint64_t len) {
    if (seg >= p->nsegs || len == 0) return false;
    uint64_t b = p->seg[seg].shm.bytes;
    return off < b && len <= b - off;
}

uint32_t pool_nsegs(const pool_t *p) { return p->nsegs; }
int pool_seg_fd(const pool_t *p, uint32_t seg) { return seg < p->nsegs ? p->seg[seg].shm.fd : -1; }
void *pool_seg_base(const pool_t *p, uint32_t seg) { return seg < p->nsegs ? p->seg[seg].shm.base : NULL; }
uint64_t pool_seg_bytes(const pool_t *p, uint32_t seg) { return seg < p->nsegs ? p->seg[seg].shm.bytes : 0; }
uint64_t pool_max_alloc(const pool_t *p) { return p->seg_max; }

void pool_stats(pool_t *p, pool_stats_t *out) {
    memset(out, 0, sizeof *out);
    ext_stats_t es;
    pthread_mutex_lock(&p->mu);
    ext_stats(p->ext, &es);
    out->allocs = p->allocs;
    out->alloc_failures = p->failures;
    pthread_mutex_unlock(&p->mu);
    out->total_bytes = es.total;
    out->used_bytes = es.used;
    out->free_bytes = es.free;
    out->largest_free = es.largest_free;
    out->free_extents = es.free_extents;
    out->used_regions = es.used_extents;
    out->fragmentation = es.free ? 1.0 - (double)es.largest_free / (double)es.free : 0.0;
    out->nsegs = p->nsegs;
    out->mlocked = p->mlocked;
    out->huge = p->huge;
}
