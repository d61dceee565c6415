/* comm_nccl_run.c: the NCCL backend on real GPUs, for
 * tests/integration/comm_nccl.sh. One forked rank per GPU (at most 2, so
 * that sums of two values are exact whatever order NCCL uses); rank 0
 * serves the rendezvous in-process. Every collective in fp32 and bf16 on
 * seeded random data of odd lengths, compared with the serial reference;
 * the ring shift (ncclSend/ncclRecv in a group) against the predecessor's
 * block.
 *
 * Exit 0: all passed; 77: skipped (no libnccl or no GPU; the reason is
 * printed); 1: a failure (printed). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/comm_check.h"

typedef struct {
    int (*set_device)(int);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int); /* kind 1: H2D, 2: D2H */
    int (*count)(int *);
} cudart_t;

static int load_cudart(cudart_t *c) {
    const char *names[] = { "libcudart.so", "libcudart.so.13", "libcudart.so.12" };
    void *h = NULL;
    for (int i = 0; i < 3 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!h) return -1;
    *(void **)&c->set_device = dlsym(h, "cudaSetDevice");
    *(void **)&c->malloc_ = dlsym(h, "cudaMalloc");
    *(void **)&c->free_ = dlsym(h, "cudaFree");
    *(void **)&c->memcpy_ = dlsym(h, "cudaMemcpy");
    *(void **)&c->count = dlsym(h, "cudaGetDeviceCount");
    return c->set_device && c->malloc_ && c->free_ && c->memcpy_ && c->count ? 0 : -1;
}

#define NCOLL 24 /* 6 kinds (the barrier and the ring shift included) x fp32, bf16 x sum, avg */

typedef struct {
    char addr[128];
    int *ok;
} arg_t;

