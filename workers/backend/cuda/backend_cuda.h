/* backend_cuda.h: the CUDA backend (bf16 storage, fp32 accumulation) and
 * the few things beyond the backend table that GPU code needs: streams and
 * events for overlapping compute, collectives and copies, the multi-tensor
 * AdamW, and per-op timing.
 *
 * Every table op runs on the compute stream, asynchronously; to_host,
 * act_to_host and sumsq synchronize with it. act_t buffers hold bf16,
 * float buffers fp32 (workers/backend/backend.h). One process drives one GPU from
 * one thread. C header, usable from C11 and CUDA C++. */
#ifndef BALLAST_BACKEND_CUDA_H
#define BALLAST_BACKEND_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "workers/backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable GPUs; 0 when there is no driver, no device, or the
 * runtime cannot start (never exits). why (may be NULL) gets the reason
 * when 0. */
int cuda_device_count(char *why, size_t whylen);

/* Select GPU `device`, create the streams, the cuBLASLt handle and its
 * workspace, and return the table. NULL with a message in err when the
 * device is missing or unusable. Calling it again returns the same table
 * (one device per process). */
const backend_t *backend_cuda(int device, char *err, size_t errlen);

/* backend_open's CUDA part (workers/backend/backend.h): backend_cuda(spec
 * device), then the spec's precision, attention kernel and sync mode. */
const backend_t *backend_cuda_open(const backend_spec_t *spec, char *err, size_t errlen);

/* --cuda-sync: synchronize after every kernel launch and check it, so an
 * error names the kernel that failed (slow; off by default). */
void cuda_set_sync(bool on);

/* Pin host ranges for DMA (the table's host_register / host_unregister;
 * pool_register.h does the work). */
struct be_pinned *cuda_host_register(const be_range_t *ranges, int n, char *err, size_t errlen);
void cuda_host_unregister(struct be_pinned *p);

/* The name of the GPU backend_cuda() selected (cudaDeviceProp.name, e.g.
 * "NVIDIA H100 80GB HBM3"; the MFU peak table matches on it), or NULL
 * before it selected one. */
const char *cuda_device_name(void);

/* Wait for everything queued on every stream of the backend. */
void cuda_sync(void);

/* ---- streams and events (streams.cu) ---- */

/* COPY carries device-to-host copies, COPY_IN host-to-device ones, so the
 * two directions use both copy engines at once. */
typedef enum {
    CUDA_STREAM_COMPUTE = 0, CUDA_STREAM_COMM = 1, CUDA_STREAM_COPY = 2, CUDA_STREAM_COPY_IN = 3, CUDA_NSTREAMS
} cuda_stream_id_t;

/* The native cudaStream_t of a stream, as void * for C callers (NCCL takes it). */
void *cuda_stream(cuda_stream_id_t s);

/* The priority stream s was created with, and the device's range (CUDA:
 * numerically lower is greater; least is 0). Comm and the copy streams
 * have the greatest, compute the least. */
int cuda_stream_priority(cuda_stream_id_t s, int *least, int *greatest);

/* Record an event on stream `s` and return its handle (from a recycled pool);
 * cuda_stream_wait_event makes stream `waiter` wait for it without blocking
 * the host. Events return to the pool with cuda_event_release. */
void *cuda_event_record(cuda_stream_id_t s);
void cuda_stream_wait_event(cuda_stream_id_t waiter, void *event);
void cuda_event_sync(void *event);
void cuda_event_release(void *event);

/* Asynchronous copies on the copy stream (host memory should be pinned:
 * cuda_host_alloc or cudaHostRegister'ed). */
void cuda_copy_h2d_async(void *dst, const void *host_src, size_t bytes);
void cuda_copy_d2h_async(void *host_dst, const void *src, size_t bytes);
void *cuda_host_alloc(size_t bytes);   /* pinned; NULL when out of memory */
void cuda_host_free(void *p);

/* ---- GEMM precision (gemm_fp8.cu) ---- */

typedef enum { CUDA_PRECISION_BF16 = 0, CUDA_PRECISION_FP8 = 1 } cuda_precision_t;
#define CUDA_FP8_HISTORY 16   /* amax history length (uses) per scaling state */

/* Run the table's matmuls in bf16 (the default) or FP8 (--precision fp8:
 * E4M3 weights and inputs, E5M2 output gradients, per-tensor delayed
 * scaling; docs/cuda.md). FP8 needs compute capability 8.9+: on an older
 * GPU, or before backend_cuda(), it returns -1 with a message naming the
 * GPU and its capability, and the precision stays as it was. */
