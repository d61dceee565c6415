/* test_comm_stream_wait.c: comm_stream_wait on the shared-memory backend,
 * which has no CUDA streams: it must block the host until the collective
 * is done, return its status, and leave the handle for comm_wait.
 * (The NCCL path, where the stream waits on an event instead, runs on a
 * GPU: tests/gpu/check_nccl.c.)
 *
 * Two forked ranks all-reduce seeded random fp32 data; rank 1 starts
 * 200 ms late, so rank 0's comm_stream_wait must take that long and, once
 * it returns, the result must already equal the serial reference. */
#include <criterion/criterion.h>
#include <errno.h>
#include <time.h>

#include "clock.h"

#include "tests/comm_check.h"

#define LEN 100003
#define LATE_MS 200

typedef struct {
    int fd;
    double *waited; /* (2) seconds comm_stream_wait took, per rank */
} arg_t;

static int rank_fn(int me, int n, void *argp) {
    arg_t *a = argp;
    char err[COMM_ERR_LEN];
    comm_t *c = cc_open_shm("sw", a->fd, n, me, 64 << 10);
    if (!c) return 1;
    float *in[2], *out = malloc(LEN * sizeof(float)), *ref = malloc(LEN * sizeof(float));
    for (int i = 0; i < 2; i++) {
        in[i] = malloc(LEN * sizeof(float));
        cc_fill(in[i], LEN, COMM_F32, 1234 + (uint64_t)i);
    }
    cc_reduce_ref(ref, (void *const *)in, 2, 0, LEN, COMM_F32, COMM_SUM);
    for (size_t i = 0; i < LEN; i++) out[i] = NAN;
    if (me == 1) usleep(LATE_MS * 1000);
    comm_req_t *r;
    int bad = 0;
    if (comm_all_reduce(c, in[me], out, LEN, COMM_F32, COMM_SUM, &r, err, sizeof err)) {
        fprintf(stderr, "rank %d: %s\n", me, err);
        return 1;
    }
    double t0 = clock_now_s();
    int rc = comm_stream_wait(r, NULL, err, sizeof err);
    a->waited[me] = clock_now_s() - t0;
    if (rc) { fprintf(stderr, "rank %d: comm_stream_wait: %s\n", me, err); bad = 1; }
    if (!bad && memcmp(out, ref, LEN * sizeof(float))) { fprintf(stderr, "rank %d: result differs\n", me); bad = 1; }
    if (!comm_test(r)) { fprintf(stderr, "rank %d: comm_test false after comm_stream_wait\n", me); bad = 1; }
    if (comm_wait(r, err, sizeof err)) { fprintf(stderr, "rank %d: comm_wait: %s\n", me, err); bad = 1; }
    comm_destroy(c);
    for (int i = 0; i < 2; i++) free(in[i]);
    free(out), free(ref);
    return bad;
}

/* Two forked ranks on a fresh segment run fn; returns rank 0's waited[0]. */
static double run_two(cc_rank_fn fn) {
    char err[COMM_ERR_LEN];
    arg_t a;
    a.fd = comm_shm_segment_create(2, 64 << 10, err, sizeof err);
    cr_assert_geq(a.fd, 0, "%s", err);
    a.waited = cc_shared(2 * sizeof(double));
    cr_assert_not_null(a.waited);
    int failed = cc_run_ranks(2, fn, &a, 30, NULL);
    close(a.fd);
    cr_assert_eq(failed, 0, "%d ranks failed (messages above)", failed);
    return a.waited[0];
}

Test(comm_stream_wait, shm_blocks_until_done_and_keeps_the_handle) {
    double w = run_two(rank_fn);
    cr_expect_geq(w, LATE_MS * 0.8e-3, "rank 0 waited %.3f s for a peer %d ms late", w, LATE_MS);
}

Test(comm_stream_wait, null_handle_is_an_error) {
    char err[128] = "";
    cr_expect_eq(comm_stream_wait(NULL, NULL, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "NULL handle") != NULL, "message: %s", err);
}

/* comm_use on shm: each result is there when comm_use returns (host wait),
 * at most COMM_HOLD_MAX handles are kept, the blocked time counts as
 * exposed communication (comm_wait_seconds), and comm_hold_release
 * collects the rest. Seven all-reduces of seeded random data, rank 1 late
 * before the first. */
#define HOLD_LEN 4099
#define HOLD_N 7

static int hold_rank_fn(int me, int n, void *argp) {
    arg_t *a = argp;
    char err[COMM_ERR_LEN];
    comm_t *c = cc_open_shm("hold", a->fd, n, me, 64 << 10);
    if (!c) return 1;
    int bad = 0;
    comm_hold_t h = { 0 };
    float *in[2], *out[HOLD_N], *ref = malloc(HOLD_LEN * sizeof(float));
    double w0 = comm_wait_seconds();
    if (me == 1) usleep(LATE_MS * 1000);
    for (int k = 0; k < HOLD_N && !bad; k++) {
        for (int i = 0; i < 2; i++) {
            in[i] = malloc(HOLD_LEN * sizeof(float));
            cc_fill(in[i], HOLD_LEN, COMM_F32, 99 + 10 * (uint64_t)k + (uint64_t)i);
        }
        cc_reduce_ref(ref, (void *const *)in, 2, 0, HOLD_LEN, COMM_F32, COMM_SUM);
        out[k] = malloc(HOLD_LEN * sizeof(float));
        comm_req_t *r = NULL;
        if (comm_all_reduce(c, in[me], out[k], HOLD_LEN, COMM_F32, COMM_SUM, &r, err, sizeof err) ||
            comm_use(&h, &r, NULL, err, sizeof err)) {
            fprintf(stderr, "rank %d: %s\n", me, err);
            bad = 1;
        }
        if (r) { fprintf(stderr, "rank %d: comm_use left the handle with the caller\n", me); bad = 1; }
        if (!bad && memcmp(out[k], ref, HOLD_LEN * sizeof(float))) {
            fprintf(stderr, "rank %d: result %d not there after comm_use\n", me, k);
            bad = 1;
        }
        int want = k + 1 < COMM_HOLD_MAX ? k + 1 : COMM_HOLD_MAX;
        if (h.n != want) { fprintf(stderr, "rank %d: %d handles kept after %d uses, want %d\n", me, h.n, k + 1, want); bad = 1; }
        for (int i = 0; i < 2; i++) free(in[i]);
    }
    if (comm_hold_release(&h, err, sizeof err)) { fprintf(stderr, "rank %d: release: %s\n", me, err); bad = 1; }
    if (h.n != 0) { fprintf(stderr, "rank %d: %d handles left after release\n", me, h.n); bad = 1; }
    a->waited[me] = comm_wait_seconds() - w0;
    comm_destroy(c);
    for (int k = 0; k < HOLD_N; k++) free(out[k]);
    free(ref);
    return bad;
}

Test(comm_stream_wait, comm_use_keeps_a_bounded_set_and_counts_the_wait) {
    double w = run_two(hold_rank_fn);
    cr_expect_geq(w, LATE_MS * 0.8e-3, "rank 0's exposed communication is %.3f s with a peer %d ms late", w, LATE_MS);
}
