/* swiglu.cu: the SwiGLU gate of the Llama MLP, h = silu(gate) * up, and its
 * backward, elementwise on bf16 with fp32 arithmetic.
 *
 * Each thread handles 8 elements through 16-byte loads when n and the
 * pointers allow it, one element otherwise. */
#include "workers/backend/cuda/common.cuh"

/* ---- math (one element) ---- */

__device__ __forceinline__ float swiglu_f(float g, float u) {
    float s = 1.f / (1.f + expf(-g));
    return g * s * u;
}

__device__ __forceinline__ void swiglu_b(float dh, float g, float u, float *dg, float *du) {
    float s = 1.f / (1.f + expf(-g));
    *dg = dh * u * s * (1.f + g * (1.f - s));
    *du = dh * (g * s);
}

/* Eight elements in 16-byte vectors. */
__device__ __forceinline__ uint4 swiglu_f8(uint4 gv, uint4 uv) {
    uint4 hv;
    const bf16 *gg = (const bf16 *)&gv, *uu = (const bf16 *)&uv;
    bf16 *hh = (bf16 *)&hv;
#pragma unroll
    for (int k = 0; k < 8; k++) hh[k] = __float2bfloat16(swiglu_f(__bfloat162float(gg[k]), __bfloat162float(uu[k])));
    return hv;
}

__device__ __forceinline__ void swiglu_b8(uint4 dv, uint4 gv, uint4 uv, uint4 *dgv, uint4 *duv) {
    const bf16 *d8 = (const bf16 *)&dv, *g8 = (const bf16 *)&gv, *u8 = (const bf16 *)&uv;
    bf16 *o8 = (bf16 *)dgv, *p8 = (bf16 *)duv;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float a, b;
        swiglu_b(__bfloat162float(d8[k]), __bfloat162float(g8[k]), __bfloat162float(u8[k]), &a, &b);
        o8[k] = __float2bfloat16(a);
        p8[k] = __float2bfloat16(b);
    }
}

/* ---- kernels ---- */

__global__ void swiglu_fwd_kernel(bf16 *h, const bf16 *g, const bf16 *u, size_t n, bool vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (vec) {
        for (size_t i = i0; i < n / 8; i += stride) ((uint4 *)h)[i] = swiglu_f8(((const uint4 *)g)[i], ((const uint4 *)u)[i]);
    } else {
        for (size_t i = i0; i < n; i += stride) h[i] = __float2bfloat16(swiglu_f(__bfloat162float(g[i]), __bfloat162float(u[i])));
    }
}

__global__ void swiglu_bwd_kernel(bf16 *dg, bf16 *du, const bf16 *dh, const bf16 *g, const bf16 *u, size_t n, bool vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (vec) {
        for (size_t i = i0; i < n / 8; i += stride) {
            uint4 ov, pv;
            swiglu_b8(((const uint4 *)dh)[i], ((const uint4 *)g)[i], ((const uint4 *)u)[i], &ov, &pv);
            ((uint4 *)dg)[i] = ov;
            ((uint4 *)du)[i] = pv;
        }
    } else {
        for (size_t i = i0; i < n; i += stride) {
            float a, b;
            swiglu_b(__bfloat162float(dh[i]), __bfloat162float(g[i]), __bfloat162float(u[i]), &a, &b);
            dg[i] = __float2bfloat16(a);
            du[i] = __float2bfloat16(b);
        }
    }
}

/* The packed gate | up rows (backend.h, swiglu_gu_*): gu (N, 2F), one block
 * per row, 8 elements per thread through 16-byte loads when F and the
 * pointers allow; dgu is written packed the same way. */
