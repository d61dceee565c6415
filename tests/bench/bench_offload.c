/* bench_offload.c: put+get through ballastd's shared pool against plain
 * memcpy of the same bytes, ring and control-RPC latency, and spilling end
 * to end through ballastd.
 *
 * --mode pool, against a running ballastd (tests/bench/offload.sh starts
 * one, pinned with taskset):
 *   memcpy    src -> tmp, tmp -> dst                 (the bytes a put and a get move)
 *   pool      put_alloc, memcpy src -> region, put_commit,
 *             get, memcpy region -> dst, get_done, free
 * on the same buffers, in --rounds rounds. A round runs the two sides in
 * the order A B B A (memcpy first in even rounds, the pool first in odd
 * ones): the side that runs first in a pair is about a fifth faster at 16
 * MiB on this machine, and with one turn each per round the median fell on
 * whichever side opened more rounds. Each turn times enough blobs for
 * about 64 MiB each way. Each round gives one ratio; the figures
 * are the median and the lowest and highest over the rounds. Every round
 * trip of either side is timed on its own and checked (dst == src) outside
 * the timed part: the check reads 2 blobs' worth, which evicts the middle
 * buffer from the cache, so a baseline timed without it ran 15-20% faster
 * at 1 MiB than the same copies with it. --cpu pins
 * this process (the pool's pages are touched where it runs). --rounds 0
 * skips this part (latency only).
 * Latency, each against its bare baseline (tests/lib/bare_peers.h), both
 * forked before this process starts a thread and pinned to --peer-cpu (the
 * gRPC server then execs itself, so that it is a program of its own, as
 * ballastd is):
 * NOP ring round trips against an eventfd ping-pong peer, and Heartbeat RPCs
 * over the Unix socket against a bare gRPC C-core echo server. Ours and the
 * baseline take turns call by call (the one that goes first alternates), so
 * both see the same machine from moment to moment: this machine's latency
 * drifts by a third from one run to the next. --lat-iters pairs of each, in
 * --lat-rounds blocks; each block gives a p50 ratio, reported as the median
 * with the lowest and highest (0 iterations: no latency part). One run sees
 * one address layout of each program, and on one CPU that alone moves the
 * ratio (0.93 to 1.30 between runs, each tight within itself: how the
 * client's and the server's code land on the branch predictors), so
 * tests/bench/offload.sh takes the median over several fresh launches.
 *   RESULT bench_offload blob=B memcpy_gbps=M pool_gbps=P ratio=R lo=L hi=H rounds=N
 *   RESULT bench_offload_lat ring_p50_us=.. ring_p99_us=.. efd_p50_us=.. efd_p99_us=.. ring_ratio=.. ring_lo=..
 *          ring_hi=.. rpc_p50_us=.. rpc_p99_us=.. bare_p50_us=.. bare_p99_us=.. rpc_ratio=.. rpc_lo=.. rpc_hi=..
 *
 * --mode spill, against a ballastd with a --spill-dir and a pool smaller
 * than --bytes (tests/bench/offload_spill.sh): first --fill bytes of blobs
 * are put untimed (the pool is then full and eviction runs), then --bytes
 * more are put and timed (put_alloc, memcpy, put_commit: every byte of them
 * has to make its way through eviction to the disk for the puts to go on),
 * then they are read back in order (prefetch hints ahead, get, memcpy,
 * get_done, free: most come from the disk), timed from the first request
 * to the last answer as fio times its reads, and checked.
 *   RESULT bench_offload_spill blob=B write_mbps=W read_mbps=R (10^6 bytes/s) */
#include <inttypes.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "clock.h"
#include "options.h"
#include "tests/lib/bare_peers.h"
#include "workers/offload/client.h"

static const char *o_addr;
static uint64_t o_blob, o_bytes, o_fill, o_ahead;
static int64_t o_rounds, o_lat_iters, o_lat_rounds, o_cpu, o_peer_cpu;
static const char *o_lat_dir;
static int o_mode;

enum { MODE_POOL, MODE_SPILL };

