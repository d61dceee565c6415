/* table.cu: the CUDA backend's table (workers/backend/backend.h): device
 * start-up, memory, per-op timing, and the wiring of every op to its
 * launcher in the op's own file; backend_cuda_open applies the worker's
 * backend flags.
 *
 * act_t buffers are bf16 here (act_bytes = 2); float buffers fp32. Every op
 * is asynchronous on the compute stream except those that return host data
 * (to_host, act_to_host, sumsq), which wait for it. */
#define BALLAST_CUDA_WITH_CUBLAS
#include "workers/backend/cuda/common.cuh"

extern "C" {
#include "log.h"
}

#include <string.h>

/* ---- per-op timing ---- */

enum {
    P_EMB_F, P_EMB_B, P_RMS_F, P_RMS_B, P_MM_F, P_MM_B, P_ROPE_F, P_ROPE_B, P_ATT_F, P_ATT_B, P_SWI_F, P_SWI_B,
    P_XENT_F, P_XENT_B, P_ADAMW, P_ADD, P_SUMSQ, P_COPY, P_ATT_DEC, P_QKV_F, P_QKV_B, P_NOPS
};
static const char *const g_op_names[P_NOPS] = {
    "embedding_fwd", "embedding_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "matmul_fwd", "matmul_bwd", "rope_fwd",
    "rope_bwd", "attention_fwd", "attention_bwd", "swiglu_fwd", "swiglu_bwd", "xent_fwd", "xent_bwd", "adamw",
    "add", "sumsq", "copy/convert", "attention_decode", "qkv_split+rope", "qkv_pack+rope",
};

/* One timed op: its events, and what it did between them (launches,
 * cuBLASLt matmuls, host waits: deltas of cuda_counts; bytes: the operands
 * it reads once and the results it writes once, from its shapes, i.e. the
 * least traffic any implementation of the op has). */
typedef struct { int op; cudaEvent_t a, b; cuda_counts_t c0, c1; double bytes; } prof_rec_t;
static bool g_prof;
static prof_rec_t *g_recs;
static int g_nrecs, g_caprecs, g_nevents; /* events exist for the first g_nevents records */

static int prof_begin(int op, double bytes) {
    if (!g_prof) return -1;
    if (g_nrecs == g_caprecs) {
        int cap = g_caprecs ? 2 * g_caprecs : 1024;
        prof_rec_t *r = (prof_rec_t *)realloc(g_recs, (size_t)cap * sizeof *r);
        if (!r) return -1;
        g_recs = r;
        g_caprecs = cap;
    }
    prof_rec_t *r = &g_recs[g_nrecs];
    if (g_nrecs == g_nevents) {
        CUDA_CHECK(cudaEventCreate(&r->a));
        CUDA_CHECK(cudaEventCreate(&r->b));
        g_nevents++;
    }
    r->op = op;
    r->bytes = bytes;
    CUDA_CHECK(cudaEventRecord(r->a, cuda_compute_stream()));
    r->c0 = *cuda_counts();
    return g_nrecs++;
}

static void prof_end(int id) {
    if (id < 0) return;
    g_recs[id].c1 = *cuda_counts();
    CUDA_CHECK(cudaEventRecord(g_recs[id].b, cuda_compute_stream()));
}

/* body runs as op `op`, whose operands and results are `bytes` (double) */
#define TIMED(op, bytes, ...) do { int id_ = prof_begin(op, g_prof ? (double)(bytes) : 0.0); __VA_ARGS__; prof_end(id_); } while (0)

extern "C" void cuda_prof_enable(bool on) { g_prof = on; }
extern "C" void cuda_prof_reset(void) { g_nrecs = 0; }

