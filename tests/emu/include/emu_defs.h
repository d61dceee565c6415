/* emu_defs.h: the CUDA C qualifiers and built-in vector types as the
 * emulation tier (tests/emu) compiles them: every .cu file of the CUDA
 * backend is built as host C++ (g++), so __device__ and __host__ mean
 * nothing, __forceinline__ is inline and __align__ an attribute. Included
 * by every header under tests/emu/include; C-compatible. */
#ifndef BALLAST_EMU_DEFS_H
#define BALLAST_EMU_DEFS_H

#include <stddef.h>
#include <stdint.h>

#define BALLAST_GPU_EMU 1

#define __host__
#define __device__
#define __global__
#define __constant__ static
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __grid_constant__
#define __CUDACC__EMU 1

#ifdef __cplusplus
extern "C" {
#endif

/* The emulator's core (tests/emu/runtime.cc) offers these to the other
 * emulated libraries (cuBLASLt, NCCL). */
typedef struct CUstream_st *cudaStream_t;
/* Run fn(arg) on stream s after all work queued on s before it; the
 * emulator may run it at any point up to the synchronization that covers
 * it, interleaved with other streams as their events allow. free_arg (may
 * be NULL) is called on arg afterwards. */
void emu_enqueue(cudaStream_t s, const char *what, void (*fn)(void *arg), void *arg, void (*free_arg)(void *arg));
/* As emu_enqueue, but fn may start only once can_start(arg) returns
 * nonzero (data from another process has come): until then the stream
 * stands still and other streams go on; a host wait that only such
 * operations hold up polls them, up to BALLAST_EMU_PEER_TIMEOUT_S seconds
 * (default 300), then stops the run naming them. */
void emu_enqueue_when(cudaStream_t s, const char *what, int (*can_start)(void *arg), void (*fn)(void *arg), void *arg,
                      void (*free_arg)(void *arg));
/* 1 when [p, p + bytes) lies inside one live cudaMalloc allocation. */
int emu_is_device(const void *p, size_t bytes);
/* 1 when [p, p + bytes) lies inside pinned (cudaMallocHost) or registered
 * (cudaHostRegister) host memory. */
int emu_is_pinned(const void *p, size_t bytes);
/* Print "gpu-emu: <message>" (and the seed of the run) and abort. */
void emu_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif

#endif
