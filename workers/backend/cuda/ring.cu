/* ring.cu: the ring-attention ops of context parallelism on bf16 with fp32
 * arithmetic (contracts in backend.h): one (query chunk, key chunk)
 * pair's attention with its log-sum-exp rows, the exact log-sum-exp merge
 * of two partial outputs, and the pair's backward from the merged output
 * and log-sum-exp.
 *
 * Straightforward SIMT kernels, one thread per output row: the forward
 * with an online softmax over the pair's keys, dq per (query, head), dk and
 * dv per (key, kv head) looping over the query heads of its group (so the
 * sums need no atomics and run in a fixed order). Written for correctness
 * against the CPU oracle first (tests/gpu/check_ring.c); the chunk pairs
 * are the model's, a flash-attention tiling is the step after. */
#include "workers/backend/cuda/common.cuh"

#define RING_MAX_DH 256  /* head_dim the per-thread accumulators hold */
#define RING_THREADS 128

/* ---- kernels ---- */

/* out (Tq, H, Dh), lse (Tq, H) of q (Tq, H, Dh) against k, v (Tk, Hkv, Dh) */
__global__ void ring_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int Tq, int Tk,
                                int H, int Hkv, int Dh, bool causal, float sc) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= Tq * H) return;
    int t = r / H, h = r % H, kh = h / (H / Hkv), nk = causal ? t + 1 : Tk;
    const bf16 *qt = q + (size_t)r * Dh;
    float acc[RING_MAX_DH];
    for (int i = 0; i < Dh; i++) acc[i] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int u = 0; u < nk; u++) {
        const bf16 *ku = k + ((size_t)u * Hkv + kh) * Dh, *vu = v + ((size_t)u * Hkv + kh) * Dh;
        float s = 0.f;
        for (int i = 0; i < Dh; i++) s += __bfloat162float(qt[i]) * __bfloat162float(ku[i]);
        s *= sc;
        float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        for (int i = 0; i < Dh; i++) acc[i] = acc[i] * corr + p * __bfloat162float(vu[i]);
        m = mn;
    }
    bf16 *o = out + (size_t)r * Dh;
    for (int i = 0; i < Dh; i++) o[i] = __float2bfloat16(acc[i] / l);
    lse[r] = m + logf(l);
}

__global__ void ring_merge_kernel(bf16 *out, float *lse, const bf16 *out_b, const float *lse_b, int rows, int Dh) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float la = lse[r], lb = lse_b[r], m = fmaxf(la, lb);
    float wa = expf(la - m), wb = expf(lb - m), z = wa + wb;
    wa /= z, wb /= z;
    bf16 *o = out + (size_t)r * Dh;
    const bf16 *ob = out_b + (size_t)r * Dh;
    for (int i = 0; i < Dh; i++) o[i] = __float2bfloat16(__bfloat162float(o[i]) * wa + __bfloat162float(ob[i]) * wb);
    lse[r] = m + logf(z);
}

/* rowsum(dout * out) of row r (one (query, head)) */
__device__ __forceinline__ float ring_rowdot(const bf16 *dout, const bf16 *out, size_t r, int Dh) {
    float d = 0.f;
    for (int i = 0; i < Dh; i++) d += __bfloat162float(dout[r * Dh + i]) * __bfloat162float(out[r * Dh + i]);
    return d;
}

/* dq (Tq, H, Dh) += sum over keys of dS k * sc */
__global__ void ring_dq_kernel(bf16 *dq, const bf16 *dout, const bf16 *out, const float *lse, const bf16 *q,
                               const bf16 *k, const bf16 *v, int Tq, int Tk, int H, int Hkv, int Dh, bool causal,
                               float sc) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= Tq * H) return;
    int t = r / H, h = r % H, kh = h / (H / Hkv), nk = causal ? t + 1 : Tk;
    const bf16 *qt = q + (size_t)r * Dh, *gt = dout + (size_t)r * Dh;
    float dd = ring_rowdot(dout, out, (size_t)r, Dh), l = lse[r];
    float acc[RING_MAX_DH];
    for (int i = 0; i < Dh; i++) acc[i] = 0.f;
    for (int u = 0; u < nk; u++) {
        const bf16 *ku = k + ((size_t)u * Hkv + kh) * Dh, *vu = v + ((size_t)u * Hkv + kh) * Dh;
        float s = 0.f, dp = 0.f;
        for (int i = 0; i < Dh; i++) {
            s += __bfloat162float(qt[i]) * __bfloat162float(ku[i]);
            dp += __bfloat162float(gt[i]) * __bfloat162float(vu[i]);
        }
        float ds = expf(s * sc - l) * (dp - dd) * sc;
        for (int i = 0; i < Dh; i++) acc[i] += ds * __bfloat162float(ku[i]);
    }
    bf16 *d = dq + (size_t)r * Dh;
    for (int i = 0; i < Dh; i++) d[i] = __float2bfloat16(__bfloat162float(d[i]) + acc[i]);
}

