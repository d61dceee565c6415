/* comm_gloo.c: one rank of the Gloo bandwidth benchmark (comm_gloo.sh runs
 * one per namespace host). Rank 0 serves the rendezvous store at ADDR.
 *
 *   comm_gloo RANK WORLD HOST:PORT MIB
 *
 * Times an fp32 all-reduce of MIB MiB and an all-gather with MIB MiB of
 * output, best of 5 after one warm-up, and prints (rank 0) the bus
 * bandwidth as nccl-tests defines it, so that it compares with the link's
 * rate: all-reduce 2(n-1)/n x bytes / time, all-gather (n-1)/n x output
 * bytes / time. Lines: "gloo all_reduce GBPS" and "gloo all_gather GBPS". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "tests/comm_check.h"

static double best_of(comm_t *c, int k, float *in, float *out, size_t count) {
    double best = 1e30;
    char err[COMM_ERR_LEN];
    int n = comm_size(c);
    for (int it = 0; it < 6; it++) {
        comm_req_t *r;
        double t0 = clock_now_s();
        int rc = k == 0 ? comm_all_reduce(c, in, out, count, COMM_F32, COMM_SUM, &r, err, sizeof err)
                        : comm_all_gather(c, in, out, count / (size_t)n, COMM_F32, &r, err, sizeof err);
        if (!rc) rc = comm_wait(r, err, sizeof err);
        if (rc) {
            fprintf(stderr, "comm_gloo: %s\n", err);
            exit(1);
        }
        double t = clock_now_s() - t0;
        if (it > 0 && t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: comm_gloo RANK WORLD HOST:PORT MIB\n");
        return 2;
    }
    int rank = atoi(argv[1]), n = atoi(argv[2]);
    const char *addr = argv[3];
    size_t mib = (size_t)atoi(argv[4]);
    if (n < 2 || rank < 0 || rank >= n || mib < 1 || mib > 4096) {
        fprintf(stderr, "comm_gloo: need 0 <= RANK < WORLD, WORLD >= 2, 1 <= MIB <= 4096\n");
        return 2;
    }
    char err[RDZV_ERR_LEN];
    rdzv_server_t *srv = NULL;
    if (rank == 0) {
        char listen[64];
        const char *colon = strrchr(addr, ':');
        snprintf(listen, sizeof listen, "0.0.0.0%s", colon ? colon : ":29500");
        rdzv_server_opts_t o = { .listen = listen, .job_id = "bench", .world = n };
        if (!(srv = rdzv_server_start(&o, NULL, err, sizeof err))) return fprintf(stderr, "%s\n", err), 1;
    }
    rdzv_client_t *cl = rdzv_client_open(addr, "bench", n, err, sizeof err);
    if (!cl) return fprintf(stderr, "%s\n", err), 1;
    int all[64];
    for (int i = 0; i < n && i < 64; i++) all[i] = i;
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.kind = COMM_GLOO;
    cfg.name = "bench";
    cfg.n = n;
    cfg.index = rank;
    cfg.ranks = all;
    cfg.rdzv = cl;
    cfg.timeout_s = 120;
    cfg.setup_timeout_s = 60;
    comm_t *c;
    char cerr[COMM_ERR_LEN];
    if (comm_init(&c, &cfg, cerr, sizeof cerr)) return fprintf(stderr, "comm_gloo: %s\n", cerr), 1;
    size_t count = mib * (1u << 20) / sizeof(float);
    count -= count % (size_t)n;
    float *in = malloc(count * sizeof(float)), *out = malloc(count * sizeof(float));
    if (!in || !out) return fprintf(stderr, "comm_gloo: out of memory\n"), 1;
    cc_fill(in, count, COMM_F32, (uint64_t)rank + 1);
    double bytes = (double)count * sizeof(float);
    double t_ar = best_of(c, 0, in, out, count), t_ag = best_of(c, 1, in, out, count);
    if (rank == 0) {
        printf("gloo all_reduce %.3f\n", 2.0 * (n - 1) / n * bytes / t_ar / 1e9);
        printf("gloo all_gather %.3f\n", (double)(n - 1) / n * bytes / t_ag / 1e9);
    }
    comm_destroy(c);
    rdzv_barrier(cl, "done", rank, n, 60, err, sizeof err);
    rdzv_client_close(cl);
    rdzv_server_stop(srv);
    free(in);
    free(out);
    return 0;
}
