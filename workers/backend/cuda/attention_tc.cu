/* attention_tc.cu: the tensor-core path of causal GQA flash attention (the
 * default; attention.cu holds the SIMT path and chooses between them).
 *
 * Same contract as attention.cu: q, out, dq (B, T, H, Dh); k, v, dk, dv
 * (B, T, Hkv, Dh) bf16; lse (B, H, T) fp32, natural log; Dh 64 or 128; no
 * (T, T) matrix in memory; deterministic: same inputs, same bits, no
 * atomics (every output element has one owner that sums in a fixed order).
 *
 * Built from warp_mma.cuh: mma.sync m16n8k16 (bf16 in, fp32 accumulate),
 * ldmatrix x4 (.trans for the operand that is stored k-major) and
 * double-buffered cp.async tile loads. A block is 4 warps owning 64 rows
 * (16 each); tiles of 64 keys (or queries) stream through shared memory,
 * each row of 8 or 16 16-byte chunks stored with chunk ^= row % 8, so the
 * 8 rows an ldmatrix phase reads fall in 8 different bank groups.
 *
 * Forward: a warp's scores (16 x 64) live in mma accumulators; the online
 * softmax works on them in registers (a row is spread over the 4 lanes of a
 * quad: max and sum by __shfl_xor_sync 1 and 2; exp2f with log2 e folded
 * into the scale), P is rounded to bf16 in registers and is directly the A
 * operand of P.V (an m16n8 accumulator pair is an m16n8k16 A fragment).
 * Key tiles above the diagonal are never loaded; only the diagonal tile
 * (key tile index == query block index, as Br == Bc) is masked.
 *
 * Backward: two kernels, dq first (which also writes D = rowsum(dO * O),
 * the row dot the dk/dv kernel then reads), then dk/dv; 7 tile products per
 * (query tile, key tile) pair where FlashAttention-2 has 5. Its 5 need one
 * pass that owns dk/dv and adds each tile's dS.K into dq with fp32 atomics,
 * whose order (so whose bits) varies run to run. The deterministic ways
 * around it cost more than the 2 recomputed products: a per-key-block
 * partial dq is T/64 times dq's memory, and ordering the blocks' adds with
 * an inter-block semaphore relies on the blocks being co-resident (it
 * deadlocks where they are not, the emulator's one-block-at-a-time
 * included). So the dk/dv pass recomputes S and dP, and dq owns its rows.
 *
 * Occupancy (per SM: 64K registers; 164 KiB shared on sm_80, 227 on
 * sm_90). Forward shared memory is Q plus two K/V stages, (64 + 4 * 64) *
 * Dh * 2 bytes: 40 KiB at Dh 64, 80 at Dh 128, against the WMMA version's
 * 71 and 95 (its fp32 score and bf16 P scratch are gone: they live in
 * registers). Registers (ptxas 13): Dh 64 is held to 128 a thread by its
 * launch bounds (4 blocks: 4 x 128 x 128 = 64K; it spills 8 bytes on
 * sm_80, 32 on sm_90a), Dh 128 takes 203-215 (2 blocks). So a forward SM holds 16 warps at Dh 64 (was 8 on sm_80, 12
 * on sm_90: shared memory bound) and 8 at Dh 128 (was 4 on sm_80, 8 on
 * sm_90). Per thread: O's Dh / 2 floats, 32 score floats, Q's A fragments
 * (Dh / 4 registers, loaded once). The backward keeps K, V (or Q, dO)
 * resident and double-buffers the other two, 96 KiB at Dh 128 and 48 at
 * Dh 64, with two Dh x 16 fp32 accumulators per warp in the dk/dv kernel
 * (~250 registers at Dh 128: 1 block on sm_80, 2 on sm_90). */
#include "workers/backend/cuda/common.cuh"
#include "workers/backend/cuda/warp_mma.cuh"

#define TC_WARPS 4
#define TC_BR 64 /* rows per block */
#define TC_BC 64 /* keys (or queries) per tile */
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

/* ---- helpers ---- */

/* Offset (elements) of (row, col) in a (rows, DH) bf16 tile whose 16-byte
 * chunks are swizzled: chunk col / 8 of a row sits at chunk col / 8 ^ row % 8. */
