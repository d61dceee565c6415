/* test_comm_gloo.c: the Gloo backend (workers/comm/gloo.c over
 * gloo_engine.cc) on sub-groups, against a plain serial reference.
 *
 * 6 forked ranks, rank 0 serving the rendezvous store on a unix socket;
 * each rank opens Gloo communicators for its TP group (2 ranks) and shard
 * group (3 ranks) of the (S, T) = (3, 2) layout and for the whole world (6),
 * and every group runs every collective (all_gather, reduce_scatter,
 * all_reduce sum and avg, broadcast from each root, barrier) in fp32 and
 * bf16 on seeded random data (never zero, magnitudes 2^-8..2^8) of random
 * odd lengths. Gather and broadcast must match bit for bit. Reductions:
 * Gloo's ring adds in ring order, the reference in rank order, so fp32
 * may differ by rounding: |out - ref| <= 2 n eps32 sum_i |x_i| (the
 * classic bound for an n-term sum in any order, with a factor 2 of slack);
 * bf16 rounds once at the end from fp32 sums that may straddle a rounding
 * boundary: one bf16 ulp of the result on top. Every rank of a group must
 * get the same bits from all-gather, all-reduce and broadcast (a digest
 * per group). A group whose peer never comes
 * fails within the set-up timeout naming that rank. */
#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/comm_check.h"
#include "workers/parallel/groups.h"

#define WORLD 6

typedef struct {
    char addr[128];
    int *checked;                 /* shared: collectives verified per rank */
    uint64_t (*digest)[3];        /* shared: per rank, per group (tp, shard, world) */
    char (*msg)[COMM_ERR_LEN];    /* shared: per-rank message (timeout test) */
} g_arg_t;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ULL;
    return h;
}

static comm_t *open_gloo(rdzv_client_t *cl, const char *name, int n, int index, const int *ranks, double setup_s) {
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.kind = COMM_GLOO;
    cfg.name = name;
    cfg.n = n;
    cfg.index = index;
    cfg.ranks = ranks;
    cfg.rdzv = cl;
    cfg.timeout_s = 60;
    cfg.setup_timeout_s = setup_s;
    char err[COMM_ERR_LEN];
    comm_t *c = NULL;
    if (comm_init(&c, &cfg, err, sizeof err)) fprintf(stderr, "%s: %s\n", name, err);
    return c;
}

/* Collective k (0 gather, 1 reduce-scatter, 2 all-reduce, 3 broadcast, 4
 * barrier) on group c whose members' inputs come from seed; 0 or -1. */
