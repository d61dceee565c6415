/* gemm_fp8.cu: the model's matmuls in FP8 on Hopper (--precision fp8),
 * per-tensor delayed scaling as in Transformer Engine.
 *
 * Every matmul of the table is identified by its weight pointer; each has
 * three scaling states (fp8_meta_t): its weight, its input x and its output
 * gradient dout. Before a GEMM each operand is quantized from its bf16
 * storage with the state's current scale (fp8 = saturate(v * scale)); the
 * quantizing kernel also records the operand's amax, which then enters the
 * state's amax history (FP8_HISTORY entries, a ring). The next scale is
 * FP8_MAX / max(history): delayed scaling, one use late, with no host
 * synchronization (scales live on the device and cuBLASLt reads the
 * dequantization factors through pointers). The first use of a state
 * measures its operand first (just-in-time), so there is no first step
 * with an arbitrary scale. Weights and inputs use E4M3 (max 448), output
 * gradients E5M2 (max 57344, wider range for gradients).
 *
 * cuBLASLt FP8 GEMMs take A transposed and B not ("TN": the reduction
 * dimension contiguous in both), so with W (O, I), x (N, I), dout (N, O)
 * row-major:
 *   forward  y  (N, O) : A = W    (O, I),  B = x      (N, I)   k = I
 *   dx       dx (N, I) : A = W^T  (I, O),  B = dout   (N, O)   k = O
 *   dw       dw (O, I) : A = x^T  (I, N),  B = dout^T (O, N)   k = N
 * The transposes are written by the quantizing kernel itself (one read of
 * the bf16 operand, both layouts out). y and dx are written in bf16 (dx
 * accumulates when asked), dw in fp32 accumulating into the gradient
 * buffer (beta = 1), exactly as the bf16 path does. The bf16 working
 * parameters and fp32 master weights are unchanged: FP8 copies are
 * transient, made per GEMM.
 *
 * States are keyed by (scope, weight address): the scope is the block
 * index the sharded trainer sets (the table's op_scope) before each block,
 * since it gathers every block into one of two reused buffers; a model
 * whose parameters stay put runs in scope -1. cuda_fp8_reset() forgets
 * them all.
 *
 * A GEMM whose N, I or O is not a multiple of 16, or whose output is not
 * 16-byte aligned, runs in bf16 instead (cuda_fp8_counts() tells how many
 * did). */
#define BALLAST_CUDA_WITH_CUBLAS
#include "workers/backend/cuda/common.cuh"

#include <cuda_fp8.h>

#define FP8_HISTORY CUDA_FP8_HISTORY
#define FP8_E4M3_MAX 448.0f
#define FP8_E5M2_MAX 57344.0f
#define FP8_MAX_WEIGHTS 4096    /* matmuls (distinct weights) tracked */

typedef struct {
    float amax_cur;             /* amax of the operand being quantized now (atomicMax as int bits) */
    float scale;                /* quantize: fp8 = v * scale; 0 until the first use */
    float used_inv;             /* 1 / the scale the last quantization used: cuBLASLt's dequant factor */
    int pos;                    /* next slot of hist */
    float hist[FP8_HISTORY];    /* amax of the last uses, finite values only */
} fp8_meta_t;

enum { ROLE_W = 0, ROLE_X = 1, ROLE_G = 2, NROLES };

static cuda_precision_t g_prec = CUDA_PRECISION_BF16;
static fp8_meta_t *g_meta;               /* device (FP8_MAX_WEIGHTS, NROLES) */
static const void *g_keys[FP8_MAX_WEIGHTS];
static int g_key_scope[FP8_MAX_WEIGHTS];
static int g_scope = -1;                 /* the table's op_scope */
static bool g_fresh[FP8_MAX_WEIGHTS][NROLES];
static int g_nkeys;
static uint8_t *g_buf[4];                /* fp8 operand scratch: A, B of the current GEMM, and two more for bwd */
static size_t g_buf_bytes[4];
static long g_count_fp8, g_count_bf16;

/* ---- kernels ---- */

/* Quantize x (R, C) bf16 row-major with m->scale into q (R, C) and/or
 * qt (C, R) (either may be NULL), and fold max |x| into m->amax_cur
 * (non-finite values count as +inf). Block (32, 8) covers a 32 x 32 tile. */
