/* rmsnorm.cu: RMSNorm forward and backward (Hugging Face LlamaRMSNorm),
 * bf16 in and out, statistics and the weight gradient in fp32.
 *
 * Forward and the input gradient use one block per row. When D is a
 * multiple of 8 (at most RMS_VEC 16-byte chunks per thread) and the rows
 * are 16-byte aligned, a row is read once, through 16-byte loads, into
 * registers, and the statistic and the output come from there (one pass
 * over memory); otherwise the row is read twice, an element at a time. The
 * weight
 * gradient is a column sum over rows, done in two fixed-order stages
 * (partial sums over chunks of rows, then the chunks in order) so it is
 * deterministic without atomics. */
#include "workers/backend/cuda/common.cuh"

#define RMS_THREADS 256
#define RMS_ROWS_PER_CHUNK 64

/* ---- kernels ---- */

__global__ void rmsnorm_fwd_kernel(bf16 *out, float *rstd, const bf16 *x, const bf16 *w, int D, float eps) {
    int i = blockIdx.x;
    const bf16 *xi = x + (size_t)i * D;
    float ss = 0.f;
    for (int j = threadIdx.x; j < D; j += blockDim.x) { float v = __bfloat162float(xi[j]); ss += v * v; }
    ss = block_sum(ss);
    float r = rsqrtf(ss / (float)D + eps);
    if (threadIdx.x == 0) rstd[i] = r;
    bf16 *oi = out + (size_t)i * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x)
        oi[j] = __float2bfloat16(__bfloat162float(w[j]) * (__bfloat162float(xi[j]) * r));
}

#define RMS_VEC 4 /* 16-byte chunks of a row per thread: D <= 8 * RMS_VEC * RMS_THREADS */

__device__ __forceinline__ void bf8_to_f(const uint4 &v, float *f) {
    const bf16 *e = (const bf16 *)&v;
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = __bfloat162float(e[k]);
}

__global__ void rmsnorm_fwd_vec_kernel(bf16 *out, float *rstd, const bf16 *x, const bf16 *w, int D, float eps) {
    int i = blockIdx.x, nv = D / 8;
    const uint4 *xi = (const uint4 *)(x + (size_t)i * D), *w4 = (const uint4 *)w;
    uint4 *oi = (uint4 *)(out + (size_t)i * D);
    float xr[RMS_VEC][8];
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < RMS_VEC; c++) {
        int j = threadIdx.x + c * blockDim.x;
        if (j < nv) {
            bf8_to_f(xi[j], xr[c]);
#pragma unroll
            for (int k = 0; k < 8; k++) ss += xr[c][k] * xr[c][k];
        }
    }
    ss = block_sum(ss);
    float r = rsqrtf(ss / (float)D + eps);
    if (threadIdx.x == 0) rstd[i] = r;
#pragma unroll
    for (int c = 0; c < RMS_VEC; c++) {
        int j = threadIdx.x + c * blockDim.x;
        if (j < nv) {
            float wf[8];
            bf8_to_f(w4[j], wf);
            uint4 o;
            bf16 *oe = (bf16 *)&o;
#pragma unroll
            for (int k = 0; k < 8; k++) oe[k] = __float2bfloat16(wf[k] * (xr[c][k] * r));
            oi[j] = o;
        }
    }
}

/* dx += r * (g*w - xhat * mean(g*w*xhat)), xhat = x*r, with the row of dout
 * and x held in registers between the two steps */
__global__ void rmsnorm_bwd_dx_vec_kernel(bf16 *dx, const bf16 *dout, const bf16 *x, const bf16 *w, const float *rstd,
                                          int D) {
    int i = blockIdx.x, nv = D / 8;
    const uint4 *xi = (const uint4 *)(x + (size_t)i * D), *gi = (const uint4 *)(dout + (size_t)i * D),
                *w4 = (const uint4 *)w;
    uint4 *dxi = (uint4 *)(dx + (size_t)i * D);
    float r = rstd[i];
    float gw[RMS_VEC][8], xh[RMS_VEC][8];
    float dot = 0.f;
#pragma unroll
    for (int c = 0; c < RMS_VEC; c++) {
        int j = threadIdx.x + c * blockDim.x;
        if (j < nv) {
            float wf[8];
            bf8_to_f(gi[j], gw[c]);
            bf8_to_f(xi[j], xh[c]);
            bf8_to_f(w4[j], wf);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                gw[c][k] *= wf[k];
                xh[c][k] *= r;
                dot += gw[c][k] * xh[c][k];
            }
        }
    }
    float mean = block_sum(dot) / (float)D;
