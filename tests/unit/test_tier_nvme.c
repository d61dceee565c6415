/* test_tier_nvme.c: the I/O engine (io_uring and the thread pool) and the
 * spill-file tier: random regions written and read back byte-exact, with
 * O_DIRECT and buffered; the queue_depth limit, and slots freed before
 * callbacks run; reads past
 * EOF; fixed buffers; the fallback to threads when io_uring is refused and
 * to buffered I/O when O_DIRECT is (both made real with a seccomp filter in
 * the test's own process); alignment and space checks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "services/offload/pool.h"
#include "services/offload/tier_nvme.h"
#include "tests/unit/helpers.h"

static uint64_t rng_state;
static uint64_t rnd(void) { return th_xorshift64(&rng_state); }

static void fill(void *p, size_t n) {
    uint64_t *q = p;
    for (size_t i = 0; i < n / 8; i++) q[i] = rnd();
}

static char dir[256];

static void make_dir(const char *base) { th_tmpdir(dir, sizeof dir, base, "test-tier"); }

/* Idempotent; also runs after a failed test (suite .fini). */
static void remove_dir(void) { th_tmpdir_remove(dir); }

TestSuite(io_engine, .fini = remove_dir);

TestSuite(tier, .fini = remove_dir);


/* Whether files in d accept O_DIRECT. */
static bool direct_ok(const char *d) {
    char p[300];
    snprintf(p, sizeof p, "%s/.odirect-probe", d);
    int fd = open(p, O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd >= 0) close(fd);
    unlink(p);
    return fd >= 0;
}

/* Whether this kernel lets us set up an io_uring at all. */
static bool uring_ok(char *why, size_t len) {
    io_engine_t *e;
    io_config_t c = { .backend = IO_BACKEND_URING };
    int rc = io_engine_open(&e, &c, why, len);
    if (rc == 0) io_engine_close(e);
    return rc == 0;
}

typedef struct {
    atomic_int done;
    atomic_int bad;
    io_engine_t *e;
    int64_t want;
} counter_t;

static void count_cb(void *arg, int64_t res) {
    counter_t *c = arg;
    if (res != c->want) atomic_fetch_add(&c->bad, 1);
    atomic_fetch_add(&c->done, 1);
}

/* Write NREQ random, non-overlapping regions of a 32 MiB file through the
 * engine with the requests all submitted before any wait, read them back
 * the same way, compare. */
