/* test_comm_nccl_wait.c: how the NCCL backend (workers/comm/nccl.c) waits,
 * without a GPU. BALLAST_NCCL_LIB and BALLAST_CUDART_LIB point it at
 * $(BUILD)/tests/lib/nccl_fake.so (tests/unit/nccl_fake.c), whose events
 * finish after a set number of queries or never, and whose
 * ncclCommGetAsyncError reports an error when told to.
 *
 * - A peer's failure (ncclRemoteError) ends comm_wait with -EPIPE, a
 *   message naming the group, the peer's global rank and what to do; the
 *   communicator is aborted once, never destroyed, and every later call on
 *   it fails with the same message.
 * - A collective that never finishes ends with -ETIMEDOUT once the
 *   communicator's timeout (comm_config_t.timeout_s) has passed, not much
 *   later, and aborts the communicator.
 * - A collective that finishes is waited for without blocking in
 *   cudaEventSynchronize; the communicator is destroyed, not aborted.
 * - BALLAST_NCCL_LIB may name the directory holding libnccl.so.2; a wrong
 *   one is an error naming it, with no fall-back to another libnccl.
 *
 * Each Criterion test runs in a process of its own, so each loads the
 * library afresh with its own settings. Group "dp.fake" is index 0 of two
 * (global ranks 3 and 5); index 0 only publishes the unique id, so one
 * process with an in-process rendezvous store suffices. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "services/rendezvous/rdzv.h"
#include "workers/comm/comm.h"

/* the fake's control block and counters (tests/unit/nccl_fake.c) */
typedef struct {
    int ready_after, async_code, async_after;
} nccl_fake_cfg_t;
typedef struct {
    int inits, destroys, aborts, collectives;
    int async_queries, event_queries, event_syncs;
} nccl_fake_counts_t;

static char fake_path[PATH_MAX];
static void *fake;
static rdzv_server_t *srv;
static rdzv_client_t *cl;
static char sock[128];

/* Load the fake (the backend's dlopen of the same path gets this handle)
 * with the given behaviour, and point the backend at it. */
static void use_fake(int ready_after, int async_code, int async_after) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert_gt(n, 0);
    exe[n] = 0;
    *strrchr(exe, '/') = 0;   /* $(BUILD)/tests/unit */
    snprintf(fake_path, sizeof fake_path, "%s/../lib/nccl_fake.so", exe);
    fake = dlopen(fake_path, RTLD_NOW | RTLD_GLOBAL);
    cr_assert_not_null(fake, "%s (built by tests/module.mk): %s", fake_path, dlerror());
    void (*set)(const nccl_fake_cfg_t *) = (void (*)(const nccl_fake_cfg_t *))dlsym(fake, "nccl_fake_set");
    cr_assert_not_null(set);
    nccl_fake_cfg_t c = { ready_after, async_code, async_after };
    set(&c);
    setenv("BALLAST_NCCL_LIB", fake_path, 1);
    setenv("BALLAST_CUDART_LIB", fake_path, 1);
}

static nccl_fake_counts_t counts(void) {
    nccl_fake_counts_t c;
    void (*get)(nccl_fake_counts_t *) = (void (*)(nccl_fake_counts_t *))dlsym(fake, "nccl_fake_counts");
    cr_assert_not_null(get);
    get(&c);
    return c;
}

/* Index 0 of "dp.fake" (global ranks 3 and 5) on the NCCL backend. */
static comm_t *open_comm(double timeout_s) {
    char err[COMM_ERR_LEN];
    snprintf(sock, sizeof sock, "unix:/tmp/ballast-test-ncclw-%d.sock", (int)getpid());
    rdzv_server_opts_t so = { .listen = sock, .job_id = "t", .world = 2 };
    srv = rdzv_server_start(&so, NULL, err, sizeof err);
    cr_assert_not_null(srv, "%s", err);
    cl = rdzv_client_open(sock, "t", 2, err, sizeof err);
    cr_assert_not_null(cl, "%s", err);
    static const int ranks[2] = { 3, 5 };
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.kind = COMM_NCCL;
    cfg.name = "dp.fake";
    cfg.n = 2;
    cfg.index = 0;
    cfg.ranks = ranks;
    cfg.rdzv = cl;
    cfg.timeout_s = timeout_s;
    comm_t *c = NULL;
    cr_assert_eq(comm_init(&c, &cfg, err, sizeof err), 0, "comm_init: %s", err);
    return c;
}

static void close_all(comm_t *c) {
    comm_destroy(c);
    rdzv_client_close(cl);
    rdzv_server_stop(srv);
    unlink(sock + 5);
}

/* Start one all-reduce and wait for it: its status, message in err,
 * seconds the wait took in *secs. */
static int reduce_and_wait(comm_t *c, char *err, size_t errlen, double *secs) {
    float buf[4] = { 1, 2, 3, 4 };
    comm_req_t *r = NULL;
    int rc = comm_all_reduce(c, buf, buf, 4, COMM_F32, COMM_SUM, &r, err, errlen);
    cr_assert_eq(rc, 0, "comm_all_reduce: %s", err);
    double t0 = clock_now_s();
    rc = comm_wait(r, err, errlen);
    *secs = clock_now_s() - t0;
    return rc;
}