#pragma unroll
    for (int c = 0; c < RMS_VEC; c++) {
        int j = threadIdx.x + c * blockDim.x;
        if (j < nv) {
            uint4 o = dxi[j];
            bf16 *oe = (bf16 *)&o;
#pragma unroll
            for (int k = 0; k < 8; k++) oe[k] = __float2bfloat16(__bfloat162float(oe[k]) + r * (gw[c][k] - xh[c][k] * mean));
            dxi[j] = o;
        }
    }
}

static bool rms_vec_ok(int D, const void *a, const void *b, const void *c, const void *d) {
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d;
    return D % 8 == 0 && D / 8 <= RMS_VEC * RMS_THREADS && (x & 15) == 0;
}

/* dx += r * (g*w - xhat * mean(g*w*xhat)), xhat = x*r */
__global__ void rmsnorm_bwd_dx_kernel(bf16 *dx, const bf16 *dout, const bf16 *x, const bf16 *w, const float *rstd,
                                      int D) {
    int i = blockIdx.x;
    const bf16 *xi = x + (size_t)i * D, *gi = dout + (size_t)i * D;
    float r = rstd[i];
    float dot = 0.f;
    for (int j = threadIdx.x; j < D; j += blockDim.x)
        dot += (__bfloat162float(gi[j]) * __bfloat162float(w[j])) * (__bfloat162float(xi[j]) * r);
    float mean = block_sum(dot) / (float)D;
    bf16 *dxi = dx + (size_t)i * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float xh = __bfloat162float(xi[j]) * r;
        float d = r * (__bfloat162float(gi[j]) * __bfloat162float(w[j]) - xh * mean);
        dxi[j] = __float2bfloat16(__bfloat162float(dxi[j]) + d);
    }
}

/* part (chunks, D): column sums of dout * xhat over RMS_ROWS_PER_CHUNK rows */
__global__ void rmsnorm_bwd_dw_partial(float *part, const bf16 *dout, const bf16 *x, const float *rstd, int N, int D) {
    int j = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    if (j >= D) return;
    int r0 = c * RMS_ROWS_PER_CHUNK, r1 = min(N, r0 + RMS_ROWS_PER_CHUNK);
    float s = 0.f;
    for (int i = r0; i < r1; i++)
        s += __bfloat162float(dout[(size_t)i * D + j]) * (__bfloat162float(x[(size_t)i * D + j]) * rstd[i]);
    part[(size_t)c * D + j] = s;
}

__global__ void rmsnorm_bwd_dw_final(float *dw, const float *part, int chunks, int D) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D) return;
    float s = 0.f;
    for (int c = 0; c < chunks; c++) s += part[(size_t)c * D + j];
    dw[j] += s;
}

/* ---- launchers ---- */

void launch_rmsnorm_fwd(bf16 *out, float *rstd, const bf16 *x, const bf16 *w, int N, int D, float eps) {
    if (N <= 0) return;
    if (rms_vec_ok(D, out, x, w, NULL)) {
        rmsnorm_fwd_vec_kernel<<<N, RMS_THREADS, 0, cuda_compute_stream()>>>(out, rstd, x, w, D, eps);
        CUDA_LAUNCH_CHECK("rmsnorm_fwd_vec_kernel");
        return;
    }
    rmsnorm_fwd_kernel<<<N, RMS_THREADS, 0, cuda_compute_stream()>>>(out, rstd, x, w, D, eps);
    CUDA_LAUNCH_CHECK("rmsnorm_fwd_kernel");
}

void launch_rmsnorm_bwd(bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const bf16 *w, const float *rstd,
                        int N, int D) {
    if (N <= 0) return;
    cudaStream_t st = cuda_compute_stream();
    if (dx) {
        if (rms_vec_ok(D, dx, dout, x, w)) {
            rmsnorm_bwd_dx_vec_kernel<<<N, RMS_THREADS, 0, st>>>(dx, dout, x, w, rstd, D);
            CUDA_LAUNCH_CHECK("rmsnorm_bwd_dx_vec_kernel");
        } else {
            rmsnorm_bwd_dx_kernel<<<N, RMS_THREADS, 0, st>>>(dx, dout, x, w, rstd, D);
            CUDA_LAUNCH_CHECK("rmsnorm_bwd_dx_kernel");
        }
    }
    if (dw) {
        int chunks = (N + RMS_ROWS_PER_CHUNK - 1) / RMS_ROWS_PER_CHUNK;
        float *part = (float *)cuda_scratch(SCRATCH_RMSNORM, (size_t)chunks * D * sizeof(float));
        dim3 grid((D + 255) / 256, chunks);
        rmsnorm_bwd_dw_partial<<<grid, 256, 0, st>>>(part, dout, x, rstd, N, D);
        CUDA_LAUNCH_CHECK("rmsnorm_bwd_dw_partial");
        rmsnorm_bwd_dw_final<<<(D + 255) / 256, 256, 0, st>>>(dw, part, chunks, D);
        CUDA_LAUNCH_CHECK("rmsnorm_bwd_dw_final");
    }
}
