/* test_comm_shm.c: the shared-memory collectives across forked processes.
 *
 * - 4 and 8 ranks run every collective (all_gather, reduce_scatter,
 *   all_reduce sum and avg, broadcast, barrier, ring_shift) in fp32 and bf16 on seeded
 *   random data of random odd lengths, with a small slot so that tensors
 *   stream through many rounds; each result is compared bit for bit with a
 *   serial reference built from the same seeds, and a digest of every
 *   rank's outputs must be identical across ranks.
 * - concurrent groups: the TP and shard groups of the (S, T) = (2, 2)
 *   layout of 4 ranks run collectives at the same time.
 * - async overlap: two collectives started before either is waited for.
 * - set-up through the rendezvous (rank 0 serves it in-process).
 * - failures: a rank that dies mid-run and mismatched collectives are
 *   errors naming the rank, not hangs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/comm_check.h"
#include "workers/parallel/groups.h"

#define SMALL_SLOT 4096   /* bytes: forces many rounds per collective */

typedef struct {
    int fd;               /* fork-shared segment */
    size_t slot;          /* slot bytes */
    int iters;
    uint64_t seed;
    uint64_t *digest;     /* shared: one per rank */
    int *checked;         /* shared: collectives verified per rank */
} run_arg_t;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ULL;
    return h;
}

#define RFAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); goto out; } while (0)

/* One collective of kind k on random data, checked against the reference.
 * Returns 0 or -1 (message on stderr). Updates *digest with the output. */
static int one_collective(comm_t *c, int k, comm_dtype_t dt, comm_op_t op, size_t len, uint64_t seed,
                          uint64_t *digest) {
    int n = comm_size(c), me = comm_index(c);
    size_t es = dt == COMM_F32 ? 4 : 2;
    int rc = -1;
    char err[COMM_ERR_LEN];
    size_t in_len = k == 1 ? len * (size_t)n : len;           /* reduce_scatter input n*len */
    size_t out_len = k == 0 ? len * (size_t)n : len;          /* all_gather output n*len */
    void **inputs = calloc((size_t)n, sizeof(void *));
    void *out = malloc(out_len * es + 1), *ref = malloc(out_len * es + 1);
    for (int i = 0; i < n; i++) {
        inputs[i] = malloc(in_len * es + 1);
        cc_fill(inputs[i], in_len, dt, seed * 1000 + (uint64_t)i);
    }
    cc_fill(out, out_len, dt, seed ^ 0xdead); /* garbage that must be overwritten */
    comm_req_t *req = NULL;
    int root = (int)(seed % (uint64_t)n);
    switch (k) {
    case 0:
        if (comm_all_gather(c, inputs[me], out, len, dt, &req, err, sizeof err)) RFAIL("start: %s", err);
        for (int i = 0; i < n; i++) memcpy((char *)ref + (size_t)i * len * es, inputs[i], len * es);
        break;
    case 1:
        if (comm_reduce_scatter(c, inputs[me], out, len, dt, op, &req, err, sizeof err)) RFAIL("start: %s", err);
        cc_reduce_ref(ref, inputs, n, (size_t)me * len, len, dt, op);
        break;
    case 2:
        if (comm_all_reduce(c, inputs[me], out, len, dt, op, &req, err, sizeof err)) RFAIL("start: %s", err);
        cc_reduce_ref(ref, inputs, n, 0, len, dt, op);
        break;
    case 3:
        if (me == root) memcpy(out, inputs[me], len * es);
        if (comm_broadcast(c, out, len, dt, root, &req, err, sizeof err)) RFAIL("start: %s", err);
        memcpy(ref, inputs[root], len * es);
        break;
    case 4:
        if (comm_barrier(c, &req, err, sizeof err)) RFAIL("start: %s", err);
        out_len = 0;
        break;
    default:
        /* ring shift: the predecessor's block */
        if (comm_ring_shift(c, inputs[me], out, len, dt, &req, err, sizeof err)) RFAIL("start: %s", err);
        memcpy(ref, inputs[(me + n - 1) % n], len * es);
        break;
    }
    if (comm_wait(req, err, sizeof err)) RFAIL("rank %d: collective %d: %s", me, k, err);
    if (out_len && memcmp(out, ref, out_len * es) != 0) {
        size_t e = 0;
        while (e < out_len && !memcmp((char *)out + e * es, (char *)ref + e * es, es)) e++;
        RFAIL("rank %d: collective %d (%s, op %d, len %zu, n %d): element %zu is %.9g, reference %.9g",
              me, k, dt == COMM_F32 ? "fp32" : "bf16", (int)op, len, n, e, cc_get(out, e, dt),
              cc_get(ref, e, dt));
    }
    if (k != 1 && k != 5) *digest = fnv(*digest, out, out_len * es); /* reduce_scatter and shift parts differ by design */
    rc = 0;
out:
    for (int i = 0; i < n; i++) free(inputs[i]);
    free(inputs);
    free(out);
    free(ref);
    return rc;
}

