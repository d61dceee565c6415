/* test_session.c: sessions, the fd-socket handshake, leases and the client
 * library, against an in-process service (store without spill tier + session
 * manager + gRPC server on a Unix socket under /tmp). The fault and load
 * cases against the real binaries are in tests/integration/ballastd_*.sh. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

#include "log.h"
#include "offload.pb-c.h"
#include "rpc.h"
#include "shm.h"
#include "proto/offload_ring.h"
#include "services/offload/rpc_service.h"
#include "services/offload/session.h"
#include "services/offload/store.h"
#include "workers/offload/client.h"
#include "tests/unit/helpers.h"
#include "tests/unit/ballastd_fixture.h"

static void svc_start(svc_t *t, double lease, uint32_t max_sessions, uint64_t max_quota) {
    svc_start_with(t, "sess", lease, max_sessions, max_quota);
}

static oc_client_t *client(svc_t *t, const char *job, uint32_t rank, uint64_t quota, unsigned flags) {
    oc_options_t o = { 0 };
    o.addr = t->addr;
    o.job = job;
    o.rank = rank;
    o.quota_bytes = quota;
    o.flags = flags;
    o.timeout_s = 10;
    oc_client_t *c = NULL;
    cr_assert_eq(oc_open(&o, &c), STATUS_OK, "%s", oc_last_error());
    return c;
}

static void fill(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull | 1;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(th_xorshift64(&s) >> 24);
}

Test(session, names) {
    /* job names: the one rule of common/job_name.h (tested in full in test_job_name.c) */
    cr_assert(job_name_ok("llama-7b_run.3"));
    cr_assert(!job_name_ok(""));
    cr_assert(!job_name_ok("a b"));
    cr_assert(!job_name_ok("a/b"));
    char n64[65];
    memset(n64, 'x', 64); n64[64] = 0;
    cr_assert(!job_name_ok(n64));
    cr_assert(!sess_client_name_ok(n64));
    n64[63] = 0;
    cr_assert(job_name_ok(n64));
    cr_assert(sess_client_name_ok(n64));
    /* client names: printable ASCII */
    cr_assert(sess_client_name_ok("ballast store"));
    cr_assert(!sess_client_name_ok("tab\there"));
    cr_assert(!sess_client_name_ok(""));
    cr_assert(job_name_ok("job.1") && !job_name_ok("job 1") && !job_name_ok(NULL));
}

Test(session, ring_layout) {
    cr_assert_eq(sizeof(rp_req_t), 64);
    cr_assert_eq(sizeof(rp_cpl_t), 64);
    cr_assert_eq(ring_proto_comp_offset(1), 4096);
    cr_assert_eq(ring_proto_comp_offset(4096), 4096);
    cr_assert_str_eq(rp_op_name(RP_OP_GET_DONE), "GET_DONE");
    cr_assert_str_eq(rp_op_name(200), "UNKNOWN_OP");
}

/* shared and remote mode through the same API, random sizes and bytes */
Test(session, round_trip_both_modes) {
    svc_t t;
    svc_start(&t, 30, 16, 0);
    for (int remote = 0; remote < 2; remote++) {
        oc_client_t *c = client(&t, "unit", 3, 0, remote ? OC_REMOTE : 0);
        cr_assert_eq(oc_is_shared(c), !remote);
        srand(42 + remote);
        for (int i = 0; i < 20; i++) {
            size_t n = 1 + (size_t)rand() % (300 << 10);
            uint8_t *src = malloc(n), *dst = malloc(n);
            fill(src, n, (uint64_t)i + 1);
            oc_key_t k = { 3, 1 + (uint32_t)(i % 4), (uint64_t)i, 7 };
            cr_assert_eq(oc_put_copy(c, &k, src, n, false), STATUS_OK, "%s", oc_last_error());
            uint64_t len = 0;
            cr_assert_eq(oc_get_copy(c, &k, dst, n, &len), STATUS_OK, "%s", oc_last_error());
            cr_assert_eq(len, n);
            cr_assert_eq(memcmp(src, dst, n), 0, "blob %d (%zu bytes) differs", i, n);
            /* No spill tier here: a non-persistent blob never reaches NVMe, so
             * its crc32c is never computed and must be reported unknown (ring
             * completion flag / GetResponse field), not as a magic value. */
            oc_buf_t gb;
            cr_assert_eq(oc_get(c, &k, &gb), STATUS_OK, "%s", oc_last_error());
            cr_assert(!gb.crc_known && gb.crc32c == 0, "blob %d: crc reported as known (%08x)", i, gb.crc32c);
            cr_assert(!gb.persistent);
            cr_assert_eq(oc_get_done(c, &k, &gb), STATUS_OK, "%s", oc_last_error());
            cr_assert_eq(oc_put_copy(c, &k, src, n, false), STATUS_ALREADY_EXISTS);
            cr_assert_eq(oc_free(c, &k), STATUS_OK, "%s", oc_last_error());
            cr_assert_eq(oc_get_copy(c, &k, dst, n, &len), STATUS_NOT_FOUND);
            free(src); free(dst);
        }
        oc_key_t bad = { 0, 9, 0, 0 };
        cr_assert_eq(oc_put_copy(c, &bad, "x", 1, false), STATUS_INVALID_ARGUMENT);
        cr_assert_eq(oc_close(c, false), STATUS_OK, "%s", oc_last_error());
    }
    store_stats_t st;
    store_stats(t.store, &st);
    cr_assert_eq(st.pool.used_bytes, 0);
    svc_stop(&t);
}