extern "C" void cuda_prof_report(FILE *out) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_compute_stream()));
    double ms[P_NOPS] = { 0 }, mb[P_NOPS] = { 0 }, total = 0, tmb = 0;
    long calls[P_NOPS] = { 0 }, kern[P_NOPS] = { 0 }, gemms[P_NOPS] = { 0 }, waits[P_NOPS] = { 0 };
    long tcalls = 0, tkern = 0, tgemms = 0, twaits = 0;
    for (int i = 0; i < g_nrecs; i++) {
        const prof_rec_t *r = &g_recs[i];
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, r->a, r->b));
        ms[r->op] += t;
        calls[r->op]++;
        kern[r->op] += r->c1.launches - r->c0.launches;
        gemms[r->op] += r->c1.gemms - r->c0.gemms;
        waits[r->op] += r->c1.host_waits - r->c0.host_waits;
        mb[r->op] += r->bytes / 1e6;
        total += t;
    }
    int order[P_NOPS];
    for (int i = 0; i < P_NOPS; i++) order[i] = i;
    for (int i = 1; i < P_NOPS; i++)
        for (int j = i; j > 0 && ms[order[j]] > ms[order[j - 1]]; j--) { int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t; }
    fprintf(out, "%-16s %10s %6s %6s %8s %6s %6s %10s\n", "op", "ms", "share", "calls", "kernels", "gemms", "waits",
            "MB");
    for (int i = 0; i < P_NOPS; i++) {
        int o = order[i];
        if (!calls[o]) continue;
        fprintf(out, "%-16s %10.3f %5.1f%% %6ld %8ld %6ld %6ld %10.3f\n", g_op_names[o], ms[o],
                total > 0 ? 100.0 * ms[o] / total : 0.0, calls[o], kern[o], gemms[o], waits[o], mb[o]);
        tcalls += calls[o]; tkern += kern[o]; tgemms += gemms[o]; twaits += waits[o]; tmb += mb[o];
    }
    fprintf(out, "%-16s %10.3f %6s %6ld %8ld %6ld %6ld %10.3f\n", "total", total, "", tcalls, tkern, tgemms, twaits, tmb);
}

/* ---- table ops ---- */

#define BF(p) ((bf16 *)(void *)(p))
#define CBF(p) ((const bf16 *)(const void *)(p))

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_compute_stream()));
    return p;
}
static void cu_free(void *p) { if (p) CUDA_CHECK(cudaFree(p)); }
static void cu_memset0(void *p, size_t n) { CUDA_CHECK(cudaMemsetAsync(p, 0, n, cuda_compute_stream())); }
static void cu_copy(void *d, const void *s, size_t n) {
    if (d != s && n) TIMED(P_COPY, 2.0 * n, CUDA_CHECK(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, cuda_compute_stream())));
}
static void cu_to_host(void *h, const void *s, size_t n) {
    CUDA_CHECK(cudaMemcpyAsync(h, s, n, cudaMemcpyDeviceToHost, cuda_compute_stream()));
    cuda_host_wait(cuda_compute_stream());
}
static void cu_from_host(void *d, const void *h, size_t n) {
    CUDA_CHECK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, cuda_compute_stream()));
    cuda_host_wait(cuda_compute_stream());
}
static void cu_to_act(act_t *dst, const float *src, size_t n) { TIMED(P_COPY, 6.0 * n, launch_f32_to_bf16(BF(dst), src, n)); }
static void cu_act_to_host(float *host, const act_t *src, size_t n) {
    uint16_t *tmp = (uint16_t *)malloc(n * sizeof(uint16_t) + 1);
    if (!tmp) { fprintf(stderr, "%s:%d: out of host memory (%zu elements)\n", __FILE__, __LINE__, n); exit(1); }
    cu_to_host(tmp, src, n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) host[i] = cuda_bf16_to_f32(tmp[i]);
    free(tmp);
}

static void cu_add(act_t *out, const act_t *a, const act_t *b, size_t n) { TIMED(P_ADD, 6.0 * n, launch_add(BF(out), CBF(a), CBF(b), n)); }
static void cu_scale(float *x, float s, size_t n) { TIMED(P_ADD, 8.0 * n, launch_scale(x, s, n)); }
static double cu_sumsq(const float *x, size_t n) {
    double r = 0;
    TIMED(P_SUMSQ, 4.0 * n, r = cuda_sumsq_multi(&x, &n, 1));
    return r;
}

