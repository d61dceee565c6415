/* rpc_stress.c: the rpc layer's concurrency paths as a plain program, so
 * they also run under ThreadSanitizer (Criterion cannot) and helgrind.
 *
 *   rpc_stress MODE [N]
 *     calls  N calls from each of 8 threads sharing one client, to a 4-thread
 *            server, payloads random and checked byte for byte (default 1000)
 *     mixed  8 threads mixing good calls, malformed bytes, unknown methods,
 *            over-limit messages and health checks; N rounds each (default 200)
 *     cycles N start/call/stop cycles with calls in flight at stop (default 20)
 * Prints one summary line; exits 0 when every check held, 1 otherwise. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "rpc.h"
#include "tests/rpc_echo.h"

#define MAX_MSG (32u << 10)
#define THREADS 8

typedef struct {
    rpc_client_t *c;
    uint64_t seed;
    int n;
    int mode;                /* 0 calls, 1 mixed, 2 until *stop */
    atomic_int *stop;        /* mode 2 only */
    atomic_int *answered;    /* mode 2: calls answered OK by any thread so far */
    int failures, done, oks;  /* oks: mode 2 calls answered OK */
    char first[512];
} job_t;

static void fail(job_t *j, const char *what) {
    if (j->failures++ == 0) snprintf(j->first, sizeof j->first, "%s", what);
}

static void mixed_round(job_t *j, uint8_t *buf, char *msg, size_t ml) {
    void *out;
    size_t outn;
    grpc_status_code st;
    switch (rnd(&j->seed) % 5) {
    case 0: {
        static const uint8_t bad[] = {0x0f, 0x01};
        st = rpc_call_raw(j->c, ECHO_PATH, bad, sizeof bad, &out, &outn, 20000, false, msg, ml);
        if (st != GRPC_STATUS_INVALID_ARGUMENT) fail(j, "malformed request not INVALID_ARGUMENT");
        free(out);
        break;
    }
    case 1:
        st = rpc_call_raw(j->c, "/ballast.test.v1.Echo/Nope", "", 0, &out, &outn, 20000, false,
                          msg, ml);
        if (st != GRPC_STATUS_UNIMPLEMENTED) fail(j, "unknown method not UNIMPLEMENTED");
        free(out);
        break;
    case 2: {
        size_t n = MAX_MSG + 1 + rnd(&j->seed) % 1000;
        uint8_t *big = malloc(n);
        for (size_t k = 0; k < n; k++) big[k] = (uint8_t)rnd(&j->seed);
        Ballast__Test__V1__EchoRequest req = BALLAST__TEST__V1__ECHO_REQUEST__INIT;
        req.payload.data = big;
        req.payload.len = n;
        ProtobufCMessage *r = NULL;
        st = rpc_call(j->c, ECHO_PATH, &req.base, &ballast__test__v1__echo_response__descriptor,
                      &r, 20000, false, msg, ml);
        if (st != GRPC_STATUS_RESOURCE_EXHAUSTED) fail(j, "oversize request not RESOURCE_EXHAUSTED");
        if (r) protobuf_c_message_free_unpacked(r, NULL);
        free(big);
        break;
    }
    case 3: {
        Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        ProtobufCMessage *r = NULL;
        st = rpc_call(j->c, HEALTH_PATH, &req.base,
                      &grpc__health__v1__health_check_response__descriptor, &r, 20000, false, msg,
                      ml);
        if (st != GRPC_STATUS_OK) fail(j, msg);
        if (r) protobuf_c_message_free_unpacked(r, NULL);
        break;
    }
    default: {
        const char *bad = echo_random(j->c, &j->seed, 2048, buf, msg, ml);
        if (bad) fail(j, bad);
    }
    }
}

static void *run_job(void *arg) {
    job_t *j = arg;
    uint8_t buf[4096];
    char msg[512];
    for (int i = 0; (j->mode == 2) ? !atomic_load(j->stop) : i < j->n; i++) {
        if (j->mode == 0) {
            const char *bad = echo_random(j->c, &j->seed, sizeof buf, buf, msg, sizeof msg);
            if (bad) fail(j, bad);
        } else if (j->mode == 1) {
            mixed_round(j, buf, msg, sizeof msg);
        } else {
            /* the server goes away under us: any status but a wrong OK is fine */
            Ballast__Test__V1__EchoRequest req = BALLAST__TEST__V1__ECHO_REQUEST__INIT;
            req.sleep_ms = (uint32_t)(rnd(&j->seed) % 3);
            req.seq = i;
            ProtobufCMessage *r = NULL;
            grpc_status_code st = rpc_call(j->c, ECHO_PATH, &req.base,
                                           &ballast__test__v1__echo_response__descriptor, &r,
                                           2000, false, msg, sizeof msg);
            if (st == GRPC_STATUS_OK && ((Ballast__Test__V1__EchoResponse *)r)->seq != i)
                fail(j, "wrong seq");
            if (st == GRPC_STATUS_OK) {
                j->oks++;
                atomic_fetch_add(j->answered, 1);
            }
            if (r) protobuf_c_message_free_unpacked(r, NULL);
        }
        j->done++;
    }
    return NULL;
}

