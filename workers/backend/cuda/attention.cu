/* attention.cu: causal attention with grouped-query heads at flash-attention
 * cost: no (T, T) matrix exists anywhere, memory is O(T) per head.
 *
 * Our own tiled kernels rather than cuDNN's fused attention: they run on
 * sm_80 and sm_90a alike, depend on no library version (cuDNN's graph API
 * changes its supported-configuration rules between releases, and a
 * failure there shows only at run time on the GPU), are deterministic (no
 * atomics: the backward is two passes, one owning dq, one owning dk and dv)
 * and can be checked line by line against the CPU oracle. Two paths:
 * attention_tc.cu (mma.sync tensor cores, the default) and the SIMT kernels
 * here (fp32 FMA: slower, simplest to trust), chosen with
 * cuda_attention_use() (the worker's --attention own is tc). cuDNN's fused
 * attention (attention_cudnn.cu) is a third path behind the same
 * launchers, taken only after its start-up self-check against these.
 *
 * Shapes: q, out, dq (B, T, H, Dh); k, v, dk, dv (B, T, Hkv, Dh), bf16;
 * lse (B, H, T) fp32 = log-sum-exp of each query row's scaled scores, the
 * only state kept from forward to backward. Query head h reads key/value
 * head h / (H / Hkv). Dh is 64 or 128 (templates, two instantiations each).
 *
 * Work split: a block of 4 warps owns 16 rows (each warp 4); tiles of 32
 * keys (forward, dq) or 32 queries (dk/dv) stream through shared memory as
 * fp32, with lane j handling key (or query) j of the tile for the dot
 * products and lane c handling columns c, c+32, ... of the accumulators.
 * Softmax is online (running max and sum per row). */
#include "workers/backend/cuda/common.cuh"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ATT_WARPS 4
#define ATT_ROWS 4                        /* rows per warp */
#define ATT_BR (ATT_WARPS * ATT_ROWS)     /* rows per block */
#define ATT_BC 32                         /* tile of keys / queries */

/* ---- helpers ---- */

/* dst[r][d] (row stride ldd) = mul * src[(row0 + r) * stride + d] for the
 * tile's nrows rows; rows at or past T read as 0. */
template <int DH>
__device__ __forceinline__ void load_tile(float *dst, int ldd, const bf16 *src, size_t stride, int row0, int nrows,
                                          int T, float mul) {
    for (int e = threadIdx.x; e < nrows * DH; e += blockDim.x) {
        int r = e / DH, d = e % DH, t = row0 + r;
        dst[r * ldd + d] = t < T ? mul * __bfloat162float(src[(size_t)t * stride + d]) : 0.f;
    }
}

/* ---- forward ---- */