static void cu_embedding_fwd(act_t *out, const int32_t *tok, const act_t *wte, int N, int D) {
    TIMED(P_EMB_F, 4.0 * N * D + 4.0 * N, launch_embedding_fwd(BF(out), tok, CBF(wte), N, D));
}
static void cu_embedding_bwd(float *dwte, const act_t *dout, const int32_t *tok, int N, int D) {
    TIMED(P_EMB_B, 10.0 * N * D + 4.0 * N, launch_embedding_bwd(dwte, CBF(dout), tok, N, D));
}
static void cu_rmsnorm_fwd(act_t *out, float *rstd, const act_t *x, const act_t *w, int N, int D, float eps) {
    TIMED(P_RMS_F, 4.0 * N * D + 2.0 * D + 4.0 * N, launch_rmsnorm_fwd(BF(out), rstd, CBF(x), CBF(w), N, D, eps));
}
static void cu_rmsnorm_bwd(act_t *dx, float *dw, const act_t *dout, const act_t *x, const act_t *w, const float *rstd,
                           int N, int D) {
    TIMED(P_RMS_B, 4.0 * N * D + 2.0 * D + 4.0 * N + (dx ? 4.0 * N * D : 0.0) + (dw ? 8.0 * D : 0.0), launch_rmsnorm_bwd(BF(dx), dw, CBF(dout), CBF(x), CBF(w), rstd, N, D));
}
static void cu_matmul_fwd(act_t *out, const act_t *x, const act_t *w, int N, int I, int O) {
    TIMED(P_MM_F, 2.0 * ((double)N * I + (double)I * O + (double)N * O), gemm_fwd(BF(out), CBF(x), CBF(w), N, I, O));
}
/* dx (N, I): dout (N, O) and w (O, I) in, dx out (and in when it
 * accumulates); dw (O, I) fp32: x and dout in, dw in and out */
static double mm_bwd_bytes(bool dx, bool dw, int N, int I, int O, bool dx_acc) {
    double n = N, i = I, o = O;
    return (dx ? 2.0 * (n * o + o * i + n * i * (dx_acc ? 2 : 1)) : 0.0) + (dw ? 2.0 * (n * i + n * o) + 8.0 * o * i : 0.0);
}
static void cu_matmul_bwd(act_t *dx, float *dw, const act_t *dout, const act_t *x, const act_t *w, int N, int I, int O,
                          bool dx_acc) {
    TIMED(P_MM_B, mm_bwd_bytes(dx != NULL, dw != NULL, N, I, O, dx_acc), gemm_bwd(BF(dx), dw, CBF(dout), CBF(x), CBF(w), N, I, O, dx_acc));
}
static void cu_rope_fwd(act_t *x, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r) {
    TIMED(P_ROPE_F, 4.0 * B * T * nh * Dh + 4.0 * T * Dh, launch_rope(BF(x), B, T, nh, Dh, pos0, r, false));
}
static void cu_rope_bwd(act_t *dx, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r) {
    TIMED(P_ROPE_B, 4.0 * B * T * nh * Dh + 4.0 * T * Dh, launch_rope(BF(dx), B, T, nh, Dh, pos0, r, true));
}
static void cu_attention_fwd(act_t *out, float *att, const act_t *q, const act_t *k, const act_t *v, int B, int T,
                             int H, int Hkv, int Dh) {
    TIMED(P_ATT_F, (double)B * T * (2.0 * H * Dh * 2 + 2.0 * Hkv * Dh * 2 + 4.0 * H), launch_attention_fwd(BF(out), att, CBF(q), CBF(k), CBF(v), B, T, H, Hkv, Dh));
}
static size_t cu_attention_state_numel(int B, int T, int H) { return (size_t)B * H * T; }
static void cu_attention_decode(act_t *out, const act_t *q, const act_t *kc, const act_t *vc, int n, int p0, int H,
                                int Hkv, int Dh) {
    TIMED(P_ATT_DEC, (double)n * H * Dh * 2 * 2 + (double)(p0 + n) * Hkv * Dh * 2 * 2, launch_attention_decode(BF(out), CBF(q), CBF(kc), CBF(vc), n, p0, H, Hkv, Dh));
}
static void cu_attention_bwd(act_t *dq, act_t *dk, act_t *dv, const act_t *dout, const act_t *out, const act_t *q,
                             const act_t *k, const act_t *v, const float *att, int B, int T, int H, int Hkv, int Dh) {
    TIMED(P_ATT_B, (double)B * T * (4.0 * H * Dh * 2 + 4.0 * Hkv * Dh * 2 + 4.0 * H), launch_attention_bwd(BF(dq), BF(dk), BF(dv), CBF(dout), CBF(out), CBF(q), CBF(k), CBF(v), att, B, T,
                                        H, Hkv, Dh));
}
static void cu_swiglu_fwd(act_t *h, const act_t *g, const act_t *u, size_t n) {
    TIMED(P_SWI_F, 6.0 * n, launch_swiglu_fwd(BF(h), CBF(g), CBF(u), n));
}
static void cu_swiglu_bwd(act_t *dg, act_t *du, const act_t *dh, const act_t *g, const act_t *u, size_t n) {
    TIMED(P_SWI_B, 10.0 * n, launch_swiglu_bwd(BF(dg), BF(du), CBF(dh), CBF(g), CBF(u), n));
}
static void cu_xent_fwd(float *losses, const act_t *logits, const int32_t *tgt, int N, int V) {
    TIMED(P_XENT_F, 2.0 * N * V + 8.0 * N, launch_xent_fwd(losses, CBF(logits), tgt, N, V));
}
static void cu_xent_bwd(act_t *dl, const act_t *logits, const int32_t *tgt, float scale, int N, int V) {
    TIMED(P_XENT_B, 4.0 * N * V + 4.0 * N, launch_xent_bwd(BF(dl), CBF(logits), tgt, scale, N, V));
}
static void cu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                     float eps, float wd, float step_size, float bc2_sqrt, float grad_scale, act_t *p_act) {
    cuda_adamw_tensor_t t = { p, g, m, v, p_act, n, true };
    TIMED(P_ADAMW, (p_act ? 30.0 : 28.0) * n, cuda_adamw_multi(&t, 1, lr, beta1, beta2, eps, wd, step_size, bc2_sqrt, grad_scale));
}