static int rank_all_collectives(int rank, int n, void *argp) {
    run_arg_t *a = argp;
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.name = "world";
    cfg.n = n;
    cfg.index = rank;
    cfg.shm_fd = a->fd;
    cfg.slot_bytes = a->slot;
    cfg.timeout_s = 30;
    comm_t *c;
    char err[COMM_ERR_LEN];
    if (comm_init(&c, &cfg, err, sizeof err)) {
        fprintf(stderr, "rank %d: init: %s\n", rank, err);
        return 1;
    }
    uint64_t digest = 1469598103934665603ULL;
    int bad = 0;
    for (int it = 0; it < a->iters && !bad; it++) {
        uint64_t r = cc_mix(a->seed + (uint64_t)it);           /* same on every rank */
        int k = it % 6;
        comm_dtype_t dt = (it / 5) % 2 ? COMM_BF16 : COMM_F32;
        comm_op_t op = (it / 10) % 2 ? COMM_AVG : COMM_SUM;
        size_t len = ((r >> 8) % 3000) | 1;                    /* odd, 1..2999 */
        if (it % 7 == 3) len = (((r >> 8) % 40000) | 1) + 1000; /* now and then larger */
        if (one_collective(c, k, dt, op, len, a->seed * 7919 + (uint64_t)it, &digest)) bad = 1;
        else a->checked[rank]++;
    }
    a->digest[rank] = digest;
    comm_destroy(c);
    return bad;
}

static void run_all(int n, size_t slot, int iters, uint64_t seed) {
    char err[COMM_ERR_LEN];
    run_arg_t a = { .slot = slot, .iters = iters, .seed = seed };
    a.fd = comm_shm_segment_create(n, slot, err, sizeof err);
    cr_assert_geq(a.fd, 0, "%s", err);
    a.digest = cc_shared(sizeof(uint64_t) * 64);
    a.checked = cc_shared(sizeof(int) * 64);
    int failed = cc_run_ranks(n, rank_all_collectives, &a, 60, NULL);
    cr_assert_eq(failed, 0, "%d of %d ranks failed (messages above)", failed, n);
    for (int r = 0; r < n; r++) {
        cr_expect_eq(a.checked[r], iters, "rank %d verified %d of %d collectives", r, a.checked[r], iters);
        cr_expect_eq(a.digest[r], a.digest[0], "rank %d's outputs differ from rank 0's", r);
    }
    close(a.fd);
}

Test(comm_shm, four_ranks_every_collective) { run_all(4, SMALL_SLOT, 40, 11); }
Test(comm_shm, eight_ranks_every_collective) { run_all(8, SMALL_SLOT, 40, 23); }
Test(comm_shm, four_ranks_default_slot) { run_all(4, 0, 20, 37); }
Test(comm_shm, one_rank_is_a_copy) { run_all(1, SMALL_SLOT, 20, 41); }

/* Results are the same bits on a second run with the same seeds. */
Test(comm_shm, deterministic_across_runs) {
    uint64_t d[2];
    for (int run = 0; run < 2; run++) {
        char err[COMM_ERR_LEN];
        run_arg_t a = { .slot = SMALL_SLOT, .iters = 15, .seed = 99 };
        a.fd = comm_shm_segment_create(4, SMALL_SLOT, err, sizeof err);
        cr_assert_geq(a.fd, 0, "%s", err);
        a.digest = cc_shared(sizeof(uint64_t) * 64);
        a.checked = cc_shared(sizeof(int) * 64);
        cr_assert_eq(cc_run_ranks(4, rank_all_collectives, &a, 60, NULL), 0);
        d[run] = a.digest[0];
        close(a.fd);
    }
    cr_expect_eq(d[0], d[1]);
}

/* ---- concurrent groups and async overlap ---- */

