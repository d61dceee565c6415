/* parallel.cu: the CUDA backend's ops for sharded and tensor-parallel
 * training (workers/backend/backend.h, "sharded and tensor-parallel training"):
 * fp32 accumulation of reduce-scatter results, pinned host staging, the
 * vocab-parallel embedding and the vocab-parallel cross-entropy pieces.
 *
 * Kept simple on purpose: one thread per element or one block per row,
 * fixed summation orders (deterministic), every launch checked. Logits and
 * activations are bf16, statistics fp32. cuda_parallel_fill puts the ops
 * into the backend's table (called from backend_cuda()). */
#include "workers/backend/cuda/common.cuh"

#include <string.h>

#define PAR_THREADS 256

/* ---- fp32 accumulation ---- */

__global__ void acc_kernel(float *y, const float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

static void cu_acc(float *y, const float *x, size_t n) {
    if (!n) return;
    acc_kernel<<<cuda_blocks(n, PAR_THREADS), PAR_THREADS, 0, cuda_compute_stream()>>>(y, x, n);
    CUDA_LAUNCH_CHECK("acc_kernel");
}

/* ---- gradients reduced in bf16 ---- */

__global__ void grad_to_bf16_kernel(bf16 *d, const float *s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = __float2bfloat16_rn(s[i]);
}

__global__ void acc_bf16_kernel(float *y, const bf16 *x, size_t n, int overwrite) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = overwrite ? __bfloat162float(x[i]) : y[i] + __bfloat162float(x[i]);
}

static void cu_to_bf16(void *dst, const float *src, size_t n) {
    if (!n) return;
    grad_to_bf16_kernel<<<cuda_blocks(n, PAR_THREADS), PAR_THREADS, 0, cuda_compute_stream()>>>((bf16 *)dst, src, n);
    CUDA_LAUNCH_CHECK("grad_to_bf16_kernel");
}

static void cu_acc_bf16(float *y, const void *x, size_t n) {
    if (!n) return;
    acc_bf16_kernel<<<cuda_blocks(n, PAR_THREADS), PAR_THREADS, 0, cuda_compute_stream()>>>(y, (const bf16 *)x, n, 0);
    CUDA_LAUNCH_CHECK("acc_bf16_kernel");
}

static void cu_from_bf16(float *y, const void *x, size_t n) {
    if (!n) return;
    acc_bf16_kernel<<<cuda_blocks(n, PAR_THREADS), PAR_THREADS, 0, cuda_compute_stream()>>>(y, (const bf16 *)x, n, 1);
    CUDA_LAUNCH_CHECK("acc_bf16_kernel");
}

/* ---- pinned host staging (zeroed, as the table promises) ---- */

static void *cu_host_alloc(size_t bytes) {
    void *p = cuda_host_alloc(bytes);
    if (p) memset(p, 0, bytes ? bytes : 1);
    return p;
}

static void cu_host_free(void *p) { cuda_host_free(p); }

/* ---- vocab-parallel embedding ---- */

__global__ void vp_embed_fwd_kernel(bf16 *out, const int32_t *tok, const bf16 *wte, int N, int D, int64_t lo, int Vt) {
    size_t n = (size_t)N * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / (size_t)D, d = e % (size_t)D;
        int64_t j = (int64_t)tok[i] - lo;
        out[e] = j >= 0 && j < Vt ? wte[(size_t)j * D + d] : __float2bfloat16(0.f);
    }
}

/* One thread per column d: the rows are added in token order, so the sums
 * are the same bits every run and no two threads write one element. */
__global__ void vp_embed_bwd_kernel(float *dwte, const bf16 *dout, const int32_t *tok, int N, int D, int64_t lo,
                                    int Vt) {
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    for (int i = 0; i < N; i++) {
        int64_t j = (int64_t)tok[i] - lo;
        if (j >= 0 && j < Vt) dwte[(size_t)j * D + d] += __bfloat162float(dout[(size_t)i * D + d]);
    }
}

static void cu_vp_embedding_fwd(act_t *out, const int32_t *tok, const act_t *wte, int N, int D, int64_t lo, int Vt) {
    if (N <= 0 || D <= 0) return;
    vp_embed_fwd_kernel<<<cuda_blocks((size_t)N * D, PAR_THREADS), PAR_THREADS, 0, cuda_compute_stream()>>>(
        (bf16 *)out, tok, (const bf16 *)wte, N, D, lo, Vt);
    CUDA_LAUNCH_CHECK("vp_embed_fwd_kernel");
}

static void cu_vp_embedding_bwd(float *dwte, const act_t *dout, const int32_t *tok, int N, int D, int64_t lo, int Vt) {
    if (N <= 0 || D <= 0) return;
    vp_embed_bwd_kernel<<<(D + PAR_THREADS - 1) / PAR_THREADS, PAR_THREADS, 0, cuda_compute_stream()>>>(
        dwte, (const bf16 *)dout, tok, N, D, lo, Vt);
    CUDA_LAUNCH_CHECK("vp_embed_bwd_kernel");
}

