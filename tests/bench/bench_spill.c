/* bench_spill.c: spill throughput of the NVMe tier, for comparison with fio
 * on the same directory, block size, queue depth and file size.
 *
 * Writes --bytes sequentially through the tier (blocks of --block, --depth
 * requests in flight, buffers inside a pool segment, not registered with
 * io_uring unless --fixed: ballastd registers none, since its segments come
 * and go with the jobs), then reads
 * them back the same way, and prints MB/s (10^6 bytes per second) for each
 * phase plus machine-readable lines:
 *   RESULT bench_spill phase=write|read mbps=M dev_mb=D block=B depth=D backend=X direct=0|1
 *   RESULT bench_spill write_mbps=W read_mbps=R block=B depth=D backend=X direct=0|1  (--phase both)
 * fio's equivalent: --ioengine=io_uring --direct=1 --rw=write|read --bs=B
 * --iodepth=D --size=S --filename=<dir>/fio.dat.
 *
 * --phase write|read runs one phase only, on the spill files in --spill-dir
 * (kept after a write), so that a harness can interleave ours and fio phase
 * by phase (tests/bench/offload.sh). dev_mb is what the block device under
 * the directory moved during the phase (its /sys/dev/block/M:m/stat; other
 * processes add to it, -1 when the directory is not on a block device): a
 * read phase with dev_mb well under the bytes read was served from a cache,
 * not from the disk.
 *
 * With --verify every block carries its index and is checked after the read
 * (off by default: it costs CPU that fio does not spend; a read-only phase
 * checks what a write phase with --verify wrote). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "clock.h"
#include "options.h"
#include "services/offload/pool.h"
#include "services/offload/tier_nvme.h"

static const char *o_dir, *o_spill_dir;
static uint64_t o_bytes, o_block;
static int64_t o_depth;
static int o_backend, o_phase;
static bool o_direct, o_verify, o_keep, o_fixed, o_huge;

enum { PHASE_BOTH, PHASE_WRITE, PHASE_READ };

static const opt_t opts[] = {
    { "dir", OPT_STRING, "/tmp", 0, 0, NULL, "parent directory for the spill files (the NVMe under test)", &o_dir },
    { "spill-dir", OPT_STRING, NULL, 0, 0, NULL,
      "exact spill directory (default <dir>/ballast-bench-spill-PID); needed by --phase read", &o_spill_dir },
    { "phase", OPT_ENUM, "both", 0, 0, "both|write|read",
      "write then read back, or one of them (write keeps its files for a later read)", &o_phase },
    { "bytes", OPT_SIZE, "1G", 1 << 20, 1e15, NULL, "bytes to write and read back", &o_bytes },
    { "block", OPT_SIZE, "1M", 4096, 1 << 30, NULL, "bytes per request (multiple of 4K)", &o_block },
    { "depth", OPT_INT, "32", 1, 4096, NULL, "requests in flight", &o_depth },
    { "io-backend", OPT_ENUM, "auto", 0, 0, "auto|io_uring|threads", "I/O engine", &o_backend },
    { "direct", OPT_BOOL, "true", 0, 0, NULL, "O_DIRECT (as fio --direct=1)", &o_direct },
    { "fixed", OPT_BOOL, "false", 0, 0, NULL, "register the pool with io_uring (fixed-buffer requests); ballastd does not (its segments come and go with the jobs)", &o_fixed },
    { "huge-pages", OPT_BOOL, "false", 0, 0, NULL, "put the buffers on 2 MiB huge pages (as ballastd --huge-pages 2M; needs vm.nr_hugepages)", &o_huge },
    { "verify", OPT_BOOL, "false", 0, 0, NULL, "tag every block and check it after the read", &o_verify },
    { "keep", OPT_BOOL, "false", 0, 0, NULL, "keep the spill files afterwards (always with --phase write)", &o_keep },
};

/* One in-flight slot: a buffer and whether its request is running. */
typedef struct {
    char *buf;
    atomic_int busy;
    int64_t res;
    uint64_t off;
} slot_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static atomic_int failures;

