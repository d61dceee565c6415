/* model.c: Llama forward and backward over the backend table. See model.h
 * for the parameter layout. Nothing here touches backend memory except
 * through m->be. */
#include "workers/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "workers/model/tp.h"

/* ---- layout ---- */

static void add_tensor(model_t *m, const char *name, int ndim, int64_t d0, int64_t d1, size_t off, int block) {
    model_tensor_t *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 1;
    t->offset = off;
    t->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    t->block = block;
    t->decay = ndim >= 2;
    t->tp_dim = -1;
}

static void build_layout(model_t *m) {
    const llama_config_t *c = &m->cfg;
    size_t D = c->dim, F = c->ffn_dim, V = c->vocab, qd = (size_t)c->n_heads * c->head_dim,
           kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t sizes[BLK_NT] = { qd * D, kvd * D, kvd * D, D * qd, F * D, F * D, D * F, D, D };
    size_t o = 0;
    for (int i = 0; i < BLK_NT; i++) { m->blk_off[i] = o; o += sizes[i]; }
    m->block_numel = o;
    m->embed_off = 0;
    m->blocks_off = V * D;
    m->norm_off = m->blocks_off + (size_t)c->n_layers * m->block_numel;
    m->lm_head_off = c->tie_embeddings ? m->embed_off : m->norm_off + D;
    m->n_params = m->norm_off + D + (c->tie_embeddings ? 0 : V * D);

    m->tensors = calloc((size_t)c->n_layers * BLK_NT + 3, sizeof *m->tensors);
    CHECK_ALLOC(m->tensors);
    add_tensor(m, "model.embed_tokens.weight", 2, V, D, m->embed_off, -1);
    m->tensors[m->n_tensors - 1].tp_dim = 0;
    static const char *const names[BLK_NT] = {
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
        "input_layernorm.weight", "post_attention_layernorm.weight",
    };
    const int64_t shp[BLK_NT][2] = {
        { qd, D }, { kvd, D }, { kvd, D }, { D, qd }, { F, D }, { F, D }, { D, F }, { D, 0 }, { D, 0 },
    };
    /* column-parallel q, k, v, gate, up; row-parallel o, down; norms replicated */
    static const int tp_dims[BLK_NT] = { 0, 0, 0, 1, 0, 0, 1, -1, -1 };
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < BLK_NT; i++) {
            char nm[MODEL_NAME_LEN];
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, names[i]);
            add_tensor(m, nm, shp[i][1] ? 2 : 1, shp[i][0], shp[i][1],
                       m->blocks_off + (size_t)l * m->block_numel + m->blk_off[i], l);
            m->tensors[m->n_tensors - 1].tp_dim = tp_dims[i];
        }
    add_tensor(m, "model.norm.weight", 1, D, 0, m->norm_off, -1);
    if (!c->tie_embeddings) {
        add_tensor(m, "lm_head.weight", 2, V, D, m->lm_head_off, -1);
        m->tensors[m->n_tensors - 1].tp_dim = 0;
    }
}

/* The TP-local layout of rank tp.rank of tp.size: the full table with each
 * split dimension cut to its share (vocab rounded up), offsets packed in
 * the same order. Needs tp.size set and the full layout built. */
static void build_tp_layout(model_t *m) {
    model_tp_t *tp = &m->tp;
    const llama_config_t *c = &m->cfg;
    int T = tp->size;
    tp->H = c->n_heads / T;
    tp->Hkv = c->n_kv_heads / T;
    tp->F = c->ffn_dim / T;
    tp->V = (c->vocab + T - 1) / T;
    tp->tensors = calloc((size_t)m->n_tensors, sizeof *tp->tensors);
    CHECK_ALLOC(tp->tensors);
    size_t o = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        model_tensor_t *t = &tp->tensors[i];
        *t = m->tensors[i];
        if (t->tp_dim == 0) t->shape[0] = t->block < 0 ? tp->V : t->shape[0] / T;
        if (t->tp_dim == 1) t->shape[1] /= T;
        t->numel = (size_t)t->shape[0] * (size_t)t->shape[1];
        t->offset = o;
        o += t->numel;
    }
    tp->n_params = o;
    tp->embed_off = tp->tensors[0].offset;
    tp->blocks_off = tp->embed_off + tp->tensors[0].numel;
    size_t bo = 0;
    for (int k = 0; k < BLK_NT && c->n_layers > 0; k++) {
        tp->blk_off[k] = bo;
        bo += tp->tensors[1 + k].numel;
    }
    tp->block_numel = bo;
    tp->norm_off = tp->blocks_off + (size_t)c->n_layers * bo;
    tp->lm_head_off = c->tie_embeddings ? tp->embed_off : tp->norm_off + (size_t)c->dim;
}

int64_t model_tp_full_index(const model_tensor_t *full, const int64_t lshape[2], int tp_rank, size_t i) {
    int64_t r = (int64_t)(i / (size_t)lshape[1]), col = (int64_t)(i % (size_t)lshape[1]);
    if (full->tp_dim == 0) {
        r += (int64_t)tp_rank * lshape[0];
        if (r >= full->shape[0]) return -1;
    } else if (full->tp_dim == 1) {
        col += (int64_t)tp_rank * lshape[1];
    }
    return r * full->shape[1] + col;
}

void model_tp_slice(const model_t *m, const float *full, float *local) {
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *f = &m->tensors[i], *t = &m->tp.tensors[i];
        for (size_t j = 0; j < t->numel; j++) {
            int64_t k = model_tp_full_index(f, t->shape, m->tp.rank, j);
            local[t->offset + j] = k < 0 ? 0.f : full[f->offset + (size_t)k];
        }
    }
}

void model_tp_unslice(const model_t *m, int tp_rank, const float *local, float *full) {
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *f = &m->tensors[i], *t = &m->tp.tensors[i];
        for (size_t j = 0; j < t->numel; j++) {
            int64_t k = model_tp_full_index(f, t->shape, tp_rank, j);
            if (k >= 0) full[f->offset + (size_t)k] = local[t->offset + j];
        }
    }
}

/* ---- allocation ---- */

typedef struct { const backend_t *be; bool failed; size_t bytes; /* allocated so far */ } alloc_ctx_t;

