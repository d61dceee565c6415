/* comm.c: the backend-independent half of comm.h: names, argument checks,
 * completion handles, waiting and its accounting. The collectives
 * themselves live in shm.c and nccl.c (and stage.c wraps one for device
 * buffers), which use this file through impl.h; open.c picks a backend and
 * starts a communicator on it. */
#include "workers/comm/impl.h"
#include "clock.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- names ---- */

const char *comm_coll_name(comm_coll_t c) {
    static const char *names[] = { "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "ring_shift" };
    return (unsigned)c < 5 ? names[c] : "?";
}

size_t comm_dtype_size(comm_dtype_t dt) { return dt == COMM_BF16 ? 2 : 4; }
const char *comm_dtype_name(comm_dtype_t dt) { return dt == COMM_BF16 ? "bf16" : "fp32"; }

int comm_kind_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "auto")) return COMM_AUTO;
    if (!strcmp(s, "shm")) return COMM_SHM;
    if (!strcmp(s, "nccl")) return COMM_NCCL;
    if (!strcmp(s, "gloo")) return COMM_GLOO;
    return -1;
}

const char *comm_kind_name(comm_kind_t k) {
    switch (k) {
    case COMM_AUTO: return "auto";
    case COMM_SHM: return "shm";
    case COMM_NCCL: return "nccl";
    case COMM_GLOO: return "gloo";
    default: return "?";
    }
}

/* ---- set-up ---- */

void comm_config_init(comm_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = COMM_SHM;
    cfg->shm_fd = -1;
}

void comm_destroy(comm_t *c) {
    if (!c) return;
    c->ops->destroy(c);
    free(c->ranks);
    free(c);
}

int comm_size(const comm_t *c) { return c->n; }
int comm_index(const comm_t *c) { return c->index; }
const char *comm_backend(const comm_t *c) { return c->ops->name; }

/* ---- requests ---- */

void comm_req_done(comm_req_t *r, int status, const char *msg) {
    pthread_mutex_lock(&r->mu);
    r->status = status;
    if (status && msg) snprintf(r->err, sizeof r->err, "%s", msg);
    r->done = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* ---- the progress threads' queue ---- */

void comm_queue_init(comm_queue_t *q) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
}

