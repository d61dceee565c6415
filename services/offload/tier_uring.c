/* tier_uring.c: the io_uring backend of the I/O engine (liburing 2.3).
 *
 * One ring of queue_depth entries. Submitters take a mutex around the
 * submission queue; one dedicated thread owns the completion queue: it
 * sleeps in read() on an eventfd the kernel signals for every CQE (a plain
 * blocking call that every tool understands; valgrind, for one, does not
 * let other threads run while a thread blocks inside io_uring_enter), then
 * reaps every CQE there is, feeds each result to io_progress() and, for a
 * short transfer or -EAGAIN, starts the rest again; the requests that are
 * finished are settled as they are reaped (their slots go to waiting
 * submitters at once) and their callbacks run after the whole batch.
 * Without an eventfd it waits in io_uring_wait_cqe instead. The in-flight
 * limit (tier_io.c) keeps the number of requests at or below the SQ size,
 * and the CQ is twice that, so the completion queue never overflows.
 *
 * Registered buffers: io_engine_register() registers the pool segments
 * (split into pieces of at most 1 GiB, the kernel's limit per buffer);
 * requests whose buffer lies inside one piece go as READ_FIXED/WRITE_FIXED
 * and skip pinning pages on every I/O. */
#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier_io.h"

#define MAX_BUFS 1024  /* registered pieces */

/* A request travels to the reaper through the kernel (SQE user_data ->
 * CQE), an ordering ThreadSanitizer cannot see; tell it (tsan.h). */
#include "tsan.h"

typedef struct {
    struct io_uring ring;
    pthread_mutex_t sq_mu;     /* guards the submission queue */
    pthread_t reaper;
    int efd;                   /* eventfd signalled per CQE; -1 when not registered */
    struct iovec bufs[MAX_BUFS];
    unsigned nbufs;            /* 0 when nothing is registered */
} uring_t;

/* Index of the registered piece holding [p, p+len), or -1. */
static int fixed_index(const uring_t *u, const char *p, uint64_t len) {
    for (unsigned i = 0; i < u->nbufs; i++) {
        const char *b = u->bufs[i].iov_base;
        if (p >= b && p + len <= b + u->bufs[i].iov_len) return (int)i;
    }
    return -1;
}

static int uring_start(io_engine_t *e, io_req_t *req) {
    uring_t *u = e->impl;
    uint64_t left = req->len - req->done;
    unsigned n = (unsigned)(left > IO_MAX_CHUNK ? IO_MAX_CHUNK : left);
    char *p = req->buf + req->done;
    uint64_t off = req->off + req->done;
    int idx = u->nbufs ? fixed_index(u, p, n) : -1;

    pthread_mutex_lock(&u->sq_mu);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    while (!sqe) {
        /* Every SQE taken earlier is already submitted below, so this only
         * happens if the kernel has not consumed them yet. */
        io_uring_submit(&u->ring);
        sqe = io_uring_get_sqe(&u->ring);
    }
    if (idx >= 0) {
        if (req->op == IO_READ) io_uring_prep_read_fixed(sqe, req->fd, p, n, off, idx);
        else io_uring_prep_write_fixed(sqe, req->fd, p, n, off, idx);
    } else {
        if (req->op == IO_READ) io_uring_prep_read(sqe, req->fd, p, n, off);
        else io_uring_prep_write(sqe, req->fd, p, n, off);
    }
    io_uring_sqe_set_data(sqe, req);
    TSAN_RELEASE(req);
    int rc;
    do rc = io_uring_submit(&u->ring);
    while (rc == -EINTR || rc == -EAGAIN);
    pthread_mutex_unlock(&u->sq_mu);
    if (rc < 0) return rc;
    if (idx >= 0) {
        pthread_mutex_lock(&e->mu);
        e->st.fixed_ops++;
        pthread_mutex_unlock(&e->mu);
    }
    return 0;
}

/* Handle one completion; false for the stop marker. A request that is
 * finished is settled (its slot free for the next submitter) and goes on
 * *done, for its callback after the rest of the batch. */
static bool reap_one(io_engine_t *e, struct io_uring_cqe *cqe, io_req_t ***done) {
    uring_t *u = e->impl;
    io_req_t *req = io_uring_cqe_get_data(cqe);
    int64_t res = cqe->res;
    io_uring_cqe_seen(&u->ring, cqe);
    if (!req) return false; /* the stop marker from uring_close */
    TSAN_ACQUIRE(req);
    bool again = io_progress(e, req, res);
    while (again) {
        int src = uring_start(e, req);
        if (src == 0) return true; /* the rest is on its way */
        again = io_progress(e, req, src); /* could not resubmit: finish with that error */
    }
    req->next = NULL;
    **done = req;
    *done = &req->next;
    return true;
}

