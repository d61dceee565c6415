/* rdzv.h: the rendezvous store: a key/value store with blocking reads and
 * named barriers, served over gRPC (proto/rendezvous.proto, package
 * ballast.rdzv.v1) by rank 0 of a job (rdzv_server_start linked into the
 * worker) or by the standalone ballast-rdzv. Ranks publish and fetch
 * bootstrap data there: NCCL unique ids, shared-memory socket names.
 *
 * Values are bytes. Keys are 1..RDZV_MAX_KEY bytes of printable ASCII.
 * Calls carry a job id and the world size; a server refuses calls from
 * another job (FAILED_PRECONDITION), so two jobs sharing an address cannot
 * mix.
 *
 * Blocking operations (Wait, Barrier) are long polls: the server holds a
 * call for at most a short slice and answers "not yet"; the client calls
 * again until its own timeout. So a few server threads serve any number of
 * waiting ranks, and Set/Get are never starved by waiters.
 *
 * Every function returns 0 or a negative errno (-ETIMEDOUT, -ENOENT, ...)
 * with a message in the caller's err buffer. See docs/comm.md. */
#ifndef BALLAST_RDZV_H
#define BALLAST_RDZV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RDZV_MAX_KEY 256                  /* bytes */
#define RDZV_DEFAULT_MAX_VALUE (1u << 20) /* bytes: default value size limit */
#define RDZV_DEFAULT_MAX_BYTES (256u << 20) /* bytes: default limit of everything held */
#define RDZV_ERR_LEN 512
#define RDZV_POLL_SLICE_MS 200            /* longest a server holds one Wait/Barrier call */

typedef struct rdzv_server rdzv_server_t;
typedef struct rdzv_client rdzv_client_t;

/* ---- server ---- */

typedef struct {
    const char *listen;        /* "host:port" (port 0 = any free port) or "unix:/path" */
    const char *job_id;        /* only calls with this job id are served; "" or NULL = any */
    int world;                 /* expected world size; 0 = take what callers say */
    int threads;               /* server threads; 0 = 4 */
    size_t max_value_bytes;    /* largest value accepted; 0 = RDZV_DEFAULT_MAX_VALUE */
    size_t max_keys;           /* most keys held; 0 = 65536 */
    size_t max_bytes;          /* most bytes held in keys, values and barriers; 0 = RDZV_DEFAULT_MAX_BYTES */
} rdzv_server_opts_t;

/* Start serving in background threads. *bound_port (may be NULL) gets the
 * TCP port actually bound (useful with port 0), 0 for a unix socket.
 * NULL on error with a message. */
rdzv_server_t *rdzv_server_start(const rdzv_server_opts_t *opts, int *bound_port,
                                 char *err, size_t errlen);

/* Stop serving and free everything. First waits (up to 5 s) until every
 * rank of each barrier's latest completed round has heard that it
 * completed (and every rank of a failed round that it failed), so rank 0
 * can stop right after its last barrier; callers still waiting then get
 * UNAVAILABLE. NULL is fine. */
void rdzv_server_stop(rdzv_server_t *s);

/* Counters, for ballast-rdzv's log and tests. */
typedef struct {
    uint64_t keys;             /* keys held */
    uint64_t sets, gets, waits, barriers; /* calls answered, per method */
    uint64_t barriers_done;    /* barrier rounds completed */
    uint64_t barriers_failed;  /* barrier rounds that timed out */
} rdzv_stats_t;
void rdzv_server_stats(rdzv_server_t *s, rdzv_stats_t *out);

/* ---- client ---- */

/* Open a client for job job_id ("" = none) of world ranks (0 = unknown)
 * to addr ("host:port" or "unix:/path"). Connecting is lazy.
 * NULL on error with a message. */
rdzv_client_t *rdzv_client_open(const char *addr, const char *job_id, int world,
                                char *err, size_t errlen);
void rdzv_client_close(rdzv_client_t *c);
const char *rdzv_client_addr(const rdzv_client_t *c);

/* Set key to value[0..len). overwrite false: an existing key is -EEXIST.
 * Retries while the server is unreachable, up to timeout_s. */
int rdzv_set(rdzv_client_t *c, const char *key, const void *value, size_t len, bool overwrite,
             double timeout_s, char *err, size_t errlen);

/* Get key without waiting: 0 with *value (malloc'ed, caller frees; may be
 * non-NULL with *len 0) when found, -ENOENT when not. */
int rdzv_get(rdzv_client_t *c, const char *key, void **value, size_t *len, double timeout_s,
             char *err, size_t errlen);

/* Wait up to timeout_s for key to exist; then as rdzv_get. -ETIMEDOUT
 * names the key and the address. */
int rdzv_wait(rdzv_client_t *c, const char *key, void **value, size_t *len, double timeout_s,
              char *err, size_t errlen);

/* Barrier name for ranks 0..world-1: returns once all world ranks have
 * called it (each round of a name completes once all have arrived; a name
 * can be used again for the next round). -ETIMEDOUT when the round does not
 * complete within timeout_s of its first arrival, with a message naming
 * the ranks that did not arrive; every rank of that round gets the same
 * list, and a rank arriving after the failure gets it too. */
int rdzv_barrier(rdzv_client_t *c, const char *name, int rank, int world, double timeout_s,
                 char *err, size_t errlen);

#endif
