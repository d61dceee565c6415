/* tier_io.h: the I/O engine under the NVMe tier: asynchronous reads and
 * writes of (fd, buffer, length, offset) with a completion callback, behind
 * a small backend table (redis ae.h style).
 *
 * Layers, each file using only those below it:
 *   tier_nvme.c    the tier; io_engine_open() picks a backend (tier_nvme.h)
 *   tier_uring.c, tier_threads.c
 *                  the backends: each implements io_backend_ops_t and feeds
 *                  every system call's result to io_progress()
 *   tier_io.c      what every backend shares: the in-flight limit, the
 *                  short-transfer / EOF / EINTR / EAGAIN rules
 *                  (io_progress), completion (io_settle, io_deliver),
 *                  statistics, and the engine calls below, which reach
 *                  the backend only through e->ops
 * Both backends complete a request only when all of it is done, at EOF
 * (reads; the callback sees the shorter count) or on error (-errno).
 *
 * Thread-safe. Callbacks run on an engine thread: they must be short and
 * must not submit, drain or close. */
#ifndef BALLAST_TIER_IO_H
#define BALLAST_TIER_IO_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define IO_ALIGN     4096u         /* O_DIRECT offset, length and buffer alignment, bytes */
#define IO_MAX_CHUNK (1ull << 30)  /* most bytes one system call or SQE moves */

/* ---- the engine ---- */

typedef enum {
    IO_BACKEND_AUTO = 0, /* io_uring, else threads (logged once) */
    IO_BACKEND_URING,    /* io_uring or fail */
    IO_BACKEND_THREADS,  /* pread/pwrite thread pool */
} io_backend_t;

typedef enum { IO_READ = 0, IO_WRITE = 1 } io_op_t;

/* res: bytes transferred (== len, or less for a read that hit EOF), or -errno. */
typedef void (*io_cb_t)(void *arg, int64_t res);

typedef struct {
    io_backend_t backend;
    uint32_t queue_depth;  /* most requests in flight; io_uring SQ size; 0 = 64, min 32 */
    uint32_t threads;      /* threads backend: workers; 0 = 4 */
} io_config_t;

typedef struct {
    uint64_t submitted;    /* requests accepted */
    uint64_t completed;    /* callbacks run */
    uint64_t errors;       /* completions with res < 0 */
    uint64_t bytes_read;   /* bytes */
    uint64_t bytes_written;/* bytes */
    uint64_t short_resubmits; /* short transfers continued with a new request */
    uint64_t eagain_retries;  /* -EAGAIN completions retried */
    uint64_t fixed_ops;    /* requests sent as READ_FIXED / WRITE_FIXED */
    uint32_t inflight;     /* requests in flight now */
    uint32_t inflight_max; /* the most in flight at once since open */
    uint32_t queue_depth;  /* the limit */
    bool registered;       /* buffers registered with io_uring */
} io_stats_t;

typedef struct io_engine io_engine_t;

/* Wait for every request in flight, stop the threads, free. NULL: no-op. */
void io_engine_close(io_engine_t *e);

/* Register buffer regions (e.g. the pool segments) so that requests inside
 * them avoid per-I/O page pinning. Call before submitting anything. Returns
 * 0, or -errno when the kernel refuses (I/O still works, unregistered); a
 * no-op returning 0 for the threads backend. */
int io_engine_register(io_engine_t *e, const struct iovec *iov, unsigned n);

/* Queue one request; blocks while queue_depth requests are in flight. cb is
 * called exactly once when it completes. 0, or -EINVAL (len 0) / -errno
 * without calling cb. */
int io_engine_submit(io_engine_t *e, io_op_t op, int fd, void *buf, uint64_t len,
                     uint64_t off, io_cb_t cb, void *arg);

/* Synchronous form: submit and wait. Returns bytes transferred or -errno. */
int64_t io_engine_rw(io_engine_t *e, io_op_t op, int fd, void *buf, uint64_t len, uint64_t off);

/* Fewer than queue_depth requests in flight now (a snapshot). */
bool io_engine_has_room(io_engine_t *e);

/* Wait until nothing is in flight. */
void io_engine_drain(io_engine_t *e);

const char *io_engine_name(const io_engine_t *e);     /* "io_uring" or "threads" */
const char *io_engine_fallback(const io_engine_t *e); /* why not io_uring; "" when not a fallback */
void io_engine_stats(io_engine_t *e, io_stats_t *out);

/* ---- for the backends ---- */

typedef struct io_req {
    io_op_t op;
    int fd;
    char *buf;            /* start of the whole request */
    uint64_t len;         /* bytes asked for */
    uint64_t off;         /* file offset of buf[0], bytes */
    uint64_t done;        /* bytes transferred so far */
    int64_t res;          /* the result, once settled */
    io_cb_t cb;
    void *arg;
    struct io_req *next;  /* backend queue link; the io_uring reaper's list of settled requests */
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
    pthread_mutex_t mu;      /* guards inflight, delivering and stats */
    pthread_cond_t cv;       /* inflight or delivering went down */
    uint32_t inflight;       /* requests at the device (slots taken) */
    uint32_t delivering;     /* settled requests whose callback has not returned */
    io_stats_t st;
    char fallback[128];      /* why io_uring is not used; "" otherwise */
};

/* The backends (tier_uring.c, tier_threads.c); tier_nvme.c picks one. */
extern const io_backend_ops_t io_uring_ops;
extern const io_backend_ops_t io_threads_ops;

/* Fill in e's defaults (queue_depth 64, at least 32, at most 4096; 4
 * threads, at most 256) and its lock from cfg; e->ops is left to the
 * caller. io_engine_free undoes it (for an engine whose backend failed to
 * open; a running one goes through io_engine_close). */
void io_engine_init(io_engine_t *e, const io_config_t *cfg);
void io_engine_free(io_engine_t *e);

/* Account res (the result of one system call or CQE for req's remaining
 * bytes). Returns true when req must be started again for the rest (short
 * transfer, -EAGAIN, -EINTR); false when it is finished: settled (its slot
 * released), and the caller must then io_deliver() it. */
bool io_progress(io_engine_t *e, io_req_t *req, int64_t res);

/* Finishing a request is two steps, so that a backend can release the
 * slots of a whole batch of completions before it runs their callbacks:
 * io_settle records res, the statistics and releases the in-flight slot;
 * io_deliver (once per settled request, on the engine thread, in any
 * order) runs the callback and frees req. A drain waits for both. */
void io_settle(io_engine_t *e, io_req_t *req, int64_t res);
void io_deliver(io_engine_t *e, io_req_t *req);

#endif
