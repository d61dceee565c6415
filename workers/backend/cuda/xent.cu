/* xent.cu: softmax cross-entropy over a large vocabulary (e.g. 128256),
 * forward (per-row loss) and backward (dlogits, in place if asked).
 *
 * One block per row. A single pass over the logits keeps a running
 * (max, sum of exp) per thread, merged across the block at the end (online
 * softmax), so the forward reads the row once and the backward reads it
 * once more to write the gradient: the probabilities are never stored. */
#include "workers/backend/cuda/common.cuh"

#define XENT_THREADS 512

/* ---- helpers ---- */

__device__ __forceinline__ void online_add(float x, float *m, float *s) {
    if (x > *m) { *s = *s * expf(*m - x) + 1.f; *m = x; }
    else *s += expf(x - *m);
}

/* Max and sum of exp(l - max) of one row, every thread gets both. */
__device__ void row_stats(const bf16 *l, int V, bool vec, float *M, float *S) {
    float m = -INFINITY, s = 0.f;
    if (vec) {
        for (int j = threadIdx.x; j < V / 8; j += blockDim.x) {
            uint4 raw = ((const uint4 *)l)[j];
            const bf16 *e = (const bf16 *)&raw;
#pragma unroll
            for (int k = 0; k < 8; k++) online_add(__bfloat162float(e[k]), &m, &s);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) online_add(__bfloat162float(l[j]), &m, &s);
    }
    float bm = block_max(m);
    s = m == -INFINITY ? 0.f : s * expf(m - bm);
    *S = block_sum(s);
    *M = bm;
}

/* ---- kernels ---- */

__global__ void xent_fwd_kernel(float *losses, const bf16 *logits, const int32_t *tgt, int V, bool vec) {
    int i = blockIdx.x;
    const bf16 *l = logits + (size_t)i * V;
    float M, S;
    row_stats(l, V, vec, &M, &S);
    if (threadIdx.x == 0) losses[i] = logf(S) + M - __bfloat162float(l[tgt[i]]);
}

__global__ void xent_bwd_kernel(bf16 *dl, const bf16 *logits, const int32_t *tgt, float scale, int V, bool vec) {
    int i = blockIdx.x;
    const bf16 *l = logits + (size_t)i * V;
    bf16 *d = dl + (size_t)i * V;
    float M, S;
    row_stats(l, V, vec, &M, &S);
    /* every thread has read its elements; when dl aliases logits a thread
     * overwrites only elements it reads itself below, and row_stats ended
     * with a barrier, so no thread still needs the old values */
    float inv = 1.f / S;
    int y = tgt[i];
    if (vec) {
        for (int j = threadIdx.x; j < V / 8; j += blockDim.x) {
            uint4 raw = ((const uint4 *)l)[j], out;
            const bf16 *e = (const bf16 *)&raw;
            bf16 *o = (bf16 *)&out;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float p = expf(__bfloat162float(e[k]) - M) * inv;
                o[k] = __float2bfloat16((p - (j * 8 + k == y ? 1.f : 0.f)) * scale);
            }
            ((uint4 *)d)[j] = out;
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float p = expf(__bfloat162float(l[j]) - M) * inv;
            d[j] = __float2bfloat16((p - (j == y ? 1.f : 0.f)) * scale);
        }
    }
}

/* ---- launchers ---- */

static bool vec_ok(const void *a, const void *b, int V) {
    return V % 8 == 0 && (((uintptr_t)a | (uintptr_t)b) & 15) == 0;
}

void launch_xent_fwd(float *losses, const bf16 *logits, const int32_t *tgt, int N, int V) {
    if (N <= 0) return;
    xent_fwd_kernel<<<N, XENT_THREADS, 0, cuda_compute_stream()>>>(losses, logits, tgt, V, vec_ok(logits, logits, V));
    CUDA_LAUNCH_CHECK("xent_fwd_kernel");
}

void launch_xent_bwd(bf16 *dlogits, const bf16 *logits, const int32_t *tgt, float scale, int N, int V) {
    if (N <= 0) return;
    xent_bwd_kernel<<<N, XENT_THREADS, 0, cuda_compute_stream()>>>(dlogits, logits, tgt, scale, V,
                                                                    vec_ok(dlogits, logits, V));
    CUDA_LAUNCH_CHECK("xent_bwd_kernel");
}
