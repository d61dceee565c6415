/* tier_nvme.h: the NVMe tier (spill files) and the choice of the I/O
 * engine's backend under it.
 *
 * I/O engine (tier_io.h): two backends implement its table:
 *   io_uring  (tier_uring.c): one ring, queue depth >= 32, buffers inside
 *             registered regions (the pool segments) go as READ_FIXED /
 *             WRITE_FIXED, a dedicated thread reaps completions, short
 *             transfers are resubmitted for the rest, -EAGAIN retried.
 *   threads   (tier_threads.c): a pool of threads doing pread/pwrite, the
 *             fallback when io_uring is refused (EPERM from seccomp or
 *             kernel.io_uring_disabled, ENOSYS); chosen with a warning logged
 *             once per process and shown in the stats.
 * io_engine_open() (here, the one place that knows both) picks one.
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

#include "tier_io.h"

#define TIER_ALIGN IO_ALIGN /* offset, length and buffer alignment, bytes */

/* ---- I/O engine: the backend choice (the rest is in tier_io.h) ---- */

/* Start an engine. With IO_BACKEND_AUTO, an io_uring that cannot be set up
 * (EPERM, ENOSYS, or any other error) gives the threads backend; the reason
 * is logged once per process and kept for io_engine_fallback(). With
 * IO_BACKEND_URING that is an error (-errno and a message naming the cause
 * and the fix). */
int io_engine_open(io_engine_t **out, const io_config_t *cfg, char *err, size_t errlen);

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
/* A request submitted now would start without waiting for a slot (a
 * snapshot: another submitter may take it first). */
bool tier_has_room(tier_t *t);

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