static float *falloc(alloc_ctx_t *ac, size_t n) {
    float *p = ac->be->alloc(n * sizeof(float));
    if (!p) ac->failed = true;
    ac->bytes += n * sizeof(float);
    return p;
}

/* n elements of act storage (act_bytes each: bf16 on CUDA) */
static act_t *aalloc(alloc_ctx_t *ac, size_t n) {
    act_t *p = ac->be->alloc(n * (size_t)ac->be->act_bytes);
    if (!p) ac->failed = true;
    ac->bytes += n * (size_t)ac->be->act_bytes;
    return p;
}

/* One block's activations: rows that stay local hold N/T rows, the
 * gathered ones (norm outputs feeding the matmuls) and the head-split ones
 * all N rows; widths are TP-local. */
static void acts_alloc(alloc_ctx_t *ac, block_acts_t *a, const model_t *m) {
    const model_tp_t *tp = &m->tp;
    size_t N = (size_t)m->B * m->T, Nl = (size_t)tp->N, D = m->cfg.dim, F = tp->F, Dh = m->cfg.head_dim,
           qd = (size_t)tp->H * Dh, kvd = (size_t)tp->Hkv * Dh;
    a->xn1 = aalloc(ac, N * D); a->rstd1 = falloc(ac, Nl);
    a->q = aalloc(ac, N * qd); a->k = aalloc(ac, N * kvd); a->v = aalloc(ac, N * kvd);
    a->att = falloc(ac, ac->be->attention_state_numel(m->B, m->T, tp->H));
    a->ao = aalloc(ac, N * qd);
    a->xmid = aalloc(ac, Nl * D);
    a->xn2 = aalloc(ac, N * D); a->rstd2 = falloc(ac, Nl);
    a->gate = aalloc(ac, 2 * N * F); a->h = aalloc(ac, N * F);
    a->up = a->gate ? be_act_at(ac->be, a->gate, N * F) : NULL;
}

/* Free a's attention output and state (selective checkpointing keeps them
 * per block instead), taking their bytes off ac's count. */
static void acts_free_attention(block_acts_t *a, alloc_ctx_t *ac, const model_t *m) {
    size_t N = (size_t)m->B * m->T, qd = (size_t)m->tp.H * m->cfg.head_dim;
    if (a->ao) ac->be->free(a->ao);
    if (a->att) ac->be->free(a->att);
    ac->bytes -= N * qd * (size_t)ac->be->act_bytes + ac->be->attention_state_numel(m->B, m->T, m->tp.H) * sizeof(float);
    a->ao = NULL;
    a->att = NULL;
}

static void acts_free(const backend_t *be, block_acts_t *a) {
    float *ps[] = { a->xn1, a->rstd1, a->q, a->k, a->v, a->att, a->ao, a->xmid, a->xn2, a->rstd2,
                    a->gate, a->h }; /* up lies in gate's buffer */
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) if (ps[i]) be->free(ps[i]);
}

uint64_t model_memory_bytes(const llama_config_t *c, int B, int T, model_ckpt_t act_ckpt) {
    uint64_t N = (uint64_t)B * T, D = c->dim, F = c->ffn_dim, V = c->vocab, L = c->n_layers,
             qd = (uint64_t)c->n_heads * c->head_dim, kvd = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t params = (uint64_t)llama_total_params(c);
    uint64_t acts = N * (3 * D + 2 + 2 * qd + 2 * kvd + 3 * F) + (uint64_t)B * c->n_heads * T * T;
    uint64_t floats = 4 * params                            /* params, grads, AdamW m and v */
                      + (L + 1) * N * D                     /* block inputs */
                      + (act_ckpt ? 1 : L) * acts
                      + (act_ckpt == MODEL_CKPT_SELECTIVE ? L * (N * qd + (uint64_t)B * c->n_heads * T) : 0)
                      + N * (D + 1 + V + 1)                 /* final norm, logits, losses */
                      + N * (3 * D + 3 * qd + 4 * kvd + 3 * F); /* backward scratch, the packed qkv */
    return floats * 4;
}

int model_layout(model_t *m, const llama_config_t *cfg, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (llama_config_validate(cfg, err, errlen)) return -1;
    m->cfg = *cfg;
    m->tp.size = 1;
    build_layout(m);
    build_tp_layout(m);
    return 0;
}

int model_create(model_t *m, const llama_config_t *cfg, const backend_t *be, int B, int T, model_ckpt_t act_ckpt,
                 char *err, size_t errlen) {
    return model_create_tp(m, cfg, be, B, T, act_ckpt, 1, 0, NULL, err, errlen);
}

/* The numbers tensor parallelism needs to divide; 0 or -1 with a message. */
static int tp_check(const llama_config_t *c, const backend_t *be, int B, int T, int tp, int rank, const comm_t *comm,
                    char *err, size_t errlen) {
    if (tp < 1 || rank < 0 || rank >= tp) {
        snprintf(err, errlen, "tensor-parallel rank %d of %d is invalid", rank, tp);
        return -1;
    }
    (void)be; /* every backend runs tensor parallelism (the vocab-parallel ops are in the table) */
    if (tp == 1) return 0;
    const char *what = NULL;
    int n = 0;
    if (c->n_heads % tp) what = "num_attention_heads", n = c->n_heads;
    else if (c->n_kv_heads % tp) what = "num_key_value_heads", n = c->n_kv_heads;
    else if (c->ffn_dim % tp) what = "intermediate_size", n = c->ffn_dim;
    if (what) {
        snprintf(err, errlen, "--tensor-parallel-degree %d does not divide %s %d: grouped-query heads and MLP rows are "
                 "split evenly across the TP ranks; choose a degree that divides num_attention_heads %d, "
                 "num_key_value_heads %d and intermediate_size %d", tp, what, n, c->n_heads, c->n_kv_heads, c->ffn_dim);
        return -1;
    }
    if (((int64_t)B * T) % tp) {
        snprintf(err, errlen, "--tensor-parallel-degree %d does not divide the %d x %d = %lld tokens of a micro-batch: "
                 "sequence parallelism splits them evenly; change --micro-batch or --seq-len",
                 tp, B, T, (long long)B * T);
        return -1;
    }
    if (!comm || comm_size(comm) != tp || comm_index(comm) != rank) {
        snprintf(err, errlen, "tensor parallelism needs the TP group's communicator (%d ranks)", tp);
        return -1;
    }
    return 0;
}

