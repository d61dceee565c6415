/* bare_peers.c: see bare_peers.h. */
#include "tests/lib/bare_peers.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "clock.h"
#include "log.h"

#define BARE_METHOD "/bench.Bare/Echo"

void bare_pin(int cpu, const char *who) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        die("pinning the %s to CPU %d: %s (see nproc for the CPUs there are)", who, cpu, strerror(errno));
}

/* In a forked peer: die with the parent (which may already be gone). */
static void peer_setup(pid_t parent, int cpu, const char *who) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    bare_pin(cpu, who);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bare_quantile(double *v, size_t n, double q) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_d);
    size_t i = (size_t)((double)n * q);
    return v[i < n ? i : n - 1];
}

/* ---- eventfd ping-pong ---- */

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

void bare_efd_start(bare_efd_t *e, int cpu) {
    e->ping = eventfd(0, EFD_CLOEXEC);
    e->pong = eventfd(0, EFD_CLOEXEC);
    if (e->ping < 0 || e->pong < 0) die("eventfd: %s", strerror(errno));
    pid_t parent = getpid();
    e->pid = fork();
    if (e->pid < 0) die("fork: %s", strerror(errno));
    if (e->pid == 0) {
        peer_setup(parent, cpu, "eventfd peer");
        for (;;) { /* until killed */
            efd_read(e->ping);
            efd_write(e->pong);
        }
    }
}

double bare_efd_rtt_us(bare_efd_t *e) {
    double t0 = clock_now_s();
    efd_write(e->ping);
    efd_read(e->pong);
    return (clock_now_s() - t0) * 1e6;
}

void bare_efd_stop(bare_efd_t *e) {
    if (e->pid > 0) {
        kill(e->pid, SIGKILL);
        waitpid(e->pid, NULL, 0);
    }
    close(e->ping);
    close(e->pong);
    e->pid = 0;
}

/* ---- bare gRPC echo ---- */

static gpr_timespec forever(void) { return gpr_inf_future(GPR_CLOCK_REALTIME); }

/* Wait for tag on a next-queue; dies on anything else. */
static void next_tag(grpc_completion_queue *cq, void *tag, const char *what) {
    grpc_event ev = grpc_completion_queue_next(cq, forever(), NULL);
    if (ev.type != GRPC_OP_COMPLETE || ev.tag != tag) die("bare server: %s: unexpected event %d", what, (int)ev.type);
}

/* The server: echo every call, one at a time, until killed. It serves what
 * a careful C-core server does for a known unary method: the method is
 * registered with its request read into the call (so one event brings the
 * call and its message), and one batch answers it: initial metadata, the
 * echo, the status and the close. */
void bare_grpc_serve(const char *addr, int ready_fd) {
    grpc_init();
    grpc_server *srv = grpc_server_create(NULL, NULL);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv, cq, NULL);
    void *mh = grpc_server_register_method(srv, BARE_METHOD, NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (!mh) die("bare server: cannot register %s", BARE_METHOD);
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    if (!grpc_server_add_http2_port(srv, addr, cr)) die("bare server: cannot listen on %s", addr);
    grpc_server_credentials_release(cr);
    grpc_server_start(srv);
    if (write(ready_fd, "r", 1) != 1) die("bare server: cannot report readiness");
    close(ready_fd);
    for (;;) {
        grpc_call *call = NULL;
        gpr_timespec deadline;
        grpc_metadata_array md;
        grpc_byte_buffer *req = NULL;
        grpc_metadata_array_init(&md);
        int t_new, t_io;
        if (grpc_server_request_registered_call(srv, mh, &call, &deadline, &md, &req, cq, cq, &t_new) != GRPC_CALL_OK)
            die("bare server: request_registered_call failed");
        next_tag(cq, &t_new, "waiting for a call");
        int cancelled = 0;
        grpc_op ops[4];
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = req;
        ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
        ops[3].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[3].data.recv_close_on_server.cancelled = &cancelled;
        if (grpc_call_start_batch(call, ops, req ? 4 : 3, &t_io, NULL) != GRPC_CALL_OK) die("bare server: answer batch");
        next_tag(cq, &t_io, "answering");
        if (req) grpc_byte_buffer_destroy(req);
        grpc_call_unref(call);
        grpc_metadata_array_destroy(&md);
    }
}

