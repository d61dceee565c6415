/* generate.c: KV-cached decoding and sampling; see generate.h. Every step
 * is a backend op (attention over the cache: attention_decode), so it runs
 * on any backend: the CPU's fp32 or the CUDA backend's bf16. */
#include "workers/model/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"

/* ---- the decoder ---- */

int gen_create(gen_t *g, model_t *m, int cap, int rows, char *err, size_t errlen) {
    memset(g, 0, sizeof *g);
    const backend_t *be = m->be;
    const llama_config_t *c = &m->cfg;
    if (!be->attention_decode)
        return errbuf_set(err, errlen, "backend %s has no attention over a KV cache (attention_decode); generate on "
                          "the CPU backend", be->name);
    if (m->tp.size != 1 || !m->params) return errbuf_set(err, errlen, "generation needs the whole model in one process");
    if (cap < 1 || cap > c->max_seq)
        return errbuf_set(err, errlen, "%d positions asked for; the model has max_position_embeddings %d", cap,
                          c->max_seq);
    if (rows < 1) rows = 1;
    if (rows > cap) rows = cap;
    g->m = m;
    g->cap = cap;
    g->rows = rows;
    size_t D = (size_t)c->dim, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim,
           F = (size_t)c->ffn_dim, R = (size_t)rows, L = (size_t)c->n_layers, f = (size_t)be->act_bytes;
    g->kc = be->alloc(L * (size_t)cap * kvd * f);
    g->vc = be->alloc(L * (size_t)cap * kvd * f);
    g->x = be->alloc(R * D * f);
    g->xn = be->alloc(R * D * f);
    g->q = be->alloc(R * qd * f);
    g->k = be->alloc(R * kvd * f);
    g->v = be->alloc(R * kvd * f);
    g->ao = be->alloc(R * qd * f);
    g->tmp = be->alloc(R * D * f);
    g->gate = be->alloc(R * F * f);
    g->up = be->alloc(R * F * f);
    g->h = be->alloc(R * F * f);
    g->logits = be->alloc((size_t)c->vocab * f);
    g->rstd = be->alloc(R * sizeof(float));
    g->tok = be->alloc(R * sizeof(int32_t));
    if (!g->kc || !g->vc || !g->x || !g->xn || !g->q || !g->k || !g->v || !g->ao || !g->tmp || !g->gate || !g->up ||
        !g->h || !g->logits || !g->rstd || !g->tok) {
        gen_destroy(g);
        return errbuf_set(err, errlen, "out of memory for a KV cache of %d positions", cap);
    }
    return 0;
}

void gen_destroy(gen_t *g) {
    if (!g->m) return;
    const backend_t *be = g->m->be;
    act_t *bufs[] = { g->kc, g->vc, g->x, g->xn, g->q, g->k, g->v, g->ao, g->tmp, g->gate, g->up, g->h, g->logits };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(bufs[i]);
    if (g->rstd) be->free(g->rstd);
    if (g->tok) be->free(g->tok);
    memset(g, 0, sizeof *g);
}