template <bool E4M3>
__global__ void quant_kernel(uint8_t *q, uint8_t *qt, const bf16 *x, int R, int C, fp8_meta_t *m) {
    __shared__ float tile[32][33];
    __shared__ float wmax[8];
    const __nv_fp8_interpretation_t kind = E4M3 ? __NV_E4M3 : __NV_E5M2;
    float scale = m->scale;
    int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    float mx = 0.f;
    for (int i = threadIdx.y; i < 32; i += 8) {
        int r = r0 + i, c = c0 + threadIdx.x;
        float v = 0.f;
        if (r < R && c < C) {
            v = __bfloat162float(x[(size_t)r * C + c]);
            mx = isfinite(v) ? fmaxf(mx, fabsf(v)) : INFINITY;
            if (q) q[(size_t)r * C + c] = __nv_cvt_float_to_fp8(v * scale, __NV_SATFINITE, kind);
        }
        tile[i][threadIdx.x] = v;
    }
    __syncthreads();
    if (qt)
        for (int i = threadIdx.y; i < 32; i += 8) {
            int c = c0 + i, r = r0 + threadIdx.x; /* qt row c, column r */
            if (c < C && r < R) qt[(size_t)c * R + r] = __nv_cvt_float_to_fp8(tile[threadIdx.x][i] * scale, __NV_SATFINITE, kind);
        }
    mx = warp_max(mx);
    if (threadIdx.x == 0) wmax[threadIdx.y] = mx;
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        for (int w = 1; w < 8; w++) mx = fmaxf(mx, wmax[w]);
        /* non-negative floats order like their bit patterns */
        atomicMax((int *)&m->amax_cur, __float_as_int(mx));
        if (blockIdx.x == 0 && blockIdx.y == 0) m->used_inv = scale > 0.f ? 1.f / scale : 1.f;
    }
}

/* The operand's amax joins the history; the next scale is fmax / max(history). */
__global__ void update_kernel(fp8_meta_t *m, float fmax) {
    float a = m->amax_cur;
    m->amax_cur = 0.f;
    m->hist[m->pos] = isfinite(a) ? a : 0.f;
    m->pos = (m->pos + 1) % FP8_HISTORY;
    float mx = 0.f;
    for (int i = 0; i < FP8_HISTORY; i++) mx = fmaxf(mx, m->hist[i]);
    if (mx > 0.f) m->scale = fmax / mx;
    else if (!(m->scale > 0.f)) m->scale = 1.f;
}

/* ---- state ---- */

/* Index of the scaling states of the matmul with weight w (new ones start
 * fresh); -1 when FP8_MAX_WEIGHTS weights are tracked already. */
static int meta_index(const void *w) {
    for (int i = 0; i < g_nkeys; i++)
        if (g_keys[i] == w && g_key_scope[i] == g_scope) return i;
    if (g_nkeys == FP8_MAX_WEIGHTS) return -1;
    g_keys[g_nkeys] = w;
    g_key_scope[g_nkeys] = g_scope;
    for (int r = 0; r < NROLES; r++) g_fresh[g_nkeys][r] = true;
    return g_nkeys++;
}

static uint8_t *buf(int slot, size_t bytes) {
    if (g_buf_bytes[slot] < bytes) {
        if (g_buf[slot]) CUDA_CHECK(cudaFree(g_buf[slot]));
        g_buf[slot] = NULL;
        CUDA_CHECK(cudaMalloc((void **)&g_buf[slot], bytes));
        g_buf_bytes[slot] = bytes;
    }
    return g_buf[slot];
}