template <int DH>
__device__ __forceinline__ int tc_swz(int row, int col) {
    return row * DH + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

/* Start the copy of rows row0..row0+63 of src (row stride in elements) into
 * the swizzled tile dst; rows at or past T come in as zeros. The block's
 * threads share the 16-byte chunks. The caller commits the group. */
template <int DH>
__device__ __forceinline__ void tc_load_async(bf16 *dst, const bf16 *src, size_t stride, int row0, int T) {
    constexpr int CH = DH / 8;
    for (int e = threadIdx.x; e < TC_BC * CH; e += TC_WARPS * 32) {
        int r = e / CH, c = e % CH, t = row0 + r;
        bool ok = t < T;
        cp_async_16(dst + tc_swz<DH>(r, c * 8), src + (size_t)(ok ? t : 0) * stride + c * 8, ok);
    }
}

/* Tile j of a double-buffered K/V stream (KV: two stages of K then V, each
 * TC_BC x DH): start tile j + 1's copy into the other stage, so that it
 * overlaps tile j's products, and wait until tile j has landed (all of it
 * at the last tile). The caller synchronises the block next. */
template <int DH>
__device__ __forceinline__ void tc_kv_next(bf16 *KV, const bf16 *kbase, const bf16 *vbase, size_t ks, int j,
                                           int ntiles, int T) {
    if (j + 1 < ntiles) {
        bf16 *Kn = KV + (size_t)((j + 1) & 1) * 2 * TC_BC * DH;
        tc_load_async<DH>(Kn, kbase, ks, (j + 1) * TC_BC, T);
        tc_load_async<DH>(Kn + TC_BC * DH, vbase, ks, (j + 1) * TC_BC, T);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

/* A fragment of rows r0..r0+15, columns 16 kk..16 kk+15 of a tile. */
template <int DH>
__device__ __forceinline__ void tc_frag_a(uint32_t (&a)[4], const bf16 *tile, int r0, int kk) {
    int lane = threadIdx.x & 31;
    warp_ldmatrix_x4<false>(a, tile + tc_swz<DH>(r0 + (lane & 15), 16 * kk + (lane >> 4) * 8));
}

/* B fragments of X^T for two n-tiles, X a tile of rows n0..n0+15 (the n
 * index) by columns 16 kk.. (the k index): b[0..1] n-tile n0, b[2..3] n0+8. */
template <int DH>
__device__ __forceinline__ void tc_frag_bt(uint32_t (&b)[4], const bf16 *tile, int n0, int kk) {
    int lane = threadIdx.x & 31;
    warp_ldmatrix_x4<false>(b, tile + tc_swz<DH>(n0 + (lane & 7) + ((lane >> 4) << 3), 16 * kk + ((lane >> 3) & 1) * 8));
}

/* B fragments of Y for two n-tiles, Y a tile of rows 16 kk.. (the k index)
 * by columns n0..n0+15 (the n index): ldmatrix .trans. */
template <int DH>
__device__ __forceinline__ void tc_frag_b(uint32_t (&b)[4], const bf16 *tile, int kk, int n0) {
    int lane = threadIdx.x & 31;
    warp_ldmatrix_x4<true>(b, tile + tc_swz<DH>(16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8, n0 + (lane >> 4) * 8));
}

/* c[n] (16 x 64, 8 n-tiles) = A (16 x DH: the warp's rows r0.. of At) . X^T
 * (X: the 64 rows of Xt). */
template <int DH>
__device__ __forceinline__ void tc_abt(float (&c)[TC_BC / 8][4], const bf16 *At, int r0, const bf16 *Xt) {
#pragma unroll
    for (int n = 0; n < TC_BC / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) c[n][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DH / 16; kk++) {
        uint32_t a[4];
        tc_frag_a<DH>(a, At, r0, kk);
#pragma unroll
        for (int np = 0; np < TC_BC / 16; np++) {
            uint32_t b[4];
            tc_frag_bt<DH>(b, Xt, 16 * np, kk);
            const uint32_t b0[2] = { b[0], b[1] }, b1[2] = { b[2], b[3] };
            warp_mma_bf16(c[2 * np], a, b0, c[2 * np]);
            warp_mma_bf16(c[2 * np + 1], a, b1, c[2 * np + 1]);
        }
    }
}

/* acc[n] (16 x DH) += P (16 x 64, bf16 A fragments p[kk]) . Y (the 64 x DH tile Yt) */
template <int DH>
__device__ __forceinline__ void tc_ab_acc(float (&acc)[DH / 8][4], const uint32_t (&p)[TC_BC / 16][4], const bf16 *Yt) {
#pragma unroll
    for (int kk = 0; kk < TC_BC / 16; kk++)
#pragma unroll
        for (int np = 0; np < DH / 16; np++) {
            uint32_t b[4];
            tc_frag_b<DH>(b, Yt, kk, 16 * np);
            const uint32_t b0[2] = { b[0], b[1] }, b1[2] = { b[2], b[3] };
            warp_mma_bf16(acc[2 * np], p[kk], b0, acc[2 * np]);
            warp_mma_bf16(acc[2 * np + 1], p[kk], b1, acc[2 * np + 1]);
        }
}

/* Accumulator n-tiles n, n+1 of a 16 x 64 tile (rows g, g+8) as the A
 * fragment of k-step n / 2: rows g / g+8, columns 2t.. and 2t+8... */
__device__ __forceinline__ void tc_pack_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16x2(c0[0], c0[1]);
    a[1] = pack_bf16x2(c0[2], c0[3]);
    a[2] = pack_bf16x2(c1[0], c1[1]);
    a[3] = pack_bf16x2(c1[2], c1[3]);
}

__device__ __forceinline__ float tc_bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

/* Write a warp's 16 x DH accumulator times f as bf16 rows row0 + g and
 * row0 + g + 8 of base (row stride in elements); rows at or past T are skipped. */
template <int DH>
__device__ __forceinline__ void tc_store(bf16 *base, size_t stride, int row0, int T, const float (&acc)[DH / 8][4], float f) {
    int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
        int row = row0 + g + 8 * hi;
        if (row >= T) continue;
        bf16 *dst = base + (size_t)row * stride + 2 * t4;
#pragma unroll
        for (int n = 0; n < DH / 8; n++)
            *(__nv_bfloat162 *)(dst + 8 * n) = __floats2bfloat162_rn(acc[n][2 * hi] * f, acc[n][2 * hi + 1] * f);
    }
}

template <int DH>
struct tc_dims {
    static constexpr size_t tile = (size_t)TC_BC * DH * 2; /* bytes of one bf16 tile */
    static constexpr size_t fwd_smem = 5 * tile;           /* Q, 2 x (K, V) */
    static constexpr size_t bwd_smem = 6 * tile + 2 * 2 * TC_BC * 4; /* 2 resident, 2 x 2 staged, 2 x (L, D) */
};

/* ---- forward ---- */

template <int DH>
__global__ void __launch_bounds__(TC_WARPS * 32, DH == 64 ? 4 : 2) attn_fwd_tc(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                                             const bf16 *v, int T, int H, int Hkv, float scale) {
    constexpr int KS = DH / 16, NS = TC_BC / 8, NO = DH / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *KV = Qs + TC_BR * DH; /* KV: stage s at KV + 2 s TC_BC DH, K then V */
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (H / Hkv);
    int q0 = qb * TC_BR, row0 = q0 + 16 * w + g; /* this lane's rows: row0, row0 + 8 */
    size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
    const bf16 *kbase = k + (size_t)b * T * ks + (size_t)kh * DH, *vbase = v + (size_t)b * T * ks + (size_t)kh * DH;
    float sl2 = scale * TC_LOG2E;
    int ntiles = qb + 1; /* key tiles 0..qb; tile qb is the diagonal */
    tc_load_async<DH>(Qs, q + (size_t)b * T * qs + (size_t)h * DH, qs, q0, T);
    tc_load_async<DH>(KV, kbase, ks, 0, T);
    tc_load_async<DH>(KV + TC_BC * DH, vbase, ks, 0, T);
    cp_async_commit();

    uint32_t qf[KS][4];
    float o[NO][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.f, 0.f };
#pragma unroll
    for (int n = 0; n < NO; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[n][i] = 0.f;
    for (int j = 0; j < ntiles; j++) {
        const bf16 *Ks = KV + (size_t)(j & 1) * 2 * TC_BC * DH, *Vs = Ks + TC_BC * DH;
        tc_kv_next<DH>(KV, kbase, vbase, ks, j, ntiles, T);
        __syncthreads();
        if (j == 0)
#pragma unroll
            for (int kk = 0; kk < KS; kk++) tc_frag_a<DH>(qf[kk], Qs, 16 * w, kk);
        /* S (16 x 64) = Q_w K^T */
        float s[NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) s[n][i] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                uint32_t bb[4];
                tc_frag_bt<DH>(bb, Ks, 16 * np, kk);
                const uint32_t b0[2] = { bb[0], bb[1] }, b1[2] = { bb[2], bb[3] };
                warp_mma_bf16(s[2 * np], qf[kk], b0, s[2 * np]);
                warp_mma_bf16(s[2 * np + 1], qf[kk], b1, s[2 * np + 1]);
            }
        /* online softmax in the log2 domain; element i of n-tile n is row
         * row0 + 8 (i / 2), key j TC_BC + 8 n + 2 t4 + i % 2 */
        bool diag = j == ntiles - 1;
        int key0 = j * TC_BC + 2 * t4;
        float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float x = s[n][i] * sl2;
                if (diag && key0 + 8 * n + (i & 1) > row0 + 8 * (i >> 1)) x = -INFINITY;
                s[n][i] = x;
                mx[i >> 1] = fmaxf(mx[i >> 1], x);
            }
        float base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[r], mx[r]);
            base[r] = mn == -INFINITY ? 0.f : mn; /* a row with no key yet: all its p are 0 */
            float corr = m[r] == -INFINITY ? 0.f : exp2f(m[r] - base[r]);
            m[r] = mn;
            l[r] *= corr;
#pragma unroll
            for (int n = 0; n < NO; n++) { o[n][2 * r] *= corr; o[n][2 * r + 1] *= corr; }
        }
        uint32_t pf[NS / 2][4];
