/* store.h: ballastd's key -> blob store.
 *
 * A blob is the bytes one worker offloaded under a 32-byte key. It lives in
 * the pool (pool.h), on the NVMe tier (tier_nvme.h), or both. The store keeps
 * the index, the per-blob state machine, pin counts, an LRU of evictable
 * blobs, the owner session of each blob and per-session quota accounting,
 * and it persists PERSISTENT blobs through a crash-safe manifest
 * (manifest.h) so that a restarted ballastd with the same spill directory
 * serves them again.
 *
 * Blob life cycle:
 *   store_put_alloc   -> ALLOCATED (region handed to the writer)
 *   store_put_commit  -> READY (a PERSISTENT blob gets its crc32c, is written
 *                        to NVMe and fsynced, then its manifest record, before
 *                        this returns; other blobs get their crc32c only when
 *                        first written to NVMe, so a commit costs no pass over
 *                        the bytes)
 *   eviction          READY -> SPILLING (crc32c computed if not yet known)
 *                     -> READY on NVMe only (pool freed)
 *   store_get / pin   NVMe-only -> LOADING -> READY in pool (crc checked), pinned
 *   store_free        the key disappears at once; the space is returned when
 *                     the last pin drops
 *
 * Sessions: the service opens a store session per client session
 * (store_session_open) with a quota; every blob a session puts is charged to
 * it (its length rounded up to 4 KiB, whichever tier it is on) until it is
 * freed. Every blob is also charged to its key's job (cfg.job_quota) until it
 * leaves the index. store_drop_session (lease expiry, CloseSession) frees the
 * session's non-persistent blobs and drops its pins; its persistent blobs
 * stay, charged to no session but still to their job, until
 * store_release_job or a free.
 *
 * Access control: the store does not check which job a session belongs to;
 * the service must only pass keys whose job_id is the session's job. A pin is
 * owned by the session that took it. A blob's pool region always lies in a
 * segment of its key's job (pool_alloc with the job id as owner), so only
 * that job's clients can map it.
 *
 * Thread-safe: every function may be called from any thread. Calls that do
 * I/O (put_commit of a persistent blob, get of a spilled blob, put_alloc that
 * has to evict) block the calling thread, never the whole store. */
#ifndef BALLAST_STORE_H
#define BALLAST_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "job_name.h"
#include "pool.h"
#include "proto/status.h"

#define STORE_ERR_LEN   256   /* a comfortable size for err buffers */

/* ---- keys ---- */

typedef enum {
    STORE_KIND_ACTIVATION = 1,      /* activations kept during a step */
    STORE_KIND_OPTIMIZER_STATE = 2, /* fp32 master weights, AdamW moments */
    STORE_KIND_PARAM = 3,           /* parameters */
    STORE_KIND_OTHER = 4,           /* anything else */
} store_kind_t;

/* 32 bytes, no padding; compared field by field (all fields significant). */
typedef struct {
    uint64_t job_id; /* from store_job_id(job name) */
    uint32_t rank;   /* global rank of the owner */
    uint32_t kind;   /* store_kind_t */
    uint64_t index;  /* layer / block / shard index, caller-defined */
    uint64_t step;   /* training step */
} store_key_t;

/* ---- status ---- */

/* Every call returns a status_t (proto/status.h). Besides the gRPC values it
 * uses the refinements STATUS_QUOTA_EXCEEDED (the session's or the job's quota),
 * STATUS_NO_SPACE (pool full and nothing evictable, NVMe tier full, out of
 * memory), STATUS_BUSY (wrong state: commit of a blob not ALLOCATED,
 * replace of a pinned blob, put of a key another session is writing),
 * STATUS_IO_ERROR (the NVMe tier failed), STATUS_NO_SESSION (unknown
 * session id) and STATUS_NOT_HELD (get_done / unpin / commit by a session
 * that does not hold the blob); status_to_grpc() gives the code a client
 * sees. */

/* ---- blob description ---- */

enum {
    STORE_F_PERSISTENT = 1u << 0, /* survives the session and a restart of ballastd;
                                     fsynced to NVMe before put_commit returns */
    STORE_F_REPLACE    = 1u << 1, /* put_alloc: replace an existing unpinned READY blob
                                     of the same key (it is freed first) */
};