static const opt_t opts[] = {
    { "addr", OPT_STRING, "unix:/run/ballast/ballastd.sock", 0, 0, NULL, "ballastd address (unix:/path)", &o_addr },
    { "mode", OPT_ENUM, "pool", 0, 0, "pool|spill", "put+get vs memcpy, or spilling end to end", &o_mode },
    { "blob", OPT_SIZE, "64M", 4096, 1ull << 40, NULL, "bytes per blob", &o_blob },
    { "rounds", OPT_INT, "15", 0, 100000, NULL, "pool: alternated rounds (median, lowest, highest; 0: latency only)",
      &o_rounds },
    { "lat-iters", OPT_INT, "5000", 0, 10000000, NULL, "pool: latency samples of ours and of each baseline (0: none)",
      &o_lat_iters },
    { "lat-rounds", OPT_INT, "8", 1, 1000, NULL, "pool: blocks the latency samples are cut into (median ratio, lowest, "
      "highest)", &o_lat_rounds },
    { "cpu", OPT_INT, "-1", -1, 4095, NULL, "pin this process to this CPU (-1: not pinned)", &o_cpu },
    { "peer-cpu", OPT_INT, "-1", -1, 4095, NULL, "pool: pin the baselines' peers to this CPU (where ballastd runs; -1: "
      "not pinned)", &o_peer_cpu },
    { "lat-dir", OPT_STRING, "/tmp", 0, 0, NULL, "pool: directory for the bare gRPC server's socket", &o_lat_dir },
    { "bytes", OPT_SIZE, "512M", 1 << 20, 1ull << 44, NULL, "spill: bytes put (and read back) timed", &o_bytes },
    { "fill", OPT_SIZE, "256M", 0, 1ull << 44, NULL, "spill: bytes put untimed first (the pool size)", &o_fill },
    { "prefetch", OPT_SIZE, "0", 0, 1ull << 44, NULL, "spill: read back with prefetch hints this many bytes of "
      "blobs ahead of the get (0: none, each get reads its blob itself)", &o_ahead },
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CHECK_OC(call) do { status_t st_ = (call); if (st_) die("%s: %s", #call, oc_last_error()); } while (0)

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void fill_random(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t s = seed | 1;
    for (size_t i = 0; i + 8 <= n; i += 8) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; memcpy(p + i, &s, 8); }
}

static bare_efd_t g_efd;
static bare_grpc_t g_bare;

/* p50 of ours / p50 of the baseline in each of R blocks of L/R pairs:
 * median, lowest, highest (ours and base are reordered). */
static void block_ratios(double *ours, double *base, int64_t L, int R, double q[3]) {
    int64_t per = L / R;
    double *r = malloc((size_t)R * sizeof *r);
    CHECK_ALLOC(r);
    q[1] = 1e30, q[2] = 0;
    for (int b = 0; b < R; b++) {
        r[b] = bare_quantile(ours + b * per, (size_t)per, 0.5) / bare_quantile(base + b * per, (size_t)per, 0.5);
        if (r[b] < q[1]) q[1] = r[b];
        if (r[b] > q[2]) q[2] = r[b];
    }
    q[0] = median(r, R);
    free(r);
}

/* Ring NOPs against the eventfd peer, then Heartbeats against the bare
 * gRPC server, each pair taking turns. */
static void latency(oc_client_t *c) {
    int64_t L = o_lat_iters;
    int R = (int)(o_lat_rounds < L ? o_lat_rounds : L);
    double *a = malloc((size_t)L * sizeof *a), *b = malloc((size_t)L * sizeof *b);
    CHECK_ALLOC(a); CHECK_ALLOC(b);
    double p[2][4], q[2][3];
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = -200; i < L; i++) {
            double ta = 0, tb = 0;
            for (int side = 0; side < 2; side++) {
                if ((side == 0) == (i % 2 == 0)) { /* even pairs: ours first */
                    double t0 = clock_now_s();
                    CHECK_OC(pass ? oc_heartbeat(c) : oc_nop(c));
                    ta = (clock_now_s() - t0) * 1e6;
                } else {
                    tb = pass ? bare_grpc_call_us(&g_bare) : bare_efd_rtt_us(&g_efd);
                }
            }
            if (i >= 0) a[i] = ta, b[i] = tb;
        }
        block_ratios(a, b, L, R, q[pass]);
        p[pass][0] = bare_quantile(a, (size_t)L, 0.5);
        p[pass][1] = bare_quantile(a, (size_t)L, 0.99);
        p[pass][2] = bare_quantile(b, (size_t)L, 0.5);
        p[pass][3] = bare_quantile(b, (size_t)L, 0.99);
    }
    printf("ring round trip (NOP): p50 %.1f us, p99 %.1f us; eventfd ping-pong p50 %.1f us, p99 %.1f us; "
           "p50 ratio %.3f [%.3f, %.3f] over %d blocks\n", p[0][0], p[0][1], p[0][2], p[0][3], q[0][0], q[0][1],
           q[0][2], R);
    printf("control RPC (Heartbeat, unix socket): p50 %.1f us, p99 %.1f us; bare gRPC p50 %.1f us, p99 %.1f us; "
           "p50 ratio %.3f [%.3f, %.3f] over %d blocks\n", p[1][0], p[1][1], p[1][2], p[1][3], q[1][0], q[1][1],
           q[1][2], R);
    printf("RESULT bench_offload_lat ring_p50_us=%.2f ring_p99_us=%.2f efd_p50_us=%.2f efd_p99_us=%.2f ring_ratio=%.3f "
           "ring_lo=%.3f ring_hi=%.3f rpc_p50_us=%.2f rpc_p99_us=%.2f bare_p50_us=%.2f bare_p99_us=%.2f "
           "rpc_ratio=%.3f rpc_lo=%.3f rpc_hi=%.3f\n", p[0][0], p[0][1], p[0][2], p[0][3], q[0][0], q[0][1], q[0][2],
           p[1][0], p[1][1], p[1][2], p[1][3], q[1][0], q[1][1], q[1][2]);
    free(a);
    free(b);
}

