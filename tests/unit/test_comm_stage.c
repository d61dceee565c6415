/* test_comm_stage.c: collectives on backend memory through host staging
 * (workers/comm/stage.h), across forked processes.
 *
 * The "device" is a test backend whose memory holds every byte XOR 0x5A
 * (to_host / from_host undo and apply it), so a wrapper that handed device
 * bytes to the host collective, or skipped a copy, gives wrong bits. Each of
 * 4 ranks runs every collective (all_gather, reduce_scatter, all_reduce,
 * broadcast, barrier; fp32 and bf16; seeded random lengths, in and out of
 * place) once through a staged communicator on device buffers and once
 * directly on a second shm group with host buffers; the two outputs must be
 * the same bits. The staging buffer must come from host_alloc. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/comm_check.h"
#include "workers/backend/backend.h"
#include "workers/comm/stage.h"

#define SLOT 4096

static backend_t g_dev;         /* backend_cpu with scrambled memory */
static int g_host_allocs;

static void scramble_copy(void *dst, const void *src, size_t n) {
    const unsigned char *s = src;
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = s[i] ^ 0x5A;
}
static void *count_host_alloc(size_t bytes) {
    g_host_allocs++;
    return calloc(1, bytes ? bytes : 1);
}
static void plain_free(void *p) { free(p); }

static void dev_init(void) {
    g_dev = *backend_cpu(1);
    g_dev.name = "scrambled";
    g_dev.to_host = scramble_copy;
    g_dev.from_host = scramble_copy;
    g_dev.host_alloc = count_host_alloc;
    g_dev.host_free = plain_free;
}

static comm_t *open_shm(const char *name, int fd, int n, int rank) { return cc_open_shm(name, fd, n, rank, SLOT); }

typedef struct {
    int fd_direct, fd_staged;
    uint64_t seed;
    int *checked;               /* shared: collectives verified per rank */
} arg_t;

/* Start collective k on c; in place (all_reduce) when inplace. */
static int run_coll(comm_t *c, int k, const void *send, void *recv, size_t len, comm_dtype_t dt, comm_op_t op,
                    char *err, size_t errlen) {
    comm_req_t *r = NULL;
    int rc = 0;
    switch (k) {
    case 0: rc = comm_all_gather(c, send, recv, len, dt, &r, err, errlen); break;
    case 1: rc = comm_reduce_scatter(c, send, recv, len, dt, op, &r, err, errlen); break;
    case 2: rc = comm_all_reduce(c, send, recv, len, dt, op, &r, err, errlen); break;
    case 3: rc = comm_broadcast(c, recv, len, dt, 1, &r, err, errlen); break;
    default: rc = comm_barrier(c, &r, err, errlen); break;
    }
    return rc ? rc : comm_wait(r, err, errlen);
}

