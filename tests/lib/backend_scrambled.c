/* backend_scrambled.c: the CPU backend with scrambled memory, for tests of
 * code that must reach backend memory only through the backend's copies;
 * see backend_scrambled.h.
 *
 * Every allocation is recorded; a compute op XORs every recorded
 * allocation (making it plain fp32 again), runs backend_cpu's op, and XORs
 * them back. Memory the op is handed that is not backend memory (host
 * outputs of act_to_host, host token arrays) is not recorded and so not
 * touched. */
#include "tests/lib/backend_scrambled.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

typedef struct {
    unsigned char *p;   /* the allocation */
    size_t n;           /* bytes */
} region_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const backend_t *g_cpu;   /* the ops underneath */
static int g_threads;
static backend_t g_be;
static region_t *g_reg;          /* (g_nreg) live allocations */
static size_t g_nreg, g_cap;

static void xor_bytes(void *p, size_t n) {
    unsigned char *b = p;
    size_t i = 0;
    const uint64_t k = 0x0101010101010101ull * BACKEND_SCRAMBLE_BYTE;
    for (; i < n && ((uintptr_t)(b + i) & 7); i++) b[i] ^= BACKEND_SCRAMBLE_BYTE;
    for (; i + 8 <= n; i += 8) *(uint64_t *)(void *)(b + i) ^= k;
    for (; i < n; i++) b[i] ^= BACKEND_SCRAMBLE_BYTE;
}

/* dst = src XOR the key, byte for byte (dst and src may be the same) */
static void xor_copy(void *dst, const void *src, size_t n) {
    if (dst != src) memmove(dst, src, n);
    xor_bytes(dst, n);
}

/* Every live allocation XOR the key: scrambled <-> plain. Under g_mu. */
static void flip_all(void) {
    for (size_t i = 0; i < g_nreg; i++) xor_bytes(g_reg[i].p, g_reg[i].n);
}

static void lock(void) { pthread_mutex_lock(&g_mu); }
static void unlock(void) { pthread_mutex_unlock(&g_mu); }

static void *s_alloc(size_t bytes) {
    void *p = g_cpu->alloc(bytes);
    if (!p) return NULL;
    lock();
    if (g_nreg == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 64;
        region_t *r = realloc(g_reg, cap * sizeof *r);
        if (!r) {
            unlock();
            g_cpu->free(p);
            return NULL;
        }
        g_reg = r;
        g_cap = cap;
    }
    g_reg[g_nreg++] = (region_t){ p, bytes };
    xor_bytes(p, bytes); /* zeroed memory reads as zeros through to_host */
    unlock();
    return p;
}

static void s_free(void *p) {
    if (!p) return;
    lock();
    size_t i = 0;
    while (i < g_nreg && g_reg[i].p != p) i++;
    if (i == g_nreg) {
        unlock();
        die("backend_scrambled: free of %p, which it did not allocate", p);
    }
    g_reg[i] = g_reg[--g_nreg];
    unlock();
    g_cpu->free(p);
}

static void s_memset0(void *p, size_t bytes) { memset(p, BACKEND_SCRAMBLE_BYTE, bytes); }
/* backend -> backend: both scrambled, the bytes move as they are */
static void s_copy(void *dst, const void *src, size_t bytes) { if (dst != src) memmove(dst, src, bytes); }
static void s_to_host(void *h, const void *s, size_t n) { lock(); xor_copy(h, s, n); unlock(); }
static void s_from_host(void *d, const void *h, size_t n) { lock(); xor_copy(d, h, n); unlock(); }

/* An op run on plain memory: unscramble everything, run, scramble again. */
#define WRAP(name, params, args)                                                                                       \
    static void s_##name params {                                                                                      \
        lock();                                                                                                        \
        flip_all();                                                                                                    \
        g_cpu->name args;                                                                                              \
        flip_all();                                                                                                    \
        unlock();                                                                                                      \
    }

WRAP(to_act, (act_t *dst, const float *src, size_t n), (dst, src, n))
WRAP(act_to_host, (float *h, const act_t *src, size_t n), (h, src, n))
WRAP(add, (act_t *out, const act_t *a, const act_t *b, size_t n), (out, a, b, n))
WRAP(scale, (float *x, float s, size_t n), (x, s, n))
WRAP(embedding_fwd, (act_t *out, const int32_t *tok, const act_t *wte, int N, int D), (out, tok, wte, N, D))
WRAP(embedding_bwd, (float *dwte, const act_t *dout, const int32_t *tok, int N, int D), (dwte, dout, tok, N, D))
WRAP(rmsnorm_fwd, (act_t *out, float *rstd, const act_t *x, const act_t *w, int N, int D, float eps),
     (out, rstd, x, w, N, D, eps))
WRAP(rmsnorm_bwd,
     (act_t *dx, float *dw, const act_t *dout, const act_t *x, const act_t *w, const float *rstd, int N, int D),
     (dx, dw, dout, x, w, rstd, N, D))
WRAP(matmul_fwd, (act_t *out, const act_t *x, const act_t *w, int N, int I, int O), (out, x, w, N, I, O))
WRAP(matmul_bwd,
     (act_t *dx, float *dw, const act_t *dout, const act_t *x, const act_t *w, int N, int I, int O, bool acc),
     (dx, dw, dout, x, w, N, I, O, acc))
