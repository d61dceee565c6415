/* attention_cudnn.cu: causal GQA attention through cuDNN 9's fused flash
 * attention, and the start-up choice between it and our own kernels
 * (--attention auto|cudnn|own: the choice and its self-check are in
 * attention.cu, which calls in here).
 *
 * cuDNN is opened with dlopen, never linked: the build needs only its
 * headers (the CUDA toolkit's, or pip's nvidia/cudnn/include), and a
 * machine without it runs our kernels. Where libcudnn.so.9 is looked for:
 * $BALLAST_CUDNN_LIB (a file or a directory; when set, only there), the
 * loader's own path (LD_LIBRARY_PATH, ld.so.cache), the site-packages of
 * PyTorch's pip wheel (nvidia/cudnn/lib, from nvidia-cudnn-cu13 or -cu12),
 * then $CUDA_HOME/lib64 and /usr/local/cuda/lib64.
 *
 * The graphs are the ones cuDNN's runtime fusion engine recognises as
 * scaled-dot-product flash attention (the same operation graph the cuDNN
 * frontend lowers its SDPA nodes to), built on the backend C API:
 *   forward:  S = Q K^T * scale, causal mask (row >= col, else -inf),
 *             Stats = max + log(sum exp(S - max)), O = softmax(S) V
 *   backward: D = rowsum(dO * O), P = exp(S - Stats) (masked),
 *             dV = P^T dO, dS = P * (dO V^T - D) * scale,
 *             dK = dS^T Q, dQ = dS K (fp32, then rounded to bf16);
 *             with Hkv < H the per-query-head dK and dV are summed over
 *             each group by a reduction.
 * Stats is (B, H, T, 1) fp32, the natural log-sum-exp of the scaled
 * scores: exactly the attention state our kernels keep (B, H, T), so a
 * forward on one path and a backward on the other agree, and the
 * self-check below compares them too.
 *
 * Layouts: q, out, dq (B, T, H, Dh); k, v, dk, dv (B, T, Hkv, Dh), bf16,
 * given to cuDNN as strided (b, h, s, d) tensors (BSHD), no copies. Plans
 * are built on the first call of each (B, T, H, Hkv, Dh) and cached. */
#include "workers/backend/cuda/common.cuh"

#include <dlfcn.h>
#include <glob.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#if defined(__has_include)
#if __has_include(<cudnn_backend.h>)
#include <cudnn_backend.h>
#define ATT_HAVE_CUDNN_H 1
#endif
#endif

#ifdef ATT_HAVE_CUDNN_H

/* ---- the library ---- */

typedef struct {
    void *dl;
    char path[512];
    size_t version;
    cudnnHandle_t handle;
    size_t (*getVersion)(void);
    const char *(*getErrorString)(cudnnStatus_t);
    void (*getLastErrorString)(char *, size_t); /* 9.0+; may be NULL */
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*setStream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*createDesc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*destroyDesc)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*setAttr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                             int64_t, const void *);
    cudnnStatus_t (*getAttr)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                             cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
} cudnn_lib_t;

static cudnn_lib_t g_dnn;
static int g_dnn_state;        /* 0 not tried, 1 loaded, -1 failed */
static char g_dnn_why[1024];   /* why it did not load */

/* dlopen one candidate; 0 when it is a cuDNN 9 with every symbol we use. */
static int dnn_try(const char *path, char *why, size_t n) {
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) { snprintf(why, n, "%s", dlerror()); return -1; }
    cudnn_lib_t L;
    memset(&L, 0, sizeof L);
    L.dl = dl;
#define DNN_SYM(field, name)                                                                        \
    do {                                                                                            \
        *(void **)&L.field = dlsym(dl, name);                                                       \
        if (!L.field) { snprintf(why, n, "%s lacks %s", path, name); dlclose(dl); return -1; }      \
    } while (0)
    DNN_SYM(getVersion, "cudnnGetVersion");
    DNN_SYM(getErrorString, "cudnnGetErrorString");
    DNN_SYM(create, "cudnnCreate");
    DNN_SYM(setStream, "cudnnSetStream");
    DNN_SYM(createDesc, "cudnnBackendCreateDescriptor");
    DNN_SYM(destroyDesc, "cudnnBackendDestroyDescriptor");
    DNN_SYM(setAttr, "cudnnBackendSetAttribute");
    DNN_SYM(getAttr, "cudnnBackendGetAttribute");
    DNN_SYM(finalize, "cudnnBackendFinalize");
    DNN_SYM(execute, "cudnnBackendExecute");
