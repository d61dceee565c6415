/* dist.h: bring a rank into its job: build its groups (workers/parallel/groups.h),
 * start the rendezvous store on rank 0 (or use an external ballast-rdzv),
 * check that every rank arrived within --rdzv-timeout (naming the missing
 * ones), and open one communicator per group (TP, shard, replica) with the
 * backend --comm selects: with --comm auto and no GPU, per group, shm when
 * every member runs on this node (the same comm_node_id, published in the
 * store as "dist/node/<rank>") and gloo otherwise; --comm shm with members
 * on different nodes is an error naming them. The worker's flags map one to one onto
 * dist_opts_t; see docs/comm.md.
 *
 * A group of one rank gets no communicator (its comm[] entry is NULL):
 * every collective over it is an identity, which the users (fsdp.c, tp.c)
 * run as a local copy or skip. A world of one process is all such groups,
 * so it starts no store, opens no socket and selects no collective
 * backend: dist_init only builds its groups. */
#ifndef BALLAST_DIST_H
#define BALLAST_DIST_H

#include <stdbool.h>
#include <stddef.h>

#include "services/rendezvous/rdzv.h"
#include "workers/comm/comm.h"
#include "workers/parallel/groups.h"

typedef struct {
    int world, rank;             /* from common/topology.h */
    int S;                       /* --hybrid-shard-degree (0 = largest that fits) */
    int T;                       /* --tensor-parallel-degree */
    int C;                       /* --context-parallel-degree; 0 = 1 */
    groups_chooser_fn chooser;   /* for S = 0; NULL = world / T */
    void *chooser_user;
    comm_kind_t comm;            /* --comm */
    bool on_gpu;                 /* CUDA backend: buffers are device memory */
    int device;                  /* this rank's GPU */
    void *compute_stream;        /* the backend's compute stream (be_stream): NCCL
                                    collectives start after the work queued on it */
    const char *rdzv_addr;       /* where every rank reaches the store: "host:port" or "unix:/path" */
    const char *rdzv_listen;     /* what rank 0 binds when it serves; NULL = rdzv_addr */
    bool rdzv_serve;             /* rank 0 serves the store in-process (false: ballast-rdzv runs) */
    const char *job_id;          /* keeps jobs sharing a store apart; NULL = "" */
    double rdzv_timeout_s;       /* --rdzv-timeout: how long to wait for every rank; 0 = 300 */
    double comm_timeout_s;       /* peer timeout inside a collective; 0 = COMM_DEFAULT_TIMEOUT_S */
    size_t slot_bytes;           /* shm backend slot size; 0 = default */
    const char *comm_dir;        /* --comm-dir: the shm backend's socket directory, shared by
                                  the ranks of a node (its identity is part of the node id);
                                  NULL = /tmp */
} dist_opts_t;

typedef struct {
    groups_t groups;             /* this rank's layout and groups */
    rdzv_server_t *server;       /* rank 0's in-process store, or NULL */
    rdzv_client_t *rdzv;         /* this rank's client */
    comm_t *comm[GROUP_NKINDS];  /* one communicator per group, indexed by group_kind_t;
                                    NULL for a group of one rank */
    comm_kind_t kind;            /* the backend selected: COMM_NCCL, COMM_SHM, COMM_GLOO,
                                    or COMM_AUTO when each group chose shm or gloo (--comm
                                    auto on the CPU) or none was selected (world 1) */
    comm_kind_t group_kind[GROUP_NKINDS]; /* the backend each group got (COMM_AUTO: none) */
    char comm_names[48];         /* dist_comm_name's text */
    double rdzv_timeout_s;
} dist_t;

/* Join the job. Returns 0, or a negative errno with a message: impossible
 * (world, S, T); the store cannot be served or reached; ranks missing after
 * rdzv_timeout_s (named); a communicator that cannot be set up. On error
 * everything started is torn down. With world 1 nothing but the groups is
 * set up (rdzv_addr, comm and the timeouts are not looked at). */
int dist_init(dist_t *d, const dist_opts_t *o, char *err, size_t errlen);

/* The collectives' names for messages: the distinct backends of the
 * communicators joined by '+' ("shm", "nccl", "shm+stage", "shm+gloo"), or
 * "none" without any (world 1). */
const char *dist_comm_name(const dist_t *d);

/* Leave: close the communicators, meet every rank at a last barrier (so
 * rank 0 keeps serving until all are done with the store), stop the
 * store on rank 0. Returns the barrier's status (0, or -ETIMEDOUT naming
 * ranks that never left) with a message. */
int dist_destroy(dist_t *d, char *err, size_t errlen);

/* Leave after a failure: close everything without the last barrier, so
 * that the peers see this process go instead of waiting for it. */
void dist_abort(dist_t *d);

#endif