template <int DH>
__global__ void __launch_bounds__(ATT_WARPS * 32) attn_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                                                  const bf16 *v, int T, int H, int Hkv, float scale) {
    constexpr int C = DH / 32;
    __shared__ float Qs[ATT_BR][DH];
    __shared__ float Ks[ATT_BC][DH + 1];
    __shared__ float Vs[ATT_BC][DH];
    int qb = gridDim.x - 1 - blockIdx.x; /* longest rows first */
    int h = blockIdx.y, b = blockIdx.z, kh = h / (H / Hkv);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int q0 = qb * ATT_BR;
    size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
    const bf16 *qbase = q + (size_t)b * T * qs + (size_t)h * DH;
    const bf16 *kbase = k + (size_t)b * T * ks + (size_t)kh * DH;
    const bf16 *vbase = v + (size_t)b * T * ks + (size_t)kh * DH;
    load_tile<DH>(&Qs[0][0], DH, qbase, qs, q0, ATT_BR, T, scale);

    float m[ATT_ROWS], l[ATT_ROWS], o[ATT_ROWS][C];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0.f;
#pragma unroll
        for (int c = 0; c < C; c++) o[r][c] = 0.f;
    }
    int last = min(q0 + ATT_BR, T) - 1; /* highest key any row here sees */
    for (int k0 = 0; k0 <= last; k0 += ATT_BC) {
        __syncthreads(); /* previous tile fully used (and Qs written) */
        load_tile<DH>(&Ks[0][0], DH + 1, kbase, ks, k0, ATT_BC, T, 1.f);
        load_tile<DH>(&Vs[0][0], DH, vbase, ks, k0, ATT_BC, T, 1.f);
        __syncthreads();
        float s[ATT_ROWS];
#pragma unroll
        for (int r = 0; r < ATT_ROWS; r++) s[r] = 0.f;
        for (int d = 0; d < DH; d++) {
            float kv = Ks[lane][d];
#pragma unroll
            for (int r = 0; r < ATT_ROWS; r++) s[r] += Qs[w * ATT_ROWS + r][d] * kv;
        }
        int kj = k0 + lane;
        float p[ATT_ROWS];
#pragma unroll
        for (int r = 0; r < ATT_ROWS; r++) {
            int qi = q0 + w * ATT_ROWS + r;
            bool ok = kj <= qi && kj < T;
            float sv = ok ? s[r] : -INFINITY;
            float mn = fmaxf(m[r], warp_max(sv));
            float corr = __expf(m[r] - mn); /* 0 on the first tile */
            p[r] = ok ? __expf(sv - mn) : 0.f;
            l[r] = l[r] * corr + warp_sum(p[r]);
            m[r] = mn;
#pragma unroll
            for (int c = 0; c < C; c++) o[r][c] *= corr;
        }
        for (int j = 0; j < ATT_BC; j++) {
            float vj[C];
#pragma unroll
            for (int c = 0; c < C; c++) vj[c] = Vs[j][lane + 32 * c];
#pragma unroll
            for (int r = 0; r < ATT_ROWS; r++) {
                float pj = __shfl_sync(0xffffffffu, p[r], j);
#pragma unroll
                for (int c = 0; c < C; c++) o[r][c] += pj * vj[c];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int qi = q0 + w * ATT_ROWS + r;
        if (qi >= T) continue;
        float inv = 1.f / l[r];
        bf16 *orow = out + ((size_t)b * T + qi) * qs + (size_t)h * DH;
#pragma unroll
        for (int c = 0; c < C; c++) orow[lane + 32 * c] = __float2bfloat16(o[r][c] * inv);
        if (lane == 0) lse[((size_t)b * H + h) * T + qi] = m[r] + __logf(l[r]);
    }
}

/* ---- backward ---- */

/* dv_row[b, h, t] = sum_d dout * out: one warp per row */
__global__ void attn_bwd_rowdot(float *dvec, const bf16 *dout, const bf16 *out, int B, int T, int H, int Dh) {
    int lane = threadIdx.x & 31;
    size_t rows = (size_t)B * T * H, nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5; row < rows; row += nwarps) {
        /* row = (b*T + t)*H + h */
        const bf16 *g = dout + row * Dh, *o = out + row * Dh;
        float s = 0.f;
        for (int d = lane; d < Dh; d += 32) s += __bfloat162float(g[d]) * __bfloat162float(o[d]);
        s = warp_sum(s);
        int h = (int)(row % H);
        size_t bt = row / H;
        int t = (int)(bt % T), b = (int)(bt / T);
        if (lane == 0) dvec[((size_t)b * H + h) * T + t] = s;
    }
}

/* dq for 16 query rows of (b, h), streaming key tiles. Dynamic shared memory:
 * Qs, Gs (16, DH) then Ks, Vs (32, DH + 1). */
