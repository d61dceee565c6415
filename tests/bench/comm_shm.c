/* comm_shm.c (bench): bandwidth of the shared-memory collectives between
 * forked processes, next to memcpy bandwidth measured in the same run.
 * The figures are only printed, but each rank checks the last result of
 * both collectives against a reference built from every rank's inputs, so
 * the bench fails (exit 1) rather than time a wrong collective.
 *
 *   build/tests/bench/comm_shm [RANKS [MIB [SLOT_KIB]]]   (default 4 ranks, 16 MiB, 1024 KiB slots)
 *
 * all_reduce: MIB of fp32 per rank, reduced into every rank; all_gather:
 * MIB/RANKS per rank gathered into MIB on every rank. Bandwidth is the
 * result size per rank over the time per collective (the "algorithm
 * bandwidth"); ratio = that / memcpy bandwidth of the same size. Times are
 * the best of several repetitions (a shared machine disturbs some). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

#include "tests/comm_check.h"

typedef struct {
    int fd;
    size_t bytes, slot;
    double *best;      /* shared: [0] all_reduce s, [1] all_gather s (rank 0's) */
} arg_t;

#define REPS 5

static int rank_main(int rank, int n, void *argp) {
    arg_t *a = argp;
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.name = "bench";
    cfg.n = n;
    cfg.index = rank;
    cfg.shm_fd = a->fd;
    cfg.slot_bytes = a->slot;
    comm_t *c;
    char err[COMM_ERR_LEN];
    if (comm_init(&c, &cfg, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    size_t count = a->bytes / 4;
    float *x = malloc(a->bytes), *y = malloc(a->bytes);
    cc_fill(x, count, COMM_F32, (uint64_t)rank + 1);
    memset(y, 0, a->bytes);
    double best[2] = { 1e30, 1e30 };
    for (int rep = 0; rep < REPS; rep++)
        for (int k = 0; k < 2; k++) {
            comm_req_t *r;
            if (comm_barrier(c, &r, err, sizeof err) || comm_wait(r, err, sizeof err)) goto fail;
            double t0 = clock_now_s();
            int rc = k == 0 ? comm_all_reduce(c, x, y, count, COMM_F32, COMM_SUM, &r, err, sizeof err)
                            : comm_all_gather(c, x, y, count / (size_t)n, COMM_F32, &r, err, sizeof err);
            if (rc || comm_wait(r, err, sizeof err)) goto fail;
            double t = clock_now_s() - t0;
            if (t < best[k]) best[k] = t;
        }
    /* check both collectives once more against references: the shm backend
     * reduces in rank order, so the sum is exact to the bit */
    {
        float **in = calloc((size_t)n, sizeof *in), *ref = malloc(a->bytes);
        int bad = !in || !ref;
        for (int i = 0; !bad && i < n; i++) {
            if (!(in[i] = malloc(a->bytes))) { bad = 1; break; }
            cc_fill(in[i], count, COMM_F32, (uint64_t)i + 1);
        }
        comm_req_t *r;
        if (!bad) {
            cc_reduce_ref(ref, (void *const *)in, n, 0, count, COMM_F32, COMM_SUM);
            if (comm_all_reduce(c, x, y, count, COMM_F32, COMM_SUM, &r, err, sizeof err) || comm_wait(r, err, sizeof err))
                bad = 2;
            else if (memcmp(y, ref, a->bytes)) bad = 3;
        }
        size_t chunk = count / (size_t)n;
        if (!bad) {
            if (comm_all_gather(c, x, y, chunk, COMM_F32, &r, err, sizeof err) || comm_wait(r, err, sizeof err)) bad = 2;
            for (int i = 0; !bad && i < n; i++)
                if (memcmp(y + (size_t)i * chunk, in[i], chunk * sizeof(float))) bad = 4;
        }
        for (int i = 0; in && i < n; i++) free(in[i]);
        free(in);
        free(ref);
        if (bad) {
            if (bad != 2) snprintf(err, sizeof err, "%s", bad == 1 ? "out of memory for the reference" :
                                   bad == 3 ? "all_reduce result differs from the rank-order sum" :
                                              "all_gather result differs from the ranks' inputs");
            goto fail;
        }
    }
    if (rank == 0) a->best[0] = best[0], a->best[1] = best[1];
    comm_destroy(c);
    free(x), free(y);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, err);
    return 1;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    size_t mib = argc > 2 ? (size_t)atoi(argv[2]) : 16;
    size_t slot = (argc > 3 ? (size_t)atoi(argv[3]) : 1024) * 1024;
    if (n < 1 || n > 64 || mib < 1) {
        fprintf(stderr, "usage: comm_shm [RANKS 1..64 [MIB [SLOT_KIB]]]\n");
        return 2;
    }
    char err[COMM_ERR_LEN];
    arg_t a = { .bytes = mib << 20, .slot = slot };
    a.bytes -= a.bytes % (4 * (size_t)n);
    a.fd = comm_shm_segment_create(n, slot, err, sizeof err);
    if (a.fd < 0) return fprintf(stderr, "%s\n", err), 1;
    a.best = cc_shared(2 * sizeof(double));

    /* memcpy of the same size, best of REPS */
    char *src = malloc(a.bytes), *dst = malloc(a.bytes);
    memset(src, 1, a.bytes);
    memset(dst, 2, a.bytes);
    double mc = 1e30;
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = clock_now_s();
        memcpy(dst, src, a.bytes);
        double t = clock_now_s() - t0;
        if (t < mc) mc = t;
    }
    if (dst[a.bytes / 2] != 1) return 1;
    free(src), free(dst);

    if (cc_run_ranks(n, rank_main, &a, 120, NULL)) return fprintf(stderr, "comm_shm bench: a rank failed\n"), 1;
    double gb = (double)a.bytes / 1e9, mcbw = gb / mc;
    printf("comm_shm bench: %d ranks, %.1f MiB result per rank, %zu KiB slots, %ld CPUs online\n", n,
           a.bytes / 1048576.0, slot / 1024, sysconf(_SC_NPROCESSORS_ONLN));
    printf("  memcpy        %8.2f GB/s\n", mcbw);
    printf("  all_reduce    %8.2f GB/s   ratio to memcpy %.3f   (%.2f ms)\n", gb / a.best[0],
           gb / a.best[0] / mcbw, a.best[0] * 1e3);
    printf("  all_gather    %8.2f GB/s   ratio to memcpy %.3f   (%.2f ms)\n", gb / a.best[1],
           gb / a.best[1] / mcbw, a.best[1] * 1e3);
    printf("RATIO shm all_reduce/memcpy bandwidth, %d ranks %zu MiB: %.3f (%.2f vs %.2f GB/s)\n", n,
           a.bytes >> 20, gb / a.best[0] / mcbw, gb / a.best[0], mcbw);
    printf("RATIO shm all_gather/memcpy bandwidth, %d ranks %zu MiB: %.3f (%.2f vs %.2f GB/s)\n", n,
           a.bytes >> 20, gb / a.best[1] / mcbw, gb / a.best[1], mcbw);
    close(a.fd);
    return 0;
}