/* async handles: several GETs in flight, each completed with its own region */
Test(session, async_handles) {
    svc_t t;
    svc_start(&t, 30, 16, 0);
    oc_client_t *c = client(&t, "unit", 0, 0, 0);
    enum { N = 12 };
    oc_key_t k[N];
    for (int i = 0; i < N; i++) {
        k[i] = (oc_key_t){ 0, OC_KIND_PARAM, (uint64_t)i, 0 };
        uint8_t buf[5000];
        fill(buf, sizeof buf, (uint64_t)i + 100);
        cr_assert_eq(oc_put_copy(c, &k[i], buf, sizeof buf - (size_t)i, false), STATUS_OK, "%s", oc_last_error());
    }
    oc_handle_t h[N];
    for (int i = 0; i < N; i++) cr_assert_eq(oc_get_async(c, &k[i], &h[i]), STATUS_OK, "%s", oc_last_error());
    for (int i = N - 1; i >= 0; i--) { /* wait out of order */
        oc_buf_t b;
        cr_assert_eq(oc_wait(c, h[i], &b, 10), STATUS_OK, "%s", oc_last_error());
        uint8_t want[5000];
        fill(want, sizeof want, (uint64_t)i + 100);
        cr_assert_eq(b.len, 5000u - (unsigned)i);
        cr_assert_eq(memcmp(b.ptr, want, b.len), 0);
        cr_assert_eq(oc_get_done(c, &k[i], &b), STATUS_OK, "%s", oc_last_error());
    }
    oc_buf_t b;
    cr_assert_eq(oc_wait(c, h[0], &b, 1), STATUS_INVALID_ARGUMENT, "a handle completes once");
    oc_close(c, false);
    svc_stop(&t);
}

/* Remote mode runs an async op at submit time and parks its result: a
 * failure's message travels with the handle, so oc_wait() on any thread, in
 * any order, reports that op's own message. */
typedef struct { oc_client_t *c; oc_handle_t h; status_t st; char msg[1024]; } waiter_t;

static void *wait_elsewhere(void *arg) {
    waiter_t *w = arg;
    oc_buf_t b;
    w->st = oc_wait(w->c, w->h, &b, 10);
    snprintf(w->msg, sizeof w->msg, "%s", oc_last_error());
    return NULL;
}

Test(session, remote_async_failure_message_follows_the_handle) {
    svc_t t;
    svc_start(&t, 30, 16, 0);
    oc_client_t *c = client(&t, "unit", 0, 0, OC_REMOTE);
    oc_key_t k1 = { 0, OC_KIND_PARAM, 41, 0 }, k2 = { 0, OC_KIND_PARAM, 42, 0 };
    oc_handle_t h1, h2;
    cr_assert_eq(oc_get_async(c, &k1, &h1), STATUS_OK, "%s", oc_last_error());
    cr_assert_eq(oc_get_async(c, &k2, &h2), STATUS_OK, "%s", oc_last_error());
    waiter_t w = { c, h1, STATUS_OK, "" };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, wait_elsewhere, &w), 0);
    pthread_join(th, NULL);
    cr_assert_eq(w.st, STATUS_NOT_FOUND, "%s", w.msg);
    cr_assert(strstr(w.msg, "index 41") && strstr(w.msg, "not_found"), "the waiting thread sees h1's message: %s",
              w.msg);
    oc_buf_t b;
    cr_assert_eq(oc_wait(c, h2, &b, 10), STATUS_NOT_FOUND);
    cr_assert(strstr(oc_last_error(), "index 42"), "h2's own message, not h1's: %s", oc_last_error());
    oc_close(c, false);
    svc_stop(&t);
}