template <int DH>
__global__ void __launch_bounds__(ATT_WARPS * 32) attn_bwd_dq_kernel(bf16 *dq, const bf16 *dout, const bf16 *q,
                                                                     const bf16 *k, const bf16 *v, const float *lse,
                                                                     const float *dvec, int T, int H, int Hkv,
                                                                     float scale) {
    constexpr int C = DH / 32;
    extern __shared__ float sm[];
    float(*Qs)[DH] = (float(*)[DH])sm;
    float(*Gs)[DH] = (float(*)[DH])(sm + ATT_BR * DH);
    float(*Ks)[DH + 1] = (float(*)[DH + 1])(sm + 2 * ATT_BR * DH);
    float(*Vs)[DH + 1] = (float(*)[DH + 1])(sm + 2 * ATT_BR * DH + ATT_BC * (DH + 1));
    int qb = gridDim.x - 1 - blockIdx.x;
    int h = blockIdx.y, b = blockIdx.z, kh = h / (H / Hkv);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int q0 = qb * ATT_BR;
    size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
    load_tile<DH>(&Qs[0][0], DH, q + (size_t)b * T * qs + (size_t)h * DH, qs, q0, ATT_BR, T, scale);
    load_tile<DH>(&Gs[0][0], DH, dout + (size_t)b * T * qs + (size_t)h * DH, qs, q0, ATT_BR, T, 1.f);
    const bf16 *kbase = k + (size_t)b * T * ks + (size_t)kh * DH;
    const bf16 *vbase = v + (size_t)b * T * ks + (size_t)kh * DH;
    float L[ATT_ROWS], Dv[ATT_ROWS], acc[ATT_ROWS][C];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int qi = q0 + w * ATT_ROWS + r;
        size_t idx = ((size_t)b * H + h) * T + qi;
        L[r] = qi < T ? lse[idx] : 0.f;
        Dv[r] = qi < T ? dvec[idx] : 0.f;
#pragma unroll
        for (int c = 0; c < C; c++) acc[r][c] = 0.f;
    }
    int last = min(q0 + ATT_BR, T) - 1;
    for (int k0 = 0; k0 <= last; k0 += ATT_BC) {
        __syncthreads();
        load_tile<DH>(&Ks[0][0], DH + 1, kbase, ks, k0, ATT_BC, T, 1.f);
        load_tile<DH>(&Vs[0][0], DH + 1, vbase, ks, k0, ATT_BC, T, 1.f);
        __syncthreads();
        float s[ATT_ROWS], dp[ATT_ROWS];
#pragma unroll
        for (int r = 0; r < ATT_ROWS; r++) { s[r] = 0.f; dp[r] = 0.f; }
        for (int d = 0; d < DH; d++) {
            float kv = Ks[lane][d], vv = Vs[lane][d];
#pragma unroll
            for (int r = 0; r < ATT_ROWS; r++) {
                s[r] += Qs[w * ATT_ROWS + r][d] * kv;
                dp[r] += Gs[w * ATT_ROWS + r][d] * vv;
            }
        }
        int kj = k0 + lane;
        float ds[ATT_ROWS];
#pragma unroll
        for (int r = 0; r < ATT_ROWS; r++) {
            int qi = q0 + w * ATT_ROWS + r;
            float p = (kj <= qi && kj < T) ? __expf(s[r] - L[r]) : 0.f;
            ds[r] = p * (dp[r] - Dv[r]);
        }
        for (int j = 0; j < ATT_BC; j++) {
            float kj_[C];
#pragma unroll
            for (int c = 0; c < C; c++) kj_[c] = Ks[j][lane + 32 * c];
#pragma unroll
            for (int r = 0; r < ATT_ROWS; r++) {
                float dsj = __shfl_sync(0xffffffffu, ds[r], j);
#pragma unroll
                for (int c = 0; c < C; c++) acc[r][c] += dsj * kj_[c];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int qi = q0 + w * ATT_ROWS + r;
        if (qi >= T) continue;
        bf16 *row = dq + ((size_t)b * T + qi) * qs + (size_t)h * DH;
#pragma unroll
        for (int c = 0; c < C; c++) row[lane + 32 * c] = __float2bfloat16(acc[r][c] * scale);
    }
}

/* dk, dv for 16 key rows of (b, kh), streaming query tiles of every query
 * head of the group in a fixed order. Dynamic shared memory: Ks, Vs (16, DH)
 * then Qs, Gs (32, DH + 1), then lse and dvec of the tile (32 each). */
template <int DH>
__global__ void __launch_bounds__(ATT_WARPS * 32) attn_bwd_dkdv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout,
                                                                       const bf16 *q, const bf16 *k, const bf16 *v,
                                                                       const float *lse, const float *dvec, int T,
                                                                       int H, int Hkv, float scale) {
    constexpr int C = DH / 32;
    extern __shared__ float sm[];
    float(*Ks)[DH] = (float(*)[DH])sm;
    float(*Vs)[DH] = (float(*)[DH])(sm + ATT_BR * DH);
    float(*Qs)[DH + 1] = (float(*)[DH + 1])(sm + 2 * ATT_BR * DH);
    float(*Gs)[DH + 1] = (float(*)[DH + 1])(sm + 2 * ATT_BR * DH + ATT_BC * (DH + 1));
    float *Ls = sm + 2 * ATT_BR * DH + 2 * ATT_BC * (DH + 1);
    float *Ds = Ls + ATT_BC;
    int kb = gridDim.x - 1 - blockIdx.x;
    int kh = blockIdx.y, b = blockIdx.z, rep = H / Hkv;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int k0 = kb * ATT_BR;
    size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
    load_tile<DH>(&Ks[0][0], DH, k + (size_t)b * T * ks + (size_t)kh * DH, ks, k0, ATT_BR, T, scale);
    load_tile<DH>(&Vs[0][0], DH, v + (size_t)b * T * ks + (size_t)kh * DH, ks, k0, ATT_BR, T, 1.f);
    float adk[ATT_ROWS][C], adv[ATT_ROWS][C];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++)
