/* adamw.cu: multi-tensor AdamW on fp32 master weights and moments, writing
 * the bf16 working copy in the same pass.
 *
 * Up to ADAMW_MAX_TENSORS tensors travel by value in the kernel's
 * parameters; each block owns one chunk of one tensor (a short linear search
 * over the chunk prefix sums finds which), so the whole model updates in a
 * handful of launches. The arithmetic is the CPU oracle's, operation by
 * operation, with the _rn intrinsics so that nvcc does not contract it
 * into fused multiply-adds: the fp32 results match to the last bits. */
#include "workers/backend/cuda/common.cuh"

#include <string.h>

#define ADAMW_MAX_TENSORS 32
#define ADAMW_THREADS 256
#define ADAMW_CHUNK (ADAMW_THREADS * 8) /* elements per block */

typedef struct {
    float *p[ADAMW_MAX_TENSORS];
    const float *g[ADAMW_MAX_TENSORS];
    float *m[ADAMW_MAX_TENSORS], *v[ADAMW_MAX_TENSORS];
    bf16 *pa[ADAMW_MAX_TENSORS];
    size_t n[ADAMW_MAX_TENSORS];
    float decay[ADAMW_MAX_TENSORS];          /* 1 - lr * wd, or 1 */
    unsigned first_block[ADAMW_MAX_TENSORS + 1];
    int count;
} adamw_list_t;

typedef struct { float beta1, beta2, eps, step_size, bc2_sqrt, grad_scale; } adamw_hyper_t;

/* ---- kernel ---- */

__global__ void __launch_bounds__(ADAMW_THREADS) adamw_kernel(const __grid_constant__ adamw_list_t L, adamw_hyper_t h) {
    int t = 0;
    while (t + 1 < L.count && blockIdx.x >= L.first_block[t + 1]) t++;
    size_t base = (size_t)(blockIdx.x - L.first_block[t]) * ADAMW_CHUNK, n = L.n[t];
    float *p = L.p[t], *m = L.m[t], *v = L.v[t];
    const float *g = L.g[t];
    bf16 *pa = L.pa[t];
    float decay = L.decay[t];
    for (size_t i = base + threadIdx.x; i < base + ADAMW_CHUNK && i < n; i += ADAMW_THREADS) {
        float gi = __fmul_rn(g[i], h.grad_scale);
        float pi = __fmul_rn(p[i], decay);
        float mi = __fadd_rn(__fmul_rn(m[i], h.beta1), __fmul_rn(1.f - h.beta1, gi));
        float vi = __fadd_rn(__fmul_rn(v[i], h.beta2), __fmul_rn(1.f - h.beta2, __fmul_rn(gi, gi)));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), h.bc2_sqrt), h.eps);
        float np = __fsub_rn(pi, __fmul_rn(h.step_size, __fdiv_rn(mi, denom)));
        m[i] = mi;
        v[i] = vi;
        p[i] = np;
        if (pa) pa[i] = __float2bfloat16(np);
    }
}

/* ---- launchers ---- */

extern "C" void cuda_adamw_multi(const cuda_adamw_tensor_t *ts, int count, float lr, float beta1, float beta2,
                                 float eps, float wd, float step_size, float bc2_sqrt, float grad_scale) {
    adamw_hyper_t h = { beta1, beta2, eps, step_size, bc2_sqrt, grad_scale };
    /* same expression as the CPU: decay = 1 - lr * wd in fp32 */
    float decay_on = 1.f - lr * wd;
    for (int s = 0; s < count; s += ADAMW_MAX_TENSORS) {
        adamw_list_t L;
        memset(&L, 0, sizeof L);
        unsigned blocks = 0;
        for (int k = s; k < count && k < s + ADAMW_MAX_TENSORS; k++) {
            if (ts[k].n == 0) continue;
            int c = L.count++;
            L.p[c] = ts[k].p; L.g[c] = ts[k].g; L.m[c] = ts[k].m; L.v[c] = ts[k].v;
            L.pa[c] = (bf16 *)ts[k].p_act;
            L.n[c] = ts[k].n;
            L.decay[c] = ts[k].decay ? decay_on : 1.f;
            L.first_block[c] = blocks;
            size_t nb = (ts[k].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
            if (blocks + nb > 0x7fffffffu) { fprintf(stderr, "%s:%d: AdamW launch too large\n", __FILE__, __LINE__); exit(1); }
            blocks += (unsigned)nb;
        }
        L.first_block[L.count] = blocks;
        if (blocks == 0) continue;
        adamw_kernel<<<blocks, ADAMW_THREADS, 0, cuda_compute_stream()>>>(L, h);
        CUDA_LAUNCH_CHECK("adamw_kernel");
    }
}