/* oc_wait with timeout 0 is a poll: it never blocks, and it takes a
 * completion that has arrived (nobody else has to reap the ring for it) */
Test(session, wait_timeout_zero_polls) {
    svc_t t;
    svc_start(&t, 30, 16, 0);
    oc_client_t *c = client(&t, "unit", 0, 0, 0);
    oc_key_t k = { 0, OC_KIND_ACTIVATION, 7, 1 };
    uint8_t buf[3000], want[3000];
    fill(want, sizeof want, 77);
    cr_assert_eq(oc_put_copy(c, &k, want, sizeof want, false), STATUS_OK, "%s", oc_last_error());
    oc_handle_t h;
    cr_assert_eq(oc_get_async(c, &k, &h), STATUS_OK, "%s", oc_last_error());
    oc_buf_t b;
    status_t st = STATUS_DEADLINE_EXCEEDED;
    int polls = 0;
    struct timespec nap = { 0, 1000000 };
    double t0 = clock_now_s();
    for (; polls < 2000 && st == STATUS_DEADLINE_EXCEEDED; polls++) {
        double a = clock_now_s();
        st = oc_wait(c, h, &b, 0);
        double took = clock_now_s() - a;
        cr_assert_lt(took, 0.05, "a poll blocked %.3f s", took);
        if (st == STATUS_DEADLINE_EXCEEDED) nanosleep(&nap, NULL);
    }
    cr_assert_eq(st, STATUS_OK, "no completion seen by %d polls over %.1f s: %s", polls, clock_now_s() - t0,
                 oc_last_error());
    cr_assert_eq(b.len, sizeof want);
    memcpy(buf, b.ptr, sizeof buf);
    cr_assert_eq(memcmp(buf, want, sizeof want), 0);
    cr_assert_eq(oc_get_done(c, &k, &b), STATUS_OK, "%s", oc_last_error());
    cr_assert_eq(oc_wait(c, h, &b, 0), STATUS_INVALID_ARGUMENT, "a polled handle completes once");
    oc_close(c, false);
    svc_stop(&t);
}

/* a client that vanishes loses its memory when the lease ends; another stays */
Test(session, lease_expiry_frees_memory) {
    svc_t t;
    /* valgrind runs ~50x slower: a 0.3 s lease would expire during OpenSession */
    double lease = getenv("BALLAST_VALGRIND") ? 5.0 : 0.3;
    svc_start(&t, lease, 16, 0);
    oc_client_t *dead = client(&t, "unit", 0, 0, 0), *alive = client(&t, "unit", 1, 0, 0);
    uint8_t buf[100000];
    fill(buf, sizeof buf, 5);
    oc_key_t k1 = { 0, 1, 1, 0 }, k2 = { 1, 1, 2, 0 };
    cr_assert_eq(oc_put_copy(dead, &k1, buf, sizeof buf, false), STATUS_OK, "%s", oc_last_error());
    cr_assert_eq(oc_put_copy(alive, &k2, buf, sizeof buf, false), STATUS_OK, "%s", oc_last_error());
    store_stats_t st;
    store_stats(t.store, &st);
    cr_assert_eq(st.pool.used_bytes, 2 * 102400);
    oc_abandon(dead);
    double wait = 4 * lease; /* the reaper checks every lease/4 (20..250 ms) */
    struct timespec ts = { (time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9) };
    nanosleep(&ts, NULL);
    store_stats(t.store, &st);
    cr_assert_eq(st.pool.used_bytes, 102400, "the dead session's blob is freed, the live one kept");
    sess_counters_t sc;
    sess_counters(t.sm, &sc);
    cr_assert_eq(sc.expired, 1);
    uint64_t len;
    uint8_t out[100000];
    cr_assert_eq(oc_get_copy(alive, &k2, out, sizeof out, &len), STATUS_OK, "%s", oc_last_error());
    cr_assert_eq(memcmp(out, buf, sizeof buf), 0);
    oc_close(alive, false);
    svc_stop(&t);
}

