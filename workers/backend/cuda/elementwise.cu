/* elementwise.cu: the small elementwise ops of the table (add, scale,
 * fp32 <-> bf16 conversions) and the benchmarks' random fill. */
#include "workers/backend/cuda/common.cuh"

/* ---- elementwise kernels ---- */

__global__ void add_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

__global__ void scale_kernel(float *x, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}

__global__ void bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__global__ void fill_normal_kernel(float *p, size_t n, float mean, float std, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t a = mix64(seed + 0x9E3779B97F4A7C15ull * (2 * i + 1)), b = mix64(a + 0x632BE59BD9B4E019ull);
        float u1 = ((a >> 40) + 1.0f) * (1.0f / 16777217.0f), u2 = (b >> 40) * (1.0f / 16777216.0f);
        p[i] = mean + std * sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    }
}

extern "C" void cuda_fill_normal(float *p, size_t n, float mean, float std, uint64_t seed) {
    if (!n) return;
    fill_normal_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_compute_stream()>>>(p, n, mean, std, seed);
    CUDA_LAUNCH_CHECK("fill_normal_kernel");
}

void launch_add(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
    if (!n) return;
    add_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_compute_stream()>>>(out, a, b, n);
    CUDA_LAUNCH_CHECK("add_kernel");
}

void launch_scale(float *x, float s, size_t n) {
    if (!n) return;
    scale_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_compute_stream()>>>(x, s, n);
    CUDA_LAUNCH_CHECK("scale_kernel");
}

void launch_f32_to_bf16(bf16 *dst, const float *src, size_t n) {
    if (!n) return;
    f32_to_bf16_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_compute_stream()>>>(dst, src, n);
    CUDA_LAUNCH_CHECK("f32_to_bf16_kernel");
}

void launch_bf16_to_f32(float *dst, const bf16 *src, size_t n) {
    if (!n) return;
    bf16_to_f32_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_compute_stream()>>>(dst, src, n);
    CUDA_LAUNCH_CHECK("bf16_to_f32_kernel");
}

extern "C" void cuda_act_to_f32(float *dst, const act_t *src, size_t n) { launch_bf16_to_f32(dst, (const bf16 *)src, n); }

