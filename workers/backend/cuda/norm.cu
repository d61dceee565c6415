/* norm.cu: sum of squares for the global gradient norm, deterministic.
 *
 * Stage one gives every buffer a fixed number of blocks (NORM_BLOCKS, not
 * the device's multiprocessor count, so results do not depend on the GPU);
 * each thread accumulates its grid-stride elements in double, each block
 * reduces in a fixed tree. Stage two sums all partials in index order in
 * one block. One host read at the end. */
#include "workers/backend/cuda/common.cuh"

#define NORM_BLOCKS 256
#define NORM_THREADS 256

/* ---- kernels ---- */

__device__ double block_sum_d(double v) {
    __shared__ double buf[NORM_THREADS];
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int s = NORM_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    double r = buf[0];
    __syncthreads();
    return r;
}

__global__ void __launch_bounds__(NORM_THREADS) sumsq_partial(double *part, const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)NORM_THREADS + threadIdx.x; i < n; i += (size_t)NORM_BLOCKS * NORM_THREADS) {
        double v = x[i];
        s += v * v;
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void __launch_bounds__(NORM_THREADS) sumsq_final(double *out, const double *part, int count) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += NORM_THREADS) s += part[i];
    s = block_sum_d(s);
    if (threadIdx.x == 0) *out = s;
}

/* ---- launchers ---- */

extern "C" double cuda_sumsq_multi(const float *const *xs, const size_t *ns, int count) {
    if (count <= 0) return 0.0;
    cudaStream_t st = cuda_compute_stream();
    double *part = (double *)cuda_scratch(SCRATCH_NORM, ((size_t)count * NORM_BLOCKS + 1) * sizeof(double));
    for (int k = 0; k < count; k++) {
        if (ns[k] == 0) {
            CUDA_CHECK(cudaMemsetAsync(part + (size_t)k * NORM_BLOCKS, 0, NORM_BLOCKS * sizeof(double), st));
            continue;
        }
        sumsq_partial<<<NORM_BLOCKS, NORM_THREADS, 0, st>>>(part + (size_t)k * NORM_BLOCKS, xs[k], ns[k]);
        CUDA_LAUNCH_CHECK("sumsq_partial");
    }
    double *out = part + (size_t)count * NORM_BLOCKS;
    sumsq_final<<<1, NORM_THREADS, 0, st>>>(out, part, count * NORM_BLOCKS);
    CUDA_LAUNCH_CHECK("sumsq_final");
    double h = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&h, out, sizeof h, cudaMemcpyDeviceToHost, st));
    cuda_host_wait(st);
    return h;
}