#pragma unroll
        for (int c = 0; c < C; c++) { adk[r][c] = 0.f; adv[r][c] = 0.f; }
    for (int h = kh * rep; h < (kh + 1) * rep; h++) {
        const bf16 *qbase = q + (size_t)b * T * qs + (size_t)h * DH;
        const bf16 *gbase = dout + (size_t)b * T * qs + (size_t)h * DH;
        const float *lrow = lse + ((size_t)b * H + h) * T, *drow = dvec + ((size_t)b * H + h) * T;
        for (int t0 = (k0 / ATT_BC) * ATT_BC; t0 < T; t0 += ATT_BC) {
            __syncthreads();
            load_tile<DH>(&Qs[0][0], DH + 1, qbase, qs, t0, ATT_BC, T, 1.f);
            load_tile<DH>(&Gs[0][0], DH + 1, gbase, qs, t0, ATT_BC, T, 1.f);
            if (threadIdx.x < ATT_BC) {
                int t = t0 + threadIdx.x;
                Ls[threadIdx.x] = t < T ? lrow[t] : 0.f;
                Ds[threadIdx.x] = t < T ? drow[t] : 0.f;
            }
            __syncthreads();
            /* lane i is query t0 + i: scores against this warp's 4 keys */
            float s[ATT_ROWS], dp[ATT_ROWS];
#pragma unroll
            for (int r = 0; r < ATT_ROWS; r++) { s[r] = 0.f; dp[r] = 0.f; }
            for (int d = 0; d < DH; d++) {
                float qv = Qs[lane][d], gv = Gs[lane][d];
#pragma unroll
                for (int r = 0; r < ATT_ROWS; r++) {
                    s[r] += qv * Ks[w * ATT_ROWS + r][d]; /* Ks carries the scale */
                    dp[r] += gv * Vs[w * ATT_ROWS + r][d];
                }
            }
            int qi = t0 + lane;
            float p[ATT_ROWS], ds[ATT_ROWS];
#pragma unroll
            for (int r = 0; r < ATT_ROWS; r++) {
                int kj = k0 + w * ATT_ROWS + r;
                p[r] = (qi >= kj && qi < T) ? __expf(s[r] - Ls[lane]) : 0.f;
                ds[r] = p[r] * (dp[r] - Ds[lane]);
            }
            for (int i = 0; i < ATT_BC; i++) {
                float qv[C], gv[C];
#pragma unroll
                for (int c = 0; c < C; c++) { qv[c] = Qs[i][lane + 32 * c]; gv[c] = Gs[i][lane + 32 * c]; }
#pragma unroll
                for (int r = 0; r < ATT_ROWS; r++) {
                    float pi = __shfl_sync(0xffffffffu, p[r], i), dsi = __shfl_sync(0xffffffffu, ds[r], i);
#pragma unroll
                    for (int c = 0; c < C; c++) { adv[r][c] += pi * gv[c]; adk[r][c] += dsi * qv[c]; }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int kj = k0 + w * ATT_ROWS + r;
        if (kj >= T) continue;
        bf16 *krow = dk + ((size_t)b * T + kj) * ks + (size_t)kh * DH;
        bf16 *vrow = dv + ((size_t)b * T + kj) * ks + (size_t)kh * DH;
#pragma unroll
        for (int c = 0; c < C; c++) {
            krow[lane + 32 * c] = __float2bfloat16(adk[r][c] * scale);
            vrow[lane + 32 * c] = __float2bfloat16(adv[r][c]);
        }
    }
}

/* ---- launchers ---- */

static void check_shape(int H, int Hkv, int Dh) {
    if (Dh != 64 && Dh != 128) {
        fprintf(stderr, "%s:%d: attention head_dim %d is not supported by the CUDA backend (64 or 128)\n", __FILE__, __LINE__, Dh);
        exit(1);
    }
    if (Hkv <= 0 || H % Hkv) {
        fprintf(stderr, "%s:%d: attention heads %d not a multiple of key/value heads %d\n", __FILE__, __LINE__, H, Hkv);
        exit(1);
    }
}

/* true after cuda_attention_select chose cuDNN */
static bool g_cudnn_on;
static bool cudnn_attention_on(void) { return g_cudnn_on; }
static void cudnn_attention_off(void) { g_cudnn_on = false; }

/* 1: tensor cores (attention_tc.cu, the default), 0: SIMT */
static int g_use_tc = 1;

extern "C" int cuda_attention_use(const char *impl) {
    if (strcmp(impl, "tc") == 0 || strcmp(impl, "own") == 0) g_use_tc = 1;
    else if (strcmp(impl, "simt") == 0) g_use_tc = 0;
    else return -1;
    cudnn_attention_off();
    return 0;
}

static bool use_tc(void) { return g_use_tc == 1; }

void launch_attention_fwd_own(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H,
                              int Hkv, int Dh) {
    if (B <= 0 || T <= 0) return;
    check_shape(H, Hkv, Dh);
    dim3 grid((T + ATT_BR - 1) / ATT_BR, H, B);
    float scale = (float)(1.0 / sqrt((double)Dh));
    if (use_tc()) { launch_attention_fwd_tc(out, lse, q, k, v, B, T, H, Hkv, Dh, scale); return; }
    cudaStream_t st = cuda_compute_stream();
    if (Dh == 64) attn_fwd_kernel<64><<<grid, ATT_WARPS * 32, 0, st>>>(out, lse, q, k, v, T, H, Hkv, scale);
    else attn_fwd_kernel<128><<<grid, ATT_WARPS * 32, 0, st>>>(out, lse, q, k, v, T, H, Hkv, scale);
    CUDA_LAUNCH_CHECK("attn_fwd_kernel");
}

/* A call cuDNN refuses (a shape its engines do not take, an unaligned
 * pointer) runs our kernels, with one warning per reason: the log-sum-exp
 * state is the same on both paths, so a forward and backward on different
 * paths agree (the start-up self-check compares it). */
static long g_cudnn_ran, g_cudnn_refused;
static char g_cudnn_last[512];

extern "C" void cuda_attention_cudnn_counts(long *ran, long *refused, const char **last_refusal) {
    if (ran) *ran = g_cudnn_ran;
    if (refused) *refused = g_cudnn_refused;
    if (last_refusal) *last_refusal = g_cudnn_last;
}

static void cudnn_refused(const char *err) {
    static char last[512];
    g_cudnn_refused++;
    snprintf(g_cudnn_last, sizeof g_cudnn_last, "%s", err);
    if (strcmp(last, err) == 0) return;
    snprintf(last, sizeof last, "%s", err);
    fprintf(stderr, "warning: attention: %s; this call runs our own kernels\n", err);
}

void launch_attention_fwd(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H,
                          int Hkv, int Dh) {
    if (B <= 0 || T <= 0) return;
    if (cudnn_attention_on()) {
        char err[768];
        check_shape(H, Hkv, Dh);
        if (cudnn_attention_fwd(out, lse, q, k, v, B, T, H, Hkv, Dh, err, sizeof err) == 0) { g_cudnn_ran++; return; }
        cudnn_refused(err);
    }
    launch_attention_fwd_own(out, lse, q, k, v, B, T, H, Hkv, Dh);
}

template <int DH>
static void launch_bwd_dh(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                          const float *lse, const float *dvec, int B, int T, int H, int Hkv, float scale) {
    static bool attr_set;
    size_t dq_smem = (size_t)(2 * ATT_BR * DH + 2 * ATT_BC * (DH + 1)) * sizeof(float);
    size_t kv_smem = dq_smem + 2 * ATT_BC * sizeof(float);
    if (!attr_set) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_kernel<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem));
        CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_kernel<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kv_smem));
        attr_set = true;
    }
    cudaStream_t st = cuda_compute_stream();
    dim3 gq((T + ATT_BR - 1) / ATT_BR, H, B), gk((T + ATT_BR - 1) / ATT_BR, Hkv, B);
    attn_bwd_dq_kernel<DH><<<gq, ATT_WARPS * 32, dq_smem, st>>>(dq, dout, q, k, v, lse, dvec, T, H, Hkv, scale);
    CUDA_LAUNCH_CHECK("attn_bwd_dq_kernel");
    attn_bwd_dkdv_kernel<DH><<<gk, ATT_WARPS * 32, kv_smem, st>>>(dk, dv, dout, q, k, v, lse, dvec, T, H, Hkv, scale);
    CUDA_LAUNCH_CHECK("attn_bwd_dkdv_kernel");
}

