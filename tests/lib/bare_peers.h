/* bare_peers.h: the baselines the offload benchmarks set our latency
 * beside, as forked peer processes that nothing of ours runs in:
 *
 *   - an eventfd ping-pong peer (the ring round trip's baseline): it blocks
 *     in read(2) on one eventfd and answers on another, no ring, no spin;
 *   - a bare gRPC C-core echo server on a Unix socket (the control RPC's
 *     baseline): one completion queue, one thread, the method registered
 *     with its request read in, every request echoed in one batch; it runs
 *     as its own program (bench_grpc_bare --serve, exec'd from the fork),
 *     as ballastd does, so that it shares no address layout with the
 *     client;
 *     its client side is what a careful client does (one channel, one pluck
 *     queue for all calls, a registered method, the same six-op batch as
 *     common/rpc.c sends).
 *
 * Both are forked, so start them before this process starts any thread
 * (gRPC's included: call bare_grpc_start before grpc_init or anything that
 * opens a channel); bare_grpc_connect then opens the client side. Each peer
 * dies with this process (PR_SET_PDEATHSIG) and is pinned to a CPU when
 * cpu >= 0. Errors die() with the reason. */
#ifndef BALLAST_TESTS_BARE_PEERS_H
#define BALLAST_TESTS_BARE_PEERS_H

#include <stddef.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    int ping, pong;            /* eventfds: to the peer, back from it */
} bare_efd_t;

typedef struct {
    pid_t pid;
    char path[4200];           /* the socket file */
    char addr[4300];           /* unix:<path> */
    size_t bytes;              /* request (and echo) size */
    char *payload;
    void *ch, *cq, *method;    /* client side, after bare_grpc_connect */
} bare_grpc_t;

/* Pin the calling thread to cpu (cpu < 0: leave it); who names it in the
 * error. */
void bare_pin(int cpu, const char *who);

void bare_efd_start(bare_efd_t *e, int cpu);
double bare_efd_rtt_us(bare_efd_t *e);          /* one round trip, microseconds */
void bare_efd_stop(bare_efd_t *e);

/* Fork and exec the echo server (bench_grpc_bare --serve, in this
 * program's directory) on dir/bare-PID-N.sock and wait until it listens. */
void bare_grpc_start(bare_grpc_t *g, const char *dir, int cpu, size_t bytes);
void bare_grpc_connect(bare_grpc_t *g);          /* grpc_init + channel; once */
double bare_grpc_call_us(bare_grpc_t *g);       /* one unary call, microseconds */
void bare_grpc_stop(bare_grpc_t *g);            /* channel closed, server killed, socket removed */

/* The echo server itself (bench_grpc_bare --serve): listens on addr,
 * writes one byte to ready_fd once it does, then serves until killed. */
void bare_grpc_serve(const char *addr, int ready_fd);

/* Sort v[n] and give its q-quantile (0.5: median). */
double bare_quantile(double *v, size_t n, double q);

#endif
