/* backend.h: the table of compute operations the model runs on.
 *
 * The model never touches activation or parameter memory itself: it
 * allocates through the table and calls one op per layer step. The CPU
 * backend (backend_cpu.c, fp32, the oracle) fills it today; the CUDA backend
 * (bf16 storage, fp32 accumulation) fills the same table later.
 *
 * Conventions for every op:
 *   - pointers are backend memory (from ->alloc), except where a parameter is
 *     documented as host memory;
 *   - N = rows (B*T tokens), D = model width, V = vocabulary, H / Hkv = query
 *     and key/value heads, Dh = head width, F = MLP width;
 *   - matrices are row-major; weights are stored (out, in) as in PyTorch and
 *     Hugging Face checkpoints;
 *   - "accumulates" means +=, so gradients sum over micro-batches; everything
 *     else overwrites its output;
 *   - ops are deterministic: the same inputs give bit-identical outputs
 *     whatever the thread count (checkpoint resume and activation
 *     checkpointing rely on it);
 *   - storage precision: pointers typed act_t hold activations, the working
 *     copy of the parameters, logits and activation gradients, in elements of
 *     act_bytes bytes (4: fp32 on the CPU; 2: bf16 on CUDA). Pointers typed
 *     float are fp32 on every backend: norm statistics, losses, parameter
 *     gradients, optimizer moments, the fp32 master parameters and the
 *     attention state. Callers never index act_t memory directly: offsets go
 *     through be_act_at(), sizes through act_bytes. */
#ifndef BALLAST_BACKEND_H
#define BALLAST_BACKEND_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* An element of activation storage as callers see it: fp32 on the CPU
 * backend; the CUDA backend keeps bf16 behind the same pointers. The alias
 * says which buffers follow act_bytes; it is never dereferenced by callers. */
typedef float act_t;

/* One tensor of the flat buffers (backend_t.adamw_spans). */
typedef struct be_span {
    size_t offset, n;
    bool decay;
} be_span_t;

/* A range of host memory (backend_t.host_register). */
typedef struct {
    void *base;
    size_t bytes;
} be_range_t;

/* The rotary embedding's frequencies: Hugging Face's rope_theta and
 * rope_scaling ("default", "linear", "llama3"). */
typedef enum { BE_ROPE_DEFAULT = 0, BE_ROPE_LINEAR = 1, BE_ROPE_LLAMA3 = 2 } be_rope_type_t;
typedef struct {
    float theta;              /* rope_theta */
    be_rope_type_t type;
    float factor;             /* linear, llama3: how much longer the context became */
    float low_freq_factor;    /* llama3 */
    float high_freq_factor;   /* llama3 */
    int original_max_pos;     /* llama3: original_max_position_embeddings */
} be_rope_t;

/* Inverse frequency of pair (i, i + Dh/2), in double; every backend builds
 * its angles from it. Default: theta^(-2i/Dh). Linear: that / factor.
 * Llama 3 (transformers' _compute_llama3_parameters): with wavelength
 * w = 2 pi / f and C = original_max_pos, frequencies whose w exceeds
 * C / low_freq_factor are divided by factor, those whose w is under
 * C / high_freq_factor stay, and in between they blend,
 * (1 - s) f / factor + s f with s = (C / w - low) / (high - low). */
static inline double be_rope_inv_freq(const be_rope_t *r, int Dh, int i) {
    double f = 1.0 / pow((double)r->theta, (2.0 * i) / Dh);
    if (r->type == BE_ROPE_LINEAR) return f / r->factor;
    if (r->type != BE_ROPE_LLAMA3) return f;
    double C = (double)r->original_max_pos, lo = r->low_freq_factor, hi = r->high_freq_factor;
    double w = 2.0 * 3.14159265358979323846 / f;
    if (w > C / lo) return f / r->factor;
    if (w < C / hi) return f;
    double s = (C / w - lo) / (hi - lo);
    return (1.0 - s) * f / r->factor + s * f;
}

