/* bench_eventfd.c: the baseline of the ring round trip: a bare eventfd
 * ping-pong between two processes, each side blocking in read(2) until the
 * other writes, with no ring and no spinning (tests/lib/bare_peers.c).
 *
 *   bench_eventfd [--iters N] [--cpu C] [--peer-cpu P]
 *
 * --cpu / --peer-cpu pin this process and the forked peer to one CPU each
 * (sched_setaffinity; -1 leaves them where the scheduler puts them). Prints
 * the median and 99th percentile round trip:
 *   RESULT bench_eventfd p50_us=.. p99_us=.. cpu=C peer_cpu=P
 * bench_offload --lat-iters runs the same peer interleaved with the ring's
 * round trips, which is the comparison tests/bench/offload.sh reports. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "options.h"
#include "tests/lib/bare_peers.h"

static int64_t o_iters, o_cpu, o_peer_cpu;

static const opt_t opts[] = {
    { "iters", OPT_INT, "5000", 10, 10000000, NULL, "round trips timed (after 200 untimed)", &o_iters },
    { "cpu", OPT_INT, "-1", -1, 4095, NULL, "CPU of this process (-1: not pinned)", &o_cpu },
    { "peer-cpu", OPT_INT, "-1", -1, 4095, NULL, "CPU of the peer process (-1: not pinned)", &o_peer_cpu },
};

int main(int argc, char **argv) {
    log_init("bench_eventfd", -1);
    char err[OPT_ERR_LEN];
    int npos = 0;
    int rc = opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, NULL, 0, &npos,
                       "usage: bench_eventfd [--iters N] [--cpu C] [--peer-cpu P]", err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) die("%s", err);
    bare_efd_t e;
    bare_efd_start(&e, (int)o_peer_cpu);
    bare_pin((int)o_cpu, "client");
    double *lat = malloc((size_t)o_iters * sizeof *lat);
    CHECK_ALLOC(lat);
    for (int i = 0; i < 200; i++) bare_efd_rtt_us(&e);
    for (int64_t i = 0; i < o_iters; i++) lat[i] = bare_efd_rtt_us(&e);
    bare_efd_stop(&e);
    double p50 = bare_quantile(lat, (size_t)o_iters, 0.5), p99 = bare_quantile(lat, (size_t)o_iters, 0.99);
    printf("bare eventfd ping-pong: p50 %.1f us, p99 %.1f us (%lld round trips, cpu %lld, peer cpu %lld)\n", p50,
           p99, (long long)o_iters, (long long)o_cpu, (long long)o_peer_cpu);
    printf("RESULT bench_eventfd p50_us=%.2f p99_us=%.2f cpu=%lld peer_cpu=%lld\n", p50, p99, (long long)o_cpu,
           (long long)o_peer_cpu);
    free(lat);
    return 0;
}
