/* embedding.cu: token embedding forward (row gather) and backward (row
 * scatter-add into the fp32 gradient of the table).
 *
 * The backward is deterministic without atomics and without the host: one
 * block sorts the (token, row) pairs on the device (a bitonic sort of
 * 64-bit keys token << 32 | row in scratch), then one block per sorted
 * position that starts a token's run adds that token's rows in row order,
 * starting from the gradient already there: the CPU oracle's summation
 * order exactly. Two launches, no host wait. */
#include "workers/backend/cuda/common.cuh"


/* ---- kernels ---- */

/* out (N, D) = wte[tok[i]]; one block per row, 16-byte copies when D allows */
__global__ void embedding_fwd_kernel(bf16 *out, const int32_t *tok, const bf16 *wte, int D) {
    int i = blockIdx.x;
    const bf16 *src = wte + (size_t)tok[i] * D;
    bf16 *dst = out + (size_t)i * D;
    if ((D & 7) == 0) {
        const uint4 *s4 = (const uint4 *)src;
        uint4 *d4 = (uint4 *)dst;
        for (int j = threadIdx.x; j < D / 8; j += blockDim.x) d4[j] = s4[j];
    } else {
        for (int j = threadIdx.x; j < D; j += blockDim.x) dst[j] = src[j];
    }
}

#define EMB_SORT_THREADS 256

/* keys (P, a power of two >= N) = token << 32 | row for the N rows, the
 * rest all ones, sorted ascending in place by one block */
__global__ void __launch_bounds__(EMB_SORT_THREADS) embedding_sort_kernel(unsigned long long *keys, const int32_t *tok,
                                                                           int N, int P) {
    for (int i = threadIdx.x; i < P; i += blockDim.x)
        keys[i] = i < N ? ((unsigned long long)(uint32_t)tok[i] << 32) | (unsigned)i : ~0ull;
    __syncthreads();
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += blockDim.x) {
                int l = i ^ j;
                if (l > i) {
                    unsigned long long a = keys[i], b = keys[l];
                    bool up = (i & k) == 0;
                    if ((a > b) == up) { keys[i] = b; keys[l] = a; }
                }
            }
            __syncthreads();
        }
}

/* Block s: when sorted position s starts a run of one token, add the run's
 * rows (in row order) to that token's gradient row. */
__global__ void embedding_bwd_kernel(float *dwte, const bf16 *dout, const unsigned long long *keys, int N, int D) {
    int s0 = blockIdx.x;
    unsigned tok = (unsigned)(keys[s0] >> 32);
    if (s0 > 0 && (unsigned)(keys[s0 - 1] >> 32) == tok) return;
    int s1 = s0 + 1;
    while (s1 < N && (unsigned)(keys[s1] >> 32) == tok) s1++;
    float *row = dwte + (size_t)tok * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float acc = row[j];
        for (int s = s0; s < s1; s++) acc += __bfloat162float(dout[(size_t)(unsigned)(keys[s] & 0xffffffffu) * D + j]);
        row[j] = acc;
    }
}

/* ---- launchers ---- */

void launch_embedding_fwd(bf16 *out, const int32_t *tok, const bf16 *wte, int N, int D) {
    if (N <= 0) return;
    embedding_fwd_kernel<<<N, 128, 0, cuda_compute_stream()>>>(out, tok, wte, D);
    CUDA_LAUNCH_CHECK("embedding_fwd_kernel");
}

void launch_embedding_bwd(float *dwte, const bf16 *dout, const int32_t *tok, int N, int D) {
    if (N <= 0) return;
    cudaStream_t st = cuda_compute_stream();
    int P = 1;
    while (P < N) P <<= 1;
    /* the scratch is reused only by later launches on this stream */
    unsigned long long *keys = (unsigned long long *)cuda_scratch(SCRATCH_EMBED, (size_t)P * sizeof *keys);
    embedding_sort_kernel<<<1, EMB_SORT_THREADS, 0, st>>>(keys, tok, N, P);
    CUDA_LAUNCH_CHECK("embedding_sort_kernel");
    embedding_bwd_kernel<<<(unsigned)N, 256, 0, st>>>(dwte, dout, keys, N, D);
    CUDA_LAUNCH_CHECK("embedding_bwd_kernel");
}