typedef struct backend {
    const char *name;
    int act_bytes;                                /* bytes per act_t element: 4 (fp32) or 2 (bf16) */

    /* ---- capabilities: what callers may assume of this backend ---- */
    /* Backend memory is ordinary host memory the host may read and write
     * directly (the fp32 CPU backend): the offload savers compute on
     * ballastd's pool in place and collectives take it without staging.
     * False: every access goes through the copy ops. */
    bool host_memory;
    /* The device this backend drives, for logs and the MFU table ("cpu",
     * "NVIDIA H200", ...). NULL: name. */
    const char *(*device_name)(void);

    /* ---- memory ---- */
    void *(*alloc)(size_t bytes);                 /* zeroed; NULL when out of memory */
    void (*free)(void *p);
    void (*memset0)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);          /* backend -> backend */
    void (*to_host)(void *host_dst, const void *src, size_t bytes);  /* backend -> host */
    void (*from_host)(void *dst, const void *host_src, size_t bytes);/* host -> backend */
    /* act dst (n) = fp32 src (n), both backend memory (rounded to bf16 on CUDA) */
    void (*to_act)(act_t *dst, const float *src, size_t n);
    /* host fp32 (n) = act src (n) */
    void (*act_to_host)(float *host_dst, const act_t *src, size_t n);

    /* ---- elementwise ---- */
    /* out[n] = a[n] + b[n]; out may alias a or b */
    void (*add)(act_t *out, const act_t *a, const act_t *b, size_t n);
    /* x[n] *= s */
    void (*scale)(float *x, float s, size_t n);
    /* sum of x[i]^2 over n elements, accumulated in double; result on the host */
    double (*sumsq)(const float *x, size_t n);

    /* ---- embedding ---- */
    /* out (N, D) = wte[tokens[i]] ; tokens (N) int32, already checked < V */
    void (*embedding_fwd)(act_t *out, const int32_t *tokens, const act_t *wte, int N, int D);
    /* dwte (V, D) accumulates dout (N, D) rows at tokens */
    void (*embedding_bwd)(float *dwte, const act_t *dout, const int32_t *tokens, int N, int D);

    /* ---- RMSNorm (Hugging Face LlamaRMSNorm) ---- */
    /* out (N, D) = w (D) * x / sqrt(mean(x^2) + eps); rstd (N) keeps 1/sqrt(...) */
    void (*rmsnorm_fwd)(act_t *out, float *rstd, const act_t *x, const act_t *w, int N, int D, float eps);
    /* dx (N, D) accumulates, dw (D) accumulates */
    void (*rmsnorm_bwd)(act_t *dx, float *dw, const act_t *dout, const act_t *x, const act_t *w,
                        const float *rstd, int N, int D);

    /* ---- matmul with (out, in) weights: y = x W^T ---- */
    /* out (N, O) = x (N, I) @ w (O, I)^T */
    void (*matmul_fwd)(act_t *out, const act_t *x, const act_t *w, int N, int I, int O);
    /* dx (N, I) = dout (N, O) @ w (overwritten, or accumulated when dx_acc);
     * dw (O, I) accumulates dout^T @ x. Either output may be NULL. */
    void (*matmul_bwd)(act_t *dx, float *dw, const act_t *dout, const act_t *x, const act_t *w,
                       int N, int I, int O, bool dx_acc);

    /* ---- rotary position embedding, rotate-half form, in place ---- */
    /* x (B, T, nh, Dh): position of row t is pos0 + t; pair (i, i + Dh/2)
     * turns by position * be_rope_inv_freq(r, Dh, i); r is host memory. */
    void (*rope_fwd)(act_t *x, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r);
    /* the inverse rotation applied to a gradient (B, T, nh, Dh) in place */
    void (*rope_bwd)(act_t *dx, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r);

    /* ---- causal attention with grouped-query heads ---- */
    /* q (B, T, H, Dh), k, v (B, T, Hkv, Dh), out (B, T, H, Dh);
     * query head h reads key/value head h / (H / Hkv); scale 1/sqrt(Dh).
     * att (B, H, T, T) keeps the softmax probabilities for backward (a
     * backend may keep less, e.g. log-sum-exp rows, in the same buffer:
     * attention_state_numel says how many floats it needs). */
    void (*attention_fwd)(act_t *out, float *att, const act_t *q, const act_t *k, const act_t *v,
                          int B, int T, int H, int Hkv, int Dh);
    size_t (*attention_state_numel)(int B, int T, int H);
    /* dq overwritten; dk, dv (B, T, Hkv, Dh) overwritten; out is the
     * forward's output (a flash backward needs rowsum(dout * out)) */
    void (*attention_bwd)(act_t *dq, act_t *dk, act_t *dv, const act_t *dout, const act_t *out,
                          const act_t *q, const act_t *k, const act_t *v, const float *att,
                          int B, int T, int H, int Hkv, int Dh);

    /* ---- ring attention (context parallelism, workers/model/model.c) ----
     * One (query chunk, key/value chunk) pair of a causal attention whose
     * sequence is split in chunks: q (Tq, H, Dh) of one row, k, v (Tk, Hkv,
     * Dh); query head h reads kv head h / (H / Hkv), scale 1/sqrt(Dh).
     * causal: the diagonal pair (Tq == Tk, same positions: query t sees keys
     * 0..t); otherwise every key (a chunk wholly before the queries).
     *   attn_block_fwd  out (Tq, H, Dh) and lse (Tq, H) fp32 of this pair alone:
     *                   lse[t, h] = log sum over the keys of exp(score)
     *   attn_merge      out, lse (the pairs merged so far) take in the pair
     *                   out_b, lse_b exactly: lse' = log(e^lse + e^lse_b),
     *                   out' = out e^(lse - lse') + out_b e^(lse_b - lse')
     *   attn_block_bwd  dq (Tq, H, Dh), dk, dv (Tk, Hkv, Dh) accumulate this
     *                   pair's part, given out, lse of the whole rows (all
     *                   pairs merged) and dout: P = exp(score - lse),
     *                   dS = P (dout . v - rowsum(dout * out))
     * NULL in a table without them: context parallelism is refused. */
    void (*attn_block_fwd)(act_t *out, float *lse, const act_t *q, const act_t *k, const act_t *v, int Tq, int Tk,
                           int H, int Hkv, int Dh, bool causal);
    void (*attn_merge)(act_t *out, float *lse, const act_t *out_b, const float *lse_b, int Tq, int H, int Dh);
    void (*attn_block_bwd)(act_t *dq, act_t *dk, act_t *dv, const act_t *dout, const act_t *out, const float *lse,
                           const act_t *q, const act_t *k, const act_t *v, int Tq, int Tk, int H, int Hkv, int Dh,
                           bool causal);

    /* ---- attention of new rows over a KV cache (decoding) ---- */
    /* q (n, H, Dh) at positions p0..p0+n-1; kc, vc (P, Hkv, Dh) hold the
     * keys and values of positions 0..p0+n-1 (P >= p0 + n); out (n, H, Dh):
     * row i's query heads over cache positions 0..p0+i, softmax with scale
     * 1/sqrt(Dh), query head h reading kv head h / (H / Hkv). The same
     * numbers as attention_fwd's rows on the whole sequence. */
    void (*attention_decode)(act_t *out, const act_t *q, const act_t *kc, const act_t *vc, int n, int p0, int H,
                             int Hkv, int Dh);

    /* ---- SwiGLU: h = silu(gate) * up, n elements ---- */
    void (*swiglu_fwd)(act_t *h, const act_t *gate, const act_t *up, size_t n);
    void (*swiglu_bwd)(act_t *dgate, act_t *dup, const act_t *dh, const act_t *gate, const act_t *up, size_t n);

    /* ---- softmax cross-entropy over V classes ---- */
    /* losses (N) = logsumexp(logits[i]) - logits[i][targets[i]] */
    void (*xent_fwd)(float *losses, const act_t *logits, const int32_t *targets, int N, int V);
    /* dlogits (N, V) = (softmax(logits) - onehot(targets)) * scale;
     * dlogits may alias logits */
    void (*xent_bwd)(act_t *dlogits, const act_t *logits, const int32_t *targets, float scale, int N, int V);

    /* ---- optimizer ---- */
    /* torch.optim.AdamW on n elements, one step:
     *   p -= lr * wd * p
     *   g' = g * grad_scale
     *   m = beta1 m + (1 - beta1) g' ;  v = beta2 v + (1 - beta2) g'^2
     *   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
     * with step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t) from the caller.
     * p is the fp32 master; p_act (n), when not NULL, receives the updated
     * p in act storage (the bf16 working copy on CUDA). */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float wd, float step_size, float bc2_sqrt, float grad_scale,
                  act_t *p_act);

    /* ---- sharded and tensor-parallel training (fsdp.c, tp.c) ---- */
    /* y[n] += x[n], fp32 (a reduce-scatter result into a gradient chunk) */
    void (*acc)(float *y, const float *x, size_t n);
    /* gradients reduced in bf16 (--grad-reduce-dtype bf16): dst (n bf16,
     * backend memory) = src (n fp32) rounded to nearest, ties to even;
     * y (n fp32) += x (n bf16) widened; y = x widened */
    void (*to_bf16)(void *dst, const float *src, size_t n);
    void (*acc_bf16)(float *y, const void *x, size_t n);
    void (*from_bf16)(float *y, const void *x, size_t n);
    /* host memory the device copies to and from at full speed (pinned on
     * CUDA, plain on the CPU) for staging collectives: zeroed; NULL when out
     * of memory. Host memory, not backend memory. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    /* Make n ranges of host memory that someone else allocated (ballastd's
     * pool segments) copy at full speed: pinned for DMA on CUDA. Returns a
     * handle for host_unregister, also when pinning failed and copies stay
     * pageable (one warning says why); NULL with a message in err on bad
     * ranges or no device. The ranges stay mapped until host_unregister.
     * NULL in the table: host memory needs nothing (the CPU). */
    struct be_pinned *(*host_register)(const be_range_t *ranges, int n, char *err, size_t errlen);
    void (*host_unregister)(struct be_pinned *p);
    /* Vocab-parallel embedding over the slice [lo, lo + Vt) of the
     * vocabulary: out (N, D) row i = wte (Vt, D) row tokens[i] - lo when
     * the token is in the slice, zeros otherwise. */
    void (*vp_embedding_fwd)(act_t *out, const int32_t *tokens, const act_t *wte, int N, int D, int64_t lo, int Vt);
    /* dwte (Vt, D) accumulates the dout (N, D) rows whose token is in the
     * slice, summed in token order */
    void (*vp_embedding_bwd)(float *dwte, const act_t *dout, const int32_t *tokens, int N, int D, int64_t lo,
                             int Vt);
    /* Vocab-parallel cross-entropy over logits (N, Vt), one rank's columns
     * lo .. lo + Vt - 1 of the full logits, of which the first nv are real
     * vocabulary entries (the rest padding, never read):
     *   vp_xent_max     mx (N) = the row max over the nv columns (-inf when nv = 0)
     *   vp_xent_stats   mx (N) = max over t < T of all_mx (T, N) [t * N + i] (the
     *                   global row max); st (2N): st[i] = sum over the nv columns of
     *                   exp(l - mx[i]), st[N + i] = the logit of column targets[i] - lo
     *                   when that is in 0..nv-1, 0 otherwise
     *   vp_xent_finish  after st is summed over the group: lse (N) = log(st[i]) + mx[i],
     *                   losses (N) = lse - st[N + i]
     *   vp_xent_bwd     dl (N, Vt) = (exp(l - lse[i]) - onehot(targets[i] - lo)) * scale
     *                   over the nv columns, 0 on the padding; dl may alias logits
     * targets (N) int32 backend memory; the others backend memory. */
    void (*vp_xent_max)(float *mx, const act_t *logits, int N, int Vt, int nv);
    void (*vp_xent_stats)(float *st, float *mx, const float *all_mx, int T, const act_t *logits,
                          const int32_t *targets, int N, int Vt, int nv, int64_t lo);
    void (*vp_xent_finish)(float *losses, float *lse, const float *st, const float *mx, int N);
    void (*vp_xent_bwd)(act_t *dl, const act_t *logits, const float *lse, const int32_t *targets, float scale, int N,
                        int Vt, int nv, int64_t lo);

    /* ---- asynchronous copies between backend and host memory ----
     * The offload paths move block inputs and optimizer state on copy
     * streams so that a step does not wait on them. A copy is queued
     * after every op queued so far (it reads what they wrote, and
     * overwrites what they read only after they are done) and runs while
     * later ops compute. Host memory should be pinned (host_alloc, or the
     * registered ballastd pool) for the copy to overlap. The handle:
     *   xfer_order  ops queued from now on run after the copy, without a
     *               host wait (a device buffer filled by xfer_from_host is
     *               read, or one read by xfer_to_host is overwritten)
     *   xfer_wait   the host blocks until the copy is done (its host data
     *               is complete, or its host source may be reused), and
     *               the handle is freed: every handle ends with exactly
     *               one xfer_wait
     *   xfer_done   whether it is done, without blocking (never spin on
     *               it: a backend may only run copies at xfer_order or
     *               xfer_wait)
     * NULL handles are complete. The ops may be NULL in a table: callers
     * use the be_xfer_* wrappers below, which copy synchronously then.
     * stream returns the compute stream (cudaStream_t) that collectives
     * order themselves against (comm_stream_wait), or NULL on the CPU. */
    struct be_xfer *(*xfer_to_host)(void *host_dst, const void *src, size_t bytes);
    struct be_xfer *(*xfer_from_host)(void *dst, const void *host_src, size_t bytes);
    void (*xfer_order)(struct be_xfer *x);
    void (*xfer_wait)(struct be_xfer *x);
    bool (*xfer_done)(struct be_xfer *x);
    /* Copies queued and not yet run (0 after a step whose copies were all
     * waited for; the offload savers check it). NULL: copies never wait. */
    size_t (*xfer_pending)(void);
    void *(*stream)(void);
    /* The ops that follow belong to scope s (a block index; -1: none, the
     * default). Backends that keep per-tensor state across steps (FP8
     * delayed scaling) key it by (scope, weight address), so blocks
     * gathered into the same reused buffer keep their own. May be NULL. */
    void (*op_scope)(int s);

    /* ---- fused paths (may be NULL: the model then runs the ops above) ----
     * Each is exactly what the ops it replaces compute, in fewer launches
     * and passes over memory; a backend that fills one is checked against
     * the CPU oracle's separate ops (tests/gpu/check_fused.c).
     *
     * The packed projections: a block's q, k, v weights lie one after the
     * other in the parameter layout, so they are one (qd + 2 kvd, D) matrix
     * and x @ it^T is one GEMM writing qkv (N, qd + 2 kvd), each row q | k | v
     * (qd = H Dh, kvd = Hkv Dh); gate and up likewise one (2F, D) matrix
     * and gu (N, 2F) rows gate | up.
     *   qkv_split_rope   q (B, T, H, Dh), k, v (B, T, Hkv, Dh) from qkv, with
     *                    rope_fwd applied to q and k
     *   qkv_pack_rope    dqkv (N, qd + 2 kvd) from dq, dk, dv, with rope_bwd
     *                    applied to dq and dk (inputs unchanged)
     *   swiglu_gu_fwd    h (N, F) = silu(gate) * up, gate and up from gu
     *   swiglu_gu_bwd    dgu (N, 2F): swiglu_bwd's dgate | dup per row
     *   matmul_fwd_res   out (N, O) = res (N, O) + x @ w^T: the residual add
     *                    inside the GEMM (out may be res)
     *   adamw_spans      adamw over n spans of the flat buffers p, g, m, v,
     *                    p_act (p_act may be NULL), span i at offset
     *                    spans[i].offset of spans[i].n elements, weight decay
     *                    wd where spans[i].decay and 0 elsewhere; the spans
     *                    are host memory */
    void (*qkv_split_rope)(act_t *q, act_t *k, act_t *v, const act_t *qkv, int B, int T, int H, int Hkv, int Dh,
                           int pos0, const be_rope_t *r);
    void (*qkv_pack_rope)(act_t *dqkv, const act_t *dq, const act_t *dk, const act_t *dv, int B, int T, int H,
                          int Hkv, int Dh, int pos0, const be_rope_t *r);
    void (*swiglu_gu_fwd)(act_t *h, const act_t *gu, int N, int F);
    void (*swiglu_gu_bwd)(act_t *dgu, const act_t *dh, const act_t *gu, int N, int F);
    void (*matmul_fwd_res)(act_t *out, const act_t *res, const act_t *x, const act_t *w, int N, int I, int O);
    void (*adamw_spans)(float *p, const float *g, float *m, float *v, act_t *p_act, const be_span_t *spans, int n,
                        float lr, float beta1, float beta2, float eps, float wd, float step_size, float bc2_sqrt,
                        float grad_scale);
} backend_t;


