/* cublaslt.cc: a reference cuBLASLt for the emulation tier (tests/emu):
 * exactly the calls the CUDA backend makes (workers/backend/cuda/
 * cublaslt.cu, gemm.cu, gemm_fp8.cu), computed on the CPU as a job queued
 * on the caller's stream through the emulator's core (emu_defs.h).
 *
 * Build (tests/emu/module.mk does it; by hand):
 *   g++ -std=c++17 -O1 -g -Wall -Wextra -Werror -Itests/emu/include -I. \
 *       -c tests/emu/cublaslt.cc -o /tmp/cublaslt.o
 * and with the test's stubs of the core (tests/emu/test_emu_libs.cc):
 *   g++ -std=c++17 -O1 -g -Wall -Wextra -Werror -Itests/emu/include -I. -rdynamic \
 *       tests/emu/test_emu_libs.cc tests/emu/cublaslt.cc -ldl -o /tmp/t && /tmp/t
 *
 * What a matmul computes: column-major
 *     D = (alpha * a_scale * b_scale) * op(A) op(B) + beta * C
 * with every product accumulated in fp32 in k order (products of bf16 or
 * fp8 values are exact in fp32, so only the sums round), then the result
 * rounded once to D's type (bf16: to nearest even). beta == 0 does not read
 * C (BLAS convention: C may hold NaN). The GPU's tensor cores sum in
 * another order and with other internal widths, so emulated and real
 * results agree within a tolerance, not bit for bit.
 *
 * Timing of the operands, as in cuBLASLt: alpha and beta are host values
 * read by cublasLtMatmul (the default pointer mode, the only one
 * modelled); the descriptor and layouts are copied into the job then, so
 * later changes to them do not affect it; the scale pointers are taken from
 * the descriptor then, but the floats they point to are read when the job
 * runs (gemm_fp8.cu's quantizing kernels write them on the same stream
 * right before).
 *
 * The constraints modelled (what the heuristic refuses with
 * CUBLAS_STATUS_NOT_SUPPORTED), from NVIDIA's cuBLAS documentation,
 * cublasLtMatmul() (the table of supported type combinations and "to use
 * FP8 kernels, the following requirements must be satisfied"), and the
 * attribute descriptions of cublasLt.h:
 *   - compute type CUBLAS_COMPUTE_32F and scale type CUDA_R_32F only (the
 *     FP8 rule; the other compute types are real but not modelled).
 *   - bf16: A and B CUDA_R_16BF, C = D of CUDA_R_16BF or CUDA_R_32F; any
 *     transposes, any sizes (odd ones included), alignment down to the
 *     element size.
 *   - FP8: A and B each CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2 but not both
 *     E5M2; C = D of CUDA_R_16BF or CUDA_R_32F (FP8 and fp16 outputs are
 *     real but not modelled); A transposed and B not ("TN", required on
 *     Ada and Hopper); the documentation asks that every dimension meet
 *     the tensor-core rule of 16-byte multiples and every pointer be
 *     16-byte aligned: modelled as m, n, k multiples of 16, lda, ldb and
 *     ldc, ldd (in bytes) multiples of 16, and MIN_ALIGNMENT_{A,B,C,D} of
 *     at least 16 (a smaller promise leaves no FP8 algorithm). The strict
 *     reading of n is an assumption: the documented byte rule only binds
 *     the contiguous dimensions (k for A and B, m for C and D).
 *   - A scale pointer set for non-FP8 A or B makes cublasLtMatmul return
 *     CUBLAS_STATUS_INVALID_VALUE, as cublasLt.h says of an unsupported
 *     combination.
 * Layouts inconsistent with the descriptor (rows and columns against m, n,
 * k and the transposes, C shaped unlike D, ld < rows, a zero size) are
 * CUBLAS_STATUS_INVALID_VALUE with a line on stderr. Attributes other than
 * TRANSA, TRANSB, A_SCALE_POINTER, B_SCALE_POINTER (descriptor) and
 * MAX_WORKSPACE_BYTES, MIN_ALIGNMENT_{A,B,C,D}_BYTES (preference) are
 * refused with CUBLAS_STATUS_NOT_SUPPORTED and a line naming them: the
 * emulation never silently ignores a setting.
 *
 * cublasLtMatmul checks, before queueing, and stops the run with
 * emu_fatal (naming the operand) where the GPU would fault or compute
 * garbage: that A, B, C, D, the workspace and the scale pointers lie in
 * device memory (emu_is_device) and alpha, beta do not (host pointer
 * mode); that each of A, B, C, D is as aligned as the preference promised
 * when the algorithm was chosen; that D overlaps neither A, B nor C,
 * unless C is D (in place; then a layout other than D's is
 * CUBLAS_STATUS_INVALID_VALUE). An algorithm found for
 * another problem (say the descriptor's TRANSA changed since) is
 * CUBLAS_STATUS_INVALID_VALUE; a NULL algorithm runs the implicit
 * heuristic with the default preference (256-byte alignment, as cuBLASLt). */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LT_MSG "gpu-emu cuBLASLt: "