/* The server runs as its own program (bench_grpc_bare --serve, found next
 * to this one), not as a bare fork of it: a forked copy would share this
 * process's address layout, so on one CPU its gRPC code would run at the
 * very addresses the client's just trained the branch predictors on, which
 * no separate service (ballastd) gets. */
static void server_path(char *out, size_t n) {
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) die("bare server: cannot read /proc/self/exe: %s", strerror(errno));
    self[k] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    if ((size_t)snprintf(out, n, "%s/bench_grpc_bare", slash ? self : ".") >= n)
        die("bare server: path of bench_grpc_bare too long");
    if (access(out, X_OK) != 0)
        die("bare server: %s: %s (build it: make)", out, strerror(errno));
}

void bare_grpc_start(bare_grpc_t *g, const char *dir, int cpu, size_t bytes) {
    static int count;
    memset(g, 0, sizeof *g);
    g->bytes = bytes;
    snprintf(g->path, sizeof g->path, "%s/bare-%d-%d.sock", dir, (int)getpid(), count++);
    snprintf(g->addr, sizeof g->addr, "unix:%s", g->path);
    char exe[4200];
    server_path(exe, sizeof exe);
    int pfd[2];
    if (pipe(pfd) != 0) die("pipe: %s", strerror(errno));
    pid_t parent = getpid();
    g->pid = fork(); /* before this process's grpc_init: gRPC's threads do not survive a fork */
    if (g->pid < 0) die("fork: %s", strerror(errno));
    if (g->pid == 0) {
        close(pfd[0]);
        peer_setup(parent, cpu, "bare gRPC server"); /* the pin and the death signal outlive exec */
        char fd[16];
        snprintf(fd, sizeof fd, "%d", pfd[1]);
        execl(exe, "bench_grpc_bare", "--serve", g->addr, "--ready-fd", fd, (char *)NULL);
        fprintf(stderr, "bare server: exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    char c;
    if (read(pfd[0], &c, 1) != 1) {
        waitpid(g->pid, NULL, 0);
        die("the bare gRPC server did not start on %s", g->addr);
    }
    close(pfd[0]);
}

void bare_grpc_connect(bare_grpc_t *g) {
    grpc_init();
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(g->addr, cr, NULL);
    grpc_channel_credentials_release(cr);
    g->ch = ch;
    g->method = grpc_channel_register_call(ch, BARE_METHOD, NULL, NULL);
    g->cq = grpc_completion_queue_create_for_pluck(NULL);
    g->payload = malloc(g->bytes + 1);
    CHECK_ALLOC(g->payload);
    for (size_t i = 0; i < g->bytes; i++) g->payload[i] = (char)('a' + i % 26);
}

double bare_grpc_call_us(bare_grpc_t *g) {
    double t0 = clock_now_s();
    gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(10000, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_registered_call(g->ch, NULL, GRPC_PROPAGATE_DEFAULTS, g->cq, g->method,
                                                          dl, NULL);
    grpc_slice s = grpc_slice_from_copied_buffer(g->payload, g->bytes);
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
    if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) die("bare client: cannot start a call");
    grpc_event ev = grpc_completion_queue_pluck(g->cq, &tag, forever(), NULL);
    if (ev.type != GRPC_OP_COMPLETE || !ev.success || st != GRPC_STATUS_OK || !resp)
        die("bare client: a call to %s failed (status %d)", g->addr, (int)st);
    if (grpc_byte_buffer_length(resp) != g->bytes) die("bare client: echo of the wrong length");
    grpc_byte_buffer_destroy(resp);
    grpc_byte_buffer_destroy(req);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&im);
    grpc_metadata_array_destroy(&tm);
    grpc_call_unref(call);
    return (clock_now_s() - t0) * 1e6;
}

void bare_grpc_stop(bare_grpc_t *g) {
    if (g->ch) {
        grpc_completion_queue_shutdown(g->cq);
        grpc_completion_queue_destroy(g->cq);
        grpc_channel_destroy(g->ch);
        grpc_shutdown();
        g->ch = NULL;
    }
    if (g->pid > 0) {
        kill(g->pid, SIGKILL);
        waitpid(g->pid, NULL, 0);
        g->pid = 0;
    }
    unlink(g->path);
    free(g->payload);
    g->payload = NULL;
}
