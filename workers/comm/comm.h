/* comm.h: collectives over a group of ranks, behind one table.
 *
 * A communicator (comm_t) connects the processes of one group (a list of
 * global ranks, e.g. a TP or shard group from workers/parallel/groups.h). Every
 * collective is asynchronous: comm_<op> starts it and returns a completion
 * handle; comm_wait(handle) blocks until it is done and frees the handle.
 * Every rank of the group must start the same collectives in the same order
 * with the same counts. Buffers must stay valid until the wait returns.
 *
 * Three backends fill the table (comm_ops_t, private to workers/comm/impl.h):
 *   shm   shared memory between the processes of one node: one memfd
 *         segment per group, per-rank slots, sequence-numbered flags,
 *         deterministic reduction order (bit-identical results on every
 *         rank and every run), chunked through a bounded buffer
 *         (workers/comm/shm.c). Buffers are host memory.
 *   gloo  Gloo over TCP between hosts (workers/comm/gloo.c over the C++
 *         adapter gloo_engine.cc); peers find each other's addresses in
 *         the rendezvous store. Buffers are host memory.
 *   nccl  NCCL, loaded at run time (workers/comm/nccl.c). Buffers are
 *         device memory of the rank's GPU; unique ids travel through the
 *         rendezvous store.
 * --comm auto picks nccl when the worker runs on GPUs and libnccl loads;
 * otherwise, per group, shm when every member runs on this node (same
 * comm_node_id) and gloo when not (workers/parallel/dist.c). See
 * docs/comm.md.
 *
 * Functions return 0 or a negative errno with a message in err (library
 * code: the worker turns it into a fatal error). */
#ifndef BALLAST_COMM_H
#define BALLAST_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "services/rendezvous/rdzv.h"

#define COMM_ERR_LEN 512
#define COMM_MAX_RANKS 4096              /* largest group */
#define COMM_DEFAULT_SLOT_BYTES (1u << 20) /* shm: bytes per rank slot and buffer */
#define COMM_DEFAULT_TIMEOUT_S 300.0     /* a collective waiting longer on a peer fails */

typedef enum { COMM_F32 = 0, COMM_BF16 = 1 } comm_dtype_t;
typedef enum { COMM_SUM = 0, COMM_AVG = 1 } comm_op_t; /* AVG: sum, then divide by n */
typedef enum { COMM_AUTO = 0, COMM_SHM, COMM_NCCL, COMM_GLOO } comm_kind_t;

typedef struct comm comm_t;
typedef struct comm_req comm_req_t;     /* completion handle */

/* ---- set-up ---- */

typedef struct {
    comm_kind_t kind;          /* COMM_SHM, COMM_GLOO or COMM_NCCL (resolve AUTO first: comm_select) */
    const char *name;          /* unique within the job, e.g. "shard.3": rendezvous key prefix */
    int n;                     /* ranks in the group */
    int index;                 /* this process's position in ranks[] */
    const int *ranks;          /* global ranks of the group (n entries, for messages) */
    rdzv_client_t *rdzv;       /* bootstrap store; may be NULL when shm_fd >= 0 */
    double timeout_s;          /* per-collective peer timeout; 0 = default */
    double setup_timeout_s;    /* how long set-up waits for the peers (--rdzv-timeout); 0 = timeout_s */
    /* shm backend */
    int shm_fd;                /* a segment from comm_shm_segment_create shared by fork or
                                  fd passing; -1 = create/receive it through rdzv */
    size_t slot_bytes;         /* bytes per rank slot; 0 = COMM_DEFAULT_SLOT_BYTES; all
                                  ranks must agree (checked) */
    const char *sock_dir;      /* where the group leader's fd-passing socket lives (--comm-dir:
                                  a directory every rank of the node shares); NULL = /tmp */
    /* nccl backend */
    int device;                /* CUDA device ordinal of this rank */
    void *compute_stream;      /* cudaStream_t that produces the inputs; each collective's
                                  stream first waits for the work queued on it so far
                                  (an event, not a host wait). NULL = no ordering */
} comm_config_t;

/* Defaults: kind SHM, shm_fd -1, everything else 0/NULL. */
void comm_config_init(comm_config_t *cfg);

/* Connect this process to its group. Blocks until every rank of the group
 * has attached (or timeout_s: -ETIMEDOUT naming the ranks that did not
 * attach). */
int comm_init(comm_t **out, const comm_config_t *cfg, char *err, size_t errlen);

/* Leave the group and free everything. Wait for every started collective
 * (comm_wait) first. NULL is fine. */
void comm_destroy(comm_t *c);

int comm_size(const comm_t *c);   /* n */
int comm_index(const comm_t *c);  /* this rank's index */
const char *comm_backend(const comm_t *c); /* "shm", "gloo" or "nccl" */

/* ---- collectives (counts are elements) ---- */

/* recv[i*count .. (i+1)*count) = send of group index i; recv holds n*count. */
int comm_all_gather(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                    comm_req_t **req, char *err, size_t errlen);

/* send holds n*count; recv (count) = op over i of send_i[index*count ..). */
int comm_reduce_scatter(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                        comm_op_t op, comm_req_t **req, char *err, size_t errlen);

