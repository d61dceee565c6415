/* cublaslt.cu: the backend's one cuBLASLt handle, its workspace and one
 * plan cache for every GEMM shape (common.cuh, lt_*): bf16 (gemm.cu) and
 * FP8 (gemm_fp8.cu) matmuls alike. The model has a few dozen distinct
 * shapes and asks for each every step, so a plan (descriptor, layouts and
 * an algorithm) is made once per shape and kept, and so is the answer "no
 * algorithm" (the caller then takes another path or stops).
 *
 * The algorithm: the heuristic's top LT_CANDIDATES are each timed once, on
 * the first matmul of the shape (its real operands; an accumulating output
 * is saved before and restored after), and the fastest is kept. That first
 * matmul waits for the device once. The emulated cuBLASLt (tests/emu)
 * offers one candidate, so there the choice is the heuristic's first,
 * deterministically, and nothing is timed. */
#define BALLAST_CUDA_WITH_CUBLAS
#include "workers/backend/cuda/common.cuh"

#include <math.h>
#include <string.h>

#define LT_WORKSPACE (32u << 20) /* bytes; NVIDIA's advice for Hopper */
#define LT_CACHE 256             /* distinct shapes, bf16 and FP8 together */
#define LT_CANDIDATES 8          /* heuristic results timed per shape */
#define LT_TIMING_RUNS 3         /* timed runs per candidate (after one warm-up) */

struct lt_plan {
    lt_shape_t s;
    bool none;                   /* cuBLASLt has no algorithm for it */
    cublasStatus_t why;          /* the heuristic's status when none */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulAlgo_t cand[LT_CANDIDATES]; /* the heuristic's, best first */
    int ncand;                   /* > 1 until timed */
};

static cublasLtHandle_t g_lt;
static void *g_workspace;
static lt_plan_t g_plans[LT_CACHE];
static int g_nplans;

void lt_init(void) {
    if (g_lt) return;
    CUBLAS_CHECK(cublasLtCreate(&g_lt));
    CUDA_CHECK(cudaMalloc(&g_workspace, LT_WORKSPACE));
}

static bool same(const lt_shape_t *a, const lt_shape_t *b) {
    return a->m == b->m && a->n == b->n && a->k == b->k && a->ta == b->ta && a->tb == b->tb && a->at == b->at &&
           a->bt == b->bt && a->dt == b->dt && a->beta1 == b->beta1 && a->align_ab == b->align_ab &&
           a->align_cd == b->align_cd;
}

const lt_plan_t *lt_plan(const lt_shape_t *s, cublasStatus_t *why, bool *first) {
    if (first) *first = false;
    for (int i = 0; i < g_nplans; i++)
        if (same(&g_plans[i].s, s)) {
            *why = g_plans[i].why;
            return g_plans[i].none ? NULL : &g_plans[i];
        }
    if (g_nplans == LT_CACHE) {
        fprintf(stderr, "%s:%d: more than %d GEMM shapes; raise LT_CACHE\n", __FILE__, __LINE__, LT_CACHE);
        exit(1);
    }
    lt_init();
    if (first) *first = true;
    lt_plan_t *p = &g_plans[g_nplans];
    memset(p, 0, sizeof *p);
    p->s = *s;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &s->ta, sizeof s->ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &s->tb, sizeof s->tb));
    /* stored shapes: A is (m, k) or its transpose, B (k, n) or its transpose */
    int ar = s->ta == CUBLAS_OP_N ? s->m : s->k, ac = s->ta == CUBLAS_OP_N ? s->k : s->m;
    int br = s->tb == CUBLAS_OP_N ? s->k : s->n, bc = s->tb == CUBLAS_OP_N ? s->n : s->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, s->at, ar, ac, ar));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, s->bt, br, bc, br));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, s->dt, s->m, s->n, s->m));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = LT_WORKSPACE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* the heuristic assumes 256-byte aligned pointers unless told otherwise;
     * tensors inside the flat parameter buffer can be less aligned */
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &s->align_ab,
                                                      sizeof s->align_ab));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &s->align_ab,
                                                      sizeof s->align_ab));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &s->align_cd,
                                                      sizeof s->align_cd));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &s->align_cd,
                                                      sizeof s->align_cd));
    cublasLtMatmulHeuristicResult_t res[LT_CANDIDATES];
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->a, p->b, p->c, p->c, pref, LT_CANDIDATES, res,
                                                       &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    g_nplans++;
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
        p->none = true;
        p->why = hs != CUBLAS_STATUS_SUCCESS ? hs : CUBLAS_STATUS_NOT_SUPPORTED;
        *why = p->why;
        return NULL;
    }
    p->algo = res[0].algo;
    for (int i = 0; i < found && i < LT_CANDIDATES; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= LT_WORKSPACE) p->cand[p->ncand++] = res[i].algo;
    *why = CUBLAS_STATUS_SUCCESS;
    return p;
}