typedef struct be_xfer be_xfer_t;   /* an asynchronous copy in flight (NULL: complete) */

static inline be_xfer_t *be_xfer_to_host(const backend_t *be, void *host_dst, const void *src, size_t bytes) {
    if (be->xfer_to_host) return be->xfer_to_host(host_dst, src, bytes);
    be->to_host(host_dst, src, bytes);
    return NULL;
}
static inline be_xfer_t *be_xfer_from_host(const backend_t *be, void *dst, const void *host_src, size_t bytes) {
    if (be->xfer_from_host) return be->xfer_from_host(dst, host_src, bytes);
    be->from_host(dst, host_src, bytes);
    return NULL;
}
static inline void be_xfer_order(const backend_t *be, be_xfer_t *x) { if (x && be->xfer_order) be->xfer_order(x); }
static inline void be_xfer_wait(const backend_t *be, be_xfer_t *x) { if (x && be->xfer_wait) be->xfer_wait(x); }
static inline bool be_xfer_done(const backend_t *be, be_xfer_t *x) { return !x || !be->xfer_done || be->xfer_done(x); }
static inline void *be_stream(const backend_t *be) { return be->stream ? be->stream() : NULL; }

/* Element n of act storage p: offsets into act_t buffers go through here. */
static inline act_t *be_act_at(const backend_t *be, const act_t *p, size_t n) {
    return (act_t *)(void *)((char *)(uintptr_t)p + n * (size_t)be->act_bytes);
}

