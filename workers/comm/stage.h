/* stage.h: collectives on backend (GPU) memory over a communicator
 * that moves host memory (the shm backend), through host staging buffers.
 *
 * NCCL refuses two ranks on one GPU, so ranks sharing a GPU (the multi-rank
 * checks on a one-GPU machine) talk through shared memory: the wrapper
 * copies each collective's device input into pinned host memory (the
 * backend's host_alloc), runs the shm collective there, and copies the
 * result back into device memory. fsdp.c and tp.c then call the same
 * comm.h API on device pointers whatever the backend of the group.
 *
 * Every collective of a staged communicator completes inside its start
 * call (copies, collective, copies back), so its handle is already done
 * and comm_wait only collects the status: simple, and correct because
 * every rank starts its collectives in the same program order. Copies go
 * through the backend's to_host / from_host, which order themselves after
 * the work queued on the compute stream. Results are the shm backend's, bit
 * for bit (its fixed reduction order), on whatever backend memory holds. */
#ifndef BALLAST_COMM_STAGE_H
#define BALLAST_COMM_STAGE_H

#include <stddef.h>

#include "workers/backend/backend.h"
#include "workers/comm/comm.h"

/* Wrap inner (a communicator whose buffers are host memory, e.g. shm) into
 * *out, whose buffers are memory of backend be. The wrapper owns inner:
 * comm_destroy(*out) destroys both. Size, index, name and ranks are
 * inner's; comm_backend(*out) is "shm+stage". Returns 0, or a negative
 * errno with a message (inner is then left to the caller). */
int comm_stage_wrap(comm_t **out, comm_t *inner, const backend_t *be, char *err, size_t errlen);

/* Bytes of host staging a wrapped communicator holds now (grows to the
 * largest collective's input plus output). */
size_t comm_stage_bytes(const comm_t *c);

#endif
