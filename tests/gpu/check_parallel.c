/* check_parallel.c: the sharded / tensor-parallel ops of the CUDA backend
 * (workers/backend/cuda/parallel.cu) against the CPU oracle: fp32
 * accumulation, the pinned host allocation, the vocab-parallel embedding
 * forward and backward, and the vocab-parallel cross-entropy pieces over T
 * slices of a vocabulary (with a padded last slice), whose losses and
 * gradients must also match the whole-vocabulary cross-entropy. */
#include "tests/gpu/gpucheck.h"

static void run_acc(size_t n) {
    if (!gc_case("acc_n%zu", n)) return;
    float *y = gc_host(n), *x = gc_host(n), *ref = gc_host(n);
    gc_rand(y, n, -4, 4);
    gc_rand(x, n, -4, 4);
    memcpy(ref, y, n * sizeof(float));
    GC.cpu->acc(ref, x, n);
    float *gy = gc_dev_f32(y, n), *gx = gc_dev_f32(x, n);
    GC.gpu->acc(gy, gx, n);
    float *h = gc_get_f32(gy, n);
    gc_compare("y += x (fp32)", h, ref, n, GC_F32_TOL);
    GC.gpu->free(gy); GC.gpu->free(gx);
    free(y); free(x); free(ref); free(h);
}

static void run_host_alloc(void) {
    if (!gc_case("host_alloc")) return;
    size_t n = 1 << 20;
    unsigned char *p = GC.gpu->host_alloc(n);
    bool ok = p != NULL;
    for (size_t i = 0; ok && i < n; i++) ok = p[i] == 0;
    if (p) {
        /* a device round trip through it */
        float *src = gc_host(1024), *back = gc_host(1024);
        gc_rand(src, 1024, -1, 1);
        memcpy(p, src, 1024 * sizeof(float));
        float *d = gc_dev_f32((const float *)p, 1024);
        memset(p, 0, 1024 * sizeof(float));
        GC.gpu->to_host(p, d, 1024 * sizeof(float));
        memcpy(back, p, 1024 * sizeof(float));
        ok = ok && memcmp(back, src, 1024 * sizeof(float)) == 0;
        GC.gpu->free(d);
        GC.gpu->host_free(p);
        free(src); free(back);
    }
    GC.cases++;
    if (!ok) GC.failed++;
    printf("%s - %s/host_alloc: zeroed pinned memory, device round trip\n", ok ? "ok" : "not ok", GC.family);
}

static void run_embedding(int N, int D, int V, int T) {
    if (!gc_case("vp_embedding_N%d_D%d_V%d_T%d", N, D, V, T)) return;
    int Vt = (V + T - 1) / T;
    int32_t *tok = (int32_t *)malloc((size_t)N * sizeof(int32_t));
    gc_rand_tokens(tok, N, V);
    float *wte = gc_host((size_t)Vt * D), *dout = gc_host((size_t)N * D);
    float *out = gc_host((size_t)N * D), *dw = gc_host((size_t)Vt * D);
    gc_rand(wte, (size_t)Vt * D, -1, 1);
    gc_round_bf16(wte, (size_t)Vt * D);
    gc_rand(dout, (size_t)N * D, -1, 1);
    gc_round_bf16(dout, (size_t)N * D);
    int32_t *gt = (int32_t *)gc_dev_bytes(tok, (size_t)N * sizeof(int32_t));
    act_t *gw = gc_dev_act(wte, (size_t)Vt * D), *gd = gc_dev_act(dout, (size_t)N * D);
    act_t *gout = (act_t *)GC.gpu->alloc((size_t)N * D * 2);
    for (int t = 0; t < T; t++) {
        int64_t lo = (int64_t)t * Vt;
        GC.cpu->vp_embedding_fwd(out, tok, wte, N, D, lo, Vt);
        gc_poison_act(gout, (size_t)N * D);
        GC.gpu->vp_embedding_fwd(gout, gt, gw, N, D, lo, Vt);
        float *h = gc_get_act(gout, (size_t)N * D);
        char what[64];
        snprintf(what, sizeof what, "forward, slice %d", t);
        gc_compare(what, h, out, (size_t)N * D, GC_BF16_TOL);
        free(h);
        /* backward accumulates into a random start */
        gc_rand(dw, (size_t)Vt * D, -1, 1);
        float *gdw = gc_dev_f32(dw, (size_t)Vt * D);
        GC.cpu->vp_embedding_bwd(dw, dout, tok, N, D, lo, Vt);
        GC.gpu->vp_embedding_bwd(gdw, gd, gt, N, D, lo, Vt);
        h = gc_get_f32(gdw, (size_t)Vt * D);
        snprintf(what, sizeof what, "backward (fp32), slice %d", t);
        gc_compare(what, h, dw, (size_t)Vt * D, GC_F32_TOL);
        free(h);
        GC.gpu->free(gdw);
    }
    GC.gpu->free(gt); GC.gpu->free(gw); GC.gpu->free(gout); GC.gpu->free(gd);
    free(tok); free(wte); free(dout); free(out); free(dw);
}

/* The vocab-parallel cross-entropy over T slices, run one slice after the
 * other on one device (the sums over the group done on the host, in rank
 * order, as the shm collectives do). */
