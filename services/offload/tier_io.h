/* tier_io.h: internals shared by the I/O engine (tier_nvme.c) and its
 * backends (tier_uring.c, tier_threads.c). Not a public header. */
#ifndef BALLAST_TIER_IO_H
#define BALLAST_TIER_IO_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "tier_nvme.h"

#define IO_MAX_CHUNK (1ull << 30)  /* most bytes one system call or SQE moves */

typedef struct io_req {
    io_op_t op;
    int fd;
    char *buf;            /* start of the whole request */
    uint64_t len;         /* bytes asked for */
    uint64_t off;         /* file offset of buf[0], bytes */
    uint64_t done;        /* bytes transferred so far */
    io_cb_t cb;
    void *arg;
    struct io_req *next;  /* backend queue link */
} io_req_t;

/* The backend function table. */
typedef struct {
    const char *name;
    /* Set up; -errno with a message on failure (e->impl left NULL). */
    int (*open)(io_engine_t *e, char *err, size_t errlen);
    /* Start (or restart, after progress) the transfer of req's remaining
     * bytes. 0 or -errno (the caller completes req with it). */
    int (*start)(io_engine_t *e, io_req_t *req);
    int (*reg)(io_engine_t *e, const struct iovec *iov, unsigned n);
    /* Nothing is in flight: stop threads, free e->impl. */
    void (*close)(io_engine_t *e);
} io_backend_ops_t;

struct io_engine {
    const io_backend_ops_t *ops;
    void *impl;              /* backend state */
    io_config_t cfg;         /* effective: queue_depth and threads filled in */
    pthread_mutex_t mu;      /* guards inflight and stats */
    pthread_cond_t cv;       /* inflight went down */
    uint32_t inflight;
    io_stats_t st;
    char fallback[128];      /* why io_uring is not used; "" otherwise */
};

extern const io_backend_ops_t io_uring_ops;
extern const io_backend_ops_t io_threads_ops;

/* Account res (the result of one system call or CQE for req's remaining
 * bytes). Returns true when req must be started again for the rest (short
 * transfer, -EAGAIN, -EINTR); false when it is finished, in which case its
 * callback has run, req is freed and the in-flight slot released. */
bool io_progress(io_engine_t *e, io_req_t *req, int64_t res);

/* Finish req with res: stats, callback, free, release the slot. */
void io_finish(io_engine_t *e, io_req_t *req, int64_t res);

#endif