/* recv (count) = op over i of send_i. send == recv is allowed. */
int comm_all_reduce(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                    comm_op_t op, comm_req_t **req, char *err, size_t errlen);

/* buf (count) of group index root is copied into every rank's buf. */
int comm_broadcast(comm_t *c, void *buf, size_t count, comm_dtype_t dt, int root,
                   comm_req_t **req, char *err, size_t errlen);

/* Ring shift (point to point around the group): recv (count) = send of
 * group index (index - 1 + n) % n, i.e. every rank passes its block to the
 * next one. send and recv must be distinct buffers. Context parallelism's
 * ring attention passes K/V blocks with it, the next block's transfer in
 * flight while the current one is used. shm and NCCL move only the
 * neighbour's block; Gloo runs it as an all-gather into scratch (n blocks
 * of traffic). */
int comm_ring_shift(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                    comm_req_t **req, char *err, size_t errlen);

/* Returns (through its handle) once every rank of the group has started it. */
int comm_barrier(comm_t *c, comm_req_t **req, char *err, size_t errlen);

/* Wait for a started collective and free its handle. Returns its status:
 * 0, or -ETIMEDOUT / -EPIPE (a peer died or failed) with a message. */
int comm_wait(comm_req_t *req, char *err, size_t errlen);

/* Seconds this process has spent blocked in comm_wait (and in the host
 * wait of comm_stream_wait on shm) so far, over every communicator, plus
 * the time CUDA streams stood still in comm_stream_wait for NCCL
 * collectives (comm_nccl_stall_seconds: timed with events, counted once
 * they have completed): the exposed (not overlapped) communication time
 * that the training loop reports per step as the difference of two
 * readings. */
double comm_wait_seconds(void);
double comm_nccl_stall_seconds(void);

/* Collectives whose results a stream already waits for, with their handles
 * collected later. comm_use makes `stream` wait for *req (comm_stream_wait:
 * an event on NCCL, a host wait on shm), sets *req to NULL and keeps the
 * handle; once COMM_HOLD_MAX are kept it collects the oldest (comm_wait).
 * So the host blocks only on a collective that is several behind, one the
 * GPU has long passed, never on the one the next kernel needs. Buffers of
 * a held collective must stay valid until it is collected.
 * comm_hold_release collects every kept handle (before the buffers go, and
 * at the end of a micro-step); the first error is returned. A zeroed
 * comm_hold_t is empty. */
#define COMM_HOLD_MAX 4
typedef struct {
    comm_req_t *r[COMM_HOLD_MAX];
    int n;
} comm_hold_t;
int comm_use(comm_hold_t *h, comm_req_t **req, void *stream, char *err, size_t errlen);
int comm_hold_release(comm_hold_t *h, char *err, size_t errlen);

/* Whether a started collective has finished (comm_wait still required). */
bool comm_test(comm_req_t *req);

/* Make the CUDA stream `stream` (a cudaStream_t) wait for the collective
 * without blocking the host: work queued on it afterwards sees the result.
 * NCCL records an event after the collective and the stream waits on it;
 * host-memory backends (shm) block the host until the collective is done.
 * comm_wait is still required to free the handle. Returns 0 or the
 * collective's error (shm) / -EIO (CUDA) with a message. */
int comm_stream_wait(comm_req_t *req, void *stream, char *err, size_t errlen);

/* ---- backend selection ---- */

/* "auto|shm|gloo|nccl" -> kind; -1 when unknown. */
int comm_kind_parse(const char *s);
const char *comm_kind_name(comm_kind_t k);

/* Resolve --comm: AUTO gives NCCL when on_gpu and NCCL loads, SHM otherwise
 * (the kind for ranks of one node: the caller may still pick GLOO for a
 * group that spans nodes). NCCL without a GPU, or when libnccl cannot be
 * loaded, is an error naming the fix; SHM and GLOO are always possible (on
 * GPUs they need host staging). Returns the kind or -1. */
int comm_select(comm_kind_t requested, bool on_gpu, char *err, size_t errlen);

/* ---- shm backend ---- */

/* Bytes of a shm segment for n ranks with slot_bytes per slot. */
size_t comm_shm_segment_bytes(int n, size_t slot_bytes);

/* Create (before fork, for tests and launchers) a sealed memfd segment for
 * n ranks; returns its fd or a negative errno. */
int comm_shm_segment_create(int n, size_t slot_bytes, char *err, size_t errlen);

/* This node's identity for --comm auto, as text into out (at least 128
 * bytes): the kernel's boot id and the device and inode of the socket
 * directory dir (NULL = /tmp). Two processes get the same id exactly when
 * they run on one kernel and see the same directory there, which is what
 * the shm backend needs (memfds are per kernel, the fd-passing socket
 * lives in dir); PIDs, host names and container names play no part.
 * 0 or -errno with a message (dir missing). */
int comm_node_id(const char *dir, char *out, size_t outlen, char *err, size_t errlen);

/* Whether libnccl and a CUDA runtime can be loaded here. */
bool comm_nccl_available(char *err, size_t errlen);

#endif