static inline const char *be_device_name(const backend_t *be) {
    const char *n = be->device_name ? be->device_name() : NULL;
    return n && *n ? n : be->name;
}
static inline size_t be_xfer_pending(const backend_t *be) { return be->xfer_pending ? be->xfer_pending() : 0; }

/* ---- opening a backend ---- */

typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } backend_kind_t;

/* --attention, in the option's order: auto (cuDNN when it loads and its
 * self-check passes, else own), cudnn, own (our tensor-core kernels), and
 * our two kernels by name */
typedef enum { BE_ATTENTION_AUTO = 0, BE_ATTENTION_CUDNN, BE_ATTENTION_OWN, BE_ATTENTION_TC, BE_ATTENTION_SIMT } be_attention_t;

/* What to open, from the worker's flags. */
typedef struct {
    backend_kind_t kind;
    int threads;               /* CPU: compute threads; <= 0 = every core */
    int device;                /* CUDA: device ordinal */
    bool fp8;                  /* CUDA: FP8 GEMMs (--precision fp8; compute capability 8.9+) */
    be_attention_t attention;  /* CUDA: attention path (--attention) */
    bool sync;                 /* CUDA: synchronize after every op and check it (--cuda-sync) */
} backend_spec_t;

/* The backend the spec names, or NULL with a message naming the problem
 * and the fix (a build without CUDA, no usable GPU, FP8 on a GPU without
 * it). The table lives as long as the process. */
const backend_t *backend_open(const backend_spec_t *spec, char *err, size_t errlen);

/* Devices of that kind this process can use (CPU: 1); 0 with the reason in
 * why when there is none (no GPU, driver missing, a build without CUDA). */
int backend_device_count(backend_kind_t kind, char *why, size_t whylen);

/* The fp32 CPU backend. threads <= 0 uses every core. Its xfer copies
 * run at once. */
const backend_t *backend_cpu(int threads);

#endif