/* Run the callbacks of the settled requests on list, in completion order. */
static void deliver_all(io_engine_t *e, io_req_t *list) {
    while (list) {
        io_req_t *next = list->next;
        io_deliver(e, list);
        list = next;
    }
}

static void *reaper_main(void *arg) {
    io_engine_t *e = arg;
    uring_t *u = e->impl;
    for (;;) {
        /* settle every completion there is first (at most a queue's worth,
         * so that callbacks are not put off for as long as completions keep
         * coming), then run their callbacks: the submitters waiting for
         * slots go on meanwhile */
        io_req_t *list = NULL, **tail = &list;
        struct io_uring_cqe *cqe;
        bool stop = false;
        uint32_t n = 0;
        for (; !stop && n < e->cfg.queue_depth && io_uring_peek_cqe(&u->ring, &cqe) == 0; n++)
            stop = !reap_one(e, cqe, &tail);
        deliver_all(e, list);
        if (stop) return NULL;
        if (n == e->cfg.queue_depth) continue; /* more may be there: look before waiting */
        if (u->efd >= 0) {
            uint64_t v;
            ssize_t r = read(u->efd, &v, sizeof v);
            (void)r; /* EINTR or a count: either way, look at the CQ again */
        } else {
            io_uring_wait_cqe(&u->ring, &cqe); /* leaves the CQE for the peek loop */
        }
    }
}

static int uring_open(io_engine_t *e, char *err, size_t errlen) {
    uring_t *u = calloc(1, sizeof *u);
    if (!u) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
    struct io_uring_params prm;
    memset(&prm, 0, sizeof prm);
    prm.flags = IORING_SETUP_CQSIZE;
    prm.cq_entries = e->cfg.queue_depth * 2;
    int rc = io_uring_queue_init_params(e->cfg.queue_depth, &u->ring, &prm);
    if (rc < 0) {
        const char *hint = "";
        if (rc == -EPERM) hint = " (blocked by seccomp or sysctl kernel.io_uring_disabled)";
        else if (rc == -ENOSYS) hint = " (kernel without io_uring)";
        else if (rc == -ENOMEM) hint = " (RLIMIT_MEMLOCK too low for the ring)";
        snprintf(err, errlen, "io_uring_queue_init: %s%s", strerror(-rc), hint);
        free(u);
        return rc;
    }
    pthread_mutex_init(&u->sq_mu, NULL);
    u->efd = eventfd(0, EFD_CLOEXEC);
    if (u->efd >= 0 && io_uring_register_eventfd(&u->ring, u->efd) != 0) {
        close(u->efd);
        u->efd = -1;
    }
    e->impl = u;
    rc = pthread_create(&u->reaper, NULL, reaper_main, e);
    if (rc) {
        snprintf(err, errlen, "starting the io_uring completion thread: %s", strerror(rc));
        io_uring_queue_exit(&u->ring);
        if (u->efd >= 0) close(u->efd);
        pthread_mutex_destroy(&u->sq_mu);
        free(u);
        e->impl = NULL;
        return -rc;
    }
    return 0;
}

static int uring_reg(io_engine_t *e, const struct iovec *iov, unsigned n) {
    uring_t *u = e->impl;
    unsigned k = 0;
    for (unsigned i = 0; i < n; i++) {
        for (uint64_t o = 0; o < iov[i].iov_len; o += IO_MAX_CHUNK) {
            if (k == MAX_BUFS) return -E2BIG;
            uint64_t l = iov[i].iov_len - o;
            u->bufs[k].iov_base = (char *)iov[i].iov_base + o;
            u->bufs[k].iov_len = l > IO_MAX_CHUNK ? IO_MAX_CHUNK : l;
            k++;
        }
    }
    pthread_mutex_lock(&u->sq_mu);
    if (u->nbufs) io_uring_unregister_buffers(&u->ring);
    u->nbufs = 0;
    int rc = io_uring_register_buffers(&u->ring, u->bufs, k);
    if (rc == 0) u->nbufs = k;
    pthread_mutex_unlock(&u->sq_mu);
    pthread_mutex_lock(&e->mu);
    e->st.registered = rc == 0;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static void uring_close(io_engine_t *e) {
    uring_t *u = e->impl;
    if (!u) return;
    pthread_mutex_lock(&u->sq_mu);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    while (!sqe) { io_uring_submit(&u->ring); sqe = io_uring_get_sqe(&u->ring); }
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, NULL);
    io_uring_submit(&u->ring);
    pthread_mutex_unlock(&u->sq_mu);
    pthread_join(u->reaper, NULL);
    io_uring_queue_exit(&u->ring);
    if (u->efd >= 0) close(u->efd);
    pthread_mutex_destroy(&u->sq_mu);
    free(u);
    e->impl = NULL;
}

const io_backend_ops_t io_uring_ops = {
    .name = "io_uring",
    .open = uring_open,
    .start = uring_start,
    .reg = uring_reg,
    .close = uring_close,
};
