/* bench_offload.c: put+get through ballastd's shared pool against plain
 * memcpy of the same bytes, plus ring and control-RPC latency.
 *
 * Against a running ballastd (tests/bench/offload.sh starts one):
 *   memcpy    src -> tmp, tmp -> dst                 (the bytes a put and a get move)
 *   pool      put_alloc, memcpy src -> region, put_commit,
 *             get, memcpy region -> dst, get_done, free
 * both on the same buffers, alternated, best of --iters each. Every pool
 * round trip is checked (dst == src) outside the timed part.
 * Latency: NOP ring round trips and Heartbeat RPCs over the Unix socket,
 * p50 and p99 of --lat-iters each.
 * Prints a table and machine-readable lines:
 *   RESULT bench_offload blob=B memcpy_gbps=M pool_gbps=P ratio=R
 *   RESULT bench_offload_lat ring_p50_us=.. ring_p99_us=.. rpc_p50_us=.. rpc_p99_us=.. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "clock.h"
#include "options.h"
#include "workers/offload/client.h"

static const char *o_addr;
static uint64_t o_blob;
static int64_t o_iters, o_lat_iters;

static const opt_t opts[] = {
    { "addr", OPT_STRING, "unix:/run/ballast/ballastd.sock", 0, 0, NULL, "ballastd address (unix:/path)", &o_addr },
    { "blob", OPT_SIZE, "64M", 4096, 1ull << 40, NULL, "bytes per blob", &o_blob },
    { "iters", OPT_INT, "15", 1, 100000, NULL, "timed repetitions of each path (best is kept)", &o_iters },
    { "lat-iters", OPT_INT, "5000", 10, 10000000, NULL, "latency samples", &o_lat_iters },
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CHECK_OC(call) do { status_t st_ = (call); if (st_) die("%s: %s", #call, oc_last_error()); } while (0)

int main(int argc, char **argv) {
    log_init("bench_offload", -1);
    char err[OPT_ERR_LEN];
    int npos = 0;
    int rc = opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, NULL, 0, &npos,
                       "usage: bench_offload --addr unix:/path [--blob 64M]", err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) die("%s", err);
    oc_options_t o = { 0 };
    o.addr = o_addr;
    o.job = "bench";
    o.client_name = "bench_offload";
    oc_client_t *c = NULL;
    if (oc_open(&o, &c)) die("%s", oc_last_error());
    if (!oc_is_shared(c)) die("bench_offload needs shared-memory mode (a unix: address)");
    size_t n = o_blob;
    uint8_t *src = malloc(n), *tmp = malloc(n), *dst = malloc(n);
    CHECK_ALLOC(src); CHECK_ALLOC(tmp); CHECK_ALLOC(dst);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i + 8 <= n; i += 8) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; memcpy(src + i, &s, 8); }
    memset(tmp, 1, n);
    memset(dst, 2, n);

    double best_mem = 1e30, best_pool = 1e30, best_parts[6] = { 0 };
    oc_key_t k = { 0, OC_KIND_ACTIVATION, 0, 0 };
    for (int64_t it = -2; it < o_iters; it++) { /* two warm-up rounds fault the pages in */
        double t0 = clock_now_s();
        memcpy(tmp, src, n);
        memcpy(dst, tmp, n);
        double t1 = clock_now_s();
        if (it >= 0 && t1 - t0 < best_mem) best_mem = t1 - t0;
        memset(dst, 3, 4096);

        k.index = (uint64_t)(it + 2);
        oc_buf_t b;
        double ts[7];
        ts[0] = t0 = clock_now_s();
        CHECK_OC(oc_put_alloc(c, &k, n, false, &b));
        ts[1] = clock_now_s();
        memcpy(b.ptr, src, n);
        ts[2] = clock_now_s();
        CHECK_OC(oc_put_commit(c, &k, &b));
        ts[3] = clock_now_s();
        CHECK_OC(oc_get(c, &k, &b));
        ts[4] = clock_now_s();
        memcpy(dst, b.ptr, n);
        ts[5] = clock_now_s();
        CHECK_OC(oc_get_done(c, &k, &b));
        ts[6] = t1 = clock_now_s();
        if (it >= 0 && t1 - t0 < best_pool)
            for (int j = 0; j < 6; j++) best_parts[j] = (ts[j + 1] - ts[j]) * 1e6;
        CHECK_OC(oc_free(c, &k));
        if (memcmp(dst, src, n) != 0) die("pool round trip corrupted the data (blob %zu bytes)", n);
        if (it >= 0 && t1 - t0 < best_pool) best_pool = t1 - t0;
    }
    double mem_gbps = 2.0 * n / best_mem / 1e9, pool_gbps = 2.0 * n / best_pool / 1e9;
    printf("put+get %zu-byte blob: memcpy %.2f GB/s, pool %.2f GB/s, ratio %.3f\n", n, mem_gbps, pool_gbps,
           best_mem / best_pool);
    printf("  pool path, best round (us): put_alloc %.0f, memcpy in %.0f, put_commit %.0f, get %.0f, "
           "memcpy out %.0f, get_done %.0f; memcpy path %.0f\n", best_parts[0], best_parts[1], best_parts[2],
           best_parts[3], best_parts[4], best_parts[5], best_mem * 1e6);
    printf("RESULT bench_offload blob=%zu memcpy_gbps=%.3f pool_gbps=%.3f ratio=%.3f\n", n, mem_gbps, pool_gbps,
           best_mem / best_pool);

    int64_t L = o_lat_iters;
    double *t = malloc((size_t)L * sizeof *t);
    CHECK_ALLOC(t);
    double p[4];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 100; i++) CHECK_OC(pass ? oc_heartbeat(c) : oc_nop(c));
        for (int64_t i = 0; i < L; i++) {
            double t0 = clock_now_s();
            CHECK_OC(pass ? oc_heartbeat(c) : oc_nop(c));
            t[i] = (clock_now_s() - t0) * 1e6;
        }
        qsort(t, (size_t)L, sizeof *t, cmp_d);
        p[2 * pass] = t[L / 2];
        p[2 * pass + 1] = t[(int64_t)(L * 0.99)];
    }
    printf("ring round trip (NOP): p50 %.1f us, p99 %.1f us\n", p[0], p[1]);
    printf("control RPC (Heartbeat, unix socket): p50 %.1f us, p99 %.1f us\n", p[2], p[3]);
    printf("RESULT bench_offload_lat ring_p50_us=%.1f ring_p99_us=%.1f rpc_p50_us=%.1f rpc_p99_us=%.1f\n",
           p[0], p[1], p[2], p[3]);
    free(t);
    free(src); free(tmp); free(dst);
    oc_close(c, false);
    return 0;
}
