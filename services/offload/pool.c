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
 * Segments come from common/shm.h (create, size, seal, map, mlock). Each
 * belongs to one owner (a job) and has an extent allocator of its own, so a
 * region of one job can never be carved out of another job's memfd; the
 * budget (cfg.pool_bytes) limits the sum of live segment sizes. An empty
 * segment is retired (pages punched out, unmapped, fd closed) when another
 * allocation needs its bytes or on pool_trim. */
#include "pool.h"
#include "errbuf.h"

#include <errno.h>
#include <fcntl.h>
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
    shm_seg_t shm;      /* sealed memfd and its mapping (common/shm.h); shm.base NULL: slot free */
    ext_alloc_t *ext;   /* regions inside it, offsets 0 .. shm.bytes */
    uint64_t owner;     /* the job it belongs to */
    uint32_t id;        /* slot + POOL_MAX_SEGS * gen */
    uint32_t gen;       /* bumped when the slot is reused */
    uint64_t used;      /* bytes in allocated regions */
    bool dedicated;     /* made for one blob of at least seg_unit bytes: holds only blobs of its size */
} seg_t;

struct pool {
    pthread_mutex_t mu;        /* guards everything below except cfg */
    pool_config_t cfg;
    char name[48];
    seg_t seg[POOL_MAX_SEGS];
    uint32_t nsegs;            /* live segments */
    uint64_t budget;           /* total, bytes */
    uint64_t assigned;         /* bytes in live segments */
    uint64_t seg_unit;         /* size of a new segment, bytes */
    uint64_t page;             /* segment size granule (page or 2 MiB) */
    uint64_t allocs, failures, created, retired;
    bool huge;                 /* segments use 2 MiB huge pages */
    bool thp;                  /* collapse normal-page segments into transparent huge pages */
    int thp_errno;             /* the last refusal of that; 0: none */
    bool thp_warned;
    bool lock_ok;              /* no mlock refusal so far */
    bool lock_warned;
};

/* ---- segments (with mu held) ---- */

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static void seg_retire(pool_t *p, seg_t *s) {
    /* Free the pages now even if a client still maps the file: what is left
     * is an empty memfd of the same job. */
    fallocate(s->shm.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)s->shm.bytes);
    p->assigned -= s->shm.bytes;
    shm_destroy(&s->shm); /* munlocks too */
    ext_destroy(s->ext);
    s->ext = NULL;
    s->owner = 0;
    s->used = 0;
    p->nsegs--;
    p->retired++;
}

/* Retire empty segments (of any owner but keep) until want bytes of budget
 * are unassigned. true when there are. */
static bool make_budget(pool_t *p, uint64_t want) {
    for (uint32_t i = 0; i < POOL_MAX_SEGS && p->budget - p->assigned < want; i++)
        if (p->seg[i].shm.base && p->seg[i].used == 0) seg_retire(p, &p->seg[i]);
    return p->budget - p->assigned >= want;
}

/* A segment stays on normal pages although transparent huge pages were
 * asked for: remember why, say it once. */
static void thp_refused(pool_t *p, int e, uint64_t bytes) {
    p->thp_errno = e;
    if (p->thp_warned) return;
    p->thp_warned = true;
    log_warn("pool: a segment of %llu bytes stays on 4 KiB pages: %s (said once; pool_stats counts the "
             "bytes on transparent huge pages)", (unsigned long long)bytes, shm_thp_why(e));
}

