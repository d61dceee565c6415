/* session.h: ballastd's client sessions.
 *
 * A session is one worker's connection to the service: a job, a quota (kept
 * by the store), a lease, and in shared-memory mode a request/completion ring
 * served by its own thread. The session manager owns
 *   - the session table (random 64-bit ids, so ids cannot be guessed),
 *   - authentication (token from --token-file; peer uid over the fd socket
 *     via SO_PEERCRED: the service's uid or root),
 *   - the fd socket: a worker sends {session id, attach nonce} and receives
 *     the fds of its job's pool segments (no other job's), the ring memfd
 *     and four eventfds (SCM_RIGHTS); later it may ask for one more segment
 *     of its job by id (rp_segment_req_t) when a completion names it,
 *   - one thread per attached session that pops ring entries, validates
 *     every field, runs the op against the store and pushes a completion,
 *   - a reaper thread that expires sessions whose lease ran out (their
 *     non-persistent blobs are freed, their ring torn down).
 * Heartbeat, remote Put/Get and every ring entry renew the lease.
 *
 * Functions that a handler calls return a status_t (proto/status.h,
 * STATUS_OK = 0; the handler turns it into a gRPC code with
 * status_to_grpc()) and write a message into err on failure. Thread-safe
 * throughout. */
#ifndef BALLAST_SESSION_H
#define BALLAST_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "job_name.h"
#include "shm.h"
#include "services/offload/store.h"

#define SESS_ERR_LEN     256
#define SESS_NAME_MAX    63     /* client names, chars (job names: JOB_NAME_MAX) */
#define SESS_TOKEN_MAX   256    /* bytes of a token */

typedef struct sess_mgr sess_mgr_t;

typedef struct {
    double lease_s;              /* lease, seconds (> 0) */
    uint64_t default_quota;      /* quota when a client asks for 0, bytes; 0 = unlimited */
    uint64_t max_quota;          /* most a client may ask for, bytes; 0 = unlimited */
    uint32_t max_sessions;       /* open sessions at most */
    uint32_t ring_capacity;      /* entries per ring, power of two <= RING_PROTO_MAX_CAPACITY */
    const char *fd_socket;       /* Unix path of the fd socket (SOCK_SEQPACKET) */
    const char *token;           /* required token, NULL or "" = none */
    uint64_t max_blob;           /* largest blob, bytes (0 = the pool's largest allocation) */
    uint32_t ring_spin_us;       /* ring threads poll this long before sleeping, microseconds */
    const shm_uidset_t *peers;   /* who may connect to the fd socket; NULL = our uid and root */
    bool socket_group_set;       /* chown the fd socket to socket_gid (mode 0660 always) */
    gid_t socket_gid;
} sess_config_t;

/* Who makes a call: a session belongs to the caller that opened it and
 * answers only that caller. Over a Unix socket that is the peer's uid
 * (SO_PEERCRED); over TCP any caller that holds the session id (a random
 * 64-bit capability that no unauthenticated call reveals). */
typedef struct {
    bool local;                  /* came over a Unix socket */
    uint32_t uid;                /* its SO_PEERCRED uid, when local */
} sess_caller_t;

/* What OpenSession hands back. */
typedef struct {
    uint64_t sid;                /* session id */
    uint64_t nonce;              /* attach nonce for the fd socket */
    uint64_t job_id;
    uint64_t quota;              /* granted, bytes (0 = unlimited) */
    uint64_t ring_bytes;         /* size of the ring memfd */
    uint64_t cpl_offset;         /* completion ring offset in it */
    uint32_t ring_capacity;
    uint64_t max_blob;
} sess_open_info_t;

/* One row of Stats. */
typedef struct {
    uint64_t sid;
    char job[JOB_NAME_MAX + 1];
    char client[SESS_NAME_MAX + 1];
    uint32_t rank;
    pid_t pid;                   /* fd-socket peer, 0 when not attached */
    bool shared;                 /* shared-memory mode */
    bool attached;               /* ring running */
    bool detached;               /* closed with keep_blobs: holds blobs, no lease */
    uint64_t quota, used;        /* bytes */
    uint64_t ops, errors;        /* served, of which failed */
    double idle_s;               /* since the last activity, seconds */
    bool owner_local;            /* opened over a Unix socket ... */
    uint32_t owner_uid;          /* ... by this uid */
} sess_row_t;