static size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 1; }

/* Time each candidate on these operands and keep the fastest in p->algo.
 * D is what the caller's matmul overwrites next; when C is D (beta = 1)
 * its contents are saved first and put back. Without memory for the copy,
 * the heuristic's first stays. */
static void lt_pick(lt_plan_t *p, const void *A, const void *B, const void *C, void *D, float beta) {
    cudaStream_t st = cuda_compute_stream();
    int n = p->ncand;
    p->ncand = 0; /* whatever happens, once */
    size_t dbytes = (size_t)p->s.m * (size_t)p->s.n * type_bytes(p->s.dt);
    void *save = NULL;
    if (beta != 0.f && C == D) {
        if (cudaMalloc(&save, dbytes) != cudaSuccess) { (void)cudaGetLastError(); return; }
        CUDA_CHECK(cudaMemcpyAsync(save, D, dbytes, cudaMemcpyDeviceToDevice, st));
    }
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float alpha = 1.f, best = INFINITY;
    int besti = 0;
    for (int i = 0; i < n; i++) {
        cublasStatus_t rc = CUBLAS_STATUS_SUCCESS;
        for (int r = 0; r <= LT_TIMING_RUNS && rc == CUBLAS_STATUS_SUCCESS; r++) {
            if (r == 1) CUDA_CHECK(cudaEventRecord(e0, st));
            rc = cublasLtMatmul(g_lt, p->desc, &alpha, A, p->a, B, p->b, &beta, C, p->c, D, p->c, &p->cand[i],
                                g_workspace, LT_WORKSPACE, st);
        }
        if (rc != CUBLAS_STATUS_SUCCESS) continue; /* a candidate that fails to launch is skipped */
        CUDA_CHECK(cudaEventRecord(e1, st));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) { best = ms; besti = i; }
    }
    p->algo = p->cand[besti];
    if (save) {
        CUDA_CHECK(cudaMemcpyAsync(D, save, dbytes, cudaMemcpyDeviceToDevice, st));
        CUDA_CHECK(cudaFree(save));
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
}

void lt_matmul(const lt_plan_t *p, const void *A, const void *B, void *D, float beta) {
    float alpha = 1.f;
    if (p->ncand > 1) lt_pick((lt_plan_t *)p, A, B, D, D, beta);
    cuda_counts()->gemms++;
    CUBLAS_CHECK(cublasLtMatmul(g_lt, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->c, D, p->c, &p->algo,
                                g_workspace, LT_WORKSPACE, cuda_compute_stream()));
}

void lt_matmul_c(const lt_plan_t *p, const void *A, const void *B, const void *C, void *D) {
    float alpha = 1.f, beta = 1.f;
    if (p->ncand > 1) lt_pick((lt_plan_t *)p, A, B, C, D, beta);
    cuda_counts()->gemms++;
    CUBLAS_CHECK(cublasLtMatmul(g_lt, p->desc, &alpha, A, p->a, B, p->b, &beta, C, p->c, D, p->c, &p->algo,
                                g_workspace, LT_WORKSPACE, cuda_compute_stream()));
}

void lt_set_scales(const lt_plan_t *p, const float *a_inv, const float *b_inv) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_inv, sizeof a_inv));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_inv, sizeof b_inv));
}