static int create(model_t *m, const llama_config_t *cfg, const backend_t *be, int B, int T, model_ckpt_t act_ckpt,
                  int tp_size, int tp_rank, comm_t *comm, bool with_params, char *err, size_t errlen);

int model_create_tp(model_t *m, const llama_config_t *cfg, const backend_t *be, int B, int T, model_ckpt_t act_ckpt,
                    int tp_size, int tp_rank, comm_t *comm, char *err, size_t errlen) {
    return create(m, cfg, be, B, T, act_ckpt, tp_size, tp_rank, comm, true, err, errlen);
}

int model_create_acts(model_t *m, const llama_config_t *cfg, const backend_t *be, int B, int T, model_ckpt_t act_ckpt,
                      int tp_size, int tp_rank, comm_t *comm, char *err, size_t errlen) {
    return create(m, cfg, be, B, T, act_ckpt, tp_size, tp_rank, comm, false, err, errlen);
}

static int create(model_t *m, const llama_config_t *cfg, const backend_t *be, int B, int T, model_ckpt_t act_ckpt,
                  int tp_size, int tp_rank, comm_t *comm, bool with_params, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (llama_config_validate(cfg, err, errlen)) return -1;
    if (cfg->head_dim % 2) {
        snprintf(err, errlen, "head_dim %d is odd; rotary embedding needs an even head_dim", cfg->head_dim);
        return -1;
    }
    if (B <= 0 || T <= 0) { snprintf(err, errlen, "micro-batch (%d) and seq-len (%d) must be positive", B, T); return -1; }
    if (T > cfg->max_seq) {
        snprintf(err, errlen, "seq-len %d exceeds the model's max_position_embeddings %d", T, cfg->max_seq);
        return -1;
    }
    if (tp_check(cfg, be, B, T, tp_size, tp_rank, comm, err, errlen)) return -1;
    m->cfg = *cfg;
    m->be = be;
    m->B = B;
    m->T = T;
    m->act_ckpt = act_ckpt;
    m->tp.size = tp_size;
    m->tp.rank = tp_rank;
    m->tp.comm = tp_size > 1 ? comm : NULL;
    m->tp.be = be;
    m->tp.N = B * T / tp_size;
    build_layout(m);
    build_tp_layout(m);

    const llama_config_t *c = cfg;
    size_t N = (size_t)B * T, Nl = (size_t)m->tp.N, D = c->dim, F = m->tp.F, V = m->tp.V,
           qd = (size_t)m->tp.H * c->head_dim, kvd = (size_t)m->tp.Hkv * c->head_dim;
    alloc_ctx_t ac = { be, false, 0 };
    if (with_params) {
        m->params = aalloc(&ac, m->n_params);
        /* fp32 master weights apart from the working copy when act storage is narrower */
        m->master = be->act_bytes == (int)sizeof(float) ? m->params : falloc(&ac, m->n_params);
        m->grads = falloc(&ac, m->n_params);
    }
    size_t param_bytes = ac.bytes;
    m->tokens = be->alloc(N * sizeof(int32_t));
    m->targets = be->alloc(N * sizeof(int32_t));
    if (!m->tokens || !m->targets) ac.failed = true;
    m->xs = calloc((size_t)c->n_layers + 1, sizeof *m->xs);
    m->xs_own = calloc((size_t)c->n_layers + 1, sizeof *m->xs_own);
    int nacts = act_ckpt ? 1 : c->n_layers;
    m->acts = calloc((size_t)nacts, sizeof *m->acts);
    CHECK_ALLOC(m->xs);
    CHECK_ALLOC(m->xs_own);
    CHECK_ALLOC(m->acts);
    for (int l = 0; l <= c->n_layers; l++) m->xs[l] = m->xs_own[l] = aalloc(&ac, Nl * D);
    for (int l = 0; l < nacts; l++) acts_alloc(&ac, &m->acts[l], m);
    if (act_ckpt == MODEL_CKPT_SELECTIVE) {
        /* the attention output and state of every block stay; the scratch
         * set's own are not needed (model_block_acts points them here) */
        acts_free_attention(&m->acts[0], &ac, m);
        m->sel_ao = calloc((size_t)c->n_layers, sizeof *m->sel_ao);
        m->sel_att = calloc((size_t)c->n_layers, sizeof *m->sel_att);
        CHECK_ALLOC(m->sel_ao);
        CHECK_ALLOC(m->sel_att);
        for (int l = 0; l < c->n_layers; l++) {
            m->sel_ao[l] = aalloc(&ac, N * qd);
            m->sel_att[l] = falloc(&ac, be->attention_state_numel(B, T, m->tp.H));
        }
        m->acts[0].ao = m->sel_ao[0];
        m->acts[0].att = m->sel_att[0];
    }
    m->xf = aalloc(&ac, N * D); m->rstdf = falloc(&ac, Nl);
    m->logits = aalloc(&ac, N * V);
    m->losses = falloc(&ac, N);
    m->dx = aalloc(&ac, Nl * D); m->dtmp = aalloc(&ac, N * D); m->ftmp = aalloc(&ac, N * D);
    if (tp_size > 1) {
        m->tp.rows = aalloc(&ac, Nl * D);
        m->tp.lse = falloc(&ac, N);
        m->tp.xbuf = falloc(&ac, N * (size_t)(tp_size + 3));
    }
    m->dq = aalloc(&ac, N * qd); m->dk = aalloc(&ac, N * kvd); m->dv = aalloc(&ac, N * kvd);
    m->dao = aalloc(&ac, N * qd);
    m->dgate = aalloc(&ac, 2 * N * F); m->dh = aalloc(&ac, N * F);
    m->dup = m->dgate ? be_act_at(be, m->dgate, N * F) : NULL;
    if (be->qkv_split_rope && be->qkv_pack_rope) m->qkv = aalloc(&ac, N * (qd + 2 * kvd));
    m->loss_host = malloc(N * sizeof(float));
    m->act_bytes = ac.bytes - param_bytes;
    m->cp.size = 1;
    if (ac.failed || !m->loss_host) {
        snprintf(err, errlen, "out of memory allocating the model (%zu parameters, micro-batch %d x %d)",
                 m->n_params, B, T);
        model_destroy(m);
        return -1;
    }
    return 0;
}

