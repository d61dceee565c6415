/* emu_ptx.h of the emulation tier: the inline-PTX warp primitives the
 * tensor-core attention uses (workers/backend/cuda/warp_mma.cuh calls these
 * under BALLAST_GPU_EMU instead of its asm):
 *   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 *   ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16
 *   cp.async.cg.shared.global (16 bytes, zero fill), commit_group, wait_group
 *
 * mma and ldmatrix are warp collectives (emu::warp_collective, as mma.h's
 * WMMA): every lane arrives with its own registers and the operation runs
 * once for the warp with the PTX ISA's fragment layouts, so a lane that
 * reads the wrong element of a fragment gets another lane's value, as on
 * the hardware. A b32 register holds two b16 elements, the lower-numbered
 * in the low half. mma's products are exact in fp32 (bf16 x bf16) and
 * summed in k order onto C.
 *
 * cp.async reads its 16 source bytes when issued but writes them to shared
 * memory only when a cp.async.wait_group of the issuing thread retires its
 * group: shared memory keeps its old bytes (NaN at block start) until then,
 * so a missing wait, or a wait for the wrong count, shows as wrong bits.
 * The pending copies are per thread (keyed by the running thread's
 * context), as the hardware's are. */
#ifndef BALLAST_EMU_PTX_H
#define BALLAST_EMU_PTX_H

#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

#include <map>
#include <vector>

namespace emu {
namespace ptx {

static inline uint32_t lo16(uint32_t r) { return r & 0xffffu; }
static inline uint32_t hi16(uint32_t r) { return r >> 16; }
static inline float bf16_bits_to_f(uint32_t h) {
    uint32_t u = h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- mma.sync m16n8k16 bf16 -> fp32 ---- */

struct mma_args {
    float *d;          /* 4 */
    const uint32_t *a; /* 4 */
    const uint32_t *b; /* 2 */
    const float *c;    /* 4 */
};

/* Lane l: g = l / 4, t = l % 4. A (16x16, row): a0,a1 (g, 2t..2t+1),
 * a2,a3 (g+8, 2t..), a4,a5 (g, 2t+8..), a6,a7 (g+8, 2t+8..). B (16x8, col):
 * b0,b1 (k 2t..2t+1, n g), b2,b3 (k 2t+8.., n g). C, D (16x8): c0,c1
 * (g, 2t..2t+1), c2,c3 (g+8, 2t..). */
static void mma_all(void **args, int n) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < n; l++) {
        const mma_args *m = (const mma_args *)args[l];
        int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) {
            int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
            A[row][col] = bf16_bits_to_f(lo16(m->a[i]));
            A[row][col + 1] = bf16_bits_to_f(hi16(m->a[i]));
        }
        for (int i = 0; i < 2; i++) {
            int k = 2 * t + 8 * i;
            B[k][g] = bf16_bits_to_f(lo16(m->b[i]));
            B[k + 1][g] = bf16_bits_to_f(hi16(m->b[i]));
        }
        for (int i = 0; i < 4; i++) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = m->c[i];
    }
    float D[16][8];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            float s = C[i][j];
            for (int k = 0; k < 16; k++) s += A[i][k] * B[k][j];
            D[i][j] = s;
        }
    for (int l = 0; l < n; l++) {
        const mma_args *m = (const mma_args *)args[l];
        int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) m->d[i] = D[g + 8 * (i >> 1)][2 * t + (i & 1)];
    }
}

static inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    float cc[4] = { c[0], c[1], c[2], c[3] }; /* d may alias c */
    mma_args m{ d, a, b, cc };
    warp_collective("mma.sync.m16n8k16", mma_all, &m);
}

/* ---- ldmatrix m8n8 x4 b16 ---- */

struct ldm_args {
    uint32_t *r;     /* 4 */
    const void *row; /* this lane's row address: lanes 8j..8j+7 give matrix j's rows */
    bool trans;
};

/* Lane l, register j: matrix j's row l/4, elements 2(l%4) and 2(l%4)+1;
 * with .trans, its column l/4, rows 2(l%4) and 2(l%4)+1. */
static void ldmatrix_all(void **args, int n) {
    uint16_t M[4][8][8];
    for (int l = 0; l < n; l++) {
        const ldm_args *a = (const ldm_args *)args[l];
        if (((uintptr_t)a->row & 15) != 0) emu_fatal("ldmatrix: lane %d's row address %p is not 16-byte aligned", l, a->row);
        memcpy(M[l >> 3][l & 7], a->row, 16);
    }
    for (int l = 0; l < n; l++) {
        const ldm_args *a = (const ldm_args *)args[l];
        int r = l >> 2, c = 2 * (l & 3);
        for (int j = 0; j < 4; j++) {
            uint32_t e0 = a->trans ? M[j][c][r] : M[j][r][c], e1 = a->trans ? M[j][c + 1][r] : M[j][r][c + 1];
            a->r[j] = e0 | (e1 << 16);
        }
    }
}

static inline void ldmatrix_x4(uint32_t r[4], const void *row, bool trans) {
    ldm_args a{ r, row, trans };
    warp_collective(trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", ldmatrix_all, &a);
}

/* ---- cp.async ---- */

struct cp_pending {
    void *dst;
    unsigned char bytes[16];
};
struct cp_state {
    std::vector<std::vector<cp_pending>> groups; /* committed, oldest first */
    std::vector<cp_pending> open;                /* issued since the last commit */
};
static inline cp_state &cp_of_thread(void) {
    static thread_local std::map<const void *, cp_state> all;
    return all[(const void *)cur("cp.async")];
}

static inline void cp_async_16(void *dst, const void *src, int src_bytes) {
    if (((uintptr_t)dst & 15) || ((uintptr_t)src & 15)) emu_fatal("cp.async: address not 16-byte aligned (%p <- %p)", dst, src);
    cp_pending p;
    p.dst = dst;
    memset(p.bytes, 0, 16);
    if (src_bytes) memcpy(p.bytes, src, (size_t)src_bytes);
    cp_of_thread().open.push_back(p);
}
static inline void cp_async_commit(void) {
    cp_state &s = cp_of_thread();
    s.groups.push_back(s.open);
    s.open.clear();
}
/* Retire all but the `keep` most recent committed groups. */
static inline void cp_async_wait(int keep) {
    cp_state &s = cp_of_thread();
    while ((int)s.groups.size() > keep) {
        for (cp_pending &p : s.groups.front()) memcpy(p.dst, p.bytes, 16);
        s.groups.erase(s.groups.begin());
    }
}

} // namespace ptx
} // namespace emu

#endif
