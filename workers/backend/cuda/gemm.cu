/* gemm.cu: the matmuls of the model through cuBLASLt, bf16 inputs with fp32
 * accumulation, for weights stored (out, in) row-major as in PyTorch.
 *
 * cuBLASLt is column-major; a row-major (R, C) matrix is a column-major
 * (C, R) one, so with W (O, I), x (N, I), dout (N, O), all row-major:
 *   forward   y^T  (O, N) = W_cm^T (O, I) . x^T (I, N)      transa = T
 *   dx        dx^T (I, N) = W_cm   (I, O) . dout^T (O, N)   no transposes
 *   dw        dw^T (I, O) = x^T    (I, N) . dout (N, O)     transb = T
 * dw is fp32 (the gradient buffer) and accumulates (beta = 1); cuBLASLt
 * takes bf16 A/B with an fp32 C/D directly. Plans (descriptors and the
 * heuristic's algorithm) come from the backend's one cache (cublaslt.cu),
 * per (m, n, k, transposes, types, beta, alignment).
 * With --precision fp8, gemm_fp8.cu takes the matmuls it can.
 * The residual add after the output and down projections is fused as
 * cuBLASLt's C operand with beta = 1 (gemm_fwd_res: D = x W^T + C, C the
 * residual, D the block's next residual); the model's matmuls have no bias,
 * and RoPE and SwiGLU are not epilogues cuBLASLt offers (rope.cu and
 * swiglu.cu fuse them with the packed projections' split instead). */
#define BALLAST_CUDA_WITH_CUBLAS
#include "workers/backend/cuda/common.cuh"

/* The plan for column-major D (m, n) = op(A) (m, k) . op(B) (k, n) + beta C,
 * A and B bf16, C = D of ctype, every pointer aligned to align bytes. */
static const lt_plan_t *gemm_plan(int m, int n, int k, cublasOperation_t ta, cublasOperation_t tb,
                                  cudaDataType_t ctype, bool beta1, uint32_t align) {
    lt_shape_t sh = { m, n, k, ta, tb, CUDA_R_16BF, CUDA_R_16BF, ctype, beta1, align, align };
    cublasStatus_t why;
    const lt_plan_t *p = lt_plan(&sh, &why, NULL);
    if (!p) {
        fprintf(stderr, "%s:%d: cuBLASLt has no algorithm for bf16 GEMM m=%d n=%d k=%d (%s output): %s; hint: sizes "
                "that are multiples of 8 are the supported common case\n", __FILE__, __LINE__, m, n, k,
                ctype == CUDA_R_32F ? "fp32" : "bf16", cublas_status_name(why));
        exit(1);
    }
    return p;
}

/* Largest power of two <= 256 dividing every address. */
static uint32_t align_of(const void *a, const void *b, const void *c) {
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | 256;
    return (uint32_t)(x & (~x + 1));
}

/* ---- the table's matmuls (table.cu) ---- */

void gemm_fwd(bf16 *out, const bf16 *x, const bf16 *w, int N, int I, int O) {
    if (N <= 0 || I <= 0 || O <= 0) return;
    if (fp8_gemm_fwd(out, x, w, N, I, O)) return;
    const lt_plan_t *p = gemm_plan(O, N, I, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, false, align_of(w, x, out));
    lt_matmul(p, w, x, out, 0.f);
}

void gemm_bwd(bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const bf16 *w, int N, int I, int O, bool dx_acc) {
    if (N <= 0 || I <= 0 || O <= 0) return;
    if (fp8_gemm_bwd(dx, dw, dout, x, w, N, I, O, dx_acc)) return;
    if (dx) {
        const lt_plan_t *p = gemm_plan(I, N, O, CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, dx_acc, align_of(w, dout, dx));
        lt_matmul(p, w, dout, dx, dx_acc ? 1.f : 0.f);
    }
    if (dw) {
        const lt_plan_t *p = gemm_plan(I, O, N, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_32F, true, align_of(x, dout, dw));
        lt_matmul(p, x, dout, dw, 1.f);
    }
}

bool gemm_fwd_res(bf16 *out, const bf16 *res, const bf16 *x, const bf16 *w, int N, int I, int O) {
    if (cuda_precision() != CUDA_PRECISION_BF16) return false;
    if (N <= 0 || O <= 0) return true;
    if (I <= 0) {
        if (out != res) CUDA_CHECK(cudaMemcpyAsync(out, res, (size_t)N * O * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                                   cuda_compute_stream()));
        return true;
    }
    /* beta = 1 plans are separate cache entries from the plain forward's */
    uint32_t a = align_of(w, x, out) < align_of(res, res, res) ? align_of(w, x, out) : align_of(res, res, res);
    const lt_plan_t *p = gemm_plan(O, N, I, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, true, a);
    lt_matmul_c(p, w, x, res, out);
    return true;
}