void launch_attention_bwd_own(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out, const bf16 *q,
                              const bf16 *k, const bf16 *v, const float *lse, int B, int T, int H, int Hkv, int Dh) {
    if (B <= 0 || T <= 0) return;
    check_shape(H, Hkv, Dh);
    size_t rows = (size_t)B * T * H;
    float *dvec = (float *)cuda_scratch(SCRATCH_ATTN, rows * sizeof(float));
    float scale = (float)(1.0 / sqrt((double)Dh));
    /* the tensor-core dq kernel computes the row dot itself */
    if (use_tc()) { launch_attention_bwd_tc(dq, dk, dv, dvec, dout, out, q, k, v, lse, B, T, H, Hkv, Dh, scale); return; }
    attn_bwd_rowdot<<<cuda_blocks(rows * 32, 256), 256, 0, cuda_compute_stream()>>>(dvec, dout, out, B, T, H, Dh);
    CUDA_LAUNCH_CHECK("attn_bwd_rowdot");
    if (Dh == 64) launch_bwd_dh<64>(dq, dk, dv, dout, q, k, v, lse, dvec, B, T, H, Hkv, scale);
    else launch_bwd_dh<128>(dq, dk, dv, dout, q, k, v, lse, dvec, B, T, H, Hkv, scale);
}