void model_destroy(model_t *m) {
    const backend_t *be = m->be;
    free(m->tp.tensors);
    if (!be) { free(m->tensors); memset(m, 0, sizeof *m); return; }
    if (m->tp.rows) be->free(m->tp.rows);
    if (m->tp.lse) be->free(m->tp.lse);
    if (m->tp.xbuf) be->free(m->tp.xbuf);
    void *cps[] = { m->cp.kv[0], m->cp.kv[1], m->cp.dkv[0], m->cp.dkv[1], m->cp.ob, m->cp.lb };
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) if (cps[i]) be->free(cps[i]);
    float *ps[] = { m->params, m->grads, m->xf, m->rstdf, m->logits, m->losses, m->dx, m->dtmp, m->ftmp,
                    m->dq, m->dk, m->dv, m->dao, m->dgate, m->dh, m->qkv }; /* dup lies in dgate's buffer */
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) if (ps[i]) be->free(ps[i]);
    if (m->master && m->master != m->params) be->free(m->master);
    if (m->tokens) be->free(m->tokens);
    if (m->targets) be->free(m->targets);
    /* the model's own block-input buffers, wherever the inputs point now */
    if (m->xs_own) for (int l = 0; l <= m->cfg.n_layers; l++) if (m->xs_own[l]) be->free(m->xs_own[l]);
    if (m->sel_ao) {
        /* the scratch set's attention buffers are one of the kept ones */
        m->acts[0].ao = NULL;
        m->acts[0].att = NULL;
        for (int l = 0; l < m->cfg.n_layers; l++) {
            if (m->sel_ao[l]) be->free(m->sel_ao[l]);
            if (m->sel_att[l]) be->free(m->sel_att[l]);
        }
    }
    free(m->sel_ao);
    free(m->sel_att);
    if (m->acts) for (int l = 0; l < (m->act_ckpt ? 1 : m->cfg.n_layers); l++) acts_free(be, &m->acts[l]);
    free(m->xs);
    free(m->xs_own);
    free(m->acts);
    free(m->tensors);
    free(m->loss_host);
    memset(m, 0, sizeof *m);
}