int gen_feed(gen_t *g, const int32_t *tokens, int n, float *logits_host, char *err, size_t errlen) {
    model_t *m = g->m;
    const backend_t *be = m->be;
    const llama_config_t *c = &m->cfg;
    if (n < 1 || n > g->rows) return errbuf_set(err, errlen, "gen_feed: %d tokens (1..%d per call)", n, g->rows);
    if (g->pos + n > g->cap)
        return errbuf_set(err, errlen, "the KV cache is full: %d positions (prompt and new tokens)", g->cap);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return errbuf_set(err, errlen, "token id %d is outside the vocabulary (0..%d)", (int)tokens[i],
                              c->vocab - 1);
    int D = c->dim, H = c->n_heads, Hkv = c->n_kv_heads, Dh = c->head_dim, qd = H * Dh, kvd = Hkv * Dh,
        F = c->ffn_dim, L = c->n_layers, p0 = g->pos;
    be_rope_t rope = llama_rope(c);
    be->from_host(g->tok, tokens, (size_t)n * sizeof(int32_t));
    be->embedding_fwd(g->x, g->tok, be_act_at(be, m->params, m->embed_off), n, D);
    for (int l = 0; l < L; l++) {
        const act_t *bp = model_block_params(m, l);
#define P(i) be_act_at(be, bp, m->blk_off[i])
        act_t *kc = be_act_at(be, g->kc, (size_t)l * g->cap * kvd), *vc = be_act_at(be, g->vc, (size_t)l * g->cap * kvd);
        be->rmsnorm_fwd(g->xn, g->rstd, g->x, P(BLK_ATTN_NORM), n, D, c->rms_eps);
        be->matmul_fwd(g->q, g->xn, P(BLK_WQ), n, D, qd);
        be->matmul_fwd(g->k, g->xn, P(BLK_WK), n, D, kvd);
        be->matmul_fwd(g->v, g->xn, P(BLK_WV), n, D, kvd);
        be->rope_fwd(g->q, 1, n, H, Dh, p0, &rope);
        be->rope_fwd(g->k, 1, n, Hkv, Dh, p0, &rope);
        be->copy(be_act_at(be, kc, (size_t)p0 * kvd), g->k, (size_t)n * kvd * be->act_bytes);
        be->copy(be_act_at(be, vc, (size_t)p0 * kvd), g->v, (size_t)n * kvd * be->act_bytes);
        be->attention_decode(g->ao, g->q, kc, vc, n, p0, H, Hkv, Dh);
        be->matmul_fwd(g->tmp, g->ao, P(BLK_WO), n, qd, D);
        be->add(g->x, g->x, g->tmp, (size_t)n * D);
        be->rmsnorm_fwd(g->xn, g->rstd, g->x, P(BLK_FFN_NORM), n, D, c->rms_eps);
        be->matmul_fwd(g->gate, g->xn, P(BLK_WGATE), n, D, F);
        be->matmul_fwd(g->up, g->xn, P(BLK_WUP), n, D, F);
        be->swiglu_fwd(g->h, g->gate, g->up, (size_t)n * F);
        be->matmul_fwd(g->tmp, g->h, P(BLK_WDOWN), n, F, D);
        be->add(g->x, g->x, g->tmp, (size_t)n * D);
#undef P
    }
    /* the head on the last row only */
    const act_t *last = be_act_at(be, g->x, (size_t)(n - 1) * D);
    be->rmsnorm_fwd(g->xn, g->rstd, last, be_act_at(be, m->params, m->norm_off), 1, D, c->rms_eps);
    be->matmul_fwd(g->logits, g->xn, be_act_at(be, m->params, m->lm_head_off), 1, D, c->vocab);
    be->act_to_host(logits_host, g->logits, (size_t)c->vocab);
    g->pos += n;
    return 0;
}

/* ---- sampling ---- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct { float v; int32_t id; } cand_t;

/* larger logit first; equal ones by lower id */
static int cand_cmp(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int32_t gen_sample(const float *logits, int V, const gen_sampling_t *s, uint64_t *rng) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (!(s->temperature > 0) || s->top_k == 1) return best;
    cand_t *c = malloc((size_t)V * sizeof *c);
    if (!c) return best;
    for (int i = 0; i < V; i++) c[i] = (cand_t){ logits[i], i };
    qsort(c, (size_t)V, sizeof *c, cand_cmp);
    int n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    /* softmax of logits / T over the n kept, in double */
    double *p = malloc((size_t)n * sizeof *p), z = 0;
    if (!p) { free(c); return best; }
    for (int i = 0; i < n; i++) z += p[i] = exp(((double)c[i].v - c[0].v) / s->temperature);
    for (int i = 0; i < n; i++) p[i] /= z;
    if (s->top_p > 0 && s->top_p < 1) {
        double cum = 0;
        int keep = 0;
        while (keep < n) {
            cum += p[keep++];
            if (cum >= s->top_p) break;
        }
        n = keep;
        z = 0;
        for (int i = 0; i < n; i++) z += p[i];
        for (int i = 0; i < n; i++) p[i] /= z;
    }
    double u = (double)(splitmix64(rng) >> 11) * 0x1.0p-53, cum = 0;
    int32_t pick = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        cum += p[i];
        if (u < cum) { pick = c[i].id; break; }
    }
    free(p);
    free(c);
    return pick;
}