Test(comm_nccl_wait, peer_failure_aborts_and_names_the_peer) {
    use_fake(-1, 6 /* ncclRemoteError */, 3);
    comm_t *c = open_comm(60);
    char err[COMM_ERR_LEN] = "";
    double secs;
    int rc = reduce_and_wait(c, err, sizeof err, &secs);
    cr_expect_eq(rc, -EPIPE, "status %d: %s", rc, err);
    cr_expect_lt(secs, 5.0, "the error took %.2f s to surface", secs);
    cr_expect(strstr(err, "comm dp.fake") != NULL, "names the group: %s", err);
    cr_expect(strstr(err, "rank 5 of this group failed") != NULL, "names the peer: %s", err);
    cr_expect(strstr(err, "remote process exited") != NULL, "passes NCCL's reason on: %s", err);
    cr_expect(strstr(err, "NCCL_DEBUG=WARN") != NULL && strstr(err, "--resume") != NULL, "says what to do: %s", err);
    nccl_fake_counts_t n = counts();
    cr_expect_eq(n.aborts, 1);
    cr_expect_eq(n.event_syncs, 0, "comm_wait blocked in cudaEventSynchronize");
    /* a failed communicator fails every later call with the same message */
    char again[COMM_ERR_LEN] = "";
    float buf[4] = { 0 };
    comm_req_t *r = NULL;
    cr_expect_eq(comm_all_gather(c, buf, buf, 2, COMM_F32, &r, again, sizeof again), -EPIPE);
    cr_expect_null(r);
    cr_expect_str_eq(again, err);
    close_all(c);
    n = counts();
    cr_expect_eq(n.aborts, 1, "aborted %d times", n.aborts);
    cr_expect_eq(n.destroys, 0, "an aborted communicator was destroyed too");
}

Test(comm_nccl_wait, timeout_aborts_after_the_communicators_timeout) {
    use_fake(-1, 0, 0);   /* the collective never finishes, NCCL reports nothing */
    comm_t *c = open_comm(0.3);
    char err[COMM_ERR_LEN] = "";
    double secs;
    int rc = reduce_and_wait(c, err, sizeof err, &secs);
    cr_expect_eq(rc, -ETIMEDOUT, "status %d: %s", rc, err);
    cr_expect_geq(secs, 0.3, "gave up after %.3f s, before the 0.3 s timeout", secs);
    cr_expect_lt(secs, 3.0, "gave up after %.3f s, long after the 0.3 s timeout", secs);
    cr_expect(strstr(err, "comm dp.fake (index 0 of 2): all_reduce not done after 0.3 s") != NULL, "%s", err);
    cr_expect(strstr(err, "rank 5 of this group is dead, stuck") != NULL, "names the peer: %s", err);
    nccl_fake_counts_t n = counts();
    cr_expect_eq(n.aborts, 1);
    cr_expect_gt(n.async_queries, 0, "never asked NCCL for an asynchronous error");
    cr_expect_eq(n.event_syncs, 0);
    close_all(c);
    cr_expect_eq(counts().destroys, 0);
}

Test(comm_nccl_wait, finished_collective_is_waited_for_and_destroyed) {
    use_fake(5, 0, 0);
    comm_t *c = open_comm(60);
    char err[COMM_ERR_LEN] = "";
    double secs;
    for (int i = 0; i < 3; i++) cr_expect_eq(reduce_and_wait(c, err, sizeof err, &secs), 0, "%s", err);
    nccl_fake_counts_t n = counts();
    cr_expect_eq(n.collectives, 3);
    cr_expect_geq(n.event_queries, 3 * 6, "the event was done after 5 queries, %d made", n.event_queries);
    cr_expect_eq(n.event_syncs, 0);
    close_all(c);
    n = counts();
    cr_expect_eq(n.aborts, 0);
    cr_expect_eq(n.destroys, 1);
}

Test(comm_nccl_wait, nccl_lib_may_name_a_directory) {
    use_fake(0, 0, 0);
    /* a directory holding libnccl.so.2 (a link to the fake) */
    char dir[] = "/tmp/ballast-test-ncclw-XXXXXX", link_path[PATH_MAX];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(link_path, sizeof link_path, "%s/libnccl.so.2", dir);
    cr_assert_eq(symlink(fake_path, link_path), 0);
    setenv("BALLAST_NCCL_LIB", dir, 1);
    char err[COMM_ERR_LEN] = "";
    cr_expect(comm_nccl_available(err, sizeof err), "%s", err);
    unlink(link_path);
    rmdir(dir);
}

Test(comm_nccl_wait, wrong_nccl_lib_is_named_without_fall_back) {
    setenv("BALLAST_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    char err[COMM_ERR_LEN] = "";
    cr_expect(!comm_nccl_available(err, sizeof err));
    cr_expect(strstr(err, "BALLAST_NCCL_LIB=/nonexistent/libnccl.so.2") != NULL, "%s", err);
    cr_expect(strstr(err, "point BALLAST_NCCL_LIB at libnccl.so.2") != NULL, "%s", err);
}