/* ---- parameters ---- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A standard normal from two uniforms (Box-Muller), in double. */
static double randn(uint64_t *s) {
    double u1 = ((splitmix64(s) >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
    double u2 = (splitmix64(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void model_init_random(model_t *m, uint64_t seed) {
    float *host = malloc(m->n_params * sizeof(float));
    CHECK_ALLOC(host);
    model_init_random_host(m, seed, host);
    model_set_params(m, host);
    free(host);
}

void model_init_random_host(const model_t *m, uint64_t seed, float *host) {
    /* tensors in parallel: the values do not depend on the thread count
     * (one stream per tensor, disjoint writes); a 7B model takes minutes
     * on one core */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        /* each tensor has its own stream, so adding a layer leaves the others alone */
        uint64_t s = seed ^ (0x1000193ull * (uint64_t)(i + 1));
        for (size_t j = 0; j < t->numel; j++)
            host[t->offset + j] = t->ndim == 2 ? (float)(0.02 * randn(&s)) : 1.0f;
    }
}

const model_tensor_t *model_find(const model_t *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++) if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

act_t *model_block_params(model_t *m, int l) { return be_act_at(m->be, m->params, m->blocks_off + (size_t)l * m->block_numel); }
float *model_block_grads(model_t *m, int l) { return m->grads + m->blocks_off + (size_t)l * m->block_numel; }

void model_get_params(const model_t *m, float *host) { m->be->to_host(host, m->master, m->n_params * sizeof(float)); }
void model_set_params(model_t *m, const float *host) {
    m->be->from_host(m->master, host, m->n_params * sizeof(float));
    if (m->master != m->params) m->be->to_act(m->params, m->master, m->n_params);
}
void model_zero_grads(model_t *m) { m->be->memset0(m->grads, m->n_params * sizeof(float)); }

void model_drop_params(model_t *m) {
    if (m->master && m->master != m->params) m->be->free(m->master);
    if (m->params) m->be->free(m->params);
    if (m->grads) m->be->free(m->grads);
    m->params = NULL;
    m->master = NULL;
    m->grads = NULL;
}

/* ---- block inputs ---- */

act_t *model_block_input(const model_t *m, int l) { return m->xs[l]; }

void model_set_block_input(model_t *m, int l, act_t *buf) { m->xs[l] = buf; }

void model_drop_block_inputs(model_t *m, int keep) {
    for (int l = keep < 0 ? 0 : keep; l <= m->cfg.n_layers; l++) {
        if (m->xs_own[l]) m->be->free(m->xs_own[l]);
        m->xs_own[l] = NULL;
        m->xs[l] = NULL;
    }
}

void model_reset_block_inputs(model_t *m) {
    for (int l = 0; l <= m->cfg.n_layers; l++) m->xs[l] = m->xs_own[l];
}

/* ---- context parallelism: chunked RoPE and ring attention ---- */

int model_set_cp(model_t *m, int cp_size, int cp_rank, comm_t *comm, char *err, size_t errlen) {
    if (cp_size == 1) return 0;
    const backend_t *be = m->be;
    const llama_config_t *c = &m->cfg;
    if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size) {
        snprintf(err, errlen, "context-parallel rank %d of %d is invalid", cp_rank, cp_size);
        return -1;
    }
    if (!be->attn_block_fwd || !be->attn_merge || !be->attn_block_bwd) {
        snprintf(err, errlen, "--context-parallel-degree %d: the %s backend has no ring-attention ops; "
                 "use --backend cpu, or --context-parallel-degree 1", cp_size, be->name);
        return -1;
    }
    if (m->T % 2) {
        snprintf(err, errlen, "context parallelism cuts each sequence in 2C chunks: a rank's %d tokens per row "
                 "must be even (seq-len divisible by 2 x --context-parallel-degree)", m->T);
        return -1;
    }
    if ((int64_t)m->T * cp_size > c->max_seq) {
        snprintf(err, errlen, "seq-len %lld exceeds the model's max_position_embeddings %d",
                 (long long)m->T * cp_size, c->max_seq);
        return -1;
    }
    if (!comm || comm_size(comm) != cp_size || comm_index(comm) != cp_rank) {
        snprintf(err, errlen, "context parallelism needs the CP group's communicator (%d ranks)", cp_size);
        return -1;
    }
    model_cp_t *cp = &m->cp;
    cp->size = cp_size;
    cp->rank = cp_rank;
    cp->comm = comm;
    cp->Tc = m->T / 2;
    size_t N = (size_t)m->B * m->T, kvn = N * (size_t)m->tp.Hkv * c->head_dim, H = (size_t)m->tp.H;
    alloc_ctx_t ac = { be, false, 0 };
    for (int b = 0; b < 2; b++) {
        cp->kv[b] = aalloc(&ac, 2 * kvn);
        cp->dkv[b] = aalloc(&ac, 2 * kvn);
    }
    cp->ob = aalloc(&ac, (size_t)cp->Tc * H * c->head_dim);
    cp->lb = falloc(&ac, (size_t)cp->Tc * H);
    /* the attention state becomes the log-sum-exp rows (N, H) */
    int nacts = m->act_ckpt ? 1 : c->n_layers;
    size_t old = be->attention_state_numel(m->B, m->T, m->tp.H) * sizeof(float);
    if (m->sel_att) {
        nacts = c->n_layers; /* selective: every block keeps its state */
        for (int l = 0; l < nacts; l++) {
            be->free(m->sel_att[l]);
            m->sel_att[l] = falloc(&ac, N * H);
        }
        m->acts[0].att = m->sel_att[0];
    } else {
        for (int l = 0; l < nacts; l++) {
            be->free(m->acts[l].att);
            m->acts[l].att = falloc(&ac, N * H);
        }
    }
    m->act_bytes += ac.bytes - (size_t)nacts * old;
    if (ac.failed) {
        snprintf(err, errlen, "out of memory allocating the ring-attention buffers (micro-batch %d x %d tokens)",
                 m->B, m->T);
        return -1;
    }
    return 0;
}

/* RoPE (forward, or its inverse with bwd) of x (B, T, nh, Dh): at
 * positions 0.. without context parallelism, else each chunk at its
 * global positions. */
static void rope_rows(model_t *m, act_t *x, int nh, bool bwd) {
    const backend_t *be = m->be;
    const llama_config_t *c = &m->cfg;
    int Dh = c->head_dim;
    be_rope_t rope = llama_rope(c);
    void (*op)(act_t *, int, int, int, int, int, const be_rope_t *) = bwd ? be->rope_bwd : be->rope_fwd;
    if (m->cp.size == 1) { op(x, m->B, m->T, nh, Dh, 0, &rope); return; }
    int Tc = m->cp.Tc;
    for (int b = 0; b < m->B; b++)
        for (int j = 0; j < 2; j++)
            op(be_act_at(be, x, ((size_t)b * m->T + (size_t)j * Tc) * (size_t)nh * Dh), 1, Tc, nh, Dh,
               model_cp_chunk(m->cp.size, m->cp.rank, j) * Tc, &rope);
}

/* Keep the first failure of a ring collective where fsdp looks (m->tp). */
static void cp_fail(model_t *m, int rc, const char *e) {
    if (!m->tp.rc) {
        m->tp.rc = rc;
        snprintf(m->tp.err, sizeof m->tp.err, "context-parallel group: %.480s", e);
    }
}

static int cp_shift(model_t *m, const act_t *send, act_t *recv, size_t n, comm_req_t **req) {
    char e[COMM_ERR_LEN];
    comm_dtype_t dt = m->be->act_bytes == 2 ? COMM_BF16 : COMM_F32;
    int rc = comm_ring_shift(m->cp.comm, send, recv, n, dt, req, e, sizeof e);
    if (rc) cp_fail(m, rc, e);
    return rc;
}

/* Make later compute see the shift's result: the compute stream waits for
 * it and the host collects the handle a few collectives later (comm_use;
 * the ring's buffers live as long as the model), or, with host_wait, the
 * host waits for it here. */
static void cp_wait(model_t *m, comm_req_t *req) {
    char e[COMM_ERR_LEN];
    if (!req) return;
    void *stream = m->be->stream ? m->be->stream() : NULL;
    if (!m->cp.host_wait) {
        int rc = comm_use(&m->tp.held, &req, stream, e, sizeof e);
        if (rc) cp_fail(m, rc, e);
        return;
    }
    int rc = stream ? comm_stream_wait(req, stream, e, sizeof e) : 0;
    int rc2 = comm_wait(req, e, sizeof e);
    if (rc || rc2) cp_fail(m, rc ? rc : rc2, e);
}

/* The chunk pairs of ring step s: for each row b and each local query
 * chunk j, the key/value chunks jj of the block from CP rank src = (i - s)
 * mod C that the queries see: an earlier chunk whole, the same chunk
 * causally, a later one not at all. */
typedef struct { int b, j, jj; bool causal; } cp_pair_t;

static int cp_pairs(const model_t *m, int s, cp_pair_t *out) {
    int C = m->cp.size, i = m->cp.rank, src = (i - s + C) % C, n = 0;
    for (int b = 0; b < m->B; b++)
        for (int j = 0; j < 2; j++)
            for (int jj = 0; jj < 2; jj++) {
                int qg = model_cp_chunk(C, i, j), kg = model_cp_chunk(C, src, jj);
                if (kg > qg) continue;
                out[n++] = (cp_pair_t){ b, j, jj, kg == qg };
            }
    return n;
}

/* a->ao and a->att (log-sum-exp rows) of a->q against every rank's a->k,
 * a->v: C steps, the next block's shift in flight during each. */
static void ring_attention_fwd(model_t *m, block_acts_t *a) {
    const backend_t *be = m->be;
    model_cp_t *cp = &m->cp;
    int C = cp->size, T = m->T, Tc = cp->Tc, H = m->tp.H, Hkv = m->tp.Hkv, Dh = m->cfg.head_dim;
    size_t qd = (size_t)H * Dh, kvd = (size_t)Hkv * Dh, kvn = (size_t)m->B * T * kvd, es = (size_t)be->act_bytes;
    cp_pair_t *pairs = malloc(sizeof *pairs * (size_t)m->B * 4);
    bool *have = calloc((size_t)m->B * 2, sizeof *have);
    CHECK_ALLOC(pairs);
    CHECK_ALLOC(have);
    act_t *cur = cp->kv[0], *nxt = cp->kv[1];
    be->copy(cur, a->k, kvn * es);
    be->copy(be_act_at(be, cur, kvn), a->v, kvn * es);
    for (int s = 0; s < C && !m->tp.rc; s++) {
        comm_req_t *req = NULL;
        if (s < C - 1 && cp_shift(m, cur, nxt, 2 * kvn, &req)) break;
        int np = cp_pairs(m, s, pairs);
        for (int p = 0; p < np; p++) {
            const cp_pair_t *pr = &pairs[p];
            size_t qrow = (size_t)pr->b * T + (size_t)pr->j * Tc, krow = (size_t)pr->b * T + (size_t)pr->jj * Tc;
            const act_t *q = be_act_at(be, a->q, qrow * qd), *k = be_act_at(be, cur, krow * kvd),
                        *v = be_act_at(be, cur, kvn + krow * kvd);
            act_t *o = be_act_at(be, a->ao, qrow * qd);
            float *lse = a->att + qrow * (size_t)H;
            if (!have[pr->b * 2 + pr->j]) {
                be->attn_block_fwd(o, lse, q, k, v, Tc, Tc, H, Hkv, Dh, pr->causal);
                have[pr->b * 2 + pr->j] = true;
            } else {
                be->attn_block_fwd(cp->ob, cp->lb, q, k, v, Tc, Tc, H, Hkv, Dh, pr->causal);
                be->attn_merge(o, lse, cp->ob, cp->lb, Tc, H, Dh);
            }
        }
        cp_wait(m, req);
        act_t *t = cur; cur = nxt; nxt = t;
    }
    free(pairs);
    free(have);
}

/* m->dq, m->dk, m->dv of the block's attention from m->dao: K/V go round
 * the ring again (the next block's shift in flight during each step) and
 * the dK/dV of each block travel with it, each rank adding its queries'
 * part; after C shifts every rank holds its own block's dK/dV. The dK/dV
 * shift starts once the step's kernels are queued and the host goes on
 * queueing the next step (its K/V shift, its kernels, which wait on the
 * dK/dV's event); the host never waits for it unless cp.host_wait. */
static void ring_attention_bwd(model_t *m, block_acts_t *a) {
    const backend_t *be = m->be;
    model_cp_t *cp = &m->cp;
    int C = cp->size, T = m->T, Tc = cp->Tc, H = m->tp.H, Hkv = m->tp.Hkv, Dh = m->cfg.head_dim;
    size_t qd = (size_t)H * Dh, kvd = (size_t)Hkv * Dh, kvn = (size_t)m->B * T * kvd, es = (size_t)be->act_bytes;
    cp_pair_t *pairs = malloc(sizeof *pairs * (size_t)m->B * 4);
    CHECK_ALLOC(pairs);
    act_t *cur = cp->kv[0], *nxt = cp->kv[1], *dcur = cp->dkv[0], *dnxt = cp->dkv[1];
    be->copy(cur, a->k, kvn * es);
    be->copy(be_act_at(be, cur, kvn), a->v, kvn * es);
    be->memset0(dcur, 2 * kvn * es);
    be->memset0(m->dq, (size_t)m->B * T * qd * es);
    for (int s = 0; s < C && !m->tp.rc; s++) {
        comm_req_t *req = NULL, *dreq = NULL;
        if (s < C - 1 && cp_shift(m, cur, nxt, 2 * kvn, &req)) break;
        int np = cp_pairs(m, s, pairs);
        for (int p = 0; p < np; p++) {
            const cp_pair_t *pr = &pairs[p];
            size_t qrow = (size_t)pr->b * T + (size_t)pr->j * Tc, krow = (size_t)pr->b * T + (size_t)pr->jj * Tc;
            be->attn_block_bwd(be_act_at(be, m->dq, qrow * qd), be_act_at(be, dcur, krow * kvd),
                               be_act_at(be, dcur, kvn + krow * kvd), be_act_at(be, m->dao, qrow * qd),
                               be_act_at(be, a->ao, qrow * qd), a->att + qrow * (size_t)H,
                               be_act_at(be, a->q, qrow * qd), be_act_at(be, cur, krow * kvd),
                               be_act_at(be, cur, kvn + krow * kvd), Tc, Tc, H, Hkv, Dh, pr->causal);
        }
        int rc = cp_shift(m, dcur, dnxt, 2 * kvn, &dreq);
        cp_wait(m, req);
        if (rc) break;
        cp_wait(m, dreq);
        act_t *t = cur; cur = nxt; nxt = t;
        t = dcur; dcur = dnxt; dnxt = t;
    }
    be->copy(m->dk, dcur, kvn * es);
    be->copy(m->dv, be_act_at(be, dcur, kvn), kvn * es);
    free(pairs);
}

/* ---- blocks ---- */

/* Sequence parallelism around a column-parallel matmul: the norm of this
 * rank's rows (N/T) is gathered into all N rows. With T = 1 the norm writes
 * its output in place and nothing moves. */
static void norm_gathered(model_t *m, act_t *out_full, float *rstd, const act_t *x, const act_t *w) {
    const backend_t *be = m->be;
    int D = m->cfg.dim;
    if (m->tp.size == 1) { be->rmsnorm_fwd(out_full, rstd, x, w, m->tp.N, D, m->cfg.rms_eps); return; }
    be->rmsnorm_fwd(m->tp.rows, rstd, x, w, m->tp.N, D, m->cfg.rms_eps);
    tp_gather_rows(&m->tp, out_full, m->tp.rows, (size_t)D);
}

/* After a row-parallel matmul: this rank's rows of the sum over the group
 * of the partial (N, D) in full; with T = 1 full itself. */
static const act_t *rows_summed(model_t *m, const act_t *full) {
    if (m->tp.size == 1) return full;
    tp_scatter_rows(&m->tp, m->tp.rows, full, (size_t)m->cfg.dim);
    return m->tp.rows;
}

/* Before the backward of a row-parallel matmul: dL/d(its output) on all N
 * rows, gathered from this rank's rows dx into scratch (dtmp); with T = 1
 * dx itself. */
static const act_t *rows_gathered(model_t *m, const act_t *dx) {
    if (m->tp.size == 1) return dx;
    tp_gather_rows(&m->tp, m->dtmp, dx, (size_t)m->cfg.dim);
    return m->dtmp;
}

/* The block's forward; without `attention` a->ao and a->att are taken as
 * they are (selective checkpointing's recompute: they were kept). */
static void block_forward(model_t *m, const act_t *bp, const act_t *x_in, act_t *x_out, block_acts_t *a,
                          bool attention) {
    const backend_t *be = m->be;
    const llama_config_t *c = &m->cfg;
    const model_tp_t *tp = &m->tp;
    int B = m->B, T = m->T, N = B * T, Nl = tp->N, D = c->dim, F = tp->F, H = tp->H, Hkv = tp->Hkv,
        Dh = c->head_dim, qd = H * Dh, kvd = Hkv * Dh;
#define P(i) be_act_at(be, bp, tp->blk_off[i])
    const act_t *wq = P(BLK_WQ), *wk = P(BLK_WK), *wv = P(BLK_WV), *wo = P(BLK_WO), *wg = P(BLK_WGATE),
                *wu = P(BLK_WUP), *wd = P(BLK_WDOWN), *n1 = P(BLK_ATTN_NORM), *n2 = P(BLK_FFN_NORM);
#undef P
    /* attention (this rank's heads over all N rows) */
    norm_gathered(m, a->xn1, a->rstd1, x_in, n1);
    be_rope_t rope = llama_rope(c);
    if (m->qkv && m->cp.size == 1) {
        /* wq | wk | wv are one matrix in the layout: one GEMM, then the split with RoPE */
        be->matmul_fwd(m->qkv, a->xn1, wq, N, D, qd + 2 * kvd);
        be->qkv_split_rope(a->q, a->k, a->v, m->qkv, B, T, H, Hkv, Dh, 0, &rope);
    } else {
        /* separate GEMMs; RoPE at each row's global position (context parallel chunks) */
        be->matmul_fwd(a->q, a->xn1, wq, N, D, qd);
        be->matmul_fwd(a->k, a->xn1, wk, N, D, kvd);
        be->matmul_fwd(a->v, a->xn1, wv, N, D, kvd);
        rope_rows(m, a->q, H, false);
        rope_rows(m, a->k, Hkv, false);
    }
    if (attention) {
        if (m->cp.size > 1) ring_attention_fwd(m, a);
        else be->attention_fwd(a->ao, a->att, a->q, a->k, a->v, B, T, H, Hkv, Dh);
    }
    /* the residual add inside the GEMM where the backend can (no TP: the sum is local) */
    bool res = tp->size == 1 && be->matmul_fwd_res;
    if (res) {
        be->matmul_fwd_res(a->xmid, x_in, a->ao, wo, N, qd, D);
    } else {
        be->matmul_fwd(m->ftmp, a->ao, wo, N, qd, D);
        be->add(a->xmid, x_in, rows_summed(m, m->ftmp), (size_t)Nl * D);
    }
    /* MLP (this rank's rows of gate/up, columns of down) */
    norm_gathered(m, a->xn2, a->rstd2, a->xmid, n2);
    if (be->swiglu_gu_fwd) {
        be->matmul_fwd(a->gate, a->xn2, wg, N, D, 2 * F); /* w_gate | w_up: rows gate | up */
        be->swiglu_gu_fwd(a->h, a->gate, N, F);
    } else {
        be->matmul_fwd(a->gate, a->xn2, wg, N, D, F);
        be->matmul_fwd(a->up, a->xn2, wu, N, D, F);
        be->swiglu_fwd(a->h, a->gate, a->up, (size_t)N * F);
    }
    if (res) {
        be->matmul_fwd_res(x_out, a->xmid, a->h, wd, N, F, D);
    } else {
        be->matmul_fwd(m->ftmp, a->h, wd, N, F, D);
        be->add(x_out, a->xmid, rows_summed(m, m->ftmp), (size_t)Nl * D);
    }
}

void model_block_forward(model_t *m, const act_t *bp, const act_t *x_in, act_t *x_out, block_acts_t *a) {
    block_forward(m, bp, x_in, x_out, a, true);
}

block_acts_t *model_block_acts(model_t *m, int l) {
    if (m->act_ckpt == MODEL_CKPT_NONE) return &m->acts[l];
    block_acts_t *a = &m->acts[0];
    if (m->act_ckpt == MODEL_CKPT_SELECTIVE) {
        a->ao = m->sel_ao[l];
        a->att = m->sel_att[l];
    }
    return a;
}

void model_block_recompute(model_t *m, int l, const act_t *bp, const act_t *x_in, act_t *x_out) {
    if (m->act_ckpt == MODEL_CKPT_NONE) return;
    block_forward(m, bp, x_in, x_out, model_block_acts(m, l), m->act_ckpt != MODEL_CKPT_SELECTIVE);
}

void model_block_backward(model_t *m, const act_t *bp, float *bg, const act_t *x_in, block_acts_t *a, act_t *dx) {
    const backend_t *be = m->be;
    const llama_config_t *c = &m->cfg;
    const model_tp_t *tp = &m->tp;
    int B = m->B, T = m->T, N = B * T, Nl = tp->N, D = c->dim, F = tp->F, H = tp->H, Hkv = tp->Hkv,
        Dh = c->head_dim, qd = H * Dh, kvd = Hkv * Dh;
#define P(i) be_act_at(be, bp, tp->blk_off[i])
#define G(i) (bg + tp->blk_off[i])
    /* MLP: dx is dL/d x_out and also, through the residual, part of dL/d xmid */
    be->matmul_bwd(m->dh, G(BLK_WDOWN), rows_gathered(m, dx), a->h, P(BLK_WDOWN), N, F, D, false);
    if (be->swiglu_gu_bwd) {
        be->swiglu_gu_bwd(m->dgate, m->dh, a->gate, N, F);
        be->matmul_bwd(m->dtmp, G(BLK_WGATE), m->dgate, a->xn2, P(BLK_WGATE), N, D, 2 * F, false);
    } else {
        be->swiglu_bwd(m->dgate, m->dup, m->dh, a->gate, a->up, (size_t)N * F);
        be->matmul_bwd(m->dtmp, G(BLK_WGATE), m->dgate, a->xn2, P(BLK_WGATE), N, D, F, false);
        be->matmul_bwd(m->dtmp, G(BLK_WUP), m->dup, a->xn2, P(BLK_WUP), N, D, F, true);
    }
    be->rmsnorm_bwd(dx, G(BLK_FFN_NORM), rows_summed(m, m->dtmp), a->xmid, P(BLK_FFN_NORM), a->rstd2, Nl, D);
    /* attention: dx is now dL/d xmid */
    be->matmul_bwd(m->dao, G(BLK_WO), rows_gathered(m, dx), a->ao, P(BLK_WO), N, qd, D, false);
    if (m->cp.size > 1) ring_attention_bwd(m, a);
    else be->attention_bwd(m->dq, m->dk, m->dv, m->dao, a->ao, a->q, a->k, a->v, a->att, B, T, H, Hkv, Dh);
    if (m->qkv && m->cp.size == 1) {
        be_rope_t rope = llama_rope(c);
        be->qkv_pack_rope(m->qkv, m->dq, m->dk, m->dv, B, T, H, Hkv, Dh, 0, &rope);
        be->matmul_bwd(m->dtmp, G(BLK_WQ), m->qkv, a->xn1, P(BLK_WQ), N, D, qd + 2 * kvd, false);
    } else {
        rope_rows(m, m->dq, H, true);
        rope_rows(m, m->dk, Hkv, true);
        be->matmul_bwd(m->dtmp, G(BLK_WQ), m->dq, a->xn1, P(BLK_WQ), N, D, qd, false);
        be->matmul_bwd(m->dtmp, G(BLK_WK), m->dk, a->xn1, P(BLK_WK), N, D, kvd, true);
        be->matmul_bwd(m->dtmp, G(BLK_WV), m->dv, a->xn1, P(BLK_WV), N, D, kvd, true);
    }
    be->rmsnorm_bwd(dx, G(BLK_ATTN_NORM), rows_summed(m, m->dtmp), x_in, P(BLK_ATTN_NORM), a->rstd1, Nl, D);
#undef P
#undef G
}

/* ---- embedding and head ---- */

void model_embed_forward(model_t *m, const act_t *embed, const int32_t *tokens, const int32_t *targets) {
    const backend_t *be = m->be;
    int N = m->B * m->T;
    be->from_host(m->tokens, tokens, (size_t)N * sizeof(int32_t));
    be->from_host(m->targets, targets, (size_t)N * sizeof(int32_t));
    if (m->tp.size == 1) {
        be->embedding_fwd(m->xs[0], m->tokens, embed, N, m->cfg.dim);
        return;
    }
    /* vocab-parallel: each rank adds the rows of its vocabulary slice */
    tp_embedding_fwd(&m->tp, m->ftmp, m->tokens, embed, N, m->cfg.dim);
    tp_scatter_rows(&m->tp, m->xs[0], m->ftmp, (size_t)m->cfg.dim);
}

double model_head_forward(model_t *m, const act_t *norm, const act_t *lm_head) {
    const backend_t *be = m->be;
    const llama_config_t *c = &m->cfg;
    model_tp_t *tp = &m->tp;
    int N = m->B * m->T, D = c->dim, V = tp->V;
    norm_gathered(m, m->xf, m->rstdf, m->xs[c->n_layers], norm);
    be->matmul_fwd(m->logits, m->xf, lm_head, N, D, V);
    if (tp->size == 1) be->xent_fwd(m->losses, m->logits, m->targets, N, V);
    else tp_xent_fwd(tp, m->losses, m->logits, m->targets, N, c->vocab);
    be->to_host(m->loss_host, m->losses, (size_t)N * sizeof(float));
    /* every TP rank has every row's loss; each counts its own rows */
    double s = 0;
    for (int i = tp->rank * tp->N; i < (tp->rank + 1) * tp->N; i++) s += m->loss_host[i];
    return s;
}

void model_head_backward(model_t *m, const act_t *norm, const act_t *lm_head, float *dnorm, float *dlm_head,
                         float loss_scale) {
    const backend_t *be = m->be;
    const llama_config_t *c = &m->cfg;
    model_tp_t *tp = &m->tp;
    int N = m->B * m->T, D = c->dim, V = tp->V;
    if (tp->size == 1) be->xent_bwd(m->logits, m->logits, m->targets, loss_scale, N, V);
    else tp_xent_bwd(tp, m->logits, m->logits, m->targets, loss_scale, N, c->vocab);
    be->matmul_bwd(m->dtmp, dlm_head, m->logits, m->xf, lm_head, N, D, V, false);
    be->memset0(m->dx, (size_t)tp->N * D * (size_t)be->act_bytes);
    be->rmsnorm_bwd(m->dx, dnorm, rows_summed(m, m->dtmp), m->xs[c->n_layers], norm, m->rstdf, tp->N, D);
}

void model_embed_backward(model_t *m, float *dembed) {
    if (m->tp.size == 1) {
        m->be->embedding_bwd(dembed, m->dx, m->tokens, m->B * m->T, m->cfg.dim);
        return;
    }
    tp_embedding_bwd(&m->tp, dembed, rows_gathered(m, m->dx), m->tokens, m->B * m->T, m->cfg.dim);
}

/* ---- whole model ---- */

double model_forward(model_t *m, const int32_t *tokens, const int32_t *targets) {
    int L = m->cfg.n_layers;
    model_embed_forward(m, be_act_at(m->be, m->params, m->embed_off), tokens, targets);
    for (int l = 0; l < L; l++)
        model_block_forward(m, model_block_params(m, l), m->xs[l], m->xs[l + 1], model_block_acts(m, l));
    return model_head_forward(m, be_act_at(m->be, m->params, m->norm_off), be_act_at(m->be, m->params, m->lm_head_off));
}

void model_backward(model_t *m, float loss_scale) {
    int L = m->cfg.n_layers;
    model_head_backward(m, be_act_at(m->be, m->params, m->norm_off), be_act_at(m->be, m->params, m->lm_head_off),
                        m->grads + m->norm_off,
                        m->grads + m->lm_head_off, loss_scale);
    for (int l = L - 1; l >= 0; l--) {
        /* recompute this block from its input; the output rewrites xs[l+1]
         * with the same values (ops are deterministic), which block l+1's
         * backward has finished with */
        model_block_recompute(m, l, model_block_params(m, l), m->xs[l], m->xs[l + 1]);
        model_block_backward(m, model_block_params(m, l), model_block_grads(m, l), m->xs[l], model_block_acts(m, l),
                             m->dx);
    }
    model_embed_backward(m, m->grads + m->embed_off);
}
