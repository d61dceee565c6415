/* store.h: the rendezvous state (keys and barriers), independent of gRPC.
 * Thread-safe: one mutex and one condition variable; Wait and Barrier polls
 * block at most a caller-given slice, and only while fewer than max_blocked
 * calls are blocked, so the server threads are never all held by waiters.
 * Every function returns 0 or a negative errno with a message in err. */
#ifndef BALLAST_RDZV_STORE_H
#define BALLAST_RDZV_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rdzv_store rdzv_store_t;

/* max_blocked: calls allowed to block at once (server threads - 1, >= 0). */
rdzv_store_t *rdzv_store_new(size_t max_keys, size_t max_value, int max_blocked);
void rdzv_store_free(rdzv_store_t *s);

/* Bound barriers to max_world ranks and everything held (keys, values,
 * barrier names and arrival tables, with their bookkeeping) to max_bytes;
 * 0 keeps the current bound (at first 2^20 ranks and no byte limit). */
void rdzv_store_limits(rdzv_store_t *s, uint32_t max_world, size_t max_bytes);

/* Wait up to max_ms until every rank of each barrier's latest completed
 * round has been answered "done", and every rank of a failed round has
 * been told of the failure (so a server stopping right after its own last
 * barrier does not strand the others). Returns whether it got there. */
bool rdzv_store_quiesce(rdzv_store_t *s, int max_ms);

/* Wake every blocked call and make later blocking calls return -ESHUTDOWN. */
void rdzv_store_shutdown(rdzv_store_t *s);

/* -EEXIST (exists, !overwrite), -EMSGSIZE (value over max_value), -ENOSPC
 * (too many keys or bytes), -EINVAL (bad key). *version: the key's write count. */
int rdzv_store_set(rdzv_store_t *s, const char *key, const void *val, size_t len, bool overwrite,
                   uint64_t *version, char *err, size_t errlen);

/* Copy of the value (malloc'ed; caller frees) in *val. -ENOENT when the key
 * is missing after waiting up to max_ms (0: no wait). */
int rdzv_store_get(rdzv_store_t *s, const char *key, int max_ms, void **val, size_t *len,
                   uint64_t *version, char *err, size_t errlen);

typedef struct {
    uint64_t round;        /* the round arrived at / polled */
    uint64_t generation;   /* rounds of this name completed */
    bool done;             /* round complete */
    uint32_t *missing;     /* ranks not yet arrived (malloc'ed, caller frees; NULL when none) */
    size_t n_missing;
} rdzv_barrier_state_t;

/* round == 0: rank arrives (-EEXIST: already arrived in the open round;
 * -EINVAL: rank/world out of range or world differs from the round's;
 * -EMSGSIZE: world over max_world; -ENOSPC: a new barrier over max_bytes);
 * round > 0: poll that round, waiting up to max_ms for it to complete.
 * A round not complete timeout_ms after its first arrival fails: -ETIMEDOUT
 * with the missing ranks named in err, for every later call about it. */
int rdzv_store_barrier(rdzv_store_t *s, const char *name, uint32_t rank, uint32_t world,
                       uint32_t timeout_ms, uint64_t round, int max_ms, rdzv_barrier_state_t *out,
                       char *err, size_t errlen);

typedef struct {
    uint64_t keys, barriers_done, barriers_failed;
} rdzv_store_stats_t;
void rdzv_store_stats(rdzv_store_t *s, rdzv_store_stats_t *out);

/* Check a key or barrier name: 1..256 bytes of printable ASCII. */
int rdzv_key_check(const char *key, const char *what, char *err, size_t errlen);

#endif