static int rank_main(int rank, int n, void *argp) {
    arg_t *a = argp;
    dev_init();
    char err[COMM_ERR_LEN];
    comm_t *direct = open_shm("direct", a->fd_direct, n, rank), *inner = open_shm("staged", a->fd_staged, n, rank);
    comm_t *staged = NULL;
    if (!direct || !inner) return 1;
    if (comm_stage_wrap(&staged, inner, &g_dev, err, sizeof err)) { fprintf(stderr, "wrap: %s\n", err); return 1; }
    if (strcmp(comm_backend(staged), "shm+stage") || comm_size(staged) != n || comm_index(staged) != rank) {
        fprintf(stderr, "rank %d: wrapper reports %s, %d ranks, index %d\n", rank, comm_backend(staged),
                comm_size(staged), comm_index(staged));
        return 1;
    }
    int bad = 0;
    for (int it = 0; it < 30 && !bad; it++) {
        uint64_t r = cc_mix(a->seed + (uint64_t)it);
        int k = it % 5;
        bool inplace = k == 2 && (it / 5) % 2;
        comm_dtype_t dt = (it / 5) % 2 ? COMM_BF16 : COMM_F32;
        comm_op_t op = (it / 10) % 2 ? COMM_AVG : COMM_SUM;
        size_t len = ((r >> 8) % 3000) | 1, es = dt == COMM_BF16 ? 2 : 4;
        size_t in_len = k == 1 ? len * (size_t)n : len, out_len = k == 0 ? len * (size_t)n : len;
        void *hin = malloc(in_len * es), *hout = malloc(out_len * es), *ref = malloc(out_len * es);
        void *din = g_dev.alloc(in_len * es), *dout = g_dev.alloc(out_len * es);
        cc_fill(hin, in_len, dt, a->seed * 1000 + (uint64_t)it * 64 + (uint64_t)rank);
        cc_fill(ref, out_len, dt, a->seed ^ 0xbeef);         /* broadcast: non-root garbage */
        if (k == 3 || inplace) memcpy(ref, hin, out_len * es);
        g_dev.from_host(dout, ref, out_len * es);
        g_dev.from_host(din, hin, in_len * es);
        /* direct, host memory */
        if (run_coll(direct, k, hin, ref, len, dt, op, err, sizeof err)) {
            fprintf(stderr, "rank %d: direct %d: %s\n", rank, k, err);
            bad = 1;
        }
        /* staged, device memory */
        if (!bad && run_coll(staged, k, inplace ? dout : din, dout, len, dt, op, err, sizeof err)) {
            fprintf(stderr, "rank %d: staged %d: %s\n", rank, k, err);
            bad = 1;
        }
        if (!bad) {
            g_dev.to_host(hout, dout, out_len * es);
            if (k < 4 && memcmp(hout, ref, out_len * es)) {
                fprintf(stderr, "rank %d: collective %d (%s, %zu elements) differs staged vs direct\n", rank, k,
                        dt == COMM_BF16 ? "bf16" : "fp32", len);
                bad = 1;
            } else {
                a->checked[rank]++;
            }
        }
        free(hin); free(hout); free(ref);
        g_dev.free(din); g_dev.free(dout);
    }
    if (!bad && (g_host_allocs < 1 || comm_stage_bytes(staged) == 0)) {
        fprintf(stderr, "rank %d: staging did not use host_alloc (%d allocations, %zu bytes)\n", rank, g_host_allocs,
                comm_stage_bytes(staged));
        bad = 1;
    }
    comm_destroy(staged);
    comm_destroy(direct);
    return bad;
}

Test(comm_stage, staged_matches_direct_bits) {
    char err[COMM_ERR_LEN];
    arg_t a = { .seed = 97 };
    a.fd_direct = comm_shm_segment_create(4, SLOT, err, sizeof err);
    cr_assert_geq(a.fd_direct, 0, "%s", err);
    a.fd_staged = comm_shm_segment_create(4, SLOT, err, sizeof err);
    cr_assert_geq(a.fd_staged, 0, "%s", err);
    a.checked = cc_shared(sizeof(int) * 8);
    int failed = cc_run_ranks(4, rank_main, &a, 60, NULL);
    cr_assert_eq(failed, 0, "%d of 4 ranks failed (messages above)", failed);
    for (int r = 0; r < 4; r++) cr_expect_eq(a.checked[r], 30, "rank %d verified %d of 30", r, a.checked[r]);
    close(a.fd_direct);
    close(a.fd_staged);
}

Test(comm_stage, refuses_a_backend_without_host_alloc) {
    backend_t be = *backend_cpu(1);
    be.host_alloc = NULL;
    comm_t *out = (comm_t *)&be; /* must be reset to NULL */
    char err[COMM_ERR_LEN] = "";
    cr_expect_eq(comm_stage_wrap(&out, NULL, &be, err, sizeof err), -EINVAL);
    cr_expect_null(out);
    cr_expect(strstr(err, "host_alloc") != NULL, "message: %s", err);
}