WRAP(rope_fwd, (act_t *x, int B, int T, int nh, int Dh, int p0, const be_rope_t *r), (x, B, T, nh, Dh, p0, r))
WRAP(rope_bwd, (act_t *x, int B, int T, int nh, int Dh, int p0, const be_rope_t *r), (x, B, T, nh, Dh, p0, r))
WRAP(attention_fwd,
     (act_t *out, float *att, const act_t *q, const act_t *k, const act_t *v, int B, int T, int H, int Hkv, int Dh),
     (out, att, q, k, v, B, T, H, Hkv, Dh))
WRAP(attention_bwd,
     (act_t *dq, act_t *dk, act_t *dv, const act_t *dout, const act_t *out, const act_t *q, const act_t *k,
      const act_t *v, const float *att, int B, int T, int H, int Hkv, int Dh),
     (dq, dk, dv, dout, out, q, k, v, att, B, T, H, Hkv, Dh))
WRAP(swiglu_fwd, (act_t *h, const act_t *g, const act_t *u, size_t n), (h, g, u, n))
WRAP(swiglu_bwd, (act_t *dg, act_t *du, const act_t *dh, const act_t *g, const act_t *u, size_t n),
     (dg, du, dh, g, u, n))
WRAP(xent_fwd, (float *l, const act_t *lg, const int32_t *t, int N, int V), (l, lg, t, N, V))
WRAP(xent_bwd, (act_t *dl, const act_t *lg, const int32_t *t, float s, int N, int V), (dl, lg, t, s, N, V))
WRAP(adamw,
     (float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps, float wd,
      float ss, float bc2, float gs, act_t *pa),
     (p, g, m, v, n, lr, b1, b2, eps, wd, ss, bc2, gs, pa))
WRAP(acc, (float *y, const float *x, size_t n), (y, x, n))
WRAP(to_bf16, (void *d, const float *s, size_t n), (d, s, n))
WRAP(acc_bf16, (float *y, const void *x, size_t n), (y, x, n))
WRAP(from_bf16, (float *y, const void *x, size_t n), (y, x, n))
WRAP(vp_embedding_fwd, (act_t *out, const int32_t *tok, const act_t *wte, int N, int D, int64_t lo, int Vt),
     (out, tok, wte, N, D, lo, Vt))
WRAP(vp_embedding_bwd, (float *dwte, const act_t *dout, const int32_t *tok, int N, int D, int64_t lo, int Vt),
     (dwte, dout, tok, N, D, lo, Vt))
WRAP(vp_xent_max, (float *mx, const act_t *lg, int N, int Vt, int nv), (mx, lg, N, Vt, nv))
WRAP(vp_xent_stats,
     (float *st, float *mx, const float *all_mx, int T, const act_t *lg, const int32_t *t, int N, int Vt, int nv,
      int64_t lo),
     (st, mx, all_mx, T, lg, t, N, Vt, nv, lo))
WRAP(vp_xent_finish, (float *l, float *lse, const float *st, const float *mx, int N), (l, lse, st, mx, N))
WRAP(vp_xent_bwd,
     (act_t *dl, const act_t *lg, const float *lse, const int32_t *t, float s, int N, int Vt, int nv, int64_t lo),
     (dl, lg, lse, t, s, N, Vt, nv, lo))

static double s_sumsq(const float *x, size_t n) {
    lock();
    flip_all();
    double r = g_cpu->sumsq(x, n);
    flip_all();
    unlock();
    return r;
}

static void build(void) {
    g_cpu = backend_cpu(g_threads);
    g_be = *g_cpu;
    g_be.name = "scrambled";
    g_be.host_memory = false;   /* the point: the host must not read it */
    g_be.alloc = s_alloc;
    g_be.free = s_free;
    g_be.memset0 = s_memset0;
    g_be.copy = s_copy;
    g_be.to_host = s_to_host;
    g_be.from_host = s_from_host;
#define SET(name) g_be.name = s_##name
    SET(to_act); SET(act_to_host); SET(add); SET(scale); SET(sumsq); SET(embedding_fwd); SET(embedding_bwd);
    SET(rmsnorm_fwd); SET(rmsnorm_bwd); SET(matmul_fwd); SET(matmul_bwd); SET(rope_fwd); SET(rope_bwd);
    SET(attention_fwd); SET(attention_bwd); SET(swiglu_fwd); SET(swiglu_bwd); SET(xent_fwd); SET(xent_bwd);
    SET(adamw); SET(acc); SET(vp_embedding_fwd); SET(vp_embedding_bwd); SET(vp_xent_max); SET(vp_xent_stats);
    SET(vp_xent_finish); SET(vp_xent_bwd); SET(to_bf16); SET(acc_bf16); SET(from_bf16);
#undef SET
    /* host_alloc / host_free and attention_state_numel stay the CPU's;
     * copies are synchronous through to_host / from_host */
    g_be.xfer_to_host = NULL;
    g_be.xfer_from_host = NULL;
    g_be.xfer_order = NULL;
    g_be.xfer_wait = NULL;
    g_be.xfer_done = NULL;
    g_be.stream = NULL;
}

const backend_t *backend_scrambled(int threads) {
    g_threads = threads;
    pthread_once(&g_once, build);
    return &g_be;
}

size_t backend_scrambled_live(size_t *bytes) {
    lock();
    size_t b = 0, n = g_nreg;
    for (size_t i = 0; i < g_nreg; i++) b += g_reg[i].n;
    unlock();
    if (bytes) *bytes = b;
    return n;
}
