/* job.h: the job a training process belongs to, from its flags: where it
 * sits (common/topology.h), its backend and GPU, and its groups and
 * communicators (workers/parallel/dist.h). One process is world 1: its
 * groups are itself alone, so joining starts no rendezvous store, opens no
 * socket and selects no collective backend.
 *
 * Functions return 0 or -1 with a message in err (without the "rank N: "
 * prefix, which j->who holds for the caller's messages). */
#ifndef BALLAST_TRAIN_JOB_H
#define BALLAST_TRAIN_JOB_H

#include <stdbool.h>
#include <stddef.h>

#include "topology.h"
#include "workers/backend/backend.h"
#include "workers/parallel/dist.h"
#include "workers/train/train.h"

typedef struct {
    topo_t topo;               /* rank, local rank, world and the rendezvous address */
    int rank, world;           /* topo.rank, topo.world_size */
    const backend_t *be;       /* the compute backend (the test build's double where one is set) */
    int device;                /* this rank's GPU (--backend cuda) */
    comm_kind_t comm;          /* the collectives --comm and the GPUs allow (dist_init resolves auto) */
    dist_t d;                  /* groups and communicators, once joined */
    bool joined;               /* d is set up */
    bool staged;               /* shm collectives behind host staging (a backend the host may not touch) */
    char who[32];              /* "rank N: " for messages of a job of several processes, "" for one */
} train_job_t;

/* Where this process sits and its backend: with --backend cuda and several
 * local ranks, local rank r drives GPU (--device + r) mod (visible GPUs),
 * and ranks sharing a GPU get the shm collectives (NCCL refuses them); one
 * process drives --device. */
int train_job_open(train_job_t *j, const train_opts_t *o, char *err, size_t errlen);

/* Join the job (dist_init): the groups, and with more than one process the
 * rendezvous and one communicator per group of two ranks or more, staged
 * through host memory when the backend's memory is off limits to the host. */
int train_job_join(train_job_t *j, const train_opts_t *o, char *err, size_t errlen);

/* Leave cleanly: meet every rank at the last barrier (dist_destroy). */
int train_job_leave(train_job_t *j, char *err, size_t errlen);

/* Leave after a failure, without the barrier, so that the peers see this
 * process go. Nothing when not joined. */
void train_job_abort(train_job_t *j);

#endif
