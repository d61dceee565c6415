/* check_nccl.c: the NCCL backend of comm.h with one rank per communicator,
 * through every collective path of a training step.
 *
 * NCCL refuses two ranks on one GPU, so on a one-GPU machine each group
 * (TP, shard, replica) is a communicator of one; what is checked is the
 * path, not the arithmetic across ranks (tests/integration/comm_nccl_run.c
 * does that with one rank per GPU on machines with several): collectives
 * on each communicator's own stream, ordered after the compute stream
 * (cfg.compute_stream) and before later compute (comm_stream_wait), with
 * no host synchronization in between. Per step, as the sharded trainer
 * does it:
 *   broadcast  fp32 master shard from root 0 (replica group)
 *   all_gather bf16 working copy of the shard (shard group), produced by a
 *              kernel queued right before the collective, consumed by a
 *              kernel queued right after comm_stream_wait
 *   reduce_scatter gradients, fp32 or bf16 (--grad-reduce-dtype), AVG
 *   all_reduce the gradient shard across replicas (fp32 SUM) and the
 *              activations across the TP group (bf16 SUM), both in flight
 *              at once and polled with comm_test
 *   barrier    on each group
 * Outputs start as NaN and the producing/consuming kernels sit behind a
 * long GEMM, so a missing ordering shows as NaN or stale values. Every
 * result is compared exactly with the host sum over the group's ranks
 * (one rank: its own values, rounded to bf16 where the path is bf16).
 *
 *
 * Then, on the emulated GPU (tests/emu, whose NCCL runs several ranks as
 * processes), comm_ring_shift over NCCL communicators of C = 2 and 4
 * ranks, one forked process and emulated device each, against the shm
 * backend's ring shift of the same random data (fp32 and bf16, odd
 * lengths): each rank must receive exactly its predecessor's block, as
 * shm delivers it. Every iteration runs the pattern of ring attention's
 * backward, two shifts in flight at once on one communicator (K/V and
 * dK/dV) with the compute stream made to wait on both (comm_stream_wait),
 * and the forward's, one shift. On a real GPU this part is skipped
 * (tests/integration/comm_nccl_run.c shifts across real GPUs); the
 * standalone build of tests/gpu/run.sh has no rendezvous and skips it too.
 *
 *   check_nccl [--grad-reduce-dtype fp32|bf16|both] (default both) */
#include <cuda_runtime.h>
#include <errno.h>
#include <time.h>

#include "tests/gpu/gpucheck.h"
#include "workers/comm/comm.h"
#ifndef GPU_STANDALONE
#include "services/rendezvous/rdzv.h"
#include "tests/comm_check.h"
#endif

#ifdef GPU_STANDALONE
/* tests/gpu/run.sh builds without gRPC: groups of one need no rendezvous */
int rdzv_set(rdzv_client_t *c, const char *key, const void *value, size_t len, bool overwrite, double timeout_s,
             char *err, size_t errlen) {
    (void)c, (void)value, (void)len, (void)overwrite, (void)timeout_s;
    snprintf(err, errlen, "rendezvous key %s: no rendezvous client in this build", key);
    return -ENOSYS;
}
int rdzv_wait(rdzv_client_t *c, const char *key, void **value, size_t *len, double timeout_s, char *err,
              size_t errlen) {
    (void)c, (void)value, (void)len, (void)timeout_s;
    snprintf(err, errlen, "rendezvous key %s: no rendezvous client in this build", key);
    return -ENOSYS;
}
#endif

#define P 1000003      /* shard elements (odd) */
#define NA 65537       /* activation elements of the TP all-reduce */

static void result(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s - nccl/%s ", ok ? "ok" : "not ok", GC.name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    GC.cases++;
    if (!ok) GC.failed++;
}

static bool same(const float *got, const float *want, size_t n, size_t *at) {
    for (size_t i = 0; i < n; i++)
        if (!(got[i] == want[i])) { *at = i; return false; } /* NaN fails too */
    return true;
}

/* Keep the compute stream busy for a while (a few large GEMMs) so that
 * work queued after it runs late: an unordered collective would overtake. */
static void busy(act_t *a, act_t *b, act_t *c) {
    int n = gc_emulated() ? 64 : 4096; /* the emulator's stream order is random anyway */
    for (int i = 0; i < 4; i++) GC.gpu->matmul_fwd(c, a, b, n, n, n);
}