typedef struct {
    int fd[GROUP_NKINDS][8]; /* segment per (kind, group id) */
    int *checked;
} groups_arg_t;

static comm_t *open_group(const group_t *g, int fd, char *err, size_t errlen) {
    comm_config_t cfg;
    comm_config_init(&cfg);
    char name[32];
    group_name(g, name, sizeof name);
    cfg.name = name;
    cfg.n = g->n;
    cfg.index = g->index;
    cfg.ranks = g->ranks;
    cfg.shm_fd = fd;
    cfg.slot_bytes = SMALL_SLOT;
    cfg.timeout_s = 30;
    comm_t *c = NULL;
    if (comm_init(&c, &cfg, err, errlen)) return NULL;
    return c;
}

/* Per iteration: an all-reduce in the TP group and an all-gather in the
 * shard group, both started before either is waited for; then two
 * collectives started back to back on one comm and waited in reverse. */
static int rank_groups(int rank, int n, void *argp) {
    groups_arg_t *a = argp;
    groups_t g;
    char err[COMM_ERR_LEN];
    if (groups_build(&g, n, rank, 2, 2, NULL, NULL, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    comm_t *tp = open_group(&g.group[GROUP_TP], a->fd[GROUP_TP][g.group[GROUP_TP].id], err, sizeof err);
    comm_t *sh = tp ? open_group(&g.group[GROUP_SHARD], a->fd[GROUP_SHARD][g.group[GROUP_SHARD].id], err, sizeof err) : NULL;
    if (!tp || !sh) return fprintf(stderr, "rank %d: %s\n", rank, err), 1;
    int bad = 0;
    for (int it = 0; it < 12 && !bad; it++) {
        size_t len = (cc_mix(500 + (uint64_t)it) % 5000) | 1;
        comm_dtype_t dt = it % 2 ? COMM_BF16 : COMM_F32;
        size_t es = dt == COMM_F32 ? 4 : 2;
        /* inputs: seeded by global rank so any rank can rebuild any other's */
        void *in[4], *ar = malloc(len * es), *ag = malloc(2 * len * es), *ref = malloc(2 * len * es);
        for (int r = 0; r < 4; r++) {
            in[r] = malloc(len * es);
            cc_fill(in[r], len, dt, (uint64_t)it * 100 + (uint64_t)r);
        }
        comm_req_t *r1, *r2;
        if (comm_all_reduce(tp, in[rank], ar, len, dt, COMM_SUM, &r1, err, sizeof err) ||
            comm_all_gather(sh, in[rank], ag, len, dt, &r2, err, sizeof err) ||
            comm_wait(r2, err, sizeof err) || comm_wait(r1, err, sizeof err)) {
            fprintf(stderr, "rank %d: %s\n", rank, err);
            bad = 1;
        }
        /* TP all-reduce reference over the TP group's global ranks */
        const group_t *gt = &g.group[GROUP_TP], *gs = &g.group[GROUP_SHARD];
        void *tin[2] = { in[gt->ranks[0]], in[gt->ranks[1]] };
        cc_reduce_ref(ref, tin, 2, 0, len, dt, COMM_SUM);
        if (!bad && memcmp(ar, ref, len * es)) bad = (fprintf(stderr, "rank %d: TP all_reduce differs\n", rank), 1);
        for (int i = 0; i < 2; i++) memcpy((char *)ref + (size_t)i * len * es, in[gs->ranks[i]], len * es);
        if (!bad && memcmp(ag, ref, 2 * len * es)) bad = (fprintf(stderr, "rank %d: shard all_gather differs\n", rank), 1);
        /* two on one comm, waited in reverse order */
        void *b1 = malloc(len * es), *b2 = malloc(len * es);
        memcpy(b2, in[rank], len * es);
        if (!bad && (comm_all_reduce(sh, in[rank], b1, len, dt, COMM_AVG, &r1, err, sizeof err) ||
                     comm_broadcast(sh, b2, len, dt, 1, &r2, err, sizeof err) ||
                     comm_wait(r2, err, sizeof err) || comm_wait(r1, err, sizeof err)))
            bad = (fprintf(stderr, "rank %d: %s\n", rank, err), 1);
        void *sin[2] = { in[gs->ranks[0]], in[gs->ranks[1]] };
        cc_reduce_ref(ref, sin, 2, 0, len, dt, COMM_AVG);
        if (!bad && memcmp(b1, ref, len * es)) bad = (fprintf(stderr, "rank %d: overlapped all_reduce differs\n", rank), 1);
        if (!bad && memcmp(b2, in[gs->ranks[1]], len * es)) bad = (fprintf(stderr, "rank %d: overlapped broadcast differs\n", rank), 1);
        if (!bad) a->checked[rank]++;
        for (int r = 0; r < 4; r++) free(in[r]);
        free(ar), free(ag), free(ref), free(b1), free(b2);
    }
    comm_destroy(tp);
    comm_destroy(sh);
    groups_free(&g);
    return bad;
}

Test(comm_shm, concurrent_tp_and_shard_groups_with_overlap) {
    groups_arg_t a;
    char err[COMM_ERR_LEN];
    for (int k = 0; k < GROUP_NKINDS; k++)
        for (int i = 0; i < 8; i++) {
            a.fd[k][i] = comm_shm_segment_create(2, SMALL_SLOT, err, sizeof err);
            cr_assert_geq(a.fd[k][i], 0, "%s", err);
        }
    a.checked = cc_shared(sizeof(int) * 8);
    cr_assert_eq(cc_run_ranks(4, rank_groups, &a, 60, NULL), 0, "ranks failed (messages above)");
    for (int r = 0; r < 4; r++) cr_expect_eq(a.checked[r], 12, "rank %d checked %d", r, a.checked[r]);
    for (int k = 0; k < GROUP_NKINDS; k++)
        for (int i = 0; i < 8; i++) close(a.fd[k][i]);
}

/* ---- set-up through the rendezvous ---- */

typedef struct {
    char addr[128];
    int *checked;
} rdzv_arg_t;

static int rank_rdzv(int rank, int n, void *argp) {
    rdzv_arg_t *a = argp;
    char err[RDZV_ERR_LEN];
    rdzv_server_t *srv = NULL;
    if (rank == 0) {
        rdzv_server_opts_t o = { .listen = a->addr, .job_id = "t", .world = n };
        if (!(srv = rdzv_server_start(&o, NULL, err, sizeof err))) return fprintf(stderr, "%s\n", err), 1;
    }
    rdzv_client_t *cl = rdzv_client_open(a->addr, "t", n, err, sizeof err);
    if (!cl) return fprintf(stderr, "%s\n", err), 1;
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.name = "world.rdzv";
    cfg.n = n;
    cfg.index = rank;
    cfg.rdzv = cl;
    cfg.timeout_s = 30;
    cfg.slot_bytes = SMALL_SLOT;
    comm_t *c;
    int bad = 0;
    if (comm_init(&c, &cfg, err, sizeof err)) return fprintf(stderr, "rank %d: %s\n", rank, err), 1;
    uint64_t digest = 0;
    for (int it = 0; it < 5 && !bad; it++)
        if (one_collective(c, it % 5, COMM_F32, COMM_SUM, 1001 + 2 * (size_t)it, 5 + (uint64_t)it, &digest)) bad = 1;
        else a->checked[rank]++;
    comm_destroy(c);
    /* rank 0 keeps serving until every rank is done with the store */
    if (rdzv_barrier(cl, "done", rank, n, 30, err, sizeof err)) bad = (fprintf(stderr, "%s\n", err), 1);
    rdzv_client_close(cl);
    rdzv_server_stop(srv);
    return bad;
}

Test(comm_shm, setup_through_rendezvous) {
    rdzv_arg_t a;
    snprintf(a.addr, sizeof a.addr, "unix:/tmp/ballast-test-comm-%d.sock", (int)getpid());
    a.checked = cc_shared(sizeof(int) * 8);
    cr_assert_eq(cc_run_ranks(4, rank_rdzv, &a, 60, NULL), 0, "ranks failed (messages above)");
    for (int r = 0; r < 4; r++) cr_expect_eq(a.checked[r], 5);
}

/* ---- failures ---- */

typedef struct {
    int fd;
    char (*msg)[COMM_ERR_LEN]; /* shared: each rank's error */
    int mode;                  /* 0: rank 2 exits; 1: rank 1 runs a different collective */
} fail_arg_t;

static int rank_fail(int rank, int n, void *argp) {
    fail_arg_t *a = argp;
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.name = "world";
    cfg.n = n;
    cfg.index = rank;
    cfg.shm_fd = a->fd;
    cfg.slot_bytes = SMALL_SLOT;
    cfg.timeout_s = 20;
    comm_t *c;
    char err[COMM_ERR_LEN];
    if (comm_init(&c, &cfg, err, sizeof err)) return 1;
    float x[257], y[257 * 4];
    cc_fill(x, 257, COMM_F32, (uint64_t)rank + 1);
    comm_req_t *r;
    if (a->mode == 0 && rank == 2) _exit(3); /* dies before its first collective */
    int rc;
    if (a->mode == 1 && rank == 1) rc = comm_all_gather(c, x, y, 257, COMM_F32, &r, err, sizeof err);
    else rc = comm_all_reduce(c, x, y, 257, COMM_F32, COMM_SUM, &r, err, sizeof err);
    if (!rc) rc = comm_wait(r, err, sizeof err);
    snprintf(a->msg[rank], COMM_ERR_LEN, "%s", rc ? err : "ok");
    comm_destroy(c);
    return 0;
}

Test(comm_shm, dead_rank_is_named_not_a_hang) {
    char err[COMM_ERR_LEN];
    fail_arg_t a = { .mode = 0 };
    a.fd = comm_shm_segment_create(4, SMALL_SLOT, err, sizeof err);
    a.msg = cc_shared(sizeof(*a.msg) * 4);
    int st[4];
    cc_run_ranks(4, rank_fail, &a, 15, st);
    for (int r = 0; r < 4; r++) {
        if (r == 2) continue;
        cr_expect(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0, "rank %d did not finish (hung?)", r);
        cr_expect(strstr(a.msg[r], "rank 2") != NULL && strstr(a.msg[r], "exited") != NULL,
                  "rank %d: %s", r, a.msg[r]);
    }
    close(a.fd);
}

Test(comm_shm, mismatched_collectives_are_named) {
    char err[COMM_ERR_LEN];
    fail_arg_t a = { .mode = 1 };
    a.fd = comm_shm_segment_create(4, SMALL_SLOT, err, sizeof err);
    a.msg = cc_shared(sizeof(*a.msg) * 4);
    cr_assert_eq(cc_run_ranks(4, rank_fail, &a, 15, NULL), 0);
    for (int r = 0; r < 4; r++)
        cr_expect(strstr(a.msg[r], "all_gather") && strstr(a.msg[r], "all_reduce") &&
                  strstr(a.msg[r], "rank 1"), "rank %d: %s", r, a.msg[r]);
    close(a.fd);
}

Test(comm_shm, bad_arguments) {
    char err[COMM_ERR_LEN];
    int fd = comm_shm_segment_create(2, SMALL_SLOT, err, sizeof err);
    cr_assert_geq(fd, 0);
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.name = "bad name";
    cfg.n = 2;
    cfg.shm_fd = fd;
    comm_t *c;
    cr_expect_eq(comm_init(&c, &cfg, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "bad name"), "%s", err);
    cfg.name = "ok";
    cfg.index = 2;
    cr_expect_eq(comm_init(&c, &cfg, err, sizeof err), -EINVAL);
    cfg.index = 0;
    cfg.slot_bytes = 8192; /* the segment was made with 4096 */
    cfg.timeout_s = 1;
    cr_expect_eq(comm_init(&c, &cfg, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "4096") && strstr(err, "8192"), "%s", err);
    cfg.slot_bytes = 1000;
    cr_expect_eq(comm_init(&c, &cfg, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "multiple of 64"), "%s", err);
    /* the other rank never attaches */
    cfg.slot_bytes = SMALL_SLOT;
    cr_expect_eq(comm_init(&c, &cfg, err, sizeof err), -ETIMEDOUT);
    cr_expect(strstr(err, "rank 1 did not attach"), "%s", err);
    close(fd);
    cr_expect_eq(comm_kind_parse("shm"), COMM_SHM);
    cr_expect_eq(comm_kind_parse("nccl"), COMM_NCCL);
    cr_expect_eq(comm_kind_parse("auto"), COMM_AUTO);
    cr_expect_eq(comm_kind_parse("mpi"), -1);
    cr_expect_eq(comm_select(COMM_AUTO, false, err, sizeof err), COMM_SHM);
    cr_expect_eq(comm_select(COMM_NCCL, false, err, sizeof err), -1);
    cr_expect(strstr(err, "--comm shm"), "%s", err);
}