static void random_round_trip(io_backend_t be, bool direct, const char *base) {
    make_dir(base);
    char path[300];
    snprintf(path, sizeof path, "%s/f", dir);
    int fd = open(path, O_RDWR | O_CREAT | (direct ? O_DIRECT : 0), 0600);
    cr_assert_geq(fd, 0);
    const uint64_t fsize = 32u << 20;
    cr_assert_eq(ftruncate(fd, (off_t)fsize), 0);
    io_engine_t *e;
    char err[256];
    io_config_t cfg = { .backend = be, .queue_depth = 32, .threads = 4 };
    cr_assert_eq(io_engine_open(&e, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(io_engine_name(e), be == IO_BACKEND_URING ? "io_uring" : "threads");

    enum { NREQ = 200 };
    /* Carve the file into NREQ slots of 160 KiB; each request uses a random
     * 4 KiB multiple inside its slot. */
    const uint64_t slot = 160u << 10;
    uint64_t off[NREQ], len[NREQ];
    char *src = aligned_alloc(4096, NREQ * slot), *dst = aligned_alloc(4096, NREQ * slot);
    fill(src, NREQ * slot);
    memset(dst, 0xA5, NREQ * slot);
    for (int i = 0; i < NREQ; i++) {
        len[i] = 4096 * (1 + rnd() % (slot / 4096));
        off[i] = (uint64_t)i * slot + 4096 * (rnd() % ((slot - len[i]) / 4096 + 1));
    }
    for (int pass = 0; pass < 2; pass++) {
        /* One counter per request: each completion checks its own length. */
        counter_t *cs = calloc(NREQ, sizeof *cs);
        for (int i = 0; i < NREQ; i++) {
            cs[i].e = e;
            cs[i].want = (int64_t)len[i];
            char *buf = (pass == 0 ? src : dst) + (off[i] - (uint64_t)i * slot) + (uint64_t)i * slot;
            int rc = io_engine_submit(e, pass == 0 ? IO_WRITE : IO_READ, fd, buf, len[i], off[i], count_cb, &cs[i]);
            cr_assert_eq(rc, 0, "submit %d: %s", i, strerror(-rc));
        }
        io_engine_drain(e);
        for (int i = 0; i < NREQ; i++) {
            cr_assert_eq(atomic_load(&cs[i].done), 1, "request %d completed %d times", i, atomic_load(&cs[i].done));
            cr_assert_eq(atomic_load(&cs[i].bad), 0, "request %d got the wrong byte count", i);
        }
        free(cs);
    }
    for (int i = 0; i < NREQ; i++) {
        uint64_t at = off[i];
        cr_assert_eq(memcmp(src + at, dst + at, len[i]), 0, "region %d differs after read-back", i);
    }
    io_stats_t st;
    io_engine_stats(e, &st);
    cr_assert_eq(st.completed, 2 * NREQ);
    cr_assert_eq(st.errors, 0);
    cr_assert_eq(st.queue_depth, 32);
    uint64_t total = 0;
    for (int i = 0; i < NREQ; i++) total += len[i];
    cr_assert_eq(st.bytes_written, total);
    cr_assert_eq(st.bytes_read, total);
    io_engine_close(e);
    close(fd);
    free(src);
    free(dst);
    remove_dir();
}

Test(io_engine, random_regions_io_uring_direct) {
    char why[256];
    if (!uring_ok(why, sizeof why)) cr_skip_test("io_uring refused by this kernel/sandbox: %s", why);
    if (!direct_ok("/tmp")) cr_skip_test("/tmp refuses O_DIRECT; covered by the buffered test");
    rng_state = 0x1111222233334444ull;
    random_round_trip(IO_BACKEND_URING, true, "/tmp");
}

Test(io_engine, random_regions_io_uring_buffered) {
    char why[256];
    if (!uring_ok(why, sizeof why)) cr_skip_test("io_uring refused by this kernel/sandbox: %s", why);
    rng_state = 0x5555666677778888ull;
    random_round_trip(IO_BACKEND_URING, false, "/tmp");
}

Test(io_engine, random_regions_threads_direct) {
    if (!direct_ok("/tmp")) cr_skip_test("/tmp refuses O_DIRECT; covered by the buffered test");
    rng_state = 0x9999aaaabbbbccccull;
    random_round_trip(IO_BACKEND_THREADS, true, "/tmp");
}

Test(io_engine, random_regions_threads_buffered) {
    rng_state = 0xddddeeeeffff0001ull;
    random_round_trip(IO_BACKEND_THREADS, false, "/tmp");
}

/* The in-flight limit and the two steps of finishing a request, on a
 * backend of the test's own (tier_io.h's backend table): its start() only
 * keeps the request, so requests stay at the "device" until the test ends
 * them, as io_uring's reaper does: io_progress (the slot goes), then
 * io_deliver (the callback). */
static io_req_t *held[64];
static atomic_int nheld;

static int held_start(io_engine_t *e, io_req_t *req) {
    (void)e;
    held[atomic_fetch_add(&nheld, 1)] = req;
    return 0;
}
static int held_open(io_engine_t *e, char *err, size_t errlen) { (void)err; (void)errlen; e->impl = held; return 0; }
static void held_close(io_engine_t *e) { e->impl = NULL; }
static const io_backend_ops_t held_ops = { .name = "held", .open = held_open, .start = held_start,
                                           .close = held_close };

static atomic_int cb_runs;
static void counted_cb(void *arg, int64_t res) {
    (void)arg;
    if (res == 4096) atomic_fetch_add(&cb_runs, 1);
}

typedef struct { io_engine_t *e; char *buf; io_cb_t cb; atomic_bool returned; } late_t;

static void *late_submit(void *arg) {
    late_t *l = arg;
    int rc = io_engine_submit(l->e, IO_READ, 0, l->buf, 4096, 0, l->cb, NULL);
    cr_assert_eq(rc, 0);
    atomic_store(&l->returned, true);
    return NULL;
}

static void *drainer(void *arg) {
    late_t *l = arg;
    io_engine_drain(l->e);
    atomic_store(&l->returned, true);
    return NULL;
}

/* Poll flag for up to ms milliseconds. */
static bool becomes_true(atomic_bool *flag, int ms) {
    for (int i = 0; i < ms && !atomic_load(flag); i++) usleep(1000);
    return atomic_load(flag);
}

Test(io_engine, queue_depth_limits_requests_at_the_device_and_frees_a_slot_before_the_callback) {
    io_engine_t *e = calloc(1, sizeof *e);
    cr_assert(e);
    io_config_t cfg = { .queue_depth = 40 };
    io_engine_init(e, &cfg);
    e->ops = &held_ops;
    char err[64];
    cr_assert_eq(e->ops->open(e, err, sizeof err), 0);
    char buf[4096];
    atomic_store(&nheld, 0);
    atomic_store(&cb_runs, 0);
    for (int i = 0; i < 40; i++) cr_assert_eq(io_engine_submit(e, IO_READ, 0, buf, 4096, 0, counted_cb, NULL), 0);
    io_stats_t st;
    io_engine_stats(e, &st);
    cr_assert_eq(st.inflight, 40, "%u in flight after 40 submits at depth 40", st.inflight);
    cr_assert_eq(st.inflight_max, 40, "the peak in flight is %u, not 40", st.inflight_max);
    late_t l = { .e = e, .buf = buf, .cb = counted_cb };
    pthread_t th;
    pthread_create(&th, NULL, late_submit, &l);
    cr_assert(!becomes_true(&l.returned, 100), "a 41st request was accepted at queue depth 40");
    /* the device ends one: its slot goes to the waiting submitter before
     * its callback has run */
    cr_assert(!io_progress(e, held[0], 4096), "a whole transfer asked for more");
    cr_assert(becomes_true(&l.returned, 5000), "the 41st request still waits after one ended (slot held until "
              "the callback)");
    pthread_join(th, NULL);
    cr_assert_eq(atomic_load(&cb_runs), 0);
    /* a drain waits for callbacks too, not only for the device */
    for (int i = 1; i < 41; i++) cr_assert(!io_progress(e, held[i], 4096));
    io_engine_stats(e, &st);
    cr_assert_eq(st.inflight, 0);
    cr_assert_eq(st.inflight_max, 40, "the peak in flight is %u past the queue depth 40", st.inflight_max);
    late_t d = { .e = e };
    pthread_create(&th, NULL, drainer, &d);
    cr_assert(!becomes_true(&d.returned, 50), "drain returned with 41 callbacks not yet run");
    for (int i = 0; i < 41; i++) io_deliver(e, held[i]);
    cr_assert(becomes_true(&d.returned, 5000), "drain did not return after every callback ran");
    pthread_join(th, NULL);
    cr_assert_eq(atomic_load(&cb_runs), 41);
    io_engine_stats(e, &st);
    cr_assert_eq(st.completed, 41);
    io_engine_close(e);
}

/* On the real backends: callbacks held back at a gate do not hold their
 * slots (a 41st request goes at depth 40), and a drain waits for them. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_open;

static void gated_cb(void *arg, int64_t res) {
    pthread_mutex_lock(&gate_mu);
    while (!gate_open) pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);
    counted_cb(arg, res);
}

static void callbacks_hold_no_slots(io_backend_t be) {
    make_dir("/tmp");
    char path[300];
    snprintf(path, sizeof path, "%s/q", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 1 << 20), 0);
    io_engine_t *e;
    char err[256];
    io_config_t cfg = { .backend = be, .queue_depth = 40, .threads = 3 };
    cr_assert_eq(io_engine_open(&e, &cfg, err, sizeof err), 0, "%s", err);
    char *buf = aligned_alloc(4096, 41 * 4096);
    gate_open = false;
    atomic_store(&cb_runs, 0);
    for (int i = 0; i < 40; i++)
        cr_assert_eq(io_engine_submit(e, IO_READ, fd, buf + i * 4096, 4096, (uint64_t)i * 4096, gated_cb, NULL), 0);
    int rc = io_engine_submit(e, IO_READ, fd, buf + 40 * 4096, 4096, 0, gated_cb, NULL);
    cr_assert_eq(rc, 0); /* returns once one read has ended, its callback held or not */
    late_t d = { .e = e };
    pthread_t th;
    pthread_create(&th, NULL, drainer, &d);
    cr_assert(!becomes_true(&d.returned, 100), "drain returned with every callback held");
    pthread_mutex_lock(&gate_mu);
    gate_open = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    pthread_join(th, NULL);
    cr_assert_eq(atomic_load(&cb_runs), 41);
    io_engine_close(e);
    close(fd);
    free(buf);
    remove_dir();
}

Test(io_engine, held_callbacks_keep_no_slots_io_uring, .timeout = 30) {
    char why[256];
    if (!uring_ok(why, sizeof why)) cr_skip_test("io_uring refused by this kernel/sandbox: %s", why);
    callbacks_hold_no_slots(IO_BACKEND_URING);
}

Test(io_engine, held_callbacks_keep_no_slots_threads, .timeout = 30) { callbacks_hold_no_slots(IO_BACKEND_THREADS); }

/* A read that runs past EOF returns what is there: the engine resubmits the
 * rest after the short read, finds EOF, and reports the shorter count. */
static void short_read(io_backend_t be) {
    make_dir("/tmp");
    char path[300];
    snprintf(path, sizeof path, "%s/short", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    cr_assert_geq(fd, 0);
    char src[10000];
    fill(src, 10000 / 8 * 8);
    for (int i = 10000 / 8 * 8; i < 10000; i++) src[i] = (char)rnd();
    cr_assert_eq(write(fd, src, sizeof src), (ssize_t)sizeof src);
    io_engine_t *e;
    char err[256];
    io_config_t cfg = { .backend = be };
    cr_assert_eq(io_engine_open(&e, &cfg, err, sizeof err), 0, "%s", err);
    char *buf = aligned_alloc(4096, 16384);
    memset(buf, 0, 16384);
    int64_t n = io_engine_rw(e, IO_READ, fd, buf, 16384, 0);
    cr_assert_eq(n, 10000, "read past EOF returned %lld", (long long)n);
    cr_assert_eq(memcmp(buf, src, 10000), 0);
    io_stats_t st;
    io_engine_stats(e, &st);
    cr_assert_geq(st.short_resubmits, 1, "the short read was not continued");
    /* Entirely past EOF: 0 bytes, not an error. */
    cr_assert_eq(io_engine_rw(e, IO_READ, fd, buf, 4096, 1 << 20), 0);
    /* The same under O_DIRECT, where the kernel stops at an unaligned count. */
    int dfd = open(path, O_RDONLY | O_DIRECT);
    if (dfd >= 0) {
        memset(buf, 0, 16384);
        n = io_engine_rw(e, IO_READ, dfd, buf, 16384, 0);
        cr_assert_eq(n, 10000, "O_DIRECT read past EOF returned %lld", (long long)n);
        cr_assert_eq(memcmp(buf, src, 10000), 0);
        n = io_engine_rw(e, IO_READ, dfd, buf, 4096, 8192);
        cr_assert_eq(n, 10000 - 8192);
        cr_assert_eq(memcmp(buf, src + 8192, 10000 - 8192), 0);
        close(dfd);
    }
    /* A bad fd is an error, delivered through the callback path. */
    cr_assert_eq(io_engine_rw(e, IO_READ, 12345, buf, 4096, 0), -EBADF);
    io_engine_stats(e, &st);
    cr_assert_eq(st.errors, 1);
    io_engine_close(e);
    close(fd);
    free(buf);
    remove_dir();
}

Test(io_engine, short_read_io_uring) {
    char why[256];
    if (!uring_ok(why, sizeof why)) cr_skip_test("io_uring refused by this kernel/sandbox: %s", why);
    rng_state = 0x4242ull;
    short_read(IO_BACKEND_URING);
}

Test(io_engine, short_read_threads) {
    rng_state = 0x4343ull;
    short_read(IO_BACKEND_THREADS);
}

/* Refuse io_uring_setup with EPERM the way Docker's default seccomp profile
 * does, then ask for auto: the threads backend with the reason recorded. */
Test(io_engine, falls_back_to_threads_when_seccomp_refuses_io_uring) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { .len = sizeof f / sizeof f[0], .filter = f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
        cr_skip_test("cannot install a seccomp filter here: %s", strerror(errno));
    io_engine_t *e;
    char err[256] = "";
    io_config_t cfg = { .backend = IO_BACKEND_AUTO };
    cr_assert_eq(io_engine_open(&e, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(io_engine_name(e), "threads");
    cr_assert(strstr(io_engine_fallback(e), "Operation not permitted") != NULL, "fallback reason: %s",
              io_engine_fallback(e));
    cr_assert(strstr(io_engine_fallback(e), "seccomp") != NULL, "no hint in: %s", io_engine_fallback(e));
    /* It still moves bytes. */
    make_dir("/tmp");
    char path[300];
    snprintf(path, sizeof path, "%s/fb", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    char *a = aligned_alloc(4096, 65536), *b = aligned_alloc(4096, 65536);
    rng_state = 0x777ull;
    fill(a, 65536);
    cr_assert_eq(io_engine_rw(e, IO_WRITE, fd, a, 65536, 4096), 65536);
    cr_assert_eq(io_engine_rw(e, IO_READ, fd, b, 65536, 4096), 65536);
    cr_assert_eq(memcmp(a, b, 65536), 0);
    io_engine_close(e);
    /* Forcing io_uring now fails with a message that names the way out. */
    cfg.backend = IO_BACKEND_URING;
    cr_assert_eq(io_engine_open(&e, &cfg, err, sizeof err), -EPERM);
    cr_assert(strstr(err, "--io-backend") != NULL, "%s", err);
    close(fd);
    free(a);
    free(b);
    remove_dir();
}

/* The tier over spill files, with the pool registered as fixed buffers. */
static void tier_round_trip(io_backend_t be, bool direct) {
    rng_state = 0xc0ffee00ull + (uint64_t)be * 7 + direct;
    make_dir("/tmp");
    pool_config_t pc = { .pool_bytes = 8u << 20, .segment_bytes = 4u << 20 };
    pool_t *p;
    char err[256];
    cr_assert_eq(pool_open(&p, &pc, err, sizeof err), 0, "%s", err);
    tier_config_t tc = { .dir = dir, .capacity = 24u << 20, .file_bytes = 8u << 20,
                         .io = { .backend = be, .queue_depth = 48 }, .direct = direct };
    tier_t *t;
    cr_assert_eq(tier_open(&t, &tc, err, sizeof err), 0, "%s", err);
    if (direct) cr_assert_eq(tier_direct(t), direct_ok(dir), "O_DIRECT detection disagrees with a probe");
    else cr_assert(!tier_direct(t));
    /* one 4 MiB segment for each of two owners */
    pool_region_t s0, s1;
    cr_assert_eq(pool_alloc(p, 1, 4096, &s0), 0);
    cr_assert_eq(pool_alloc(p, 2, 4096, &s1), 0);
    pool_region_t w0 = { s0.seg, 0, 0, 4u << 20 }, w1 = { s1.seg, 0, 0, 4u << 20 };
    struct iovec iov[2] = { { pool_ptr(p, &w0), 4u << 20 }, { pool_ptr(p, &w1), 4u << 20 } };
    cr_assert(iov[0].iov_base && iov[1].iov_base);
    int reg = tier_register(t, iov, 2);
    tier_stats_t ts;
    tier_stats(t, &ts);
    cr_assert_eq(ts.nfiles, 3);
    cr_assert_eq(ts.capacity, 24u << 20);
    char why[256];
    bool uring = be == IO_BACKEND_URING || (be == IO_BACKEND_AUTO && uring_ok(why, sizeof why));
    cr_assert_str_eq(ts.backend, uring ? "io_uring" : "threads");
    char path[300];
    uint64_t fo;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tier_locate(t, (uint64_t)i * (8u << 20) + 8192, path, sizeof path, &fo), 0);
        cr_assert_eq(fo, 8192);
        struct stat st;
        cr_assert_eq(stat(path, &st), 0);
        cr_assert_eq(st.st_size, 8u << 20, "spill file %d not preallocated", i);
    }
    /* Random extents: allocate, write from pool regions, read back into others. */
    enum { N = 40 };
    pool_region_t src[N];
    uint64_t off[N], len[N];
    int n = 0;
    for (; n < N; n++) {
        len[n] = 4096 * (1 + rnd() % 24);
        if (pool_alloc(p, 1 + (uint64_t)(n % 2), len[n], &src[n]) != 0) break;
        if (tier_alloc(t, len[n], &off[n]) != 0) { pool_free(p, &src[n]); break; }
        fill(pool_ptr(p, &src[n]), len[n]);
        cr_assert_eq(tier_rw(t, IO_WRITE, pool_ptr(p, &src[n]), len[n], off[n]), (int64_t)len[n]);
        cr_assert_eq(off[n] / (8u << 20), (off[n] + len[n] - 1) / (8u << 20), "extent crosses a file");
    }
    cr_assert_gt(n, 10);
    cr_assert_eq(tier_sync(t, true), 0);
    pool_region_t back;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(pool_alloc(p, 2 - (uint64_t)(i % 2), len[i], &back), 0);
        memset(pool_ptr(p, &back), 0, len[i]);
        cr_assert_eq(tier_rw(t, IO_READ, pool_ptr(p, &back), len[i], off[i]), (int64_t)len[i]);
        cr_assert_eq(memcmp(pool_ptr(p, &back), pool_ptr(p, &src[i]), len[i]), 0, "extent %d differs", i);
        pool_free(p, &back);
    }
    tier_stats(t, &ts);
    cr_log_info("tier %s direct=%d: register=%d fixed_ops=%llu", ts.backend, tier_direct(t), reg,
                (unsigned long long)ts.io.fixed_ops);
    if (uring && reg == 0) {
        cr_assert(ts.io.registered);
        cr_assert_gt(ts.io.fixed_ops, 0, "registered buffers never used");
    }
    /* Misaligned or file-crossing requests are refused before any I/O. */
    char *pb = pool_ptr(p, &src[0]);
    cr_assert_eq(tier_rw(t, IO_READ, pb + 1, 4096, 0), -EINVAL);
    cr_assert_eq(tier_rw(t, IO_READ, pb, 4000, 0), -EINVAL);
    cr_assert_eq(tier_rw(t, IO_READ, pb, 4096, 100), -EINVAL);
    cr_assert_eq(tier_rw(t, IO_READ, pb, 8192, (8u << 20) - 4096), -EINVAL);
    cr_assert_eq(tier_rw(t, IO_READ, pb, 4096, 24u << 20), -EINVAL);
    /* Space: a full file's worth fits only while one file is empty. */
    for (int i = 0; i < n; i++) cr_assert_eq(tier_free(t, off[i]), 0);
    cr_assert_eq(tier_free(t, off[0]), -EINVAL, "double free accepted");
    uint64_t o[3];
    for (int i = 0; i < 3; i++) cr_assert_eq(tier_alloc(t, 8u << 20, &o[i]), 0);
    uint64_t x;
    cr_assert_eq(tier_alloc(t, 4096, &x), -ENOSPC);
    cr_assert_eq(tier_alloc(t, (8u << 20) + 4096, &x), -ENOSPC);
    tier_close(t);
    pool_close(p);
    remove_dir();
}

Test(tier, round_trip_io_uring) {
    char why[256];
    if (!uring_ok(why, sizeof why)) cr_skip_test("io_uring refused by this kernel/sandbox: %s", why);
    tier_round_trip(IO_BACKEND_URING, true);
}

Test(tier, round_trip_threads) { tier_round_trip(IO_BACKEND_THREADS, true); }

Test(tier, round_trip_buffered) { tier_round_trip(IO_BACKEND_AUTO, false); }

Test(tier, reopen_keeps_file_contents) {
    rng_state = 0xabcabcull;
    make_dir("/tmp");
    tier_config_t tc = { .dir = dir, .capacity = 8u << 20, .io = { .backend = IO_BACKEND_AUTO }, .direct = true };
    tier_t *t;
    char err[256];
    cr_assert_eq(tier_open(&t, &tc, err, sizeof err), 0, "%s", err);
    char *a = aligned_alloc(4096, 1 << 20), *b = aligned_alloc(4096, 1 << 20);
    fill(a, 1 << 20);
    cr_assert_eq(tier_reserve(t, 3u << 20, 1 << 20), 0);
    cr_assert_eq(tier_rw(t, IO_WRITE, a, 1 << 20, 3u << 20), 1 << 20);
    cr_assert_eq(tier_sync(t, true), 0);
    tier_close(t);
    cr_assert_eq(tier_open(&t, &tc, err, sizeof err), 0, "%s", err);
    cr_assert_eq(tier_reserve(t, 3u << 20, 1 << 20), 0);
    cr_assert_eq(tier_reserve(t, (3u << 20) + 4096, 4096), -EEXIST);
    memset(b, 0, 1 << 20); /* defined for valgrind, which cannot see io_uring's writes */
    cr_assert_eq(tier_rw(t, IO_READ, b, 1 << 20, 3u << 20), 1 << 20);
    cr_assert_eq(memcmp(a, b, 1 << 20), 0, "spill file contents lost across reopen");
    tier_close(t);
    free(a);
    free(b);
    remove_dir();
}

Test(tier, bad_config_is_refused_with_a_message) {
    tier_t *t;
    char err[256];
    tier_config_t tc = { .dir = "", .capacity = 1 << 20 };
    cr_assert_eq(tier_open(&t, &tc, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "--spill-dir") != NULL, "%s", err);
    tc.dir = "/tmp";
    tc.capacity = 0;
    cr_assert_eq(tier_open(&t, &tc, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "--spill-bytes") != NULL, "%s", err);
    tc.dir = "/proc/ballast-cannot-exist/x";
    tc.capacity = 1 << 20;
    cr_assert_lt(tier_open(&t, &tc, err, sizeof err), 0);
    cr_assert(strstr(err, "/proc/ballast-cannot-exist") != NULL, "%s", err);
}

/* A filesystem that refuses O_DIRECT (made here with a seccomp filter that
 * answers EINVAL to any open asking for it, as such filesystems do): the
 * tier runs buffered, says so, and still moves the bytes. */
Test(tier, falls_back_to_buffered_when_o_direct_is_refused) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EINVAL & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { .len = sizeof f / sizeof f[0], .filter = f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
        cr_skip_test("cannot install a seccomp filter here: %s", strerror(errno));
    cr_assert(!direct_ok("/tmp"), "the filter did not take");
    rng_state = 0xd1d1ull;
    make_dir("/tmp");
    tier_config_t tc = { .dir = dir, .capacity = 8u << 20, .file_bytes = 4u << 20,
                         .io = { .backend = IO_BACKEND_AUTO }, .direct = true };
    tier_t *t;
    char err[256];
    cr_assert_eq(tier_open(&t, &tc, err, sizeof err), 0, "%s", err);
    cr_assert(!tier_direct(t));
    tier_stats_t ts;
    tier_stats(t, &ts);
    cr_assert(!ts.direct);
    char *a = aligned_alloc(4096, 1 << 20), *b = aligned_alloc(4096, 1 << 20);
    fill(a, 1 << 20);
    memset(b, 0, 1 << 20);
    for (int i = 0; i < 2; i++) { /* one extent in each file */
        uint64_t off = (uint64_t)i * (4u << 20) + (1u << 20);
        cr_assert_eq(tier_rw(t, IO_WRITE, a, 1 << 20, off), 1 << 20);
        cr_assert_eq(tier_sync(t, true), 0);
        cr_assert_eq(tier_rw(t, IO_READ, b, 1 << 20, off), 1 << 20);
        cr_assert_eq(memcmp(a, b, 1 << 20), 0);
    }
    tier_close(t);
    free(a);
    free(b);
    remove_dir();
}

/* ---- durability of new spill files ---- */

/* fsync as seen by this program: while recording, the path of every fd
 * synced is kept, then the real call is made. */
static char fsynced[16][512];
static int nfsynced;
static atomic_bool recording;

int fsync(int fd) {
    if (atomic_load(&recording) && nfsynced < 16) {
        char l[64];
        snprintf(l, sizeof l, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(l, fsynced[nfsynced], sizeof fsynced[0] - 1);
        fsynced[nfsynced][n > 0 ? n : 0] = 0;
        nfsynced++;
    }
    return (int)syscall(SYS_fsync, fd);
}

static bool was_fsynced(const char *path) {
    for (int i = 0; i < nfsynced; i++)
        if (strcmp(fsynced[i], path) == 0) return true;
    return false;
}

/* Spill files made by tier_open, and the directory that holds their names,
 * are fsynced before tier_open returns (so before any blob in them can be
 * acknowledged durable); reopening complete files syncs nothing. */
Test(tier, new_spill_files_and_their_directory_are_fsynced) {
    make_dir("/tmp");
    char real[400];
    cr_assert_not_null(realpath(dir, real));
    uint64_t seed = th_seed(0x5eed7 ^ (uint64_t)getpid());
    uint32_t nf = 2 + (uint32_t)(th_xorshift64(&seed) % 3);
    tier_config_t tc = { .dir = dir, .capacity = (uint64_t)nf << 20, .file_bytes = 1u << 20,
                         .io = { .backend = IO_BACKEND_THREADS }, .direct = false };
    tier_t *t;
    char err[256];
    nfsynced = 0;
    atomic_store(&recording, true);
    int rc = tier_open(&t, &tc, err, sizeof err);
    atomic_store(&recording, false);
    cr_assert_eq(rc, 0, "%s", err);
    for (uint32_t i = 0; i < nf; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/spill-%04u.dat", real, i);
        cr_assert(was_fsynced(p), "new spill file %s was not fsynced (%d fsyncs seen)", p, nfsynced);
    }
    cr_assert(was_fsynced(real), "spill directory %s was not fsynced after creating its files", real);
    tier_close(t);
    nfsynced = 0;
    atomic_store(&recording, true);
    rc = tier_open(&t, &tc, err, sizeof err);
    atomic_store(&recording, false);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(nfsynced, 0, "reopening complete spill files synced %d files", nfsynced);
    tier_close(t);
    remove_dir();
}