void comm_queue_destroy(comm_queue_t *q) {
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

void comm_queue_push(comm_queue_t *q, comm_req_t *r) {
    pthread_mutex_lock(&q->mu);
    r->next = NULL;
    if (q->tail) q->tail->next = r;
    else q->head = r;
    q->tail = r;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

comm_req_t *comm_queue_pop(comm_queue_t *q) {
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
    comm_req_t *r = q->head;
    if (r) {
        q->head = r->next;
        if (!q->head) q->tail = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    return r;
}

void comm_queue_stop(comm_queue_t *q) {
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static int start(comm_t *c, comm_coll_t coll, const void *send, void *recv, size_t count,
                 comm_dtype_t dt, comm_op_t op, int root, comm_req_t **out, char *err, size_t errlen) {
    *out = NULL;
    if (dt != COMM_F32 && dt != COMM_BF16) {
        snprintf(err, errlen, "comm %s: %s: unknown element type %d (fp32 or bf16)", c->name,
                 comm_coll_name(coll), (int)dt);
        return -EINVAL;
    }
    if (op != COMM_SUM && op != COMM_AVG) {
        snprintf(err, errlen, "comm %s: %s: unknown reduction %d (sum or avg)", c->name,
                 comm_coll_name(coll), (int)op);
        return -EINVAL;
    }
    if (coll == COLL_BROADCAST && (root < 0 || root >= c->n)) {
        snprintf(err, errlen, "comm %s: broadcast root %d outside the group of %d", c->name, root, c->n);
        return -EINVAL;
    }
    if (count > (SIZE_MAX / 8) / (size_t)c->n) {
        snprintf(err, errlen, "comm %s: %s: count %zu too large", c->name, comm_coll_name(coll), count);
        return -EINVAL;
    }
    if (coll != COLL_BARRIER && count > 0 && (!recv || (coll != COLL_BROADCAST && !send))) {
        snprintf(err, errlen, "comm %s: %s: NULL buffer", c->name, comm_coll_name(coll));
        return -EINVAL;
    }
    comm_req_t *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "comm %s: out of memory", c->name);
        return -ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->comm = c;
    r->coll = coll;
    r->send = send;
    r->recv = recv;
    r->count = count;
    r->dt = dt;
    r->op = op;
    r->root = root;
    r->seq = c->next_seq++;
    int rc = c->ops->start(c, r, err, errlen);
    if (rc) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int comm_all_gather(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                    comm_req_t **req, char *err, size_t errlen) {
    return start(c, COLL_ALL_GATHER, send, recv, count, dt, COMM_SUM, 0, req, err, errlen);
}

int comm_reduce_scatter(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                        comm_op_t op, comm_req_t **req, char *err, size_t errlen) {
    return start(c, COLL_REDUCE_SCATTER, send, recv, count, dt, op, 0, req, err, errlen);
}

int comm_all_reduce(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                    comm_op_t op, comm_req_t **req, char *err, size_t errlen) {
    return start(c, COLL_ALL_REDUCE, send, recv, count, dt, op, 0, req, err, errlen);
}

int comm_broadcast(comm_t *c, void *buf, size_t count, comm_dtype_t dt, int root,
                   comm_req_t **req, char *err, size_t errlen) {
    return start(c, COLL_BROADCAST, buf, buf, count, dt, COMM_SUM, root, req, err, errlen);
}

int comm_ring_shift(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                    comm_req_t **req, char *err, size_t errlen) {
    if (count > 0 && send == recv) {
        snprintf(err, errlen, "comm %s: ring_shift: send and recv are the same buffer (give two)", c->name);
        return -EINVAL;
    }
    return start(c, COLL_SHIFT, send, recv, count, dt, COMM_SUM, 0, req, err, errlen);
}

int comm_barrier(comm_t *c, comm_req_t **req, char *err, size_t errlen) {
    return start(c, COLL_BARRIER, NULL, NULL, 0, COMM_F32, COMM_SUM, 0, req, err, errlen);
}

bool comm_test(comm_req_t *r) {
    if (r->comm->ops->test) return r->comm->ops->test(r->comm, r);
    pthread_mutex_lock(&r->mu);
    bool d = r->done;
    pthread_mutex_unlock(&r->mu);
    return d;
}

/* Nanoseconds this process spent blocked in comm_wait (exposed comm). */
static _Atomic uint64_t g_wait_ns;

double comm_host_wait_seconds(void) { return 1e-9 * (double)atomic_load_explicit(&g_wait_ns, memory_order_relaxed); }

/* Block until r is done (the backend's wait hook first); its status, and
 * its message in err when it failed. r stays allocated. */
static int wait_done(comm_req_t *r, char *err, size_t errlen) {
    if (r->comm->ops->wait) r->comm->ops->wait(r->comm, r);
    pthread_mutex_lock(&r->mu);
    while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
    int st = r->status;
    if (st) snprintf(err, errlen, "%s", r->err);
    pthread_mutex_unlock(&r->mu);
    return st;
}

int comm_stream_wait(comm_req_t *r, void *stream, char *err, size_t errlen) {
    if (!r) {
        snprintf(err, errlen, "comm_stream_wait: NULL handle");
        return -EINVAL;
    }
    if (r->comm->ops->stream_wait) return r->comm->ops->stream_wait(r->comm, r, stream, err, errlen);
    /* host-memory backend: the result is there once the collective is done;
     * the host is blocked, so it counts as exposed communication */
    uint64_t t0 = clock_now_ns();
    int st = wait_done(r, err, errlen);
    atomic_fetch_add_explicit(&g_wait_ns, clock_now_ns() - t0, memory_order_relaxed);
    return st;
}

int comm_use(comm_hold_t *h, comm_req_t **req, void *stream, char *err, size_t errlen) {
    comm_req_t *r = *req;
    if (!r) return 0;
    *req = NULL;
    int rc = comm_stream_wait(r, stream, err, errlen);
    if (rc) {
        char e[COMM_ERR_LEN];
        comm_wait(r, e, sizeof e);
        return rc;
    }
    if (h->n == COMM_HOLD_MAX) {
        comm_req_t *old = h->r[0];
        memmove(h->r, h->r + 1, (COMM_HOLD_MAX - 1) * sizeof h->r[0]);
        h->n--;
        if ((rc = comm_wait(old, err, errlen))) {
            h->r[h->n++] = r;
            return rc;
        }
    }
    h->r[h->n++] = r;
    return 0;
}

int comm_hold_release(comm_hold_t *h, char *err, size_t errlen) {
    int rc = 0;
    char e[COMM_ERR_LEN];
    for (int i = 0; i < h->n; i++) {
        int st = comm_wait(h->r[i], e, sizeof e);
        if (st && !rc) {
            rc = st;
            snprintf(err, errlen, "%s", e);
        }
    }
    h->n = 0;
    return rc;
}

int comm_wait(comm_req_t *r, char *err, size_t errlen) {
    if (!r) {
        snprintf(err, errlen, "comm_wait: NULL handle");
        return -EINVAL;
    }
    uint64_t t0 = clock_now_ns();
    int st = wait_done(r, err, errlen);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    atomic_fetch_add_explicit(&g_wait_ns, clock_now_ns() - t0, memory_order_relaxed);
    return st;
}
