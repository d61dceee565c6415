/* test_rpc.c: the gRPC layer (common/rpc.c) end to end over real sockets:
 * health over Unix and TCP, concurrency, bad requests, size limits,
 * deadlines, unreachable servers, stop with calls in flight, and 100
 * start/stop cycles that must not leak fds or threads (LeakSanitizer and
 * valgrind check memory via `make asan` / `make valgrind`). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "rpc.h"
#include "tests/rpc_echo.h"
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define HAVE_MEMCHECK 1
#endif
#include "grpc/health/v1/health.pb-c.h"

/* ---- helpers ---- */

static void unix_addr(char *buf, size_t len, const char *tag) {
    snprintf(buf, len, "unix:/tmp/ballast-test-rpc-%d-%s-%08x.sock", (int)getpid(), tag,
             (unsigned)(clock_now_ms() * 1000.0));
}

static int count_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* A TCP port on 127.0.0.1 with nothing listening (bound then closed). */
static int dead_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

static rpc_server_t *start_echo(const char *addr, int threads, size_t max_msg, int *port) {
    char err[256];
    rpc_server_opts_t o = {.threads = threads, .max_msg_bytes = max_msg};
    rpc_server_t *s = rpc_server_new(&o, err, sizeof err);
    cr_assert(s, "%s", err);
    cr_assert_eq(rpc_server_add_method(s, &echo_method, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_listen(s, addr, port, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_start(s, err, sizeof err), 0, "%s", err);
    return s;
}

static rpc_client_t *open_client(const char *addr) {
    char err[256];
    rpc_client_t *c = rpc_client_open(addr, NULL, err, sizeof err);
    cr_assert(c, "%s", err);
    return c;
}

/* One echo call with payload p[0..n); checks the answer byte for byte.
 * Returns the status (asserting the content only on OK). */
static grpc_status_code echo_once(rpc_client_t *c, const uint8_t *p, size_t n, int64_t seq,
                                  uint32_t sleep_ms, int64_t deadline_ms, char *msg, size_t ml) {
    Ballast__Test__V1__EchoRequest req = BALLAST__TEST__V1__ECHO_REQUEST__INIT;
    req.payload.data = (uint8_t *)p;
    req.payload.len = n;
    req.seq = seq;
    req.sleep_ms = sleep_ms;
    ProtobufCMessage *r = NULL;
    grpc_status_code st = rpc_call(c, ECHO_PATH, &req.base,
                                   &ballast__test__v1__echo_response__descriptor, &r, deadline_ms,
                                   false, msg, ml);
    if (st != GRPC_STATUS_OK) {
        cr_assert_null(r);
        return st;
    }
    Ballast__Test__V1__EchoResponse *resp = (void *)r;
    cr_assert_eq(resp->seq, seq);
    cr_assert_eq(resp->payload.len, n, "payload length %zu != %zu", resp->payload.len, n);
    cr_assert(n == 0 || memcmp(resp->payload.data, p, n) == 0, "payload differs");
    cr_assert_eq(resp->crc, crc32_ieee(p, n));
    protobuf_c_message_free_unpacked(r, NULL);
    return st;
}

static void echo_ok(rpc_client_t *c, uint64_t *seed) {
    uint8_t buf[512];
    size_t n = 1 + rnd(seed) % sizeof buf;
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rnd(seed);
    char msg[512];
    grpc_status_code st = echo_once(c, buf, n, (int64_t)rnd(seed), 0, 5000, msg, sizeof msg);
    cr_assert_eq(st, GRPC_STATUS_OK, "%s", msg);
}

/* Health/Check for service; returns the status code, *serving the answer. */
static grpc_status_code health(rpc_client_t *c, const char *service, int *serving, char *msg,
                               size_t ml) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    ProtobufCMessage *r = NULL;
    grpc_status_code st = rpc_call(c, HEALTH_PATH, &req.base,
                                   &grpc__health__v1__health_check_response__descriptor, &r, 5000,
                                   false, msg, ml);
    *serving = -1;
    if (st == GRPC_STATUS_OK) {
        *serving = ((Grpc__Health__V1__HealthCheckResponse *)r)->status;
        protobuf_c_message_free_unpacked(r, NULL);
    }
    return st;
}

static void check_health_states(rpc_server_t *s, rpc_client_t *c) {
    char msg[512];
    int v;
    cr_assert_eq(health(c, "", &v, msg, sizeof msg), GRPC_STATUS_OK, "%s", msg);
    cr_assert_eq(v, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    cr_assert_eq(health(c, "ballast.test.v1.Echo", &v, msg, sizeof msg), GRPC_STATUS_NOT_FOUND,
                 "%s", msg);
    cr_assert(strstr(msg, "ballast.test.v1.Echo"), "message should name the service: %s", msg);
    rpc_server_set_health(s, "ballast.test.v1.Echo", RPC_HEALTH_NOT_SERVING);
    cr_assert_eq(health(c, "ballast.test.v1.Echo", &v, msg, sizeof msg), GRPC_STATUS_OK, "%s",
                 msg);
    cr_assert_eq(v, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
    rpc_server_set_health(s, "ballast.test.v1.Echo", RPC_HEALTH_SERVING);
    cr_assert_eq(health(c, "ballast.test.v1.Echo", &v, msg, sizeof msg), GRPC_STATUS_OK, "%s",
                 msg);
    cr_assert_eq(v, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    rpc_server_set_health(s, "", RPC_HEALTH_NOT_SERVING);
    cr_assert_eq(health(c, "", &v, msg, sizeof msg), GRPC_STATUS_OK, "%s", msg);
    cr_assert_eq(v, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
}

/* ---- tests ---- */

/* Leave a socket file behind as a crashed server would. */
static void stale_socket(const char *addr) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    cr_assert_lt(strlen(addr + 5), sizeof a.sun_path);
    memcpy(a.sun_path, addr + 5, strlen(addr + 5) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "bind %s", a.sun_path);
    close(fd);
    cr_assert_eq(access(a.sun_path, F_OK), 0);
}

Test(rpc, health_over_unix_socket) {
    char addr[128];
    unix_addr(addr, sizeof addr, "health");
    stale_socket(addr);
    int port = -1;
    rpc_server_t *s = start_echo(addr, 2, 0, &port);
    cr_assert_eq(port, 0);
    rpc_client_t *c = open_client(addr);
    check_health_states(s, c);
    rpc_client_close(c);
    rpc_server_free(s);
}

Test(rpc, health_over_tcp_port_zero_and_two_addresses) {
    char err[256], ua[128], ta[64];
    unix_addr(ua, sizeof ua, "two");
    rpc_server_t *s = rpc_server_new(NULL, err, sizeof err);
    cr_assert(s, "%s", err);
    int port = 0, uport = -1;
    cr_assert_eq(rpc_server_listen(s, "127.0.0.1:0", &port, err, sizeof err), 0, "%s", err);
    cr_assert(port > 0 && port < 65536, "bound port %d", port);
    cr_assert_eq(rpc_server_listen(s, ua, &uport, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_start(s, err, sizeof err), 0, "%s", err);
    snprintf(ta, sizeof ta, "127.0.0.1:%d", port);
    rpc_client_t *c = open_client(ta);
    check_health_states(s, c);
    rpc_client_t *cu = open_client(ua);
    int v;
    char msg[512];
    cr_assert_eq(health(cu, "", &v, msg, sizeof msg), GRPC_STATUS_OK, "%s", msg);
    cr_assert_eq(v, RPC_HEALTH_NOT_SERVING); /* set through the TCP test above */
    /* Health has no Watch here: answered UNIMPLEMENTED by the catch-all */
    void *out;
    size_t outn;
    grpc_status_code st = rpc_call_raw(cu, "/grpc.health.v1.Health/Watch", "", 0, &out, &outn,
                                       5000, false, msg, sizeof msg);
    cr_assert_eq(st, GRPC_STATUS_UNIMPLEMENTED, "%s", msg);
    rpc_client_close(cu);
    rpc_client_close(c);
    rpc_server_free(s);
}

typedef struct {
    rpc_client_t *c;
    uint64_t seed;
    int calls;
    int failures;
    char first_err[512];
} worker_t;

static void *worker(void *arg) {
    worker_t *w = arg;
    uint8_t buf[4096];
    char msg[512];
    for (int i = 0; i < w->calls; i++) {
        const char *bad = echo_random(w->c, &w->seed, sizeof buf, buf, msg, sizeof msg);
        if (bad && w->failures++ == 0) snprintf(w->first_err, sizeof w->first_err, "%s", bad);
    }
    return NULL;
}

Test(rpc, eight_threads_thousand_calls_each) {
    char addr[128];
    unix_addr(addr, sizeof addr, "conc");
    rpc_server_t *s = start_echo(addr, 4, 0, NULL);
    rpc_client_t *c = open_client(addr);
    enum { T = 8, CALLS = 1000 };
    worker_t w[T];
    pthread_t tid[T];
    uint64_t seed = 0x9E3779B97F4A7C15ULL ^ (uint64_t)getpid();
    double t0 = clock_now_ms();
    for (int i = 0; i < T; i++) {
        w[i] = (worker_t){.c = c, .seed = rnd(&seed) | 1, .calls = CALLS};
        pthread_create(&tid[i], NULL, worker, &w[i]);
    }
    int failures = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(tid[i], NULL);
        cr_expect_eq(w[i].failures, 0, "thread %d: %d failures, first: %s", i, w[i].failures,
                     w[i].first_err);
        failures += w[i].failures;
    }
    cr_log_info("%d calls in %.0f ms", T * CALLS, clock_now_ms() - t0);
    cr_assert_eq(failures, 0);
    cr_assert_geq(rpc_server_calls(s), (uint64_t)(T * CALLS));
    cr_assert(atomic_load(&echo_user_seen), "handler never saw its user pointer, path and peer");
    rpc_client_close(c);
    rpc_server_free(s);
}

Test(rpc, bad_requests_get_their_status_and_server_keeps_serving) {
    char addr[128];
    unix_addr(addr, sizeof addr, "bad");
    const size_t limit = 64 << 10;
    rpc_server_t *s = start_echo(addr, 2, limit, NULL);
    rpc_client_t *c = open_client(addr);
    uint64_t seed = 0x1234567 ^ (uint64_t)getpid();
    char msg[512];
    void *out;
    size_t outn;
    echo_ok(c, &seed);

    /* malformed protobuf: wire type 7, truncated length, truncated varint,
     * a string field (payload is bytes so any bytes are fine; use a field
     * number 0 instead) */
    static const uint8_t bad1[] = {0x0f, 0x01};
    static const uint8_t bad2[] = {0x0a, 0x40, 'a', 'b'};
    static const uint8_t bad3[] = {0x10, 0xff, 0xff, 0xff};
    static const uint8_t bad4[] = {0x00, 0x01};
    const struct { const uint8_t *p; size_t n; } bads[] = {
        {bad1, sizeof bad1}, {bad2, sizeof bad2}, {bad3, sizeof bad3}, {bad4, sizeof bad4}};
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        grpc_status_code st = rpc_call_raw(c, ECHO_PATH, bads[i].p, bads[i].n, &out, &outn, 5000,
                                           false, msg, sizeof msg);
        cr_assert_eq(st, GRPC_STATUS_INVALID_ARGUMENT, "bad input %zu: %s: %s", i,
                     rpc_status_name(st), msg);
        cr_assert(strstr(msg, "ballast.test.v1.EchoRequest"), "message names the type: %s", msg);
        cr_assert_null(out);
        echo_ok(c, &seed);
    }

    /* unknown methods, a well-formed path and one in an unknown service */
    const char *unknown[] = {"/ballast.test.v1.Echo/Nope", "/no.such.Service/Echo"};
    for (size_t i = 0; i < 2; i++) {
        grpc_status_code st = rpc_call_raw(c, unknown[i], "\x08\x01", 2, &out, &outn, 5000, false,
                                           msg, sizeof msg);
        cr_assert_eq(st, GRPC_STATUS_UNIMPLEMENTED, "%s: %s", rpc_status_name(st), msg);
        cr_assert(strstr(msg, unknown[i]), "message names the method: %s", msg);
        echo_ok(c, &seed);
    }

    /* over the limit, just over and far over; just under passes */
    size_t sizes[] = {limit + 16, 4 * limit};
    for (size_t i = 0; i < 2; i++) {
        uint8_t *big = malloc(sizes[i]);
        for (size_t k = 0; k < sizes[i]; k++) big[k] = (uint8_t)rnd(&seed);
        grpc_status_code st = echo_once(c, big, sizes[i], 7, 0, 5000, msg, sizeof msg);
        cr_assert_eq(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "%zu bytes: %s: %s", sizes[i],
                     rpc_status_name(st), msg);
        free(big);
        echo_ok(c, &seed);
    }
    uint8_t *fit = malloc(limit - 64);
    for (size_t k = 0; k < limit - 64; k++) fit[k] = (uint8_t)rnd(&seed);
    cr_assert_eq(echo_once(c, fit, limit - 64, 8, 0, 5000, msg, sizeof msg), GRPC_STATUS_OK,
                 "%s", msg);
    free(fit);

    /* a handler's own status and message reach the client */
    Ballast__Test__V1__EchoRequest req = BALLAST__TEST__V1__ECHO_REQUEST__INIT;
    req.fail_code = GRPC_STATUS_FAILED_PRECONDITION;
    ProtobufCMessage *r;
    grpc_status_code st = rpc_call(c, ECHO_PATH, &req.base,
                                   &ballast__test__v1__echo_response__descriptor, &r, 5000, false,
                                   msg, sizeof msg);
    cr_assert_eq(st, GRPC_STATUS_FAILED_PRECONDITION, "%s", msg);
    cr_assert(strstr(msg, "asked to fail with 9"), "%s", msg);
    echo_ok(c, &seed);

    /* a malformed path is refused by the client before sending */
    st = rpc_call_raw(c, "no-slash", "", 0, &out, &outn, 5000, false, msg, sizeof msg);
    cr_assert_eq(st, GRPC_STATUS_INVALID_ARGUMENT, "%s", msg);
    echo_ok(c, &seed);

    rpc_client_close(c);
    rpc_server_free(s);
}

Test(rpc, deadline_exceeded_and_server_still_answers) {
    char addr[128];
    unix_addr(addr, sizeof addr, "dl");
    rpc_server_t *s = start_echo(addr, 2, 0, NULL);
    rpc_client_t *c = open_client(addr);
    uint64_t seed = 0xabcdef ^ (uint64_t)getpid();
    echo_ok(c, &seed);
    char msg[512];
    uint8_t b[3] = {1, 2, 3};
    double t0 = clock_now_ms();
    grpc_status_code st = echo_once(c, b, 3, 1, 1500, 200, msg, sizeof msg);
    double dt = clock_now_ms() - t0;
    cr_assert_eq(st, GRPC_STATUS_DEADLINE_EXCEEDED, "%s: %s", rpc_status_name(st), msg);
    cr_assert(dt >= 150 && dt < 1200, "deadline of 200 ms took %.0f ms", dt);
    /* the other thread answers while the first still sleeps */
    t0 = clock_now_ms();
    echo_ok(c, &seed);
    cr_assert(clock_now_ms() - t0 < 1000, "second call waited %.0f ms", clock_now_ms() - t0);
    rpc_client_close(c);
    rpc_server_free(s);
}

/* ---- quick methods run on the thread waiting on the completion queue ---- */

#define QUICK_PATH "/ballast.test.v1.Echo/QuickEcho"
static atomic_int quick_thread = -1, slow_thread = -1;

static grpc_status_code quick_handler(rpc_ctx_t *ctx, const ProtobufCMessage *req, ProtobufCMessage *resp) {
    atomic_store(&quick_thread, ctx->thread);
    return echo_handler(ctx, req, resp);
}

static grpc_status_code slow_handler(rpc_ctx_t *ctx, const ProtobufCMessage *req, ProtobufCMessage *resp) {
    if (ctx->thread == 0) atomic_store(&slow_thread, 0); /* 0 would be wrong: remember it */
    else if (atomic_load(&slow_thread) != 0) atomic_store(&slow_thread, ctx->thread);
    return echo_handler(ctx, req, resp);
}

typedef struct {
    rpc_client_t *c;
    int64_t seq;
    grpc_status_code st;
} busy_call_t;

static void *busy_call(void *arg) {
    busy_call_t *a = arg;
    char msg[256];
    uint8_t b[4] = {9, 8, 7, (uint8_t)a->seq};
    a->st = echo_once(a->c, b, sizeof b, a->seq, 1500, 10000, msg, sizeof msg);
    return NULL;
}

/* With 2 handler threads both held by 1.5 s calls, a quick method still
 * answers at once: it runs on thread 0 (the one waiting on the completion
 * queue), the others never do. */
Test(rpc, quick_methods_answer_while_the_handlers_are_busy) {
    char addr[128], err[256];
    unix_addr(addr, sizeof addr, "quick");
    rpc_server_opts_t o = {.threads = 2};
    rpc_server_t *s = rpc_server_new(&o, err, sizeof err);
    cr_assert(s, "%s", err);
    rpc_method_t slow = echo_method, quick = echo_method;
    slow.handler = slow_handler;
    quick.path = QUICK_PATH;
    quick.handler = quick_handler;
    quick.quick = true;
    cr_assert_eq(rpc_server_add_method(s, &slow, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_add_method(s, &quick, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_listen(s, addr, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_start(s, err, sizeof err), 0, "%s", err);
    rpc_client_t *c = open_client(addr);
    uint64_t seed = 0x9e3779b9 ^ (uint64_t)getpid();
    echo_ok(c, &seed); /* connected */
    busy_call_t a[2] = {{c, 1, GRPC_STATUS_UNKNOWN}, {c, 2, GRPC_STATUS_UNKNOWN}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, busy_call, &a[i]), 0);
    usleep(300 * 1000); /* both slow calls are in their handlers (or queued for them) */
    uint8_t buf[64];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)rnd(&seed);
    Ballast__Test__V1__EchoRequest req = BALLAST__TEST__V1__ECHO_REQUEST__INIT;
    req.payload.data = buf;
    req.payload.len = sizeof buf;
    req.seq = 77;
    ProtobufCMessage *r = NULL;
    char msg[256];
    double t0 = clock_now_ms();
    grpc_status_code st = rpc_call(c, QUICK_PATH, &req.base, &ballast__test__v1__echo_response__descriptor, &r,
                                   5000, false, msg, sizeof msg);
    double dt = clock_now_ms() - t0;
    cr_assert_eq(st, GRPC_STATUS_OK, "%s", msg);
    Ballast__Test__V1__EchoResponse *resp = (void *)r;
    cr_assert_eq(resp->crc, crc32_ieee(buf, sizeof buf));
    protobuf_c_message_free_unpacked(r, NULL);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(a[i].st, GRPC_STATUS_OK, "slow call %d: %s", i, rpc_status_name(a[i].st));
    }
    cr_assert(dt < 1000, "the quick call waited %.0f ms behind two 1.5 s calls", dt);
    cr_assert_eq(atomic_load(&quick_thread), 0, "the quick method ran on thread %d", atomic_load(&quick_thread));
    cr_assert_geq(atomic_load(&slow_thread), 1, "a handler ran on the thread waiting on the queue");
    rpc_client_close(c);
    rpc_server_free(s);
}

Test(rpc, unreachable_address_fails_fast_with_unavailable) {
    char addrs[2][128];
    snprintf(addrs[0], sizeof addrs[0], "unix:/tmp/ballast-test-rpc-%d-nobody.sock",
             (int)getpid());
    snprintf(addrs[1], sizeof addrs[1], "127.0.0.1:%d", dead_port());
    for (int i = 0; i < 2; i++) {
        rpc_client_t *c = open_client(addrs[i]);
        char msg[512];
        int v;
        for (int k = 0; k < 2; k++) { /* first attempt and the one in backoff */
            double t0 = clock_now_ms();
            grpc_status_code st = health(c, "", &v, msg, sizeof msg);
            double dt = clock_now_ms() - t0;
            cr_assert_eq(st, GRPC_STATUS_UNAVAILABLE, "%s: %s: %s", addrs[i], rpc_status_name(st),
                         msg);
            cr_assert(strstr(msg, addrs[i]), "message should name %s: %s", addrs[i], msg);
            cr_assert(dt < 3000, "fail fast took %.0f ms", dt);
        }
        rpc_client_close(c);
    }
}

typedef struct {
    char addr[128];
    rpc_server_t *s;
} late_t;

static void *start_late(void *arg) {
    late_t *l = arg;
    usleep(300 * 1000);
    l->s = start_echo(l->addr, 1, 0, NULL);
    return NULL;
}

Test(rpc, wait_for_ready_waits_for_a_late_server) {
    late_t l = {0};
    unix_addr(l.addr, sizeof l.addr, "late");
    rpc_client_t *c = open_client(l.addr);
    pthread_t t;
    pthread_create(&t, NULL, start_late, &l);
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    ProtobufCMessage *r = NULL;
    char msg[512];
    grpc_status_code st = rpc_call(c, HEALTH_PATH, &req.base,
                                   &grpc__health__v1__health_check_response__descriptor, &r, 10000,
                                   true, msg, sizeof msg);
    cr_assert_eq(st, GRPC_STATUS_OK, "%s", msg);
    protobuf_c_message_free_unpacked(r, NULL);
    pthread_join(t, NULL);
    rpc_client_close(c);
    rpc_server_free(l.s);
}

typedef struct {
    rpc_client_t *c;
    grpc_status_code st;
    char msg[512];
} slow_call_t;

static void *slow_call(void *arg) {
    slow_call_t *sc = arg;
    uint8_t b[1] = {9};
    sc->st = echo_once(sc->c, b, 1, 1, 800, 10000, sc->msg, sizeof sc->msg);
    return NULL;
}

Test(rpc, stop_with_a_call_in_flight) {
    char addr[128];
    unix_addr(addr, sizeof addr, "inflight");
    rpc_server_t *s = start_echo(addr, 2, 0, NULL);
    rpc_client_t *c = open_client(addr);
    slow_call_t sc = {.c = c};
    pthread_t t;
    pthread_create(&t, NULL, slow_call, &sc);
    usleep(200 * 1000); /* the handler is now sleeping */
    double t0 = clock_now_ms();
    rpc_server_stop(s, 0);
    double dt = clock_now_ms() - t0;
    pthread_join(t, NULL);
    cr_assert_neq(sc.st, GRPC_STATUS_OK, "a call cut by stop must not report OK");
    cr_assert(dt < 5000, "stop took %.0f ms", dt);
    rpc_server_free(s);
    rpc_client_close(c);
}

Test(rpc, hundred_start_stop_cycles_leak_no_fds_or_threads) {
    int fds0 = count_dir("/proc/self/fd"), thr0 = count_dir("/proc/self/task");
    uint64_t seed = 0x5eed ^ (uint64_t)getpid();
    for (int i = 0; i < 100; i++) {
        char addr[128];
        int port = 0;
        if (i % 2) snprintf(addr, sizeof addr, "127.0.0.1:0");
        else unix_addr(addr, sizeof addr, "cycle");
        rpc_server_t *s = start_echo(addr, 1 + i % 3, 0, &port);
        if (i % 5 == 0) { /* some cycles also carry a call */
            char ca[128];
            if (i % 2) snprintf(ca, sizeof ca, "127.0.0.1:%d", port);
            else snprintf(ca, sizeof ca, "%s", addr);
            rpc_client_t *c = open_client(ca);
            echo_ok(c, &seed);
            rpc_client_close(c);
        }
        rpc_server_free(s);
    }
    /* a server created and freed without ever starting */
    char err[256];
    rpc_server_t *s = rpc_server_new(NULL, err, sizeof err);
    cr_assert(s, "%s", err);
    cr_assert_eq(rpc_server_listen(s, "127.0.0.1:0", NULL, err, sizeof err), 0, "%s", err);
    rpc_server_free(s);
    int fds1 = count_dir("/proc/self/fd"), thr1 = count_dir("/proc/self/task");
    cr_assert_leq(fds1, fds0 + 2, "fds %d -> %d after 100 cycles", fds0, fds1);
    cr_assert_leq(thr1, thr0 + 2, "threads %d -> %d after 100 cycles", thr0, thr1);
#ifdef __SANITIZE_ADDRESS__
    /* Criterion ignores a leak report at a test process's exit, so ask now. */
    cr_assert_eq(__lsan_do_recoverable_leak_check(), 0,
                 "LeakSanitizer found leaks after 100 cycles (report above)");
#endif
#ifdef HAVE_MEMCHECK
    if (RUNNING_ON_VALGRIND) { /* same for `make valgrind` */
        unsigned long leaked = 0, dubious = 0, reachable = 0, suppressed = 0;
        VALGRIND_DO_LEAK_CHECK;
        VALGRIND_COUNT_LEAKS(leaked, dubious, reachable, suppressed);
        (void)dubious, (void)reachable, (void)suppressed;
        cr_assert_eq(leaked, 0, "valgrind: %lu bytes definitely lost after 100 cycles", leaked);
    }
#endif
}

Test(rpc, api_rejects_bad_input_with_clear_messages) {
    char err[256];
    rpc_server_opts_t bad = {.threads = -1};
    cr_assert_null(rpc_server_new(&bad, err, sizeof err));
    cr_assert(strstr(err, "threads"), "%s", err);
    rpc_server_t *s = rpc_server_new(NULL, err, sizeof err);
    cr_assert(s, "%s", err);
    const char *bad_addrs[] = {"", "unix:", "localhost", "127.0.0.1:99999", "127.0.0.1:x"};
    for (size_t i = 0; i < sizeof bad_addrs / sizeof bad_addrs[0]; i++) {
        cr_assert_eq(rpc_server_listen(s, bad_addrs[i], NULL, err, sizeof err), -1, "%s",
                     bad_addrs[i]);
        cr_assert(strstr(err, "address"), "%s", err);
    }
    const char *bad_paths[] = {"Echo", "/Echo", "/a.B/", "//x", "/a.B/c/d", "/a B/c"};
    for (size_t i = 0; i < sizeof bad_paths / sizeof bad_paths[0]; i++) {
        rpc_method_t m = {bad_paths[i], &ballast__test__v1__echo_request__descriptor,
                          &ballast__test__v1__echo_response__descriptor, echo_handler, NULL};
        cr_assert_eq(rpc_server_add_method(s, &m, err, sizeof err), -1, "%s", bad_paths[i]);
        cr_assert(strstr(err, "malformed"), "%s", err);
    }
    rpc_method_t m = {ECHO_PATH, &ballast__test__v1__echo_request__descriptor,
                      &ballast__test__v1__echo_response__descriptor, echo_handler, NULL};
    cr_assert_eq(rpc_server_add_method(s, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_add_method(s, &m, err, sizeof err), -1);
    cr_assert(strstr(err, "twice"), "%s", err);
    cr_assert_eq(rpc_server_start(s, err, sizeof err), -1);
    cr_assert(strstr(err, "listen"), "%s", err);
    rpc_server_free(s);
    cr_assert_null(rpc_client_open("nope", NULL, err, sizeof err));
    cr_assert(strstr(err, "nope"), "%s", err);
}

/* Unix listeners: the socket file is 0660 and a handler sees the caller's
 * uid (SO_PEERCRED); over TCP it sees no local peer. A request whose string
 * field holds a NUL is refused before the handler, naming the field. */
Test(rpc, unix_peer_credentials_socket_mode_and_nul_strings) {
    char addr[128], err[256], msg[512];
    unix_addr(addr, sizeof addr, "peer");
    rpc_server_opts_t o = {.threads = 2};
    rpc_server_t *s = rpc_server_new(&o, err, sizeof err);
    cr_assert(s, "%s", err);
    cr_assert_eq(rpc_server_add_method(s, &echo_method, err, sizeof err), 0, "%s", err);
    int port = -1;
    cr_assert_eq(rpc_server_listen(s, addr, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_listen(s, "127.0.0.1:0", &port, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_start(s, err, sizeof err), 0, "%s", err);
    struct stat st;
    cr_assert_eq(stat(addr + 5, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0660, "socket mode %o, want 0660", st.st_mode & 0777);

    char tcp[64];
    snprintf(tcp, sizeof tcp, "127.0.0.1:%d", port);
    const char *addrs[2] = {addr, tcp};
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    for (int a = 0; a < 2; a++) {
        rpc_client_t *c = open_client(addrs[a]);
        cr_assert_eq(rpc_client_private(c), a == 0);
        Ballast__Test__V1__EchoRequest req = BALLAST__TEST__V1__ECHO_REQUEST__INIT;
        req.seq = (int64_t)(rnd(&seed) >> 1);
        req.note = "fine";
        ProtobufCMessage *r = NULL;
        grpc_status_code code = rpc_call(c, ECHO_PATH, &req.base, &ballast__test__v1__echo_response__descriptor,
                                         &r, 10000, true, msg, sizeof msg);
        cr_assert_eq(code, GRPC_STATUS_OK, "%s", msg);
        Ballast__Test__V1__EchoResponse *er = (void *)r;
        cr_assert_eq(er->seq, req.seq);
        cr_assert_eq(er->peer_local, a == 0, "%s: peer_local %d", addrs[a], er->peer_local);
        if (a == 0) cr_assert_eq(er->peer_uid, (uint32_t)geteuid());
        protobuf_c_message_free_unpacked(r, NULL);

        /* "ab\0cd" in field 5 (note), at a random place among the bytes */
        uint8_t raw[64];
        size_t len = 2 + rnd(&seed) % 20, nulat = rnd(&seed) % len;
        raw[0] = (5 << 3) | 2;
        raw[1] = (uint8_t)len;
        for (size_t i = 0; i < len; i++) raw[2 + i] = (uint8_t)('a' + rnd(&seed) % 26);
        raw[2 + nulat] = 0;
        void *out = NULL;
        size_t outlen = 0;
        code = rpc_call_raw(c, ECHO_PATH, raw, 2 + len, &out, &outlen, 10000, true, msg, sizeof msg);
        free(out);
        cr_assert_eq(code, GRPC_STATUS_INVALID_ARGUMENT, "NUL in note: %s (%s)", rpc_status_name(code), msg);
        cr_assert(strstr(msg, "'note'") && strstr(msg, "NUL"), "message should name the field: %s", msg);
        rpc_client_close(c);
    }
    rpc_server_free(s);
    cr_assert_neq(access(addr + 5, F_OK), 0, "socket file left behind");
}