/* A new segment of at least len bytes for owner; NULL with -errno in *rc. */
static seg_t *seg_new(pool_t *p, uint64_t owner, uint64_t len, int *rc) {
    uint64_t bytes = round_up(len > p->seg_unit ? len : p->seg_unit, p->page);
    uint64_t need = round_up(len, p->page);
    uint64_t left = p->budget - p->assigned;
    if (bytes > left) {
        /* take what the budget has, down to what the blob needs */
        if (!make_budget(p, bytes)) bytes = (p->budget - p->assigned) / p->page * p->page;
        if (bytes < need) { *rc = -ENOMEM; return NULL; }
    }
    uint32_t slot = POOL_MAX_SEGS;
    for (uint32_t i = 0; i < POOL_MAX_SEGS; i++)
        if (!p->seg[i].shm.base) { slot = i; break; }
    if (slot == POOL_MAX_SEGS) { *rc = -EMFILE; return NULL; }
    seg_t *s = &p->seg[slot];
    char nm[64], err[SHM_ERR_LEN];
    snprintf(nm, sizeof nm, "%s-%u", p->name, slot);
    int r = shm_create(&s->shm, nm, bytes, p->huge ? SHM_HUGE : p->thp ? SHM_THP : 0, err, sizeof err);
    if (r && p->huge && p->cfg.huge == POOL_HUGE_TRY) {
        log_warn("pool: 2 MiB huge pages unavailable (%s); using normal pages, on transparent huge pages "
                 "where the kernel gives them", err);
        p->huge = false;
        p->thp = true;
        r = shm_create(&s->shm, nm, bytes, SHM_THP, err, sizeof err);
    }
    if (r) {
        log_error("pool: creating a segment of %llu bytes: %s", (unsigned long long)bytes, err);
        *rc = r;
        return NULL;
    }
    s->ext = ext_new(POOL_ALIGN);
    if (!s->ext || ext_add_span(s->ext, 0, s->shm.bytes) < 0) {
        ext_destroy(s->ext);
        s->ext = NULL;
        shm_destroy(&s->shm);
        *rc = -ENOMEM;
        return NULL;
    }
    if (p->thp && !s->shm.thp_bytes) thp_refused(p, s->shm.thp_errno, bytes);
    if (p->cfg.mlock && p->lock_ok && shm_lock(&s->shm, err, sizeof err) != 0) {
        p->lock_ok = false;
        if (!p->lock_warned)
            log_warn("pool: %s. Docker: docker run --ulimit memlock=-1; systemd: LimitMEMLOCK=infinity", err);
        p->lock_warned = true;
    }
    if (++s->gen >= UINT32_MAX / POOL_MAX_SEGS) s->gen = 1;
    s->id = slot + POOL_MAX_SEGS * s->gen;
    s->owner = owner;
    s->used = 0;
    s->dedicated = len >= p->seg_unit;
    p->assigned += s->shm.bytes;
    p->nsegs++;
    p->created++;
    return s;
}