/* ---- vocab-parallel cross-entropy, one block per row ---- */

__global__ void vp_xent_max_kernel(float *mx, const bf16 *logits, int Vt, int nv) {
    const bf16 *l = logits + (size_t)blockIdx.x * Vt;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) m = fmaxf(m, __bfloat162float(l[j]));
    m = block_max(m);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void vp_xent_stats_kernel(float *st, float *mx, const float *all, int T, const bf16 *logits,
                                     const int32_t *tgt, int N, int Vt, int nv, int64_t lo) {
    int i = blockIdx.x;
    const bf16 *l = logits + (size_t)i * Vt;
    float m = -INFINITY;
    for (int t = 0; t < T; t++) m = fmaxf(m, all[(size_t)t * N + i]);
    float s = 0.f;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) s += expf(__bfloat162float(l[j]) - m);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        int64_t y = (int64_t)tgt[i] - lo;
        mx[i] = m;
        st[i] = s;
        st[N + i] = y >= 0 && y < nv ? __bfloat162float(l[y]) : 0.f;
    }
}

__global__ void vp_xent_finish_kernel(float *losses, float *lse, const float *st, const float *mx, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float z = logf(st[i]) + mx[i];
    lse[i] = z;
    losses[i] = z - st[N + i];
}

/* Each thread reads and writes only its own elements, so dl may alias logits. */
__global__ void vp_xent_bwd_kernel(bf16 *dl, const bf16 *logits, const float *lse, const int32_t *tgt, float scale,
                                   int Vt, int nv, int64_t lo) {
    int i = blockIdx.x;
    const bf16 *l = logits + (size_t)i * Vt;
    bf16 *d = dl + (size_t)i * Vt;
    float z = lse[i];
    int64_t y = (int64_t)tgt[i] - lo;
    for (int j = threadIdx.x; j < Vt; j += blockDim.x) {
        float g = 0.f;
        if (j < nv) g = (expf(__bfloat162float(l[j]) - z) - (j == y ? 1.f : 0.f)) * scale;
        d[j] = __float2bfloat16(g);
    }
}

static void cu_vp_xent_max(float *mx, const act_t *logits, int N, int Vt, int nv) {
    if (N <= 0) return;
    vp_xent_max_kernel<<<N, PAR_THREADS, 0, cuda_compute_stream()>>>(mx, (const bf16 *)logits, Vt, nv);
    CUDA_LAUNCH_CHECK("vp_xent_max_kernel");
}

static void cu_vp_xent_stats(float *st, float *mx, const float *all, int T, const act_t *logits, const int32_t *tgt,
                             int N, int Vt, int nv, int64_t lo) {
    if (N <= 0) return;
    vp_xent_stats_kernel<<<N, PAR_THREADS, 0, cuda_compute_stream()>>>(st, mx, all, T, (const bf16 *)logits, tgt, N,
                                                                        Vt, nv, lo);
    CUDA_LAUNCH_CHECK("vp_xent_stats_kernel");
}

static void cu_vp_xent_finish(float *losses, float *lse, const float *st, const float *mx, int N) {
    if (N <= 0) return;
    vp_xent_finish_kernel<<<(N + PAR_THREADS - 1) / PAR_THREADS, PAR_THREADS, 0, cuda_compute_stream()>>>(
        losses, lse, st, mx, N);
    CUDA_LAUNCH_CHECK("vp_xent_finish_kernel");
}

static void cu_vp_xent_bwd(act_t *dl, const act_t *logits, const float *lse, const int32_t *tgt, float scale, int N,
                           int Vt, int nv, int64_t lo) {
    if (N <= 0) return;
    vp_xent_bwd_kernel<<<N, PAR_THREADS, 0, cuda_compute_stream()>>>((bf16 *)dl, (const bf16 *)logits, lse, tgt,
                                                                      scale, Vt, nv, lo);
    CUDA_LAUNCH_CHECK("vp_xent_bwd_kernel");
}

/* ---- the table ---- */

void cuda_parallel_fill(backend_t *t) {
    t->acc = cu_acc;
    t->to_bf16 = cu_to_bf16;
    t->acc_bf16 = cu_acc_bf16;
    t->from_bf16 = cu_from_bf16;
    t->host_alloc = cu_host_alloc;
    t->host_free = cu_host_free;
    t->vp_embedding_fwd = cu_vp_embedding_fwd;
    t->vp_embedding_bwd = cu_vp_embedding_bwd;
    t->vp_xent_max = cu_vp_xent_max;
    t->vp_xent_stats = cu_vp_xent_stats;
    t->vp_xent_finish = cu_vp_xent_finish;
    t->vp_xent_bwd = cu_vp_xent_bwd;
}