static int step(comm_t *tp, comm_t *shard, comm_t *rep, bool bf16_grads, act_t *ba, act_t *bb, act_t *bc) {
    const backend_t *g = GC.gpu;
    char err[COMM_ERR_LEN];
    void *compute = cuda_stream(CUDA_STREAM_COMPUTE);
    int n = comm_size(shard), fails = GC.failed;
    size_t at = 0;
    float *h_master = gc_host(P), *h_grad = gc_host((size_t)n * P), *h_act = gc_host(NA), *want = gc_host((size_t)n * P);
    float *got = gc_host((size_t)n * P);
    gc_rand(h_master, P, -1.f, 1.f);
    gc_rand(h_grad, (size_t)n * P, -0.01f, 0.01f);
    gc_rand(h_act, NA, -4.f, 4.f);
    float *master = gc_dev_f32(h_master, P), *grad = gc_dev_f32(h_grad, (size_t)n * P);
    float *gshard = g->alloc(P * 4);
    act_t *wshard = g->alloc(P * 2), *wfull = g->alloc((size_t)n * P * 2), *dbl = g->alloc((size_t)n * P * 2);
    act_t *gbf = g->alloc((size_t)n * P * 2), *gshard_bf = g->alloc(P * 2);
    act_t *act = gc_dev_act(h_act, NA), *act_sum = g->alloc(NA * 2);
    gc_poison_act(wshard, P);
    gc_poison_act(wfull, (size_t)n * P);
    gc_poison_f32(gshard, P);
    gc_poison_act(gshard_bf, P);
    gc_poison_act(act_sum, NA);
    comm_req_t *r = NULL, *r2 = NULL;

    /* broadcast of the master shard (replica group, root 0), in place */
    int rc = comm_broadcast(rep, master, P, COMM_F32, 0, &r, err, sizeof err);
    if (!rc) rc = comm_stream_wait(r, compute, err, sizeof err);
    if (!rc) rc = comm_wait(r, err, sizeof err);
    if (rc) { result(false, "broadcast: %s", err); goto out; }
    g->to_host(got, master, P * 4);
    result(same(got, h_master, P, &at), "broadcast fp32 master shard from root 0");

    /* bf16 all-gather of the working copy: produced on compute, consumed on compute */
    busy(ba, bb, bc);
    g->to_act(wshard, master, P);
    if ((rc = comm_all_gather(shard, wshard, wfull, P, COMM_BF16, &r, err, sizeof err)) ||
        (rc = comm_stream_wait(r, compute, err, sizeof err))) { result(false, "all_gather: %s", err); goto out; }
    g->add(dbl, wfull, wfull, (size_t)n * P); /* 2x is exact in bf16 */
    if ((rc = comm_wait(r, err, sizeof err))) { result(false, "all_gather wait: %s", err); goto out; }
    g->act_to_host(got, dbl, (size_t)n * P);
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < P; k++)
            want[(size_t)i * P + k] = 2.f * cuda_bf16_to_f32(cuda_f32_to_bf16(h_master[k]));
    result(same(got, want, (size_t)n * P, &at), "all_gather bf16 shards, ordered after the producer and before the consumer%s",
           "");

    /* gradient reduce-scatter (AVG), fp32 or bf16 */
    busy(ba, bb, bc);
    if (bf16_grads) {
        g->to_act(gbf, grad, (size_t)n * P);
        rc = comm_reduce_scatter(shard, gbf, gshard_bf, P, COMM_BF16, COMM_AVG, &r, err, sizeof err);
        if (!rc) rc = comm_stream_wait(r, compute, err, sizeof err);
        if (!rc) cuda_act_to_f32(gshard, gshard_bf, P);
    } else {
        rc = comm_reduce_scatter(shard, grad, gshard, P, COMM_F32, COMM_AVG, &r, err, sizeof err);
        if (!rc) rc = comm_stream_wait(r, compute, err, sizeof err);
    }
    if (!rc) rc = comm_wait(r, err, sizeof err);
    if (rc) { result(false, "reduce_scatter: %s", err); goto out; }
    int me = comm_index(shard);
    for (size_t k = 0; k < P; k++) {
        double s = 0;
        for (int i = 0; i < n; i++) {
            float v = h_grad[(size_t)i * P + (size_t)me * P + k];
            s += bf16_grads ? cuda_bf16_to_f32(cuda_f32_to_bf16(v)) : v;
        }
        float avg = (float)(s / n);
        want[k] = bf16_grads ? cuda_bf16_to_f32(cuda_f32_to_bf16(avg)) : avg;
    }
    g->to_host(got, gshard, P * 4);
    result(same(got, want, P, &at), "reduce_scatter %s gradients (avg)", bf16_grads ? "bf16" : "fp32");

    /* two groups in flight at once: replica all-reduce (fp32, in place) and TP all-reduce (bf16) */
    busy(ba, bb, bc);
    if ((rc = comm_all_reduce(rep, gshard, gshard, P, COMM_F32, COMM_SUM, &r, err, sizeof err)) ||
        (rc = comm_all_reduce(tp, act, act_sum, NA, COMM_BF16, COMM_SUM, &r2, err, sizeof err))) {
        result(false, "all_reduce: %s", err);
        if (r) comm_wait(r, err, sizeof err);
        goto out;
    }
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    int polls = 0;
    while (!(comm_test(r) && comm_test(r2)) && (double)clock() / CLOCKS_PER_SEC - t0 < 60) polls++;
    bool done = comm_test(r) && comm_test(r2);
    int rc1 = comm_wait(r, err, sizeof err), rc2 = comm_wait(r2, err, sizeof err);
    result(done && !rc1 && !rc2, "two communicators in flight, comm_test until both done (%d polls)%s%s", polls,
           rc1 || rc2 ? ": " : "", rc1 || rc2 ? err : "");
    float *gs = gc_host(P);
    g->to_host(gs, gshard, P * 4);
    for (size_t k = 0; k < P; k++) want[k] = want[k] * (float)comm_size(rep); /* every replica holds the same shard */
    result(same(gs, want, P, &at), "all_reduce fp32 gradient shard across replicas (sum)");
    free(gs);
    float *as = gc_get_act(act_sum, NA);
    for (size_t k = 0; k < NA; k++)
        want[k] = cuda_bf16_to_f32(cuda_f32_to_bf16(cuda_bf16_to_f32(cuda_f32_to_bf16(h_act[k])) * (float)comm_size(tp)));
    result(same(as, want, NA, &at), "all_reduce bf16 activations across the TP group (sum)");
    free(as);

    /* barriers */
    comm_t *cs[3] = { tp, shard, rep };
    bool bok = true;
    for (int i = 0; i < 3; i++) {
        if (comm_barrier(cs[i], &r, err, sizeof err) || comm_wait(r, err, sizeof err)) bok = false;
    }
    result(bok, "barrier on each group%s%s", bok ? "" : ": ", bok ? "" : err);
