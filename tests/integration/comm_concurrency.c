/* comm_concurrency.c: ranks as threads of one process, so that
 * ThreadSanitizer sees the comm layer's own synchronization (the queue
 * between a caller and a communicator's progress thread, completion
 * handles) and the rendezvous store under concurrent barriers and waits.
 * Driven by tests/integration/comm_concurrency.sh (the `make tsan` check
 * of this code: Criterion cannot run under TSan).
 *
 *   comm_concurrency [ITERS]
 *
 * 4 rank threads bootstrap through an in-process rendezvous server, open a
 * world communicator (via the rendezvous: fd passing between threads) and
 * a pair communicator ({0,1} / {2,3}); each iteration starts an all-reduce
 * on one and an all-gather on the other before waiting for either, checks
 * both against the serial reference, and passes a rendezvous barrier. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/comm_check.h"

#define N 4

static char addr[128];
static int iters = 20;
static int ok_count[N];

static void *rank_thread(void *arg) {
    int rank = (int)(intptr_t)arg;
    char err[COMM_ERR_LEN];
    rdzv_client_t *cl = rdzv_client_open(addr, "conc", N, err, sizeof err);
    if (!cl) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return NULL;
    }
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.rdzv = cl;
    cfg.timeout_s = 60;
    cfg.slot_bytes = 4096;
    cfg.name = "world";
    cfg.n = N;
    cfg.index = rank;
    comm_t *world = NULL, *pair = NULL;
    if (comm_init(&world, &cfg, err, sizeof err)) goto fail;
    int pr[2] = { rank & ~1, (rank & ~1) + 1 };
    char pname[32];
    snprintf(pname, sizeof pname, "pair.%d", rank / 2);
    cfg.name = pname;
    cfg.n = 2;
    cfg.index = rank & 1;
    cfg.ranks = pr;
    if (comm_init(&pair, &cfg, err, sizeof err)) goto fail;
    for (int it = 0; it < iters; it++) {
        size_t len = (cc_mix((uint64_t)it) % 3000) | 1;
        comm_dtype_t dt = it % 2 ? COMM_BF16 : COMM_F32;
        size_t es = dt == COMM_F32 ? 4 : 2;
        void *in[N], *ar = malloc(len * es), *ag = malloc(2 * len * es), *ref = malloc(2 * len * es);
        for (int r = 0; r < N; r++) {
            in[r] = malloc(len * es);
            cc_fill(in[r], len, dt, (uint64_t)it * 31 + (uint64_t)r);
        }
        comm_req_t *a, *b;
        if (comm_all_reduce(world, in[rank], ar, len, dt, COMM_SUM, &a, err, sizeof err) ||
            comm_all_gather(pair, in[rank], ag, len, dt, &b, err, sizeof err))
            goto fail;
        while (!comm_test(b)) sched_yield();
        if (comm_wait(b, err, sizeof err) || comm_wait(a, err, sizeof err)) goto fail;
        cc_reduce_ref(ref, in, N, 0, len, dt, COMM_SUM);
        int bad = memcmp(ar, ref, len * es) != 0;
        memcpy(ref, in[pr[0]], len * es);
        memcpy((char *)ref + len * es, in[pr[1]], len * es);
        bad |= memcmp(ag, ref, 2 * len * es) != 0;
        for (int r = 0; r < N; r++) free(in[r]);
        free(ar), free(ag), free(ref);
        if (bad) {
            snprintf(err, sizeof err, "iteration %d: result differs from the reference", it);
            goto fail;
        }
        if (it % 5 == 0 && rdzv_barrier(cl, "iter", rank, N, 30, err, sizeof err)) goto fail;
        ok_count[rank]++;
    }
    comm_destroy(pair);
    comm_destroy(world);
    if (rdzv_barrier(cl, "done", rank, N, 30, err, sizeof err)) fprintf(stderr, "rank %d: %s\n", rank, err);
    rdzv_client_close(cl);
    return NULL;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, err);
    exit(1); /* the other ranks would wait for this one until their timeout */
}

int main(int argc, char **argv) {
    if (argc > 1) iters = atoi(argv[1]);
    snprintf(addr, sizeof addr, "unix:/tmp/ballast-conc-%d.sock", (int)getpid());
    char err[RDZV_ERR_LEN];
    rdzv_server_opts_t o = { .listen = addr, .job_id = "conc", .world = N };
    rdzv_server_t *srv = rdzv_server_start(&o, NULL, err, sizeof err);
    if (!srv) return fprintf(stderr, "%s\n", err), 1;
    pthread_t th[N];
    for (int r = 0; r < N; r++) pthread_create(&th[r], NULL, rank_thread, (void *)(intptr_t)r);
    for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
    rdzv_stats_t st;
    rdzv_server_stats(srv, &st);
    rdzv_server_stop(srv);
    int all = 1;
    for (int r = 0; r < N; r++) all &= ok_count[r] == iters;
    printf("%d ranks x %d iterations verified: %s; rendezvous: %llu barrier rounds, %llu waits\n", N, iters,
           all ? "yes" : "NO", (unsigned long long)st.barriers_done, (unsigned long long)st.waits);
    return all ? 0 : 1;
}
