/* emu.h: the device side of the emulation tier, as the backend's kernels
 * see it once compiled as host C++ (tests/emu/include/cuda_runtime.h
 * includes it under C++).
 *
 * A launch runs every block of the grid, in a random order, one after the
 * other; inside a block every thread is a fiber (tests/emu/sched.cc) that
 * runs until it reaches a barrier (__syncthreads), a warp collective
 * (__syncwarp, shuffles, votes, WMMA) or its end, in an order drawn at
 * random per launch from the run's seed, so a missing barrier shows as
 * wrong or varying bits. threadIdx and friends read the running fiber's
 * context. __shared__ variables become per-block allocations (cu2cc.py
 * rewrites their declarations), filled with NaN bytes when the block starts
 * and separately allocated so that AddressSanitizer sees an overrun.
 * Atomics are plain read-modify-writes: fibers of one host thread never
 * interleave inside one. */
#ifndef BALLAST_EMU_H
#define BALLAST_EMU_H

#include "emu_defs.h"

#include <stdint.h>
#include <string.h>

#include <cmath>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- built-in vector types ---- */

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(8) uint2 { unsigned x, y; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{ x, y, z, w }; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{ x, y }; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{ x, y, z, w }; }
static inline int2 make_int2(int x, int y) { return int2{ x, y }; }
static inline float2 make_float2(float x, float y) { return float2{ x, y }; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{ x, y, z, w }; }

namespace emu {

/* The running thread of the running block. */
struct thread_ctx {
    uint3 tid, bid;
    dim3 bdim, gdim;
    unsigned lane, warp; /* linear thread index % 32 and / 32 */
};
extern thread_local thread_ctx *g_cur;

[[noreturn]] void no_thread(const char *what);
static inline thread_ctx *cur(const char *what) {
    if (!g_cur) no_thread(what);
    return g_cur;
}

/* ---- barriers and warp collectives (sched.cc) ---- */

void syncthreads(const char *file, int line);
void syncwarp(const char *file, int line, unsigned mask = 0xffffffffu);

enum shfl_kind { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };
/* The 8 bytes of `bits` from the lane the kind names (own bits when that
 * lane is outside this lane's width segment, as CUDA defines). */
uint64_t shfl(unsigned mask, shfl_kind kind, uint64_t bits, int arg, int width);
enum vote_kind { VOTE_BALLOT, VOTE_ANY, VOTE_ALL };
unsigned vote(unsigned mask, vote_kind kind, int pred);
/* A warp-wide operation (WMMA): every lane of the warp arrives with its own
 * `arg`; once all have, fn runs once with all of them (lane order). */
void warp_collective(const char *what, void (*fn)(void **args, int n), void *arg);

/* ---- shared memory (sched.cc) ---- */

void *shared_at(int id, size_t bytes, size_t align);
void *dyn_shared(void);
template <class T>
T &shared(int id) {
    return *(T *)shared_at(id, sizeof(T), alignof(T) < 16 ? 16 : alignof(T));
}

/* ---- launches (sched.cc, runtime.cc) ---- */

/* Checks the configuration (sets the last error and returns false when
 * CUDA would refuse it) and the pointer arguments. */
bool launch_ok(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem);
void check_pointer_arg(const char *name, int index, const void *p);
/* Queue the grid on the stream: body runs once per thread. */
void enqueue_grid(cudaStream_t s, const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem,
                  std::function<void()> body);

template <class T>
static inline void check_arg(const char *name, int i, const T &v) {
    if constexpr (std::is_pointer<T>::value) check_pointer_arg(name, i, (const void *)v);
    (void)name, (void)i, (void)v;
}

template <class... P>
struct launch_t {
    void (*k)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    /* the kernel's own parameter types: arguments convert at the call, as
     * with <<<>>> (NULL included), and are copied at launch */
    void operator()(P... a) const {
        if (!launch_ok((const void *)k, name, grid, block, smem)) return;
        auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(a...);
        int i = 0;
        std::apply([&](const auto &...v) { (check_arg(name, i++, v), ...); }, *args);
        auto kern = k;
        enqueue_grid(stream, (const void *)k, name, grid, block, smem, [kern, args]() { std::apply(kern, *args); });
    }
};

template <class... P>
launch_t<P...> launcher(void (*k)(P...), const char *name, dim3 grid, dim3 block, size_t smem = 0,
                        cudaStream_t s = 0) {
    return launch_t<P...>{ k, name, grid, block, smem, s };
}

/* cudaFuncSetAttribute's record, read by launch_ok */
void set_max_dynamic_smem(const void *kernel, int bytes);

} // namespace emu

/* ---- what kernels call ---- */

#define threadIdx (emu::cur("threadIdx")->tid)
#define blockIdx (emu::cur("blockIdx")->bid)
#define blockDim (emu::cur("blockDim")->bdim)
#define gridDim (emu::cur("gridDim")->gdim)
static constexpr int warpSize = 32;

#define __syncthreads() emu::syncthreads(__FILE__, __LINE__)
namespace emu {
struct syncwarp_at {
    const char *file;
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { syncwarp(file, line, mask); }
};
} // namespace emu
#define __syncwarp emu::syncwarp_at{ __FILE__, __LINE__ }
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}

template <class T>
static inline uint64_t emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T>
static inline T emu_from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}
template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return emu_from_bits<T>(emu::shfl(mask, emu::SHFL_IDX, emu_bits(v), src, width));
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return emu_from_bits<T>(emu::shfl(mask, emu::SHFL_UP, emu_bits(v), (int)d, width));
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return emu_from_bits<T>(emu::shfl(mask, emu::SHFL_DOWN, emu_bits(v), (int)d, width));
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    return emu_from_bits<T>(emu::shfl(mask, emu::SHFL_XOR, emu_bits(v), m, width));
}
static inline unsigned __ballot_sync(unsigned mask, int p) { return emu::vote(mask, emu::VOTE_BALLOT, p); }
static inline int __any_sync(unsigned mask, int p) { return (int)emu::vote(mask, emu::VOTE_ANY, p); }
static inline int __all_sync(unsigned mask, int p) { return (int)emu::vote(mask, emu::VOTE_ALL, p); }
static inline unsigned __activemask(void) { return 0xffffffffu; }

/* Atomics: the old value, as CUDA returns it. */
template <class T>
static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T>
static inline T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <class T>
static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T>
static inline T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <class T>
static inline T atomicMin(T *p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <class T>
static inline T atomicCAS(T *p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
template <class T>
static inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <class T>
static inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }

template <class T>
static inline T __ldg(const T *p) { return *p; }

#endif
