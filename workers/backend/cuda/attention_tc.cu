/* attention_tc.cu: the tensor-core path of causal GQA flash attention (the
 * default; attention.cu holds the SIMT path and chooses between them).
 *
 * Same contract as attention.cu: q, out, dq (B, T, H, Dh); k, v, dk, dv
 * (B, T, Hkv, Dh) bf16; lse (B, H, T) fp32, natural log; Dh 64 or 128; no
 * (T, T) matrix in memory; deterministic (the backward is one pass owning
 * dk/dv and one owning dq, no atomics).
 *
 * Products go through WMMA (16x16x16 bf16 -> fp32, sm_80 and sm_90a); the
 * online softmax and the masking are SIMT on a per-warp fp32 scratch tile.
 * A block is 4 warps owning 64 rows (16 each); tiles of 64 keys (or
 * queries) stream through shared memory as bf16. In the forward, lane l
 * owns row l/2 of its warp's 16 and half of its columns, so the running
 * output lives in registers and is rescaled there; the backward keeps its
 * dk/dv/dq accumulators in WMMA fragments across the whole loop. */
#include "workers/backend/cuda/common.cuh"

#include <mma.h>

using namespace nvcuda;

#define TC_WARPS 4
#define TC_BR 64 /* rows per block */
#define TC_BC 64 /* keys (or queries) per tile */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bt; /* B = X^T of row-major X */
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* ---- helpers ---- */

/* dst (rows, DH) bf16 with row stride LD = rows row0.. of src (stride in
 * elements); rows at or past T are zero. 16-byte copies. */
template <int DH, int LD>
__device__ __forceinline__ void tc_load(bf16 *dst, const bf16 *src, size_t stride, int row0, int rows, int T) {
    constexpr int CH = DH / 8;
    for (int e = threadIdx.x; e < rows * CH; e += blockDim.x) {
        int r = e / CH, c = e % CH, t = row0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (t < T) val = *(const uint4 *)(src + (size_t)t * stride + c * 8);
        *(uint4 *)(dst + r * LD + c * 8) = val;
    }
}

/* C (16 x 16*NT, fp32, stride ldc) = A (16 x K, row-major bf16, lda) . X^T
 * where X is (16*NT x K) row-major bf16 (ldx): scores of 16 rows against
 * 16*NT rows. */
template <int K, int NT>
__device__ __forceinline__ void tc_abt(float *C, int ldc, const bf16 *A, int lda, const bf16 *X, int ldx) {
#pragma unroll
    for (int n = 0; n < NT; n++) {
        frag_c c;
        wmma::fill_fragment(c, 0.f);
#pragma unroll
        for (int kk = 0; kk < K / 16; kk++) {
            frag_a a;
            frag_bt b;
            wmma::load_matrix_sync(a, A + kk * 16, lda);
            wmma::load_matrix_sync(b, X + n * 16 * ldx + kk * 16, ldx);
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(C + n * 16, c, ldc, wmma::mem_row_major);
    }
}

/* acc[n] += A (16 x 64, row-major bf16, lda) . Y (64 x DH, row-major bf16, ldy) */
template <int DH>
__device__ __forceinline__ void tc_ab_acc(frag_c *acc, const bf16 *A, int lda, const bf16 *Y, int ldy) {
#pragma unroll
    for (int kk = 0; kk < TC_BC / 16; kk++) {
        frag_a a;
        wmma::load_matrix_sync(a, A + kk * 16, lda);
#pragma unroll
        for (int n = 0; n < DH / 16; n++) {
            frag_b b;
            wmma::load_matrix_sync(b, Y + kk * 16 * ldy + n * 16, ldy);
            wmma::mma_sync(acc[n], a, b, acc[n]);
        }
    }
}

/* Write a warp's 16 x DH accumulator as bf16 row r (lane's half of it) of
 * `row` times f, through `stage` (16 x LS floats of the warp's scratch). */
template <int DH>
__device__ __forceinline__ void tc_store_rows(const frag_c (&acc)[DH / 16], float *stage, bf16 *row, bool write, float f,
                                              int r, int half) {
    constexpr int LS = (DH > TC_BC ? DH : TC_BC) + 4;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < DH / 16; n++) wmma::store_matrix_sync(stage + n * 16, acc[n], LS, wmma::mem_row_major);
    __syncwarp();
    if (write) {
        const float *src = stage + r * LS + (DH / 2) * half;
        bf16 *dst = row + (DH / 2) * half;
        for (int j = 0; j < DH / 2; j += 2) *(__nv_bfloat162 *)(dst + j) = __floats2bfloat162_rn(src[j] * f, src[j + 1] * f);
    }
    __syncwarp();
}