out:
    if (GC.failed > fails && at) printf("#   first difference at element %zu\n", at);
    cuda_sync();
    g->free(master), g->free(grad), g->free(gshard), g->free(wshard), g->free(wfull), g->free(dbl);
    g->free(gbf), g->free(gshard_bf), g->free(act), g->free(act_sum);
    free(h_master), free(h_grad), free(h_act), free(want), free(got);
    return GC.failed > fails;
}

/* ---- ring shift across ranks (emulation) ---- */

#ifndef GPU_STANDALONE
typedef struct {
    char addr[128];
    int shm_fd;
    size_t slot;
    int *ok;                  /* (n) iterations each rank got right */
    char *msg;                /* 512 bytes: the first failure */
} shift_arg_t;

#define SHIFT_ITERS 6

/* One rank: rendezvous (rank 0 serves it), an NCCL and a shm communicator
 * of the n ranks, then SHIFT_ITERS iterations alternating fp32 and bf16. */
static int shift_rank(int rank, int n, void *argp) {
    shift_arg_t *a = argp;
    char err[COMM_ERR_LEN] = "";
    int bad = 0;
    if (cudaSetDevice(rank) != cudaSuccess) return snprintf(a->msg, 512, "rank %d: cudaSetDevice", rank), 1;
    rdzv_server_t *srv = NULL;
    if (rank == 0) {
        rdzv_server_opts_t o = { .listen = a->addr, .job_id = "cp-shift", .world = n };
        if (!(srv = rdzv_server_start(&o, NULL, err, sizeof err))) return snprintf(a->msg, 512, "%s", err), 1;
    }
    rdzv_client_t *cl = rdzv_client_open(a->addr, "cp-shift", n, err, sizeof err);
    if (!cl) return snprintf(a->msg, 512, "rank %d: %s", rank, err), 1;
    cudaStream_t compute;
    cudaStreamCreate(&compute);
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.kind = COMM_NCCL;
    cfg.name = "cp.0";
    cfg.n = n;
    cfg.index = rank;
    cfg.rdzv = cl;
    cfg.device = rank;
    cfg.timeout_s = 120;
    cfg.compute_stream = compute;
    comm_t *nc = NULL, *sc = cc_open_shm("cp.0-shm", a->shm_fd, n, rank, a->slot);
    if (!sc || comm_init(&nc, &cfg, err, sizeof err)) {
        snprintf(a->msg, 512, "rank %d: comm_init: %s", rank, sc ? err : "shm");
        return 1;
    }
    for (int it = 0; it < SHIFT_ITERS && !bad; it++) {
        comm_dtype_t dt = it % 2 ? COMM_BF16 : COMM_F32;
        size_t es = dt == COMM_F32 ? 4 : 2, len = (cc_mix(991 + (uint64_t)it * 7) % 40000) | 1, b = len * es;
        bool two = it < SHIFT_ITERS - 2; /* the backward's two shifts in flight, then the forward's one */
        int prev = (rank + n - 1) % n;
        void *h[2], *want[2], *via_shm[2], *got[2], *dsend[2], *drecv[2];
        for (int k = 0; k < 2; k++) {
            h[k] = malloc(b), want[k] = malloc(b), via_shm[k] = malloc(b), got[k] = malloc(b);
            cc_fill(h[k], len, dt, (uint64_t)it * 1000 + (uint64_t)k * 100 + (uint64_t)rank);
            cc_fill(want[k], len, dt, (uint64_t)it * 1000 + (uint64_t)k * 100 + (uint64_t)prev);
            cudaMalloc(&dsend[k], b);
            cudaMalloc(&drecv[k], b);
            cudaMemcpy(dsend[k], h[k], b, cudaMemcpyHostToDevice);
            cudaMemset(drecv[k], 0xff, b);
        }
        int nk = two ? 2 : 1, rc = 0;
        comm_req_t *r[2] = { NULL, NULL };
        for (int k = 0; k < nk && !rc; k++) rc = comm_ring_shift(nc, dsend[k], drecv[k], len, dt, &r[k], err, sizeof err);
        for (int k = 0; k < nk && !rc; k++) rc = comm_stream_wait(r[k], compute, err, sizeof err);
        for (int k = 0; k < nk; k++)
            if (r[k]) {
                int w = comm_wait(r[k], rc ? (char[COMM_ERR_LEN]){ 0 } : err, sizeof err);
                if (!rc) rc = w;
            }
        for (int k = 0; k < nk && !rc; k++) {
            comm_req_t *q = NULL;
            rc = comm_ring_shift(sc, h[k], via_shm[k], len, dt, &q, err, sizeof err);
            if (!rc) rc = comm_wait(q, err, sizeof err);
        }
        if (rc) {
            snprintf(a->msg, 512, "rank %d, iteration %d: %s", rank, it, err);
            bad = 1;
        }
        for (int k = 0; k < nk && !bad; k++) {
            cudaMemcpyAsync(got[k], drecv[k], b, cudaMemcpyDeviceToHost, compute);
            cudaStreamSynchronize(compute);
            if (memcmp(got[k], via_shm[k], b) || memcmp(got[k], want[k], b)) {
                size_t at = 0;
                while (at < b && ((char *)got[k])[at] == ((char *)want[k])[at]) at++;
                snprintf(a->msg, 512, "rank %d, iteration %d (%s, %zu elements), shift %d of %d: NCCL's block differs "
                         "from rank %d's (first at byte %zu)%s", rank, it, dt == COMM_F32 ? "fp32" : "bf16", len, k + 1,
                         nk, prev, at, memcmp(via_shm[k], want[k], b) ? "; shm's too" : "; shm's is right");
                bad = 1;
            }
        }
        if (!bad) a->ok[rank]++;
        for (int k = 0; k < 2; k++) {
            cudaFree(dsend[k]), cudaFree(drecv[k]);
            free(h[k]), free(want[k]), free(via_shm[k]), free(got[k]);
        }
    }
    comm_destroy(nc);
    comm_destroy(sc);
    if (rdzv_barrier(cl, "done", rank, n, 60, err, sizeof err)) bad = 1;
    rdzv_client_close(cl);
    rdzv_server_stop(srv);
    return bad;
}
#endif