#pragma unroll
        for (int n = 0; n < NS; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float p = tc_bf16_round(exp2f(s[n][i] - base[i >> 1]));
                s[n][i] = p;
                l[i >> 1] += p; /* the weights the product below uses */
            }
        }
#pragma unroll
        for (int kk = 0; kk < NS / 2; kk++) tc_pack_a(pf[kk], s[2 * kk], s[2 * kk + 1]);
        tc_ab_acc<DH>(o, pf, Vs); /* O += P V */
        __syncthreads();          /* this stage is refilled by the next iteration's copy */
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    int lane_rows[2] = { row0, row0 + 8 };
    float inv[2] = { 1.f / l[0], 1.f / l[1] };
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int n = 0; n < NO; n++) { o[n][2 * r] *= inv[r]; o[n][2 * r + 1] *= inv[r]; }
    tc_store<DH>(out + (size_t)b * T * qs + (size_t)h * DH, qs, q0 + 16 * w, T, o, 1.f);
    if (t4 == 0)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (lane_rows[r] < T) lse[((size_t)b * H + h) * T + lane_rows[r]] = m[r] * TC_LN2 + __logf(l[r]);
}

/* ---- backward: dq (and D) ---- */

/* dq for 64 query rows of (b, h), streaming the key tiles up to the
 * diagonal; first D = rowsum(dO * O) of those rows, kept in registers and
 * written to dvec (B, H, T) for the dk/dv kernel. */
