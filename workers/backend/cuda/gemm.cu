/* gemm.cu: the matmuls of the model through cuBLASLt, bf16 inputs with fp32
 * accumulation, for weights stored (out, in) row-major as in PyTorch.
 *
 * cuBLASLt is column-major; a row-major (R, C) matrix is a column-major
 * (C, R) one, so with W (O, I), x (N, I), dout (N, O), all row-major:
 *   forward   y^T  (O, N) = W_cm^T (O, I) . x^T (I, N)      transa = T
 *   dx        dx^T (I, N) = W_cm   (I, O) . dout^T (O, N)   no transposes
 *   dw        dw^T (I, O) = x^T    (I, N) . dout (N, O)     transb = T
 * dw is fp32 (the gradient buffer) and accumulates (beta = 1); cuBLASLt
 * takes bf16 A/B with an fp32 C/D directly. Descriptors and the heuristic's
 * algorithm are cached per (m, n, k, transposes, output type, beta): the
 * model has a few dozen distinct shapes and asks for them every step.
 * With --precision fp8, gemm_fp8.cu takes the matmuls it can.
 * No epilogue is fused: the model's matmuls have no bias and the activations
 * that follow (RoPE on part of the output, SwiGLU over two outputs, the
 * residual add) are not epilogues cuBLASLt offers. */
#define BALLAST_CUDA_WITH_CUBLAS
#include "workers/backend/cuda/common.cuh"

#define GEMM_WORKSPACE (32u << 20) /* bytes; NVIDIA's advice for Hopper */
#define GEMM_CACHE 128

typedef struct {
    int m, n, k;
    cublasOperation_t ta, tb;
    cudaDataType_t ctype;
    bool beta1;
    uint32_t align;            /* bytes all of A, B, C are aligned to (<= 256) */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} gemm_plan_t;

static cublasLtHandle_t g_lt;
static void *g_workspace;
static gemm_plan_t g_plans[GEMM_CACHE];
static int g_nplans;

void gemm_init(void) {
    if (g_lt) return;
    CUBLAS_CHECK(cublasLtCreate(&g_lt));
    CUDA_CHECK(cudaMalloc(&g_workspace, GEMM_WORKSPACE));
}

/* The plan for column-major D (m, n) = op(A) (m, k) . op(B) (k, n) + beta C,
 * A and B bf16, C = D of ctype, leading dimensions the packed ones. */
static const gemm_plan_t *gemm_plan(int m, int n, int k, cublasOperation_t ta, cublasOperation_t tb,
                                    cudaDataType_t ctype, bool beta1, uint32_t align) {
    for (int i = 0; i < g_nplans; i++) {
        const gemm_plan_t *p = &g_plans[i];
        if (p->m == m && p->n == n && p->k == k && p->ta == ta && p->tb == tb && p->ctype == ctype &&
            p->beta1 == beta1 && p->align == align)
            return p;
    }
    if (g_nplans == GEMM_CACHE) {
        fprintf(stderr, "%s:%d: more than %d GEMM shapes; raise GEMM_CACHE\n", __FILE__, __LINE__, GEMM_CACHE);
        exit(1);
    }
    gemm_plan_t *p = &g_plans[g_nplans];
    p->m = m; p->n = n; p->k = k; p->ta = ta; p->tb = tb; p->ctype = ctype; p->beta1 = beta1; p->align = align;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    /* stored shapes: A is (m, k) or its transpose, B (k, n) or its transpose */
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, ar, ac, ar));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, br, bc, br));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, ctype, m, n, m));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = GEMM_WORKSPACE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* the heuristic assumes 256-byte aligned pointers unless told otherwise;
     * tensors inside the flat parameter buffer can be less aligned */
    const cublasLtMatmulPreferenceAttributes_t al[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES };
    for (int i = 0; i < 4; i++) CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al[i], &align, sizeof align));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0) {
        fprintf(stderr, "%s:%d: cuBLASLt has no algorithm for bf16 GEMM m=%d n=%d k=%d (%s output); hint: sizes that are multiples of 8 are the supported common case\n",
                __FILE__, __LINE__, m, n, k, ctype == CUDA_R_32F ? "fp32" : "bf16");
        exit(1);
    }
    p->algo = res.algo;
    g_nplans++;
    return p;
}

static void gemm_run(const gemm_plan_t *p, const void *A, const void *B, void *C, float beta) {
    float alpha = 1.f;
    CUBLAS_CHECK(cublasLtMatmul(g_lt, p->desc, &alpha, A, p->a, B, p->b, &beta, C, p->c, C, p->c, &p->algo,
                                g_workspace, GEMM_WORKSPACE, cuda_compute_stream()));
}

/* Largest power of two <= 256 dividing every address. */
static uint32_t align_of(const void *a, const void *b, const void *c) {
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | 256;
    return (uint32_t)(x & (~x + 1));
}

/* ---- public (backend_cuda.cu) ---- */

void gemm_fwd(bf16 *out, const bf16 *x, const bf16 *w, int N, int I, int O) {
    if (N <= 0 || I <= 0 || O <= 0) return;
    if (fp8_gemm_fwd(out, x, w, N, I, O)) return;
    const gemm_plan_t *p = gemm_plan(O, N, I, CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF, false, align_of(w, x, out));
    gemm_run(p, w, x, out, 0.f);
}

void gemm_bwd(bf16 *dx, float *dw, const bf16 *dout, const bf16 *x, const bf16 *w, int N, int I, int O, bool dx_acc) {
    if (N <= 0 || I <= 0 || O <= 0) return;
    if (fp8_gemm_bwd(dx, dw, dout, x, w, N, I, O, dx_acc)) return;
    if (dx) {
        const gemm_plan_t *p = gemm_plan(I, N, O, CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF, dx_acc, align_of(w, dout, dx));
        gemm_run(p, w, dout, dx, dx_acc ? 1.f : 0.f);
    }
    if (dw) {
        const gemm_plan_t *p = gemm_plan(I, O, N, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_32F, true, align_of(x, dout, dw));
        gemm_run(p, x, dout, dw, 1.f);
    }
}
