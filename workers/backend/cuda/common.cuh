/* common.cuh: what every kernel file of the CUDA backend shares.
 *
 * Error checks for runtime, cuBLAS/cuBLASLt and kernel launches that print
 * file, line, the failing call and a hint, then exit (the worker is a batch
 * program: STYLE.md), bf16 <-> fp32 helpers, warp and block reductions, and
 * the backend's compute stream. Relies on the CUDA runtime and cuda_bf16.h
 * only; the op files include it and nothing else of the backend. */
#ifndef BALLAST_CUDA_COMMON_CUH
#define BALLAST_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "workers/backend/cuda/backend_cuda.h"

typedef __nv_bfloat16 bf16;

/* ---- error checks ---- */

/* A hint for the errors people actually hit; NULL when there is none. */
static inline const char *cuda_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorNoDevice: return "no GPU visible: check nvidia-smi and CUDA_VISIBLE_DEVICES";
    case cudaErrorInsufficientDriver: return "the driver is older than this CUDA runtime: update the driver or build with the machine's nvcc";
    case cudaErrorMemoryAllocation: return "out of GPU memory: lower --micro-batch or --seq-len, or turn on --activation-checkpointing";
    case cudaErrorNoKernelImageForDevice: return "no kernel image for this GPU: add its -gencode to CUDA_ARCHS (sm_80 and sm_90a are built)";
    case cudaErrorInvalidConfiguration: return "bad launch configuration (grid or block too large, or too much shared memory)";
    case cudaErrorIllegalAddress: return "a kernel read or wrote out of bounds: rerun under compute-sanitizer";
    case cudaErrorLaunchOutOfResources: return "too many registers or threads for this kernel";
    default: return NULL;
    }
}

static inline void cuda_check_at(cudaError_t e, const char *call, const char *file, int line) {
    if (e == cudaSuccess) return;
    const char *hint = cuda_hint(e);
    fprintf(stderr, "%s:%d: CUDA error %s (%s) in %s%s%s\n", file, line, cudaGetErrorName(e),
            cudaGetErrorString(e), call, hint ? "; hint: " : "", hint ? hint : "");
    exit(1);
}
#define CUDA_CHECK(call) cuda_check_at((call), #call, __FILE__, __LINE__)

/* After every launch: catches bad configurations at once; with
 * --cuda-sync (cuda_set_sync) also synchronizes so a fault names its kernel. */
void cuda_launch_check_at(const char *kernel, const char *file, int line);
#define CUDA_LAUNCH_CHECK(kernel) cuda_launch_check_at(kernel, __FILE__, __LINE__)

/* What the per-op table counts (runtime.cu): kernel launches (every
 * CUDA_LAUNCH_CHECK), cuBLASLt matmuls (lt_matmul) and host waits for a
 * stream (cuda_host_wait) since the process started. */
typedef struct { long launches, gemms, host_waits; } cuda_counts_t;
cuda_counts_t *cuda_counts(void);
/* cudaStreamSynchronize(s), counted */
void cuda_host_wait(cudaStream_t s);

#ifdef BALLAST_CUDA_WITH_CUBLAS
#include <cublasLt.h>
/* Only cuBLASLt is linked, so the status names are ours. */
static inline const char *cublas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
    }
}
static inline void cublas_check_at(cublasStatus_t s, const char *call, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    const char *hint = s == CUBLAS_STATUS_NOT_SUPPORTED ? "this shape/type combination has no cuBLASLt algorithm: check the leading dimensions (multiples of 8 elements help)"
                     : s == CUBLAS_STATUS_ALLOC_FAILED ? "out of GPU memory for the cuBLAS workspace"
                     : s == CUBLAS_STATUS_NOT_INITIALIZED ? "cuBLAS could not start: check the driver and that a GPU is visible"
                     : s == CUBLAS_STATUS_INVALID_VALUE ? "an argument is out of range (a zero or negative size, or a bad pointer)"
                     : s == CUBLAS_STATUS_ARCH_MISMATCH ? "this GPU lacks a feature the call needs (bf16 needs compute capability 8.0+)"
                     : NULL;
    fprintf(stderr, "%s:%d: cuBLAS error %d (%s) in %s%s%s\n", file, line, (int)s, cublas_status_name(s), call,
            hint ? "; hint: " : "", hint ? hint : "");
    exit(1);
}
#define CUBLAS_CHECK(call) cublas_check_at((call), #call, __FILE__, __LINE__)

