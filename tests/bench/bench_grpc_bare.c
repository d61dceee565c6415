/* bench_grpc_bare.c: the baseline of the control RPC: a bare unary call
 * over a Unix socket with the gRPC C core API and nothing of ours (no
 * protobuf, no peer checks, no handler table), to set beside
 * bench_offload's Heartbeat through ballastd.
 *
 *   bench_grpc_bare [--iters N] [--bytes B] [--cpu C] [--peer-cpu P] [--dir D]
 *
 * A forked child serves one method on unix:<dir>/bare-PID.sock: it asks for
 * calls on its completion queue and answers each with the request's bytes
 * echoed. The parent calls it --iters times, one call in flight, with what a
 * careful client does: one channel, one pluck completion queue for all calls
 * and a registered method; each call is the same one batch of six ops as
 * common/rpc.c sends. --cpu / --peer-cpu pin the two processes (-1: not
 * pinned). Prints p50 and p99:
 *   RESULT bench_grpc_bare p50_us=.. p99_us=.. cpu=C peer_cpu=P */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "clock.h"
#include "log.h"
#include "options.h"

#define METHOD "/bench.Bare/Echo"

static int64_t o_iters, o_bytes, o_cpu, o_peer_cpu;
static const char *o_dir;

static const opt_t opts[] = {
    { "iters", OPT_INT, "5000", 10, 10000000, NULL, "calls timed (after 200 untimed)", &o_iters },
    { "bytes", OPT_INT, "16", 0, 1 << 20, NULL, "request (and echoed response) bytes", &o_bytes },
    { "cpu", OPT_INT, "-1", -1, 4095, NULL, "CPU of the client (-1: not pinned)", &o_cpu },
    { "peer-cpu", OPT_INT, "-1", -1, 4095, NULL, "CPU of the server (-1: not pinned)", &o_peer_cpu },
    { "dir", OPT_STRING, "/tmp", 0, 0, NULL, "directory for the socket", &o_dir },
};

static void pin(int64_t cpu, const char *who) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        die("pinning the %s to CPU %lld: %s (see nproc for the CPUs there are)", who, (long long)cpu, strerror(errno));
}

static gpr_timespec forever(void) { return gpr_inf_future(GPR_CLOCK_REALTIME); }

/* Wait for tag on a next-queue; dies on anything else. */
static void next_tag(grpc_completion_queue *cq, void *tag, const char *what) {
    grpc_event ev = grpc_completion_queue_next(cq, forever(), NULL);
    if (ev.type != GRPC_OP_COMPLETE || ev.tag != tag) die("server: %s: unexpected event %d", what, (int)ev.type);
}