#undef DNN_SYM
    *(void **)&L.getLastErrorString = dlsym(dl, "cudnnGetLastErrorString");
    L.version = L.getVersion();
    if (L.version < 90000 || L.version >= 100000) {
        snprintf(why, n, "%s is cuDNN %zu.%zu.%zu; the fused attention graphs here need cuDNN 9", path,
                 L.version / 10000, L.version / 100 % 100, L.version % 100);
        dlclose(dl);
        return -1;
    }
    Dl_info info;
    const char *real = dladdr(*(void **)&L.getVersion, &info) && info.dli_fname ? info.dli_fname : path;
    snprintf(L.path, sizeof L.path, "%s", real);
    g_dnn = L;
    return 0;
}

/* Load libcudnn.so.9 once (see the top of the file for where). */
static int dnn_load(void) {
    if (g_dnn_state) return g_dnn_state > 0 ? 0 : -1;
    g_dnn_state = -1;
    char why[512] = "";
    const char *env = getenv("BALLAST_CUDNN_LIB");
    if (env && *env) {
        char p[600];
        size_t len = strlen(env);
        if (len > 3 && strcmp(env + len - 3, ".so") != 0 && !strstr(env, ".so."))
            snprintf(p, sizeof p, "%s/libcudnn.so.9", env);
        else snprintf(p, sizeof p, "%s", env);
        if (dnn_try(p, why, sizeof why) == 0) { g_dnn_state = 1; return 0; }
        snprintf(g_dnn_why, sizeof g_dnn_why, "libcudnn.so.9 did not load from BALLAST_CUDNN_LIB=%s (%s); "
                 "point it at PyTorch's site-packages/nvidia/cudnn/lib or unset it", env, why);
        return -1;
    }
    if (dnn_try("libcudnn.so.9", why, sizeof why) == 0) { g_dnn_state = 1; return 0; }
    char looked[700];
    snprintf(looked, sizeof looked, "the loader's path");
    const char *home = getenv("HOME"), *cuda = getenv("CUDA_HOME"), *venv = getenv("VIRTUAL_ENV"),
               *conda = getenv("CONDA_PREFIX");
    char pats[8][400];
    int np = 0;
    const char *tail = "lib/python3*/*-packages/nvidia/cudnn/lib/libcudnn.so.9";
    if (venv && *venv) snprintf(pats[np++], sizeof pats[0], "%s/%s", venv, tail);
    if (conda && *conda) snprintf(pats[np++], sizeof pats[0], "%s/%s", conda, tail);
    snprintf(pats[np++], sizeof pats[0], "/usr/local/%s", tail);
    snprintf(pats[np++], sizeof pats[0], "/usr/%s", tail);
    if (home && *home) snprintf(pats[np++], sizeof pats[0], "%s/.local/%s", home, tail);
    snprintf(pats[np++], sizeof pats[0], "/opt/conda/%s", tail);
    if (cuda && *cuda) snprintf(pats[np++], sizeof pats[0], "%s/lib64/libcudnn.so.9", cuda);
    snprintf(pats[np++], sizeof pats[0], "/usr/local/cuda/lib64/libcudnn.so.9");
    for (int i = 0; i < np; i++) {
        size_t l = strlen(looked);
        char dir[sizeof pats[0]];
        memcpy(dir, pats[i], sizeof dir);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        snprintf(looked + l, sizeof looked - l, ", %s", dir);
        glob_t g;
        if (glob(pats[i], 0, NULL, &g) == 0) {
            for (size_t j = 0; j < g.gl_pathc; j++)
                if (dnn_try(g.gl_pathv[j], why, sizeof why) == 0) { globfree(&g); g_dnn_state = 1; return 0; }
            globfree(&g);
        }
    }
    snprintf(g_dnn_why, sizeof g_dnn_why, "libcudnn.so.9 not found (looked in %s; BALLAST_CUDNN_LIB names it)", looked);
    return -1;
}

