/* client.h: the client library workers link to talk to ballastd.
 *
 * One API, two transports chosen at open time:
 *   - shared-memory mode ("unix:/path" or a bare path): OpenSession over
 *     gRPC on the Unix socket, then the pool segments and the session ring
 *     arrive over the fd socket (SCM_RIGHTS) and are mapped; puts and gets
 *     move no bytes through the service: the worker writes into and reads
 *     from the blob's region in the pool directly.
 *   - remote mode ("host:port", or OC_REMOTE with a unix address): every
 *     request is a gRPC call and the bytes travel in the messages; regions
 *     handed to the caller are private heap buffers.
 * Either way: oc_put_alloc -> write -> oc_put_commit; oc_get -> read ->
 * oc_get_done; the *_copy helpers do both steps with a memcpy.
 *
 * Every call is synchronous unless it ends in _async: those return a
 * handle (> 0) that oc_wait() completes. A background thread sends
 * Heartbeat every lease/3. The handle is thread-safe.
 *
 * Errors: functions return a status_t (proto/status.h), always one of its
 * wire values (gRPC's numbers, STATUS_OK = 0; status_name() names it), and
 * leave a message in oc_last_error() (per thread) that names the service
 * address and, when it is unreachable, says how to start ballastd. */
#ifndef BALLAST_OFFLOAD_CLIENT_H
#define BALLAST_OFFLOAD_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "job_name.h"
#include "proto/status.h"

typedef struct oc_client oc_client_t;

/* Blob kinds (offload.proto Kind). */
typedef enum {
    OC_KIND_ACTIVATION = 1,
    OC_KIND_OPTIMIZER_STATE = 2,
    OC_KIND_PARAM = 3,
    OC_KIND_OTHER = 4,
} oc_kind_t;

/* A blob's name inside the session's job. */
typedef struct {
    uint32_t rank;   /* worker rank */
    uint32_t kind;   /* oc_kind_t */
    uint64_t index;  /* e.g. block index */
    uint64_t step;   /* training step */
} oc_key_t;

/* open flags */
#define OC_REMOTE 0x1u    /* force remote mode even on a Unix socket */

typedef struct {
    const char *addr;        /* "unix:/run/ballast/ballastd.sock", "/path", or "host:port" */
    const char *job;         /* job name: job_name_ok() (common/job_name.h) */
    uint32_t rank;           /* this worker's rank */
    uint64_t quota_bytes;    /* 0 = the service default */
    const char *token;       /* NULL = none (or the contents of token_file) */
    const char *token_file;  /* read the token from here when token is NULL */
    unsigned flags;          /* OC_REMOTE */
    double timeout_s;        /* per-call deadline; 0 = 30 s */
    const char *client_name; /* shown in `ballast status`; NULL = program name */
    const char *tls_ca;      /* PEM CA of ballastd's --tls-cert: TLS to a TCP address
                                (NULL = $BALLAST_TLS_CA, else plaintext) */
    const char *tls_cert;    /* client certificate and key for --tls-ca (NULL = $BALLAST_TLS_CERT, */
    const char *tls_key;     /*   $BALLAST_TLS_KEY) */
    bool allow_insecure_token; /* send a token over plaintext TCP (also $BALLAST_ALLOW_INSECURE_TOKEN=1) */
} oc_options_t;

/* A region handed to the caller: the blob's bytes. */
typedef struct {
    void *ptr;       /* where to write (put) or read (get) */
    uint64_t len;    /* blob length, bytes */
    uint32_t crc32c; /* get: the blob's checksum, when crc_known */
    bool crc_known;  /* get: crc32c is known (false for a non-persistent blob that was
                        never written to NVMe: its checksum is computed only then) */
    bool persistent; /* get: blob is persistent */
    /* private to the library */
    uint32_t _seg;   /* shared mode: region segment */
    uint64_t _off;   /* shared mode: region offset, bytes */
    void *_priv;     /* remote mode: heap buffer or unpacked response */
} oc_buf_t;

/* Open a session. *out on STATUS_OK. */
status_t oc_open(const oc_options_t *opt, oc_client_t **out);

/* Close the session. keep_blobs: leave its non-persistent blobs in the
 * service (owned by the job) instead of freeing them. NULL is a no-op. */
status_t oc_close(oc_client_t *c, bool keep_blobs);

/* Forget the session without telling the service (a crashed worker, for
 * tests); the lease then reclaims its memory. */
void oc_abandon(oc_client_t *c);

bool oc_is_shared(const oc_client_t *c);    /* shared-memory mode */
uint64_t oc_session_id(const oc_client_t *c);
uint64_t oc_quota(const oc_client_t *c);    /* granted quota, bytes */
uint64_t oc_max_blob(const oc_client_t *c); /* largest blob, bytes */
const char *oc_addr(const oc_client_t *c);

