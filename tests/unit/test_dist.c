/* test_dist.c: ranks joining a job through dist_init (forked processes,
 * rank 0 serving the rendezvous store on a unix socket): every group's
 * communicator works (an all-reduce per group checked against the serial
 * reference over that group's members), a group of one rank has none,
 * S = 0 falls back to full sharding, and a rank that never arrives is
 * named in every other rank's error within the rendezvous timeout. One
 * process joins alone: no store, no socket, no collective backend. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

#include "tests/comm_check.h"
#include "workers/parallel/dist.h"

typedef struct {
    char addr[128];
    int S, T;
    int missing;               /* rank that never starts, or -1 */
    double timeout_s;
    int *checked;              /* shared: groups verified per rank */
    int *S_seen;               /* shared: resolved S per rank */
    char (*msg)[COMM_ERR_LEN]; /* shared: each rank's error */
} arg_t;

static int rank_main(int rank, int n, void *argp) {
    arg_t *a = argp;
    if (rank == a->missing) return 0;
    dist_opts_t o = { .world = n, .rank = rank, .S = a->S, .T = a->T, .comm = COMM_AUTO,
                      .rdzv_addr = a->addr, .rdzv_serve = true, .job_id = "t",
                      .rdzv_timeout_s = a->timeout_s, .comm_timeout_s = 30, .slot_bytes = 4096 };
    dist_t d;
    char err[COMM_ERR_LEN];
    if (dist_init(&d, &o, err, sizeof err)) {
        snprintf(a->msg[rank], COMM_ERR_LEN, "%s", err);
        return 1;
    }
    a->S_seen[rank] = d.groups.S;
    int bad = 0;
    size_t len = 333;
    for (int k = 0; k < GROUP_NKINDS && !bad; k++) {
        const group_t *g = &d.groups.group[k];
        if (g->n == 1) {
            /* a group of one rank: no communicator, its collectives are identities */
            if (d.comm[k]) {
                snprintf(a->msg[rank], COMM_ERR_LEN, "%s group of one rank has a communicator", group_kind_name(k));
                bad = 1;
            } else {
                a->checked[rank]++;
            }
            continue;
        }
        float *in[64], out[333], ref[333];
        for (int i = 0; i < g->n; i++) {
            in[i] = malloc(len * 4);
            cc_fill(in[i], len, COMM_F32, 1000 * (uint64_t)k + (uint64_t)g->ranks[i]);
        }
        comm_req_t *r;
        if (comm_all_reduce(d.comm[k], in[g->index], out, len, COMM_F32, COMM_SUM, &r, err, sizeof err) ||
            comm_wait(r, err, sizeof err)) {
            snprintf(a->msg[rank], COMM_ERR_LEN, "%s", err);
            bad = 1;
        } else {
            cc_reduce_ref(ref, (void *const *)in, g->n, 0, len, COMM_F32, COMM_SUM);
            if (memcmp(out, ref, sizeof out)) {
                snprintf(a->msg[rank], COMM_ERR_LEN, "%s group: all_reduce differs", group_kind_name(k));
                bad = 1;
            } else {
                a->checked[rank]++;
            }
        }
        for (int i = 0; i < g->n; i++) free(in[i]);
    }
    if (dist_destroy(&d, err, sizeof err)) {
        snprintf(a->msg[rank], COMM_ERR_LEN, "%s", err);
        bad = 1;
    }
    return bad;
}

static arg_t make_arg(int S, int T, int missing, double timeout_s) {
    arg_t a = { .S = S, .T = T, .missing = missing, .timeout_s = timeout_s };
    snprintf(a.addr, sizeof a.addr, "unix:/tmp/ballast-test-dist-%d-%d%d.sock", (int)getpid(), S, T);
    a.checked = cc_shared(sizeof(int) * 64);
    a.S_seen = cc_shared(sizeof(int) * 64);
    a.msg = cc_shared(sizeof(*a.msg) * 64);
    return a;
}