#define LT_ALGO_MAGIC 0x474c41544c554d45ull /* "EMULTALG" */
#define LT_ALIGN_DEFAULT 256u               /* cuBLASLt's default MIN_ALIGNMENT_* */

/* ---- the opaque objects ---- */

struct cublasLtContext {
    int live; /* 1 until cublasLtDestroy */
};

struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType type;
    uint64_t rows, cols; /* column-major: rows contiguous */
    int64_t ld;          /* elements between the starts of two columns */
};

struct cublasLtMatmulDescOpaque_t {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t ta, tb;                /* cublasOperation_t as set */
    const void *a_scale, *b_scale; /* device floats or NULL (1) */
};

struct cublasLtMatmulPreferenceOpaque_t {
    uint64_t max_workspace; /* bytes */
    uint32_t align[4];      /* MIN_ALIGNMENT_{A,B,C,D}_BYTES */
};

/* ---- helpers ---- */

static void lt_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void lt_say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs(LT_MSG, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static const char *type_name(cudaDataType t) {
    switch (t) {
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_8F_E4M3: return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2: return "CUDA_R_8F_E5M2";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_32I: return "CUDA_R_32I";
    default: return "another cudaDataType";
    }
}

/* Bytes per element; 0 for types the emulation does not store. */
static size_t type_size(cudaDataType t) {
    switch (t) {
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    case CUDA_R_32F: return 4;
    default: return 0;
    }
}

static bool is_fp8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

static const char *desc_attr_name(int a) {
    switch (a) {
#define N(x) case CUBLASLT_MATMUL_DESC_##x: return "CUBLASLT_MATMUL_DESC_" #x;
    N(COMPUTE_TYPE) N(SCALE_TYPE) N(POINTER_MODE) N(TRANSA) N(TRANSB) N(TRANSC) N(FILL_MODE) N(EPILOGUE)
    N(BIAS_POINTER) N(BIAS_BATCH_STRIDE) N(EPILOGUE_AUX_POINTER) N(EPILOGUE_AUX_LD) N(EPILOGUE_AUX_BATCH_STRIDE)
    N(ALPHA_VECTOR_BATCH_STRIDE) N(SM_COUNT_TARGET) N(A_SCALE_POINTER) N(B_SCALE_POINTER) N(C_SCALE_POINTER)
    N(D_SCALE_POINTER) N(AMAX_D_POINTER) N(EPILOGUE_AUX_DATA_TYPE) N(EPILOGUE_AUX_SCALE_POINTER)
    N(EPILOGUE_AUX_AMAX_POINTER) N(FAST_ACCUM) N(BIAS_DATA_TYPE) N(A_SCALE_MODE) N(B_SCALE_MODE) N(C_SCALE_MODE)
    N(D_SCALE_MODE) N(EPILOGUE_AUX_SCALE_MODE) N(D_OUT_SCALE_POINTER) N(D_OUT_SCALE_MODE)
    N(EMULATION_DESCRIPTOR)
#undef N
    default: return "an unknown matmul descriptor attribute";
    }
}

static const char *pref_attr_name(int a) {
    switch (a) {
#define N(x) case CUBLASLT_MATMUL_PREF_##x: return "CUBLASLT_MATMUL_PREF_" #x;
    N(SEARCH_MODE) N(MAX_WORKSPACE_BYTES) N(REDUCTION_SCHEME_MASK) N(MIN_ALIGNMENT_A_BYTES) N(MIN_ALIGNMENT_B_BYTES)
    N(MIN_ALIGNMENT_C_BYTES) N(MIN_ALIGNMENT_D_BYTES) N(MAX_WAVES_COUNT) N(IMPL_MASK)
#undef N
    default: return "an unknown preference attribute";
    }
}

/* ---- status names ---- */

extern "C" const char *cublasLtGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

extern "C" const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "an emulated cuBLASLt error";
    }
}