int cuda_set_precision(cuda_precision_t p, char *err, size_t errlen);
cuda_precision_t cuda_precision(void);

/* GEMMs run in FP8 so far, and GEMMs that asked for FP8 but ran in bf16
 * (a dimension not a multiple of 16, an unaligned output). */
void cuda_fp8_counts(long *fp8, long *bf16_fallback);

/* The delayed-scaling state of one operand of the matmul with weight w
 * (role CUDA_FP8_WEIGHT, _INPUT or _GRAD): its current scale and the max
 * of its amax history. Synchronizes. -1 when w has not run in FP8. */
enum { CUDA_FP8_WEIGHT = 0, CUDA_FP8_INPUT = 1, CUDA_FP8_GRAD = 2 };
int cuda_fp8_state(const void *w, int role, float *scale, float *hist_max);

/* Forget every scaling state. States are keyed by weight address, so a
 * program that frees a model and allocates another calls this first (a new
 * weight at a reused address would inherit the old history). */
void cuda_fp8_reset(void);

/* dst (n, fp32, device) = src (n, bf16 act storage, device), on the compute
 * stream: for gradients reduced in bf16 and widened again. */
void cuda_act_to_f32(float *dst, const act_t *src, size_t n);

/* ---- multi-tensor AdamW (adamw.cu) ---- */

/* One tensor of a multi-tensor update: n fp32 elements at p, g, m, v (device),
 * the bf16 working copy at p_act (device, may be NULL), and whether weight
 * decay applies. */
typedef struct {
    float *p;          /* (n) fp32 master */
    const float *g;    /* (n) fp32 gradient */
    float *m, *v;      /* (n) moments */
    act_t *p_act;      /* (n) bf16 working copy, or NULL */
    size_t n;
    bool decay;
} cuda_adamw_tensor_t;

/* The table's AdamW over many tensors in one launch (same formulas,
 * wd applied only where decay). */
void cuda_adamw_multi(const cuda_adamw_tensor_t *ts, int count, float lr, float beta1, float beta2, float eps,
                      float wd, float step_size, float bc2_sqrt, float grad_scale);

/* ---- global gradient norm (norm.cu) ---- */

/* sum of squares over many fp32 buffers, deterministic (fixed blocks and a
 * fixed final order), accumulated in double; result on the host. */
double cuda_sumsq_multi(const float *const *xs, const size_t *ns, int count);

/* ---- attention path (attention.cu) ---- */

/* One of our own kernels: "tc" (tensor cores, the default; "own" is the
 * same) or "simt". Turns cuDNN's path off. 0, or -1 for an unknown name. */
int cuda_attention_use(const char *impl);

/* --attention auto|cudnn|own (or tc|simt), after backend_cuda(): auto and
 * cudnn load libcudnn.so.9 (attention_cudnn.cu says where it looks;
 * BALLAST_CUDNN_LIB names it) and compare its fused attention with our
 * kernels on a small random case (out, lse, dq, dk, dv); auto takes cuDNN
 * when that passes, our kernels otherwise. msg gets the one line saying
 * which and why. -1 (msg says why) when cudnn was asked for and cannot be
 * used, or for an unknown name. */
int cuda_attention_select(const char *mode, char *msg, size_t msglen);

/* Attention calls cuDNN ran, and calls it refused (a shape its engines do
 * not take, an unaligned tensor: those ran our kernels, one warning per
 * reason), with the last refusal's reason. */
void cuda_attention_cudnn_counts(long *ran, long *refused, const char **last_refusal);

/* ---- timing (table.cu) ---- */

/* When on, every table op records events around itself on the compute
 * stream; cuda_prof_report prints total milliseconds, calls and share per
 * op since the last reset, largest first (it synchronizes). */
void cuda_prof_enable(bool on);
void cuda_prof_reset(void);
void cuda_prof_report(FILE *out);

/* ---- initialisation ---- */

/* p (n, fp32, device) = mean + std * N(0, 1) from a counter-based hash of
 * (seed, index): fast random weights for benchmarks (not the CPU model's
 * stream). std = 0 fills with mean. */
void cuda_fill_normal(float *p, size_t n, float mean, float std, uint64_t seed);

/* ---- host helpers for tests ---- */

/* Round fp32 to bf16 (round to nearest even) and back, on the host. */
uint16_t cuda_f32_to_bf16(float x);
float cuda_bf16_to_f32(uint16_t x);

#ifdef __cplusplus
}
#endif

#endif
