/* store.c: the key -> blob index of ballastd, with eviction to the NVMe
 * tier, read-back with crc32c checks, prefetch, sessions and quotas, and
 * persistence through the manifest (see store.h for the contract).
 *
 * Locking: one mutex (mu) guards the index, the LRU, sessions, jobs and the
 * counters; cv is broadcast whenever a blob leaves SPILLING/LOADING or a pin
 * or pool region is released. No I/O and no checksum runs under mu: a
 * thread that spills, loads or commits a blob marks it (state, refs), drops
 * mu, does the work and retakes mu. The manifest has its own mutex (mmu),
 * taken after mu when both are held, never before. Persistent commits share
 * manifest syncs (group commit): each appends its record under mmu, and one
 * of them runs fdatasync for all records appended so far while the others
 * wait on mcv (see manifest_append_durable).
 *
 * A blob struct lives while it is in the index (linked), pinned, or
 * referenced by a thread doing I/O on it (refs). store_free unlinks at once;
 * a blob unlinked while pinned is a "zombie" on its own list until the last
 * pin drops, so get_done can still find it.
 *
 * Invariant: a blob is on the LRU list iff it is linked, READY, in the pool,
 * unpinned and no thread holds it (refs == 0). Only LRU blobs are evicted. */
#include "store.h"
#include "clock.h"
#include "errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "log.h"
#include "manifest.h"
#include "tier_nvme.h"

#define PREFETCH_QUEUE 1024   /* pending prefetch hints; more are dropped */
#define MAX_JOBS 4096         /* distinct job names */

typedef struct holder {
    uint64_t sid;             /* session holding pins */
    uint32_t count;           /* pins it holds */
    struct holder *next;
} holder_t;

typedef struct blob {
    store_key_t key;
    uint64_t length;          /* bytes asked for */
    uint64_t alen;            /* length rounded up to 4 KiB: pool region and NVMe extent size */
    uint32_t crc;             /* of [0, length), valid when crc_valid */
    bool crc_valid;           /* crc computed: set by a persistent commit, by the first spill
                                 (before its write is submitted) and by manifest replay;
                                 on_nvme implies it */
    uint32_t flags;           /* STORE_F_PERSISTENT */
    store_state_t state;
    bool in_pool;             /* region valid */
    bool on_nvme;             /* nvme_off valid and the bytes there are current */
    bool durable;             /* committed persistent: its PUT record is in the manifest */
    bool in_manifest;         /* its PUT record was appended (set under mmu, possibly before
                                 the commit finishes: compaction must keep it) */
    bool linked;              /* in the index (false: freed, waiting for pins/refs) */
    bool committing;          /* put_commit running */
    bool on_lru;
    bool rb_held;             /* read back from NVMe (by a prefetch hint or a get) and
                                 neither released by the gets that took it nor out of
                                 the pool: its bytes are in s->rb_held_bytes */
    pool_region_t region;
    uint64_t nvme_off;
    uint64_t owner;           /* session charged, 0 = nobody */
    uint64_t writer;          /* session writing into the region (ALLOCATED); 0 = none. The
                                 region is not reused while it is set, even after a free. */
    uint32_t pins;            /* sum of holder counts */
    uint32_t refs;            /* threads using the struct with mu dropped */
    holder_t *holders;
    struct blob *lprev, *lnext; /* LRU (head = least recently used) or zombie list */
    struct blob *hnext;       /* hash chain */
    bool job_charged;         /* alen is in its job's used */
} blob_t;

typedef struct {
    uint64_t sid;
    uint64_t quota;           /* bytes, 0 = unlimited */
    uint64_t used;            /* bytes charged */
    uint64_t blobs;           /* blobs charged */
    uint64_t pins;            /* pins held */
} session_t;

typedef struct {
    uint64_t id;
    char name[JOB_NAME_MAX + 1];
    bool claimed;             /* a caller owns the job (store_job_claim) */
    uint64_t used;            /* bytes charged: every indexed blob of the job (cfg.job_quota) */
    bool owner_local;         /* its owner: a Unix-socket uid, or TCP callers */
    uint32_t owner_uid;
} job_t;

struct store {
    store_config_t cfg;
    char spill_dir[4096];
    pool_t *pool;
    tier_t *tier;             /* NULL without a spill dir */
    manifest_t *man;          /* NULL without a spill dir */
    int lock_fd;              /* flock on <dir>/ballastd.lock */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t mmu;      /* manifest */
    pthread_cond_t mcv;       /* a manifest sync finished */
    bool m_syncing;           /* a thread runs fdatasync on the manifest outside mmu */
    uint64_t m_synced;        /* records up to this seq are durable (guarded by mmu) */

    blob_t **hash;
    uint64_t nhash, nblobs;
    blob_t *lru_head, *lru_tail;
    blob_t *zombies;          /* unlinked but pinned or referenced */

    session_t *sessions;
    size_t nsessions, cap_sessions;
    job_t *jobs;
    size_t njobs;

    uint64_t busy_ops;        /* commits, spills and loads in progress */

    /* background evictor (evict_main) */
    pthread_t ev_thread;
    bool ev_started, ev_stop;
    pthread_cond_t ev_cv;     /* wakes the evictor: a put, a waiter, a completion */
    uint64_t ev_mark;         /* bytes kept free (or being freed): the watermark */
    uint64_t ev_waiting;      /* bytes asked for by allocations waiting for space */
    uint64_t ev_retry;        /* of those, bytes whose allocation failed again since the evictor last looked */
    uint32_t ev_inflight;     /* eviction writes in flight */
    uint64_t ev_bytes;        /* their bytes */
    uint32_t ev_failures;     /* eviction writes failed in a row */
    uint64_t ev_pressed_ms;   /* when the evictor last had to free space (clock_now_ms) */
    bool draining;

    /* prefetch worker */
    pthread_t pf_thread;
    bool pf_started, pf_stop;
    pthread_cond_t pf_cv;
    store_key_t pf_q[PREFETCH_QUEUE];
    size_t pf_head, pf_n;
    uint32_t pf_inflight;     /* prefetch loads not finished (the read, then its crc pass) */
    struct prefetch_io *pf_check, **pf_check_tail; /* reads ended, for the worker to check */
    uint32_t pf_reads;        /* prefetch reads submitted whose callback has not run: at the
                               * device, or just ended (the tier frees a slot before the
                               * callback, so this can briefly exceed the queue depth) */
    uint64_t pf_bytes;        /* their bytes */
    uint64_t pf_bytes_cap;    /* the most: a quarter of the pool (one blob is always let through) */
    uint32_t pf_depth_max;    /* the most pf_reads at once */
    uint64_t rb_loading;      /* bytes of read-backs under way (load_start to load_finish) */
    uint64_t rb_held_bytes;   /* read back and not yet released (rb_held) */
    bool pf_space_wait;       /* the worker holds a hint until pool space is freed */

    /* counters */
    uint64_t spill_writes, spill_reads, spill_wbytes, spill_rbytes;
    uint64_t puts, put_bytes;  /* committed puts and their bytes (length, not the 4 KiB rounding) */
    uint64_t gets, get_bytes;  /* gets that handed a blob's region to a client, and its bytes */
    uint64_t evictions, prefetches, crc_errors, persistent_live;
    uint64_t ahead_writes;    /* blobs written ahead of need, their regions kept */
    uint64_t manifest_damaged, manifest_lost; /* found when the manifest was replayed */
};

/* ---- keys and the index ---- */

static bool key_eq(const store_key_t *a, const store_key_t *b) {
    return a->job_id == b->job_id && a->rank == b->rank && a->kind == b->kind &&
           a->index == b->index && a->step == b->step;
}

static int key_cmp(const store_key_t *a, const store_key_t *b) {
#define CMP(f) if (a->f != b->f) return a->f < b->f ? -1 : 1
    CMP(job_id); CMP(rank); CMP(kind); CMP(index); CMP(step);
#undef CMP
    return 0;
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
}

static uint64_t key_hash(const store_key_t *k) {
    uint64_t h = mix(0, k->job_id);
    h = mix(h, (uint64_t)k->rank << 32 | k->kind);
    h = mix(h, k->index);
    return mix(h, k->step);
}

static blob_t *lookup(store_t *s, const store_key_t *k) {
    for (blob_t *b = s->hash[key_hash(k) & (s->nhash - 1)]; b; b = b->hnext)
        if (key_eq(&b->key, k)) return b;
    return NULL;
}

static void index_grow(store_t *s) {
    uint64_t nn = s->nhash * 2;
    blob_t **h = calloc(nn, sizeof *h);
    if (!h) return; /* keep the old table: longer chains, still correct */
    for (uint64_t i = 0; i < s->nhash; i++) {
        for (blob_t *b = s->hash[i], *next; b; b = next) {
            next = b->hnext;
            uint64_t j = key_hash(&b->key) & (nn - 1);
            b->hnext = h[j];
            h[j] = b;
        }
    }
    free(s->hash);
    s->hash = h;
    s->nhash = nn;
}

static void index_add(store_t *s, blob_t *b) {
    if (s->nblobs + 1 > s->nhash) index_grow(s);
    uint64_t i = key_hash(&b->key) & (s->nhash - 1);
    b->hnext = s->hash[i];
    s->hash[i] = b;
    b->linked = true;
    s->nblobs++;
}

static void index_del(store_t *s, blob_t *b) {
    blob_t **pp = &s->hash[key_hash(&b->key) & (s->nhash - 1)];
    for (; *pp; pp = &(*pp)->hnext) {
        if (*pp == b) {
            *pp = b->hnext;
            b->hnext = NULL;
            b->linked = false;
            s->nblobs--;
            return;
        }
    }
}

/* ---- LRU and zombies ---- */

static void lru_del(store_t *s, blob_t *b) {
    if (!b->on_lru) return;
    if (b->lprev) b->lprev->lnext = b->lnext;
    else s->lru_head = b->lnext;
    if (b->lnext) b->lnext->lprev = b->lprev;
    else s->lru_tail = b->lprev;
    b->lprev = b->lnext = NULL;
    b->on_lru = false;
}

/* Put b on the LRU when it qualifies, off it otherwise: as the most recent,
 * or (first) as the least recent, where a blob written ahead of need goes
 * back to. */
static void lru_put(store_t *s, blob_t *b, bool first) {
    lru_del(s, b);
    if (!(b->linked && b->state == STORE_READY && b->in_pool && b->pins == 0 && b->refs == 0)) return;
    if (first) { /* lru_del left b's links NULL */
        b->lnext = s->lru_head;
        if (s->lru_head) s->lru_head->lprev = b;
        else s->lru_tail = b;
        s->lru_head = b;
    } else {
        b->lprev = s->lru_tail;
        if (s->lru_tail) s->lru_tail->lnext = b;
        else s->lru_head = b;
        s->lru_tail = b;
    }
    b->on_lru = true;
}

static void lru_update(store_t *s, blob_t *b) { lru_put(s, b, false); }

static void zombie_add(store_t *s, blob_t *b) {
    b->lprev = NULL;
    b->lnext = s->zombies;
    if (s->zombies) s->zombies->lprev = b;
    s->zombies = b;
}

static void zombie_del(store_t *s, blob_t *b) {
    if (b->lprev) b->lprev->lnext = b->lnext;
    else s->zombies = b->lnext;
    if (b->lnext) b->lnext->lprev = b->lprev;
    b->lprev = b->lnext = NULL;
}

/* ---- sessions and jobs ---- */

static session_t *session_find(store_t *s, uint64_t sid) {
    for (size_t i = 0; i < s->nsessions; i++)
        if (s->sessions[i].sid == sid) return &s->sessions[i];
    return NULL;
}

static void uncharge(store_t *s, blob_t *b) {
    if (!b->owner) return;
    session_t *se = session_find(s, b->owner);
    if (se) {
        se->used -= b->alen;
        se->blobs--;
    }
    b->owner = 0;
}