typedef enum {
    STORE_TIER_POOL = 1, /* in the pool only */
    STORE_TIER_NVME = 2, /* on NVMe only */
    STORE_TIER_BOTH = 3, /* in the pool and a valid copy on NVMe */
} store_tier_t;

typedef enum {
    STORE_ALLOCATED = 1, /* put in progress: region handed out, not committed */
    STORE_READY,         /* committed, readable */
    STORE_SPILLING,      /* being written to NVMe by eviction */
    STORE_LOADING,       /* being read back from NVMe */
} store_state_t;

typedef struct {
    store_key_t key;
    uint64_t length;       /* bytes the writer asked for */
    uint32_t crc32c;       /* of bytes [0, length); meaningful only when crc_known */
    bool crc_known;        /* crc32c computed: always for PERSISTENT blobs and for blobs
                              that have been written to NVMe; false (crc32c 0) before */
    uint32_t flags;        /* STORE_F_PERSISTENT */
    store_tier_t tier;
    store_state_t state;
    pool_region_t region;  /* valid when tier has POOL */
    uint64_t nvme_off;     /* offset in the NVMe tier, bytes; valid when tier has NVME */
    uint64_t owner;        /* session id charged for it; 0 = nobody (persistent, after restart) */
    uint32_t pins;         /* pin count over all sessions */
    char job[JOB_NAME_MAX + 1]; /* job name, "" when unknown */
} store_blob_info_t;

/* ---- configuration and lifetime ---- */

typedef enum {
    STORE_IO_AUTO = 0,     /* io_uring, falling back to threads when refused */
    STORE_IO_URING,        /* io_uring or fail */
    STORE_IO_THREADS,      /* pread/pwrite thread pool */
} store_io_backend_t;

typedef struct {
    pool_config_t pool;          /* the pool (see pool.h) */
    const char *spill_dir;       /* NVMe tier directory; NULL or "" = no tier (no eviction,
                                    no persistence: PERSISTENT puts fail with STATUS_INVALID_ARGUMENT) */
    uint64_t spill_bytes;        /* capacity of the tier, bytes (> 0 with spill_dir) */
    uint64_t spill_file_bytes;   /* size of one spill file, bytes; 0 = 1 GiB (capped by spill_bytes) */
    store_io_backend_t io_backend;
    uint32_t queue_depth;        /* io_uring depth / in-flight limit; 0 = 64 (>= 32) */
    uint32_t io_threads;         /* threads of the fallback backend; 0 = 4 */
    uint32_t evict_wait_ms;      /* how long put_alloc waits for space (evictions by
                                    others, pins dropping); 0 = 5000 */
    uint32_t evict_watermark_pct;/* percent of the pool the background evictor keeps free
                                    (0..90; 0 = evict only for waiting allocations) */
    uint32_t evict_ahead_ms;     /* for this long after the pool was last short of space, keep
                                    the watermark's bytes of writes in flight, the blobs written
                                    keeping their regions (0: never; at most 10000) */
    bool direct_io;              /* try O_DIRECT (default true via store_config_default) */
    uint64_t job_quota;          /* bytes all blobs of one job may hold together; 0 = no limit */
} store_config_t;

/* Defaults: 256 MiB pool in one segment, huge pages off, mlock on, no spill
 * dir, 1 GiB spill files, io auto, depth 64, 4 threads, 5 s wait, watermark
 * 10%, writes ahead for 50 ms, O_DIRECT. */
void store_config_default(store_config_t *cfg);

typedef struct store store_t;

/* Open the pool and (with spill_dir) the NVMe tier. When spill_dir holds a
 * manifest from an earlier run, its persistent blobs are loaded into the
 * index (tier NVME, owner 0) and served again; anything else in the old
 * spill files is discarded. The spill directory is locked (flock on
 * "<dir>/ballastd.lock"); a second store on the same directory gets -EBUSY.
 * Returns 0 and *out, or -errno with a message in err. */
int store_open(store_t **out, const store_config_t *cfg, char *err, size_t errlen);

/* Finish in-flight I/O, sync, close the tier and the pool, free everything.
 * Persistent blobs stay on disk. NULL is a no-op. No other call may run
 * concurrently or afterwards. */
