/* comm_impl.h: what comm.c shares with the backends (comm_shm.c,
 * comm_nccl.c): the communicator and request structures and the completion
 * call. Not for users of comm.h. */
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
} comm_coll_t;

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

/* "all_gather", ... */
const char *comm_coll_name(comm_coll_t c);
size_t comm_dtype_size(comm_dtype_t dt);
const char *comm_dtype_name(comm_dtype_t dt);

#endif