/* ---- fused paths (backend.h) ---- */

static void cu_qkv_split_rope(act_t *q, act_t *k, act_t *v, const act_t *qkv, int B, int T, int H, int Hkv, int Dh,
                              int pos0, const be_rope_t *r) {
    TIMED(P_QKV_F, 4.0 * B * T * (H + 2 * Hkv) * Dh + 4.0 * T * Dh,
          launch_qkv_split_rope(BF(q), BF(k), BF(v), CBF(qkv), B, T, H, Hkv, Dh, pos0, r));
}
static void cu_qkv_pack_rope(act_t *dqkv, const act_t *dq, const act_t *dk, const act_t *dv, int B, int T, int H,
                             int Hkv, int Dh, int pos0, const be_rope_t *r) {
    TIMED(P_QKV_B, 4.0 * B * T * (H + 2 * Hkv) * Dh + 4.0 * T * Dh,
          launch_qkv_pack_rope(BF(dqkv), CBF(dq), CBF(dk), CBF(dv), B, T, H, Hkv, Dh, pos0, r));
}
static void cu_swiglu_gu_fwd(act_t *h, const act_t *gu, int N, int F) {
    TIMED(P_SWI_F, 6.0 * N * F, launch_swiglu_gu_fwd(BF(h), CBF(gu), N, F));
}
static void cu_swiglu_gu_bwd(act_t *dgu, const act_t *dh, const act_t *gu, int N, int F) {
    TIMED(P_SWI_B, 10.0 * N * F, launch_swiglu_gu_bwd(BF(dgu), CBF(dh), CBF(gu), N, F));
}
static void cu_matmul_fwd_res(act_t *out, const act_t *res, const act_t *x, const act_t *w, int N, int I, int O) {
    TIMED(P_MM_F, 2.0 * ((double)N * I + (double)I * O + 2.0 * N * O), {
        if (!gemm_fwd_res(BF(out), CBF(res), CBF(x), CBF(w), N, I, O)) {
            /* fp8: its GEMM, then the add */
            bf16 *tmp = (bf16 *)cuda_scratch(SCRATCH_MMRES, (size_t)N * O * sizeof(bf16));
            gemm_fwd(tmp, CBF(x), CBF(w), N, I, O);
            launch_add(BF(out), CBF(res), tmp, (size_t)N * O);
        }
    });
}
static void cu_adamw_spans(float *p, const float *g, float *m, float *v, act_t *p_act, const be_span_t *spans, int n,
                           float lr, float beta1, float beta2, float eps, float wd, float step_size, float bc2_sqrt,
                           float grad_scale) {
    enum { CHUNK = 256 };
    cuda_adamw_tensor_t ts[CHUNK];
    double elems = 0;
    for (int i = 0; i < n; i++) elems += (double)spans[i].n;
    TIMED(P_ADAMW, (p_act ? 30.0 : 28.0) * elems, {
        for (int s0 = 0; s0 < n; s0 += CHUNK) {
            int c = n - s0 < CHUNK ? n - s0 : CHUNK;
            for (int i = 0; i < c; i++) {
                const be_span_t *sp = &spans[s0 + i];
                ts[i].p = p + sp->offset; ts[i].g = g + sp->offset; ts[i].m = m + sp->offset; ts[i].v = v + sp->offset;
                ts[i].p_act = p_act ? (act_t *)(void *)(BF(p_act) + sp->offset) : NULL;
                ts[i].n = sp->n;
                ts[i].decay = sp->decay;
            }
            cuda_adamw_multi(ts, c, lr, beta1, beta2, eps, wd, step_size, bc2_sqrt, grad_scale);
        }
    });
}