/* The server: echo every call until the parent goes away. */
static void serve(const char *addr, int ready_fd) {
    grpc_init();
    grpc_server *srv = grpc_server_create(NULL, NULL);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv, cq, NULL);
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    if (!grpc_server_add_http2_port(srv, addr, cr)) die("server: cannot listen on %s", addr);
    grpc_server_credentials_release(cr);
    grpc_server_start(srv);
    if (write(ready_fd, "r", 1) != 1) die("server: cannot report readiness");
    close(ready_fd);
    for (;;) {
        grpc_call *call = NULL;
        grpc_call_details det;
        grpc_metadata_array md;
        grpc_call_details_init(&det);
        grpc_metadata_array_init(&md);
        int t_new, t_io;
        if (grpc_server_request_call(srv, &call, &det, &md, cq, cq, &t_new) != GRPC_CALL_OK)
            die("server: request_call failed");
        next_tag(cq, &t_new, "waiting for a call");
        grpc_byte_buffer *req = NULL;
        grpc_op ops[4];
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_RECV_MESSAGE;
        ops[1].data.recv_message.recv_message = &req;
        if (grpc_call_start_batch(call, ops, 2, &t_io, NULL) != GRPC_CALL_OK) die("server: receive batch");
        next_tag(cq, &t_io, "receiving");
        int cancelled = 0;
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_MESSAGE;
        ops[0].data.send_message.send_message = req;
        ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[1].data.send_status_from_server.status = GRPC_STATUS_OK;
        ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[2].data.recv_close_on_server.cancelled = &cancelled;
        if (grpc_call_start_batch(call, ops, 3, &t_io, NULL) != GRPC_CALL_OK) die("server: send batch");
        next_tag(cq, &t_io, "answering");
        if (req) grpc_byte_buffer_destroy(req);
        grpc_call_unref(call);
        grpc_call_details_destroy(&det);
        grpc_metadata_array_destroy(&md);
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    log_init("bench_grpc_bare", -1);
    char err[OPT_ERR_LEN];
    int npos = 0;
    int rc = opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, NULL, 0, &npos,
                       "usage: bench_grpc_bare [--iters N] [--cpu C] [--peer-cpu P] [--dir D]", err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) die("%s", err);
    char path[4200], addr[4300];
    snprintf(path, sizeof path, "%s/bare-%d.sock", o_dir, (int)getpid());
    snprintf(addr, sizeof addr, "unix:%s", path);
    int pfd[2];
    if (pipe(pfd) != 0) die("pipe: %s", strerror(errno));
    pid_t pid = fork(); /* before grpc_init: gRPC's threads do not survive a fork */
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(pfd[0]);
        pin(o_peer_cpu, "server");
        serve(addr, pfd[1]);
        _exit(0);
    }
    close(pfd[1]);
    char c;
    if (read(pfd[0], &c, 1) != 1) {
        waitpid(pid, NULL, 0);
        die("the bare gRPC server did not start on %s", addr);
    }
    close(pfd[0]);
    pin(o_cpu, "client");

    grpc_init();
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(addr, cr, NULL);
    grpc_channel_credentials_release(cr);
    void *mh = grpc_channel_register_call(ch, METHOD, NULL, NULL);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    char *payload = malloc((size_t)o_bytes + 1);
    CHECK_ALLOC(payload);
    for (int64_t i = 0; i < o_bytes; i++) payload[i] = (char)('a' + i % 26);
    int64_t total = o_iters + 200;
    double *lat = malloc((size_t)o_iters * sizeof *lat);
    CHECK_ALLOC(lat);
    for (int64_t i = 0; i < total; i++) {
        double t0 = clock_now_s();
        gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(10000, GPR_TIMESPAN));
        grpc_call *call = grpc_channel_create_registered_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, mh, dl, NULL);
        grpc_slice s = grpc_slice_from_copied_buffer(payload, (size_t)o_bytes);
        grpc_byte_buffer *req = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        grpc_metadata_array im, tm;
        grpc_metadata_array_init(&im);
        grpc_metadata_array_init(&tm);
        grpc_byte_buffer *resp = NULL;
        grpc_status_code st = GRPC_STATUS_UNKNOWN;
        grpc_slice details = grpc_empty_slice();
        grpc_op ops[6];
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[0].flags = GRPC_INITIAL_METADATA_WAIT_FOR_READY_EXPLICITLY_SET | GRPC_INITIAL_METADATA_WAIT_FOR_READY;
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = req;
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[3].data.recv_initial_metadata.recv_initial_metadata = &im;
        ops[4].op = GRPC_OP_RECV_MESSAGE;
        ops[4].data.recv_message.recv_message = &resp;
        ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[5].data.recv_status_on_client.trailing_metadata = &tm;
        ops[5].data.recv_status_on_client.status = &st;
        ops[5].data.recv_status_on_client.status_details = &details;
        int tag;
        if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) die("client: cannot start a call");
        grpc_event ev = grpc_completion_queue_pluck(cq, &tag, forever(), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success || st != GRPC_STATUS_OK || !resp)
            die("client: call %lld failed (status %d)", (long long)i, (int)st);
        if (grpc_byte_buffer_length(resp) != (size_t)o_bytes) die("client: echo of the wrong length");
        grpc_byte_buffer_destroy(resp);
        grpc_byte_buffer_destroy(req);
        grpc_slice_unref(details);
        grpc_metadata_array_destroy(&im);
        grpc_metadata_array_destroy(&tm);
        grpc_call_unref(call);
        if (i >= 200) lat[i - 200] = (clock_now_s() - t0) * 1e6;
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unlink(path);
    qsort(lat, (size_t)o_iters, sizeof *lat, cmp_d);
    double p50 = lat[o_iters / 2], p99 = lat[o_iters * 99 / 100];
    printf("bare gRPC C-core unary call (unix socket, %lld-byte echo): p50 %.1f us, p99 %.1f us (%lld calls)\n",
           (long long)o_bytes, p50, p99, (long long)o_iters);
    printf("RESULT bench_grpc_bare p50_us=%.2f p99_us=%.2f cpu=%lld peer_cpu=%lld\n", p50, p99, (long long)o_cpu,
           (long long)o_peer_cpu);
    free(lat);
    free(payload);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
    grpc_shutdown();
    return 0;
}
