/* decode.cu: attention of a few new rows over a KV cache, the decoding step
 * of `ballast generate --backend cuda` (backend.h, attention_decode).
 *
 * One block per (row, query head). The block walks the cache in chunks of
 * DEC_THREADS positions: each thread scores one position (q . k, fp32 from
 * bf16), the block keeps the running maximum and sum of the softmax (the
 * online form: earlier chunks are rescaled when the maximum grows), and
 * each thread accumulates the output dimensions it owns. Cache and output
 * are bf16, arithmetic fp32. Relies on common.cuh's block reductions. */
#include "workers/backend/cuda/common.cuh"

#define DEC_THREADS 128
#define DEC_MAX_DH 512                       /* head widths up to this */
#define DEC_DPT (DEC_MAX_DH / DEC_THREADS)   /* output dimensions per thread */

/* ---- kernel ---- */

/* out (n, H, Dh); q (n, H, Dh); kc, vc (P, Hkv, Dh); grid n * H blocks. */
__global__ void attention_decode_kernel(bf16 *out, const bf16 *q, const bf16 *kc, const bf16 *vc, int p0, int H,
                                        int Hkv, int Dh, float scale) {
    extern __shared__ float sh[];
    float *qs = sh, *ps = sh + Dh;           /* (Dh) the scaled query, (DEC_THREADS) a chunk's weights */
    int i = blockIdx.x / H, h = blockIdx.x % H, kh = h / (H / Hkv), tid = threadIdx.x;
    size_t kvd = (size_t)Hkv * Dh;
    const bf16 *kb = kc + (size_t)kh * Dh, *vb = vc + (size_t)kh * Dh;
    int len = p0 + i + 1;
    for (int d = tid; d < Dh; d += DEC_THREADS) qs[d] = __bfloat162float(q[((size_t)i * H + h) * Dh + d]) * scale;
    __syncthreads();
    float m = -INFINITY, l = 0.f, acc[DEC_DPT];
#pragma unroll
    for (int j = 0; j < DEC_DPT; j++) acc[j] = 0.f;
    for (int t0 = 0; t0 < len; t0 += DEC_THREADS) {
        int t = t0 + tid, cnt = min(DEC_THREADS, len - t0);
        float s = -INFINITY;
        if (t < len) {
            const bf16 *kt = kb + (size_t)t * kvd;
            s = 0.f;
            for (int d = 0; d < Dh; d++) s += qs[d] * __bfloat162float(kt[d]);
        }
        float mn = fmaxf(m, block_max(s));
        float p = t < len ? expf(s - mn) : 0.f;
        ps[tid] = p;
        float corr = expf(m - mn);           /* 0 on the first chunk (m = -inf) */
        l = l * corr + block_sum(p);         /* block_sum's barriers also publish ps[] */
#pragma unroll
        for (int j = 0; j < DEC_DPT; j++) {
            int d = tid + j * DEC_THREADS;
            if (d >= Dh) break;
            float a = acc[j] * corr;
            for (int u = 0; u < cnt; u++) a += ps[u] * __bfloat162float(vb[(size_t)(t0 + u) * kvd + d]);
            acc[j] = a;
        }
        m = mn;
        __syncthreads();                     /* ps[] is rewritten by the next chunk */
    }
#pragma unroll
    for (int j = 0; j < DEC_DPT; j++) {
        int d = tid + j * DEC_THREADS;
        if (d < Dh) out[((size_t)i * H + h) * Dh + d] = __float2bfloat16(acc[j] / l);
    }
}

/* ---- launcher ---- */

void launch_attention_decode(bf16 *out, const bf16 *q, const bf16 *kc, const bf16 *vc, int n, int p0, int H, int Hkv,
                             int Dh) {
    if (Dh > DEC_MAX_DH || Hkv < 1 || H % Hkv) {
        fprintf(stderr, "attention_decode: head_dim %d (at most %d) with %d query and %d kv heads is not supported\n",
                Dh, DEC_MAX_DH, H, Hkv);
        exit(1);
    }
    size_t shmem = ((size_t)Dh + DEC_THREADS) * sizeof(float);
    attention_decode_kernel<<<(unsigned)n * H, DEC_THREADS, shmem, cuda_compute_stream()>>>(
        out, q, kc, vc, p0, H, Hkv, Dh, (float)(1.0 / sqrt((double)Dh)));
    CUDA_LAUNCH_CHECK("attention_decode_kernel");
}