/* the fd socket refuses bad attach messages and keeps serving */
Test(session, attach_refusals) {
    svc_t t;
    svc_start(&t, 30, 16, 0);
    char err[256];
    sess_open_info_t info;
    cr_assert_eq(sess_open(t.sm, "unit", 0, 0, NULL, true, "t", &info, err, sizeof err), 0, "%s", err);
    struct { uint64_t sid, nonce; uint32_t want; } cases[] = {
        { info.sid, info.nonce ^ 1, STATUS_PERMISSION_DENIED },
        { info.sid ^ 1, info.nonce, STATUS_NOT_FOUND },
    };
    for (size_t i = 0; i < 2; i++) {
        int fd;
        cr_assert_eq(shm_connect(t.fdsock, &fd, err, sizeof err), 0, "%s", err);
        rp_attach_t a = { RP_ATTACH_MAGIC, cases[i].sid, cases[i].nonce, RING_PROTO_VERSION, 0 };
        cr_assert_eq(shm_send_fds(fd, &a, sizeof a, NULL, 0, err, sizeof err), 0, "%s", err);
        rp_attach_reply_t r;
        size_t len;
        cr_assert_eq(shm_recv_fds(fd, &r, sizeof r, &len, NULL, 0, 5000, err, sizeof err), 0, "%s", err);
        cr_assert_eq(r.status, cases[i].want, "case %zu: status %u (%s)", i, r.status, r.msg);
        close(fd);
    }
    /* a malformed message */
    int fd;
    cr_assert_eq(shm_connect(t.fdsock, &fd, err, sizeof err), 0, "%s", err);
    char junk[7] = "garbage";
    cr_assert_eq(shm_send_fds(fd, junk, sizeof junk, NULL, 0, err, sizeof err), 0, "%s", err);
    rp_attach_reply_t r;
    size_t len;
    cr_assert_eq(shm_recv_fds(fd, &r, sizeof r, &len, NULL, 0, 5000, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.status, STATUS_INVALID_ARGUMENT);
    close(fd);
    /* the session can still attach normally through the library */
    oc_client_t *c = client(&t, "unit", 0, 0, 0);
    cr_assert(oc_is_shared(c));
    cr_assert_eq(oc_nop(c), STATUS_OK, "%s", oc_last_error());
    oc_close(c, false);
    uint64_t freed;
    cr_assert_eq(sess_close(t.sm, info.sid, false, &freed, err, sizeof err), 0, "%s", err);
    svc_stop(&t);
}

/* limits: session count, quota ceiling, token */
Test(session, limits) {
    svc_t t;
    svc_start(&t, 30, 2, 1 << 20);
    char err[256];
    sess_open_info_t a, b, c;
    cr_assert_eq(sess_open(t.sm, "unit", 0, 0, NULL, false, NULL, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(a.quota, 0u, "no --default-quota: 0 (the ceiling applies to requests)");
    cr_assert_eq(sess_open(t.sm, "unit", 0, (1 << 20) + 1, NULL, false, NULL, &b, err, sizeof err),
                 STATUS_RESOURCE_EXHAUSTED);
    cr_assert(strstr(err, "quota") != NULL, "%s", err);
    cr_assert_eq(sess_open(t.sm, "unit", 1, 1 << 20, NULL, false, NULL, &b, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sess_open(t.sm, "unit", 2, 0, NULL, false, NULL, &c, err, sizeof err), STATUS_RESOURCE_EXHAUSTED);
    cr_assert(strstr(err, "too many sessions") != NULL, "%s", err);
    cr_assert_eq(sess_open(t.sm, "bad name", 2, 0, NULL, false, NULL, &c, err, sizeof err), STATUS_INVALID_ARGUMENT);
    cr_assert(sess_token_ok(t.sm, "anything"), "no token configured");
    double lease;
    cr_assert_eq(sess_heartbeat(t.sm, a.sid, NULL, &lease, NULL, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_float_eq(lease, 30.0, 1e-9);
    cr_assert_eq(sess_heartbeat(t.sm, 12345, NULL, NULL, NULL, NULL, err, sizeof err), STATUS_NOT_FOUND);
    /* with a caller: only the owner renews, and another caller hears what an
     * unknown id gets */
    sess_caller_t me = { true, (uint32_t)geteuid() }, other = { true, (uint32_t)geteuid() + 1 }, remote = { false, 0 };
    cr_assert_eq(sess_heartbeat(t.sm, a.sid, &me, &lease, NULL, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sess_heartbeat(t.sm, a.sid, &other, &lease, NULL, NULL, err, sizeof err), STATUS_NOT_FOUND);
    cr_assert(strstr(err, "of this caller") != NULL, "%s", err);
    cr_assert_eq(sess_heartbeat(t.sm, a.sid, &remote, &lease, NULL, NULL, err, sizeof err), STATUS_NOT_FOUND);
    char err2[256];
    cr_assert_eq(sess_heartbeat(t.sm, 12345, &me, NULL, NULL, NULL, err2, sizeof err2), STATUS_NOT_FOUND);
    cr_assert(strstr(err2, "of this caller") != NULL, "%s", err2);
    svc_stop(&t);
}

/* a service that is not running: a clear message naming the address */
Test(session, service_gone) {
    oc_options_t o = { 0 };
    o.addr = "unix:/tmp/ballast-no-such-dir/none.sock";
    o.job = "unit";
    o.timeout_s = 2;
    oc_client_t *c = NULL;
    status_t st = oc_open(&o, &c);
    cr_assert_eq(st, STATUS_UNAVAILABLE, "%s", oc_last_error());
    cr_assert(strstr(oc_last_error(), "/tmp/ballast-no-such-dir/none.sock") != NULL, "%s", oc_last_error());
    cr_assert(strstr(oc_last_error(), "start it") != NULL, "%s", oc_last_error());
}

/* one client handle shared by several threads (the library serialises the
 * ring and files completions by request id) */
typedef struct { oc_client_t *c; int id; int bad; } thr_arg_t;

static void *thr_main(void *p) {
    thr_arg_t *a = p;
    uint8_t buf[20000], out[20000];
    for (int i = 0; i < 60; i++) {
        size_t n = 1 + (size_t)((a->id * 7919 + i * 104729) % (int)sizeof buf);
        fill(buf, n, (uint64_t)(a->id * 1000 + i));
        oc_key_t k = { (uint32_t)a->id, OC_KIND_OTHER, (uint64_t)i, 0 };
        uint64_t len = 0;
        if (oc_put_copy(a->c, &k, buf, n, false) || oc_get_copy(a->c, &k, out, sizeof out, &len) ||
            len != n || memcmp(buf, out, n) || oc_free(a->c, &k))
            a->bad++;
    }
    return NULL;
}

Test(session, shared_handle_threads) {
    svc_t t;
    svc_start(&t, 30, 16, 0);
    oc_client_t *c = client(&t, "unit", 0, 0, 0);
    pthread_t th[4];
    thr_arg_t a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (thr_arg_t){ c, i, 0 };
        cr_assert_eq(pthread_create(&th[i], NULL, thr_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(a[i].bad, 0, "thread %d saw %d failures (%s)", i, a[i].bad, oc_last_error());
    }
    store_stats_t st;
    store_stats(t.store, &st);
    cr_assert_eq(st.blobs, 0);
    oc_close(c, false);
    svc_stop(&t);
}

/* One Stats call (the caller frees the answer). */
static Ballast__Offload__V1__StatsResponse *stats_call(rpc_client_t *rc) {
    Ballast__Offload__V1__StatsRequest req = BALLAST__OFFLOAD__V1__STATS_REQUEST__INIT;
    Ballast__Offload__V1__StatsResponse *r = NULL;
    char msg[512];
    cr_assert_eq(rpc_call(rc, OFFLOAD_SVC "Stats", (ProtobufCMessage *)&req,
                          &ballast__offload__v1__stats_response__descriptor, (ProtobufCMessage **)&r, 5000, false,
                          msg, sizeof msg), GRPC_STATUS_OK, "%s", msg);
    return r;
}

/* Stats reports the service's own heap: jemalloc serves this process's
 * malloc (the test programs link it as ballastd does), and the figures are
 * fresh: a big block allocated between two calls shows in the second. */
Test(session, stats_report_the_service_heap) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    cr_skip_test("sanitizer build: jemalloc is left out, the sanitizer owns malloc");
#endif
    svc_t t;
    svc_start(&t, 30, 8, 0);
    char err[RPC_ERR_LEN];
    rpc_client_t *rc = rpc_client_open(t.addr, NULL, err, sizeof err);
    cr_assert_not_null(rc, "%s", err);
    Ballast__Offload__V1__StatsResponse *a = stats_call(rc);
    cr_assert_not_null(a->allocator, "no allocator in StatsResponse");
    cr_assert(a->allocator->is_malloc, "jemalloc does not serve malloc: %s", a->allocator->why_not);
    cr_assert(strncmp(a->allocator->name, "jemalloc 5.", 11) == 0, "name '%s'", a->allocator->name);
    cr_assert_str_empty(a->allocator->why_not);
    cr_assert_gt(a->allocator->allocated_bytes, 0);
    cr_assert_geq(a->allocator->active_bytes, a->allocator->allocated_bytes);
    cr_assert_geq(a->allocator->resident_bytes, a->allocator->active_bytes);
    cr_assert_geq(a->allocator->mapped_bytes, a->allocator->active_bytes);
    cr_assert_gt(a->allocator->metadata_bytes, 0);
    const size_t big = 48u << 20;
    char *volatile p = malloc(big);
    cr_assert_not_null(p);
    p[0] = 1;
    Ballast__Offload__V1__StatsResponse *b = stats_call(rc);
    /* less 4 MiB for what the gRPC threads allocated around the first call
     * and freed since (kilobytes in practice) */
    cr_assert_geq(b->allocator->allocated_bytes, a->allocator->allocated_bytes + big - (4u << 20), "%llu -> %llu",
                  (unsigned long long)a->allocator->allocated_bytes, (unsigned long long)b->allocator->allocated_bytes);
    free(p);
    protobuf_c_message_free_unpacked((ProtobufCMessage *)a, NULL);
    protobuf_c_message_free_unpacked((ProtobufCMessage *)b, NULL);
    rpc_client_close(rc);
    svc_stop(&t);
}

/* A job's segments are made as it grows, after the attach: the client
 * fetches and maps each one the first time a completion names it, and the
 * hook sees each once. Another job gets segments of its own; when a job's
 * last session ends its empty segments go back to the pool. */
static _Atomic int g_hook_calls;
static void count_hook(void *arg, const oc_segment_t *seg) {
    (void)arg;
    cr_assert(seg->base && seg->bytes > 0);
    g_hook_calls++;
}

Test(session, segments_grow_after_attach_per_job) {
    svc_t t;
    svc_start(&t, 30, 16, 0);
    oc_client_t *c = client(&t, "grow", 0, 0, 0);
    uint32_t n0 = 99;
    oc_segments(c, &n0);
    cr_assert_eq(n0, 0, "a job that stored nothing has %u segments", n0);
    oc_set_segment_hook(c, count_hook, NULL);
    enum { N = 10 };
    size_t len[N];
    for (int i = 0; i < N; i++) {
        len[i] = (600u << 10) + (size_t)rand() % 4000; /* two do not fit one 1 MiB segment */
        uint8_t *b = malloc(len[i]);
        fill(b, len[i], (uint64_t)i + 500);
        oc_key_t k = { 0, OC_KIND_OTHER, (uint64_t)i, 1 };
        cr_assert_eq(oc_put_copy(c, &k, b, len[i], false), STATUS_OK, "%s", oc_last_error());
        free(b);
    }
    uint32_t n = 0;
    oc_segments(c, &n);
    cr_assert_geq(n, N, "%d blobs of 600 KiB in %u segments", N, n);
    cr_assert_eq(g_hook_calls, (int)n, "the hook saw %d of %u segments", (int)g_hook_calls, n);
    oc_client_t *o = client(&t, "other-job", 0, 0, 0);
    uint8_t small[5000];
    fill(small, sizeof small, 77);
    oc_key_t ko = { 0, OC_KIND_OTHER, 0, 1 };
    cr_assert_eq(oc_put_copy(o, &ko, small, sizeof small, false), STATUS_OK, "%s", oc_last_error());
    uint32_t no = 0;
    oc_segments(o, &no);
    cr_assert_eq(no, 1, "the other job maps %u segments (its own one expected)", no);
    for (int i = 0; i < N; i++) {
        uint8_t *b = malloc(len[i]), *w = malloc(len[i]);
        fill(w, len[i], (uint64_t)i + 500);
        uint64_t got = 0;
        oc_key_t k = { 0, OC_KIND_OTHER, (uint64_t)i, 1 };
        cr_assert_eq(oc_get_copy(c, &k, b, len[i], &got), STATUS_OK, "%s", oc_last_error());
        cr_assert(got == len[i] && memcmp(b, w, len[i]) == 0, "blob %d differs", i);
        free(b); free(w);
    }
    store_stats_t st;
    store_stats(t.store, &st);
    cr_assert_eq(st.pool.nsegs, n + no);
    cr_assert_eq(oc_close(c, false), STATUS_OK, "%s", oc_last_error());
    store_stats(t.store, &st);
    cr_assert_eq(st.pool.nsegs, no, "the closed job's empty segments were not given back (%u left)", st.pool.nsegs);
    cr_assert_eq(oc_close(o, false), STATUS_OK, "%s", oc_last_error());
    svc_stop(&t);
}