/* ---- the one cuBLASLt handle, workspace and plan cache (cublaslt.cu) ----
 * Every GEMM of the backend (bf16 in gemm.cu, FP8 in gemm_fp8.cu) runs
 * through these: column-major D (m, n) = op(A) (m, k) . op(B) (k, n) +
 * beta D, leading dimensions the packed ones. */
typedef struct {
    int m, n, k;
    cublasOperation_t ta, tb;
    cudaDataType_t at, bt, dt; /* element types of A, B and C = D */
    bool beta1;                /* the caller accumulates (beta = 1) */
    uint32_t align_ab;         /* bytes A and B are aligned to (256 = cuBLASLt's default assumption) */
    uint32_t align_cd;         /* bytes C = D is aligned to */
} lt_shape_t;
typedef struct lt_plan lt_plan_t;
/* The cached plan (descriptor, layouts, the heuristic's first algorithm)
 * for a shape; NULL, cached too, when cuBLASLt has no algorithm for it
 * (*why gets the heuristic's status). *first (may be NULL) is true when this
 * call asked the heuristic, false when the answer came from the cache. */
const lt_plan_t *lt_plan(const lt_shape_t *s, cublasStatus_t *why, bool *first);
/* D = op(A) . op(B) + beta D on the compute stream. */
void lt_matmul(const lt_plan_t *p, const void *A, const void *B, void *D, float beta);
/* D = op(A) . op(B) + C (beta = 1), C of D's type and layout; C may be D. */
void lt_matmul_c(const lt_plan_t *p, const void *A, const void *B, const void *C, void *D);
/* FP8: the dequantization factors cuBLASLt reads through pointers (device). */
void lt_set_scales(const lt_plan_t *p, const float *a_inv, const float *b_inv);
#endif

/* ---- backend internals shared between files ---- */

/* The stream every table op runs on; created by cuda_streams_init (streams.cu). */
cudaStream_t cuda_compute_stream(void);
void cuda_streams_init(void);

/* The table's xfer ops and stream accessor (streams.cu; backend.h). */
struct be_xfer *cuda_xfer_to_host(void *host_dst, const void *src, size_t bytes);
struct be_xfer *cuda_xfer_from_host(void *dst, const void *host_src, size_t bytes);
void cuda_xfer_order(struct be_xfer *x);
void cuda_xfer_wait(struct be_xfer *x);
bool cuda_xfer_done(struct be_xfer *x);
void *cuda_compute_stream_ptr(void);
void cuda_op_scope(int s);   /* gemm_fp8.cu: the scope FP8 states are keyed by */

/* Device scratch that grows on demand, one buffer per slot (runtime.cu).
 * Contents are undefined; a slot is owned by one op for the op's duration.
 * Growing frees the old buffer (cudaFree synchronizes the device). */
enum { SCRATCH_RMSNORM, SCRATCH_ATTN, SCRATCH_NORM, SCRATCH_EMBED, SCRATCH_ROPE, SCRATCH_MMRES, SCRATCH_CUDNN, SCRATCH_NSLOTS };
void *cuda_scratch(int slot, size_t bytes);

/* ---- op launchers, one family per file; pointers are device memory ---- */

void launch_add(bf16 *out, const bf16 *a, const bf16 *b, size_t n);                   /* elementwise.cu */
void launch_scale(float *x, float s, size_t n);
void launch_f32_to_bf16(bf16 *dst, const float *src, size_t n);
void launch_bf16_to_f32(float *dst, const bf16 *src, size_t n);
void launch_embedding_fwd(bf16 *out, const int32_t *tok, const bf16 *wte, int N, int D);  /* embedding.cu */
void launch_embedding_bwd(float *dwte, const bf16 *dout, const int32_t *tok, int N, int D);
void launch_rmsnorm_fwd(bf16 *out, float *rstd, const bf16 *x, const bf16 *w, int N, int D, float eps); /* rmsnorm.cu */
void launch_rmsnorm_bwd(bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const bf16 *w, const float *rstd,
                        int N, int D);
void launch_rope(bf16 *x, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r, bool inverse); /* rope.cu */
void launch_qkv_split_rope(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, int B, int T, int H, int Hkv, int Dh, int pos0,
                           const be_rope_t *r);                                          /* rope.cu */
void launch_qkv_pack_rope(bf16 *dqkv, const bf16 *dq, const bf16 *dk, const bf16 *dv, int B, int T, int H, int Hkv,
                          int Dh, int pos0, const be_rope_t *r);