void launch_attention_bwd(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out, const bf16 *q,
                          const bf16 *k, const bf16 *v, const float *lse, int B, int T, int H, int Hkv, int Dh) {
    if (B <= 0 || T <= 0) return;
    if (cudnn_attention_on()) {
        char err[768];
        check_shape(H, Hkv, Dh);
        if (cudnn_attention_bwd(dq, dk, dv, dout, out, q, k, v, lse, B, T, H, Hkv, Dh, err, sizeof err) == 0) {
            g_cudnn_ran++;
            return;
        }
        cudnn_refused(err);
    }
    launch_attention_bwd_own(dq, dk, dv, dout, out, q, k, v, lse, B, T, H, Hkv, Dh);
}

/* The self-check's tolerance on max |cudnn - own| / max |own| per tensor;
 * see cuda_attention_select. */
#define ATT_CHECK_TOL 3.2e-2

/* ---- the self-check and the choice ---- */

/* max |a - b| / max |b| over n values (inf when a has a NaN or b is all 0). */
static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d == d)) return INFINITY;
        if (d > num) num = d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : INFINITY;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.f;
}

static void to_device_bf16(bf16 *d, const float *h, size_t n) {
    uint16_t *t = (uint16_t *)malloc(n * 2);
    for (size_t i = 0; i < n; i++) t[i] = cuda_f32_to_bf16(h[i]);
    CUDA_CHECK(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice));
    free(t);
}
static void from_device_bf16(float *h, const bf16 *d, size_t n) {
    uint16_t *t = (uint16_t *)malloc(n * 2);
    CUDA_CHECK(cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) h[i] = cuda_bf16_to_f32(t[i]);
    free(t);
}