static seg_t *seg_by_id(const pool_t *p, uint32_t id) {
    const seg_t *s = &p->seg[id % POOL_MAX_SEGS];
    return s->shm.base && s->id == id ? (seg_t *)s : NULL;
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
    pool_t *p = calloc(1, sizeof *p);
    if (!p) { errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    pthread_mutex_init(&p->mu, NULL);
    for (int i = 0; i < POOL_MAX_SEGS; i++) p->seg[i].shm.fd = -1;
    p->cfg = *cfg;
    snprintf(p->name, sizeof p->name, "%s", cfg->name ? cfg->name : "ballast-pool");
    p->cfg.name = NULL;
    p->huge = cfg->huge == POOL_HUGE_ON || cfg->huge == POOL_HUGE_TRY;
    p->thp = cfg->huge == POOL_HUGE_THP;
    p->page = p->huge ? POOL_HUGE_2M : (uint64_t)pg;
    p->budget = round_up(cfg->pool_bytes, p->page);
    /* default: a sixteenth of the budget, at most POOL_DEFAULT_SEG, so that
     * several jobs share a small pool; at least what POOL_MAX_SEGS allows */
    uint64_t unit = cfg->segment_bytes;
    if (!unit) {
        unit = p->budget / 16 < POOL_DEFAULT_SEG ? p->budget / 16 : POOL_DEFAULT_SEG;
        if (unit < (p->budget + POOL_MAX_SEGS - 1) / POOL_MAX_SEGS) unit = (p->budget + POOL_MAX_SEGS - 1) / POOL_MAX_SEGS;
        if (unit < p->page) unit = p->page;
    }
    if (unit > p->budget) unit = p->budget;
    p->seg_unit = round_up(unit, p->page);
    if (p->budget / p->seg_unit > POOL_MAX_SEGS) {
        errbuf_set(err, errlen, "pool of %llu bytes in segments of %llu bytes needs %llu segments; "
               "at most %d: raise --segment-bytes", (unsigned long long)p->budget,
               (unsigned long long)p->seg_unit, (unsigned long long)(p->budget / p->seg_unit), POOL_MAX_SEGS);
        pool_close(p);
        return -EINVAL;
    }
    p->lock_ok = true;
    if (p->thp) {
        /* one 2 MiB probe, so that the start-up line and pool_stats can say
         * before the first segment whether the kernel gives huge pages */
        shm_seg_t probe;
        char perr[SHM_ERR_LEN];
        if (shm_create(&probe, "ballast-pool-probe", POOL_HUGE_2M, SHM_THP, perr, sizeof perr) == 0) {
            if (!probe.thp_bytes) thp_refused(p, probe.thp_errno, POOL_HUGE_2M);
            shm_destroy(&probe);
        }
    }
    *out = p;
    return 0;
}

void pool_close(pool_t *p) {
    if (!p) return;
    for (uint32_t i = 0; i < POOL_MAX_SEGS; i++) {
        if (p->seg[i].shm.base) shm_destroy(&p->seg[i].shm); /* munlocks too */
        ext_destroy(p->seg[i].ext);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* ---- allocation ---- */

int pool_alloc(pool_t *p, uint64_t owner, uint64_t len, pool_region_t *r) {
    if (len == 0 || owner == 0 || len > p->budget) return -EINVAL;
    uint64_t alen = round_up(len, POOL_ALIGN);
    pthread_mutex_lock(&p->mu);
    int rc = -ENOMEM;
    uint64_t off = 0;
    seg_t *s = NULL;
    /* A blob of a segment's size or more gets a segment of exactly its size
     * (page-rounded), reused only by a blob of that size: no segment is left
     * with a tail nothing fits in. Smaller blobs share segments of seg_unit. */
    bool big = alen >= p->seg_unit;
    uint64_t exact = round_up(alen, p->page);
    for (uint32_t i = 0; i < POOL_MAX_SEGS; i++) {
        seg_t *c = &p->seg[i];
        if (!c->shm.base || c->owner != owner || c->dedicated != big) continue;
        if (big && (c->used || c->shm.bytes != exact)) continue;
        if (c->shm.bytes - c->used >= alen && ext_alloc(c->ext, alen, &off) == 0) { s = c; rc = 0; break; }
    }
    if (!s && (s = seg_new(p, owner, alen, &rc)) != NULL) rc = ext_alloc(s->ext, alen, &off);
    if (rc == 0) {
        s->used += alen;
        p->allocs++;
        r->seg = s->id;
        r->_pad = 0;
        r->off = off;
        r->len = alen;
    } else {
        p->failures++;
    }
    pthread_mutex_unlock(&p->mu);
    return rc == -EMFILE ? -ENOMEM : rc;
}

void pool_explain(pool_t *p, uint64_t owner, uint64_t len, char *err, size_t errlen) {
    pthread_mutex_lock(&p->mu);
    uint64_t mine = 0, mine_free = 0, largest = 0, others = 0;
    for (uint32_t i = 0; i < POOL_MAX_SEGS; i++) {
        seg_t *s = &p->seg[i];
        if (!s->shm.base) continue;
        if (s->owner != owner) { others += s->shm.bytes; continue; }
        ext_stats_t es;
        ext_stats(s->ext, &es);
        mine += s->shm.bytes;
        mine_free += es.free;
        if (es.largest_free > largest) largest = es.largest_free;
    }
    uint64_t left = p->budget - p->assigned;
    pthread_mutex_unlock(&p->mu);
    errbuf_set(err, errlen, "no room for %llu bytes: this job's segments hold %llu bytes (%llu free, largest free "
               "extent %llu), other jobs' segments %llu bytes, unassigned budget %llu of --pool-bytes %llu",
               (unsigned long long)len, (unsigned long long)mine, (unsigned long long)mine_free,
               (unsigned long long)largest, (unsigned long long)others, (unsigned long long)left,
               (unsigned long long)p->budget);
}

int pool_free(pool_t *p, const pool_region_t *r) {
    pthread_mutex_lock(&p->mu);
    seg_t *s = seg_by_id(p, r->seg);
    int rc = -EINVAL;
    if (s && r->off < s->shm.bytes && ext_used_len(s->ext, r->off) == r->len &&
        (rc = ext_free(s->ext, r->off, NULL)) == 0)
        s->used -= r->len;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

uint32_t pool_trim(pool_t *p, uint64_t owner) {
    uint32_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (uint32_t i = 0; i < POOL_MAX_SEGS; i++) {
        seg_t *s = &p->seg[i];
        if (s->shm.base && s->used == 0 && (owner == 0 || s->owner == owner)) { seg_retire(p, s); n++; }
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* A region is only ever used while it is allocated, and an allocated
 * region's segment cannot be retired, so its slot is stable without mu. */
void *pool_ptr(const pool_t *p, const pool_region_t *r) {
    const seg_t *s = seg_by_id(p, r->seg);
    uint64_t len = r->len ? r->len : 1;
    if (!s || r->off >= s->shm.bytes || len > s->shm.bytes - r->off) return NULL;
    return (char *)s->shm.base + r->off;
}

bool pool_range_ok(pool_t *p, uint64_t owner, uint32_t seg, uint64_t off, uint64_t len) {
    if (len == 0) return false;
    pthread_mutex_lock(&p->mu);
    const seg_t *s = seg_by_id(p, seg);
    bool ok = s && s->owner == owner && off < s->shm.bytes && len <= s->shm.bytes - off;
    pthread_mutex_unlock(&p->mu);
    return ok;
}

static int info_of(const seg_t *s, pool_seg_info_t *o) {
    int fd = fcntl(s->shm.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return -errno;
    *o = (pool_seg_info_t){ s->id, fd, s->shm.bytes };
    return 0;
}

int pool_owner_segs(pool_t *p, uint64_t owner, pool_seg_info_t *out, int max) {
    int n = 0, rc = 0;
    pthread_mutex_lock(&p->mu);
    /* ids ascending: slot order within one generation is not id order, so sort after */
    for (uint32_t i = 0; i < POOL_MAX_SEGS && n < max; i++) {
        const seg_t *s = &p->seg[i];
        if (!s->shm.base || s->owner != owner) continue;
        if ((rc = info_of(s, &out[n])) != 0) break;
        n++;
    }
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        for (int i = 0; i < n; i++) close(out[i].fd);
        return rc;
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && out[j - 1].id > out[j].id; j--) {
            pool_seg_info_t t = out[j]; out[j] = out[j - 1]; out[j - 1] = t;
        }
    return n;
}

int pool_owner_seg(pool_t *p, uint64_t owner, uint32_t seg, pool_seg_info_t *out) {
    pthread_mutex_lock(&p->mu);
    const seg_t *s = seg_by_id(p, seg);
    int rc = s && s->owner == owner ? info_of(s, out) : -ENOENT;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

uint64_t pool_owner_bytes(pool_t *p, uint64_t owner) {
    uint64_t b = 0;
    pthread_mutex_lock(&p->mu);
    for (uint32_t i = 0; i < POOL_MAX_SEGS; i++)
        if (p->seg[i].shm.base && p->seg[i].owner == owner) b += p->seg[i].shm.bytes;
    pthread_mutex_unlock(&p->mu);
    return b;
}

uint64_t pool_max_alloc(const pool_t *p) { return p->budget; }

void pool_stats(pool_t *p, pool_stats_t *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&p->mu);
    uint64_t owners[POOL_MAX_SEGS];
    uint32_t nown = 0;
    for (uint32_t i = 0; i < POOL_MAX_SEGS; i++) {
        seg_t *s = &p->seg[i];
        if (!s->shm.base) continue;
        out->thp_bytes += s->shm.thp_bytes;
        ext_stats_t es;
        ext_stats(s->ext, &es);
        out->used_bytes += es.used;
        out->free_extents += es.free_extents;
        out->used_regions += es.used_extents;
        if (es.largest_free > out->largest_free) out->largest_free = es.largest_free;
        uint32_t k = 0;
        while (k < nown && owners[k] != s->owner) k++;
        if (k == nown) owners[nown++] = s->owner;
    }
    uint64_t left = p->budget - p->assigned;
    if (left > out->largest_free) out->largest_free = left;
    out->total_bytes = p->budget;
    out->segment_bytes = p->assigned;
    out->free_bytes = p->budget - out->used_bytes;
    out->allocs = p->allocs;
    out->alloc_failures = p->failures;
    out->segs_created = p->created;
    out->segs_retired = p->retired;
    out->nsegs = p->nsegs;
    out->owners = nown;
    out->mlocked = p->cfg.mlock && p->lock_ok && p->created > 0;
    out->huge = p->huge;
    out->thp = p->thp && !p->thp_errno;
    out->thp_errno = p->thp_errno;
    pthread_mutex_unlock(&p->mu);
    out->fragmentation = out->free_bytes ? 1.0 - (double)out->largest_free / (double)out->free_bytes : 0.0;
}