static job_t *job_by_id(store_t *s, uint64_t id) {
    for (size_t i = 0; i < s->njobs; i++)
        if (s->jobs[i].id == id) return &s->jobs[i];
    return NULL;
}

static job_t *job_by_name(store_t *s, const char *name) {
    for (size_t i = 0; i < s->njobs; i++)
        if (strcmp(s->jobs[i].name, name) == 0) return &s->jobs[i];
    return NULL;
}

static uint64_t fnv1a(const char *p, uint64_t salt) {
    uint64_t h = 0xcbf29ce484222325ull ^ salt;
    for (; *p; p++) { h ^= (unsigned char)*p; h *= 0x100000001b3ull; }
    return h ? h : 1;
}

/* Add (id, name) to the table; with mu held. -1 when full. */
static int job_add(store_t *s, uint64_t id, const char *name) {
    if (job_by_id(s, id)) return 0;
    if (s->njobs == MAX_JOBS) return -1;
    s->jobs[s->njobs].id = id;
    snprintf(s->jobs[s->njobs].name, sizeof s->jobs[s->njobs].name, "%s", name);
    s->njobs++;
    return 0;
}

/* Remove job id from the table (its slot is reused); with mu held. */
static void job_drop(store_t *s, uint64_t id) {
    for (size_t i = 0; i < s->njobs; i++) {
        if (s->jobs[i].id != id) continue;
        s->jobs[i] = s->jobs[--s->njobs];
        memset(&s->jobs[s->njobs], 0, sizeof s->jobs[0]);
        return;
    }
}

/* The job's share of b (mu held): charged while b is in the index. */
static void job_charge(store_t *s, blob_t *b) {
    job_t *j = job_by_id(s, b->key.job_id);
    if (!j || b->job_charged) return;
    j->used += b->alen;
    b->job_charged = true;
}

static void job_uncharge(store_t *s, blob_t *b) {
    if (!b->job_charged) return;
    job_t *j = job_by_id(s, b->key.job_id);
    if (j) j->used -= b->alen;
    b->job_charged = false;
}

static bool job_has_blobs(store_t *s, uint64_t id) {
    for (uint64_t i = 0; i < s->nhash; i++)
        for (blob_t *b = s->hash[i]; b; b = b->hnext)
            if (b->key.job_id == id) return true;
    return false;
}

/* ---- blob lifetime ---- */

/* Pool space was freed: wake the prefetch worker if a hint waits for
 * some. With mu held. */
static void pf_space_freed(store_t *s) {
    if (s->pf_space_wait) pthread_cond_signal(&s->pf_cv);
}

/* b stops counting as read back: the pins of the gets that took it were
 * released, or it left the pool. No signal: its space comes back, if at
 * all, with the region's free, which signals. Counting it out at the get
 * instead let the prefetch worker evict for the next hint in the moment
 * before the client's free. With mu held. */
static void rb_release(store_t *s, blob_t *b) {
    if (!b->rb_held) return;
    b->rb_held = false;
    s->rb_held_bytes -= b->alen;
}

/* Return b's space and memory when nothing refers to it any more: unlinked,
 * no pins, no thread using it. With mu held. */
static void blob_maybe_destroy(store_t *s, blob_t *b) {
    if (b->linked || b->pins || b->refs || b->committing || b->writer) return;
    zombie_del(s, b);
    rb_release(s, b);
    if (b->in_pool) { pool_free(s->pool, &b->region); pf_space_freed(s); }
    if (b->on_nvme) tier_free(s->tier, b->nvme_off);
    for (holder_t *h = b->holders, *n; h; h = n) { n = h->next; free(h); }
    free(b);
    pthread_cond_broadcast(&s->cv);
}

/* Take b out of the index (store_free, release, drop_session). Its quota is
 * returned now; space when the last pin/ref goes. With mu held. */
static void blob_unlink(store_t *s, blob_t *b) {
    lru_del(s, b);
    index_del(s, b);
    uncharge(s, b);
    job_uncharge(s, b);
    if (b->durable) s->persistent_live--;
    zombie_add(s, b);
    blob_maybe_destroy(s, b);
}

static holder_t *holder_of(blob_t *b, uint64_t sid) {
    for (holder_t *h = b->holders; h; h = h->next)
        if (h->sid == sid) return h;
    return NULL;
}

static int pin_add(store_t *s, blob_t *b, uint64_t sid) {
    holder_t *h = holder_of(b, sid);
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h) return -1;
        h->sid = sid;
        h->next = b->holders;
        b->holders = h;
    }
    h->count++;
    b->pins++;
    session_t *se = session_find(s, sid);
    if (se) se->pins++;
    lru_del(s, b);
    return 0;
}

/* Drop n pins of sid on b (n = 0: all of them). With mu held; b may be
 * destroyed. Returns the number dropped. */
static uint32_t pin_drop(store_t *s, blob_t *b, uint64_t sid, uint32_t n) {
    holder_t **pp = &b->holders;
    while (*pp && (*pp)->sid != sid) pp = &(*pp)->next;
    if (!*pp) return 0;
    holder_t *h = *pp;
    uint32_t d = (n == 0 || n > h->count) ? h->count : n;
    h->count -= d;
    b->pins -= d;
    if (h->count == 0) { *pp = h->next; free(h); }
    session_t *se = session_find(s, sid);
    if (se) se->pins -= d;
    if (!b->pins) rb_release(s, b);
    if (b->linked) lru_update(s, b);
    else blob_maybe_destroy(s, b);
    pthread_cond_broadcast(&s->cv);
    return d;
}

/* ---- manifest helpers ---- */

static void rec_from_blob(store_t *s, const blob_t *b, manifest_rec_t *r, uint8_t type) {
    memset(r, 0, sizeof *r);
    r->type = type;
    r->job_id = b->key.job_id;
    r->rank = b->key.rank;
    r->kind = b->key.kind;
    r->index = b->key.index;
    r->step = b->key.step;
    r->length = b->length;
    r->nvme_off = b->nvme_off;
    r->crc = b->crc;
    r->flags = b->flags;
    job_t *j = job_by_id(s, b->key.job_id);
    if (j) snprintf(r->job, sizeof r->job, "%s", j->name);
}

/* fdatasync the manifest with mmu held; everything appended so far is then
 * durable. 0 or -errno. */
static int msync_locked(store_t *s) {
    while (s->m_syncing) pthread_cond_wait(&s->mcv, &s->mmu);
    int rc = manifest_sync(s->man);
    if (rc == 0) s->m_synced = manifest_last_seq(s->man);
    return rc;
}

/* Append r and return once it is durable, sharing the fdatasync with
 * concurrent callers (group commit). Called without mu or mmu; marks b (may
 * be NULL) in_manifest as soon as the record is in the log. 0 or -errno. */
static int manifest_append_durable(store_t *s, manifest_rec_t *r, blob_t *b) {
    pthread_mutex_lock(&s->mmu);
    int rc = manifest_append(s->man, r, false);
    if (rc == 0 && b) b->in_manifest = true;
    uint64_t mine = r->seq;
    while (rc == 0 && s->m_synced < mine) {
        if (s->m_syncing) { pthread_cond_wait(&s->mcv, &s->mmu); continue; }
        s->m_syncing = true;
        uint64_t upto = manifest_last_seq(s->man);
        pthread_mutex_unlock(&s->mmu);
        int r2 = manifest_sync(s->man); /* the fd stays: compaction waits for !m_syncing */
        pthread_mutex_lock(&s->mmu);
        s->m_syncing = false;
        if (r2 == 0 && upto > s->m_synced) s->m_synced = upto;
        pthread_cond_broadcast(&s->mcv);
        if (r2) rc = r2;
    }
    pthread_mutex_unlock(&s->mmu);
    return rc;
}

/* Rewrite the manifest with only live records when it has grown well past
 * them. With mu held (takes mmu). */
static void maybe_compact(store_t *s) {
    if (!s->man) return;
    pthread_mutex_lock(&s->mmu);
    while (s->m_syncing) pthread_cond_wait(&s->mcv, &s->mmu);
    uint64_t nrec = manifest_records(s->man);
    if (nrec < 1024 || nrec < 4 * (s->persistent_live + s->njobs)) {
        pthread_mutex_unlock(&s->mmu);
        return;
    }
    size_t n = 0, cap = s->njobs + 1;
    for (uint64_t i = 0; i < s->nhash; i++)
        for (blob_t *b = s->hash[i]; b; b = b->hnext)
            if (b->in_manifest) cap++;
    manifest_rec_t *live = calloc(cap, sizeof *live);
    if (!live) { pthread_mutex_unlock(&s->mmu); return; }
    for (size_t i = 0; i < s->njobs; i++) {
        live[n].type = MREC_JOB;
        live[n].job_id = s->jobs[i].id;
        snprintf(live[n].job, sizeof live[n].job, "%s", s->jobs[i].name);
        n++;
    }
    for (uint64_t i = 0; i < s->nhash; i++)
        for (blob_t *b = s->hash[i]; b; b = b->hnext)
            if (b->in_manifest && n < cap) rec_from_blob(s, b, &live[n++], MREC_PUT);
    char err[256];
    if (manifest_compact(s->man, live, n, err, sizeof err) != 0)
        log_warn("store: manifest compaction failed (%s); the log keeps growing", err);
    else
        s->m_synced = manifest_last_seq(s->man); /* the new log was fsynced whole */
    pthread_mutex_unlock(&s->mmu);
    free(live);
}

/* ---- space: allocation with eviction ---- */

/* Drop the NVMe copies of non-persistent blobs that are also in the pool
 * until need bytes of tier space could be found. With mu held. */
static bool reclaim_nvme_copies(store_t *s, uint64_t need, uint64_t *off) {
    for (blob_t *b = s->lru_head; b; b = b->lnext) {
        if (b->on_nvme && b->in_pool && !(b->flags & STORE_F_PERSISTENT)) {
            tier_free(s->tier, b->nvme_off);
            b->on_nvme = false;
            if (tier_alloc(s->tier, need, off) == 0) return true;
        }
    }
    return false;
}

/* ---- background eviction ----
 *
 * One thread (evict_main) keeps free + being-freed pool bytes at or above
 * the watermark (cfg.evict_watermark_pct of the pool), and above it while an
 * allocation waits for space: it takes least recently used blobs off the LRU
 * and writes them to the NVMe tier with up to cfg.queue_depth writes in
 * flight, overlapped with clients' copies. Each completion (evict_done, on
 * the tier's completion thread) releases the blob's pool region and wakes
 * the waiters. A blob with a current NVMe copy just loses its region. The
 * bytes of a blob are immutable once READY and a victim is SPILLING and
 * referenced, so its crc and write run with mu dropped, and at the same
 * time: the write goes to the tier first and the CRC-32C pass (about a
 * millisecond for 16 MiB) runs while the device works, instead of holding
 * the write back; whichever of the two ends last finishes the eviction. */

#define EV_AHEAD_SCAN 256  /* blobs on NVMe a write-ahead pick passes over at most */

typedef struct {
    store_t *s;
    blob_t *b;
    uint64_t off;         /* NVMe extent */
    uint32_t crc;         /* computed while the write runs, when need_crc */
    bool need_crc;        /* the blob had no crc yet (committed without one) */
    bool keep;            /* written ahead of need: the blob keeps its region unless space is wanted */
    int64_t res;          /* the write's result: bytes written or -errno */
    atomic_int parts;     /* of the write and the crc pass, those still running */
} evict_io_t;