static backend_t g_table;
static int g_device = -1;
static char g_device_name[256]; /* cudaDeviceProp.name of g_device */

extern "C" const char *cuda_device_name(void) { return g_device >= 0 ? g_device_name : NULL; }

void cuda_parallel_fill(backend_t *t); /* parallel.cu: the sharded / tensor-parallel ops */
void cuda_ring_fill(backend_t *t);     /* ring.cu: ring attention (context parallelism) */

/* ---- start-up ---- */

enum { CUDA_FUSED_QKV = 1, CUDA_FUSED_GU = 2, CUDA_FUSED_RES = 4, CUDA_FUSED_ADAMW = 8, CUDA_FUSED_ALL = 15 };

/* BALLAST_CUDA_FUSED: unset or "1" all fused paths, "0" none, or a comma
 * list of qkv, gu, res, adamw. Returns 0, or -1 with the message in err. */
static int cuda_fused_parse(const char *v, unsigned *out, char *err, size_t errlen) {
    static const char *const names[] = { "qkv", "gu", "res", "adamw" };
    *out = CUDA_FUSED_ALL;
    if (!v || strcmp(v, "1") == 0) return 0;
    *out = 0;
    if (strcmp(v, "0") == 0) return 0;
    const char *s = v;
    do {
        size_t len = strcspn(s, ",");
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (strlen(names[i]) == len && strncmp(s, names[i], len) == 0) k = i;
        if (k < 0) {
            snprintf(err, errlen,
                     "BALLAST_CUDA_FUSED='%s': expected 1 (all fused paths, the default), 0 (the separate ops) "
                     "or a comma list of qkv, gu, res, adamw", v);
            return -1;
        }
        *out |= 1u << k;
        s += len;
    } while (*s++ == ',');
    return 0;
}