/* ---- building graphs ---- */

/* One graph under construction: every descriptor made, to destroy at the
 * end, and the first failure. */
typedef struct {
    cudnnBackendDescriptor_t d[96];
    int nd;
    cudnnBackendDescriptor_t ops[48];
    int nops;
    int64_t next_virtual;  /* uids of virtual tensors */
    char err[400];
} gb_t;

static bool gb_fail(gb_t *g, const char *what, cudnnStatus_t st) {
    if (g->err[0]) return false;
    char last[256] = "";
    if (g_dnn.getLastErrorString) g_dnn.getLastErrorString(last, sizeof last);
    snprintf(g->err, sizeof g->err, "%s: %s%s%s", what, g_dnn.getErrorString(st), last[0] ? ": " : "", last);
    return false;
}

static cudnnBackendDescriptor_t gb_new(gb_t *g, cudnnBackendDescriptorType_t type, const char *what) {
    if (g->err[0]) return NULL;
    if (g->nd == (int)(sizeof g->d / sizeof g->d[0])) { snprintf(g->err, sizeof g->err, "too many descriptors"); return NULL; }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = g_dnn.createDesc(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) { gb_fail(g, what, st); return NULL; }
    g->d[g->nd++] = d;
    return d;
}

static void gb_set(gb_t *g, cudnnBackendDescriptor_t d, int attr, cudnnBackendAttributeType_t type, int64_t n,
                   const void *v, const char *what) {
    if (g->err[0] || !d) return;
    cudnnStatus_t st = g_dnn.setAttr(d, (cudnnBackendAttributeName_t)attr, type, n, v);
    if (st != CUDNN_STATUS_SUCCESS) {
        char w[160];
        snprintf(w, sizeof w, "%s: set attribute %d", what, attr);
        gb_fail(g, w, st);
    }
}

static void gb_finalize(gb_t *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->err[0] || !d) return;
    cudnnStatus_t st = g_dnn.finalize(d);
    if (st != CUDNN_STATUS_SUCCESS) {
        char w[160];
        snprintf(w, sizeof w, "finalize %s", what);
        gb_fail(g, w, st);
    }
}

static void gb_free(gb_t *g) {
    for (int i = g->nd - 1; i >= 0; i--) g_dnn.destroyDesc(g->d[i]);
    g->nd = 0;
}

/* A 4-d tensor (dims and strides in (b, h, s, d) order). uid 0 makes a
 * virtual tensor with the next virtual uid. */
static cudnnBackendDescriptor_t gb_tensor(gb_t *g, int64_t uid, cudnnDataType_t type, const int64_t dims[4],
                                          const int64_t strides[4], bool by_value = false) {
    cudnnBackendDescriptor_t t = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    bool virt = uid == 0;
    if (virt) uid = g->next_virtual++;
    int64_t align = 16;
    gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor");
    gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor");
    gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor");
    gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor");
    gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor");
    gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor");
    if (by_value) gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor");
    gb_finalize(g, t, "tensor");
    return t;
}

static void gb_op(gb_t *g, cudnnBackendDescriptor_t op, const char *what) {
    gb_finalize(g, op, what);
    if (!g->err[0] && op) g->ops[g->nops++] = op;
}

/* y = mode(x[, b[, t]]) in fp32 (BOOLEAN for comparisons); axis for GEN_INDEX. */
static void gb_pw(gb_t *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                  cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis = -1,
                  cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
    cudnnBackendDescriptor_t pw = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise");
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise");
    if (axis >= 0) gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise");
    gb_finalize(g, pw, "pointwise");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise op");
    if (b) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise op");
    if (t) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise op");
    gb_op(g, op, "pointwise op");
}

static void gb_matmul(gb_t *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    gb_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "matmul");
    gb_finalize(g, mm, "matmul");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul op");
    gb_op(g, op, "matmul op");
}

static void gb_reduce(gb_t *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction");
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "reduction");
    gb_finalize(g, rd, "reduction");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, "reduction op");
    gb_op(g, op, "reduction op");
}