Test(dist, eight_ranks_hybrid_2x2) {
    arg_t a = make_arg(2, 2, -1, 30);
    int failed = cc_run_ranks(8, rank_main, &a, 60, NULL);
    for (int r = 0; r < 8; r++) {
        cr_expect_eq(a.checked[r], GROUP_NKINDS, "rank %d verified %d of %d groups: %s", r, a.checked[r], GROUP_NKINDS, a.msg[r]);
        cr_expect_eq(a.S_seen[r], 2);
    }
    cr_assert_eq(failed, 0);
}

Test(dist, groups_of_one_rank_have_no_communicator) {
    /* S 1, T 1 of 4: the TP and shard groups are each rank alone, the replica group all four */
    arg_t a = make_arg(1, 1, -1, 30);
    int failed = cc_run_ranks(4, rank_main, &a, 60, NULL);
    for (int r = 0; r < 4; r++) cr_expect_eq(a.checked[r], GROUP_NKINDS, "rank %d verified %d of %d groups: %s", r, a.checked[r], GROUP_NKINDS, a.msg[r]);
    cr_assert_eq(failed, 0);
}

Test(dist, one_process_joins_alone) {
    char dir[] = "/tmp/ballast-test-dist-solo-XXXXXX", addr[128];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(addr, sizeof addr, "unix:%s/rdzv.sock", dir);
    /* --comm nccl on the CPU would be refused by comm_select: one process selects nothing */
    dist_opts_t o = { .world = 1, .rank = 0, .S = 0, .T = 1, .comm = COMM_NCCL, .rdzv_addr = addr,
                      .rdzv_serve = true, .job_id = "t", .rdzv_timeout_s = 1 };
    dist_t d;
    char err[COMM_ERR_LEN] = "";
    cr_assert_eq(dist_init(&d, &o, err, sizeof err), 0, "%s", err);
    cr_expect_eq(d.groups.R * d.groups.S * d.groups.T, 1);
    for (int k = 0; k < GROUP_NKINDS; k++) cr_expect_null(d.comm[k], "%s group", group_kind_name(k));
    cr_expect_null(d.server);
    cr_expect_null(d.rdzv);
    cr_expect_str_eq(dist_comm_name(&d), "none");
    struct stat st;
    cr_expect_neq(stat(addr + 5, &st), 0, "a socket was created at %s", addr + 5);
    cr_expect_eq(dist_destroy(&d, err, sizeof err), 0, "%s", err);
    cr_expect_eq(rmdir(dir), 0, "%s is not empty", dir);
}

Test(dist, shard_degree_zero_is_full_sharding_without_a_memory_figure) {
    arg_t a = make_arg(0, 2, -1, 30);
    cr_assert_eq(cc_run_ranks(4, rank_main, &a, 60, NULL), 0, "%s", a.msg[0]);
    for (int r = 0; r < 4; r++) cr_expect_eq(a.S_seen[r], 2, "rank %d: S %d", r, a.S_seen[r]);
}

Test(dist, a_missing_rank_is_named_by_every_other_rank) {
    arg_t a = make_arg(1, 1, 3, 1.5);
    double t0 = clock_now_s();
    cc_run_ranks(4, rank_main, &a, 30, NULL);
    double secs = clock_now_s() - t0;
    for (int r = 0; r < 3; r++)
        cr_expect(strstr(a.msg[r], "rank 3 did not arrive") && strstr(a.msg[r], "--rdzv-timeout"),
                  "rank %d: %s", r, a.msg[r]);
    cr_expect_lt(secs, 6.0, "took %.1f s for a 1.5 s timeout", secs);
}

Test(dist, impossible_layout_is_an_error_before_any_network) {
    dist_opts_t o = { .world = 6, .rank = 0, .S = 4, .T = 1, .comm = COMM_SHM, .rdzv_addr = "unix:/nonexistent/x" };
    dist_t d;
    char err[COMM_ERR_LEN];
    cr_expect_eq(dist_init(&d, &o, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "--hybrid-shard-degree 4"), "%s", err);
    o.S = 1;
    o.comm = COMM_NCCL; /* on the CPU backend */
    cr_expect_eq(dist_init(&d, &o, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "--comm shm"), "%s", err);
}