template <int DH>
__global__ void __launch_bounds__(TC_WARPS * 32) attn_bwd_dq_tc(bf16 *dq, float *dvec, const bf16 *dout, const bf16 *out,
                                                                const bf16 *q, const bf16 *k, const bf16 *v,
                                                                const float *lse, int T, int H, int Hkv, float scale) {
    constexpr int NS = TC_BC / 8, NO = DH / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *Gs = Qs + TC_BR * DH, *KV = Gs + TC_BR * DH;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (H / Hkv);
    int q0 = qb * TC_BR, row0 = q0 + 16 * w + g;
    size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH, qoff = (size_t)b * T * qs + (size_t)h * DH;
    const bf16 *kbase = k + (size_t)b * T * ks + (size_t)kh * DH, *vbase = v + (size_t)b * T * ks + (size_t)kh * DH;
    float sl2 = scale * TC_LOG2E;
    int ntiles = qb + 1;
    tc_load_async<DH>(Qs, q + qoff, qs, q0, T);
    tc_load_async<DH>(Gs, dout + qoff, qs, q0, T);
    tc_load_async<DH>(KV, kbase, ks, 0, T);
    tc_load_async<DH>(KV + TC_BC * DH, vbase, ks, 0, T);
    cp_async_commit();

    /* D and L of rows row0, row0 + 8: the quad splits a row's 16-byte chunks */
    float Dr[2], Lr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        float s = 0.f;
        if (row < T) {
            const bf16 *gr = dout + qoff + (size_t)row * qs, *orow = out + qoff + (size_t)row * qs;
            for (int c = t4 * 8; c < DH; c += 32)
#pragma unroll
                for (int e = 0; e < 8; e++) s += __bfloat162float(gr[c + e]) * __bfloat162float(orow[c + e]);
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        Dr[r] = s;
        size_t li = ((size_t)b * H + h) * T + row;
        Lr[r] = row < T ? lse[li] * TC_LOG2E : 0.f;
        if (row < T && t4 == 0) dvec[li] = s;
    }

    float acc[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[n][i] = 0.f;
    for (int j = 0; j < ntiles; j++) {
        const bf16 *Ks = KV + (size_t)(j & 1) * 2 * TC_BC * DH, *Vs = Ks + TC_BC * DH;
        tc_kv_next<DH>(KV, kbase, vbase, ks, j, ntiles, T);
        __syncthreads();
        float s[NS][4], dp[NS][4];
        tc_abt<DH>(s, Qs, 16 * w, Ks);  /* S = Q_w K^T */
        tc_abt<DH>(dp, Gs, 16 * w, Vs); /* dP = dO_w V^T */
        bool diag = j == ntiles - 1;
        int key0 = j * TC_BC + 2 * t4;
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = i >> 1;
                float p = diag && key0 + 8 * n + (i & 1) > row0 + 8 * r ? 0.f : exp2f(s[n][i] * sl2 - Lr[r]);
                s[n][i] = p * (dp[n][i] - Dr[r]);
            }
        uint32_t dsf[NS / 2][4];
#pragma unroll
        for (int kk = 0; kk < NS / 2; kk++) tc_pack_a(dsf[kk], s[2 * kk], s[2 * kk + 1]);
        tc_ab_acc<DH>(acc, dsf, Ks); /* dQ_w += dS K (scale at the store) */
        __syncthreads();
    }
    tc_store<DH>(dq + qoff, qs, q0 + 16 * w, T, acc, scale);
}