void store_close(store_t *s);

/* The pool (for handing a job's segments to its clients). Owned by the store. */
pool_t *store_pool(store_t *s);

/* ---- jobs ---- */

/* Map a job name (job_name_ok(), common/job_name.h) to its stable 64-bit
 * id, registering it (and recording it in the manifest when there is a
 * spill dir) the first time. The same name always gives the same id, across
 * restarts. STATUS_INVALID_ARGUMENT with a message for a bad name. */
status_t store_job_id(store_t *s, const char *name, uint64_t *job_id,
                      char *err, size_t errlen);

/* The id of a known job without registering it: NOT_FOUND when the service
 * has never seen the name (listing must not create state). */
status_t store_job_find(store_t *s, const char *name, uint64_t *job_id);

/* Bind a job to its first caller (local: a Unix-socket uid; else TCP
 * callers): later claims by another owner get PERMISSION_DENIED, so no
 * caller reaches another's blobs by naming its job. Kept in memory only:
 * after a restart the first caller claims the job again. */
status_t store_job_claim(store_t *s, uint64_t job_id, bool local, uint32_t uid, bool no_sessions);
/* (no_sessions: the caller knows no session of the job is open; a job that
 * then holds no blob either is free to claim again.) */

/* Drop job_id from the job table when it holds no blob (after Release), so
 * its slot is reused; the manifest forgets it at the next compaction and
 * a restart does not re-register it. */
void store_job_forget(store_t *s, uint64_t job_id);

/* The job has no session left: its empty pool segments go back to the
 * budget now (segments that still hold blobs stay; pool.h). */
void store_job_idle(store_t *s, uint64_t job_id);

/* The name of a known job id into name[JOB_NAME_MAX+1]; false if unknown. */
bool store_job_name(store_t *s, uint64_t job_id, char *name);

/* ---- sessions ---- */

/* Register session sid (> 0, chosen by the caller, unique) with a quota in
 * bytes (0 = unlimited). STATUS_ALREADY_EXISTS if sid is taken, STATUS_UNAVAILABLE
 * while draining. */
status_t store_session_open(store_t *s, uint64_t sid, uint64_t quota_bytes);

/* Lease expiry or CloseSession: free every non-persistent blob charged to
 * sid (those pinned by others are unlinked now and freed when their pins
 * drop), abort its uncommitted puts, drop every pin it holds, and forget
 * the session. Its persistent blobs stay, charged to nobody. Returns the
 * number of blobs freed (>= 0) or -1 when sid is unknown. */
int store_drop_session(store_t *s, uint64_t sid);

typedef struct {
    uint64_t sid;          /* session id */
    uint64_t quota_bytes;  /* 0 = unlimited */
    uint64_t used_bytes;   /* charged bytes (4 KiB-rounded lengths), both tiers */
    uint64_t pool_bytes;   /* of which in the pool, bytes */
    uint64_t nvme_bytes;   /* of which only on NVMe, bytes */
    uint64_t blobs;        /* blobs charged to it */
    uint64_t pins;         /* pins it holds */
} store_session_stats_t;

/* Usage of one session; STATUS_NO_SESSION if unknown. Walks every blob for
 * the pool/NVMe split: for the Stats RPC, not for every request. */
status_t store_session_stats(store_t *s, uint64_t sid, store_session_stats_t *out);

/* The counters of store_session_stats without the walk (pool_bytes and
 * nvme_bytes stay 0), in time independent of the number of blobs: what
 * every ring completion and Heartbeat reports. */
status_t store_session_usage(store_t *s, uint64_t sid, store_session_stats_t *out);

/* ---- blob operations (sid: the calling session) ---- */

/* Start a put: reserve a pool region of len bytes (1 .. pool_max_alloc)
 * for key, charged to sid. Evicts LRU unpinned READY blobs to NVMe when the
 * pool is full, waiting up to evict_wait_ms. On STATUS_OK *region is where the
 * writer puts the bytes (only the first len are covered by the crc).
 * STATUS_ALREADY_EXISTS when the key exists (unless STORE_F_REPLACE), STATUS_BUSY when
 * it is being written or (with REPLACE) pinned, STATUS_QUOTA_EXCEEDED, STATUS_NO_SPACE,
 * STATUS_INVALID_ARGUMENT (len, kind, PERSISTENT without a spill dir). */