/* Put+get vs memcpy in alternated rounds; latency afterwards. */
static int pool_mode(oc_client_t *c) {
    if (o_rounds == 0) {
        if (o_lat_iters > 0) latency(c);
        return 0;
    }
    size_t n = o_blob;
    int reps = n >= (64u << 20) ? 1 : (int)((64u << 20) / n);
    uint8_t *src = malloc(n), *tmp = malloc(n), *dst = malloc(n);
    CHECK_ALLOC(src); CHECK_ALLOC(tmp); CHECK_ALLOC(dst);
    fill_random(src, n, 0x9e3779b97f4a7c15ull);
    memset(tmp, 1, n);
    memset(dst, 2, n);
    int R = (int)o_rounds;
    double *tm = calloc((size_t)R, sizeof *tm), *tp = calloc((size_t)R, sizeof *tp), *q = calloc((size_t)R, sizeof *q);
    CHECK_ALLOC(tm); CHECK_ALLOC(tp); CHECK_ALLOC(q);
    oc_key_t k = { 0, OC_KIND_ACTIVATION, 0, 0 };
    uint64_t idx = 0;
    for (int r = -2; r < R; r++) { /* two warm-up rounds fault the pages in */
        double t_mem = 0, t_pool = 0;
        /* A B B A: whichever side runs first in a pair runs about a fifth
         * faster at 16 MiB here, so each side takes both places in every
         * round (and which one opens the round alternates) */
        for (int slot = 0; slot < 4; slot++) {
            bool do_pool = (slot == 0 || slot == 3) == (r % 2 != 0);
            if (!do_pool) {
                /* timed and checked blob by blob as the pool side is: the
                 * check reads src and dst, which takes the cache from the
                 * buffer in the middle, so both sides must do it */
                for (int j = 0; j < reps; j++) {
                    double t0 = clock_now_s();
                    memcpy(tmp, src, n);
                    memcpy(dst, tmp, n);
                    t_mem += clock_now_s() - t0;
                    if (memcmp(dst, src, n) != 0) die("memcpy corrupted the data (blob %zu bytes)", n);
                    memset(dst, 3, 4096);
                }
                continue;
            }
            for (int j = 0; j < reps; j++) {
                k.index = idx++;
                oc_buf_t b;
                double t0 = clock_now_s();
                CHECK_OC(oc_put_alloc(c, &k, n, false, &b));
                memcpy(b.ptr, src, n);
                CHECK_OC(oc_put_commit(c, &k, &b));
                CHECK_OC(oc_get(c, &k, &b));
                memcpy(dst, b.ptr, n);
                CHECK_OC(oc_get_done(c, &k, &b));
                t_pool += clock_now_s() - t0;
                CHECK_OC(oc_free(c, &k));
                if (memcmp(dst, src, n) != 0) die("pool round trip corrupted the data (blob %zu bytes)", n);
                memset(dst, 3, 4096);
            }
        }
        if (r < 0) continue;
        tm[r] = t_mem;
        tp[r] = t_pool;
        q[r] = t_mem / t_pool;
    }
    double bytes = 4.0 * (double)n * reps; /* per side and round: two turns of reps blobs, each way */
    double mt = median(tm, R), pt = median(tp, R);
    double qlo = 1e30, qhi = 0;
    for (int r = 0; r < R; r++) { if (q[r] < qlo) qlo = q[r]; if (q[r] > qhi) qhi = q[r]; }
    double qm = median(q, R);
    printf("put+get %zu-byte blob, %d rounds of 2 x %d blobs each side: memcpy %.2f GB/s, pool %.2f GB/s (medians), "
           "ratio %.3f [%.3f, %.3f]\n", n, R, reps, bytes / mt / 1e9, bytes / pt / 1e9, qm, qlo, qhi);
    printf("RESULT bench_offload blob=%zu memcpy_gbps=%.3f pool_gbps=%.3f ratio=%.3f lo=%.3f hi=%.3f rounds=%d\n", n,
           bytes / mt / 1e9, bytes / pt / 1e9, qm, qlo, qhi, R);
    free(tm); free(tp); free(q);

    if (o_lat_iters > 0) latency(c);
    free(src); free(tmp); free(dst);
    return 0;
}

