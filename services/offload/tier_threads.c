/* tier_threads.c: the thread-pool backend of the I/O engine, for hosts
 * where io_uring is refused. A FIFO of requests under a mutex; each worker
 * takes one and loops pread/pwrite until it is complete (io_progress(), in
 * tier_io.c, decides about short transfers, EOF, EINTR and EAGAIN exactly
 * as for io_uring). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tier_io.h"

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* queue not empty, or stopping */
    io_req_t *head, *tail;   /* FIFO */
    bool stop;
    uint32_t nthreads;
    pthread_t *threads;
} pool_impl_t;

static void run(io_engine_t *e, io_req_t *req) {
    for (;;) {
        uint64_t left = req->len - req->done;
        size_t n = (size_t)(left > IO_MAX_CHUNK ? IO_MAX_CHUNK : left);
        char *p = req->buf + req->done;
        off_t off = (off_t)(req->off + req->done);
        ssize_t r = req->op == IO_READ ? pread(req->fd, p, n, off) : pwrite(req->fd, p, n, off);
        int64_t res = r < 0 ? -(int64_t)errno : (int64_t)r;
        if (!io_progress(e, req, res)) { io_deliver(e, req); return; }
    }
}

static void *worker_main(void *arg) {
    io_engine_t *e = arg;
    pool_impl_t *t = e->impl;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->head && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->head) break;
        io_req_t *req = t->head;
        t->head = req->next;
        if (!t->head) t->tail = NULL;
        pthread_mutex_unlock(&t->mu);
        run(e, req);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void threads_close(io_engine_t *e) {
    pool_impl_t *t = e->impl;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    for (uint32_t i = 0; i < t->nthreads; i++) pthread_join(t->threads[i], NULL);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t->threads);
    free(t);
    e->impl = NULL;
}

static int threads_open(io_engine_t *e, char *err, size_t errlen) {
    pool_impl_t *t = calloc(1, sizeof *t);
    if (!t) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
    t->threads = calloc(e->cfg.threads, sizeof *t->threads);
    if (!t->threads) { free(t); snprintf(err, errlen, "out of memory"); return -ENOMEM; }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    e->impl = t;
    for (uint32_t i = 0; i < e->cfg.threads; i++) {
        int rc = pthread_create(&t->threads[i], NULL, worker_main, e);
        if (rc) {
            snprintf(err, errlen, "starting I/O thread %u: %s", i, strerror(rc));
            threads_close(e);
            return -rc;
        }
        t->nthreads++;
    }
    return 0;
}

static int threads_start(io_engine_t *e, io_req_t *req) {
    pool_impl_t *t = e->impl;
    req->next = NULL;
    pthread_mutex_lock(&t->mu);
    if (t->tail) t->tail->next = req;
    else t->head = req;
    t->tail = req;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

const io_backend_ops_t io_threads_ops = {
    .name = "threads",
    .open = threads_open,
    .start = threads_start,
    .reg = NULL,
    .close = threads_close,
};
