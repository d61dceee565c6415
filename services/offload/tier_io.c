/* tier_io.c: the part of the I/O engine every backend shares: the
 * in-flight limit, the short-transfer / EOF / EINTR / EAGAIN rules
 * (io_progress), completion (io_settle, io_deliver), statistics. It
 * reaches a backend only through e->ops, so the backends (tier_uring.c,
 * tier_threads.c) sit above it and call into it; tier_nvme.c picks one.
 * See tier_io.h. */
#include "tier_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>

/* ---- set-up ---- */

void io_engine_init(io_engine_t *e, const io_config_t *cfg) {
    e->cfg = *cfg;
    if (e->cfg.queue_depth == 0) e->cfg.queue_depth = 64;
    if (e->cfg.queue_depth < 32) e->cfg.queue_depth = 32;
    if (e->cfg.queue_depth > 4096) e->cfg.queue_depth = 4096;
    if (e->cfg.threads == 0) e->cfg.threads = 4;
    if (e->cfg.threads > 256) e->cfg.threads = 256;
    e->st.queue_depth = e->cfg.queue_depth;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
}

void io_engine_free(io_engine_t *e) {
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

/* ---- engine calls ---- */

bool io_engine_has_room(io_engine_t *e) {
    pthread_mutex_lock(&e->mu);
    bool room = e->inflight < e->cfg.queue_depth;
    pthread_mutex_unlock(&e->mu);
    return room;
}

void io_engine_drain(io_engine_t *e) {
    pthread_mutex_lock(&e->mu);
    while (e->inflight || e->delivering) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

void io_engine_close(io_engine_t *e) {
    if (!e) return;
    io_engine_drain(e);
    e->ops->close(e);
    io_engine_free(e);
}

int io_engine_register(io_engine_t *e, const struct iovec *iov, unsigned n) {
    return e->ops->reg ? e->ops->reg(e, iov, n) : 0;
}

/* The device is done with req: account it and give its slot to the next
 * request at once, before the callback runs. A callback may take a while
 * (a read-back's crc32c pass over a cold blob is ~0.14 ms per MiB here)
 * and this machine's disk answers a whole batch together: releasing slots
 * only after each callback left the device idle while the completion
 * thread checked a batch (32 x 1 MiB: ~4 ms of a ~14 ms cycle). */
void io_settle(io_engine_t *e, io_req_t *req, int64_t res) {
    req->res = res;
    pthread_mutex_lock(&e->mu);
    if (res < 0) e->st.errors++;
    else if (req->op == IO_READ) e->st.bytes_read += (uint64_t)res;
    else e->st.bytes_written += (uint64_t)res;
    e->inflight--;
    e->delivering++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void io_deliver(io_engine_t *e, io_req_t *req) {
    io_cb_t cb = req->cb;
    void *arg = req->arg;
    int64_t res = req->res;
    free(req);
    cb(arg, res);
    /* counted until the callback returns, so that a drain that returns has
     * seen every callback finish */
    pthread_mutex_lock(&e->mu);
    e->st.completed++;
    e->delivering--;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

bool io_progress(io_engine_t *e, io_req_t *req, int64_t res) {
    if (res == -EAGAIN || res == -EINTR) {
        pthread_mutex_lock(&e->mu);
        e->st.eagain_retries++;
        pthread_mutex_unlock(&e->mu);
        if (res == -EAGAIN) nanosleep(&(struct timespec){ 0, 20000 }, NULL);
        return true;
    }
    if (res < 0) { io_settle(e, req, res); return false; }
    if (res == 0) {
        /* EOF on a read: report what we have. A write that moves nothing
         * would loop forever: call it an I/O error. */
        io_settle(e, req, req->op == IO_READ ? (int64_t)req->done : -EIO);
        return false;
    }
    uint64_t asked = req->len - req->done;
    if (asked > IO_MAX_CHUNK) asked = IO_MAX_CHUNK;
    req->done += (uint64_t)res;
    if (req->done >= req->len) { io_settle(e, req, (int64_t)req->len); return false; }
    /* Short transfer. Under O_DIRECT the kernel only stops at an unaligned
     * count at EOF, and restarting there would fail with EINVAL. */
    if (req->op == IO_READ && (req->done & (IO_ALIGN - 1))) {
        int fl = fcntl(req->fd, F_GETFL);
        if (fl >= 0 && (fl & O_DIRECT)) { io_settle(e, req, (int64_t)req->done); return false; }
    }
    if ((uint64_t)res < asked) {
        pthread_mutex_lock(&e->mu);
        e->st.short_resubmits++;
        pthread_mutex_unlock(&e->mu);
    }
    return true;
}

int io_engine_submit(io_engine_t *e, io_op_t op, int fd, void *buf, uint64_t len,
                     uint64_t off, io_cb_t cb, void *arg) {
    if (len == 0 || !cb || fd < 0) return -EINVAL;
    io_req_t *req = calloc(1, sizeof *req);
    if (!req) return -ENOMEM;
    *req = (io_req_t){ .op = op, .fd = fd, .buf = buf, .len = len, .off = off, .cb = cb, .arg = arg };
    pthread_mutex_lock(&e->mu);
    while (e->inflight >= e->cfg.queue_depth) pthread_cond_wait(&e->cv, &e->mu);
    if (++e->inflight > e->st.inflight_max) e->st.inflight_max = e->inflight;
    e->st.submitted++;
    pthread_mutex_unlock(&e->mu);
    int rc = e->ops->start(e, req);
    if (rc) {
        pthread_mutex_lock(&e->mu);
        e->inflight--;
        e->st.submitted--;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        free(req);
    }
    return rc;
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int64_t res;
} sync_wait_t;

static void sync_cb(void *arg, int64_t res) {
    sync_wait_t *w = arg;
    pthread_mutex_lock(&w->mu);
    w->res = res;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int64_t io_engine_rw(io_engine_t *e, io_op_t op, int fd, void *buf, uint64_t len, uint64_t off) {
    sync_wait_t w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
    int rc = io_engine_submit(e, op, fd, buf, len, off, sync_cb, &w);
    if (rc) return rc;
    pthread_mutex_lock(&w.mu);
    while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return w.res;
}

const char *io_engine_name(const io_engine_t *e) { return e->ops->name; }
const char *io_engine_fallback(const io_engine_t *e) { return e->fallback; }

void io_engine_stats(io_engine_t *e, io_stats_t *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    out->inflight = e->inflight;
    pthread_mutex_unlock(&e->mu);
}