/* Put fill then bytes of blobs (the latter timed), read the latter back
 * (timed) and check them. */
static int spill_mode(oc_client_t *c) {
    size_t n = o_blob;
    uint64_t nfill = o_fill / n, nt = o_bytes / n;
    if (nt == 0) die("--bytes %llu holds no --blob of %zu bytes", (unsigned long long)o_bytes, n);
    uint8_t *src = malloc(n), *dst = malloc(n);
    CHECK_ALLOC(src); CHECK_ALLOC(dst);
    fill_random(src, n, 0x2545f4914f6cdd1dull);
    memset(dst, 7, n);
    oc_key_t k = { 0, OC_KIND_ACTIVATION, 0, 0 };
    double t0 = 0;
    for (uint64_t i = 0; i < nfill + nt; i++) {
        if (i == nfill) t0 = clock_now_s();
        k.index = i;
        memcpy(src, &k.index, 8); /* each blob differs */
        oc_buf_t b;
        CHECK_OC(oc_put_alloc(c, &k, n, false, &b));
        memcpy(b.ptr, src, n);
        CHECK_OC(oc_put_commit(c, &k, &b));
    }
    double tw = clock_now_s() - t0;
    uint64_t bad = 0;
    /* a trainer reading activations back for its backward pass hints the
     * next ones while it uses this one: prefetch up to --prefetch bytes of
     * blobs ahead. As workers/offload/act.c does, the hints and the frees
     * go without waiting (their answers are taken later), the get and
     * get_done wait. Timed as fio is, from the first request to the last
     * answer; each blob is checked as it comes by its tag and one word of
     * every 4 KiB page (a full compare would be the bench's own work between
     * gets, holding back the next hint; ballastd checks the crc32c of every
     * read-back), the last one in full. */
    uint64_t ahead = o_ahead / n, hinted = nfill, cap = ahead + 1;
    oc_handle_t *hint_h = calloc(cap, sizeof *hint_h), free_h = 0;
    CHECK_ALLOC(hint_h);
    double t1 = clock_now_s();
    for (uint64_t i = nfill; i < nfill + nt; i++) {
        k.index = i;
        oc_buf_t b;
        for (; hinted < nfill + nt && hinted <= i + ahead; hinted++) {
            if (hinted == i) continue; /* the get reads it */
            oc_key_t h = k;
            h.index = hinted;
            oc_handle_t *slot = &hint_h[hinted % cap];
            if (*slot) CHECK_OC(oc_wait(c, *slot, NULL, -1));
            CHECK_OC(oc_prefetch_async(c, &h, slot));
        }
        if (hint_h[i % cap]) { CHECK_OC(oc_wait(c, hint_h[i % cap], NULL, -1)); hint_h[i % cap] = 0; }
        CHECK_OC(oc_get(c, &k, &b));
        uint64_t got = b.len; /* get_done clears b */
        memcpy(dst, b.ptr, n);
        CHECK_OC(oc_get_done(c, &k, &b));
        if (free_h) CHECK_OC(oc_wait(c, free_h, NULL, -1));
        CHECK_OC(oc_free_async(c, &k, &free_h));
        memcpy(src, &k.index, 8);
        bool same = got == n && memcmp(dst, src, n < 64 ? n : 64) == 0;
        for (size_t p = 4096; same && p + 8 <= n; p += 4096) {
            size_t at = p + (p / 4096 * 8) % 4088;
            same = memcmp(dst + at, src + at, 8) == 0;
        }
        if (same && i + 1 == nfill + nt) same = memcmp(dst, src, n) == 0;
        if (!same) bad++;
    }
    if (free_h) CHECK_OC(oc_wait(c, free_h, NULL, -1));
    for (uint64_t j = 0; j < cap; j++)
        if (hint_h[j]) CHECK_OC(oc_wait(c, hint_h[j], NULL, -1));
    double tr = clock_now_s() - t1;
    free(hint_h);
    if (bad) die("spill: %llu of %llu blobs came back different", (unsigned long long)bad, (unsigned long long)nt);
    double mb = (double)(nt * n) / 1e6;
    printf("spill through ballastd, %zu-byte blobs, %.0f MB after %.0f MB of fill: write %.1f MB/s, read-back "
           "%.1f MB/s with %llu blob(s) prefetched ahead (all %llu blobs checked: tag and a word per 4 KiB page, "
           "the last in full)\n", n, mb, (double)(nfill * n) / 1e6, mb / tw, mb / tr, (unsigned long long)ahead,
           (unsigned long long)nt);
    printf("RESULT bench_offload_spill blob=%zu write_mbps=%.1f read_mbps=%.1f\n", n, mb / tw, mb / tr);
    free(src); free(dst);
    return 0;
}