template <int DH>
struct tc_dims {
    static constexpr int LD = DH + 8;                      /* bf16 tile row stride */
    static constexpr int LS = (DH > TC_BC ? DH : TC_BC) + 4; /* fp32 scratch row stride */
    static constexpr int LP = TC_BC + 8;                   /* bf16 probability row stride */
    static constexpr int LW = TC_BC + 4;                   /* fp32 score row stride (backward) */
    static constexpr size_t fwd_smem = (size_t)3 * TC_BR * LD * 2 + (size_t)TC_WARPS * 16 * LS * 4 + (size_t)TC_WARPS * 16 * LP * 2;
    /* backward: 4 bf16 tiles; per warp two fp32 16 x LW tiles (also the
     * 16 x LS output staging: 2 * LW >= LS) and two bf16 16 x LP tiles; 2 x 64 floats */
    static constexpr size_t bwd_smem = (size_t)4 * TC_BR * LD * 2 + (size_t)TC_WARPS * (2 * 16 * LW * 4 + 2 * 16 * LP * 2) + 2 * TC_BC * 4;
    static_assert(2 * LW >= LS, "output staging must fit in the two score tiles");
};

/* ---- forward ---- */

template <int DH>
__global__ void __launch_bounds__(TC_WARPS * 32) attn_fwd_tc(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                                             const bf16 *v, int T, int H, int Hkv, float scale) {
    typedef tc_dims<DH> Z;
    constexpr int HALF = DH / 2;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + TC_BR * Z::LD, *Vs = Ks + TC_BC * Z::LD;
    float *Sc = (float *)(Vs + TC_BC * Z::LD);
    bf16 *Pc = (bf16 *)(Sc + TC_WARPS * 16 * Z::LS);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    float *S = Sc + w * 16 * Z::LS;
    bf16 *P = Pc + w * 16 * Z::LP;
    int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (H / Hkv);
    int q0 = qb * TC_BR, qw = q0 + 16 * w, qi = qw + r;
    size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
    const bf16 *kbase = k + (size_t)b * T * ks + (size_t)kh * DH, *vbase = v + (size_t)b * T * ks + (size_t)kh * DH;
    tc_load<DH, Z::LD>(Qs, q + (size_t)b * T * qs + (size_t)h * DH, qs, q0, TC_BR, T);

    float m = -INFINITY, l = 0.f, o[HALF];
#pragma unroll
    for (int j = 0; j < HALF; j++) o[j] = 0.f;
    int last = min(q0 + TC_BR, T) - 1;
    for (int k0 = 0; k0 <= last; k0 += TC_BC) {
        __syncthreads();
        tc_load<DH, Z::LD>(Ks, kbase, ks, k0, TC_BC, T);
        tc_load<DH, Z::LD>(Vs, vbase, ks, k0, TC_BC, T);
        __syncthreads();
        if (k0 > qw + 15) continue; /* every key of the tile is after this warp's rows */
        tc_abt<DH, TC_BC / 16>(S, Z::LS, Qs + 16 * w * Z::LD, Z::LD, Ks, Z::LD);
        __syncwarp();
        /* online softmax of row r over columns [32 half, 32 half + 32) */
        const float *srow = S + r * Z::LS + 32 * half;
        float mx = -INFINITY;
        for (int c = 0; c < 32; c++) {
            int kj = k0 + 32 * half + c;
            if (kj <= qi && kj < T) mx = fmaxf(mx, srow[c] * scale);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float mn = fmaxf(m, mx);
        float corr = m == -INFINITY ? 0.f : __expf(m - mn);
        float sum = 0.f;
        bf16 *prow = P + r * Z::LP + 32 * half;
        for (int c = 0; c < 32; c++) {
            int kj = k0 + 32 * half + c;
            float p = (kj <= qi && kj < T) ? __expf(srow[c] * scale - mn) : 0.f;
            bf16 pb = __float2bfloat16(p);
            prow[c] = pb;
            sum += __bfloat162float(pb); /* the weights the product below uses */
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * corr + sum;
        m = mn;
        __syncwarp();
        /* S (16 x DH) = P (16 x 64) . V (64 x DH) */
        frag_c acc[DH / 16];
#pragma unroll
        for (int n = 0; n < DH / 16; n++) wmma::fill_fragment(acc[n], 0.f);
        tc_ab_acc<DH>(acc, P, Z::LP, Vs, Z::LD);
#pragma unroll
        for (int n = 0; n < DH / 16; n++) wmma::store_matrix_sync(S + n * 16, acc[n], Z::LS, wmma::mem_row_major);
        __syncwarp();
        const float *pv = S + r * Z::LS + HALF * half;
#pragma unroll
        for (int j = 0; j < HALF; j++) o[j] = o[j] * corr + pv[j];
        __syncwarp();
    }
    if (qi < T) {
        float inv = 1.f / l;
        bf16 *orow = out + ((size_t)b * T + qi) * qs + (size_t)h * DH + HALF * half;
#pragma unroll
        for (int j = 0; j < HALF; j += 2) *(__nv_bfloat162 *)(orow + j) = __floats2bfloat162_rn(o[j] * inv, o[j + 1] * inv);
        if (half == 0) lse[((size_t)b * H + h) * T + qi] = m + __logf(l);
    }
}

/* ---- backward: dk, dv ---- */

template <int DH>
__global__ void __launch_bounds__(TC_WARPS * 32) attn_bwd_dkdv_tc(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                                                                  const bf16 *k, const bf16 *v, const float *lse,
                                                                  const float *dvec, int T, int H, int Hkv, float scale) {
    typedef tc_dims<DH> Z;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Ks = (bf16 *)smem, *Vs = Ks + TC_BR * Z::LD, *Qs = Vs + TC_BR * Z::LD, *Gs = Qs + TC_BC * Z::LD;
    float *Wf = (float *)(Gs + TC_BC * Z::LD);
    bf16 *Wb = (bf16 *)(Wf + TC_WARPS * 2 * 16 * Z::LW);
    float *Ls = (float *)(Wb + TC_WARPS * 2 * 16 * Z::LP), *Ds = Ls + TC_BC;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    float *St = Wf + w * 2 * 16 * Z::LW, *Dt = St + 16 * Z::LW;
    bf16 *Pt = Wb + w * 2 * 16 * Z::LP, *dSt = Pt + 16 * Z::LP;
    int kb = gridDim.x - 1 - blockIdx.x, kh = blockIdx.y, b = blockIdx.z, rep = H / Hkv;
    int k0 = kb * TC_BR, kw = k0 + 16 * w, kj = kw + r;
    size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
    tc_load<DH, Z::LD>(Ks, k + (size_t)b * T * ks + (size_t)kh * DH, ks, k0, TC_BR, T);
    tc_load<DH, Z::LD>(Vs, v + (size_t)b * T * ks + (size_t)kh * DH, ks, k0, TC_BR, T);
    frag_c adk[DH / 16], adv[DH / 16];
#pragma unroll
    for (int n = 0; n < DH / 16; n++) { wmma::fill_fragment(adk[n], 0.f); wmma::fill_fragment(adv[n], 0.f); }
    for (int h = kh * rep; h < (kh + 1) * rep; h++) {
        const bf16 *qbase = q + (size_t)b * T * qs + (size_t)h * DH, *gbase = dout + (size_t)b * T * qs + (size_t)h * DH;
        const float *lrow = lse + ((size_t)b * H + h) * T, *drow = dvec + ((size_t)b * H + h) * T;
        for (int t0 = (k0 / TC_BC) * TC_BC; t0 < T; t0 += TC_BC) {
            __syncthreads();
            tc_load<DH, Z::LD>(Qs, qbase, qs, t0, TC_BC, T);
            tc_load<DH, Z::LD>(Gs, gbase, qs, t0, TC_BC, T);
            for (int i = threadIdx.x; i < TC_BC; i += blockDim.x) {
                int t = t0 + i;
                Ls[i] = t < T ? lrow[t] : 0.f;
                Ds[i] = t < T ? drow[t] : 0.f;
            }
            __syncthreads();
            if (t0 + TC_BC - 1 < kw) continue; /* every query of the tile is before this warp's keys */
            /* S^T (16 keys x 64 queries) = K_w . Q^T ; dP^T = V_w . dO^T */
            tc_abt<DH, TC_BC / 16>(St, Z::LW, Ks + 16 * w * Z::LD, Z::LD, Qs, Z::LD);
            tc_abt<DH, TC_BC / 16>(Dt, Z::LW, Vs + 16 * w * Z::LD, Z::LD, Gs, Z::LD);
            __syncwarp();
            for (int c = 32 * half; c < 32 * half + 32; c++) {
                int qi = t0 + c;
                float p = (qi >= kj && qi < T) ? __expf(St[r * Z::LW + c] * scale - Ls[c]) : 0.f;
                float ds = p * (Dt[r * Z::LW + c] - Ds[c]);
                Pt[r * Z::LP + c] = __float2bfloat16(p);
                dSt[r * Z::LP + c] = __float2bfloat16(ds);
            }
            __syncwarp();
            tc_ab_acc<DH>(adv, Pt, Z::LP, Gs, Z::LD);  /* dV_w += P^T dO */
            tc_ab_acc<DH>(adk, dSt, Z::LP, Qs, Z::LD); /* dK_w += dS^T Q (scale below) */
            __syncwarp();
        }
    }
    /* stage each accumulator through the warp's scratch, then write bf16 rows */
    size_t at = ((size_t)b * T + kj) * ks + (size_t)kh * DH;
    tc_store_rows<DH>(adk, St, dk + at, kj < T, scale, r, half);
    tc_store_rows<DH>(adv, St, dv + at, kj < T, 1.f, r, half);
}

/* ---- backward: dq ---- */

template <int DH>
__global__ void __launch_bounds__(TC_WARPS * 32) attn_bwd_dq_tc(bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k,
                                                                const bf16 *v, const float *lse, const float *dvec, int T,
                                                                int H, int Hkv, float scale) {
    typedef tc_dims<DH> Z;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem, *Gs = Qs + TC_BR * Z::LD, *Ks = Gs + TC_BR * Z::LD, *Vs = Ks + TC_BC * Z::LD;
    float *Wf = (float *)(Vs + TC_BC * Z::LD);
    bf16 *Wb = (bf16 *)(Wf + TC_WARPS * 2 * 16 * Z::LW);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    float *S = Wf + w * 2 * 16 * Z::LW, *Dp = S + 16 * Z::LW;
    bf16 *dS = Wb + w * 2 * 16 * Z::LP;
    int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (H / Hkv);
    int q0 = qb * TC_BR, qw = q0 + 16 * w, qi = qw + r;
    size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
    tc_load<DH, Z::LD>(Qs, q + (size_t)b * T * qs + (size_t)h * DH, qs, q0, TC_BR, T);
    tc_load<DH, Z::LD>(Gs, dout + (size_t)b * T * qs + (size_t)h * DH, qs, q0, TC_BR, T);
    const bf16 *kbase = k + (size_t)b * T * ks + (size_t)kh * DH, *vbase = v + (size_t)b * T * ks + (size_t)kh * DH;
    size_t li = ((size_t)b * H + h) * T + qi;
    float Lr = qi < T ? lse[li] : 0.f, Dr = qi < T ? dvec[li] : 0.f;
    frag_c acc[DH / 16];
#pragma unroll
    for (int n = 0; n < DH / 16; n++) wmma::fill_fragment(acc[n], 0.f);
    int last = min(q0 + TC_BR, T) - 1;
    for (int k0 = 0; k0 <= last; k0 += TC_BC) {
        __syncthreads();
        tc_load<DH, Z::LD>(Ks, kbase, ks, k0, TC_BC, T);
        tc_load<DH, Z::LD>(Vs, vbase, ks, k0, TC_BC, T);
        __syncthreads();
        if (k0 > qw + 15) continue;
        tc_abt<DH, TC_BC / 16>(S, Z::LW, Qs + 16 * w * Z::LD, Z::LD, Ks, Z::LD);  /* S = Q_w K^T */
        tc_abt<DH, TC_BC / 16>(Dp, Z::LW, Gs + 16 * w * Z::LD, Z::LD, Vs, Z::LD); /* dP = dO_w V^T */
        __syncwarp();
        for (int c = 32 * half; c < 32 * half + 32; c++) {
            int kj = k0 + c;
            float p = (kj <= qi && kj < T) ? __expf(S[r * Z::LW + c] * scale - Lr) : 0.f;
            dS[r * Z::LP + c] = __float2bfloat16(p * (Dp[r * Z::LW + c] - Dr));
        }
        __syncwarp();
        tc_ab_acc<DH>(acc, dS, Z::LP, Ks, Z::LD); /* dQ_w += dS K (scale below) */
        __syncwarp();
    }
    tc_store_rows<DH>(acc, S, dq + ((size_t)b * T + qi) * qs + (size_t)h * DH, qi < T, scale, r, half);
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
static void tc_bwd(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                   const float *lse, const float *dvec, int B, int T, int H, int Hkv, float scale) {
    static bool attr;
    size_t sm = tc_dims<DH>::bwd_smem;
    if (!attr) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_tc<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_tc<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        attr = true;
    }
    cudaStream_t st = cuda_compute_stream();
    dim3 gk((T + TC_BR - 1) / TC_BR, Hkv, B), gq((T + TC_BR - 1) / TC_BR, H, B);
    attn_bwd_dkdv_tc<DH><<<gk, TC_WARPS * 32, sm, st>>>(dk, dv, dout, q, k, v, lse, dvec, T, H, Hkv, scale);
    CUDA_LAUNCH_CHECK("attn_bwd_dkdv_tc");
    attn_bwd_dq_tc<DH><<<gq, TC_WARPS * 32, sm, st>>>(dq, dout, q, k, v, lse, dvec, T, H, Hkv, scale);
    CUDA_LAUNCH_CHECK("attn_bwd_dq_tc");
}

void launch_attention_fwd_tc(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H,
                             int Hkv, int Dh, float scale) {
    if (Dh == 64) tc_fwd<64>(out, lse, q, k, v, B, T, H, Hkv, scale);
    else tc_fwd<128>(out, lse, q, k, v, B, T, H, Hkv, scale);
}

void launch_attention_bwd_tc(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k,
                             const bf16 *v, const float *lse, const float *dvec, int B, int T, int H, int Hkv, int Dh,
                             float scale) {
    if (Dh == 64) tc_bwd<64>(dq, dk, dv, dout, q, k, v, lse, dvec, B, T, H, Hkv, scale);
    else tc_bwd<128>(dq, dk, dv, dout, q, k, v, lse, dvec, B, T, H, Hkv, scale);
}
