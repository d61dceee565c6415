/* embedding.cu: token embedding forward (row gather) and backward (row
 * scatter-add into the fp32 gradient of the table).
 *
 * The backward is deterministic without atomics: the host groups the row
 * indices by token (tokens are few: B*T int32, copied back once per
 * backward), then one block per distinct token adds that token's rows in
 * row order, starting from the gradient already there, which is the CPU
 * oracle's summation order exactly. */
#include "workers/backend/cuda/common.cuh"

#include <string.h>

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

/* Block u handles token seg_tok[u], whose rows are order[seg[u] .. seg[u+1]). */
__global__ void embedding_bwd_kernel(float *dwte, const bf16 *dout, const int32_t *order, const int32_t *seg,
                                     const int32_t *seg_tok, int D) {
    int u = blockIdx.x, s0 = seg[u], s1 = seg[u + 1];
    float *row = dwte + (size_t)seg_tok[u] * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float acc = row[j];
        for (int s = s0; s < s1; s++) acc += __bfloat162float(dout[(size_t)order[s] * D + j]);
        row[j] = acc;
    }
}

/* ---- launchers ---- */

void launch_embedding_fwd(bf16 *out, const int32_t *tok, const bf16 *wte, int N, int D) {
    if (N <= 0) return;
    embedding_fwd_kernel<<<N, 128, 0, cuda_compute_stream()>>>(out, tok, wte, D);
    CUDA_LAUNCH_CHECK("embedding_fwd_kernel");
}

typedef struct { int32_t tok, row; } tok_row_t;

static int cmp_tok_row(const void *a, const void *b) {
    const tok_row_t *x = (const tok_row_t *)a, *y = (const tok_row_t *)b;
    if (x->tok != y->tok) return x->tok < y->tok ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

void launch_embedding_bwd(float *dwte, const bf16 *dout, const int32_t *tok, int N, int D) {
    if (N <= 0) return;
    cudaStream_t st = cuda_compute_stream();
    tok_row_t *tr = (tok_row_t *)malloc((size_t)N * sizeof *tr);
    int32_t *host = (int32_t *)malloc((size_t)(3 * N + 1) * sizeof(int32_t));
    if (!tr || !host) { fprintf(stderr, "%s:%d: out of host memory in embedding backward\n", __FILE__, __LINE__); exit(1); }
    CUDA_CHECK(cudaMemcpyAsync(host, tok, (size_t)N * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    for (int i = 0; i < N; i++) { tr[i].tok = host[i]; tr[i].row = i; }
    qsort(tr, (size_t)N, sizeof *tr, cmp_tok_row);
    /* host layout: order (N) | seg (U+1) | seg_tok (U) */
    int32_t *order = host, *seg = host + N;
    int U = 0;
    for (int i = 0; i < N; i++) {
        order[i] = tr[i].row;
        if (i == 0 || tr[i].tok != tr[i - 1].tok) seg[U++] = i;
    }
    seg[U] = N;
    int32_t *seg_tok = seg + U + 1;
    for (int u = 0; u < U; u++) seg_tok[u] = tr[seg[u]].tok;
    size_t nints = (size_t)N + 2 * (size_t)U + 1;
    int32_t *dev = (int32_t *)cuda_scratch(SCRATCH_EMBED, nints * sizeof(int32_t));
    /* pageable source: the call returns once the data is staged, so host may be freed */
    CUDA_CHECK(cudaMemcpyAsync(dev, host, nints * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    embedding_bwd_kernel<<<U, 256, 0, st>>>(dwte, dout, dev, dev + N, dev + N + U + 1, D);
    CUDA_LAUNCH_CHECK("embedding_bwd_kernel");
    CUDA_CHECK(cudaStreamSynchronize(st)); /* keep the scratch contents alive until the kernel is done */
    free(tr);
    free(host);
}