int main(int argc, char **argv) {
    log_init("bench_offload", -1);
    char err[OPT_ERR_LEN];
    int npos = 0;
    int rc = opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, NULL, 0, &npos,
                       "usage: bench_offload --addr unix:/path [--blob 64M]", err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) die("%s", err);
    /* the baselines' peers are forked before any thread exists */
    bool lat = o_mode == MODE_POOL && o_lat_iters > 0;
    if (lat) {
        bare_efd_start(&g_efd, (int)o_peer_cpu);
        bare_grpc_start(&g_bare, o_lat_dir, (int)o_peer_cpu, 16);
    }
    /* before oc_open: its threads inherit the CPU */
    if (o_cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)o_cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0)
            die("--cpu %lld: %s (see nproc for the CPUs there are)", (long long)o_cpu, strerror(errno));
    }
    oc_options_t o = { 0 };
    o.addr = o_addr;
    o.job = "bench";
    o.client_name = "bench_offload";
    oc_client_t *c = NULL;
    if (lat) bare_grpc_connect(&g_bare);
    if (oc_open(&o, &c)) die("%s", oc_last_error());
    if (!oc_is_shared(c)) die("bench_offload needs shared-memory mode (a unix: address)");
    int rc2 = o_mode == MODE_SPILL ? spill_mode(c) : pool_mode(c);
    oc_close(c, false);
    if (lat) {
        bare_grpc_stop(&g_bare);
        bare_efd_stop(&g_efd);
    }
    return rc2;
}