/* dk, dv (Tk, Hkv, Dh) += the parts of the query heads of kv head kh */
__global__ void ring_dkv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out, const float *lse,
                                const bf16 *q, const bf16 *k, const bf16 *v, int Tq, int Tk, int H, int Hkv, int Dh,
                                bool causal, float sc) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= Tk * Hkv) return;
    int u = r / Hkv, kh = r % Hkv, rep = H / Hkv;
    const bf16 *ku = k + (size_t)r * Dh, *vu = v + (size_t)r * Dh;
    float ak[RING_MAX_DH], av[RING_MAX_DH];
    for (int i = 0; i < Dh; i++) ak[i] = av[i] = 0.f;
    for (int h = kh * rep; h < (kh + 1) * rep; h++)
        for (int t = causal ? u : 0; t < Tq; t++) {
            size_t qr = (size_t)t * H + h;
            const bf16 *qt = q + qr * Dh, *gt = dout + qr * Dh;
            float s = 0.f, dp = 0.f;
            for (int i = 0; i < Dh; i++) {
                s += __bfloat162float(qt[i]) * __bfloat162float(ku[i]);
                dp += __bfloat162float(gt[i]) * __bfloat162float(vu[i]);
            }
            float p = expf(s * sc - lse[qr]), ds = p * (dp - ring_rowdot(dout, out, qr, Dh)) * sc;
            for (int i = 0; i < Dh; i++) {
                av[i] += p * __bfloat162float(gt[i]);
                ak[i] += ds * __bfloat162float(qt[i]);
            }
        }
    bf16 *dkr = dk + (size_t)r * Dh, *dvr = dv + (size_t)r * Dh;
    for (int i = 0; i < Dh; i++) {
        dkr[i] = __float2bfloat16(__bfloat162float(dkr[i]) + ak[i]);
        dvr[i] = __float2bfloat16(__bfloat162float(dvr[i]) + av[i]);
    }
}

/* ---- launchers ---- */

static void ring_check_dh(int Dh) {
    if (Dh > RING_MAX_DH) {
        fprintf(stderr, "ring attention: head_dim %d is over the %d the CUDA ring kernels hold\n", Dh, RING_MAX_DH);
        exit(1);
    }
}

static void cu_attn_block_fwd(act_t *out, float *lse, const act_t *q, const act_t *k, const act_t *v, int Tq, int Tk,
                              int H, int Hkv, int Dh, bool causal) {
    ring_check_dh(Dh);
    int rows = Tq * H;
    ring_fwd_kernel<<<cuda_blocks((size_t)rows, RING_THREADS), RING_THREADS, 0, cuda_compute_stream()>>>(
        (bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, Tq, Tk, H, Hkv, Dh, causal,
        1.f / sqrtf((float)Dh));
    CUDA_LAUNCH_CHECK("ring_fwd_kernel");
}

static void cu_attn_merge(act_t *out, float *lse, const act_t *out_b, const float *lse_b, int Tq, int H, int Dh) {
    int rows = Tq * H;
    ring_merge_kernel<<<cuda_blocks((size_t)rows, RING_THREADS), RING_THREADS, 0, cuda_compute_stream()>>>(
        (bf16 *)out, lse, (const bf16 *)out_b, lse_b, rows, Dh);
    CUDA_LAUNCH_CHECK("ring_merge_kernel");
}

static void cu_attn_block_bwd(act_t *dq, act_t *dk, act_t *dv, const act_t *dout, const act_t *out, const float *lse,
                              const act_t *q, const act_t *k, const act_t *v, int Tq, int Tk, int H, int Hkv, int Dh,
                              bool causal) {
    ring_check_dh(Dh);
    float sc = 1.f / sqrtf((float)Dh);
    ring_dq_kernel<<<cuda_blocks((size_t)Tq * H, RING_THREADS), RING_THREADS, 0, cuda_compute_stream()>>>(
        (bf16 *)dq, (const bf16 *)dout, (const bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v,
        Tq, Tk, H, Hkv, Dh, causal, sc);
    CUDA_LAUNCH_CHECK("ring_dq_kernel");
    ring_dkv_kernel<<<cuda_blocks((size_t)Tk * Hkv, RING_THREADS), RING_THREADS, 0, cuda_compute_stream()>>>(
        (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
        (const bf16 *)v, Tq, Tk, H, Hkv, Dh, causal, sc);
    CUDA_LAUNCH_CHECK("ring_dkv_kernel");
}

/* ---- the table ---- */

void cuda_ring_fill(backend_t *t) {
    t->attn_block_fwd = cu_attn_block_fwd;
    t->attn_merge = cu_attn_merge;
    t->attn_block_bwd = cu_attn_block_bwd;
}