typedef struct {
    uint64_t opened, expired, closed;     /* sessions */
    uint64_t ring_ops, ring_errors;       /* ring entries */
    uint64_t quota_refusals;              /* RESOURCE_EXHAUSTED for quota */
} sess_counters_t;

/* Start the manager: listen on cfg->fd_socket (lock file "<path>.lock"),
 * start the acceptor and reaper threads. The store must outlive it.
 * 0 or -errno with a message. */
int sess_mgr_open(sess_mgr_t **out, const sess_config_t *cfg, store_t *store,
                  char *err, size_t errlen);

/* Stop accepting attachments, let every ring thread finish the entries
 * already queued, stop the threads, tear down all rings and drop every
 * session from the store (persistent blobs stay). NULL is a no-op. */
void sess_mgr_close(sess_mgr_t *m);

/* From now on OpenSession fails with UNAVAILABLE ("draining"). */
void sess_mgr_set_draining(sess_mgr_t *m);
bool sess_mgr_draining(const sess_mgr_t *m);

/* ---- the calls behind the RPCs (return a status_t) ---- */

status_t sess_open(sess_mgr_t *m, const char *job, uint32_t rank, uint64_t quota,
                   const char *token, bool shared, const char *client_name,
                   sess_open_info_t *info, char *err, size_t errlen);
/* The same, owned by caller (sess_open: a local caller with our uid). */
status_t sess_open_as(sess_mgr_t *m, const sess_caller_t *caller, const char *job, uint32_t rank,
                      uint64_t quota, const char *token, bool shared, const char *client_name,
                      sess_open_info_t *info, char *err, size_t errlen);
/* Whether session sid exists and belongs to caller: NOT_FOUND otherwise
 * (the same answer as for an unknown id, so ids of others cannot be probed). */
status_t sess_check_owner(sess_mgr_t *m, uint64_t sid, const sess_caller_t *caller,
                          char *err, size_t errlen);
/* Whether row r belongs to caller. */
bool sess_row_owned(const sess_row_t *r, const sess_caller_t *caller);
status_t sess_close(sess_mgr_t *m, uint64_t sid, bool keep_blobs, uint64_t *freed_bytes,
                    char *err, size_t errlen);
/* Renew the lease; *lease_s, *used, *quota (may be NULL) describe the
 * session. With a caller, the session must be the caller's, checked under
 * the same lock (the answer of sess_check_owner otherwise). */
status_t sess_heartbeat(sess_mgr_t *m, uint64_t sid, const sess_caller_t *caller, double *lease_s,
                        uint64_t *used, uint64_t *quota, char *err, size_t errlen);
/* Look up a live session for a remote call and renew its lease; *job_id
 * gets its job. Counts the op (and the error when ok is false, see
 * sess_count). */
status_t sess_use(sess_mgr_t *m, uint64_t sid, uint64_t *job_id, char *err, size_t errlen);
void sess_count(sess_mgr_t *m, uint64_t sid, bool failed, bool quota);
/* Whether token matches (constant time); true when no token is set. */
bool sess_token_ok(const sess_mgr_t *m, const char *token);
/* Release(job): free the job's blobs (persistent ones too) and forget the
 * job's detached sessions. */
status_t sess_release_job(sess_mgr_t *m, uint64_t job_id, uint64_t *blobs, uint64_t *bytes);

/* Rows for every session: *rows malloc()ed (free() it). */
status_t sess_list(sess_mgr_t *m, sess_row_t **rows, size_t *n);
void sess_counters(sess_mgr_t *m, sess_counters_t *out);
double sess_lease(const sess_mgr_t *m);

/* Client names (shown in `ballast status`): 1..SESS_NAME_MAX printable
 * ASCII characters. Job names follow job_name_ok() (common/job_name.h). */
bool sess_client_name_ok(const char *s);

#endif