/* Quantize x (R, C) into q and/or qt with state (wi, role). */
static void quantize(uint8_t *q, uint8_t *qt, const bf16 *x, int R, int C, int wi, int role) {
    fp8_meta_t *m = &g_meta[(size_t)wi * NROLES + role];
    bool e4m3 = role != ROLE_G;
    float fmax = e4m3 ? FP8_E4M3_MAX : FP8_E5M2_MAX;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)((R + 31) / 32)), block(32, 8);
    cudaStream_t s = cuda_compute_stream();
    if (g_fresh[wi][role]) { /* first use: measure, then scale from that */
        if (e4m3) quant_kernel<true><<<grid, block, 0, s>>>(NULL, NULL, x, R, C, m);
        else quant_kernel<false><<<grid, block, 0, s>>>(NULL, NULL, x, R, C, m);
        CUDA_LAUNCH_CHECK("fp8 amax");
        update_kernel<<<1, 1, 0, s>>>(m, fmax);
        CUDA_LAUNCH_CHECK("fp8 scale update");
        g_fresh[wi][role] = false;
    }
    if (e4m3) quant_kernel<true><<<grid, block, 0, s>>>(q, qt, x, R, C, m);
    else quant_kernel<false><<<grid, block, 0, s>>>(q, qt, x, R, C, m);
    CUDA_LAUNCH_CHECK("fp8 quantize");
    update_kernel<<<1, 1, 0, s>>>(m, fmax);
    CUDA_LAUNCH_CHECK("fp8 scale update");
}

/* ---- cuBLASLt (cublaslt.cu) ---- */

/* Column-major D (m, n) = A^T B + beta D, A stored (k, m) E4M3, B (k, n) of
 * bt. NULL (and one warning per shape) when cuBLASLt offers no algorithm. */
static const lt_plan_t *plan(int m, int n, int k, cudaDataType_t bt, cudaDataType_t dt, bool beta1) {
    /* outputs are checked for 16 bytes; the fp8 scratch is 256 */
    lt_shape_t sh = { m, n, k, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_8F_E4M3, bt, dt, beta1, 256, 16 };
    cublasStatus_t why;
    bool first;
    const lt_plan_t *p = lt_plan(&sh, &why, &first);
    if (!p && first)
        fprintf(stderr, "%s:%d: warning: cuBLASLt has no FP8 algorithm for m=%d n=%d k=%d (B %s, D %s): %s; "
                "this GEMM runs in bf16\n", __FILE__, __LINE__, m, n, k, bt == CUDA_R_8F_E5M2 ? "e5m2" : "e4m3",
                dt == CUDA_R_32F ? "fp32" : "bf16", cublas_status_name(why));
    return p;
}

static void run(const lt_plan_t *p, const uint8_t *A, const float *a_inv, const uint8_t *B, const float *b_inv,
                void *D, float beta) {
    lt_set_scales(p, a_inv, b_inv);
    lt_matmul(p, A, B, D, beta);
}

static bool shape_ok(int N, int I, int O, const void *out) {
    bool ok = N % 16 == 0 && I % 16 == 0 && O % 16 == 0 && ((uintptr_t)out & 15) == 0 &&
              (N + 31) / 32 <= 65535 && (O + 31) / 32 <= 65535 && (I + 31) / 32 <= 65535;
    if (!ok) g_count_bf16++;
    return ok;
}

static const float *inv(int wi, int role) { return &g_meta[(size_t)wi * NROLES + role].used_inv; }

/* ---- backend internals (gemm.cu) ---- */

bool fp8_gemm_fwd(bf16 *out, const bf16 *x, const bf16 *w, int N, int I, int O) {
    if (g_prec != CUDA_PRECISION_FP8 || N <= 0 || !shape_ok(N, I, O, out)) return false;
    const lt_plan_t *p = plan(O, N, I, CUDA_R_8F_E4M3, CUDA_R_16BF, false);
    int wi = p ? meta_index(w) : -1;
    if (wi < 0) { g_count_bf16++; return false; }
    uint8_t *w8 = buf(0, (size_t)O * I), *x8 = buf(1, (size_t)N * I);
    quantize(w8, NULL, w, O, I, wi, ROLE_W);
    quantize(x8, NULL, x, N, I, wi, ROLE_X);
    run(p, w8, inv(wi, ROLE_W), x8, inv(wi, ROLE_X), out, 0.f);
    g_count_fp8++;
    return true;
}