static void gb_reshape(gb_t *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape op");
    gb_op(g, op, "reshape op");
}

/* Tensor uids of the variant packs. */
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEGINF, UID_DO, UID_DQ, UID_DK, UID_DV,
    UID_SOFTMAX_SUM, UID_DQ_ACCUM, UID_ONE, UID_VIRTUAL = 100
};

/* ---- plans ---- */

typedef struct {
    bool used, bwd;
    int B, T, H, Hkv, Dh;
    cudnnBackendDescriptor_t plan;  /* NULL: this shape failed (err says why) */
    int64_t workspace;              /* bytes cuDNN asked for */
    char err[512];
} dnn_plan_t;

#define DNN_PLANS 32
static dnn_plan_t g_plans[DNN_PLANS];

/* The operations of the forward (bwd false) or backward graph of one
 * shape into g. */
static void build_ops(gb_t *g, bool bwd, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t Dh) {
    const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT, I = CUDNN_DATA_INT32, BOOL = CUDNN_DATA_BOOLEAN;
    int64_t qd[4] = { B, H, T, Dh }, qs[4] = { T * H * Dh, Dh, H * Dh, 1 };               /* (B, T, H, Dh) memory */
    int64_t kd[4] = { B, Hkv, T, Dh }, ks[4] = { T * Hkv * Dh, Dh, Hkv * Dh, 1 };         /* (B, T, Hkv, Dh) */
    int64_t ktd[4] = { B, Hkv, Dh, T }, kts[4] = { T * Hkv * Dh, Dh, 1, Hkv * Dh };       /* K^T view */
    int64_t sd[4] = { B, H, T, T }, ss[4] = { H * T * T, T * T, T, 1 };                   /* scores */
    int64_t std_[4] = { B, H, T, T }, sts[4] = { H * T * T, T * T, 1, T };                /* scores^T view */
    int64_t rd[4] = { B, H, T, 1 }, rs[4] = { H * T, T, 1, 1 };                           /* per row: stats */
    int64_t hd[4] = { B, H, T, Dh }, hs[4] = { H * T * Dh, T * Dh, Dh, 1 };               /* per query head */
    int64_t one[4] = { 1, 1, 1, 1 };
    g->next_virtual = UID_VIRTUAL;
    cudnnBackendDescriptor_t q = gb_tensor(g, UID_Q, BF, qd, qs);
    cudnnBackendDescriptor_t kt = gb_tensor(g, UID_K, BF, ktd, kts);
    cudnnBackendDescriptor_t stats = gb_tensor(g, UID_STATS, F, rd, rs);
    cudnnBackendDescriptor_t scale = gb_tensor(g, UID_SCALE, F, one, one, true);
    cudnnBackendDescriptor_t neginf = gb_tensor(g, UID_NEGINF, F, one, one, true);
    if (!bwd) {
        cudnnBackendDescriptor_t v = gb_tensor(g, UID_V, BF, kd, ks);
        cudnnBackendDescriptor_t o = gb_tensor(g, UID_O, BF, qd, qs);
        cudnnBackendDescriptor_t s1 = gb_tensor(g, 0, F, sd, ss), s2 = gb_tensor(g, 0, F, sd, ss);
        gb_matmul(g, q, kt, s1);
        gb_pw(g, CUDNN_POINTWISE_MUL, s1, scale, NULL, s2);
        cudnnBackendDescriptor_t row = gb_tensor(g, 0, I, sd, ss), col = gb_tensor(g, 0, I, sd, ss);
        cudnnBackendDescriptor_t mask = gb_tensor(g, 0, BOOL, sd, ss), s3 = gb_tensor(g, 0, F, sd, ss);
        gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, s2, NULL, NULL, row, 2);
        gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, s2, NULL, NULL, col, 3);
        gb_pw(g, CUDNN_POINTWISE_CMP_GE, row, col, NULL, mask, -1, BOOL);
        gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, s2, neginf, mask, s3);
        cudnnBackendDescriptor_t mx = gb_tensor(g, 0, F, rd, rs), sub = gb_tensor(g, 0, F, sd, ss);
        cudnnBackendDescriptor_t ex = gb_tensor(g, 0, F, sd, ss), sum = gb_tensor(g, 0, F, rd, rs);
        cudnnBackendDescriptor_t lg = gb_tensor(g, 0, F, rd, rs), p = gb_tensor(g, 0, BF, sd, ss);
        gb_reduce(g, CUDNN_REDUCE_TENSOR_MAX, s3, mx);
        gb_pw(g, CUDNN_POINTWISE_SUB, s3, mx, NULL, sub);
        gb_pw(g, CUDNN_POINTWISE_EXP, sub, NULL, NULL, ex);
        gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, ex, sum);
        gb_pw(g, CUDNN_POINTWISE_LOG, sum, NULL, NULL, lg);
        gb_pw(g, CUDNN_POINTWISE_ADD, mx, lg, NULL, stats);
        gb_pw(g, CUDNN_POINTWISE_DIV, ex, sum, NULL, p);
        gb_matmul(g, p, v, o);
        return;
    }
    int64_t vtd[4] = { B, Hkv, Dh, T }, vts[4] = { T * Hkv * Dh, Dh, 1, Hkv * Dh };       /* V^T view */
    cudnnBackendDescriptor_t vt = gb_tensor(g, UID_V, BF, vtd, vts);
    cudnnBackendDescriptor_t o = gb_tensor(g, UID_O, BF, qd, qs);
    cudnnBackendDescriptor_t dout = gb_tensor(g, UID_DO, BF, qd, qs);
    cudnnBackendDescriptor_t dq = gb_tensor(g, UID_DQ, BF, qd, qs);
    cudnnBackendDescriptor_t dk = gb_tensor(g, UID_DK, BF, kd, ks);
    cudnnBackendDescriptor_t dv = gb_tensor(g, UID_DV, BF, kd, ks);
    cudnnBackendDescriptor_t onev = gb_tensor(g, UID_ONE, F, one, one, true);
    cudnnBackendDescriptor_t ssum = gb_tensor(g, UID_SOFTMAX_SUM, F, rd, rs);
    cudnnBackendDescriptor_t dqacc = gb_tensor(g, UID_DQ_ACCUM, F, hd, hs);
    /* D = rowsum(dO * O), kept in the workspace */
    cudnnBackendDescriptor_t dxo = gb_tensor(g, 0, F, qd, qs), dsum = gb_tensor(g, 0, F, rd, rs);
    gb_pw(g, CUDNN_POINTWISE_MUL, dout, o, NULL, dxo);
    gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dxo, dsum);
    gb_pw(g, CUDNN_POINTWISE_MUL, dsum, onev, NULL, ssum);
    /* P = exp(S * scale - Stats), masked */
    cudnnBackendDescriptor_t s1 = gb_tensor(g, 0, F, sd, ss), s2 = gb_tensor(g, 0, F, sd, ss);
    cudnnBackendDescriptor_t s3 = gb_tensor(g, 0, F, sd, ss), s4 = gb_tensor(g, 0, F, sd, ss);
    cudnnBackendDescriptor_t row = gb_tensor(g, 0, I, sd, ss), col = gb_tensor(g, 0, I, sd, ss);
    cudnnBackendDescriptor_t mask = gb_tensor(g, 0, BOOL, sd, ss), p = gb_tensor(g, 0, F, sd, ss);
    gb_matmul(g, q, kt, s1);
    gb_pw(g, CUDNN_POINTWISE_MUL, s1, scale, NULL, s2);
    gb_pw(g, CUDNN_POINTWISE_SUB, s2, stats, NULL, s3);
    gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, s3, NULL, NULL, row, 2);
    gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, s3, NULL, NULL, col, 3);
    gb_pw(g, CUDNN_POINTWISE_CMP_GE, row, col, NULL, mask, -1, BOOL);
    gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, s3, neginf, mask, s4);
    gb_pw(g, CUDNN_POINTWISE_EXP, s4, NULL, NULL, p);
    /* dV = P^T dO (summed over each group of query heads) */
    cudnnBackendDescriptor_t pt = gb_tensor(g, 0, BF, std_, sts);
    gb_reshape(g, p, pt);
    if (H == Hkv) gb_matmul(g, pt, dout, dv);
    else {
        cudnnBackendDescriptor_t dvh = gb_tensor(g, 0, BF, hd, hs);
        gb_matmul(g, pt, dout, dvh);
        gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dvh, dv);
    }
    /* dS = P * (dO V^T - D) * scale */
    cudnnBackendDescriptor_t dp = gb_tensor(g, 0, F, sd, ss), dp2 = gb_tensor(g, 0, F, sd, ss);
    cudnnBackendDescriptor_t ds1 = gb_tensor(g, 0, F, sd, ss), ds = gb_tensor(g, 0, F, sd, ss);
    gb_matmul(g, dout, vt, dp);
    gb_pw(g, CUDNN_POINTWISE_SUB, dp, ssum, NULL, dp2);
    gb_pw(g, CUDNN_POINTWISE_MUL, dp2, p, NULL, ds1);
    gb_pw(g, CUDNN_POINTWISE_MUL, ds1, scale, NULL, ds);
    /* dK = dS^T Q (summed over the group) */
    cudnnBackendDescriptor_t dst = gb_tensor(g, 0, BF, std_, sts);
    gb_reshape(g, ds, dst);
    if (H == Hkv) gb_matmul(g, dst, q, dk);
    else {
        cudnnBackendDescriptor_t dkh = gb_tensor(g, 0, BF, hd, hs);
        gb_matmul(g, dst, q, dkh);
        gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dkh, dk);
    }
    /* dQ = dS K, accumulated in fp32 in the workspace, then rounded */
    cudnnBackendDescriptor_t kr = gb_tensor(g, 0, BF, kd, ks);
    gb_reshape(g, kt, kr);
    gb_matmul(g, ds, kr, dqacc);
    gb_pw(g, CUDNN_POINTWISE_IDENTITY, dqacc, NULL, NULL, dq);
}

