/* bench_grpc_bare.c: the baseline of the control RPC: a bare unary call
 * over a Unix socket with the gRPC C core API and nothing of ours (no
 * protobuf, no peer checks, no handler table; tests/lib/bare_peers.c).
 *
 *   bench_grpc_bare [--iters N] [--bytes B] [--cpu C] [--peer-cpu P] [--dir D]
 *   bench_grpc_bare --serve unix:PATH --ready-fd FD
 *
 * A child (this program again, with --serve) serves one method on
 * unix:<dir>/bare-PID-0.sock and echoes each request; this process calls it
 * --iters times, one call in flight. --serve is that server alone: it
 * writes a byte to FD once it listens.
 * --cpu / --peer-cpu pin the two processes (-1: not pinned). Prints p50 and
 * p99:
 *   RESULT bench_grpc_bare p50_us=.. p99_us=.. cpu=C peer_cpu=P
 * bench_offload --lat-iters runs the same server interleaved with its
 * Heartbeat calls, which is the comparison tests/bench/offload.sh reports. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "options.h"
#include "tests/lib/bare_peers.h"

static int64_t o_iters, o_bytes, o_cpu, o_peer_cpu, o_ready_fd;
static const char *o_dir, *o_serve;

static const opt_t opts[] = {
    { "iters", OPT_INT, "5000", 10, 10000000, NULL, "calls timed (after 200 untimed)", &o_iters },
    { "bytes", OPT_INT, "16", 0, 1 << 20, NULL, "request (and echoed response) bytes", &o_bytes },
    { "cpu", OPT_INT, "-1", -1, 4095, NULL, "CPU of the client (-1: not pinned)", &o_cpu },
    { "peer-cpu", OPT_INT, "-1", -1, 4095, NULL, "CPU of the server (-1: not pinned)", &o_peer_cpu },
    { "dir", OPT_STRING, "/tmp", 0, 0, NULL, "directory for the socket", &o_dir },
    { "serve", OPT_STRING, "", 0, 0, NULL, "only serve on this unix: address (the child's mode)", &o_serve },
    { "ready-fd", OPT_INT, "-1", -1, 1 << 20, NULL, "with --serve: descriptor to report readiness on", &o_ready_fd },
};

int main(int argc, char **argv) {
    log_init("bench_grpc_bare", -1);
    char err[OPT_ERR_LEN];
    int npos = 0;
    int rc = opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, NULL, 0, &npos,
                       "usage: bench_grpc_bare [--iters N] [--bytes B] [--cpu C] [--peer-cpu P] [--dir D] | --serve unix:PATH --ready-fd FD", err,
                       sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) die("%s", err);
    if (*o_serve) {
        if (strncmp(o_serve, "unix:", 5) != 0) die("--serve %s: give a unix:PATH address", o_serve);
        if (o_ready_fd < 0) die("--serve needs --ready-fd: the descriptor its starter waits on");
        bare_grpc_serve(o_serve, (int)o_ready_fd);
        return 0;
    }
    bare_grpc_t g;
    bare_grpc_start(&g, o_dir, (int)o_peer_cpu, (size_t)o_bytes);
    bare_pin((int)o_cpu, "client");
    bare_grpc_connect(&g);
    double *lat = malloc((size_t)o_iters * sizeof *lat);
    CHECK_ALLOC(lat);
    for (int i = 0; i < 200; i++) bare_grpc_call_us(&g);
    for (int64_t i = 0; i < o_iters; i++) lat[i] = bare_grpc_call_us(&g);
    bare_grpc_stop(&g);
    double p50 = bare_quantile(lat, (size_t)o_iters, 0.5), p99 = bare_quantile(lat, (size_t)o_iters, 0.99);
    printf("bare gRPC C-core unary call (unix socket, %lld-byte echo): p50 %.1f us, p99 %.1f us (%lld calls)\n",
           (long long)o_bytes, p50, p99, (long long)o_iters);
    printf("RESULT bench_grpc_bare p50_us=%.2f p99_us=%.2f cpu=%lld peer_cpu=%lld\n", p50, p99, (long long)o_cpu,
           (long long)o_peer_cpu);
    free(lat);
    return 0;
}
