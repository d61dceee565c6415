/* tier_nvme.c: the spill-file tier, and the choice of the I/O engine's
 * backend under it (io_uring, else the thread pool). The engine's shared
 * part is tier_io.c; the backends are tier_uring.c and tier_threads.c. */
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

/* ---- the backend choice ---- */

int io_engine_open(io_engine_t **out, const io_config_t *cfg, char *err, size_t errlen) {
    *out = NULL;
    io_engine_t *e = calloc(1, sizeof *e);
    if (!e) { errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    io_engine_init(e, cfg);

    int rc = 0;
    if (cfg->backend != IO_BACKEND_THREADS) {
        char why[128] = "";
        e->ops = &io_uring_ops;
        rc = e->ops->open(e, why, sizeof why);
        if (rc == 0) { *out = e; return 0; }
        if (cfg->backend == IO_BACKEND_URING) {
            errbuf_set(err, errlen, "io_uring forced by --io-backend io_uring but unavailable: %s "
                   "(use --io-backend auto or threads)", why);
            io_engine_free(e);
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
        io_engine_free(e);
        return rc;
    }
    *out = e;
    return 0;
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

/* Open (creating and preallocating when needed) spill file i. A file that
 * was created or grown is fsynced (its size and allocation are metadata
 * that fdatasync of later writes need not cover) and *changed set, so that
 * the caller fsyncs the directory entry too: a blob acknowledged durable must
 * not sit in a file that a power loss could take away. */
static int open_file(tier_t *t, uint32_t i, bool want_direct, bool *changed, char *err, size_t errlen) {
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
        if (fsync(fd) != 0) {
            int e = errno;
            errbuf_set(err, errlen, "fsync of the new spill file %s: %s (is the spill filesystem "
                   "full or read-only?)", path, strerror(e));
            close(fd);
            return -e;
        }
        *changed = true;
    }
    t->fds[i] = fd;
    return 0;
}

/* fsync directory dir (its entries: the files just created in it). */
static int fsync_dir(const char *dir, char *err, size_t errlen) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = dfd < 0 || fsync(dfd) != 0 ? -errno : 0;
    if (dfd >= 0) close(dfd);
    if (rc) errbuf_set(err, errlen, "fsync of the spill directory %s: %s", dir, strerror(-rc));
    return rc;
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
    bool changed = false;
    for (uint32_t i = 0; i < t->nfiles && rc == 0; i++) {
        rc = open_file(t, i, cfg->direct, &changed, err, errlen);
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
    if (rc == 0 && changed) rc = fsync_dir(cfg->dir, err, errlen);
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

bool tier_has_room(tier_t *t) { return io_engine_has_room(t->io); }

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
