/* ring_stress.c: pass N entries through a request/completion ring pair
 * between two threads or two processes (tests/ring_traffic.h) and report.
 * Run by tests/integration/ring_stress.sh; it exists as a plain program so
 * that `make tsan` can check the ring under ThreadSanitizer, which Criterion
 * cannot start under.
 *
 *   ring_stress threads|fork [N=1000000] [CAPACITY=64] [SEED]
 * Exit status 0 when every entry and completion arrived once, in order,
 * with a matching checksum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

#include "tests/ring_traffic.h"

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "threads") && strcmp(argv[1], "fork"))) {
        fprintf(stderr, "usage: %s threads|fork [N=1000000] [CAPACITY=64] [SEED]\n", argv[0]);
        return 2;
    }
    uint64_t n = argc > 2 ? strtoull(argv[2], NULL, 0) : 1000000;
    uint32_t cap = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 0) : 64;
    uint64_t seed = argc > 4 ? strtoull(argv[4], NULL, 0) : (uint64_t)time(NULL) * 2654435761u;
    if (n == 0 || ring_bytes(cap, sizeof(traffic_req_t)) == 0) {
        fprintf(stderr, "ring_stress: N must be > 0 and CAPACITY a power of two (got %llu, %u)\n",
                (unsigned long long)n, cap);
        return 2;
    }
    char err[256] = "";
    traffic_stats_t st = { 0 };
    double a = clock_now_s();
    int rc = strcmp(argv[1], "fork") == 0 ? traffic_fork(n, cap, seed, &st, err, sizeof err)
                                          : traffic_threads(n, cap, seed, &st, err, sizeof err);
    double s = clock_now_s() - a;
    if (rc) {
        fprintf(stderr, "ring_stress %s: FAILED (seed %llu): %s\n", argv[1],
                (unsigned long long)seed, err);
        return 1;
    }
    if (st.req_full == 0) {
        fprintf(stderr, "ring_stress %s: the request ring never filled up; the full path did "
                "not run\n", argv[1]);
        return 1;
    }
    printf("ring_stress %s: %llu entries, %u-entry rings, %.2f s (%.2f M entries/s); full %llu, "
           "producer woke %llu+%llu, consumer waited %llu\n", argv[1], (unsigned long long)n, cap,
           s, (double)n / s / 1e6, (unsigned long long)st.req_full,
           (unsigned long long)st.req_sleeps, (unsigned long long)st.cpl_sleeps,
           (unsigned long long)st.cons_sleeps);
    return 0;
}