/* Bytes the evictor should still free now (0: none). With mu held. */
static uint64_t evict_deficit(store_t *s) {
    if (s->ev_stop) return 0;
    pool_stats_t ps;
    pool_stats(s->pool, &ps);
    /* Read-backs draw on the watermark's room rather than refilling it:
     * blobs read back from NVMe and not yet released by the gets that take
     * them (prefetched, or loaded by a get and still pinned) are about to be
     * used and, in a read-back, freed, which gives their space back without
     * a write. Refilling it wrote the newest pool blobs out during an
     * oldest-first read-back, only to read them again (1 MiB blobs through a
     * 128 MiB pool at 25%: 993 reads for 1024 blobs, 929 without), and slowed
     * the reads a client waits for. A put that has to wait still makes room
     * (ev_waiting); once released, a blob counts as any other. */
    uint64_t ahead = s->rb_loading + s->rb_held_bytes;
    uint64_t have = ps.free_bytes + s->ev_bytes + (ahead < s->ev_mark ? ahead : s->ev_mark);
    uint64_t want = s->ev_mark + s->ev_waiting; /* what waiting allocations ask for, on top */
    uint64_t d = have >= want ? 0 : want - have;
    /* A waiting allocation may fail with enough free bytes, in pieces too
     * small: free its size again (LRU order) unless that much is on its way.
     * Only for an allocation that tried again and failed since the evictor
     * last looked (ev_retry): asking on ev_waiting alone went on evicting,
     * one blob per completion, for as long as a satisfied waiter had not yet
     * woken to take its space (a loaded machine spilled a whole pool). And
     * only for as much as still waits: a waiter that failed, then got its
     * space before the evictor looked, leaves ev_retry behind, and honouring
     * it dropped blobs no one needed gone (a loaded machine dropped 16 just
     * prefetched blobs, 7 of 8 MiB free, and read them again). */
    uint64_t retry = s->ev_retry < s->ev_waiting ? s->ev_retry : s->ev_waiting;
    if (retry > s->ev_bytes && retry - s->ev_bytes > d) d = retry - s->ev_bytes;
    return d;
}

/* Finish one eviction once both its write and its crc pass are done: on
 * success the blob is on NVMe and, unless pinned again meanwhile, leaves the
 * pool. Takes mu. */
static void evict_finish(evict_io_t *io) {
    store_t *s = io->s;
    blob_t *b = io->b;
    int64_t res = io->res;
    pthread_mutex_lock(&s->mu);
    s->busy_ops--;
    s->ev_inflight--;
    s->ev_bytes -= b->alen;
    b->refs--;
    b->state = STORE_READY;
    if (io->need_crc) { b->crc = io->crc; b->crc_valid = true; }
    if (res != (int64_t)b->alen) {
        log_error("store: spilling a blob of %llu bytes to %s failed: %s", (unsigned long long)b->alen,
                  s->spill_dir, res < 0 ? strerror((int)-res) : "short write");
        tier_free(s->tier, io->off);
        s->ev_failures++;
    } else {
        s->ev_failures = 0;
        s->spill_writes++;
        s->spill_wbytes += b->alen;
        b->on_nvme = true;
        b->nvme_off = io->off;
        if (io->keep) s->ahead_writes++;
        /* written ahead of need: keep the region, as the least recent blob
         * (the next to go, at once), unless an allocation waits for space */
        if (b->linked && !b->pins && (!io->keep || s->ev_waiting)) {
            pool_free(s->pool, &b->region);
            b->in_pool = false;
            s->evictions++;
            pf_space_freed(s);
        }
    }
    if (!b->linked) blob_maybe_destroy(s, b);
    else if (io->keep) lru_put(s, b, true);
    else lru_update(s, b);
    pthread_cond_broadcast(&s->cv);
    pthread_cond_signal(&s->ev_cv);
    pthread_mutex_unlock(&s->mu);
    free(io);
}

/* One part of an eviction ended; the last one finishes it. The release
 * orders the part's result (io->res or io->crc) before the other side reads
 * it. */
static void evict_part_done(evict_io_t *io) {
    if (atomic_fetch_sub_explicit(&io->parts, 1, memory_order_acq_rel) == 1) evict_finish(io);
}

/* The tier's completion of an eviction write: res = bytes written or
 * -errno. */
static void evict_done(void *arg, int64_t res) {
    evict_io_t *io = arg;
    io->res = res;
    evict_part_done(io);
}

/* Take victims off the LRU head until about need bytes are on their way
 * out or depth writes are in flight. Blobs already on NVMe lose their
 * region at once (*dropped counts them); the others are marked SPILLING
 * and returned in v (at most max). ahead: writes ahead of need instead,
 * for blobs that keep their regions (evict_ahead): blobs on NVMe are passed
 * over (at most EV_AHEAD_SCAN of them), and a full tier ends the pick
 * rather than give up other blobs' NVMe copies. With mu held. */
static int evict_pick(store_t *s, uint64_t need, evict_io_t **v, int max, int *dropped, bool ahead) {
    int nv = 0, passed = 0;
    uint64_t got = 0;
    for (blob_t *b = s->lru_head, *next; b && nv < max && got < need; b = next) {
        next = b->lnext;
        if (ahead && b->on_nvme) {
            if (++passed >= EV_AHEAD_SCAN) break;
            continue;
        }
        if (b->on_nvme) {
            rb_release(s, b);
            lru_del(s, b);
            pool_free(s->pool, &b->region);
            b->in_pool = false;
            s->evictions++;
            pf_space_freed(s);
            (*dropped)++;
        } else {
            uint64_t o;
            if (tier_alloc(s->tier, b->alen, &o) != 0 && (ahead || !reclaim_nvme_copies(s, b->alen, &o))) break;
            evict_io_t *io = malloc(sizeof *io);
            if (!io) { tier_free(s->tier, o); break; }
            next = b->lnext; /* reclaiming does not reorder the LRU, but re-read to be safe */
            lru_del(s, b);
            b->state = STORE_SPILLING;
            b->refs++;
            *io = (evict_io_t){ .s = s, .b = b, .off = o, .need_crc = !b->crc_valid, .keep = ahead };
            atomic_init(&io->parts, 2);
            v[nv++] = io;
            s->busy_ops++;
            s->ev_inflight++;
            s->ev_bytes += b->alen;
        }
        got += b->alen;
    }
    return nv;
}

/* Bytes to write ahead of need now (0: none): while the pool has been
 * short of space within the last cfg.evict_ahead_ms, the evictor keeps the
 * watermark's bytes of writes in flight even when free + being-freed bytes
 * are at the mark. Without it the disk idled once per cycle: the writes the
 * watermark started ended together (this machine's virtio disk answers a
 * batch at once), their space went to the client, and nothing was written
 * until the client's copies took the pool below the mark again (16 MiB
 * blobs in a 128 MiB pool: no write in flight 9-15% of the time, spill
 * writes at 0.84 of fio against 0.95 with it). The blobs written keep their
 * regions as the least recent ones, so the pool holds as many blobs as
 * before and gives up one at once, without a write, when an allocation
 * needs room. What this writes that is never needed (blobs freed while
 * still in the pool) is bounded by cfg.evict_ahead_ms of the device after
 * the last shortage, plus the watermark. None while prefetch reads are at
 * the device: it is busy then, and such writes only slow the reads a
 * client waits for (a read-back of the oldest blobs first otherwise wrote
 * every newer blob the pool still held). With mu held. */
static uint64_t evict_ahead(store_t *s, uint64_t now_ms) {
    if (!s->cfg.evict_ahead_ms || s->ev_stop || s->draining || s->ev_failures || !s->ev_pressed_ms ||
        now_ms - s->ev_pressed_ms > s->cfg.evict_ahead_ms || s->pf_reads)
        return 0;
    return s->ev_bytes < s->ev_mark ? s->ev_mark - s->ev_bytes : 0;
}