static void ring_shift_ranks(int n) {
    if (!gc_case("ring_shift_C%d", n)) return;
    if (!gc_emulated()) {
        printf("ok - nccl/%s # SKIP several ranks run on the emulated GPU only (comm_nccl_run shifts across real "
               "GPUs)\n", GC.name);
        GC.cases++;
        return;
    }
#ifdef GPU_STANDALONE
    printf("ok - nccl/%s # SKIP no rendezvous in the standalone build\n", GC.name);
    GC.cases++;
#else
    char err[COMM_ERR_LEN];
    shift_arg_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.addr, sizeof a.addr, "unix:/tmp/ballast-cp-shift-%d-%d.sock", (int)getpid(), n);
    a.slot = 40000 * 4;
    a.ok = cc_shared(sizeof(int) * (size_t)n);
    a.msg = cc_shared(512);
    a.shm_fd = comm_shm_segment_create(n, a.slot, err, sizeof err);
    if (a.shm_fd < 0) { result(false, "shm segment: %s", err); return; }
    char devs[8];
    snprintf(devs, sizeof devs, "%d", n);
    setenv("BALLAST_EMU_DEVICES", devs, 1); /* one emulated device per rank */
    int failed = cc_run_ranks(n, shift_rank, &a, 300, NULL);
    close(a.shm_fd);
    int ok = 0;
    for (int i = 0; i < n; i++) ok += a.ok[i];
    result(!failed && ok == n * SHIFT_ITERS, "comm_ring_shift over NCCL, %d ranks (processes), equals shm's, fp32 and "
           "bf16, two shifts in flight and one: %d of %d rank-iterations%s%s", n, ok, n * SHIFT_ITERS,
           a.msg[0] ? ": " : "", a.msg);