bool fp8_gemm_bwd(bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const bf16 *w, int N, int I, int O, bool dx_acc) {
    if (g_prec != CUDA_PRECISION_FP8 || N <= 0 || !shape_ok(N, I, O, dx ? (const void *)dx : (const void *)dw)) return false;
    if (dx && dw && ((uintptr_t)dw & 15)) { g_count_bf16++; return false; }
    const lt_plan_t *pdx = dx ? plan(I, N, O, CUDA_R_8F_E5M2, CUDA_R_16BF, dx_acc) : NULL;
    const lt_plan_t *pdw = dw ? plan(I, O, N, CUDA_R_8F_E5M2, CUDA_R_32F, true) : NULL;
    int wi = (!dx || pdx) && (!dw || pdw) ? meta_index(w) : -1;
    if (wi < 0) { g_count_bf16++; return false; }
    uint8_t *g8 = dx ? buf(0, (size_t)N * O) : NULL, *g8t = dw ? buf(1, (size_t)N * O) : NULL;
    quantize(g8, g8t, dout, N, O, wi, ROLE_G);
    if (dx) {
        uint8_t *wt8 = buf(2, (size_t)O * I);
        quantize(NULL, wt8, w, O, I, wi, ROLE_W);
        run(pdx, wt8, inv(wi, ROLE_W), g8, inv(wi, ROLE_G), dx,
            dx_acc ? 1.f : 0.f);
        g_count_fp8++;
    }
    if (dw) {
        uint8_t *xt8 = buf(3, (size_t)N * I);
        quantize(NULL, xt8, x, N, I, wi, ROLE_X);
        run(pdw, xt8, inv(wi, ROLE_X), g8t, inv(wi, ROLE_G), dw, 1.f);
        g_count_fp8++;
    }
    return true;
}

/* ---- public (backend_cuda.h) ---- */

extern "C" int cuda_set_precision(cuda_precision_t p, char *err, size_t errlen) {
    if (p == CUDA_PRECISION_BF16) {
        g_prec = p;
        return 0;
    }
    if (p != CUDA_PRECISION_FP8) {
        snprintf(err, errlen, "unknown precision %d (bf16 or fp8)", (int)p);
        return -1;
    }
    int dev = 0;
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "--precision fp8: cannot query the GPU (%s); start the CUDA backend first",
                 cudaGetErrorString(e));
        return -1;
    }
    if (prop.major * 10 + prop.minor < 89) {
        snprintf(err, errlen, "--precision fp8 needs FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, "
                 "Blackwell); GPU %d (%s) has %d.%d: use --precision bf16", dev, prop.name, prop.major, prop.minor);
        return -1;
    }
    if (!g_meta) {
        lt_init();
        CUDA_CHECK(cudaMalloc((void **)&g_meta, sizeof(fp8_meta_t) * FP8_MAX_WEIGHTS * NROLES));
        CUDA_CHECK(cudaMemset(g_meta, 0, sizeof(fp8_meta_t) * FP8_MAX_WEIGHTS * NROLES));
    }
    g_prec = p;
    return 0;
}

extern "C" cuda_precision_t cuda_precision(void) { return g_prec; }

void cuda_op_scope(int s) { g_scope = s; }

extern "C" void cuda_fp8_reset(void) {
    g_nkeys = 0;
    g_scope = -1;
    if (g_meta)
        CUDA_CHECK(cudaMemsetAsync(g_meta, 0, sizeof(fp8_meta_t) * FP8_MAX_WEIGHTS * NROLES, cuda_compute_stream()));
}

extern "C" void cuda_fp8_counts(long *fp8, long *bf16_fallback) {
    *fp8 = g_count_fp8;
    *bf16_fallback = g_count_bf16;
}

extern "C" int cuda_fp8_state(const void *w, int role, float *scale, float *hist_max) {
    int wi = -1;
    for (int i = 0; i < g_nkeys; i++)
        if (g_keys[i] == w && g_key_scope[i] == g_scope) wi = i;
    if (wi < 0 || role < 0 || role >= NROLES) return -1;
    fp8_meta_t m;
    CUDA_CHECK(cudaStreamSynchronize(cuda_compute_stream()));
    CUDA_CHECK(cudaMemcpy(&m, &g_meta[(size_t)wi * NROLES + role], sizeof m, cudaMemcpyDeviceToHost));
    float mx = 0.f;
    for (int i = 0; i < FP8_HISTORY; i++) mx = fmaxf(mx, m.hist[i]);
    *scale = m.scale;
    *hist_max = mx;
    return 0;
}