/* One random case on both paths: the largest relative error over out,
 * lse, dq, dk and dv into *worst (and its name), -1 with err when cuDNN
 * refused to run it. */
static int self_check_case(int B, int T, int H, int Hkv, int Dh, double *worst, const char **what, char *err,
                           size_t errlen) {
    size_t nq = (size_t)B * T * H * Dh, nk = (size_t)B * T * Hkv * Dh, nl = (size_t)B * H * T;
    size_t nbuf[5] = { nq, nl, nq, nk, nk };
    const char *names[5] = { "out", "lse", "dq", "dk", "dv" };
    float *hq = (float *)malloc(nq * 4), *hk = (float *)malloc(nk * 4), *hv = (float *)malloc(nk * 4),
          *hdo = (float *)malloc(nq * 4);
    for (size_t i = 0; i < nq; i++) { hq[i] = 2.f * urand(); hdo[i] = urand(); }
    for (size_t i = 0; i < nk; i++) { hk[i] = 2.f * urand(); hv[i] = urand(); }
    bf16 *q, *k, *v, *dout, *o[2], *dq[2], *dk[2], *dv[2];
    float *lse[2];
    CUDA_CHECK(cudaMalloc(&q, nq * 2)); CUDA_CHECK(cudaMalloc(&k, nk * 2)); CUDA_CHECK(cudaMalloc(&v, nk * 2));
    CUDA_CHECK(cudaMalloc(&dout, nq * 2));
    for (int s = 0; s < 2; s++) {
        CUDA_CHECK(cudaMalloc(&o[s], nq * 2)); CUDA_CHECK(cudaMalloc(&dq[s], nq * 2));
        CUDA_CHECK(cudaMalloc(&dk[s], nk * 2)); CUDA_CHECK(cudaMalloc(&dv[s], nk * 2));
        CUDA_CHECK(cudaMalloc(&lse[s], nl * 4));
    }
    to_device_bf16(q, hq, nq); to_device_bf16(k, hk, nk); to_device_bf16(v, hv, nk); to_device_bf16(dout, hdo, nq);
    launch_attention_fwd_own(o[0], lse[0], q, k, v, B, T, H, Hkv, Dh);
    launch_attention_bwd_own(dq[0], dk[0], dv[0], dout, o[0], q, k, v, lse[0], B, T, H, Hkv, Dh);
    int rc = cudnn_attention_fwd(o[1], lse[1], q, k, v, B, T, H, Hkv, Dh, err, errlen);
    if (rc == 0) rc = cudnn_attention_bwd(dq[1], dk[1], dv[1], dout, o[1], q, k, v, lse[1], B, T, H, Hkv, Dh, err, errlen);
    CUDA_CHECK(cudaStreamSynchronize(cuda_compute_stream()));
    if (rc == 0) {
        float *a = (float *)malloc(nq * 4), *b = (float *)malloc(nq * 4);
        for (int t = 0; t < 5; t++) {
            if (t == 1) {
                CUDA_CHECK(cudaMemcpy(a, lse[1], nl * 4, cudaMemcpyDeviceToHost));
                CUDA_CHECK(cudaMemcpy(b, lse[0], nl * 4, cudaMemcpyDeviceToHost));
            } else {
                bf16 *const *bufs = t == 0 ? o : t == 2 ? dq : t == 3 ? dk : dv;
                from_device_bf16(a, bufs[1], nbuf[t]);
                from_device_bf16(b, bufs[0], nbuf[t]);
            }
            double e = rel_err(a, b, nbuf[t]);
            if (!(e <= *worst)) { *worst = e; *what = names[t]; }
        }
        free(a); free(b);
    }
    cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(dout);
    for (int s = 0; s < 2; s++) { cudaFree(o[s]); cudaFree(dq[s]); cudaFree(dk[s]); cudaFree(dv[s]); cudaFree(lse[s]); }
    free(hq); free(hk); free(hv); free(hdo);
    return rc;
}


