/* stage.c: device-memory collectives over a host-memory communicator
 * through pinned staging buffers; see comm_stage.h. Relies on comm_impl.h
 * for the communicator structure and on the backend table for the copies
 * and the pinned allocations. */
#include "workers/comm/stage.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/comm/impl.h"

typedef struct {
    comm_t *inner;             /* the host-memory communicator (owned) */
    const backend_t *be;       /* whose memory the callers' buffers are */
    char *host;                /* staging: input (send_b bytes) | output (recv_b bytes) */
    size_t cap;                /* bytes at host */
} stage_t;

static int stage_init(comm_t *c, const comm_config_t *cfg, char *err, size_t errlen) {
    (void)cfg;
    snprintf(err, errlen, "comm %s: a staged communicator is made with comm_stage_wrap", c->name);
    return -EINVAL;
}

static void stage_destroy(comm_t *c) {
    stage_t *st = c->backend;
    if (!st) return;
    comm_destroy(st->inner);
    if (st->host) st->be->host_free(st->host);
    free(st);
    c->backend = NULL;
}

/* Grow the staging buffer to at least bytes. */
static int stage_reserve(comm_t *c, stage_t *st, size_t bytes, char *err, size_t errlen) {
    if (bytes <= st->cap) return 0;
    if (st->host) st->be->host_free(st->host);
    st->host = st->be->host_alloc(bytes);
    st->cap = st->host ? bytes : 0;
    if (!st->host) {
        snprintf(err, errlen, "comm %s: out of pinned host memory for %zu staging bytes", c->name, bytes);
        return -ENOMEM;
    }
    return 0;
}

/* Run collective r on the staging buffers: copy in, collective, copy out.
 * A failure is returned (comm.c frees r and hands err to the caller). */
static int stage_start(comm_t *c, comm_req_t *r, char *err, size_t errlen) {
    stage_t *st = c->backend;
    const backend_t *be = st->be;
    size_t es = comm_dtype_size(r->dt), n = (size_t)c->n, one = r->count * es;
    size_t send_b = 0, recv_b = 0;
    switch (r->coll) {
    case COLL_ALL_GATHER: send_b = one; recv_b = n * one; break;
    case COLL_REDUCE_SCATTER: send_b = n * one; recv_b = one; break;
    case COLL_ALL_REDUCE: send_b = one; recv_b = one; break;
    case COLL_BROADCAST: recv_b = one; break; /* in place: the buffer is staged as output */
    case COLL_BARRIER: break;
    case COLL_SHIFT: send_b = one; recv_b = one; break;
    }
    int rc = stage_reserve(c, st, send_b + recv_b, err, errlen);
    if (rc) return rc;
    char *hs = st->host, *hr = st->host ? st->host + send_b : NULL;
    if (send_b) be->to_host(hs, r->send, send_b);
    if (r->coll == COLL_BROADCAST && recv_b && c->index == r->root) be->to_host(hr, r->recv, recv_b);
    comm_req_t *ir = NULL;
    switch (r->coll) {
    case COLL_ALL_GATHER: rc = comm_all_gather(st->inner, hs, hr, r->count, r->dt, &ir, err, errlen); break;
    case COLL_REDUCE_SCATTER:
        rc = comm_reduce_scatter(st->inner, hs, hr, r->count, r->dt, r->op, &ir, err, errlen);
        break;
    case COLL_ALL_REDUCE: rc = comm_all_reduce(st->inner, hs, hr, r->count, r->dt, r->op, &ir, err, errlen); break;
    case COLL_BROADCAST: rc = comm_broadcast(st->inner, hr, r->count, r->dt, r->root, &ir, err, errlen); break;
    case COLL_BARRIER: rc = comm_barrier(st->inner, &ir, err, errlen); break;
    case COLL_SHIFT: rc = comm_ring_shift(st->inner, hs, hr, r->count, r->dt, &ir, err, errlen); break;
    }
    if (!rc) rc = comm_wait(ir, err, errlen);
    if (rc) return rc;
    if (recv_b) be->from_host(r->recv, hr, recv_b);
    comm_req_done(r, 0, NULL);
    return 0;
}

static const comm_ops_t comm_stage_ops = {
    .name = "shm+stage",
    .init = stage_init,
    .destroy = stage_destroy,
    .start = stage_start,
    .wait = NULL,
    .test = NULL,
};

int comm_stage_wrap(comm_t **out, comm_t *inner, const backend_t *be, char *err, size_t errlen) {
    *out = NULL;
    if (!inner || !be || !be->host_alloc || !be->host_free || !be->to_host || !be->from_host) {
        snprintf(err, errlen, "comm staging needs a communicator and a backend with host_alloc and copies");
        return -EINVAL;
    }
    comm_t *c = calloc(1, sizeof *c);
    stage_t *st = calloc(1, sizeof *st);
    int *ranks = malloc(sizeof(int) * (size_t)inner->n);
    if (!c || !st || !ranks) {
        free(c);
        free(st);
        free(ranks);
        snprintf(err, errlen, "comm %s: out of memory", inner->name);
        return -ENOMEM;
    }
    memcpy(ranks, inner->ranks, sizeof(int) * (size_t)inner->n);
    st->inner = inner;
    st->be = be;
    c->ops = &comm_stage_ops;
    snprintf(c->name, sizeof c->name, "%s", inner->name);
    c->n = inner->n;
    c->index = inner->index;
    c->ranks = ranks;
    c->timeout_s = inner->timeout_s;
    c->next_seq = 1;
    c->backend = st;
    *out = c;
    return 0;
}

size_t comm_stage_bytes(const comm_t *c) {
    const stage_t *st = c->ops == &comm_stage_ops ? c->backend : NULL;
    return st ? st->cap : 0;
}