/* Build (once) and return the plan of a shape; NULL with the reason in the
 * cache entry when cuDNN refuses it. */
static dnn_plan_t *dnn_plan(bool bwd, int B, int T, int H, int Hkv, int Dh) {
    dnn_plan_t *free_slot = NULL;
    for (int i = 0; i < DNN_PLANS; i++) {
        dnn_plan_t *p = &g_plans[i];
        if (!p->used) { if (!free_slot) free_slot = p; continue; }
        if (p->bwd == bwd && p->B == B && p->T == T && p->H == H && p->Hkv == Hkv && p->Dh == Dh) return p;
    }
    dnn_plan_t *p = free_slot ? free_slot : &g_plans[DNN_PLANS - 1]; /* full: reuse the last slot */
    if (!free_slot && p->plan) g_dnn.destroyDesc(p->plan);
    memset(p, 0, sizeof *p);
    p->used = true; p->bwd = bwd; p->B = B; p->T = T; p->H = H; p->Hkv = Hkv; p->Dh = Dh;

    gb_t *g = (gb_t *)calloc(1, sizeof *g);
    if (!g) { snprintf(p->err, sizeof p->err, "out of host memory"); return p; }
    build_ops(g, bwd, B, T, H, Hkv, Dh);
    cudnnBackendDescriptor_t graph = gb_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops, "operation graph");
    gb_set(g, graph, 800 /* CUDNN_ATTR_OPERATIONGRAPH_HANDLE */, CUDNN_TYPE_HANDLE, 1, &g_dnn.handle, "operation graph");
    gb_finalize(g, graph, "operation graph");
    cudnnBackendDescriptor_t heur = gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristics");
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
    gb_finalize(g, heur, "heuristics");
    cudnnBackendDescriptor_t cfgs[8] = { 0 };
    int64_t ncfg = 0;
    if (!g->err[0]) {
        int made = 0;
        for (; made < 8; made++) {
            cfgs[made] = gb_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
            if (!cfgs[made]) break;
        }
        cudnnStatus_t st = g_dnn.getAttr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, made,
                                         &ncfg, cfgs);
        if (st != CUDNN_STATUS_SUCCESS) gb_fail(g, "heuristics results", st);
        else if (ncfg <= 0) snprintf(g->err, sizeof g->err, "no engine supports this graph");
    }
    char tried[512] = "";
    for (int64_t i = 0; !g->err[0] && i < ncfg && i < 8 && !p->plan; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if (g_dnn.createDesc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS) break;
        cudnnStatus_t st = g_dnn.setAttr(plan, (cudnnBackendAttributeName_t)400 /* EXECUTION_PLAN_HANDLE */,
                                         CUDNN_TYPE_HANDLE, 1, &g_dnn.handle);
        if (st == CUDNN_STATUS_SUCCESS)
            st = g_dnn.setAttr(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        if (st == CUDNN_STATUS_SUCCESS) st = g_dnn.finalize(plan);
        int64_t ws = 0, n = 0;
        if (st == CUDNN_STATUS_SUCCESS)
            st = g_dnn.getAttr(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
        if (st == CUDNN_STATUS_SUCCESS) { p->plan = plan; p->workspace = ws; break; }
        size_t l = strlen(tried);
        snprintf(tried + l, sizeof tried - l, "%sconfig %lld: %s", l ? "; " : "", (long long)i, g_dnn.getErrorString(st));
        g_dnn.destroyDesc(plan);
    }
    if (!p->plan && !g->err[0]) snprintf(g->err, sizeof g->err, "no engine config finalized (%s)", tried);
    if (!p->plan)
        snprintf(p->err, sizeof p->err, "cuDNN refused the %s attention graph for B %d T %d H %d Hkv %d Dh %d: %s",
                 bwd ? "backward" : "forward", B, T, H, Hkv, Dh, g->err);
    gb_free(g); /* the plan keeps what it needs */
    free(g);
    return p;
}

/* Run a plan with the tensors in uids/ptrs; the workspace holds cuDNN's
 * own part first, then the graph's workspace tensors (extra bytes). */
static int dnn_run(dnn_plan_t *p, const int64_t *uids, void **ptrs, int n, char *err, size_t errlen) {
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = g_dnn.createDesc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    void *ws = p->workspace ? cuda_scratch(SCRATCH_CUDNN, (size_t)p->workspace) : NULL;
    if (st == CUDNN_STATUS_SUCCESS)
        st = g_dnn.setAttr(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = g_dnn.setAttr(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS) st = g_dnn.setAttr(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (st == CUDNN_STATUS_SUCCESS) st = g_dnn.finalize(vp);
    if (st == CUDNN_STATUS_SUCCESS) st = g_dnn.execute(g_dnn.handle, p->plan, vp);
    if (vp) g_dnn.destroyDesc(vp);
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[256] = "";
        if (g_dnn.getLastErrorString) g_dnn.getLastErrorString(last, sizeof last);
        snprintf(err, errlen, "cudnnBackendExecute (%s attention, B %d T %d H %d Hkv %d Dh %d): %s%s%s",
                 p->bwd ? "backward" : "forward", p->B, p->T, p->H, p->Hkv, p->Dh, g_dnn.getErrorString(st),
                 last[0] ? ": " : "", last);
        return -1;
    }
    return 0;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* cuDNN attention on the compute stream. 0 when it ran; -1 with the reason
 * in err when cuDNN refuses the shape or the pointers (the caller runs our
 * kernels instead). */
int cudnn_attention_fwd(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int B, int T, int H,
                        int Hkv, int Dh, char *err, size_t errlen) {
    if (g_dnn_state <= 0 || !g_dnn.handle) { snprintf(err, errlen, "cuDNN is not loaded"); return -1; }
    if (!aligned16(out) || !aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(lse)) {
        snprintf(err, errlen, "a tensor is not 16-byte aligned");
        return -1;
    }
    dnn_plan_t *p = dnn_plan(false, B, T, H, Hkv, Dh);
    if (!p->plan) { snprintf(err, errlen, "%s", p->err); return -1; }
    float scale = (float)(1.0 / sqrt((double)Dh)), neginf = -INFINITY;
    int64_t uids[] = { UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEGINF };
    void *ptrs[] = { (void *)q, (void *)k, (void *)v, out, lse, &scale, &neginf };
    return dnn_run(p, uids, ptrs, 7, err, errlen);
}

int cudnn_attention_bwd(bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *out, const bf16 *q,
                        const bf16 *k, const bf16 *v, const float *lse, int B, int T, int H, int Hkv, int Dh,
                        char *err, size_t errlen) {
    if (g_dnn_state <= 0 || !g_dnn.handle) { snprintf(err, errlen, "cuDNN is not loaded"); return -1; }
    const void *all[] = { dq, dk, dv, dout, out, q, k, v, lse };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!aligned16(all[i])) { snprintf(err, errlen, "a tensor is not 16-byte aligned"); return -1; }
    dnn_plan_t *p = dnn_plan(true, B, T, H, Hkv, Dh);
    if (!p->plan) { snprintf(err, errlen, "%s", p->err); return -1; }
    /* the graph's own workspace tensors: D (B, H, T) and dQ's fp32
     * accumulator (B, H, T, Dh), zeroed (cuDNN before 9.6 needs it) */
    size_t rows = (size_t)B * H * T, acc = rows * Dh * sizeof(float), off = (rows * sizeof(float) + 255) / 256 * 256;
    char *extra = (char *)cuda_scratch(SCRATCH_ATTN, off + acc);
    float *ssum = (float *)extra, *dqacc = (float *)(extra + off);
    CUDA_CHECK(cudaMemsetAsync(dqacc, 0, acc, cuda_compute_stream()));
    float scale = (float)(1.0 / sqrt((double)Dh)), neginf = -INFINITY, one = 1.f;
    int64_t uids[] = { UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
                       UID_SOFTMAX_SUM, UID_DQ_ACCUM, UID_SCALE, UID_NEGINF, UID_ONE };
    void *ptrs[] = { (void *)q, (void *)k, (void *)v, (void *)out, (void *)lse, (void *)dout, dq, dk, dv,
                     ssum, dqacc, &scale, &neginf, &one };
    return dnn_run(p, uids, ptrs, 14, err, errlen);
}

/* Load the library and make its handle on the compute stream; 0 or -1 with
 * the reason in why. */
static int dnn_open(char *why, size_t n) {
    if (dnn_load()) { snprintf(why, n, "%s", g_dnn_why); return -1; }
    if (g_dnn.handle) return 0;
    cudnnHandle_t h = NULL;
    cudnnStatus_t st = g_dnn.create(&h);
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[256] = "";
        if (g_dnn.getLastErrorString) g_dnn.getLastErrorString(last, sizeof last);
        snprintf(why, n, "cuDNN %zu.%zu.%zu (%s): cudnnCreate: %s%s%s", g_dnn.version / 10000, g_dnn.version / 100 % 100,
                 g_dnn.version % 100, g_dnn.path, g_dnn.getErrorString(st), last[0] ? ": " : "", last);
        return -1;
    }
    st = g_dnn.setStream(h, cuda_compute_stream());
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(why, n, "cudnnSetStream: %s", g_dnn.getErrorString(st));
        return -1;
    }
    g_dnn.handle = h;
    return 0;
}

#else /* no cuDNN headers at build time */

int cudnn_attention_fwd(bf16 *, float *, const bf16 *, const bf16 *, const bf16 *, int, int, int, int, int, char *err,
                        size_t errlen) {
    snprintf(err, errlen, "built without cuDNN's headers");
    return -1;
}
int cudnn_attention_bwd(bf16 *, bf16 *, bf16 *, const bf16 *, const bf16 *, const bf16 *, const bf16 *, const bf16 *,
                        const float *, int, int, int, int, int, char *err, size_t errlen) {
    snprintf(err, errlen, "built without cuDNN's headers");
    return -1;
}
static int dnn_open(char *why, size_t n) {
    snprintf(why, n, "this build had no cuDNN headers (cudnn_backend.h: the CUDA toolkit's include directory, or "
             "pip's nvidia/cudnn/include)");
    return -1;
}
static struct { size_t version; } g_dnn;

#endif

/* ---- for attention.cu's choice ---- */

int cudnn_attention_open(char *why, size_t n) { return dnn_open(why, n); }
size_t cudnn_attention_version(void) { return g_dnn.version; }