/* ---- backward: dk, dv ---- */

/* dk, dv for 64 keys of (b, kh): every query tile from the diagonal on, of
 * each of the kh's H / Hkv query heads, in a fixed order; the Q and dO
 * tiles and their L, D rows are double-buffered. */
template <int DH>
__global__ void __launch_bounds__(TC_WARPS * 32) attn_bwd_dkdv_tc(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                                                                  const bf16 *k, const bf16 *v, const float *lse,
                                                                  const float *dvec, int T, int H, int Hkv, float scale) {
    constexpr int NS = TC_BC / 8, NO = DH / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Ks = (bf16 *)smem, *Vs = Ks + TC_BR * DH, *QG = Vs + TC_BR * DH; /* stage s: Q, dO at QG + 2 s TC_BC DH */
    float *LD = (float *)(QG + 4 * TC_BC * DH);                          /* stage s: L, D at LD + 2 s TC_BC */
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int kb = gridDim.x - 1 - blockIdx.x, kh = blockIdx.y, b = blockIdx.z, rep = H / Hkv;
    int k0 = kb * TC_BR, key0 = k0 + 16 * w + g; /* this lane's keys: key0, key0 + 8 */
    size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH, koff = (size_t)b * T * ks + (size_t)kh * DH;
    float sl2 = scale * TC_LOG2E;
    int nq = (T + TC_BC - 1) / TC_BC - kb, total = rep * nq; /* (head, query tile) pairs */
    tc_load_async<DH>(Ks, k + koff, ks, k0, T);
    tc_load_async<DH>(Vs, v + koff, ks, k0, T);
    /* stage st <- pair it: L (log2 units; +inf past T, so p = 0 there) and D with plain stores */
    auto fill = [&](int st, int it) {
        int hh = kh * rep + it / nq, t0 = (kb + it % nq) * TC_BC;
        size_t qoff = (size_t)b * T * qs + (size_t)hh * DH;
        bf16 *Qn = QG + (size_t)st * 2 * TC_BC * DH;
        tc_load_async<DH>(Qn, q + qoff, qs, t0, T);
        tc_load_async<DH>(Qn + TC_BC * DH, dout + qoff, qs, t0, T);
        const float *lrow = lse + ((size_t)b * H + hh) * T, *drow = dvec + ((size_t)b * H + hh) * T;
        float *Ln = LD + st * 2 * TC_BC;
        for (int i = threadIdx.x; i < TC_BC; i += TC_WARPS * 32) {
            int t = t0 + i;
            Ln[i] = t < T ? lrow[t] * TC_LOG2E : INFINITY;
            Ln[TC_BC + i] = t < T ? drow[t] : 0.f;
        }
    };
    fill(0, 0);
    cp_async_commit();

    float adk[NO][4], adv[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) adk[n][i] = adv[n][i] = 0.f;
    for (int it = 0; it < total; it++) {
        int st = it & 1;
        if (it + 1 < total) {
            fill(st ^ 1, it + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else cp_async_wait<0>();
        __syncthreads();
        const bf16 *Qs = QG + (size_t)st * 2 * TC_BC * DH, *Gs = Qs + TC_BC * DH;
        const float *Ls = LD + st * 2 * TC_BC, *Ds = Ls + TC_BC;
        int t0 = (kb + it % nq) * TC_BC;
        bool diag = it % nq == 0;
        float s[NS][4], dp[NS][4];
        tc_abt<DH>(s, Ks, 16 * w, Qs);  /* S^T (16 keys x 64 queries) = K_w Q^T */
        tc_abt<DH>(dp, Vs, 16 * w, Gs); /* dP^T = V_w dO^T */
        float ds[NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int c = 8 * n + 2 * t4 + (i & 1);
                float p = diag && t0 + c < key0 + 8 * (i >> 1) ? 0.f : exp2f(s[n][i] * sl2 - Ls[c]);
                ds[n][i] = p * (dp[n][i] - Ds[c]);
                s[n][i] = p;
            }
        uint32_t pf[NS / 2][4], dsf[NS / 2][4];
#pragma unroll
        for (int kk = 0; kk < NS / 2; kk++) {
            tc_pack_a(pf[kk], s[2 * kk], s[2 * kk + 1]);
            tc_pack_a(dsf[kk], ds[2 * kk], ds[2 * kk + 1]);
        }
        tc_ab_acc<DH>(adv, pf, Gs);  /* dV_w += P^T dO */
        tc_ab_acc<DH>(adk, dsf, Qs); /* dK_w += dS^T Q (scale at the store) */
        __syncthreads();
    }
    tc_store<DH>(dk + koff, ks, k0 + 16 * w, T, adk, scale);
    tc_store<DH>(dv + koff, ks, k0 + 16 * w, T, adv, 1.f);
}

/* ---- launchers ---- */

template <int DH>
static void tc_fwd(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H, int Hkv,
                   float scale) {
    static bool attr;
    size_t sm = tc_dims<DH>::fwd_smem;
    if (!attr) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_tc<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        attr = true;
    }
    dim3 grid((T + TC_BR - 1) / TC_BR, H, B);
    attn_fwd_tc<DH><<<grid, TC_WARPS * 32, sm, cuda_compute_stream()>>>(out, lse, q, k, v, T, H, Hkv, scale);
    CUDA_LAUNCH_CHECK("attn_fwd_tc");
}

template <int DH>
static void tc_bwd(bf16 *dq, bf16 *dk, bf16 *dv, float *dvec, const bf16 *dout, const bf16 *out, const bf16 *q,
                   const bf16 *k, const bf16 *v, const float *lse, int B, int T, int H, int Hkv, float scale) {
    static bool attr;
    size_t sm = tc_dims<DH>::bwd_smem;
    if (!attr) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_tc<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_tc<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        attr = true;
    }
    cudaStream_t st = cuda_compute_stream();
    dim3 gk((T + TC_BR - 1) / TC_BR, Hkv, B), gq((T + TC_BR - 1) / TC_BR, H, B);
    /* dq first: it writes the D that the dk/dv kernel reads */
    attn_bwd_dq_tc<DH><<<gq, TC_WARPS * 32, sm, st>>>(dq, dvec, dout, out, q, k, v, lse, T, H, Hkv, scale);
    CUDA_LAUNCH_CHECK("attn_bwd_dq_tc");
    attn_bwd_dkdv_tc<DH><<<gk, TC_WARPS * 32, sm, st>>>(dk, dv, dout, q, k, v, lse, dvec, T, H, Hkv, scale);
    CUDA_LAUNCH_CHECK("attn_bwd_dkdv_tc");
}

void launch_attention_fwd_tc(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H,
                             int Hkv, int Dh, float scale) {
    if (Dh == 64) tc_fwd<64>(out, lse, q, k, v, B, T, H, Hkv, scale);
    else tc_fwd<128>(out, lse, q, k, v, B, T, H, Hkv, scale);
}

void launch_attention_bwd_tc(bf16 *dq, bf16 *dk, bf16 *dv, float *dvec, const bf16 *dout, const bf16 *out,
                             const bf16 *q, const bf16 *k, const bf16 *v, const float *lse, int B, int T, int H,
                             int Hkv, int Dh, float scale) {
    if (Dh == 64) tc_bwd<64>(dq, dk, dv, dvec, dout, out, q, k, v, lse, B, T, H, Hkv, scale);
    else tc_bwd<128>(dq, dk, dv, dvec, dout, out, q, k, v, lse, B, T, H, Hkv, scale);
}
