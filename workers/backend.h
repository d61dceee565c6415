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
 *     checkpointing rely on it). */
#ifndef BALLAST_BACKEND_H
#define BALLAST_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct backend {
    const char *name;

    /* ---- memory ---- */
    void *(*alloc)(size_t bytes);                 /* zeroed; NULL when out of memory */
    void (*free)(void *p);
    void (*memset0)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);          /* backend -> backend */
    void (*to_host)(void *host_dst, const void *src, size_t bytes);  /* backend -> host */
    void (*from_host)(void *dst, const void *host_src, size_t bytes);/* host -> backend */

    /* ---- elementwise ---- */
    /* out[n] = a[n] + b[n]; out may alias a or b */
    void (*add)(float *out, const float *a, const float *b, size_t n);
    /* x[n] *= s */
    void (*scale)(float *x, float s, size_t n);
    /* sum of x[i]^2 over n elements, accumulated in double; result on the host */
    double (*sumsq)(const float *x, size_t n);

    /* ---- embedding ---- */
    /* out (N, D) = wte[tokens[i]] ; tokens (N) int32, already checked < V */
    void (*embedding_fwd)(float *out, const int32_t *tokens, const float *wte, int N, int D);
    /* dwte (V, D) accumulates dout (N, D) rows at tokens */
    void (*embedding_bwd)(float *dwte, const float *dout, const int32_t *tokens, int N, int D);

    /* ---- RMSNorm (Hugging Face LlamaRMSNorm) ---- */
    /* out (N, D) = w (D) * x / sqrt(mean(x^2) + eps); rstd (N) keeps 1/sqrt(...) */
    void (*rmsnorm_fwd)(float *out, float *rstd, const float *x, const float *w, int N, int D, float eps);
    /* dx (N, D) accumulates, dw (D) accumulates */
    void (*rmsnorm_bwd)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                        const float *rstd, int N, int D);

    /* ---- matmul with (out, in) weights: y = x W^T ---- */
    /* out (N, O) = x (N, I) @ w (O, I)^T */
    void (*matmul_fwd)(float *out, const float *x, const float *w, int N, int I, int O);
    /* dx (N, I) = dout (N, O) @ w (overwritten, or accumulated when dx_acc);
     * dw (O, I) accumulates dout^T @ x. Either output may be NULL. */
    void (*matmul_bwd)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                       int N, int I, int O, bool dx_acc);

    /* ---- rotary position embedding, rotate-half form, in place ---- */
    /* x (B, T, nh, Dh): position of row t is t; pair (i, i + Dh/2) turns by
     * t * theta^(-2i/Dh). */
    void (*rope_fwd)(float *x, int B, int T, int nh, int Dh, float theta);
    /* the inverse rotation applied to a gradient (B, T, nh, Dh) in place */
    void (*rope_bwd)(float *dx, int B, int T, int nh, int Dh, float theta);

    /* ---- causal attention with grouped-query heads ---- */
    /* q (B, T, H, Dh), k, v (B, T, Hkv, Dh), out (B, T, H, Dh);
     * query head h reads key/value head h / (H / Hkv); scale 1/sqrt(Dh).
     * att (B, H, T, T) keeps the softmax probabilities for backward (a
     * backend may keep less, e.g. log-sum-exp rows, in the same buffer). */
    void (*attention_fwd)(float *out, float *att, const float *q, const float *k, const float *v,
                          int B, int T, int H, int Hkv, int Dh);
    /* dq overwritten; dk, dv (B, T, Hkv, Dh) overwritten */
    void (*attention_bwd)(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, const float *att,
                          int B, int T, int H, int Hkv, int Dh);

    /* ---- SwiGLU: h = silu(gate) * up, n elements ---- */
    void (*swiglu_fwd)(float *h, const float *gate, const float *up, size_t n);
    void (*swiglu_bwd)(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n);

    /* ---- softmax cross-entropy over V classes ---- */
    /* losses (N) = logsumexp(logits[i]) - logits[i][targets[i]] */
    void (*xent_fwd)(float *losses, const float *logits, const int32_t *targets, int N, int V);
    /* dlogits (N, V) = (softmax(logits) - onehot(targets)) * scale;
     * dlogits may alias logits */
    void (*xent_bwd)(float *dlogits, const float *logits, const int32_t *targets, float scale, int N, int V);

    /* ---- optimizer ---- */
    /* torch.optim.AdamW on n elements, one step:
     *   p -= lr * wd * p
     *   g' = g * grad_scale
     *   m = beta1 m + (1 - beta1) g' ;  v = beta2 v + (1 - beta2) g'^2
     *   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
     * with step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t) from the caller. */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float wd, float step_size, float bc2_sqrt, float grad_scale);
} backend_t;

/* The fp32 CPU backend. threads <= 0 uses every core. */
const backend_t *backend_cpu(int threads);

#endif