static void done_cb(void *arg, int64_t res) {
    slot_t *s = arg;
    s->res = res;
    if (res != (int64_t)o_block) atomic_fetch_add(&failures, 1);
    pthread_mutex_lock(&mu);
    atomic_store(&s->busy, 0);
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

static void tag(char *buf, uint64_t block) {
    for (uint64_t i = 0; i < o_block; i += 512) memcpy(buf + i, &block, 8), memcpy(buf + i + 8, &i, 8);
}

static bool tag_ok(const char *buf, uint64_t block) {
    for (uint64_t i = 0; i < o_block; i += 512) {
        uint64_t b, j;
        memcpy(&b, buf + i, 8);
        memcpy(&j, buf + i + 8, 8);
        if (b != block || j != i) return false;
    }
    return true;
}

/* Bytes read and written so far by the block device holding dir (512-byte
 * sectors in /sys/dev/block/M:m/stat); false when there is none. */
static bool dev_bytes(const char *dir, uint64_t *rd, uint64_t *wr) {
    struct stat sb;
    if (stat(dir, &sb) != 0 || major(sb.st_dev) == 0) return false;
    char path[128];
    snprintf(path, sizeof path, "/sys/dev/block/%u:%u/stat", major(sb.st_dev), minor(sb.st_dev));
    FILE *f = fopen(path, "r");
    if (!f) return false;
    unsigned long long v[7];
    int n = fscanf(f, "%llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]);
    fclose(f);
    if (n != 7) return false;
    *rd = v[2] * 512;
    *wr = v[6] * 512;
    return true;
}

/* Run one phase over all blocks; returns seconds. */
static double phase(tier_t *t, slot_t *slots, uint64_t nblocks, io_op_t op, uint64_t *bad) {
    double t0 = clock_now_s();
    uint64_t next = 0;
    int depth = (int)o_depth;
    while (next < nblocks) {
        /* Find a free slot (wait when all are busy). */
        pthread_mutex_lock(&mu);
        int s = -1;
        for (;;) {
            for (int i = 0; i < depth; i++)
                if (!atomic_load(&slots[i].busy)) { s = i; break; }
            if (s >= 0) break;
            pthread_cond_wait(&cv, &mu);
        }
        pthread_mutex_unlock(&mu);
        if (op == IO_READ && o_verify && slots[s].off != UINT64_MAX && !tag_ok(slots[s].buf, slots[s].off / o_block))
            (*bad)++;
        if (op == IO_WRITE && o_verify) tag(slots[s].buf, next);
        slots[s].off = next * o_block;
        atomic_store(&slots[s].busy, 1);
        int rc = tier_submit(t, op, slots[s].buf, o_block, slots[s].off, done_cb, &slots[s]);
        if (rc) die("submitting block %llu: %s", (unsigned long long)next, strerror(-rc));
        next++;
    }
    pthread_mutex_lock(&mu);
    for (int i = 0; i < depth; i++)
        while (atomic_load(&slots[i].busy)) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    double dt = clock_now_s() - t0;
    for (int i = 0; i < depth && op == IO_READ && o_verify; i++)
        if (slots[i].off != UINT64_MAX && !tag_ok(slots[i].buf, slots[i].off / o_block)) (*bad)++;
    for (int i = 0; i < depth; i++) slots[i].off = UINT64_MAX;
    return dt;
}

/* One timed phase with the device's traffic around it; prints its lines.
 * Returns MB/s. */
static double run_phase(tier_t *t, const char *dir, slot_t *slots, uint64_t nblocks, io_op_t op,
                        uint64_t *bad, const tier_stats_t *st) {
    uint64_t r0 = 0, w0 = 0, r1 = 0, w1 = 0;
    bool dev = dev_bytes(dir, &r0, &w0);
    double dt = phase(t, slots, nblocks, op, bad);
    dev = dev && dev_bytes(dir, &r1, &w1);
    double mb = (double)(nblocks * o_block) / 1e6;
    double dev_mb = dev ? (double)(op == IO_READ ? r1 - r0 : w1 - w0) / 1e6 : -1;
    const char *name = op == IO_READ ? "read" : "write";
    printf("  %-5s %9.1f MB/s  (%.3f s", name, mb / dt, dt);
    if (dev) printf("; the device %s %.0f MB meanwhile", op == IO_READ ? "read" : "wrote", dev_mb);
    printf(")\n");
    printf("RESULT bench_spill phase=%s mbps=%.1f dev_mb=%.0f block=%llu depth=%lld backend=%s direct=%d\n", name,
           mb / dt, dev_mb, (unsigned long long)o_block, (long long)o_depth, st->backend, st->direct ? 1 : 0);
    return mb / dt;
}

int main(int argc, char **argv) {
    log_init("bench_spill", -1);
    char err[OPT_ERR_LEN];
    const char *pos[1];
    int npos = 0;
    int rc = opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, pos, 0, &npos,
                       "usage: bench_spill [options]\nSpill write/read throughput through ballastd's NVMe tier.",
                       err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) die("%s", err);
    if (o_block % 4096) die("--block %llu is not a multiple of 4K: O_DIRECT needs 4 KiB multiples",
                            (unsigned long long)o_block);
    uint64_t nblocks = o_bytes / o_block;
    if (nblocks == 0) die("--bytes must be at least one --block");
    if (o_phase == PHASE_READ && (!o_spill_dir || !*o_spill_dir))
        die("--phase read needs --spill-dir: the directory a --phase write filled");
    if (o_phase == PHASE_WRITE) o_keep = true;

    char dir[4096];
    if (o_spill_dir && *o_spill_dir) snprintf(dir, sizeof dir, "%s", o_spill_dir);
    else snprintf(dir, sizeof dir, "%s/ballast-bench-spill-%d", o_dir, (int)getpid());
    /* One file of exactly the bytes moved (as fio's --size), rounded to whole blocks. */
    uint64_t file_bytes = nblocks * o_block;
    if (o_phase == PHASE_READ) {
        /* A larger tier would grow the file with unwritten extents, which
         * read as zeros without touching the disk. */
        char f0[4200];
        struct stat sb;
        snprintf(f0, sizeof f0, "%s/spill-0000.dat", dir);
        if (stat(f0, &sb) != 0)
            die("--phase read: %s does not exist (run --phase write with the same --spill-dir first)", f0);
        if ((uint64_t)sb.st_size != file_bytes)
            die("--phase read: %s holds %llu bytes, not the %llu of --bytes (use the --bytes and --block "
                "of the write phase)", f0, (unsigned long long)sb.st_size, (unsigned long long)file_bytes);
    }
    pool_config_t pc = { .pool_bytes = (uint64_t)o_depth * o_block, .segment_bytes = (uint64_t)o_depth * o_block,
                         .mlock = true, .name = "bench-spill", .huge = o_huge ? POOL_HUGE_ON : POOL_HUGE_OFF };
    pool_t *pool;
    if (pool_open(&pool, &pc, err, sizeof err) != 0) die("pool: %s", err);
    tier_config_t tc = { .dir = dir, .capacity = file_bytes, .file_bytes = file_bytes,
                         .io = { .backend = (io_backend_t)o_backend, .queue_depth = (uint32_t)o_depth },
                         .direct = o_direct };
    if (tc.io.queue_depth < 32) tc.io.queue_depth = 32; /* the engine's floor; --depth still limits */
    tier_t *t;
    if (tier_open(&t, &tc, err, sizeof err) != 0) die("tier: %s", err);
    /* one region over the whole pool, cut into the buffers */
    pool_region_t all;
    if (pool_alloc(pool, 1, pc.pool_bytes, &all) != 0) die("pool of %llu bytes: no segment", (unsigned long long)pc.pool_bytes);
    struct iovec iov = { pool_ptr(pool, &all), all.len };
    int reg = o_fixed ? tier_register(t, &iov, 1) : -1;

    slot_t *slots = calloc((size_t)o_depth, sizeof *slots);
    CHECK_ALLOC(slots);
    for (int i = 0; i < o_depth; i++) {
        slots[i].buf = (char *)iov.iov_base + (size_t)i * o_block;
        slots[i].off = UINT64_MAX;
        memset(slots[i].buf, 0x5A + i, o_block);
    }
    tier_stats_t st;
    tier_stats(t, &st);
    printf("bench_spill: %llu MiB in %llu-byte blocks, depth %lld, backend %s, O_DIRECT %s, fixed buffers %s, %s\n",
           (unsigned long long)(nblocks * o_block >> 20), (unsigned long long)o_block, (long long)o_depth,
           st.backend, st.direct ? "on" : "off (filesystem refused it)",
           reg == 0 && st.io.registered ? "yes" : "no", dir);
    if (st.fallback[0]) printf("  io_uring not used: %s\n", st.fallback);
    uint64_t bad = 0;
    double wm = 0, rm = 0;
    if (o_phase != PHASE_READ) {
        wm = run_phase(t, dir, slots, nblocks, IO_WRITE, &bad, &st);
        double ts0 = clock_now_s();
        if (tier_sync(t, true) != 0) die("fdatasync failed");
        printf("  (the fdatasync after the writes took %.3f s, not counted: fio does not sync either)\n",
               clock_now_s() - ts0);
    }
    if (o_phase != PHASE_WRITE) rm = run_phase(t, dir, slots, nblocks, IO_READ, &bad, &st);
    tier_stats(t, &st);
    /* a request the kernel split (short transfers) or refused for now
     * (EAGAIN) runs in pieces, one after the other: worth seeing */
    printf("  engine: %llu requests, %llu short transfers continued, %llu EAGAIN retries, %llu with fixed buffers\n",
           (unsigned long long)st.io.submitted, (unsigned long long)st.io.short_resubmits,
           (unsigned long long)st.io.eagain_retries, (unsigned long long)st.io.fixed_ops);
    if (o_verify && o_phase != PHASE_WRITE) printf("  verify: %llu bad blocks\n", (unsigned long long)bad);
    if (o_phase == PHASE_BOTH)
        printf("RESULT bench_spill write_mbps=%.1f read_mbps=%.1f block=%llu depth=%lld backend=%s direct=%d\n",
               wm, rm, (unsigned long long)o_block, (long long)o_depth, st.backend, st.direct ? 1 : 0);
    tier_close(t);
    pool_close(pool);
    free(slots);
    if (!o_keep) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) log_warn("could not remove %s", dir);
    }
    if (atomic_load(&failures) || bad) {
        fprintf(stderr, "bench_spill: %d failed requests, %llu bad blocks\n", atomic_load(&failures),
                (unsigned long long)bad);
        return 1;
    }
    return 0;
}