static int rank_main(int rank, int n, void *argp) {
    arg_t *a = argp;
    cudart_t cu;
    char err[COMM_ERR_LEN];
    if (load_cudart(&cu) || cu.set_device(rank)) return fprintf(stderr, "rank %d: CUDA runtime\n", rank), 1;
    rdzv_server_t *srv = NULL;
    if (rank == 0) {
        rdzv_server_opts_t o = { .listen = a->addr, .job_id = "nccl", .world = n };
        if (!(srv = rdzv_server_start(&o, NULL, err, sizeof err))) return fprintf(stderr, "%s\n", err), 1;
    }
    rdzv_client_t *cl = rdzv_client_open(a->addr, "nccl", n, err, sizeof err);
    if (!cl) return fprintf(stderr, "%s\n", err), 1;
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.kind = COMM_NCCL;
    cfg.name = "world";
    cfg.n = n;
    cfg.index = rank;
    cfg.rdzv = cl;
    cfg.device = rank;
    cfg.timeout_s = 60;
    comm_t *c;
    if (comm_init(&c, &cfg, err, sizeof err)) return fprintf(stderr, "rank %d: %s\n", rank, err), 1;
    int bad = 0;
    for (int it = 0; it < NCOLL && !bad; it++) {
        int k = it % 6;
        comm_dtype_t dt = (it / 6) % 2 ? COMM_BF16 : COMM_F32;
        comm_op_t op = it >= 12 ? COMM_AVG : COMM_SUM;
        size_t es = (dt == COMM_F32 ? 4u : 2u), len = (cc_mix(77 + (uint64_t)it) % 100000) | 1;
        size_t in_len = k == 1 ? len * (size_t)n : len, out_len = k == 0 ? len * (size_t)n : len;
        void *in[2], *ref = malloc(out_len * es), *out = malloc(out_len * es);
        for (int i = 0; i < n; i++) {
            in[i] = malloc(in_len * es);
            cc_fill(in[i], in_len, dt, (uint64_t)it * 10 + (uint64_t)i);
        }
        void *dsend = NULL, *drecv = NULL;
        cu.malloc_(&dsend, in_len * es);
        cu.malloc_(&drecv, out_len * es);
        cu.memcpy_(dsend, in[rank], in_len * es, 1);
        if (k == 3) cu.memcpy_(drecv, in[rank], len * es, 1);
        comm_req_t *r;
        int rc;
        switch (k) {
        case 0: rc = comm_all_gather(c, dsend, drecv, len, dt, &r, err, sizeof err);
            for (int i = 0; i < n; i++) memcpy((char *)ref + (size_t)i * len * es, in[i], len * es);
            break;
        case 1: rc = comm_reduce_scatter(c, dsend, drecv, len, dt, op, &r, err, sizeof err);
            cc_reduce_ref(ref, in, n, (size_t)rank * len, len, dt, op);
            break;
        case 2: rc = comm_all_reduce(c, dsend, drecv, len, dt, op, &r, err, sizeof err);
            cc_reduce_ref(ref, in, n, 0, len, dt, op);
            break;
        case 3: rc = comm_broadcast(c, drecv, len, dt, n - 1, &r, err, sizeof err);
            memcpy(ref, in[n - 1], len * es);
            break;
        case 5: rc = comm_ring_shift(c, dsend, drecv, len, dt, &r, err, sizeof err);
            memcpy(ref, in[(rank + n - 1) % n], len * es); /* the predecessor's block */
            break;
        default: rc = comm_barrier(c, &r, err, sizeof err);
            out_len = 0;
            break;
        }
        if (!rc) rc = comm_wait(r, err, sizeof err);
        if (rc) bad = (fprintf(stderr, "rank %d: %s\n", rank, err), 1);
        if (!bad && out_len) {
            cu.memcpy_(out, drecv, out_len * es, 2);
            if (memcmp(out, ref, out_len * es))
                bad = (fprintf(stderr, "rank %d: collective %d (%s) differs from the reference\n", rank, k,
                               dt == COMM_F32 ? "fp32" : "bf16"), 1);
        }
        if (!bad) a->ok[rank]++;
        cu.free_(dsend);
        cu.free_(drecv);
        for (int i = 0; i < n; i++) free(in[i]);
        free(ref), free(out);
    }
    comm_destroy(c);
    if (rdzv_barrier(cl, "done", rank, n, 60, err, sizeof err)) bad = 1;
    rdzv_client_close(cl);
    rdzv_server_stop(srv);
    return bad;
}

/* In a child, so that the parent never initializes CUDA before forking. */
static int probe(int *gpus, char *why, size_t len) {
    int *shared = cc_shared(sizeof(int) + 512);
    pid_t p = fork();
    if (p == 0) {
        char e[COMM_ERR_LEN];
        if (!comm_nccl_available(e, sizeof e)) {
            snprintf((char *)(shared + 1), 512, "%s", e);
            _exit(77);
        }
        cudart_t cu;
        shared[0] = 0;
        if (load_cudart(&cu) == 0) cu.count(&shared[0]);
        _exit(0);
    }
    int st;
    waitpid(p, &st, 0);
    *gpus = shared[0];
    snprintf(why, len, "%s", (char *)(shared + 1));
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int main(void) {
    int gpus = 0;
    char why[512] = "";
    int rc = probe(&gpus, why, sizeof why);
    if (rc == 77) {
        printf("SKIP %s\n", why);
        return 77;
    }
    if (rc || gpus < 1) return fprintf(stderr, "probe failed\n"), 1;
    int n = gpus >= 2 ? 2 : 1;
    arg_t a;
    snprintf(a.addr, sizeof a.addr, "unix:/tmp/ballast-nccl-%d.sock", (int)getpid());
    a.ok = cc_shared(sizeof(int) * 2);
    int failed = cc_run_ranks(n, rank_main, &a, 300, NULL);
    printf("%d rank(s) on %d GPU(s): %d and %d of %d collectives matched\n", n, gpus, a.ok[0], n > 1 ? a.ok[1] : NCOLL,
           NCOLL);
    return failed ? 1 : 0;
}
