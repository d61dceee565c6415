/* warp_mma.cuh: the warp-level tensor-core building blocks of
 * attention_tc.cu, each one PTX instruction on nvcc (sm_80 and up) and the
 * emulation tier's model of it under BALLAST_GPU_EMU (tests/emu/include/
 * emu_ptx.h), so the kernels hold no inline asm of their own.
 *
 *   warp_mma_bf16     mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 *   warp_ldmatrix_x4  ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16
 *   cp_async_16       cp.async.cg.shared.global, 16 bytes (zero-filled
 *                     when the source is out of range)
 *   cp_async_commit / cp_async_wait<N>
 *
 * Fragments are the PTX ISA's: lane l, g = l / 4, t = l % 4. A (16x16 row)
 * a[0] (g, 2t..2t+1), a[1] (g+8, 2t..), a[2] (g, 2t+8..), a[3] (g+8, 2t+8..);
 * B (16x8 col) b[0] (k 2t..2t+1, n g), b[1] (k 2t+8.., n g); C (16x8 fp32)
 * c[0..1] (g, 2t..2t+1), c[2..3] (g+8, 2t..). A b32 register holds two
 * bf16, the lower-numbered element in the low half. */
#ifndef BALLAST_WARP_MMA_CUH
#define BALLAST_WARP_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#ifdef BALLAST_GPU_EMU
#include <emu_ptx.h>
#endif

/* d = a . b + c for one warp (all 32 lanes, converged). d may be c. */
__device__ __forceinline__ void warp_mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                              const float (&c)[4]) {
#ifdef BALLAST_GPU_EMU
    emu::ptx::mma_m16n8k16_bf16(d, a, b, c);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%11,%12,%13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#endif
}

/* Four 8x8 b16 matrices from shared memory: lane 8j + i gives the address
 * of row i of matrix j (16 bytes, 16-byte aligned); r[j] is matrix j's
 * fragment (row l/4, elements 2(l%4)..+1), or with TRANS its transpose's. */
template <bool TRANS>
__device__ __forceinline__ void warp_ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16 *row) {
#ifdef BALLAST_GPU_EMU
    emu::ptx::ldmatrix_x4(r, row, TRANS);
#else
    unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#endif
}

/* 16 bytes global -> shared, asynchronously; valid false writes zeros (and
 * reads nothing of src, which must still be a mapped address). Visible to
 * this thread after the cp_async_wait that retires its group, to the block
 * after a barrier past that. */
__device__ __forceinline__ void cp_async_16(void *dst, const void *src, bool valid) {
#ifdef BALLAST_GPU_EMU
    emu::ptx::cp_async_16(dst, src, valid ? 16 : 0);
#else
    unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(n));
#endif
}

/* Close the group of the copies issued since the last commit. */
__device__ __forceinline__ void cp_async_commit(void) {
#ifdef BALLAST_GPU_EMU
    emu::ptx::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

/* Wait until at most N of this thread's committed groups are in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait(void) {
#ifdef BALLAST_GPU_EMU
    emu::ptx::cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/* Two fp32 as one b32 register of bf16 (lo the lower-numbered element). */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

#endif