/* ---- handle ---- */

extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = (cublasLtHandle_t)calloc(1, sizeof **h);
    if (!*h) return CUBLAS_STATUS_ALLOC_FAILED;
    (*h)->live = 1;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->live = 0;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- layouts ---- */

extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows,
                                                     uint64_t cols, int64_t ld) {
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    *l = (cublasLtMatrixLayout_t)calloc(1, sizeof **l);
    if (!*l) return CUBLAS_STATUS_ALLOC_FAILED;
    (*l)->type = type;
    (*l)->rows = rows;
    (*l)->cols = cols;
    (*l)->ld = ld;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- matmul descriptor ---- */

extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                                   cudaDataType_t scale) {
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    *d = (cublasLtMatmulDesc_t)calloc(1, sizeof **d);
    if (!*d) return CUBLAS_STATUS_ALLOC_FAILED;
    (*d)->compute = compute;
    (*d)->scale = scale;
    (*d)->ta = CUBLAS_OP_N;
    (*d)->tb = CUBLAS_OP_N;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t size) {
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        int32_t op;
        if (size != sizeof op) {
            lt_say("cublasLtMatmulDescSetAttribute(%s): %zu bytes given, the attribute is an int32_t",
                   desc_attr_name(attr), size);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&op, buf, sizeof op);
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C) {
            lt_say("cublasLtMatmulDescSetAttribute(%s): %d is not a cublasOperation_t", desc_attr_name(attr), (int)op);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        *(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &d->ta : &d->tb) = op;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: {
        const void *p;
        if (size != sizeof p) {
            lt_say("cublasLtMatmulDescSetAttribute(%s): %zu bytes given, the attribute is a pointer", desc_attr_name(attr),
                   size);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&p, buf, sizeof p);
        *(attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? &d->a_scale : &d->b_scale) = p;
        return CUBLAS_STATUS_SUCCESS;
    }
    default:
        lt_say("cublasLtMatmulDescSetAttribute(%s = %d) is not modelled by the emulation: refused with "
               "CUBLAS_STATUS_NOT_SUPPORTED; model it in tests/emu/cublaslt.cc from its documented semantics",
               desc_attr_name(attr), (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

/* ---- preference ---- */

extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    *p = (cublasLtMatmulPreference_t)calloc(1, sizeof **p);
    if (!*p) return CUBLAS_STATUS_ALLOC_FAILED;
    for (int i = 0; i < 4; i++) (*p)->align[i] = LT_ALIGN_DEFAULT;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                               cublasLtMatmulPreferenceAttributes_t attr,
                                                               const void *buf, size_t size) {
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if (size != sizeof(uint64_t)) {
            lt_say("cublasLtMatmulPreferenceSetAttribute(%s): %zu bytes given, the attribute is a uint64_t",
                   pref_attr_name(attr), size);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&p->max_workspace, buf, sizeof p->max_workspace);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if (size != sizeof(uint32_t)) {
            lt_say("cublasLtMatmulPreferenceSetAttribute(%s): %zu bytes given, the attribute is a uint32_t",
                   pref_attr_name(attr), size);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeof(uint32_t));
        return CUBLAS_STATUS_SUCCESS;
    default:
        lt_say("cublasLtMatmulPreferenceSetAttribute(%s = %d) is not modelled by the emulation: refused with "
               "CUBLAS_STATUS_NOT_SUPPORTED; model it in tests/emu/cublaslt.cc from its documented semantics",
               pref_attr_name(attr), (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

/* ---- the problem a descriptor and four layouts describe ---- */

typedef struct {
    uint64_t m, n, k;
    int ta, tb;                    /* 0 = N, 1 = T (CUBLAS_OP_C is T for real types) */
    cudaDataType at, bt, ct, dt;
    uint64_t ar, ac, br, bc;       /* stored shapes of A and B */
    int64_t lda, ldb, ldc, ldd;
    cublasComputeType_t compute;
    cudaDataType_t scale;
} lt_problem_t;

/* Fill *p from the descriptor and layouts; CUBLAS_STATUS_INVALID_VALUE
 * (and a stderr line from `fn`) when they do not describe one matmul. */
static cublasStatus_t lt_problem(const char *fn, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                 cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                 lt_problem_t *p) {
    if (!d || !a || !b || !c || !dd) {
        lt_say("%s: a NULL descriptor or layout", fn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memset(p, 0, sizeof *p);
    p->ta = d->ta != CUBLAS_OP_N;
    p->tb = d->tb != CUBLAS_OP_N;
    p->at = a->type, p->bt = b->type, p->ct = c->type, p->dt = dd->type;
    p->ar = a->rows, p->ac = a->cols, p->br = b->rows, p->bc = b->cols;
    p->lda = a->ld, p->ldb = b->ld, p->ldc = c->ld, p->ldd = dd->ld;
    p->compute = d->compute;
    p->scale = d->scale;
    p->m = dd->rows;
    p->n = dd->cols;
    p->k = p->ta ? a->rows : a->cols;
    uint64_t am = p->ta ? a->cols : a->rows;
    uint64_t bk = p->tb ? b->cols : b->rows, bn = p->tb ? b->rows : b->cols;
    if (am != p->m || bk != p->k || bn != p->n) {
        lt_say("%s: layouts disagree with the descriptor: D is (%llu x %llu), op%s(A) (%llu x %llu), op%s(B) "
               "(%llu x %llu); op(A) must be (m x k) and op(B) (k x n)", fn, (unsigned long long)p->m,
               (unsigned long long)p->n, p->ta ? "=T" : "=N", (unsigned long long)am, (unsigned long long)p->k,
               p->tb ? "=T" : "=N", (unsigned long long)bk, (unsigned long long)bn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (c->rows != dd->rows || c->cols != dd->cols) {
        lt_say("%s: C is (%llu x %llu) but D (%llu x %llu)", fn, (unsigned long long)c->rows,
               (unsigned long long)c->cols, (unsigned long long)dd->rows, (unsigned long long)dd->cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (p->m == 0 || p->n == 0 || p->k == 0) {
        lt_say("%s: a zero size (m=%llu n=%llu k=%llu)", fn, (unsigned long long)p->m, (unsigned long long)p->n,
               (unsigned long long)p->k);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const struct { const char *name; cublasLtMatrixLayout_t l; } ls[4] = { { "A", a }, { "B", b }, { "C", c }, { "D", dd } };
    for (int i = 0; i < 4; i++)
        if (ls[i].l->ld < 0 || (uint64_t)ls[i].l->ld < ls[i].l->rows) {
            lt_say("%s: ld%c = %lld is less than the %llu rows of %s", fn, ls[i].name[0] + 32, (long long)ls[i].l->ld,
                   (unsigned long long)ls[i].l->rows, ls[i].name);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    return CUBLAS_STATUS_SUCCESS;
}

/* CUBLAS_STATUS_SUCCESS when an algorithm of the modelled library takes
 * problem p with pointers aligned to align[] (A, B, C, D); otherwise
 * CUBLAS_STATUS_NOT_SUPPORTED with the reason in why. See the top comment. */
static cublasStatus_t lt_supported(const lt_problem_t *p, const uint32_t align[4], char *why, size_t wn) {
    if (p->compute != CUBLAS_COMPUTE_32F || p->scale != CUDA_R_32F) {
        snprintf(why, wn, "compute type %d / scale type %d: only CUBLAS_COMPUTE_32F with CUDA_R_32F is modelled",
                 (int)p->compute, (int)p->scale);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (p->ct != p->dt || (p->dt != CUDA_R_16BF && p->dt != CUDA_R_32F)) {
        snprintf(why, wn, "C %s, D %s: C and D of one type, CUDA_R_16BF or CUDA_R_32F, are modelled", type_name(p->ct),
                 type_name(p->dt));
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    bool bf16 = p->at == CUDA_R_16BF && p->bt == CUDA_R_16BF;
    bool fp8 = is_fp8(p->at) && is_fp8(p->bt) && !(p->at == CUDA_R_8F_E5M2 && p->bt == CUDA_R_8F_E5M2);
    if (!bf16 && !fp8) {
        snprintf(why, wn, "A %s with B %s: no such cuBLASLt kernel (bf16 x bf16, or E4M3/E5M2 pairs other than "
                 "E5M2 x E5M2)", type_name(p->at), type_name(p->bt));
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (fp8) {
        size_t ds = type_size(p->dt);
        if (!p->ta || p->tb) {
            snprintf(why, wn, "FP8 needs A transposed and B not (\"TN\"); got %s%s", p->ta ? "T" : "N", p->tb ? "T" : "N");
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        if (p->m % 16 || p->n % 16 || p->k % 16) {
            snprintf(why, wn, "FP8 needs m, n, k multiples of 16 (m=%llu n=%llu k=%llu)", (unsigned long long)p->m,
                     (unsigned long long)p->n, (unsigned long long)p->k);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        if (p->lda % 16 || p->ldb % 16 || (p->ldc * ds) % 16 || (p->ldd * ds) % 16) {
            snprintf(why, wn, "FP8 needs leading dimensions of 16-byte multiples (lda=%lld ldb=%lld ldc=%lld ldd=%lld)",
                     (long long)p->lda, (long long)p->ldb, (long long)p->ldc, (long long)p->ldd);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        for (int i = 0; i < 4; i++)
            if (align[i] < 16) {
                snprintf(why, wn, "FP8 needs 16-byte aligned pointers; MIN_ALIGNMENT_%c_BYTES = %u", "ABCD"[i],
                         (unsigned)align[i]);
                return CUBLAS_STATUS_NOT_SUPPORTED;
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- algorithms: the problem and the alignments they were chosen for ---- */

static void algo_encode(const lt_problem_t *p, cublasLtMatmulAlgo_t *a) {
    memset(a, 0, sizeof *a);
    a->data[0] = LT_ALGO_MAGIC;
    a->data[1] = p->m | p->n << 32;
    a->data[2] = p->k;
    a->data[3] = (uint64_t)p->at | (uint64_t)p->bt << 8 | (uint64_t)p->ct << 16 | (uint64_t)p->dt << 24 |
                 (uint64_t)p->ta << 32 | (uint64_t)p->tb << 40;
    a->data[4] = (uint64_t)(uint32_t)p->lda | (uint64_t)(uint32_t)p->ldb << 32;
    a->data[5] = (uint64_t)(uint32_t)p->ldc | (uint64_t)(uint32_t)p->ldd << 32;
    a->data[7] = (uint64_t)(uint32_t)p->compute | (uint64_t)(uint32_t)p->scale << 32;
}

/* The alignment an algorithm relies on: the promise, capped at the 256
 * bytes no kernel needs more than, raised to the element size (every
 * pointer of that type has it; how the real library treats a smaller
 * promise is not documented). */
static void algo_set_align(cublasLtMatmulAlgo_t *a, const uint32_t align[4], const lt_problem_t *p) {
    const cudaDataType t[4] = { p->at, p->bt, p->ct, p->dt };
    uint64_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint32_t x = align[i] > LT_ALIGN_DEFAULT ? LT_ALIGN_DEFAULT : align[i];
        if (x < type_size(t[i])) x = (uint32_t)type_size(t[i]);
        v |= (uint64_t)x << (16 * i);
    }
    a->data[6] = v;
}

static uint32_t algo_align(const cublasLtMatmulAlgo_t *a, int i) { return (uint32_t)(a->data[6] >> (16 * i)) & 0xffffu; }

static bool algo_matches(const cublasLtMatmulAlgo_t *a, const lt_problem_t *p) {
    cublasLtMatmulAlgo_t e;
    algo_encode(p, &e);
    for (int i = 0; i < 8; i++)
        if (i != 6 && a->data[i] != e.data[i]) return false;
    return true;
}

/* ---- heuristic ---- */

extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                                         cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                         cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                                         cublasLtMatmulPreference_t pref, int requested,
                                                         cublasLtMatmulHeuristicResult_t results[], int *returned) {
    if (!h || !h->live) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!returned || !results || requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    lt_problem_t p;
    cublasStatus_t s = lt_problem("cublasLtMatmulAlgoGetHeuristic", d, a, b, c, dd, &p);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    const uint32_t dflt[4] = { LT_ALIGN_DEFAULT, LT_ALIGN_DEFAULT, LT_ALIGN_DEFAULT, LT_ALIGN_DEFAULT };
    const uint32_t *align = pref ? pref->align : dflt;
    char why[256];
    s = lt_supported(&p, align, why, sizeof why);
    if (s != CUBLAS_STATUS_SUCCESS) {
        lt_say("cublasLtMatmulAlgoGetHeuristic: no algorithm for m=%llu n=%llu k=%llu: %s", (unsigned long long)p.m,
               (unsigned long long)p.n, (unsigned long long)p.k, why);
        return s;
    }
    memset(&results[0], 0, sizeof results[0]);
    algo_encode(&p, &results[0].algo);
    algo_set_align(&results[0].algo, align, &p);
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- the job ---- */

typedef struct {
    lt_problem_t p;
    float alpha, beta;
    const void *A, *B, *C;
    void *D;
    const float *a_scale, *b_scale; /* read when the job runs; NULL is 1 */
} lt_job_t;

/* Element (r, c) of column-major X of type t with leading dimension ld, as
 * a float (exact for every modelled type). */
static float load(const void *X, cudaDataType t, int64_t ld, uint64_t r, uint64_t c) {
    size_t i = (size_t)(r + c * (uint64_t)ld);
    switch (t) {
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)X)[i]);
    case CUDA_R_32F: return ((const float *)X)[i];
    case CUDA_R_8F_E4M3: return emu_fp8_to_float(((const uint8_t *)X)[i], __NV_E4M3);
    case CUDA_R_8F_E5M2: return emu_fp8_to_float(((const uint8_t *)X)[i], __NV_E5M2);
    default: emu_fatal("cuBLASLt job: cannot load %s", type_name(t));
    }
}

/* D = (alpha a_scale b_scale) op(A) op(B) + beta C: op(A) is first copied
 * as floats (m, k) row-major and op(B) as (n, k) row-major, so each output
 * is one contiguous dot product summed in k order. */
static void lt_run(void *arg) {
    const lt_job_t *j = (const lt_job_t *)arg;
    const lt_problem_t *p = &j->p;
    size_t m = p->m, n = p->n, k = p->k;
    float *a = (float *)malloc(m * k * sizeof(float)), *b = (float *)malloc(n * k * sizeof(float));
    if (!a || !b) emu_fatal("cuBLASLt job: out of host memory for a (%zu x %zu x %zu) matmul", m, n, k);
    for (size_t i = 0; i < m; i++)
        for (size_t l = 0; l < k; l++) a[i * k + l] = p->ta ? load(j->A, p->at, p->lda, l, i) : load(j->A, p->at, p->lda, i, l);
    for (size_t c = 0; c < n; c++)
        for (size_t l = 0; l < k; l++) b[c * k + l] = p->tb ? load(j->B, p->bt, p->ldb, c, l) : load(j->B, p->bt, p->ldb, l, c);
    float sa = j->a_scale ? *j->a_scale : 1.0f, sb = j->b_scale ? *j->b_scale : 1.0f;
    float s = j->alpha * sa * sb;
    for (size_t c = 0; c < n; c++)
        for (size_t i = 0; i < m; i++) {
            const float *x = a + i * k, *y = b + c * k;
            float acc = 0.0f;
            for (size_t l = 0; l < k; l++) acc += x[l] * y[l];
            float v = s * acc;
            if (j->beta != 0.0f) v += j->beta * load(j->C, p->ct, p->ldc, i, c);
            size_t o = i + c * (size_t)p->ldd;
            if (p->dt == CUDA_R_16BF) ((__nv_bfloat16 *)j->D)[o] = __float2bfloat16_rn(v);
            else ((float *)j->D)[o] = v;
        }
    free(a);
    free(b);
}

/* ---- matmul ---- */

/* Bytes from the first to one past the last element of a layout. */
static size_t span_bytes(cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld) {
    return (size_t)((cols - 1) * (uint64_t)ld + rows) * type_size(t);
}

static bool overlap(const void *x, size_t xn, const void *y, size_t yn) {
    uintptr_t a = (uintptr_t)x, b = (uintptr_t)y;
    return a < b + yn && b < a + xn;
}

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                                         cublasLtMatrixLayout_t Ad, const void *B, cublasLtMatrixLayout_t Bd,
                                         const void *beta, const void *C, cublasLtMatrixLayout_t Cd, void *D,
                                         cublasLtMatrixLayout_t Dd, const cublasLtMatmulAlgo_t *algo, void *workspace,
                                         size_t workspace_bytes, cudaStream_t stream) {
    if (!h || !h->live) return CUBLAS_STATUS_NOT_INITIALIZED;
    lt_problem_t p;
    cublasStatus_t s = lt_problem("cublasLtMatmul", d, Ad, Bd, Cd, Dd, &p);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!alpha || !beta || !A || !B || !D) {
        lt_say("cublasLtMatmul: NULL alpha, beta, A, B or D");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (emu_is_device(alpha, sizeof(float)) || emu_is_device(beta, sizeof(float)))
        emu_fatal("cublasLtMatmul: alpha = %p or beta = %p is device memory, but the pointer mode is "
                  "CUBLASLT_POINTER_MODE_HOST (the only one modelled): pass host floats", alpha, beta);
    float al, be;
    memcpy(&al, alpha, sizeof al);
    memcpy(&be, beta, sizeof be);
    if (!C && be != 0.0f) {
        lt_say("cublasLtMatmul: C is NULL but beta = %g", (double)be);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((d->a_scale && !is_fp8(p.at)) || (d->b_scale && !is_fp8(p.bt))) {
        lt_say("cublasLtMatmul: a scale pointer is set for a non-FP8 operand (A %s, B %s): cuBLASLt returns "
               "CUBLAS_STATUS_INVALID_VALUE for it", type_name(p.at), type_name(p.bt));
        return CUBLAS_STATUS_INVALID_VALUE;
    }

    /* the algorithm: the caller's, found for this problem, or the implicit
     * heuristic with default preferences (256-byte alignment) */
    cublasLtMatmulAlgo_t implicit;
    char why[256];
    if (algo) {
        if (algo->data[0] != LT_ALGO_MAGIC || !algo_matches(algo, &p)) {
            lt_say("cublasLtMatmul: the algorithm was not found by cublasLtMatmulAlgoGetHeuristic for this problem "
                   "(m=%llu n=%llu k=%llu, these types, transposes and leading dimensions)", (unsigned long long)p.m,
                   (unsigned long long)p.n, (unsigned long long)p.k);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    } else {
        const uint32_t dflt[4] = { LT_ALIGN_DEFAULT, LT_ALIGN_DEFAULT, LT_ALIGN_DEFAULT, LT_ALIGN_DEFAULT };
        if ((s = lt_supported(&p, dflt, why, sizeof why)) != CUBLAS_STATUS_SUCCESS) {
            lt_say("cublasLtMatmul: no algorithm (implicit heuristic): %s", why);
            return s;
        }
        algo_encode(&p, &implicit);
        algo_set_align(&implicit, dflt, &p);
        algo = &implicit;
    }
    /* memory: where, how aligned, how overlapping */
    const size_t na = span_bytes(p.at, p.ar, p.ac, p.lda), nb = span_bytes(p.bt, p.br, p.bc, p.ldb);
    const size_t nc = span_bytes(p.ct, p.m, p.n, p.ldc), nd = span_bytes(p.dt, p.m, p.n, p.ldd);
    const struct { const char *name; const void *ptr; size_t bytes; } ops[4] = {
        { "A", A, na }, { "B", B, nb }, { "C", C, nc }, { "D", D, nd } };
    for (int i = 0; i < 4; i++) {
        if (!ops[i].ptr) continue; /* C with beta = 0 */
        if (!emu_is_device(ops[i].ptr, ops[i].bytes))
            emu_fatal("cublasLtMatmul: %s = %p (%zu bytes, m=%llu n=%llu k=%llu) is not inside one device allocation",
                      ops[i].name, ops[i].ptr, ops[i].bytes, (unsigned long long)p.m, (unsigned long long)p.n,
                      (unsigned long long)p.k);
        uint32_t need = algo_align(algo, i);
        if ((uintptr_t)ops[i].ptr % need)
            emu_fatal("cublasLtMatmul: %s = %p is not %u-byte aligned, but its algorithm was chosen for "
                      "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%s_BYTES = %u (the preference promised it)", ops[i].name,
                      ops[i].ptr, need, ops[i].name, need);
    }
    if (workspace && workspace_bytes && !emu_is_device(workspace, workspace_bytes))
        emu_fatal("cublasLtMatmul: workspace = %p (%zu bytes) is not inside one device allocation", workspace,
                  workspace_bytes);
    if (d->a_scale && !emu_is_device(d->a_scale, sizeof(float)))
        emu_fatal("cublasLtMatmul: CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = %p is not device memory", d->a_scale);
    if (d->b_scale && !emu_is_device(d->b_scale, sizeof(float)))
        emu_fatal("cublasLtMatmul: CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = %p is not device memory", d->b_scale);
    if (overlap(D, nd, A, na) || overlap(D, nd, B, nb))
        emu_fatal("cublasLtMatmul: D = %p (%zu bytes) overlaps A = %p or B = %p", D, nd, A, B);
    if (C && C == (const void *)D) {
        if (p.ldc != p.ldd || p.ct != p.dt) {
            lt_say("cublasLtMatmul: in place (C == D) needs the same layout for both (ldc=%lld ldd=%lld, %s %s)",
                   (long long)p.ldc, (long long)p.ldd, type_name(p.ct), type_name(p.dt));
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    } else if (C && overlap(D, nd, C, nc)) {
        emu_fatal("cublasLtMatmul: C = %p and D = %p overlap without being the same matrix", C, D);
    }

    lt_job_t *j = (lt_job_t *)calloc(1, sizeof *j);
    if (!j) return CUBLAS_STATUS_ALLOC_FAILED;
    j->p = p;
    j->alpha = al;
    j->beta = be;
    j->A = A, j->B = B, j->C = C, j->D = D;
    j->a_scale = (const float *)d->a_scale;
    j->b_scale = (const float *)d->b_scale;
    emu_enqueue(stream, "cublasLtMatmul", lt_run, j, free);
    return CUBLAS_STATUS_SUCCESS;
}