status_t store_put_alloc(store_t *s, uint64_t sid, const store_key_t *key,
                         uint64_t len, uint32_t flags, pool_region_t *region,
                         char *err, size_t errlen);

/* A blob's checksum as reported by commit: known is false when it has not
 * been computed yet (value is then 0). */
typedef struct {
    uint32_t value;        /* crc32c of bytes [0, length) when known */
    bool known;
} store_crc_t;

/* Finish a put started by sid and make the blob READY. A PERSISTENT blob
 * gets its crc32c, is written to the NVMe tier, fdatasynced, then recorded
 * in the manifest (fdatasynced) before this returns STATUS_OK; on an I/O error
 * the blob is dropped and STATUS_IO_ERROR returned. Other blobs are published
 * without reading their bytes: their crc32c is computed when eviction first
 * writes them to NVMe. *crc (may be NULL) gets the checksum with known set
 * for PERSISTENT blobs, {0, false} otherwise. STATUS_NOT_FOUND,
 * STATUS_NOT_HELD (another session's put), STATUS_BUSY (not ALLOCATED). */
status_t store_put_commit(store_t *s, uint64_t sid, const store_key_t *key,
                          store_crc_t *crc, char *err, size_t errlen);

/* Abandon a put started by sid: the region is freed, the key forgotten
 * (also when the key was already freed by a release meanwhile). */
status_t store_put_abort(store_t *s, uint64_t sid, const store_key_t *key);

/* Remote mode: put_alloc + copy data[0..len) + put_commit in one call. */
status_t store_put_copy(store_t *s, uint64_t sid, const store_key_t *key,
                        const void *data, uint64_t len, uint32_t flags,
                        store_crc_t *crc, char *err, size_t errlen);

/* Make the blob resident (reading it back from NVMe if needed, checking its
 * crc32c: STATUS_DATA_LOSS on mismatch, nothing returned), pin it for sid and
 * return its region and description (info may be NULL). Every STATUS_OK must
 * be matched by store_get_done. Waits for a concurrent spill/load of the
 * same blob. STATUS_NOT_FOUND, STATUS_BUSY (not committed yet), STATUS_NO_SPACE
 * (no room to load it), STATUS_IO_ERROR. */
status_t store_get(store_t *s, uint64_t sid, const store_key_t *key,
                   pool_region_t *region, store_blob_info_t *info,
                   char *err, size_t errlen);

/* Drop one pin sid took with store_get (or store_pin). The blob becomes
 * evictable again when no pins remain. STATUS_NOT_HELD if sid holds none. */
status_t store_get_done(store_t *s, uint64_t sid, const store_key_t *key);

/* Remote mode: get + copy out + get_done. *data is malloc()ed (free() it),
 * *len its length. */
status_t store_get_copy(store_t *s, uint64_t sid, const store_key_t *key,
                        void **data, uint64_t *len, char *err, size_t errlen);

/* Hint: the blob will be read soon. Starts an asynchronous read-back when it
 * is only on NVMe (if the pool has room without evicting pinned data) and
 * returns at once. STATUS_OK also when it is already resident or being
 * loaded; STATUS_NOT_FOUND. A crc mismatch found by a prefetch is reported
 * by the next get. */
status_t store_prefetch(store_t *s, const store_key_t *key);

/* Remove the key (any session of the job may). Its space is returned now,
 * or when the last pin drops. STATUS_NOT_FOUND; STATUS_BUSY when another
 * session's put of it has not committed. A persistent blob's manifest
 * record is deleted too (durably, before its NVMe space is reused). */
status_t store_free(store_t *s, uint64_t sid, const store_key_t *key);

/* Keep the blob in RAM: like store_get without returning the region; undo
 * with store_unpin. */
status_t store_pin(store_t *s, uint64_t sid, const store_key_t *key,
                   char *err, size_t errlen);
status_t store_unpin(store_t *s, uint64_t sid, const store_key_t *key);

/* Whether [off, off+len) of segment seg lies inside the pool region of key
 * and sid may touch it: sid's own uncommitted put (write) or a pin sid holds
 * (read). For validating ring entries. */