/* One mapped pool segment of a shared-memory session. */
typedef struct {
    void *base;      /* start of the mapping in this process */
    uint64_t bytes;  /* length of the mapping, bytes */
} oc_segment_t;

/* The pool segments of this session's job that it has mapped so far
 * (shared-memory mode), valid until oc_close: *n gets their count (0 in
 * remote mode, where regions are private heap buffers, and 0 for a job that
 * has stored nothing yet). The job's segments are created by ballastd on
 * demand: one named by a later completion is fetched over the fd socket and
 * mapped then, and handed to the segment hook. For registering the pool with
 * a GPU driver once per segment (workers/backend/cuda/pool_register.cu).
 * Returns the array or NULL. */
const oc_segment_t *oc_segments(const oc_client_t *c, uint32_t *n);

/* Called once for every segment mapped after oc_set_segment_hook (from the
 * thread whose request named it, before that request returns), and at once
 * for the segments already mapped. NULL fn removes the hook. */
typedef void (*oc_segment_hook_t)(void *arg, const oc_segment_t *seg);
void oc_set_segment_hook(oc_client_t *c, oc_segment_hook_t fn, void *arg);

/* ---- two-step put/get ---- */

/* Reserve len bytes for key; b->ptr is where to write. persistent: the
 * blob survives the session and ballastd restarts (acked after fsync). */
status_t oc_put_alloc(oc_client_t *c, const oc_key_t *k, uint64_t len, bool persistent,
                      oc_buf_t *b);
/* Publish what was written into b (from oc_put_alloc for the same key). */
status_t oc_put_commit(oc_client_t *c, const oc_key_t *k, oc_buf_t *b);
/* Give up a put in progress: frees the reservation. */
status_t oc_put_abort(oc_client_t *c, const oc_key_t *k, oc_buf_t *b);

/* Fetch key; b->ptr/len are the bytes (pinned until oc_get_done). */
status_t oc_get(oc_client_t *c, const oc_key_t *k, oc_buf_t *b);
status_t oc_get_done(oc_client_t *c, const oc_key_t *k, oc_buf_t *b);

/* ---- one-step helpers ---- */

status_t oc_put_copy(oc_client_t *c, const oc_key_t *k, const void *data, uint64_t len,
                     bool persistent);
/* Copy the blob into dst (cap bytes); *len gets its length. A blob larger
 * than cap fails with STATUS_INVALID_ARGUMENT (and *len says how much is needed). */
status_t oc_get_copy(oc_client_t *c, const oc_key_t *k, void *dst, uint64_t cap,
                     uint64_t *len);

status_t oc_free(oc_client_t *c, const oc_key_t *k);
status_t oc_prefetch(oc_client_t *c, const oc_key_t *k);
status_t oc_pin(oc_client_t *c, const oc_key_t *k);
status_t oc_unpin(oc_client_t *c, const oc_key_t *k);
/* Round trip without work (renews the lease; latency probe). */
status_t oc_nop(oc_client_t *c);

/* ---- async ---- */

typedef uint64_t oc_handle_t; /* 0 = none */

/* Start an op; *h gets a handle for oc_wait. In remote mode the op runs
 * synchronously here and oc_wait returns its result. */
status_t oc_get_async(oc_client_t *c, const oc_key_t *k, oc_handle_t *h);
status_t oc_prefetch_async(oc_client_t *c, const oc_key_t *k, oc_handle_t *h);
status_t oc_free_async(oc_client_t *c, const oc_key_t *k, oc_handle_t *h);
status_t oc_put_commit_async(oc_client_t *c, const oc_key_t *k, oc_buf_t *b, oc_handle_t *h);
/* Wait for h; b (may be NULL) gets the region for a GET. timeout_s < 0:
 * forever; 0: a poll (takes the completions already there, never blocks).
 * STATUS_DEADLINE_EXCEEDED when it ran out (h stays valid). */
status_t oc_wait(oc_client_t *c, oc_handle_t h, oc_buf_t *b, double timeout_s);

/* ---- service-wide ---- */

/* Send a heartbeat now (the background thread does this on its own). */
status_t oc_heartbeat(oc_client_t *c);

/* ---- testing ---- */

/* Push a raw 64-byte ring entry (rp_req_t of proto/offload_ring.h;
 * its req_id is overwritten) and wait for its raw completion (rp_cpl_t) into
 * cpl64. Shared-memory mode only. Returns the completion's status, or a
 * client-side error (STATUS_FAILED_PRECONDITION in remote mode). */
status_t oc_raw_call(oc_client_t *c, const void *req64, void *cpl64, double timeout_s);

/* Message of the last failing call on this thread. A failed async op's
 * message is the one oc_wait() sets, on whichever thread waits for the
 * handle (in remote mode it travels with the handle from the submitting
 * thread). Per thread, not per client: a client may be used by several
 * threads at once, and oc_open() fails without one. */
const char *oc_last_error(void);

#endif