/* --attention auto|cudnn|own (tc and simt pick one of our kernels; own is
 * tc). auto and cudnn load cuDNN and run the self-check: a causal GQA case
 * (B 1, T 80 (a partial tile on both paths), H 4, Hkv 2) at Dh 64 and 128,
 * random bf16 inputs in [-2, 2) (q, k) and [-1, 1) (v, dout), each of out,
 * lse, dq, dk, dv compared as max |cudnn - own| / max |own|.
 *
 * The tolerance, ATT_CHECK_TOL = 3.2e-2 = 16 u with u = 2^-9 the unit
 * roundoff of bf16: both paths read the same bf16 inputs and accumulate in
 * fp32, so they differ by their roundings to bf16: the output once each
 * (u), the probabilities before the P V and P^T dO products (u per term,
 * at most u max|out| in the sum), dS before dS^T Q and dS K (the same),
 * and in the backward the (dP - D) difference cancels, which scales the
 * rounding of P and dS by up to a few times the ratio of max|dP| to
 * max|dS|; 16 u bounds that with room. A wrong mask, scale, head mapping
 * or stats convention gives errors of order 1 (0.1 or more) and fails.
 * lse is fp32 on both sides (agreement ~1e-6).
 *
 * msg gets one line saying what was chosen and why. Returns 0, or -1 when
 * cudnn was asked for and cannot be used (msg says why); unknown names
 * -1 too. */
extern "C" int cuda_attention_select(const char *mode, char *msg, size_t msglen) {
    g_cudnn_on = false;
    if (strcmp(mode, "own") == 0 || strcmp(mode, "tc") == 0 || strcmp(mode, "simt") == 0) {
        cuda_attention_use(strcmp(mode, "simt") == 0 ? "simt" : "tc");
        snprintf(msg, msglen, "attention: --attention %s -> own (%s kernels)", mode,
                 strcmp(mode, "simt") == 0 ? "SIMT" : "tensor-core");
        return 0;
    }
    bool must = strcmp(mode, "cudnn") == 0;
    if (!must && strcmp(mode, "auto") != 0) {
        snprintf(msg, msglen, "--attention %s: unknown; use auto, cudnn or own", mode);
        return -1;
    }
    cuda_attention_use("tc");
    char why[1024];
    if (cudnn_attention_open(why, sizeof why)) {
        snprintf(msg, msglen, "attention: %s -> %s", why, must ? "--attention cudnn cannot run (use auto or own)" : "own");
        return must ? -1 : 0;
    }
    size_t ver = cudnn_attention_version();
    double worst = 0;
    const char *what = "out";
    int dhs[2] = { 64, 128 };
    for (int i = 0; i < 2; i++) {
        if (self_check_case(1, 80, 4, 2, dhs[i], &worst, &what, why, sizeof why)) {
            snprintf(msg, msglen, "attention: cuDNN %zu.%zu.%zu: self-check could not run: %s -> %s",
                     ver / 10000, ver / 100 % 100, ver % 100, why,
                     must ? "--attention cudnn cannot run (use auto or own)" : "own");
            return must ? -1 : 0;
        }
    }
    bool ok = worst <= ATT_CHECK_TOL;
    snprintf(msg, msglen, "attention: cuDNN %zu.%zu.%zu: self-check max rel err %.2e (%s; tolerance %.1e) -> %s",
             ver / 10000, ver / 100 % 100, ver % 100, worst, what, ATT_CHECK_TOL,
             ok ? "cudnn" : must ? "--attention cudnn refused (use auto or own)" : "own");
    if (!ok) return must ? -1 : 0;
    g_cudnn_on = true;
    return 0;
}