void launch_swiglu_gu_fwd(bf16 *h, const bf16 *gu, int N, int F);                       /* swiglu.cu */
void launch_swiglu_gu_bwd(bf16 *dgu, const bf16 *dh, const bf16 *gu, int N, int F);
void launch_swiglu_fwd(bf16 *h, const bf16 *g, const bf16 *u, size_t n);              /* swiglu.cu */
void launch_swiglu_bwd(bf16 *dg, bf16 *du, const bf16 *dh, const bf16 *g, const bf16 *u, size_t n);
void launch_xent_fwd(float *losses, const bf16 *logits, const int32_t *tgt, int N, int V); /* xent.cu */
void launch_xent_bwd(bf16 *dlogits, const bf16 *logits, const int32_t *tgt, float scale, int N, int V);
void launch_attention_fwd(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H,
                          int Hkv, int Dh);                                            /* attention.cu */
void launch_attention_bwd(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out, const bf16 *q,
                          const bf16 *k, const bf16 *v, const float *lse, int B, int T, int H, int Hkv, int Dh);
void launch_attention_fwd_tc(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H,
                             int Hkv, int Dh, float scale);                            /* attention_tc.cu */
/* dvec: (B, H, T) fp32 scratch the tensor-core backward fills with D = rowsum(dO * O) */
void launch_attention_bwd_tc(bf16 *dq, bf16 *dk, bf16 *dv, float *dvec, const bf16 *dout, const bf16 *out,
                             const bf16 *q, const bf16 *k, const bf16 *v, const float *lse, int B, int T, int H,
                             int Hkv, int Dh, float scale);
/* our own kernels whatever --attention chose (attention.cu), and cuDNN's
 * fused attention (attention_cudnn.cu: 0 when it ran, -1 with the reason
 * when it refused the call) */
void launch_attention_fwd_own(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H,
                              int Hkv, int Dh);
void launch_attention_bwd_own(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out, const bf16 *q,
                              const bf16 *k, const bf16 *v, const float *lse, int B, int T, int H, int Hkv, int Dh);
int cudnn_attention_fwd(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H,
                        int Hkv, int Dh, char *err, size_t errlen);
int cudnn_attention_bwd(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out, const bf16 *q,
                        const bf16 *k, const bf16 *v, const float *lse, int B, int T, int H, int Hkv, int Dh,
                        char *err, size_t errlen);
int cudnn_attention_open(char *why, size_t n);   /* load and make the handle: 0, or -1 and why */
size_t cudnn_attention_version(void);             /* e.g. 91900, once open */
void launch_attention_decode(bf16 *out, const bf16 *q, const bf16 *kc, const bf16 *vc, int n, int p0, int H, int Hkv,
                             int Dh);                                                  /* decode.cu */
void lt_init(void);                                                                    /* cublaslt.cu */
void gemm_fwd(bf16 *out, const bf16 *x, const bf16 *w, int N, int I, int O);
void gemm_bwd(bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const bf16 *w, int N, int I, int O, bool dx_acc);
/* out = res + x w^T in one GEMM (cuBLASLt C = res, beta = 1); false when the
 * precision is fp8 (the caller then runs gemm_fwd and an add) */
bool gemm_fwd_res(bf16 *out, const bf16 *res, const bf16 *x, const bf16 *w, int N, int I, int O);
/* FP8 versions (gemm_fp8.cu): false when the precision is bf16 or the shape
 * does not suit FP8; the caller then runs the bf16 GEMM */
bool fp8_gemm_fwd(bf16 *out, const bf16 *x, const bf16 *w, int N, int I, int O);
bool fp8_gemm_bwd(bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const bf16 *w, int N, int I, int O, bool dx_acc);

/* ---- launch helpers ---- */

/* Blocks for n items at `threads` per block, capped for grid-stride loops. */
static inline unsigned cuda_blocks(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 8u) b = 65535u * 8u;
    return b ? (unsigned)b : 1u;
}

/* ---- device helpers ---- */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result. Uses 33 floats of shared memory; safe to call
 * repeatedly. The order of additions is fixed (deterministic). */
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[33];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0) part[w] = v;
    __syncthreads();
    float s = lane < nw ? part[lane] : 0.f;
    s = warp_sum(s);
    return s;
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float part[33];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    float s = lane < nw ? part[lane] : -INFINITY;
    return warp_max(s);
}

__device__ __forceinline__ float ld(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const float *p) { return *p; }

#endif