static int check_one(comm_t *c, int k, comm_dtype_t dt, comm_op_t op, size_t len, uint64_t seed, int root,
                     uint64_t *digest) {
    int n = comm_size(c), me = comm_index(c);
    size_t es = dt == COMM_F32 ? 4 : 2;
    size_t in_len = k == 1 ? len * (size_t)n : len, out_len = k == 0 ? len * (size_t)n : len;
    void **in = calloc((size_t)n, sizeof(void *));
    void *out = malloc(out_len * es), *ref = malloc(out_len * es);
    for (int i = 0; i < n; i++) {
        in[i] = malloc(in_len * es);
        cc_fill(in[i], in_len, dt, seed * 1000 + (uint64_t)i);
    }
    cc_fill(out, out_len, dt, seed ^ 0xbeef); /* must be overwritten */
    char err[COMM_ERR_LEN];
    comm_req_t *r = NULL;
    int rc;
    if (k == 0) rc = comm_all_gather(c, in[me], out, len, dt, &r, err, sizeof err);
    else if (k == 1) rc = comm_reduce_scatter(c, in[me], out, len, dt, op, &r, err, sizeof err);
    else if (k == 2) rc = comm_all_reduce(c, in[me], out, len, dt, op, &r, err, sizeof err);
    else if (k == 3) {
        memcpy(out, in[me], len * es);
        rc = comm_broadcast(c, out, len, dt, root, &r, err, sizeof err);
    } else rc = comm_barrier(c, &r, err, sizeof err);
    if (!rc) rc = comm_wait(r, err, sizeof err);
    int bad = 0;
    if (rc) {
        fprintf(stderr, "rank %d: collective %d: %s\n", me, k, err);
        bad = 1;
    } else if (k == 0 || k == 3) {
        for (int i = 0; i < n; i++)
            if (k == 0) memcpy((char *)ref + (size_t)i * len * es, in[i], len * es);
        if (k == 3) memcpy(ref, in[root], len * es);
        if (memcmp(out, ref, out_len * es)) {
            fprintf(stderr, "group of %d, index %d: collective %d (%s, %zu) differs from the reference\n", n, me,
                    k, dt == COMM_F32 ? "fp32" : "bf16", len);
            bad = 1;
        }
    } else if (k == 1 || k == 2) {
        size_t off = k == 1 ? (size_t)me * len : 0;
        cc_reduce_ref(ref, in, n, off, len, dt, op);
        for (size_t e = 0; e < len && !bad; e++) {
            double mag = 0;
            for (int i = 0; i < n; i++) mag += fabs(cc_get(in[i], off + e, dt));
            if (op == COMM_AVG) mag /= n;
            double rv = cc_get(ref, e, dt), ov = cc_get(out, e, dt);
            double tol = 2.0 * n * FLT_EPSILON * mag + (dt == COMM_BF16 ? fabs(rv) / 128.0 : 0.0);
            if (!(fabs(ov - rv) <= tol)) {
                fprintf(stderr, "group of %d, index %d: collective %d (%s, %s, %zu) element %zu: %.9g, reference "
                        "%.9g (tolerance %.3g)\n", n, me, k, dt == COMM_F32 ? "fp32" : "bf16",
                        op == COMM_AVG ? "avg" : "sum", len, e, ov, rv, tol);
                bad = 1;
            }
        }
    }
    if (k != 1 && k != 4) *digest = fnv(*digest, out, out_len * es); /* reduce-scatter parts differ */
    for (int i = 0; i < n; i++) free(in[i]);
    free(in);
    free(out);
    free(ref);
    return bad ? -1 : 0;
}

