/* tier_nvme.h: the NVMe tier (spill files) and the I/O engine under it.
 *
 * I/O engine: asynchronous reads and writes of (fd, buffer, length, offset)
 * with a completion callback, behind a small function table with two
 * backends:
 *   io_uring  (tier_uring.c): one ring, queue depth >= 32, buffers inside
 *             registered regions (the pool segments) go as READ_FIXED /
 *             WRITE_FIXED, a dedicated thread reaps completions, short
 *             transfers are resubmitted for the rest, -EAGAIN retried.
 *   threads   (tier_threads.c): a pool of threads doing pread/pwrite, the
 *             fallback when io_uring is refused (EPERM from seccomp or
 *             kernel.io_uring_disabled, ENOSYS); chosen with a warning logged
 *             once per process and shown in the stats.
 * Both complete a request only when all of it is done, at EOF (reads; the
 * callback sees the shorter count) or on error (-errno).
 *
 * Tier: spill files "<dir>/spill-NNNN.dat" of file_bytes each, preallocated
 * with fallocate and opened with O_DIRECT (when the filesystem refuses
 * O_DIRECT, e.g. older tmpfs, buffered I/O with a warning; durability then
 * rests on fdatasync as before). The tier's space is one offset range
 * [0, nfiles * file_bytes), file i holding [i*file_bytes, (i+1)*file_bytes);
 * extents come from the same allocator as the pool's (extent.h), 4 KiB
 * aligned, never crossing a file.
 *
 * Thread-safe. Callbacks run on an engine thread: they must be short and
 * must not submit, drain or close. */
#ifndef BALLAST_TIER_NVME_H
#define BALLAST_TIER_NVME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define TIER_ALIGN 4096u   /* offset, length and buffer alignment, bytes */

/* ---- I/O engine ---- */

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
    uint32_t queue_depth;  /* the limit */
    bool registered;       /* buffers registered with io_uring */
} io_stats_t;

typedef struct io_engine io_engine_t;

/* Start an engine. With IO_BACKEND_AUTO, an io_uring that cannot be set up
 * (EPERM, ENOSYS, or any other error) gives the threads backend; the reason
 * is logged once per process and kept for io_engine_fallback(). With
 * IO_BACKEND_URING that is an error (-errno and a message naming the cause
 * and the fix). */
int io_engine_open(io_engine_t **out, const io_config_t *cfg, char *err, size_t errlen);

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

/* Wait until nothing is in flight. */
void io_engine_drain(io_engine_t *e);

const char *io_engine_name(const io_engine_t *e);     /* "io_uring" or "threads" */
const char *io_engine_fallback(const io_engine_t *e); /* why not io_uring; "" when not a fallback */
void io_engine_stats(io_engine_t *e, io_stats_t *out);

/* ---- tier ---- */

typedef struct {
    const char *dir;       /* spill directory (created if missing) */
    uint64_t capacity;     /* bytes (> 0); rounded up to whole files */
    uint64_t file_bytes;   /* one spill file, bytes (multiple of 4 KiB); 0 = min(1 GiB, capacity) */
    io_config_t io;
    bool direct;           /* try O_DIRECT */
} tier_config_t;

typedef struct {
    uint64_t capacity;     /* bytes over all files */
    uint64_t used;         /* bytes in allocated extents */
    uint64_t largest_free; /* bytes */
    uint32_t nfiles;
    uint64_t file_bytes;
    bool direct;           /* files opened with O_DIRECT */
    char backend[16];      /* io_engine_name */
    char fallback[128];    /* io_engine_fallback */
    io_stats_t io;
} tier_stats_t;

typedef struct tier tier_t;

/* Create or reopen the spill files (existing files of the right size keep
 * their contents), open them (O_DIRECT when cfg->direct and the filesystem
 * allows), start the I/O engine. 0 and *out, or -errno with a message. */
int tier_open(tier_t **out, const tier_config_t *cfg, char *err, size_t errlen);

/* Drain, close the engine and the files. NULL: no-op. */
void tier_close(tier_t *t);

/* Register the pool segments with the engine (see io_engine_register). */
int tier_register(tier_t *t, const struct iovec *iov, unsigned n);

/* Space: allocate len bytes (rounded to 4 KiB) in one file: 0 and *off, or
 * -ENOSPC. tier_reserve marks a known extent used (restart), tier_free
 * returns one (0 or -EINVAL). */
int tier_alloc(tier_t *t, uint64_t len, uint64_t *off);
int tier_reserve(tier_t *t, uint64_t off, uint64_t len);
int tier_free(tier_t *t, uint64_t off);

/* Read or write [off, off+len) of the tier from/to buf. off, len and buf
 * must be 4 KiB aligned and the range inside one file (-EINVAL otherwise).
 * tier_submit calls cb once (res == len on success). tier_rw waits and
 * returns bytes or -errno. */
int tier_submit(tier_t *t, io_op_t op, void *buf, uint64_t len, uint64_t off, io_cb_t cb, void *arg);
int64_t tier_rw(tier_t *t, io_op_t op, void *buf, uint64_t len, uint64_t off);

/* Wait for in-flight requests, then fdatasync every file (full fsync when
 * datasync is false). 0 or the first -errno. */
int tier_sync(tier_t *t, bool datasync);

/* fdatasync only the file holding tier offset off (after a write to it has
 * completed). 0 or -errno. */
int tier_sync_file(tier_t *t, uint64_t off);

/* Path of the file holding tier offset off and the offset inside it (tests,
 * diagnostics). 0 or -EINVAL. */
int tier_locate(const tier_t *t, uint64_t off, char *path, size_t pathlen, uint64_t *file_off);

bool tier_direct(const tier_t *t);
uint64_t tier_file_bytes(const tier_t *t);
void tier_stats(tier_t *t, tier_stats_t *out);

#endif