extern "C" const backend_t *backend_cuda(int device, char *err, size_t errlen) {
    if (g_device >= 0) {
        if (device != g_device) {
            snprintf(err, errlen, "the CUDA backend already drives GPU %d; one GPU per process", g_device);
            return NULL;
        }
        return &g_table;
    }
    char why[256];
    int n = cuda_device_count(why, sizeof why);
    if (n == 0) {
        snprintf(err, errlen, "no usable GPU: %s; hint: check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES", why);
        return NULL;
    }
    if (device < 0 || device >= n) {
        snprintf(err, errlen, "GPU %d does not exist (%d visible); hint: pick 0..%d or set CUDA_VISIBLE_DEVICES", device, n, n - 1);
        return NULL;
    }
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaFree(0); /* creates the context now, so failures show here */
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cannot start GPU %d: %s (%s)", device, cudaGetErrorName(e), cudaGetErrorString(e));
        return NULL;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 8) {
        snprintf(err, errlen, "GPU %d (%s) is compute capability %d.%d; the CUDA backend needs bf16 tensor cores (8.0 or newer)",
                 device, prop.name, prop.major, prop.minor);
        return NULL;
    }
    cuda_streams_init();
    lt_init();
    backend_t t;
    memset(&t, 0, sizeof t);
    t.name = "cuda";
    t.act_bytes = 2;
    t.host_memory = false;
    t.device_name = cuda_device_name;
    t.host_register = cuda_host_register;
    t.host_unregister = cuda_host_unregister;
    t.alloc = cu_alloc; t.free = cu_free; t.memset0 = cu_memset0; t.copy = cu_copy;
    t.to_host = cu_to_host; t.from_host = cu_from_host; t.to_act = cu_to_act; t.act_to_host = cu_act_to_host;
    t.add = cu_add; t.scale = cu_scale; t.sumsq = cu_sumsq;
    t.embedding_fwd = cu_embedding_fwd; t.embedding_bwd = cu_embedding_bwd;
    t.rmsnorm_fwd = cu_rmsnorm_fwd; t.rmsnorm_bwd = cu_rmsnorm_bwd;
    t.matmul_fwd = cu_matmul_fwd; t.matmul_bwd = cu_matmul_bwd;
    t.rope_fwd = cu_rope_fwd; t.rope_bwd = cu_rope_bwd;
    t.attention_fwd = cu_attention_fwd; t.attention_state_numel = cu_attention_state_numel;
    t.attention_bwd = cu_attention_bwd;
    t.attention_decode = cu_attention_decode;
    t.swiglu_fwd = cu_swiglu_fwd; t.swiglu_bwd = cu_swiglu_bwd;
    t.xent_fwd = cu_xent_fwd; t.xent_bwd = cu_xent_bwd;
    t.adamw = cu_adamw;
    /* The fused paths (packed QKV and gate|up GEMMs, the GEMM with the
     * residual add, multi-tensor AdamW): all of them by default; 0 runs the
     * separate ops; a comma list (qkv,gu,res,adamw) picks some, for bisecting. */
    unsigned fused;
    if (cuda_fused_parse(getenv("BALLAST_CUDA_FUSED"), &fused, err, errlen)) return NULL;
    if (fused & CUDA_FUSED_QKV) { t.qkv_split_rope = cu_qkv_split_rope; t.qkv_pack_rope = cu_qkv_pack_rope; }
    if (fused & CUDA_FUSED_GU) { t.swiglu_gu_fwd = cu_swiglu_gu_fwd; t.swiglu_gu_bwd = cu_swiglu_gu_bwd; }
    if (fused & CUDA_FUSED_RES) t.matmul_fwd_res = cu_matmul_fwd_res;
    if (fused & CUDA_FUSED_ADAMW) t.adamw_spans = cu_adamw_spans;
    cuda_parallel_fill(&t);
    cuda_ring_fill(&t);
    t.xfer_to_host = cuda_xfer_to_host; t.xfer_from_host = cuda_xfer_from_host;
    t.xfer_order = cuda_xfer_order; t.xfer_wait = cuda_xfer_wait; t.xfer_done = cuda_xfer_done;
    t.stream = cuda_compute_stream_ptr;
    t.op_scope = cuda_op_scope;
    g_table = t;
    snprintf(g_device_name, sizeof g_device_name, "%s", prop.name);
    g_device = device;
    return &g_table;
}

extern "C" const backend_t *backend_cuda_open(const backend_spec_t *spec, char *err, size_t errlen) {
    char why[768];
    const backend_t *be = backend_cuda(spec->device, why, sizeof why);
    if (!be) {
        snprintf(err, errlen, "--backend cuda: %s", why);
        return NULL;
    }
    if (spec->fp8 && cuda_set_precision(CUDA_PRECISION_FP8, err, errlen)) return NULL;
    static const char *const att_names[] = { "auto", "cudnn", "own", "tc", "simt" };
    char att_msg[1536];
    if (cuda_attention_select(att_names[spec->attention], att_msg, sizeof att_msg)) {
        snprintf(err, errlen, "%s", att_msg);
        return NULL;
    }
    log_info("%s", att_msg);
    cuda_set_sync(spec->sync);
    return be;
}