bool store_session_holds(store_t *s, uint64_t sid, const store_key_t *key,
                         uint32_t seg, uint64_t off, uint64_t len);

/* Description of one blob (no pin taken); STATUS_NOT_FOUND. */
status_t store_info(store_t *s, const store_key_t *key, store_blob_info_t *out);

/* ---- listing and bulk operations ---- */

typedef struct {
    uint64_t job_id;  /* 0 = any job */
    int64_t rank;     /* -1 = any rank */
    uint32_t kind;    /* 0 = any kind */
    bool committed_only; /* leave out ALLOCATED blobs */
} store_filter_t;

/* Blobs matching f (NULL = all), sorted by key. *out is malloc()ed (free()
 * it; NULL when *n is 0). Returns STATUS_OK or STATUS_INVALID_ARGUMENT (no memory). */
status_t store_list(store_t *s, const store_filter_t *f,
                    store_blob_info_t **out, size_t *n);

/* Release(job): free every blob of job_id, persistent ones included (their
 * manifest records are deleted, durably). A put of the job still being
 * written loses its key now; its region stays reserved for the writer until
 * it commits (STATUS_NOT_FOUND) or aborts. Returns the number of blobs freed. */
int store_release_job(store_t *s, uint64_t job_id);

/* Drain: refuse new puts and sessions from now on (STATUS_UNAVAILABLE), wait
 * for in-flight I/O and puts being committed, fdatasync the tier and the
 * manifest. Gets, frees and drop_session keep working. Returns 0 or -errno
 * with a message. */
int store_drain(store_t *s, char *err, size_t errlen);

/* ---- statistics ---- */

typedef struct {
    pool_stats_t pool;        /* pool figures (used, free, largest free, fragmentation) */
    uint64_t blobs;           /* blobs in the index */
    uint64_t blobs_in_pool;   /* of which resident */
    uint64_t blobs_on_nvme;   /* of which with a copy on NVMe */
    uint64_t persistent_blobs;/* of which persistent */
    uint64_t spill_capacity;  /* NVMe tier capacity, bytes (0 = no tier) */
    uint64_t spilled_bytes;   /* NVMe tier space in use, bytes */
    uint64_t spill_writes;    /* blobs written to NVMe (evictions and persistent puts) */
    uint64_t spill_reads;     /* blobs read back from NVMe */
    uint64_t spill_write_bytes; /* bytes */
    uint64_t spill_read_bytes;  /* bytes */
    uint64_t puts;            /* puts committed (store_put_commit, store_put_copy) */
    uint64_t put_bytes;       /* their blob lengths, bytes: what clients moved into the service */
    uint64_t gets;            /* gets served (store_get, store_get_copy; not store_pin) */
    uint64_t get_bytes;       /* their blob lengths, bytes: what clients were handed back */
    uint64_t evictions;       /* blobs whose pool copy was dropped to make room */
    uint64_t ahead_writes;    /* blobs written to NVMe ahead of need, keeping their pool copy */
    uint64_t prefetches;      /* read-backs started by store_prefetch */
    uint32_t prefetch_depth_max; /* the most prefetch reads submitted and not yet ended (callback not run) at once */
    uint32_t io_depth_max;    /* the most requests of any kind at the device at once (the tier's count) */
    uint32_t io_inflight;     /* requests at the device now (the tier's count) */
    uint64_t crc_errors;      /* read-backs whose crc32c did not match */
    uint64_t manifest_damaged; /* damaged manifest records skipped at open */
    uint64_t manifest_lost;   /* persistent blobs of the replayed manifest not served again */
    uint64_t sessions;        /* open sessions */
    char io_backend[16];      /* "io_uring", "threads", "none" */
    char io_fallback[128];    /* why io_uring was not used ("" when it is / not asked) */
    bool direct_io;           /* spill files opened with O_DIRECT */
    bool draining;            /* store_drain was called */
} store_stats_t;

void store_stats(store_t *s, store_stats_t *out);

/* Per-session usage of every open session: *out malloc()ed (free() it). */
status_t store_sessions(store_t *s, store_session_stats_t **out, size_t *n);

#endif
