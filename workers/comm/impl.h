/* impl.h: what the core (comm.c) shares with the backends (shm.c, gloo.c,
 * nccl.c, stage.c) and with open.c, which starts them: the backend table, the
 * communicator and request structures, and the completion call. Private to
 * workers/comm/: users see only comm.h. */
#ifndef BALLAST_COMM_IMPL_H
#define BALLAST_COMM_IMPL_H

#include <pthread.h>

#include "workers/comm/comm.h"

typedef enum {
    COLL_ALL_GATHER = 0,
    COLL_REDUCE_SCATTER,
    COLL_ALL_REDUCE,
    COLL_BROADCAST,
    COLL_BARRIER,
    COLL_SHIFT,               /* ring shift: recv = send of group index (index - 1) mod n */
} comm_coll_t;

/* ---- the table the backends fill (private to workers/comm/) ---- */

typedef struct {
    const char *name;
    int (*init)(comm_t *c, const comm_config_t *cfg, char *err, size_t errlen);
    void (*destroy)(comm_t *c);
    /* start one collective; the backend completes req (comm_req_done) later */
    int (*start)(comm_t *c, comm_req_t *req, char *err, size_t errlen);
    /* block until req is done (backends that need to drive progress) */
    void (*wait)(comm_t *c, comm_req_t *req);
    /* whether req has finished without blocking (NULL: its done flag tells) */
    bool (*test)(comm_t *c, comm_req_t *req);
    /* make a CUDA stream wait for req (NULL: comm_stream_wait blocks the host) */
    int (*stream_wait)(comm_t *c, comm_req_t *req, void *stream, char *err, size_t errlen);
} comm_ops_t;

extern const comm_ops_t comm_shm_ops;
extern const comm_ops_t comm_nccl_ops;
extern const comm_ops_t comm_gloo_ops;

/* ---- a collective in flight ---- */

struct comm_req {
    comm_t *comm;
    comm_coll_t coll;
    const void *send;         /* input (all_gather: count; reduce_scatter: n*count) */
    void *recv;               /* output (all_gather: n*count) / broadcast buffer */
    size_t count;             /* elements, as passed by the caller */
    comm_dtype_t dt;
    comm_op_t op;
    int root;                 /* broadcast: group index of the source */
    uint64_t seq;             /* 1, 2, ... per communicator, in start order */
    /* completion (guarded by mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;               /* 0 or -errno */
    char err[COMM_ERR_LEN];
    comm_req_t *next;         /* backend queue link */
    void *backend;            /* backend per-request state (e.g. a CUDA event) */
};

struct comm {
    const comm_ops_t *ops;
    char name[96];            /* group name, e.g. "shard.3" */
    int n;                    /* ranks in the group */
    int index;                /* this rank's index */
    int *ranks;               /* global ranks (n entries) */
    double timeout_s;         /* peer timeout, seconds */
    uint64_t next_seq;        /* sequence number of the next started collective */
    void *backend;            /* backend state */
};

/* Mark req finished with status (0 or -errno) and message (may be NULL);
 * wakes comm_wait. Called by backends, any thread. */
void comm_req_done(comm_req_t *req, int status, const char *msg);

/* The started collectives of a backend whose progress thread runs them in
 * order (shm, gloo): pushed by the caller's start, popped by that thread. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    comm_req_t *head, *tail;    /* started, not yet run */
    bool stop;
} comm_queue_t;

void comm_queue_init(comm_queue_t *q);
void comm_queue_destroy(comm_queue_t *q);
void comm_queue_push(comm_queue_t *q, comm_req_t *r);
/* Blocks for the next request; NULL once comm_queue_stop was called and
 * nothing is left. */
comm_req_t *comm_queue_pop(comm_queue_t *q);
void comm_queue_stop(comm_queue_t *q);

/* "all_gather", ... */
const char *comm_coll_name(comm_coll_t c);
size_t comm_dtype_size(comm_dtype_t dt);
const char *comm_dtype_name(comm_dtype_t dt);

/* Seconds this process spent blocked in comm_wait and in host-side
 * comm_stream_wait (comm_wait_seconds adds NCCL's timed stalls). */
double comm_host_wait_seconds(void);

#endif
