/* tier_nvme.c: the I/O engine's common part (backend choice, in-flight
 * limit, short-transfer logic, statistics) and the spill-file tier on top of
 * it. The backends live in tier_uring.c and tier_threads.c. */
#include "tier_nvme.h"
#include "errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "extent.h"
#include "log.h"
#include "tier_io.h"

/* ---- engine ---- */

int io_engine_open(io_engine_t **out, const io_config_t *cfg, char *err, size_t errlen) {
    *out = NULL;
    io_engine_t *e = calloc(1, sizeof *e);
    if (!e) { errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    e->cfg = *cfg;
    if (e->cfg.queue_depth == 0) e->cfg.queue_depth = 64;
    if (e->cfg.queue_depth < 32) e->cfg.queue_depth = 32;
    if (e->cfg.queue_depth > 4096) e->cfg.queue_depth = 4096;
    if (e->cfg.threads == 0) e->cfg.threads = 4;
    if (e->cfg.threads > 256) e->cfg.threads = 256;
    e->st.queue_depth = e->cfg.queue_depth;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);

    int rc = 0;
    if (cfg->backend != IO_BACKEND_THREADS) {
        char why[128] = "";
        e->ops = &io_uring_ops;
        rc = e->ops->open(e, why, sizeof why);
        if (rc == 0) { *out = e; return 0; }
        if (cfg->backend == IO_BACKEND_URING) {
            errbuf_set(err, errlen, "io_uring forced by --io-backend io_uring but unavailable: %s "
                   "(use --io-backend auto or threads)", why);
            pthread_mutex_destroy(&e->mu);
            pthread_cond_destroy(&e->cv);
            free(e);
            return rc;
        }
        snprintf(e->fallback, sizeof e->fallback, "%s", why);
        static atomic_bool logged;
        if (!atomic_exchange(&logged, true))
            log_warn("io: io_uring unavailable (%s); using the pread/pwrite thread pool. "
                     "Spill I/O is slower; allow io_uring (docker: a seccomp profile that permits "
                     "io_uring_setup/io_uring_enter; sysctl kernel.io_uring_disabled=0) to get it back",
                     why);
    }
    e->ops = &io_threads_ops;
    rc = e->ops->open(e, err, errlen);
    if (rc) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void io_engine_drain(io_engine_t *e) {
    pthread_mutex_lock(&e->mu);
    while (e->inflight) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

void io_engine_close(io_engine_t *e) {
    if (!e) return;
    io_engine_drain(e);
    e->ops->close(e);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

int io_engine_register(io_engine_t *e, const struct iovec *iov, unsigned n) {
    return e->ops->reg ? e->ops->reg(e, iov, n) : 0;
}

void io_finish(io_engine_t *e, io_req_t *req, int64_t res) {
    io_cb_t cb = req->cb;
    void *arg = req->arg;
    pthread_mutex_lock(&e->mu);
    if (res < 0) e->st.errors++;
    else if (req->op == IO_READ) e->st.bytes_read += (uint64_t)res;
    else e->st.bytes_written += (uint64_t)res;
    pthread_mutex_unlock(&e->mu);
    free(req);
    cb(arg, res);
    /* The slot is released after the callback so that a drain that returns
     * has seen every callback finish. */
    pthread_mutex_lock(&e->mu);
    e->st.completed++;
    e->inflight--;
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
    if (res < 0) { io_finish(e, req, res); return false; }
    if (res == 0) {
        /* EOF on a read: report what we have. A write that moves nothing
         * would loop forever: call it an I/O error. */
        io_finish(e, req, req->op == IO_READ ? (int64_t)req->done : -EIO);
        return false;
    }
    uint64_t asked = req->len - req->done;
    if (asked > IO_MAX_CHUNK) asked = IO_MAX_CHUNK;
    req->done += (uint64_t)res;
    if (req->done >= req->len) { io_finish(e, req, (int64_t)req->len); return false; }
    /* Short transfer. Under O_DIRECT the kernel only stops at an unaligned
     * count at EOF, and restarting there would fail with EINVAL. */
    if (req->op == IO_READ && (req->done & (TIER_ALIGN - 1))) {
        int fl = fcntl(req->fd, F_GETFL);
        if (fl >= 0 && (fl & O_DIRECT)) { io_finish(e, req, (int64_t)req->done); return false; }
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
    e->inflight++;
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

/* ---- tier ---- */

struct tier {
    char dir[4096];
    uint64_t file_bytes;   /* bytes per file */
    uint32_t nfiles;
    int *fds;              /* one per file */
    bool direct;
    io_engine_t *io;
    pthread_mutex_t mu;    /* guards ext */
    ext_alloc_t *ext;
};

static void file_path(const tier_t *t, uint32_t i, char *buf, size_t len) {
    snprintf(buf, len, "%s/spill-%04u.dat", t->dir, i);
}

/* Open (creating and preallocating when needed) spill file i. */
static int open_file(tier_t *t, uint32_t i, bool want_direct, char *err, size_t errlen) {
    char path[4200];
    file_path(t, i, path, sizeof path);
    int base = O_RDWR | O_CREAT | O_CLOEXEC;
    int fd = -1;
    if (want_direct && t->direct) {
        fd = open(path, base | O_DIRECT, 0600);
        if (fd < 0 && errno == EINVAL) {
            log_warn("tier: %s refuses O_DIRECT (tmpfs or similar); spill files use buffered I/O "
                     "and fdatasync. Put --spill-dir on an NVMe filesystem (ext4, xfs) for direct I/O",
                     t->dir);
            t->direct = false;
        }
    }
    if (fd < 0) {
        if (want_direct && t->direct) {
            int e = errno;
            errbuf_set(err, errlen, "opening spill file %s: %s (check --spill-dir permissions)", path, strerror(e));
            return -e;
        }
        t->direct = false;
        fd = open(path, base, 0600);
        if (fd < 0) {
            int e = errno;
            errbuf_set(err, errlen, "opening spill file %s: %s (check --spill-dir permissions)", path, strerror(e));
            return -e;
        }
    }
    struct stat stb;
    if (fstat(fd, &stb) != 0) { int e = errno; close(fd); errbuf_set(err, errlen, "stat %s: %s", path, strerror(e)); return -e; }
    if ((uint64_t)stb.st_size < t->file_bytes) {
        int rc = fallocate(fd, 0, 0, (off_t)t->file_bytes);
        if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
            static atomic_bool logged;
            if (!atomic_exchange(&logged, true))
                log_warn("tier: %s does not support fallocate; spill files are sized with ftruncate "
                         "(space is not reserved ahead, a full disk shows up as write errors)", t->dir);
            rc = ftruncate(fd, (off_t)t->file_bytes);
        }
        if (rc != 0) {
            int e = errno;
            errbuf_set(err, errlen, "preallocating %llu bytes for %s: %s (free space on the spill "
                   "filesystem or lower --spill-bytes)", (unsigned long long)t->file_bytes, path, strerror(e));
            close(fd);
            return -e;
        }
    }
    t->fds[i] = fd;
    return 0;
}

int tier_open(tier_t **out, const tier_config_t *cfg, char *err, size_t errlen) {
    *out = NULL;
    if (!cfg->dir || !*cfg->dir) { errbuf_set(err, errlen, "no spill directory given (--spill-dir)"); return -EINVAL; }
    if (cfg->capacity == 0) { errbuf_set(err, errlen, "spill capacity is 0: give --spill-bytes a size such as 64G"); return -EINVAL; }
    if (strlen(cfg->dir) > 4000) { errbuf_set(err, errlen, "spill directory path too long"); return -ENAMETOOLONG; }
    uint64_t fb = cfg->file_bytes;
    if (fb == 0) fb = cfg->capacity < (1ull << 30) ? cfg->capacity : (1ull << 30);
    fb = (fb + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN;
    uint64_t nf = (cfg->capacity + fb - 1) / fb;
    if (nf > 65536) {
        errbuf_set(err, errlen, "spill capacity %llu in files of %llu bytes needs %llu files; at most 65536",
               (unsigned long long)cfg->capacity, (unsigned long long)fb, (unsigned long long)nf);
        return -EINVAL;
    }
    if (mkdir(cfg->dir, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        errbuf_set(err, errlen, "creating spill directory %s: %s", cfg->dir, strerror(e));
        return -e;
    }
    tier_t *t = calloc(1, sizeof *t);
    if (!t) { errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    snprintf(t->dir, sizeof t->dir, "%s", cfg->dir);
    t->file_bytes = fb;
    t->nfiles = (uint32_t)nf;
    t->direct = cfg->direct;
    pthread_mutex_init(&t->mu, NULL);
    t->fds = malloc(nf * sizeof *t->fds);
    t->ext = ext_new(TIER_ALIGN);
    if (!t->fds || !t->ext) { free(t->fds); ext_destroy(t->ext); free(t); errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    for (uint32_t i = 0; i < t->nfiles; i++) t->fds[i] = -1;
    int rc = 0;
    for (uint32_t i = 0; i < t->nfiles && rc == 0; i++) {
        rc = open_file(t, i, cfg->direct, err, errlen);
        if (rc == 0 && ext_add_span(t->ext, (uint64_t)i * fb, fb) < 0) {
            errbuf_set(err, errlen, "out of memory");
            rc = -ENOMEM;
        }
    }
    /* A later file may have turned O_DIRECT off: reopen the earlier ones
     * buffered so that every file behaves alike. */
    for (uint32_t i = 0; rc == 0 && !t->direct && cfg->direct && i < t->nfiles; i++) {
        int fl = fcntl(t->fds[i], F_GETFL);
        if (fl >= 0 && (fl & O_DIRECT) && fcntl(t->fds[i], F_SETFL, fl & ~O_DIRECT) != 0) {
            errbuf_set(err, errlen, "clearing O_DIRECT on spill file %u: %s", i, strerror(errno));
            rc = -errno;
        }
    }
    if (rc == 0) rc = io_engine_open(&t->io, &cfg->io, err, errlen);
    if (rc) { tier_close(t); return rc; }
    *out = t;
    return 0;
}

void tier_close(tier_t *t) {
    if (!t) return;
    if (t->io) io_engine_close(t->io);
    for (uint32_t i = 0; i < t->nfiles; i++)
        if (t->fds && t->fds[i] >= 0) close(t->fds[i]);
    free(t->fds);
    ext_destroy(t->ext);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

int tier_register(tier_t *t, const struct iovec *iov, unsigned n) {
    return io_engine_register(t->io, iov, n);
}

int tier_alloc(tier_t *t, uint64_t len, uint64_t *off) {
    if (len == 0 || len > t->file_bytes) return len ? -ENOSPC : -EINVAL;
    pthread_mutex_lock(&t->mu);
    int rc = ext_alloc(t->ext, len, off);
    pthread_mutex_unlock(&t->mu);
    return rc == -ENOMEM ? -ENOSPC : rc;
}

int tier_reserve(tier_t *t, uint64_t off, uint64_t len) {
    len = (len + TIER_ALIGN - 1) / TIER_ALIGN * TIER_ALIGN;
    pthread_mutex_lock(&t->mu);
    int rc = ext_reserve(t->ext, off, len);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int tier_free(tier_t *t, uint64_t off) {
    pthread_mutex_lock(&t->mu);
    int rc = ext_free(t->ext, off, NULL);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* File index and in-file offset for a request; -EINVAL when misaligned or
 * crossing a file. */
static int map_range(const tier_t *t, const void *buf, uint64_t len, uint64_t off,
                     uint32_t *file, uint64_t *foff) {
    if (len == 0 || (off | len | (uintptr_t)buf) & (TIER_ALIGN - 1)) return -EINVAL;
    uint64_t i = off / t->file_bytes;
    if (i >= t->nfiles) return -EINVAL;
    *foff = off - i * t->file_bytes;
    if (len > t->file_bytes - *foff) return -EINVAL;
    *file = (uint32_t)i;
    return 0;
}

int tier_submit(tier_t *t, io_op_t op, void *buf, uint64_t len, uint64_t off, io_cb_t cb, void *arg) {
    uint32_t f;
    uint64_t fo;
    int rc = map_range(t, buf, len, off, &f, &fo);
    if (rc) return rc;
    return io_engine_submit(t->io, op, t->fds[f], buf, len, fo, cb, arg);
}

int64_t tier_rw(tier_t *t, io_op_t op, void *buf, uint64_t len, uint64_t off) {
    uint32_t f;
    uint64_t fo;
    int rc = map_range(t, buf, len, off, &f, &fo);
    if (rc) return rc;
    return io_engine_rw(t->io, op, t->fds[f], buf, len, fo);
}

int tier_sync(tier_t *t, bool datasync) {
    io_engine_drain(t->io);
    int first = 0;
    for (uint32_t i = 0; i < t->nfiles; i++) {
        int rc = datasync ? fdatasync(t->fds[i]) : fsync(t->fds[i]);
        if (rc != 0 && !first) first = -errno;
    }
    return first;
}

int tier_sync_file(tier_t *t, uint64_t off) {
    uint64_t i = off / t->file_bytes;
    if (i >= t->nfiles) return -EINVAL;
    return fdatasync(t->fds[i]) != 0 ? -errno : 0;
}

int tier_locate(const tier_t *t, uint64_t off, char *path, size_t pathlen, uint64_t *file_off) {
    uint64_t i = off / t->file_bytes;
    if (i >= t->nfiles) return -EINVAL;
    file_path(t, (uint32_t)i, path, pathlen);
    *file_off = off - i * t->file_bytes;
    return 0;
}

bool tier_direct(const tier_t *t) { return t->direct; }
uint64_t tier_file_bytes(const tier_t *t) { return t->file_bytes; }

void tier_stats(tier_t *t, tier_stats_t *out) {
    memset(out, 0, sizeof *out);
    ext_stats_t es;
    pthread_mutex_lock(&t->mu);
    ext_stats(t->ext, &es);
    pthread_mutex_unlock(&t->mu);
    out->capacity = es.total;
    out->used = es.used;
    out->largest_free = es.largest_free;
    out->nfiles = t->nfiles;
    out->file_bytes = t->file_bytes;
    out->direct = t->direct;
    snprintf(out->backend, sizeof out->backend, "%s", io_engine_name(t->io));
    snprintf(out->fallback, sizeof out->fallback, "%s", io_engine_fallback(t->io));
    io_engine_stats(t->io, &out->io);
}