static int rank_groups(int rank, int n, void *argp) {
    g_arg_t *a = argp;
    char err[RDZV_ERR_LEN];
    rdzv_server_t *srv = NULL;
    if (rank == 0) {
        rdzv_server_opts_t o = { .listen = a->addr, .job_id = "t", .world = n };
        if (!(srv = rdzv_server_start(&o, NULL, err, sizeof err))) return fprintf(stderr, "%s\n", err), 1;
    }
    rdzv_client_t *cl = rdzv_client_open(a->addr, "t", n, err, sizeof err);
    if (!cl) return fprintf(stderr, "%s\n", err), 1;
    groups_t g;
    if (groups_build(&g, n, rank, 3, 2, NULL, NULL, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    int all[WORLD];
    for (int i = 0; i < n; i++) all[i] = i;
    char tpn[32], shn[32];
    group_name(&g.group[GROUP_TP], tpn, sizeof tpn);
    group_name(&g.group[GROUP_SHARD], shn, sizeof shn);
    comm_t *c[3];
    /* the same order on every rank: TP, shard, world */
    c[0] = open_gloo(cl, tpn, g.group[GROUP_TP].n, g.group[GROUP_TP].index, g.group[GROUP_TP].ranks, 30);
    c[1] = c[0] ? open_gloo(cl, shn, g.group[GROUP_SHARD].n, g.group[GROUP_SHARD].index,
                            g.group[GROUP_SHARD].ranks, 30) : NULL;
    c[2] = c[1] ? open_gloo(cl, "world", n, rank, all, 30) : NULL;
    int bad = !c[0] || !c[1] || !c[2];
    for (int it = 0; it < 24 && !bad; it++)
        for (int q = 0; q < 3 && !bad; q++) {
            int k = it % 5;
            comm_dtype_t dt = (it / 5) % 2 ? COMM_BF16 : COMM_F32;
            comm_op_t op = (it / 10) % 2 ? COMM_AVG : COMM_SUM;
            size_t len = 1 + 2 * (cc_mix((uint64_t)it * 7 + 1) % 3000);
            int root = (int)(cc_mix((uint64_t)it) % (uint64_t)comm_size(c[q]));
            if (check_one(c[q], k, dt, op, len, (uint64_t)(it * 3 + q) + 1, root, &a->digest[rank][q])) bad = 1;
            else a->checked[rank]++;
        }
    for (int q = 2; q >= 0; q--) comm_destroy(c[q]);
    if (rdzv_barrier(cl, "done", rank, n, 60, err, sizeof err)) bad = (fprintf(stderr, "%s\n", err), 1);
    groups_free(&g);
    rdzv_client_close(cl);
    rdzv_server_stop(srv);
    return bad;
}

Test(comm_gloo, every_collective_on_tp_shard_and_world_groups) {
    g_arg_t a;
    snprintf(a.addr, sizeof a.addr, "unix:/tmp/ballast-test-gloo-%d.sock", (int)getpid());
    a.checked = cc_shared(sizeof(int) * WORLD);
    a.digest = cc_shared(sizeof(uint64_t) * 3 * WORLD);
    cr_assert_eq(cc_run_ranks(WORLD, rank_groups, &a, 240, NULL), 0, "ranks failed (messages above)");
    for (int r = 0; r < WORLD; r++) cr_expect_eq(a.checked[r], 24 * 3, "rank %d checked %d", r, a.checked[r]);
    /* the same bits on every member of a group: TP pairs (0,1), (2,3), (4,5);
     * shard triples (0,2,4), (1,3,5); the world */
    for (int r = 0; r < WORLD; r++) {
        cr_expect_eq(a.digest[r][0], a.digest[r ^ 1][0], "TP group of rank %d", r);
        cr_expect_eq(a.digest[r][1], a.digest[r % 2][1], "shard group of rank %d", r);
        cr_expect_eq(a.digest[r][2], a.digest[0][2], "world group, rank %d", r);
    }
}

/* ---- a peer that never comes ---- */

static int rank_missing(int rank, int n, void *argp) {
    g_arg_t *a = argp;
    char err[RDZV_ERR_LEN];
    rdzv_server_t *srv = NULL;
    if (rank == 0) {
        rdzv_server_opts_t o = { .listen = a->addr, .job_id = "t", .world = n };
        if (!(srv = rdzv_server_start(&o, NULL, err, sizeof err))) return 1;
    }
    rdzv_client_t *cl = rdzv_client_open(a->addr, "t", n, err, sizeof err);
    if (!cl) return 1;
    if (rank == 2) { /* joins the store but never opens the group */
        rdzv_barrier(cl, "done", rank, n, 30, err, sizeof err);
        rdzv_client_close(cl);
        return 0;
    }
    int all[3] = { 10, 11, 12 }; /* global ranks, for the message */
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.kind = COMM_GLOO;
    cfg.name = "late";
    cfg.n = n;
    cfg.index = rank;
    cfg.ranks = all;
    cfg.rdzv = cl;
    cfg.setup_timeout_s = 1.5;
    comm_t *c = NULL;
    char cerr[COMM_ERR_LEN];
    int rc = comm_init(&c, &cfg, cerr, sizeof cerr);
    snprintf(a->msg[rank], COMM_ERR_LEN, "%s", rc ? cerr : "ok");
    comm_destroy(c);
    rdzv_barrier(cl, "done", rank, n, 30, err, sizeof err);
    rdzv_client_close(cl);
    rdzv_server_stop(srv);
    return 0;
}

Test(comm_gloo, missing_peer_is_named_within_the_setup_timeout) {
    g_arg_t a;
    snprintf(a.addr, sizeof a.addr, "unix:/tmp/ballast-test-gloo-late-%d.sock", (int)getpid());
    a.msg = cc_shared(COMM_ERR_LEN * 3);
    cr_assert_eq(cc_run_ranks(3, rank_missing, &a, 60, NULL), 0);
    for (int r = 0; r < 2; r++)
        cr_expect(strstr(a.msg[r], "rank 12 (index 2 of group late) did not publish its Gloo address within 1.5 s"),
                  "rank %d: %s", r, a.msg[r]);
}

Test(comm_gloo, kind_names) {
    char err[COMM_ERR_LEN];
    cr_expect_eq(comm_kind_parse("gloo"), COMM_GLOO);
    cr_expect_str_eq(comm_kind_name(COMM_GLOO), "gloo");
    cr_expect_eq(comm_select(COMM_GLOO, false, err, sizeof err), COMM_GLOO);
}
