/* no_comm.c: the comm.h entry points for tests/gpu/run.sh's one-process
 * programs (gpu_train), which are built without the Makefile and without
 * the collectives' dependencies (the rendezvous client, NCCL loading).
 * model.c and tp.c reach the comm API only with tensor or context parallelism
 * (T > 1, C > 1), which one process never uses; these definitions satisfy the
 * linker and fail loudly if anything calls a collective anyway. */
#include <errno.h>
#include <stdio.h>

#include "workers/comm/comm.h"

int comm_size(const comm_t *c) { (void)c; return 1; }
int comm_index(const comm_t *c) { (void)c; return 0; }

static int no_comm(const char *what, comm_req_t **req, char *err, size_t errlen) {
    if (req) *req = NULL;
    snprintf(err, errlen, "%s: this program runs one process and has no collectives", what);
    return -ENOSYS;
}

int comm_all_gather(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt, comm_req_t **req,
                    char *err, size_t errlen) {
    (void)c; (void)send; (void)recv; (void)count; (void)dt;
    return no_comm("all_gather", req, err, errlen);
}

int comm_reduce_scatter(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt, comm_op_t op,
                        comm_req_t **req, char *err, size_t errlen) {
    (void)c; (void)send; (void)recv; (void)count; (void)dt; (void)op;
    return no_comm("reduce_scatter", req, err, errlen);
}

int comm_all_reduce(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt, comm_op_t op,
                    comm_req_t **req, char *err, size_t errlen) {
    (void)c; (void)send; (void)recv; (void)count; (void)dt; (void)op;
    return no_comm("all_reduce", req, err, errlen);
}

int comm_wait(comm_req_t *req, char *err, size_t errlen) {
    (void)req;
    return no_comm("wait", NULL, err, errlen);
}

int comm_use(comm_hold_t *h, comm_req_t **req, void *stream, char *err, size_t errlen) {
    (void)h; (void)stream;
    if (req) *req = NULL;
    return no_comm("use", NULL, err, errlen);
}

int comm_hold_release(comm_hold_t *h, char *err, size_t errlen) {
    (void)err; (void)errlen;
    h->n = 0; /* nothing is ever held here */
    return 0;
}

/* context parallelism (C > 1) needs several processes: never here */
int comm_ring_shift(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt, comm_req_t **req,
                    char *err, size_t errlen) {
    (void)c; (void)send; (void)recv; (void)count; (void)dt;
    return no_comm("ring_shift", req, err, errlen);
}

int comm_stream_wait(comm_req_t *req, void *stream, char *err, size_t errlen) {
    (void)req; (void)stream;
    return no_comm("stream_wait", NULL, err, errlen);
}