static rpc_server_t *start(const char *addr) {
    char err[256];
    rpc_server_opts_t o = {.threads = 4, .max_msg_bytes = MAX_MSG};
    rpc_server_t *s = rpc_server_new(&o, err, sizeof err);
    if (!s || rpc_server_add_method(s, &echo_method, err, sizeof err) ||
        rpc_server_listen(s, addr, NULL, err, sizeof err) || rpc_server_start(s, err, sizeof err)) {
        fprintf(stderr, "rpc_stress: %s\n", err);
        exit(1);
    }
    return s;
}

/* Run THREADS jobs of `mode` (0 calls, 1 mixed), n rounds each; returns the
 * failures and the rounds done in *done. */
static int run_threads(rpc_client_t *c, int mode, int n, uint64_t *seed, int *done) {
    job_t j[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        j[i] = (job_t){.c = c, .seed = rnd(seed) | 1, .n = n, .mode = mode};
        pthread_create(&t[i], NULL, run_job, &j[i]);
    }
    int failures = 0;
    *done = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        if (j[i].failures)
            fprintf(stderr, "thread %d: %d failures, first: %s\n", i, j[i].failures, j[i].first);
        failures += j[i].failures;
        *done += j[i].done;
    }
    return failures;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: rpc_stress calls|mixed|cycles [N]\n");
        return 2;
    }
    const char *mode = argv[1];
    int n = argc > 2 ? atoi(argv[2]) : 0;
    uint64_t seed = 0x9E3779B97F4A7C15ULL ^ (uint64_t)getpid();
    char addr[128], err[256];
    snprintf(addr, sizeof addr, "unix:/tmp/ballast-rpc-stress-%d.sock", (int)getpid());
    double t0 = clock_now_ms();
    int failures = 0, done = 0;

    if (strcmp(mode, "calls") == 0 || strcmp(mode, "mixed") == 0) {
        int m = mode[0] == 'c' ? 0 : 1;
        if (n <= 0) n = m == 0 ? 1000 : 200;
        rpc_server_t *s = start(addr);
        rpc_client_t *c = rpc_client_open(addr, NULL, err, sizeof err);
        if (!c) {
            fprintf(stderr, "rpc_stress: %s\n", err);
            return 1;
        }
        failures = run_threads(c, m, n, &seed, &done);
        if (done != THREADS * n) failures++;
        rpc_client_close(c);
        rpc_server_free(s);
    } else if (strcmp(mode, "cycles") == 0) {
        if (n <= 0) n = 20;
        for (int i = 0; i < n; i++) {
            rpc_server_t *s = start(addr);
            rpc_client_t *c = rpc_client_open(addr, NULL, err, sizeof err);
            if (!c) {
                fprintf(stderr, "rpc_stress: %s\n", err);
                return 1;
            }
            atomic_int stop = 0, answered = 0;
            int oks = 0;
            job_t j[THREADS];
            pthread_t t[THREADS];
            for (int k = 0; k < THREADS; k++) {
                j[k] = (job_t){.c = c, .seed = rnd(&seed) | 1, .mode = 2, .stop = &stop, .answered = &answered};
                pthread_create(&t[k], NULL, run_job, &j[k]);
            }
            /* stop with calls in flight, once the server has answered some
             * (on a loaded machine the first answers can take a while) */
            for (int w = 0; w < 2000 && atomic_load(&answered) < THREADS; w++) usleep(5 * 1000);
            usleep(20 * 1000);
            rpc_server_stop(s, (int)(rnd(&seed) % 20));
            atomic_store(&stop, 1);
            for (int k = 0; k < THREADS; k++) {
                pthread_join(t[k], NULL);
                failures += j[k].failures;
                done += j[k].done;
                oks += j[k].oks;
                if (j[k].failures) fprintf(stderr, "cycle %d: %s\n", i, j[k].first);
            }
            if (oks == 0) {
                fprintf(stderr, "cycle %d: no call succeeded before the stop\n", i);
                failures++;
            }
            rpc_client_close(c);
            rpc_server_free(s);
        }
    } else {
        fprintf(stderr, "rpc_stress: unknown mode %s; use calls, mixed or cycles\n", mode);
        return 2;
    }
    printf("rpc_stress %s: %d calls, %d failures, %.0f ms\n", mode, done, failures,
           clock_now_ms() - t0);
    return failures ? 1 : 0;
}
