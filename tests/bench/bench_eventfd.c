/* bench_eventfd.c: the baseline of the ring round trip: a bare eventfd
 * ping-pong between two processes, each side blocking in read(2) until the
 * other writes, with no ring and no spinning.
 *
 *   bench_eventfd [--iters N] [--cpu C] [--peer-cpu P]
 *
 * --cpu / --peer-cpu pin this process and the forked peer to one CPU each
 * (sched_setaffinity; -1 leaves them where the scheduler puts them), as
 * tests/bench/offload.sh pins the client and ballastd. Prints the median and
 * 99th percentile round trip:
 *   RESULT bench_eventfd p50_us=.. p99_us=.. cpu=C peer_cpu=P */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "options.h"

static int64_t o_iters, o_cpu, o_peer_cpu;

static const opt_t opts[] = {
    { "iters", OPT_INT, "5000", 10, 10000000, NULL, "round trips timed (after 200 untimed)", &o_iters },
    { "cpu", OPT_INT, "-1", -1, 4095, NULL, "CPU of this process (-1: not pinned)", &o_cpu },
    { "peer-cpu", OPT_INT, "-1", -1, 4095, NULL, "CPU of the peer process (-1: not pinned)", &o_peer_cpu },
};

static void pin(int64_t cpu, const char *who) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        die("pinning the %s to CPU %lld: %s (see nproc for the CPUs there are)", who, (long long)cpu, strerror(errno));
}

static void efd_write(int fd) {
    uint64_t one = 1;
    while (write(fd, &one, sizeof one) < 0)
        if (errno != EINTR) die("eventfd write: %s", strerror(errno));
}

static void efd_read(int fd) {
    uint64_t v;
    while (read(fd, &v, sizeof v) < 0)
        if (errno != EINTR) die("eventfd read: %s", strerror(errno));
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    log_init("bench_eventfd", -1);
    char err[OPT_ERR_LEN];
    int npos = 0;
    int rc = opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, NULL, 0, &npos,
                       "usage: bench_eventfd [--iters N] [--cpu C] [--peer-cpu P]", err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) die("%s", err);
    int ping = eventfd(0, EFD_CLOEXEC), pong = eventfd(0, EFD_CLOEXEC);
    if (ping < 0 || pong < 0) die("eventfd: %s", strerror(errno));
    int64_t total = o_iters + 200;
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        pin(o_peer_cpu, "peer");
        for (int64_t i = 0; i < total; i++) {
            efd_read(ping);
            efd_write(pong);
        }
        _exit(0);
    }
    pin(o_cpu, "client");
    double *lat = malloc((size_t)o_iters * sizeof *lat);
    CHECK_ALLOC(lat);
    for (int64_t i = 0; i < total; i++) {
        double t0 = clock_now_s();
        efd_write(ping);
        efd_read(pong);
        if (i >= 200) lat[i - 200] = (clock_now_s() - t0) * 1e6;
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("the peer process failed (status %d)", st);
    qsort(lat, (size_t)o_iters, sizeof *lat, cmp_d);
    double p50 = lat[o_iters / 2], p99 = lat[o_iters * 99 / 100];
    printf("bare eventfd ping-pong: p50 %.1f us, p99 %.1f us (%lld round trips, cpu %lld, peer cpu %lld)\n", p50,
           p99, (long long)o_iters, (long long)o_cpu, (long long)o_peer_cpu);
    printf("RESULT bench_eventfd p50_us=%.2f p99_us=%.2f cpu=%lld peer_cpu=%lld\n", p50, p99, (long long)o_cpu,
           (long long)o_peer_cpu);
    free(lat);
    return 0;
}