static void *evict_main(void *arg) {
    store_t *s = arg;
    uint32_t depth = s->cfg.queue_depth ? s->cfg.queue_depth : 64;
    evict_io_t **v = calloc(depth, sizeof *v);
    pthread_mutex_lock(&s->mu);
    while (!s->ev_stop) {
        uint64_t now = clock_now_ms();
        uint64_t need = v && !s->draining && s->ev_failures < 8 ? evict_deficit(s) : 0;
        s->ev_retry = 0; /* seen: a waiter asks again when its next try fails */
        if (need || s->ev_waiting) s->ev_pressed_ms = now;
        bool ahead = false;
        if (!need && v && (need = evict_ahead(s, now))) ahead = true;
        int dropped = 0, nv = 0;
        if (need && s->ev_inflight < depth && s->lru_head)
            nv = evict_pick(s, need, v, (int)(depth - s->ev_inflight), &dropped, ahead);
        if (dropped) pthread_cond_broadcast(&s->cv);
        if (nv == 0) {
            if (!dropped) {
                /* Nothing to do, the queue is full, or nothing is evictable:
                 * wait for a completion, a put or a waiter (or retry in a
                 * while: pins drop without telling the evictor). */
                struct timespec ts = clock_after(s->ev_failures ? 0.2 : 0.05);
                pthread_cond_timedwait(&s->ev_cv, &s->mu, &ts);
                if (s->ev_failures >= 8 && s->ev_waiting) s->ev_failures = 7; /* a waiter: try again */
            }
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        /* every write first, then the crc passes while they run */
        for (int i = 0; i < nv; i++) {
            blob_t *b = v[i]->b;
            int rc = tier_submit(s->tier, IO_WRITE, pool_ptr(s->pool, &b->region), b->alen, v[i]->off,
                                 evict_done, v[i]);
            if (rc) evict_done(v[i], rc);
        }
        for (int i = 0; i < nv; i++) {
            blob_t *b = v[i]->b;
            if (v[i]->need_crc) v[i]->crc = crc32c(0, pool_ptr(s->pool, &b->region), b->length);
            evict_part_done(v[i]);
        }
        pthread_mutex_lock(&s->mu);
    }
    while (s->ev_inflight) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    free(v);
    return NULL;
}

/* Tell the evictor that the pool got fuller: when nothing is in flight, or
 * when this allocation took the pool below the watermark. Waiting for the
 * next completion instead left large blobs (16 MiB in a 128 MiB pool) one
 * write in flight for most of a cycle: the writes the watermark had started
 * finished together, their space went to the client, and the disk idled
 * while the client filled it. With mu held. */
static void evict_kick(store_t *s) {
    if (s->ev_started && (!s->ev_inflight || (s->ev_inflight < s->cfg.queue_depth && evict_deficit(s))))
        pthread_cond_signal(&s->ev_cv);
}

/* Allocate alen bytes of pool, waiting (bounded by evict_wait_ms) while
 * the evictor makes room or pins drop. With mu held (dropped while
 * waiting). allow_evict false: no wait. */
static status_t alloc_space(store_t *s, uint64_t job, uint64_t alen, pool_region_t *r, bool allow_evict,
                            char *err, size_t errlen) {
    uint64_t deadline = clock_now_ms() + s->cfg.evict_wait_ms;
    for (;;) {
        if (pool_alloc(s->pool, job, alen, r) == 0) {
            evict_kick(s);
            return STATUS_OK;
        }
        if (!allow_evict) return STATUS_NO_SPACE;
        if (s->ev_started && s->ev_failures >= 8 && !s->ev_inflight) {
            errbuf_set(err, errlen, "pool full and spilling to %s failed (I/O error; see the log)", s->spill_dir);
            return STATUS_IO_ERROR;
        }
        uint64_t now = clock_now_ms();
        if (now >= deadline) break;
        uint64_t wait = deadline - now;
        if (wait > 50) wait = 50;
        s->ev_waiting += alen;
        s->ev_retry += alen;
        s->ev_pressed_ms = now;
        if (s->ev_started) pthread_cond_signal(&s->ev_cv);
        struct timespec ts = clock_after((double)wait * 1e-3);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        s->ev_waiting -= alen;
    }
    char why[300];
    pool_explain(s->pool, job, alen, why, sizeof why);
    errbuf_set(err, errlen, "%s; nothing evictable (pinned or uncommitted)%s; other jobs' memory is never used: "
               "free blobs, or give ballastd a larger --pool-bytes", why,
               s->tier ? " and the NVMe tier full" : " and no --spill-dir to spill to");
    return STATUS_NO_SPACE;
}

/* The first half of a read-back of b (READY, NVMe only, b->refs taken by
 * the caller): mark it LOADING and allocate its pool region in *r. With mu
 * held (dropped while waiting for space). */
static status_t load_start(store_t *s, blob_t *b, pool_region_t *r, bool allow_evict, char *err, size_t errlen) {
    b->state = STORE_LOADING;
    s->busy_ops++;
    status_t st = alloc_space(s, b->key.job_id, b->alen, r, allow_evict, err, errlen);
    if (st != STATUS_OK) {
        b->state = STORE_READY;
        s->busy_ops--;
        pthread_cond_broadcast(&s->cv);
    } else {
        s->rb_loading += b->alen;
    }
    return st;
}

/* The second half, once the read gave n (bytes or -errno) and crc (of the
 * bytes read, when n is the whole blob): on STATUS_OK b is READY in the
 * pool at r. With mu held. */
static status_t load_finish(store_t *s, blob_t *b, const pool_region_t *r, int64_t n, uint32_t crc, char *err,
                            size_t errlen) {
    uint64_t off = b->nvme_off;
    s->busy_ops--;
    s->rb_loading -= b->alen;
    b->state = STORE_READY;
    pthread_cond_broadcast(&s->cv);
    if (n != (int64_t)b->alen) {
        pool_free(s->pool, r);
        errbuf_set(err, errlen, "reading a blob of %llu bytes back from %s failed: %s",
               (unsigned long long)b->length, s->spill_dir, n < 0 ? strerror((int)-n) : "short read");
        return STATUS_IO_ERROR;
    }
    s->spill_reads++;
    s->spill_rbytes += b->alen;
    if (!b->crc_valid || crc != b->crc) { /* on_nvme implies crc_valid; never trust it blindly */
        pool_free(s->pool, r);
        s->crc_errors++;
        char path[4300] = "?";
        uint64_t fo = 0;
        tier_locate(s->tier, off, path, sizeof path, &fo);
        log_error("store: crc32c mismatch reading back a blob of %llu bytes from %s at offset %llu "
                  "(expected %08x, got %08x): the spilled copy is damaged",
                  (unsigned long long)b->length, path, (unsigned long long)fo, b->crc, crc);
        errbuf_set(err, errlen, "data loss: the blob's copy on NVMe (%s, offset %llu) fails its crc32c "
               "check (expected %08x, got %08x)", path, (unsigned long long)fo, b->crc, crc);
        return STATUS_DATA_LOSS;
    }
    b->region = *r;
    b->in_pool = true;
    if (b->linked && !b->rb_held) { /* until the gets that take it let go */
        b->rb_held = true;
        s->rb_held_bytes += b->alen;
    }
    return STATUS_OK;
}

/* Bring b (READY, NVMe only) into the pool and check its crc32c. With mu
 * held and b->refs taken by the caller; drops mu during the read. On
 * STATUS_OK b is READY in the pool (not on the LRU while refs are held). */
static status_t load_blob(store_t *s, blob_t *b, bool allow_evict, char *err, size_t errlen) {
    pool_region_t r;
    status_t st = load_start(s, b, &r, allow_evict, err, errlen);
    if (st != STATUS_OK) return st;
    uint64_t off = b->nvme_off;
    pthread_mutex_unlock(&s->mu);
    void *p = pool_ptr(s->pool, &r);
    int64_t n = tier_rw(s->tier, IO_READ, p, b->alen, off);
    uint32_t crc = n == (int64_t)b->alen ? crc32c(0, p, b->length) : 0;
    pthread_mutex_lock(&s->mu);
    return load_finish(s, b, &r, n, crc, err, errlen);
}

/* ---- prefetch worker ----
 *
 * One thread takes prefetch hints in order and reads their blobs back with
 * as many reads in flight as the tier takes (cfg.queue_depth, shared with
 * eviction writes; a read-back one blob at a time, as a get does, keeps one
 * request at the device where fio keeps 32). A finished read comes back to
 * it (prefetch_done, on the tier's completion thread, only queues it), and
 * it checks the crc32c and finishes the load itself, but only once every
 * hint it can start is on its way: the device is never kept waiting for a
 * check. Checking on the completion thread instead, with this thread
 * submitting, kept the disk idle for ~2 ms of every ~13: this machine's
 * virtio disk answers 32 reads of 1 MiB together, their checks took the
 * completion thread ~2 ms, and on two cores the woken submitter did not
 * run until they were done. */

typedef struct prefetch_io {
    store_t *s;
    blob_t *b;
    pool_region_t r;
    int64_t res;              /* the read's result, once it ended */
    struct prefetch_io *next; /* s->pf_check */
} prefetch_io_t;

static void prefetch_done(void *arg, int64_t res) {
    prefetch_io_t *io = arg;
    store_t *s = io->s;
    io->res = res;
    io->next = NULL;
    pthread_mutex_lock(&s->mu);
    s->pf_reads--;
    s->pf_bytes -= io->b->alen;
    *s->pf_check_tail = io;
    s->pf_check_tail = &io->next;
    pthread_cond_signal(&s->pf_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Check and finish one ended read. With mu held; drops it for the crc. */
static void prefetch_check(store_t *s, prefetch_io_t *io) {
    blob_t *b = io->b;
    pthread_mutex_unlock(&s->mu);
    uint32_t crc = io->res == (int64_t)b->alen ? crc32c(0, pool_ptr(s->pool, &io->r), b->length) : 0;
    char err[STORE_ERR_LEN];
    pthread_mutex_lock(&s->mu);
    status_t st = load_finish(s, b, &io->r, io->res, crc, err, sizeof err);
    b->refs--;
    if (st == STATUS_OK) s->prefetches++;
    else if (st == STATUS_IO_ERROR) log_warn("store: prefetch: %s", err); /* a get will try again and say so */
    if (b->linked) lru_update(s, b);
    else {
        if (st == STATUS_OK) { pool_free(s->pool, &b->region); b->in_pool = false; }
        blob_maybe_destroy(s, b);
    }
    s->pf_inflight--;
    free(io);
}

/* Start the next hint's read. The hint stays queued (false) while
 * pf_bytes_cap bytes of reads are at the device: reads beyond what keeps
 * the device busy only hold pool space no one can use yet, and the hints
 * that wait go the moment reads end, while those are checked (a 128 MiB
 * pool reading 16 MiB blobs: 2 at the device and 2 waiting, not 4 ended
 * together with nothing queued behind them). checks: ended reads wait for
 * this thread, so wait neither for pool space nor for a tier slot; the
 * hint stays queued when either is short. While read-backs not yet
 * released (rb_loading + rb_held_bytes: under way, or read and not let go
 * by the gets that took them) come to pf_bytes_cap, a hint does not make
 * room by eviction (one blob always may): it uses free space or waits for
 * some (pf_space_wait). A read-back frees each blob it got, and evicting
 * for reads further ahead wrote the newest pool blobs out only to read
 * them again. True when a hint was taken (started, or not needed any
 * more). With mu held; drops it to submit. */
static bool prefetch_start(store_t *s, bool checks) {
    if (checks && !tier_has_room(s->tier)) return false;
    store_key_t k = s->pf_q[s->pf_head];
    blob_t *b = lookup(s, &k);
    bool wanted = b && b->state == STORE_READY && !b->in_pool && b->on_nvme;
    if (wanted && s->pf_bytes && s->pf_bytes + b->alen > s->pf_bytes_cap) return false;
    s->pf_head = (s->pf_head + 1) % PREFETCH_QUEUE;
    s->pf_n--;
    if (!wanted) return true;
    prefetch_io_t *io = malloc(sizeof *io);
    if (!io) return true; /* a hint: the get reads it back itself */
    b->refs++;
    char err[STORE_ERR_LEN];
    uint64_t ahead = s->rb_loading + s->rb_held_bytes;
    bool evict = !checks && (!ahead || ahead + b->alen <= s->pf_bytes_cap);
    status_t st = load_start(s, b, &io->r, evict, err, sizeof err);
    if (st != STATUS_OK) {
        b->refs--;
        free(io);
        if (b->linked) lru_update(s, b);
        blob_maybe_destroy(s, b);
        if (st != STATUS_NO_SPACE || evict) return true;
        /* checked or read-ahead blobs will free space once used: put the
         * hint back */
        s->pf_head = (s->pf_head + PREFETCH_QUEUE - 1) % PREFETCH_QUEUE;
        s->pf_q[s->pf_head] = k;
        s->pf_n++;
        if (!checks) s->pf_space_wait = true;
        return false;
    }
    io->s = s;
    io->b = b;
    s->pf_inflight++;
    if (++s->pf_reads > s->pf_depth_max) s->pf_depth_max = s->pf_reads;
    s->pf_bytes += b->alen;
    void *p = pool_ptr(s->pool, &io->r);
    uint64_t len = b->alen, off = b->nvme_off;
    pthread_mutex_unlock(&s->mu);
    /* blocks while the tier is full, only when nothing waits for a check
     * (checks: there was room a moment ago; an eviction write may have
     * taken it, and one of the tier's requests ends soon) */
    int rc = tier_submit(s->tier, IO_READ, p, len, off, prefetch_done, io);
    if (rc) prefetch_done(io, rc);
    pthread_mutex_lock(&s->mu);
    return true;
}

static void *prefetch_main(void *arg) {
    store_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        bool held = false;
        while (s->pf_n && !s->pf_stop && !held) held = !prefetch_start(s, s->pf_check != NULL);
        if (s->pf_check) {
            prefetch_io_t *io = s->pf_check;
            s->pf_check = io->next;
            if (!s->pf_check) s->pf_check_tail = &s->pf_check;
            prefetch_check(s, io);
            continue;
        }
        if (s->pf_stop && !s->pf_inflight) break;
        /* held without checks waiting: by pf_bytes_cap, so a read is at
         * the device and its end signals; or for pool space, which a free
         * or an eviction signals (pf_space_wait; timed as well, so space
         * freed on a path that does not signal, or read-backs released by
         * a client that keeps its blobs, are noticed within 20 ms) */
        if (s->pf_space_wait && !s->pf_stop) {
            struct timespec ts = clock_after(0.02);
            pthread_cond_timedwait(&s->pf_cv, &s->mu, &ts);
        } else if (!s->pf_n || s->pf_stop || held) {
            pthread_cond_wait(&s->pf_cv, &s->mu); /* a hint or an ended read */
        }
        s->pf_space_wait = false;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- open and close ---- */

void store_config_default(store_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->pool.pool_bytes = 256ull << 20;
    cfg->pool.segment_bytes = 0;
    cfg->pool.huge = POOL_HUGE_OFF;
    cfg->pool.mlock = true;
    cfg->spill_file_bytes = 1ull << 30;
    cfg->io_backend = STORE_IO_AUTO;
    cfg->queue_depth = 64;
    cfg->io_threads = 4;
    cfg->evict_wait_ms = 5000;
    cfg->evict_watermark_pct = 10;
    cfg->evict_ahead_ms = 50;
    cfg->direct_io = true;
}

typedef struct {
    store_t *s;
    manifest_rec_t *recs;     /* live PUT records */
    size_t n, cap;
    bool oom;
} replay_t;

static void replay_fn(void *arg, const manifest_rec_t *r) {
    replay_t *rp = arg;
    store_t *s = rp->s;
    switch (r->type) {
    case MREC_JOB:
        if (job_name_ok(r->job) && !job_by_name(s, r->job)) job_add(s, r->job_id, r->job);
        break;
    case MREC_PUT:
    case MREC_DEL:
        for (size_t i = 0; i < rp->n; i++) {
            manifest_rec_t *q = &rp->recs[i];
            if (q->job_id == r->job_id && q->rank == r->rank && q->kind == r->kind &&
                q->index == r->index && q->step == r->step) {
                rp->recs[i] = rp->recs[--rp->n];
                break;
            }
        }
        if (r->type == MREC_PUT) {
            if (rp->n == rp->cap) {
                size_t nc = rp->cap ? rp->cap * 2 : 256;
                manifest_rec_t *nr = realloc(rp->recs, nc * sizeof *nr);
                if (!nr) { rp->oom = true; return; }
                rp->recs = nr;
                rp->cap = nc;
            }
            rp->recs[rp->n++] = *r;
            if (r->job[0] && job_name_ok(r->job) && !job_by_name(s, r->job)) job_add(s, r->job_id, r->job);
        }
        break;
    case MREC_RELEASE:
        for (size_t i = 0; i < rp->n;) {
            if (rp->recs[i].job_id == r->job_id) rp->recs[i] = rp->recs[--rp->n];
            else i++;
        }
        break;
    }
}

static int rec_seq_desc(const void *a, const void *b) {
    uint64_t x = ((const manifest_rec_t *)a)->seq, y = ((const manifest_rec_t *)b)->seq;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int open_tier(store_t *s, char *err, size_t errlen) {
    const store_config_t *cfg = &s->cfg;
    if (mkdir(s->spill_dir, 0700) != 0) {
        if (errno != EEXIST) {
            int e = errno;
            errbuf_set(err, errlen, "creating spill directory %s: %s", s->spill_dir, strerror(e));
            return -e;
        }
    } else {
        /* A new directory's entry is in its parent: make it durable before
         * anything in it is acknowledged. */
        char parent[4200];
        snprintf(parent, sizeof parent, "%s", s->spill_dir);
        char *slash = strrchr(parent, '/');
        if (!slash) snprintf(parent, sizeof parent, ".");
        else if (slash == parent) parent[1] = 0;
        else *slash = 0;
        int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        int rc = pfd < 0 || fsync(pfd) != 0 ? -errno : 0;
        if (pfd >= 0) close(pfd);
        if (rc) {
            errbuf_set(err, errlen, "fsync of %s, the parent of the new spill directory: %s", parent, strerror(-rc));
            return rc;
        }
    }
    char lp[4200];
    snprintf(lp, sizeof lp, "%s/ballastd.lock", s->spill_dir);
    s->lock_fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lock_fd < 0) {
        int e = errno;
        errbuf_set(err, errlen, "opening %s: %s", lp, strerror(e));
        return -e;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t n = pread(s->lock_fd, pid, sizeof pid - 1, 0);
        if (n > 0) pid[n] = 0;
        pid[strcspn(pid, "\n")] = 0;
        errbuf_set(err, errlen, "spill directory %s is in use by another ballastd (pid %s); give each "
               "instance its own --spill-dir", s->spill_dir, *pid ? pid : "unknown");
        return -EBUSY;
    }
    char pid[32];
    int pl = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(s->lock_fd, 0) != 0 || pwrite(s->lock_fd, pid, (size_t)pl, 0) != pl) {
        /* The pid is informational only. */
    }

    uint64_t fb = cfg->spill_file_bytes ? cfg->spill_file_bytes : (1ull << 30);
    if (fb > cfg->spill_bytes) fb = cfg->spill_bytes;
    fb = (fb + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN;

    replay_t rp = { .s = s };
    manifest_open_info_t info;
    int rc = manifest_open(&s->man, s->spill_dir, fb, replay_fn, &rp, &info, err, errlen);
    if (rc) { free(rp.recs); return rc; }
    if (rp.oom) { free(rp.recs); errbuf_set(err, errlen, "out of memory replaying the manifest"); return -ENOMEM; }
    if (info.file_bytes != fb)
        log_info("store: %s was made with %llu-byte spill files; keeping that size",
                 s->spill_dir, (unsigned long long)info.file_bytes);

    tier_config_t tc = {
        .dir = s->spill_dir,
        .capacity = cfg->spill_bytes,
        .file_bytes = info.file_bytes,
        .io = { .backend = (io_backend_t)cfg->io_backend, .queue_depth = cfg->queue_depth,
                .threads = cfg->io_threads },
        .direct = cfg->direct_io,
    };
    rc = tier_open(&s->tier, &tc, err, errlen);
    if (rc) { free(rp.recs); return rc; }

    tier_stats_t ts;
    tier_stats(s->tier, &ts);
    /* The pool's segments come and go with the jobs (pool.h), so they are
     * not registered with io_uring as fixed buffers. */

    /* Serve the persistent blobs of earlier runs, newest record first: two
     * live records can only share space when a damaged DEL or RELEASE was
     * skipped, and then the later one is the blob that owns it. */
    if (rp.n) qsort(rp.recs, rp.n, sizeof *rp.recs, rec_seq_desc); /* recs is NULL when there are none */
    size_t lost = 0;
    for (size_t i = 0; i < rp.n; i++) {
        manifest_rec_t *r = &rp.recs[i];
        blob_t *b = calloc(1, sizeof *b);
        if (!b) { lost++; continue; }
        b->key = (store_key_t){ r->job_id, r->rank, r->kind, r->index, r->step };
        b->length = r->length;
        b->alen = (r->length + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
        bool inside = r->length && r->nvme_off + b->alen >= r->nvme_off &&
                      r->nvme_off + b->alen <= ts.capacity;
        if (!inside || tier_reserve(s->tier, r->nvme_off, b->alen) != 0 || lookup(s, &b->key)) {
            log_warn("store: persistent blob (job %s, rank %u, kind %u, index %llu, step %llu) at "
                     "offset %llu, %llu bytes, is reported missing: %s", r->job, r->rank, r->kind,
                     (unsigned long long)r->index, (unsigned long long)r->step,
                     (unsigned long long)r->nvme_off, (unsigned long long)r->length,
                     !inside ? "it lies outside the spill files (--spill-bytes shrank?)"
                             : "a later record of the manifest holds its space or key (a damaged "
                               "record that freed it was skipped)");
            free(b);
            lost++;
            continue;
        }
        b->crc = r->crc;
        b->crc_valid = true;
        b->flags = r->flags | STORE_F_PERSISTENT;
        b->state = STORE_READY;
        b->on_nvme = true;
        b->durable = true;
        b->in_manifest = true;
        b->nvme_off = r->nvme_off;
        index_add(s, b);
        job_charge(s, b);
        s->persistent_live++;
    }
    free(rp.recs);
    /* jobs the log names that hold nothing any more (released) take no slot */
    for (size_t i = s->njobs; i-- > 0;)
        if (!job_has_blobs(s, s->jobs[i].id)) job_drop(s, s->jobs[i].id);
    s->manifest_damaged = info.damaged_records;
    s->manifest_lost = lost;
    if (!info.created)
        log_info("store: manifest of %s replayed: %llu records, %zu persistent blobs served again%s",
                 s->spill_dir, (unsigned long long)info.records, rp.n - lost,
                 info.torn_bytes ? ", torn tail cut" : "");
    if (info.damaged_records)
        log_warn("store: %s/manifest had %llu damaged record(s), the first at offset %llu; they were "
                 "skipped (the lines above say what they read as), and %zu blob(s) of good records "
                 "are not served (also above). The log is kept as it is until its next compaction; check the disk",
                 s->spill_dir, (unsigned long long)info.damaged_records,
                 (unsigned long long)info.first_damaged_off, lost);
    maybe_compact(s);
    return 0;
}

int store_open(store_t **out, const store_config_t *cfg, char *err, size_t errlen) {
    *out = NULL;
    store_t *s = calloc(1, sizeof *s);
    if (!s) { errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    s->cfg = *cfg;
    if (!s->cfg.evict_wait_ms) s->cfg.evict_wait_ms = 5000;
    s->lock_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    clock_cond_init(&s->cv);
    pthread_mutex_init(&s->mmu, NULL);
    pthread_cond_init(&s->mcv, NULL);
    pthread_cond_init(&s->pf_cv, NULL);
    s->pf_check_tail = &s->pf_check;
    clock_cond_init(&s->ev_cv);
    s->nhash = 1024;
    s->hash = calloc(s->nhash, sizeof *s->hash);
    s->jobs = calloc(MAX_JOBS, sizeof *s->jobs);
    if (!s->hash || !s->jobs) { store_close(s); errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }

    if (cfg->evict_ahead_ms > 10000) {
        store_close(s);
        errbuf_set(err, errlen, "--evict-ahead %ums: give 0..10s (0: never write ahead of need)", cfg->evict_ahead_ms);
        return -EINVAL;
    }
    if (cfg->evict_watermark_pct > 90) {
        store_close(s);
        errbuf_set(err, errlen, "--evict-watermark %u%%: give 0..90 (percent of the pool kept free)",
                   cfg->evict_watermark_pct);
        return -EINVAL;
    }
    int rc = pool_open(&s->pool, &cfg->pool, err, errlen);
    if (rc) { store_close(s); return rc; }
    if (cfg->spill_dir && *cfg->spill_dir) {
        if (strlen(cfg->spill_dir) > 4000) { store_close(s); errbuf_set(err, errlen, "--spill-dir path too long"); return -ENAMETOOLONG; }
        if (cfg->spill_bytes == 0) {
            store_close(s);
            errbuf_set(err, errlen, "--spill-dir given with --spill-bytes 0: give the tier a size such as 64G");
            return -EINVAL;
        }
        snprintf(s->spill_dir, sizeof s->spill_dir, "%s", cfg->spill_dir);
        s->cfg.spill_dir = s->spill_dir;
        rc = open_tier(s, err, errlen);
        if (rc) { store_close(s); return rc; }
    }
    s->cfg.spill_dir = s->spill_dir[0] ? s->spill_dir : NULL;
    s->cfg.pool.name = NULL;
    if (s->tier) {
        pool_stats_t ps;
        pool_stats(s->pool, &ps);
        s->ev_mark = ps.total_bytes / 100 * s->cfg.evict_watermark_pct;
        s->pf_bytes_cap = ps.total_bytes / 4;
        rc = pthread_create(&s->pf_thread, NULL, prefetch_main, s);
        if (rc) { store_close(s); errbuf_set(err, errlen, "starting the prefetch thread: %s", strerror(rc)); return -rc; }
        s->pf_started = true;
        rc = pthread_create(&s->ev_thread, NULL, evict_main, s);
        if (rc) { store_close(s); errbuf_set(err, errlen, "starting the eviction thread: %s", strerror(rc)); return -rc; }
        s->ev_started = true;
    }
    *out = s;
    return 0;
}

void store_close(store_t *s) {
    if (!s) return;
    if (s->ev_started) { /* it finishes the writes in flight first */
        pthread_mutex_lock(&s->mu);
        s->ev_stop = true;
        pthread_cond_signal(&s->ev_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->ev_thread, NULL);
    }
    if (s->pf_started) {
        pthread_mutex_lock(&s->mu);
        s->pf_stop = true;
        pthread_cond_broadcast(&s->pf_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->pf_thread, NULL);
    }
    if (s->tier) tier_sync(s->tier, true);
    if (s->man) manifest_sync(s->man);
    for (uint64_t i = 0; s->hash && i < s->nhash; i++) {
        for (blob_t *b = s->hash[i], *n; b; b = n) {
            n = b->hnext;
            for (holder_t *h = b->holders, *hn; h; h = hn) { hn = h->next; free(h); }
            free(b);
        }
    }
    for (blob_t *b = s->zombies, *n; b; b = n) {
        n = b->lnext;
        for (holder_t *h = b->holders, *hn; h; h = hn) { hn = h->next; free(h); }
        free(b);
    }
    tier_close(s->tier);
    manifest_close(s->man);
    pool_close(s->pool);
    if (s->lock_fd >= 0) close(s->lock_fd); /* releases the flock */
    free(s->hash);
    free(s->jobs);
    free(s->sessions);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mmu);
    pthread_cond_destroy(&s->mcv);
    pthread_cond_destroy(&s->pf_cv);
    pthread_cond_destroy(&s->ev_cv);
    free(s);
}

pool_t *store_pool(store_t *s) { return s->pool; }

/* ---- jobs ---- */

status_t store_job_id(store_t *s, const char *name, uint64_t *job_id, char *err, size_t errlen) {
    if (!job_name_ok(name)) {
        errbuf_set(err, errlen, "bad job name \"%.80s\": use 1..%d characters of A-Z a-z 0-9 . _ -",
               name ? name : "(null)", JOB_NAME_MAX);
        return STATUS_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&s->mu);
    job_t *j = job_by_name(s, name);
    if (j) { *job_id = j->id; pthread_mutex_unlock(&s->mu); return STATUS_OK; }
    uint64_t id = fnv1a(name, 0);
    for (uint64_t salt = 1; job_by_id(s, id); salt++) id = fnv1a(name, salt);
    if (job_add(s, id, name) != 0) {
        pthread_mutex_unlock(&s->mu);
        errbuf_set(err, errlen, "too many jobs (%d); Release finished jobs", MAX_JOBS);
        return STATUS_NO_SPACE;
    }
    if (s->man) {
        manifest_rec_t r = { .type = MREC_JOB, .job_id = id };
        snprintf(r.job, sizeof r.job, "%s", name);
        pthread_mutex_lock(&s->mmu);
        int rc = manifest_append(s->man, &r, false);
        if (rc == 0) rc = msync_locked(s);
        pthread_mutex_unlock(&s->mmu);
        if (rc) {
            s->njobs--;
            pthread_mutex_unlock(&s->mu);
            errbuf_set(err, errlen, "recording job %s in the manifest: %s", name, strerror(-rc));
            return STATUS_IO_ERROR;
        }
    }
    *job_id = id;
    pthread_mutex_unlock(&s->mu);
    return STATUS_OK;
}

status_t store_job_claim(store_t *s, uint64_t job_id, bool local, uint32_t uid, bool no_sessions) {
    pthread_mutex_lock(&s->mu);
    job_t *j = job_by_id(s, job_id);
    status_t st = STATUS_OK;
    if (!j) st = STATUS_NOT_FOUND;
    else if (!j->claimed || (no_sessions && !job_has_blobs(s, job_id))) { j->claimed = true; j->owner_local = local; j->owner_uid = uid; }
    else if (j->owner_local != local || (local && j->owner_uid != uid)) st = STATUS_PERMISSION_DENIED;
    pthread_mutex_unlock(&s->mu);
    return st;
}

void store_job_forget(store_t *s, uint64_t job_id) {
    pthread_mutex_lock(&s->mu);
    if (!job_has_blobs(s, job_id)) job_drop(s, job_id);
    pthread_mutex_unlock(&s->mu);
    pool_trim(s->pool, job_id);
}

void store_job_idle(store_t *s, uint64_t job_id) { pool_trim(s->pool, job_id); }

status_t store_job_find(store_t *s, const char *name, uint64_t *job_id) {
    if (!job_name_ok(name)) return STATUS_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    job_t *j = job_by_name(s, name);
    if (j) *job_id = j->id;
    pthread_mutex_unlock(&s->mu);
    return j ? STATUS_OK : STATUS_NOT_FOUND;
}

bool store_job_name(store_t *s, uint64_t job_id, char *name) {
    pthread_mutex_lock(&s->mu);
    job_t *j = job_by_id(s, job_id);
    if (j) memcpy(name, j->name, sizeof j->name);
    pthread_mutex_unlock(&s->mu);
    return j != NULL;
}

/* ---- sessions ---- */

status_t store_session_open(store_t *s, uint64_t sid, uint64_t quota_bytes) {
    if (sid == 0) return STATUS_INVALID_ARGUMENT;
    pthread_mutex_lock(&s->mu);
    status_t st = STATUS_OK;
    if (s->draining) st = STATUS_UNAVAILABLE;
    else if (session_find(s, sid)) st = STATUS_ALREADY_EXISTS;
    else {
        if (s->nsessions == s->cap_sessions) {
            size_t nc = s->cap_sessions ? s->cap_sessions * 2 : 16;
            session_t *ns = realloc(s->sessions, nc * sizeof *ns);
            if (!ns) st = STATUS_NO_SPACE;
            else { s->sessions = ns; s->cap_sessions = nc; }
        }
        if (st == STATUS_OK) s->sessions[s->nsessions++] = (session_t){ .sid = sid, .quota = quota_bytes };
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

int store_drop_session(store_t *s, uint64_t sid) {
    pthread_mutex_lock(&s->mu);
    session_t *se = session_find(s, sid);
    if (!se) { pthread_mutex_unlock(&s->mu); return -1; }
    int freed = 0;
    /* Collect first: unlinking changes the chains being walked. */
    size_t n = 0, cap = 64;
    blob_t **v = malloc(cap * sizeof *v);
    for (uint64_t i = 0; v && i < s->nhash; i++) {
        for (blob_t *b = s->hash[i]; b; b = b->hnext) {
            if (b->owner != sid && !holder_of(b, sid)) continue;
            if (n == cap) {
                blob_t **nv = realloc(v, cap * 2 * sizeof *nv);
                if (!nv) break;
                v = nv;
                cap *= 2;
            }
            v[n++] = b;
        }
    }
    for (size_t i = 0; i < n; i++) {
        blob_t *b = v[i];
        b->refs++;
        pin_drop(s, b, sid, 0);
        b->refs--;
        if (b->writer == sid && !b->committing) b->writer = 0;
        if (b->owner == sid) {
            bool keep = (b->flags & STORE_F_PERSISTENT) && (b->state != STORE_ALLOCATED || b->committing);
            if (keep) uncharge(s, b);
            else { blob_unlink(s, b); freed++; continue; }
        }
        if (b->linked) lru_update(s, b);
        else blob_maybe_destroy(s, b);
    }
    free(v);
    /* Pins on, and puts into, blobs already freed by others. */
    for (blob_t *b = s->zombies, *next; b; b = next) {
        next = b->lnext;
        if (b->writer == sid && !b->committing) { b->writer = 0; blob_maybe_destroy(s, b); continue; }
        if (holder_of(b, sid)) pin_drop(s, b, sid, 0);
    }
    se = session_find(s, sid);
    *se = s->sessions[--s->nsessions];
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return freed;
}

static void session_counters(const session_t *se, store_session_stats_t *out) {
    memset(out, 0, sizeof *out);
    out->sid = se->sid;
    out->quota_bytes = se->quota;
    out->used_bytes = se->used;
    out->blobs = se->blobs;
    out->pins = se->pins;
}

status_t store_session_usage(store_t *s, uint64_t sid, store_session_stats_t *out) {
    pthread_mutex_lock(&s->mu);
    session_t *se = session_find(s, sid);
    if (se) session_counters(se, out);
    pthread_mutex_unlock(&s->mu);
    return se ? STATUS_OK : STATUS_NO_SESSION;
}

status_t store_session_stats(store_t *s, uint64_t sid, store_session_stats_t *out) {
    pthread_mutex_lock(&s->mu);
    session_t *se = session_find(s, sid);
    if (!se) { pthread_mutex_unlock(&s->mu); return STATUS_NO_SESSION; }
    session_counters(se, out);
    for (uint64_t i = 0; i < s->nhash; i++)
        for (blob_t *b = s->hash[i]; b; b = b->hnext)
            if (b->owner == sid) {
                if (b->in_pool) out->pool_bytes += b->alen;
                else out->nvme_bytes += b->alen;
            }
    pthread_mutex_unlock(&s->mu);
    return STATUS_OK;
}

status_t store_sessions(store_t *s, store_session_stats_t **out, size_t *n) {
    pthread_mutex_lock(&s->mu);
    *n = s->nsessions;
    *out = NULL;
    if (s->nsessions) {
        *out = calloc(s->nsessions, sizeof **out);
        if (!*out) { *n = 0; pthread_mutex_unlock(&s->mu); return STATUS_NO_SPACE; }
    }
    for (size_t i = 0; i < s->nsessions; i++) {
        (*out)[i] = (store_session_stats_t){ .sid = s->sessions[i].sid, .quota_bytes = s->sessions[i].quota,
                                             .used_bytes = s->sessions[i].used,
                                             .blobs = s->sessions[i].blobs, .pins = s->sessions[i].pins };
    }
    for (uint64_t i = 0; i < s->nhash; i++)
        for (blob_t *b = s->hash[i]; b; b = b->hnext)
            for (size_t j = 0; b->owner && j < s->nsessions; j++)
                if ((*out)[j].sid == b->owner) {
                    if (b->in_pool) (*out)[j].pool_bytes += b->alen;
                    else (*out)[j].nvme_bytes += b->alen;
                }
    pthread_mutex_unlock(&s->mu);
    return STATUS_OK;
}

/* ---- put ---- */

/* A put by sid of key whose blob was freed while sid was writing: drop the
 * writer's hold so the region can go. With mu held. True if one was found. */
static bool writer_release(store_t *s, uint64_t sid, const store_key_t *key) {
    for (blob_t *z = s->zombies; z; z = z->lnext) {
        if (z->writer == sid && !z->committing && key_eq(&z->key, key)) {
            z->writer = 0;
            blob_maybe_destroy(s, z);
            return true;
        }
    }
    return false;
}

static void free_blobs(store_t *s, blob_t **v, size_t n, bool release_job, uint64_t job_id);

status_t store_put_alloc(store_t *s, uint64_t sid, const store_key_t *key, uint64_t len,
                         uint32_t flags, pool_region_t *region, char *err, size_t errlen) {
    if (len == 0 || len > pool_max_alloc(s->pool)) {
        errbuf_set(err, errlen, "blob length %llu out of range: 1..%llu bytes (the whole pool; raise "
               "--pool-bytes for larger blobs)", (unsigned long long)len,
               (unsigned long long)pool_max_alloc(s->pool));
        return STATUS_INVALID_ARGUMENT;
    }
    if (key->kind < STORE_KIND_ACTIVATION || key->kind > STORE_KIND_OTHER) {
        errbuf_set(err, errlen, "unknown blob kind %u: use 1 (activation), 2 (optimizer state), 3 (param) "
               "or 4 (other)", key->kind);
        return STATUS_INVALID_ARGUMENT;
    }
    if (flags & ~(uint32_t)(STORE_F_PERSISTENT | STORE_F_REPLACE)) {
        errbuf_set(err, errlen, "unknown put flags 0x%x", flags);
        return STATUS_INVALID_ARGUMENT;
    }
    if ((flags & STORE_F_PERSISTENT) && !s->tier) {
        errbuf_set(err, errlen, "persistent blob refused: this ballastd has no NVMe tier (start it with "
               "--spill-dir)");
        return STATUS_INVALID_ARGUMENT;
    }
    uint64_t alen = (len + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    pthread_mutex_lock(&s->mu);
    status_t st = STATUS_OK;
    session_t *se = session_find(s, sid);
    if (s->draining) {
        errbuf_set(err, errlen, "ballastd is draining: no new puts");
        st = STATUS_UNAVAILABLE;
    } else if (!se) {
        errbuf_set(err, errlen, "unknown session %llu (expired lease? open a new session)", (unsigned long long)sid);
        st = STATUS_NO_SESSION;
    }
    blob_t *old = st == STATUS_OK ? lookup(s, key) : NULL;
    if (old) {
        if (old->state == STORE_ALLOCATED || old->committing) {
            errbuf_set(err, errlen, "key is being written by a put that has not committed");
            st = STATUS_BUSY;
        } else if (!(flags & STORE_F_REPLACE)) {
            errbuf_set(err, errlen, "key exists (free it first or put with the replace flag)");
            st = STATUS_ALREADY_EXISTS;
        } else if (old->pins) {
            errbuf_set(err, errlen, "key exists and is pinned by %u get(s); cannot replace it now", old->pins);
            st = STATUS_BUSY;
        }
    }
    if (st == STATUS_OK && se->quota && se->used + alen > se->quota) {
        errbuf_set(err, errlen, "session quota exceeded: %llu of %llu bytes used, this put needs %llu "
               "(free blobs, or open the session with a larger quota, up to ballastd's --session-quota)", (unsigned long long)se->used,
               (unsigned long long)se->quota, (unsigned long long)alen);
        st = STATUS_QUOTA_EXCEEDED;
    }
    job_t *jq = st == STATUS_OK && s->cfg.job_quota ? job_by_id(s, key->job_id) : NULL;
    /* the blob this put replaces gives its share back */
    uint64_t back = old && old->job_charged ? old->alen : 0;
    if (jq && jq->used - back + alen > s->cfg.job_quota) {
        errbuf_set(err, errlen, "job %s quota exceeded: its blobs hold %llu of the %llu bytes of "
               "--job-quota (persistent ones count until freed or released), this put needs %llu "
               "(free or release blobs of the job, or raise --job-quota)", jq->name,
               (unsigned long long)jq->used, (unsigned long long)s->cfg.job_quota,
               (unsigned long long)alen);
        st = STATUS_JOB_QUOTA_EXCEEDED;
    }
    if (st != STATUS_OK) { pthread_mutex_unlock(&s->mu); return st; }
    if (old) free_blobs(s, &old, 1, false, 0);
    /* Charge first so that concurrent puts of the session see the quota taken. */
    se->used += alen;
    se->blobs++;
    blob_t *b = calloc(1, sizeof *b);
    if (!b) { st = STATUS_NO_SPACE; errbuf_set(err, errlen, "out of memory"); }
    else {
        b->key = *key;
        b->length = len;
        b->alen = alen;
        b->flags = flags & STORE_F_PERSISTENT;
        b->state = STORE_ALLOCATED;
        b->owner = sid;
        b->refs = 1; /* hidden from others until it has space */
        index_add(s, b);
        job_charge(s, b);
        st = alloc_space(s, key->job_id, alen, &b->region, true, err, errlen);
        b->refs--;
        if (st == STATUS_OK && b->linked) {
            b->in_pool = true;
            b->writer = sid;
            *region = b->region;
        } else {
            if (st == STATUS_OK) { pool_free(s->pool, &b->region); st = STATUS_NOT_FOUND; errbuf_set(err, errlen, "freed while allocating"); }
            if (b->linked) blob_unlink(s, b);
            else blob_maybe_destroy(s, b);
        }
    }
    if (st != STATUS_OK && !b) {
        se = session_find(s, sid);
        if (se) { se->used -= alen; se->blobs--; }
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

status_t store_put_commit(store_t *s, uint64_t sid, const store_key_t *key, store_crc_t *crc,
                          char *err, size_t errlen) {
    pthread_mutex_lock(&s->mu);
    blob_t *b = lookup(s, key);
    status_t st = STATUS_OK;
    if (!b || b->writer != sid) {
        /* Freed (free, release) while sid was writing it: let the region go now. */
        if (writer_release(s, sid, key)) {
            pthread_mutex_unlock(&s->mu);
            errbuf_set(err, errlen, "the key was freed (free or release) before this put committed");
            return STATUS_NOT_FOUND;
        }
    }
    if (!b) { st = STATUS_NOT_FOUND; errbuf_set(err, errlen, "no put in progress for this key"); }
    else if (b->state != STORE_ALLOCATED || b->committing) { st = STATUS_BUSY; errbuf_set(err, errlen, "key is not waiting for a commit"); }
    else if (b->owner != sid) { st = STATUS_NOT_HELD; errbuf_set(err, errlen, "this put belongs to another session"); }
    if (st != STATUS_OK) { pthread_mutex_unlock(&s->mu); return st; }
    b->committing = true;
    s->busy_ops++;
    void *p = pool_ptr(s->pool, &b->region);
    pthread_mutex_unlock(&s->mu);

    /* Only a persistent blob needs its crc now (it goes to NVMe before the
     * commit is acknowledged); the others get it when first spilled, which
     * keeps a full pass over the bytes off the put path. */
    bool persistent = b->flags & STORE_F_PERSISTENT;
    uint32_t c = persistent ? crc32c(0, p, b->length) : 0;
    uint64_t off = 0;
    int rc = 0;
    bool wrote = false, recorded = false;
    if (persistent) {
        rc = tier_alloc(s->tier, b->alen, &off);
        if (rc) {
            pthread_mutex_lock(&s->mu);
            if (!reclaim_nvme_copies(s, b->alen, &off)) {
                errbuf_set(err, errlen, "NVMe tier full: no room for a persistent blob of %llu bytes "
                       "(raise --spill-bytes or free persistent blobs)", (unsigned long long)b->length);
                rc = -ENOSPC;
            } else rc = 0;
            pthread_mutex_unlock(&s->mu);
        }
        if (rc == 0) {
            int64_t w = tier_rw(s->tier, IO_WRITE, p, b->alen, off);
            rc = w == (int64_t)b->alen ? 0 : (w < 0 ? (int)w : -EIO);
            if (rc == 0) rc = tier_sync_file(s->tier, off);
            if (rc) {
                tier_free(s->tier, off);
                errbuf_set(err, errlen, "writing a persistent blob to %s: %s", s->spill_dir, strerror(-rc));
            } else wrote = true;
        }
        if (rc == 0) {
            manifest_rec_t r;
            pthread_mutex_lock(&s->mu);
            b->nvme_off = off;
            b->crc = c;
            b->crc_valid = true;
            rec_from_blob(s, b, &r, MREC_PUT);
            pthread_mutex_unlock(&s->mu);
            rc = manifest_append_durable(s, &r, b);
            if (rc) errbuf_set(err, errlen, "recording a persistent blob in %s/manifest: %s", s->spill_dir, strerror(-rc));
            else recorded = true;
        }
    }

    pthread_mutex_lock(&s->mu);
    s->busy_ops--;
    b->committing = false;
    b->writer = 0;
    b->crc = c;
    b->crc_valid = persistent;
    if (wrote && !recorded) tier_free(s->tier, off);
    if (!b->linked) {
        /* Freed (free, release, session drop) while we committed. */
        if (recorded) {
            manifest_rec_t r;
            rec_from_blob(s, b, &r, MREC_DEL);
            pthread_mutex_lock(&s->mmu);
            if (manifest_append(s->man, &r, false) == 0) msync_locked(s);
            pthread_mutex_unlock(&s->mmu);
            tier_free(s->tier, off);
        }
        blob_maybe_destroy(s, b);
        pthread_mutex_unlock(&s->mu);
        errbuf_set(err, errlen, "the key was freed before its commit finished");
        return STATUS_NOT_FOUND;
    }
    if (rc) {
        blob_unlink(s, b);
        pthread_mutex_unlock(&s->mu);
        return rc == -ENOSPC ? STATUS_NO_SPACE : STATUS_IO_ERROR;
    }
    b->state = STORE_READY;
    s->puts++;
    s->put_bytes += b->length;
    if (persistent) {
        b->on_nvme = true;
        b->durable = true;
        b->nvme_off = off;
        s->persistent_live++;
        s->spill_writes++;
        s->spill_wbytes += b->alen;
        if (!session_find(s, b->owner)) b->owner = 0; /* its session ended meanwhile */
    }
    lru_update(s, b);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (crc) *crc = (store_crc_t){ .value = c, .known = persistent };
    return STATUS_OK;
}

status_t store_put_abort(store_t *s, uint64_t sid, const store_key_t *key) {
    pthread_mutex_lock(&s->mu);
    blob_t *b = lookup(s, key);
    status_t st = STATUS_OK;
    if ((!b || b->writer != sid) && writer_release(s, sid, key)) st = STATUS_OK;
    else if (!b) st = STATUS_NOT_FOUND;
    else if (b->state != STORE_ALLOCATED || b->committing) st = STATUS_BUSY;
    else if (b->writer != sid) st = STATUS_NOT_HELD;
    else { b->writer = 0; blob_unlink(s, b); }
    pthread_mutex_unlock(&s->mu);
    return st;
}

status_t store_put_copy(store_t *s, uint64_t sid, const store_key_t *key, const void *data,
                        uint64_t len, uint32_t flags, store_crc_t *crc, char *err, size_t errlen) {
    pool_region_t r;
    status_t st = store_put_alloc(s, sid, key, len, flags, &r, err, errlen);
    if (st != STATUS_OK) return st;
    memcpy(pool_ptr(s->pool, &r), data, len);
    return store_put_commit(s, sid, key, crc, err, errlen);
}

/* ---- get, pin ---- */

static void fill_info(store_t *s, const blob_t *b, store_blob_info_t *o) {
    memset(o, 0, sizeof *o);
    o->key = b->key;
    o->length = b->length;
    o->crc_known = b->crc_valid;
    o->crc32c = b->crc_valid ? b->crc : 0;
    o->flags = b->flags;
    o->tier = (store_tier_t)((b->in_pool ? STORE_TIER_POOL : 0) | (b->on_nvme ? STORE_TIER_NVME : 0));
    o->state = b->state;
    if (b->in_pool) o->region = b->region;
    o->nvme_off = b->on_nvme ? b->nvme_off : 0;
    o->owner = b->owner;
    o->pins = b->pins;
    job_t *j = job_by_id(s, b->key.job_id);
    if (j) memcpy(o->job, j->name, sizeof o->job);
}

/* Make the blob resident and pin it for sid. With mu held. */
static status_t get_locked(store_t *s, uint64_t sid, const store_key_t *key, pool_region_t *region,
                           store_blob_info_t *info, char *err, size_t errlen) {
    if (!session_find(s, sid)) {
        errbuf_set(err, errlen, "unknown session %llu (expired lease? open a new session)", (unsigned long long)sid);
        return STATUS_NO_SESSION;
    }
    for (;;) {
        blob_t *b = lookup(s, key);
        if (!b) { errbuf_set(err, errlen, "no blob with this key"); return STATUS_NOT_FOUND; }
        if (b->state == STORE_ALLOCATED || b->committing) {
            errbuf_set(err, errlen, "blob not committed yet");
            return STATUS_BUSY;
        }
        if (b->state == STORE_SPILLING || b->state == STORE_LOADING) {
            b->refs++;
            pthread_cond_wait(&s->cv, &s->mu);
            b->refs--;
            if (b->linked) lru_update(s, b);
            else blob_maybe_destroy(s, b);
            continue;
        }
        bool loaded = !b->in_pool; /* a read-back is checked by load_blob */
        if (!b->in_pool) {
            b->refs++;
            status_t st = load_blob(s, b, true, err, errlen);
            b->refs--;
            if (!b->linked) {
                if (st == STATUS_OK) { pool_free(s->pool, &b->region); b->in_pool = false; }
                blob_maybe_destroy(s, b);
                errbuf_set(err, errlen, "blob freed while it was being read back");
                return STATUS_NOT_FOUND;
            }
            if (st != STATUS_OK) { lru_update(s, b); return st; }
        }
        if (pin_add(s, b, sid) != 0) {
            lru_update(s, b);
            errbuf_set(err, errlen, "out of memory");
            return STATUS_NO_SPACE;
        }
        if (region && b->crc_valid && !loaded) {
            /* Every session maps the whole pool, so a committed pool copy
             * may have been written by another client since: check it (with
             * mu dropped; the pin keeps the region) before handing it out. */
            uint32_t want = b->crc;
            pthread_mutex_unlock(&s->mu);
            uint32_t got = crc32c(0, pool_ptr(s->pool, &b->region), b->length);
            pthread_mutex_lock(&s->mu);
            if (got != want) {
                s->crc_errors++;
                pin_drop(s, b, sid, 1);
                errbuf_set(err, errlen, "the pool copy of this blob changed after its commit (crc32c "
                           "%08x, committed %08x): a client wrote into the shared pool; nothing is "
                           "returned (put it again)", got, want);
                return STATUS_DATA_LOSS;
            }
        }
        if (region) { /* a get (store_pin asks for no region and moves no bytes) */
            *region = b->region;
            s->gets++;
            s->get_bytes += b->length;
        }
        if (info) fill_info(s, b, info);
        return STATUS_OK;
    }
}

status_t store_get(store_t *s, uint64_t sid, const store_key_t *key, pool_region_t *region,
                   store_blob_info_t *info, char *err, size_t errlen) {
    pthread_mutex_lock(&s->mu);
    status_t st = get_locked(s, sid, key, region, info, err, errlen);
    pthread_mutex_unlock(&s->mu);
    return st;
}

status_t store_get_done(store_t *s, uint64_t sid, const store_key_t *key) {
    pthread_mutex_lock(&s->mu);
    status_t st = STATUS_NOT_HELD;
    blob_t *b = lookup(s, key);
    if (b && holder_of(b, sid)) { pin_drop(s, b, sid, 1); st = STATUS_OK; }
    else {
        for (b = s->zombies; b; b = b->lnext) {
            if (key_eq(&b->key, key) && holder_of(b, sid)) { pin_drop(s, b, sid, 1); st = STATUS_OK; break; }
        }
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

status_t store_get_copy(store_t *s, uint64_t sid, const store_key_t *key, void **data,
                        uint64_t *len, char *err, size_t errlen) {
    pool_region_t r;
    store_blob_info_t info;
    *data = NULL;
    *len = 0;
    status_t st = store_get(s, sid, key, &r, &info, err, errlen);
    if (st != STATUS_OK) return st;
    void *buf = malloc(info.length ? info.length : 1);
    if (buf) memcpy(buf, pool_ptr(s->pool, &r), info.length);
    store_get_done(s, sid, key);
    if (!buf) { errbuf_set(err, errlen, "out of memory copying %llu bytes", (unsigned long long)info.length); return STATUS_NO_SPACE; }
    *data = buf;
    *len = info.length;
    return STATUS_OK;
}

status_t store_pin(store_t *s, uint64_t sid, const store_key_t *key, char *err, size_t errlen) {
    return store_get(s, sid, key, NULL, NULL, err, errlen);
}

status_t store_unpin(store_t *s, uint64_t sid, const store_key_t *key) {
    return store_get_done(s, sid, key);
}

status_t store_prefetch(store_t *s, const store_key_t *key) {
    pthread_mutex_lock(&s->mu);
    blob_t *b = lookup(s, key);
    status_t st = b ? STATUS_OK : STATUS_NOT_FOUND;
    if (b && s->tier && b->state == STORE_READY && !b->in_pool && b->on_nvme && s->pf_n < PREFETCH_QUEUE) {
        s->pf_q[(s->pf_head + s->pf_n) % PREFETCH_QUEUE] = *key;
        s->pf_n++;
        pthread_cond_signal(&s->pf_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Whether [off, off+len) of seg lies inside b's pool region. */
static bool in_region(const blob_t *b, uint32_t seg, uint64_t off, uint64_t len) {
    return b->in_pool && len > 0 && seg == b->region.seg && off >= b->region.off &&
           len <= b->region.len && off - b->region.off <= b->region.len - len;
}

bool store_session_holds(store_t *s, uint64_t sid, const store_key_t *key, uint32_t seg,
                         uint64_t off, uint64_t len) {
    pthread_mutex_lock(&s->mu);
    bool ok = false;
    blob_t *b = lookup(s, key);
    if (b && in_region(b, seg, off, len)) {
        bool writer = b->state == STORE_ALLOCATED && !b->committing && b->owner == sid;
        holder_t *h = holder_of(b, sid);
        ok = writer || (h && h->count > 0);
    }
    /* A blob freed while sid had it pinned stays readable until get_done. */
    for (blob_t *z = s->zombies; z && !ok; z = z->lnext)
        if (key_eq(&z->key, key) && holder_of(z, sid) && in_region(z, seg, off, len)) ok = true;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

status_t store_info(store_t *s, const store_key_t *key, store_blob_info_t *out) {
    pthread_mutex_lock(&s->mu);
    blob_t *b = lookup(s, key);
    if (b) fill_info(s, b, out);
    pthread_mutex_unlock(&s->mu);
    return b ? STATUS_OK : STATUS_NOT_FOUND;
}

/* ---- free, release ---- */

/* Unlink the blobs v[0..n) (mu held); a persistent one gets its manifest
 * record cancelled (one DEL per blob, or one RELEASE for a whole job) before
 * its NVMe space can be reused: the blobs are held by refs across the sync. */
static void free_blobs(store_t *s, blob_t **v, size_t n, bool release_job, uint64_t job_id) {
    bool any_durable = false;
    for (size_t i = 0; i < n; i++) {
        v[i]->refs++;
        if (v[i]->durable) any_durable = true;
        blob_unlink(s, v[i]);
    }
    if (any_durable && s->man) {
        pthread_mutex_lock(&s->mmu);
        if (release_job) {
            manifest_rec_t r = { .type = MREC_RELEASE, .job_id = job_id };
            job_t *j = job_by_id(s, job_id);
            if (j) snprintf(r.job, sizeof r.job, "%s", j->name);
            manifest_append(s->man, &r, false);
        } else {
            for (size_t i = 0; i < n; i++) {
                if (!v[i]->durable) continue;
                manifest_rec_t r;
                rec_from_blob(s, v[i], &r, MREC_DEL);
                manifest_append(s->man, &r, false);
            }
        }
        /* The sync runs under mu: frees of persistent blobs are rare and
         * their space must not be handed out before the record is durable. */
        msync_locked(s);
        pthread_mutex_unlock(&s->mmu);
    }
    for (size_t i = 0; i < n; i++) {
        v[i]->refs--;
        v[i]->durable = false;
        blob_maybe_destroy(s, v[i]);
    }
    if (any_durable) maybe_compact(s);
}

status_t store_free(store_t *s, uint64_t sid, const store_key_t *key) {
    pthread_mutex_lock(&s->mu);
    blob_t *b = lookup(s, key);
    if (!b) { pthread_mutex_unlock(&s->mu); return STATUS_NOT_FOUND; }
    if (b->state == STORE_ALLOCATED && !b->committing && b->writer != sid) {
        /* Its writer may still be writing into the region. */
        pthread_mutex_unlock(&s->mu);
        return STATUS_BUSY;
    }
    if (b->writer == sid) b->writer = 0; /* the writer frees its own put: an abort */
    free_blobs(s, &b, 1, false, 0);
    pthread_mutex_unlock(&s->mu);
    return STATUS_OK;
}

int store_release_job(store_t *s, uint64_t job_id) {
    pthread_mutex_lock(&s->mu);
    size_t n = 0, cap = 64;
    blob_t **v = malloc(cap * sizeof *v);
    for (uint64_t i = 0; v && i < s->nhash; i++) {
        for (blob_t *b = s->hash[i]; b; b = b->hnext) {
            if (b->key.job_id != job_id) continue;
            if (n == cap) {
                blob_t **nv = realloc(v, cap * 2 * sizeof *nv);
                if (!nv) break;
                v = nv;
                cap *= 2;
            }
            v[n++] = b;
        }
    }
    if (v) free_blobs(s, v, n, true, job_id);
    free(v);
    pthread_mutex_unlock(&s->mu);
    return (int)n;
}

/* ---- list, drain, stats ---- */

static int info_cmp(const void *a, const void *b) {
    return key_cmp(&((const store_blob_info_t *)a)->key, &((const store_blob_info_t *)b)->key);
}

status_t store_list(store_t *s, const store_filter_t *f, store_blob_info_t **out, size_t *n) {
    pthread_mutex_lock(&s->mu);
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    for (uint64_t i = 0; i < s->nhash; i++) {
        for (blob_t *b = s->hash[i]; b; b = b->hnext) {
            if (f) {
                if (f->job_id && b->key.job_id != f->job_id) continue;
                if (f->rank >= 0 && b->key.rank != (uint64_t)f->rank) continue;
                if (f->kind && b->key.kind != f->kind) continue;
                if (f->committed_only && (b->state == STORE_ALLOCATED || b->committing)) continue;
            }
            if (*n == cap) {
                size_t nc = cap ? cap * 2 : 64;
                store_blob_info_t *no = realloc(*out, nc * sizeof *no);
                if (!no) { free(*out); *out = NULL; *n = 0; pthread_mutex_unlock(&s->mu); return STATUS_INVALID_ARGUMENT; }
                *out = no;
                cap = nc;
            }
            fill_info(s, b, &(*out)[(*n)++]);
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (*n) qsort(*out, *n, sizeof **out, info_cmp);
    return STATUS_OK;
}

int store_drain(store_t *s, char *err, size_t errlen) {
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    while (s->busy_ops) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    int rc = 0;
    if (s->tier) {
        rc = tier_sync(s->tier, true);
        if (rc) errbuf_set(err, errlen, "fdatasync of the spill files in %s: %s", s->spill_dir, strerror(-rc));
    }
    if (rc == 0 && s->man) {
        pthread_mutex_lock(&s->mmu);
        rc = msync_locked(s);
        pthread_mutex_unlock(&s->mmu);
        if (rc) errbuf_set(err, errlen, "fdatasync of %s/manifest: %s", s->spill_dir, strerror(-rc));
    }
    return rc;
}

void store_stats(store_t *s, store_stats_t *out) {
    memset(out, 0, sizeof *out);
    pool_stats(s->pool, &out->pool);
    pthread_mutex_lock(&s->mu);
    out->blobs = s->nblobs;
    for (uint64_t i = 0; i < s->nhash; i++)
        for (blob_t *b = s->hash[i]; b; b = b->hnext) {
            if (b->in_pool) out->blobs_in_pool++;
            if (b->on_nvme) out->blobs_on_nvme++;
        }
    out->persistent_blobs = s->persistent_live;
    out->spill_writes = s->spill_writes;
    out->spill_reads = s->spill_reads;
    out->spill_write_bytes = s->spill_wbytes;
    out->spill_read_bytes = s->spill_rbytes;
    out->puts = s->puts;
    out->put_bytes = s->put_bytes;
    out->gets = s->gets;
    out->get_bytes = s->get_bytes;
    out->evictions = s->evictions;
    out->ahead_writes = s->ahead_writes;
    out->prefetches = s->prefetches;
    out->prefetch_depth_max = s->pf_depth_max;
    out->crc_errors = s->crc_errors;
    out->manifest_damaged = s->manifest_damaged;
    out->manifest_lost = s->manifest_lost;
    out->sessions = s->nsessions;
    out->draining = s->draining;
    pthread_mutex_unlock(&s->mu);
    if (s->tier) {
        tier_stats_t ts;
        tier_stats(s->tier, &ts);
        out->spill_capacity = ts.capacity;
        out->spilled_bytes = ts.used;
        out->direct_io = ts.direct;
        out->io_depth_max = ts.io.inflight_max;
        out->io_inflight = ts.io.inflight;
        snprintf(out->io_backend, sizeof out->io_backend, "%s", ts.backend);
        snprintf(out->io_fallback, sizeof out->io_fallback, "%s", ts.fallback);
    } else {
        snprintf(out->io_backend, sizeof out->io_backend, "none");
    }
}