static void run_xent(int N, int V, int T) {
    if (!gc_case("vp_xent_N%d_V%d_T%d", N, V, T)) return;
    int Vt = (V + T - 1) / T;
    int32_t *tgt = (int32_t *)malloc((size_t)N * sizeof(int32_t));
    gc_rand_tokens(tgt, N, V);
    float *full = gc_host((size_t)N * V);
    gc_rand(full, (size_t)N * V, -8, 8);
    gc_round_bf16(full, (size_t)N * V);
    float scale = 1.0f / (float)N;
    /* whole-vocabulary reference */
    float *loss_ref = gc_host(N), *dl_ref = gc_host((size_t)N * V);
    GC.cpu->xent_fwd(loss_ref, full, tgt, N, V);
    GC.cpu->xent_bwd(dl_ref, full, tgt, scale, N, V);
    /* slices (N, Vt), padding columns filled with garbage that must be ignored */
    float **sl = calloc((size_t)T, sizeof *sl);
    act_t **gsl = calloc((size_t)T, sizeof *gsl);
    for (int t = 0; t < T; t++) {
        sl[t] = gc_host((size_t)N * Vt);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vt; j++) {
                int64_t c = (int64_t)t * Vt + j;
                sl[t][(size_t)i * Vt + j] = c < V ? full[(size_t)i * V + c] : 1e4f;
            }
        gsl[t] = gc_dev_act(sl[t], (size_t)N * Vt);
    }
    int32_t *gt = (int32_t *)gc_dev_bytes(tgt, (size_t)N * sizeof(int32_t));
    float *all = gc_host((size_t)T * N), *st = gc_host(2 * (size_t)N), *stsum = gc_host(2 * (size_t)N);
    float *gmx = gc_dev_f32(all, N), *gall = gc_dev_f32(all, (size_t)T * N), *gst = gc_dev_f32(st, 2 * (size_t)N);
    float *glse = gc_dev_f32(st, N), *gloss = gc_dev_f32(st, N);
    /* local maxima, "gathered" */
    for (int t = 0; t < T; t++) {
        int nv = V - t * Vt < Vt ? V - t * Vt : Vt;
        GC.gpu->vp_xent_max(gmx, gsl[t], N, Vt, nv);
        float *h = gc_get_f32(gmx, N);
        memcpy(all + (size_t)t * N, h, (size_t)N * sizeof(float));
        free(h);
    }
    GC.gpu->from_host(gall, all, (size_t)T * N * sizeof(float));
    memset(stsum, 0, 2 * (size_t)N * sizeof(float));
    for (int t = 0; t < T; t++) {
        int nv = V - t * Vt < Vt ? V - t * Vt : Vt;
        GC.gpu->vp_xent_stats(gst, gmx, gall, T, gsl[t], gt, N, Vt, nv, (int64_t)t * Vt);
        float *h = gc_get_f32(gst, 2 * (size_t)N);
        for (size_t i = 0; i < 2 * (size_t)N; i++) stsum[i] += h[i];
        free(h);
    }
    GC.gpu->from_host(gst, stsum, 2 * (size_t)N * sizeof(float));
    GC.gpu->vp_xent_finish(gloss, glse, gst, gmx, N);
    float *hl = gc_get_f32(gloss, N);
    gc_compare("losses over the slices vs the whole vocabulary (fp32)", hl, loss_ref, N, GC_F32_TOL);
    /* backward per slice against the matching columns of the whole gradient */
    float *ref_t = gc_host((size_t)N * Vt);
    for (int t = 0; t < T; t++) {
        int nv = V - t * Vt < Vt ? V - t * Vt : Vt;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vt; j++)
                ref_t[(size_t)i * Vt + j] = j < nv ? dl_ref[(size_t)i * V + (size_t)t * Vt + j] : 0.f;
        GC.gpu->vp_xent_bwd(gsl[t], gsl[t], glse, gt, scale, N, Vt, nv, (int64_t)t * Vt); /* in place */
        float *h = gc_get_act(gsl[t], (size_t)N * Vt);
        char what[64];
        snprintf(what, sizeof what, "dlogits, slice %d (padding 0)", t);
        gc_compare(what, h, ref_t, (size_t)N * Vt, GC_BF16_TOL);
        free(h);
    }
    for (int t = 0; t < T; t++) { GC.gpu->free(gsl[t]); free(sl[t]); }
    GC.gpu->free(gt); GC.gpu->free(gmx); GC.gpu->free(gall); GC.gpu->free(gst); GC.gpu->free(glse);
    GC.gpu->free(gloss);
    free(sl); free(gsl); free(tgt); free(full); free(loss_ref); free(dl_ref); free(all); free(st); free(stsum);
    free(hl); free(ref_t);
}

int main(void) {
    gc_init("parallel");
    run_acc(1);
    run_acc(1000003);
    run_host_alloc();
    run_embedding(64, 96, 1000, 1);
    run_embedding(130, 512, 1003, 4);
    run_xent(7, 1000, 1);
    run_xent(33, 1003, 4);
    run_xent(64, 32000, 2);
    return gc_done();
}