__global__ void swiglu_gu_fwd_kernel(bf16 *h, const bf16 *gu, int F, bool vec) {
    const bf16 *g = gu + (size_t)blockIdx.x * 2 * F, *u = g + F;
    bf16 *hr = h + (size_t)blockIdx.x * F;
    if (vec) {
        for (int i = threadIdx.x; i < F / 8; i += blockDim.x) ((uint4 *)hr)[i] = swiglu_f8(((const uint4 *)g)[i], ((const uint4 *)u)[i]);
    } else {
        for (int i = threadIdx.x; i < F; i += blockDim.x)
            hr[i] = __float2bfloat16(swiglu_f(__bfloat162float(g[i]), __bfloat162float(u[i])));
    }
}

__global__ void swiglu_gu_bwd_kernel(bf16 *dgu, const bf16 *dh, const bf16 *gu, int F, bool vec) {
    size_t r = blockIdx.x;
    const bf16 *g = gu + r * 2 * F, *u = g + F, *d = dh + r * F;
    bf16 *dg = dgu + r * 2 * F, *du = dg + F;
    if (vec) {
        for (int i = threadIdx.x; i < F / 8; i += blockDim.x) {
            uint4 ov, pv;
            swiglu_b8(((const uint4 *)d)[i], ((const uint4 *)g)[i], ((const uint4 *)u)[i], &ov, &pv);
            ((uint4 *)dg)[i] = ov;
            ((uint4 *)du)[i] = pv;
        }
    } else {
        for (int i = threadIdx.x; i < F; i += blockDim.x) {
            float a, b;
            swiglu_b(__bfloat162float(d[i]), __bfloat162float(g[i]), __bfloat162float(u[i]), &a, &b);
            dg[i] = __float2bfloat16(a);
            du[i] = __float2bfloat16(b);
        }
    }
}

/* ---- launchers ---- */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

void launch_swiglu_fwd(bf16 *h, const bf16 *g, const bf16 *u, size_t n) {
    if (n == 0) return;
    bool vec = n % 8 == 0 && aligned16(h) && aligned16(g) && aligned16(u);
    swiglu_fwd_kernel<<<cuda_blocks(vec ? n / 8 : n, 256), 256, 0, cuda_compute_stream()>>>(h, g, u, n, vec);
    CUDA_LAUNCH_CHECK("swiglu_fwd_kernel");
}

void launch_swiglu_bwd(bf16 *dg, bf16 *du, const bf16 *dh, const bf16 *g, const bf16 *u, size_t n) {
    if (n == 0) return;
    bool vec = n % 8 == 0 && aligned16(dg) && aligned16(du) && aligned16(dh) && aligned16(g) && aligned16(u);
    swiglu_bwd_kernel<<<cuda_blocks(vec ? n / 8 : n, 256), 256, 0, cuda_compute_stream()>>>(dg, du, dh, g, u, n, vec);
    CUDA_LAUNCH_CHECK("swiglu_bwd_kernel");
}

void launch_swiglu_gu_fwd(bf16 *h, const bf16 *gu, int N, int F) {
    if (N <= 0 || F <= 0) return;
    bool vec = F % 8 == 0 && aligned16(h) && aligned16(gu);
    int work = vec ? F / 8 : F;
    swiglu_gu_fwd_kernel<<<(unsigned)N, work >= 256 ? 256 : (work + 31) / 32 * 32, 0, cuda_compute_stream()>>>(h, gu, F, vec);
    CUDA_LAUNCH_CHECK("swiglu_gu_fwd_kernel");
}

void launch_swiglu_gu_bwd(bf16 *dgu, const bf16 *dh, const bf16 *gu, int N, int F) {
    if (N <= 0 || F <= 0) return;
    bool vec = F % 8 == 0 && aligned16(dgu) && aligned16(dh) && aligned16(gu);
    int work = vec ? F / 8 : F;
    swiglu_gu_bwd_kernel<<<(unsigned)N, work >= 256 ? 256 : (work + 31) / 32 * 32, 0, cuda_compute_stream()>>>(dgu, dh, gu, F,
                                                                                                          vec);
    CUDA_LAUNCH_CHECK("swiglu_gu_bwd_kernel");
}