#endif
}

int main(int argc, char **argv) {
    int which = 2; /* 0 fp32, 1 bf16, 2 both */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--grad-reduce-dtype") && i + 1 < argc) {
            const char *v = argv[++i];
            which = !strcmp(v, "fp32") ? 0 : !strcmp(v, "bf16") ? 1 : !strcmp(v, "both") ? 2 : -1;
            if (which < 0) { fprintf(stderr, "check_nccl: --grad-reduce-dtype fp32|bf16|both, not %s\n", v); return 2; }
        } else {
            fprintf(stderr, "usage: check_nccl [--grad-reduce-dtype fp32|bf16|both]\n");
            return 2;
        }
    }
    gc_init("nccl");
    char why[COMM_ERR_LEN] = "";
    if (GC.have_gpu && !comm_nccl_available(why, sizeof why)) {
        printf("# %s\n", why);
        GC.have_gpu = false; /* every case below reports SKIP */
    }
    const char *names[2] = { "step_fp32_grads", "step_bf16_grads" };
    comm_t *c[3] = { NULL, NULL, NULL };
    const char *gname[3] = { "tp.0", "shard.0", "replica.0" };
    bool up = false;
    for (int d = 0; d < 2; d++) {
        if (which != 2 && which != d) continue;
        if (!gc_case("%s", names[d])) continue;
        if (!up) {
            char err[COMM_ERR_LEN];
            int rank = 0;
            for (int i = 0; i < 3; i++) {
                comm_config_t cfg;
                comm_config_init(&cfg);
                cfg.kind = COMM_NCCL;
                cfg.name = gname[i];
                cfg.n = 1;
                cfg.index = 0;
                cfg.ranks = &rank;
                cfg.device = 0;
                cfg.timeout_s = 60;
                cfg.compute_stream = cuda_stream(CUDA_STREAM_COMPUTE);
                if (comm_init(&c[i], &cfg, err, sizeof err)) {
                    result(false, "comm_init %s: %s", gname[i], err);
                    return gc_done();
                }
            }
            up = true;
        }
        size_t big = (size_t)4096 * 4096;
        float *hb = gc_host(big);
        gc_rand(hb, big, -0.05f, 0.05f);
        gc_round_bf16(hb, big);
        act_t *ba = gc_dev_act(hb, big), *bb = gc_dev_act(hb, big), *bc = GC.gpu->alloc(big * 2);
        free(hb);
        step(c[0], c[1], c[2], d == 1, ba, bb, bc);
        GC.gpu->free(ba), GC.gpu->free(bb), GC.gpu->free(bc);
    }
    for (int i = 0; i < 3; i++) comm_destroy(c[i]);
    ring_shift_ranks(2);
    ring_shift_ranks(4);
    if (why[0] && !GC.have_gpu) printf("# skipped: %s\n", why);
    return gc_done();
}
