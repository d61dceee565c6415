/* plan.c: the layout planner's performance and memory model.
 *
 * One optimizer step of hybrid-sharded data parallelism with tensor
 * parallelism, as ballast runs it (DESIGN.md "Parallelism", "Memory
 * savers"), is costed from FLOPs, bytes moved and link bandwidths. The
 * formulas are in docs/plan.md; the constants below that are not fitted are
 * stated there with their sources. Relies on llama_config for shapes,
 * parameter counts and the seed's FLOP counting. */
#include "workers/plan/plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- hardware table ---- */

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * MIB)

/* Vendor datasheet figures (docs/plan.md, "GPU table", cites each); the
 * attention rates are published kernel benchmarks (FlashAttention-2 on
 * Ampere, FlashAttention-3 on Hopper) or, where none is published for the
 * GPU, the nearest published kernel's fraction of peak (docs/plan.md). */
static const plan_gpu_t gpus[] = {
    /* name        alias   memory bytes     bf16 TF  GPU-GPU GB/s  HBM TB/s  PCIe GB/s  attn fwd  bwd  kernel */
    { "a100-40gb", NULL,   40960 * MIB,     312.0,   300.0,        1.555,    32.0,      190.0,  165.0, "FlashAttention-2" },
    { "a100-80gb", NULL,   81920 * MIB,     312.0,   300.0,        2.039,    32.0,      190.0,  165.0, "FlashAttention-2" },
    { "h100-80gb", "h100", 81559 * MIB,     989.0,   450.0,        3.35,     64.0,      600.0,  550.0, "FlashAttention-3" },
    { "h200-141gb", "h200", 143771 * MIB,   989.0,   450.0,        4.8,      64.0,      600.0,  550.0, "FlashAttention-3" },
    { "b200-180gb", "b200", 180e9,          2250.0,  900.0,        8.0,      64.0,      1202.0, 1154.0, "cuDNN (H100 fraction of peak, assumed)" },
    { "l40s-48gb", "l40s",  48e9,           362.0,   32.0,         0.864,    32.0,      220.0,  191.0, "FlashAttention-2 (A100 fraction of peak, assumed)" },
};
#define N_GPUS (sizeof gpus / sizeof gpus[0])

const plan_gpu_t *plan_gpu_lookup(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < N_GPUS; i++)
        if (strcasecmp(gpus[i].name, name) == 0 || (gpus[i].alias && strcasecmp(gpus[i].alias, name) == 0))
            return &gpus[i];
    return NULL;
}

const char *plan_gpu_names(void) { return "a100-40gb|a100-80gb|h100-80gb|h200-141gb|b200-180gb|l40s-48gb"; }

const plan_gpu_t *plan_gpu_table(size_t *n) {
    *n = N_GPUS;
    return gpus;
}

/* ---- fixed constants (not fitted; docs/plan.md says where they come from) ---- */

#define NVLINK_EFF     0.80   /* NCCL bus bandwidth / NVLink line rate on NVSwitch */
#define PCIE_EFF       0.80   /* pinned-memory copy rate / PCIe line rate */
#define HBM_EFF        0.80   /* streaming kernels' share of HBM bandwidth */
#define NVLINK_LAT_US  2.0    /* latency of one intra-node ring step */
#define GEMM_HALF      128.0  /* per-GPU GEMM width at which GEMMs run at half their asymptote */
#define GEMM_MHALF     64.0   /* GEMM rows (tokens per GPU) at which GEMMs run at half their asymptote */
#define ATTN_BWD_RATIO 2.5    /* attention backward FLOPs / forward (5 matmuls vs 2, FlashAttention-2 paper) */
#define CP_MAX         32     /* largest context-parallel degree enumerated */
#define LOAD_HORIZON   2      /* offloaded block inputs kept ahead in backward */
#define CTX_BYTES      (1.25 * GIB) /* CUDA context, cuBLAS/cuDNN workspaces */
#define FRAG_FRAC      0.05   /* allocator reserve, fraction of capacity */
#define NCCL_BUF_BYTES (0.25 * GIB) /* NCCL channel buffers per communicator */
#define LOGIT_BYTES    6.0    /* bf16 logits + fp32 loss gradient, per element */
#define OPT_BYTES      30.0   /* AdamW bytes moved per parameter (fp32 master, grad, m, v r/w + bf16 out) */
#define OPT_PCIE_BYTES 30.0   /* same per parameter over PCIe with optimizer offload */

plan_params_t plan_default_params(void) {
    /* Output of plan_fit (tests/unit/test_plan.c checks that refitting
     * reproduces these). */
    return (plan_params_t){ .gemm_eff = 0.622937, .interference = 0.178857, .net_eff = 0.755664,
                            .net_latency_us = 3.535156 };
}

/* ---- validation ---- */

int plan_cluster_validate(const plan_cluster_t *c, const llama_config_t *cfg, char *err, size_t errlen) {
    (void)cfg; /* sequences past max_position_embeddings are allowed (RoPE scaling); the CLI warns */
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    if (!c->gpu) BAD("unknown GPU type: use one of %s", plan_gpu_names());
    if (c->nodes < 1) BAD("--nodes must be at least 1 (got %d)", c->nodes);
    if (c->gpus_per_node < 1) BAD("--gpus-per-node must be at least 1 (got %d)", c->gpus_per_node);
    if (!(c->net_gbps > 0) && c->nodes > 1)
        BAD("--net-gbps must be positive with more than one node (got %g); p4d has 400", c->net_gbps);
    if (c->seq_len < 1) BAD("--seq-len must be positive (got %d)", c->seq_len);
    if (c->global_batch_tokens < c->seq_len)
        BAD("--global-batch-tokens (%lld) is smaller than one sequence (--seq-len %d): raise it to at least %d",
            (long long)c->global_batch_tokens, c->seq_len, c->seq_len);
    return 0;
#undef BAD
}

/* ---- collectives ---- */

typedef struct {
    double b_nvl;   /* bytes/s per GPU over NVLink, achieved */
    double b_net;   /* bytes/s per node over the network, achieved */
    double a_nvl;   /* s per intra-node ring step */
    double a_net;   /* s per inter-node ring step */
    int G;          /* GPUs per node */
} links_t;

static double dmax(double a, double b) { return a > b ? a : b; }
static double dmin(double a, double b) { return a < b ? a : b; }

/* Ring all-gather or reduce-scatter (same traffic) of X bytes per rank (the
 * gathered size) over n ranks, m of them per node, with G/m such groups
 * running at once on every node and sharing its NICs. NCCL runs these as
 * rings: each node receives (n-1)/n * X per group over the network. */
static double coll_ring(const links_t *k, double X, int n, int m) {
    if (n <= 1 || X <= 0) return 0;
    double f = (double)(n - 1) / n * X;
    double t_nvl = m > 1 ? f / k->b_nvl : 0;
    if (n <= m) return t_nvl + (n - 1) * k->a_nvl;
    double groups = (double)k->G / m;
    double t_net = groups * f / k->b_net;
    return dmax(t_nvl, t_net) + (n - 1) * k->a_net;
}

/* All-reduce of X bytes over n ranks, m per node: hierarchical as NCCL runs
 * it across nodes (intra-node reduce-scatter, inter-node ring or tree over
 * the n/m nodes, intra-node all-gather); a plain ring inside one node. */
static double coll_allreduce(const links_t *k, double X, int n, int m) {
    if (n <= 1 || X <= 0) return 0;
    if (n <= m) return 2.0 * (n - 1) / n * X / k->b_nvl + 2.0 * (n - 1) * k->a_nvl;
    int nn = n / m;
    double t_intra = m > 1 ? 2.0 * (m - 1) / m * X / k->b_nvl + 2.0 * (m - 1) * k->a_nvl : 0;
    double groups = (double)k->G / m;
    double t_net = groups * 2.0 * (nn - 1) / nn * X / k->b_net;
    double steps_ring = 2.0 * (nn - 1), steps_tree = 2.0 * ceil(log2((double)nn));
    return t_intra + t_net + dmin(steps_ring, steps_tree) * k->a_net;
}

/* ---- one layout ---- */

static double gemm_scale(double width) { return width / (width + GEMM_HALF); }

static int n_savers(const plan_layout_t *l) { return l->ckpt + l->act_offload + l->opt_offload; }

static int cp_of(const plan_layout_t *l) { return l->C > 0 ? l->C : 1; }

/* Bytes of one CP rank's K and V chunk (bf16, its 1/T of the KV heads). */
static double kv_chunk(const llama_config_t *cfg, double tl, double T) {
    return tl * 2.0 * (double)cfg->n_kv_heads * cfg->head_dim / T * 2.0;
}

/* Memory per GPU of layout l with its micro-batch. */
static void model_memory(const llama_config_t *cfg, const plan_cluster_t *c, const plan_layout_t *l,
                         plan_mem_t *m) {
    double T = l->T, S = l->S, C = cp_of(l);
    double D = cfg->dim, F = cfg->ffn_dim, L = cfg->n_layers, V = cfg->vocab, H = cfg->n_heads;
    double q = (double)cfg->n_heads * cfg->head_dim, kv = (double)cfg->n_kv_heads * cfg->head_dim;
    double Pt = (double)llama_total_params(cfg) / T;     /* parameters per TP rank */
    double Pb = (double)llama_block_params(cfg) / T;     /* one block per TP rank */
    double Pu = dmax(Pb, V * D / T);                     /* largest gathered unit */
    double tl = (double)l->micro_batch * c->seq_len / C; /* tokens of this CP rank */

    m->params = (l->opt_offload ? 0 : 4 * Pt / S) + 2 * Pt / S + 2 * 2 * Pu;
    m->grads = 4 * Pt / S;
    m->optim = l->opt_offload ? 2 * 16 * Pu / S : 8 * Pt / S;

    /* bytes per token per layer kept for backward (flash attention, sequence
     * parallel with TP): x, norm1 out, q k v, attention out, x mid, norm2 out,
     * w1 and w3 out, SwiGLU out; plus fp32 log-sum-exp per head. */
    double a_full = (2 * (4 * D + 2 * q + 2 * kv + 3 * F) + 4 * H) / T;
    double logits = tl * V / T * LOGIT_BYTES;
    /* attention's working set in one block's backward: the fp32 dQ
     * accumulator; with C > 1 the ring's K/V receive buffers (double
     * buffered) and the travelling fp32 dK/dV */
    double kvc = kv_chunk(cfg, tl, T);
    m->attn_ws = tl * q * 4 / T + (C > 1 ? 2 * kvc + 2 * 2 * kvc : 0);
    if (!l->ckpt) {
        m->acts = L * tl * a_full + tl * a_full + logits + m->attn_ws;
    } else {
        double kept = l->act_offload ? dmin(L, LOAD_HORIZON + 1) : L;
        m->acts = kept * tl * 2 * D / T + 2 * tl * a_full + logits + m->attn_ws;
        /* selective: every block's attention output (bf16) and fp32
         * log-sum-exp stay on the GPU (offload moves block inputs only) */
        if (l->ckpt_sel) m->acts += L * tl * (2 * q + 4 * H) / T;
    }
    int comms = (l->S > 1) + (l->R > 1 || C > 1) + (l->T > 1) + (C > 1);
    m->comm = 2 * 2 * Pu + comms * NCCL_BUF_BYTES;
    m->capacity = c->gpu->mem_bytes;
    m->overhead = CTX_BYTES + FRAG_FRAC * m->capacity;
    m->total = m->params + m->grads + m->optim + m->acts + m->comm + m->overhead;
}

/* The compute-stream terms of one block for one micro-batch on one GPU
 * (seconds), before the calibration scale. */
typedef struct { double gemm, rec_gemm, attn_f, attn_b, attn_rec, elem; } block_terms_t;

static void block_terms(const llama_config_t *cfg, const plan_gpu_t *g, const plan_params_t *p, double tl,
                        double seq, double T, bool ckpt, bool sel, block_terms_t *b) {
    double D = cfg->dim, F = cfg->ffn_dim;
    double q = (double)cfg->n_heads * cfg->head_dim;
    double Pblk = (double)llama_block_params(cfg);
    double eff = p->gemm_eff * gemm_scale(D / T) * tl / (tl + GEMM_MHALF);
    double peak = g->bf16_tflops * 1e12;
    b->gemm = 6.0 * Pblk * tl / T / (peak * eff);
    b->rec_gemm = ckpt ? 2.0 * Pblk * tl / T / (peak * eff) : 0;
    /* causal attention: each of the rank's tl query tokens sees on average
     * seq/2 keys (load-balanced ring with C > 1): forward 2 seq q FLOPs per
     * token (QK^T and PV at half), backward 2.5 x that */
    double f_fwd = 2.0 * seq * q * tl / T;
    b->attn_f = f_fwd / (g->attn_fwd_tflops * 1e12);
    b->attn_b = ATTN_BWD_RATIO * f_fwd / (g->attn_bwd_tflops * 1e12);
    b->attn_rec = ckpt && !sel ? b->attn_f : 0; /* selective keeps the attention output */
    double passes = 3.0 + (ckpt ? 1.0 : 0.0);
    b->elem = (14 * D + 3 * F) * 2 * passes * tl / T / (g->hbm_tbs * 1e12 * HBM_EFF);
}

static double block_sum(const block_terms_t *b) {
    return b->gemm + b->rec_gemm + b->attn_f + b->attn_b + b->attn_rec + b->elem;
}

/* Step time of layout l. */
static void model_time(const llama_config_t *cfg, const plan_cluster_t *c, const plan_params_t *p,
                       const plan_layout_t *l, plan_time_t *t) {
    const plan_gpu_t *g = c->gpu;
    int G = c->gpus_per_node, W = c->nodes * G, Ci = cp_of(l);
    double T = l->T, S = l->S, C = Ci;
    double D = cfg->dim, L = cfg->n_layers, V = cfg->vocab;
    double q = (double)cfg->n_heads * cfg->head_dim;
    double Pblk = (double)llama_block_params(cfg);
    double seq = c->seq_len, tl = (double)l->micro_batch * seq / C;
    double scale = c->block_time_scale > 0 ? c->block_time_scale : 1.0;
    links_t k = {
        .b_nvl = g->nvlink_gbs * 1e9 * NVLINK_EFF,
        .b_net = c->net_gbps / 8.0 * 1e9 * p->net_eff,
        .a_nvl = NVLINK_LAT_US * 1e-6,
        .a_net = p->net_latency_us * 1e-6,
        .G = G,
    };
    if (!(k.b_net > 0)) k.b_net = 1e-9; /* single node: never used across nodes */

    /* compute stream: the blocks (GEMMs at the shape-dependent efficiency,
     * causal attention at the kernel's rate, HBM-bound element-wise passes),
     * the output projection, TP all-reduces in line */
    block_terms_t bt;
    block_terms(cfg, g, p, tl, seq, T, l->ckpt, l->ckpt_sel, &bt);
    double eff = p->gemm_eff * gemm_scale(D / T) * tl / (tl + GEMM_MHALF);
    double t_head = 6.0 * V * D * tl / T / (g->bf16_tflops * 1e12 * eff);
    double t_blocks = L * block_sum(&bt) * scale;
    double t_tp_one = l->T > 1 ? coll_allreduce(&k, tl * D * 2, l->T, l->T) : 0;
    double t_tp = L * (4 + (l->ckpt ? 2 : 0)) * t_tp_one;

    /* ring attention (C > 1): every pass sends the rank's K/V chunk C-1
     * times around the ring (backward: K/V again plus fp32 dK/dV); each
     * step's transfer overlaps the attention of the block in hand, so only
     * what attention cannot cover is exposed, and the covered part slows it
     * by kappa like any collective */
    double t_cp = 0, t_cp_exp = 0;
    if (Ci > 1) {
        double kvc = kv_chunk(cfg, tl, T);
        int m_c = Ci < G / l->T ? Ci : G / l->T; /* CP ranks per node */
        if (m_c < 1) m_c = 1;
        double one;
        if (Ci <= m_c) one = kvc / k.b_nvl + k.a_nvl;
        else one = dmax(m_c > 1 ? kvc / k.b_nvl : 0, (double)G / m_c * kvc / k.b_net) + k.a_net;
        double steps = C - 1;
        double pass_f = steps * one, pass_b = steps * 3 * one;
        double a_f = bt.attn_f * scale, a_b = bt.attn_b * scale;
        double exp_f = dmax(0, pass_f - a_f) + p->interference * dmin(pass_f, a_f);
        double exp_b = dmax(0, pass_b - a_b) + p->interference * dmin(pass_b, a_b);
        int n_f = l->ckpt && !l->ckpt_sel ? 2 : 1; /* the recompute's ring pass, unless selective */
        t_cp = L * (n_f * pass_f + pass_b);
        t_cp_exp = L * (n_f * exp_f + exp_b);
    }
    double Cs = t_blocks + t_head + t_tp + t_cp_exp;

    /* collective stream: FSDP units are the L blocks, the embedding and
     * (untied) the output projection, each gathered in bf16. Rank order: T
     * fastest, then C, then S, then R. */
    int tc = l->T * Ci;
    int m_s = tc < G ? G / tc : 1;                           /* shard ranks per node */
    if (m_s > l->S) m_s = l->S;
    int m_r = l->S * tc < G ? G / (l->S * tc) : 1;           /* replica ranks per node */
    if (m_r > l->R) m_r = l->R;
    int m_cn = Ci < G / l->T ? Ci : G / l->T;                /* CP ranks per node */
    if (m_cn < 1) m_cn = 1;
    int n_g = l->R * Ci, m_g = m_cn * m_r;                   /* gradient group: same shard */
    if (m_g > n_g) m_g = n_g;
    double ub = 2 * Pblk / T, ue = 2 * V * D / T;
    int n_emb = cfg->tie_embeddings ? 1 : 2;
    double ag_blk = coll_ring(&k, ub, l->S, m_s), ag_emb = coll_ring(&k, ue, l->S, m_s);
    double ag_pass = L * ag_blk + n_emb * ag_emb;           /* reduce-scatter: same traffic */
    /* the ranks holding the same shard (replicas, and the CP ranks of one
     * sequence) all-reduce the accumulated fp32 gradient shard once per step */
    double ar_blk = coll_allreduce(&k, 2 * ub / S, n_g, m_g), ar_emb = coll_allreduce(&k, 2 * ue / S, n_g, m_g);
    double ar_step = L * ar_blk + n_emb * ar_emb;
    double K = 3 * ag_pass;                                  /* AG fwd, AG bwd, RS bwd */
    double fill = 2 * ag_blk;                                /* first gather, last reduce-scatter */

    /* offload stream */
    double b_pcie = g->pcie_gbs * 1e9 * PCIE_EFF;
    double O = l->act_offload ? 2 * L * tl * 2 * D / T / b_pcie : 0;

    /* overlap: the three streams run side by side; collectives slow the
     * compute they overlap by kappa; gathers of the first unit and the last
     * reduce-scatter (and all-reduce) cannot overlap anything */
    double i_mb = p->interference * dmin(Cs, K);
    double t_mb = dmax(dmax(Cs, K), O) + i_mb + fill;
    double K_last = K + ar_step;
    double i_last = p->interference * dmin(Cs, K_last);
    double t_last = dmax(dmax(Cs, K_last), O) + i_last + fill + ar_blk;

    double Pshard = (double)llama_total_params(cfg) / T / S;
    double t_opt = Pshard * OPT_BYTES / (g->hbm_tbs * 1e12 * HBM_EFF);
    if (l->opt_offload) t_opt = dmax(t_opt, Pshard * OPT_PCIE_BYTES / b_pcie);

    int nm = l->n_micro;
    t->gemm = nm * (L * (bt.gemm + bt.rec_gemm) * scale + t_head);
    t->attn_fwd = nm * L * (bt.attn_f + bt.attn_rec) * scale;
    t->attn_bwd = nm * L * bt.attn_b * scale;
    t->elementwise = nm * L * bt.elem * scale;
    t->compute = t->gemm + t->attn_fwd + t->attn_bwd + t->elementwise;
    t->recompute = nm * L * (bt.rec_gemm + bt.attn_rec) * scale;
    t->tp_comm = nm * t_tp;
    t->cp_comm = nm * t_cp;
    t->cp_exposed = nm * t_cp_exp;
    t->shard_comm = nm * K;
    t->replica_comm = ar_step;
    t->offload = nm * O;
    t->optimizer = t_opt;
    t->interference = (nm - 1) * i_mb + i_last;
    t->fill = nm * fill + ar_blk;
    t->step = (nm - 1) * t_mb + t_last + t_opt;
    t->exposed = t->step - t->compute - t->tp_comm - t->cp_exposed - t_opt;
    t->tokens = (double)l->seqs_per_rank * seq * (double)l->R * l->S;
    double f_tok = llama_flops_per_token(cfg, c->seq_len);
    t->tflops = f_tok * t->tokens / W / t->step / 1e12;
    t->tflops_causal = (f_tok - 6.0 * L * q * seq) * t->tokens / W / t->step / 1e12;
    t->tokens_per_gpu_s = t->tokens / W / t->step;
}

double plan_block_time_estimate(const llama_config_t *cfg, const plan_cluster_t *c, const plan_params_t *p,
                                const plan_measured_t *m) {
    block_terms_t bt;
    int C = m->C > 0 ? m->C : 1;
    block_terms(cfg, c->gpu, p, (double)m->micro_batch * m->seq_len / C, m->seq_len, m->T, m->ckpt, false, &bt);
    return block_sum(&bt);
}

void plan_evaluate(const llama_config_t *cfg, const plan_cluster_t *c, const plan_params_t *p,
                   const plan_layout_t *in, plan_result_t *out) {
    memset(out, 0, sizeof *out);
    out->layout = *in;
    plan_layout_t *l = &out->layout;
    int G = c->gpus_per_node, W = c->nodes * G;
#define EXCLUDE(...) do { snprintf(out->reason, sizeof out->reason, __VA_ARGS__); return; } while (0)
    if (l->T < 1 || l->S < 1) EXCLUDE("S and T must be positive");
    if (l->T > G) EXCLUDE("T=%d exceeds the %d GPUs of a node (TP stays inside a node)", l->T, G);
    if (G % l->T) EXCLUDE("T=%d does not divide the %d GPUs of a node", l->T, G);
    if (cfg->n_heads % l->T) EXCLUDE("heads (%d) do not divide by T=%d", cfg->n_heads, l->T);
    if (cfg->n_kv_heads % l->T) EXCLUDE("key/value heads (%d) do not divide by T=%d", cfg->n_kv_heads, l->T);
    if (cfg->ffn_dim % l->T) EXCLUDE("intermediate size (%d) does not divide by T=%d", cfg->ffn_dim, l->T);
    if (l->C == 0) l->C = 1;
    if (l->C < 1 || l->C > CP_MAX) EXCLUDE("C=%d is outside 1..%d", l->C, CP_MAX);
    if (W % (l->T * l->C)) EXCLUDE("T x C = %d does not divide the world of %d GPUs", l->T * l->C, W);
    if (l->C > 1 && c->seq_len % (2 * l->C))
        EXCLUDE("seq len %d does not split into 2 x C = %d equal chunks (load-balanced ring attention)", c->seq_len,
                2 * l->C);
    int dp = W / (l->T * l->C);
    if (dp % l->S) EXCLUDE("S=%d does not divide world/(T x C) = %d", l->S, dp);
    l->R = dp / l->S;
    if (l->act_offload && !l->ckpt) EXCLUDE("activation offload needs activation checkpointing");
    if (l->ckpt_sel && !l->ckpt) EXCLUDE("selective checkpointing is a kind of activation checkpointing");
    int64_t per_rank_tokens = c->global_batch_tokens / ((int64_t)l->R * l->S);
    if (per_rank_tokens < c->seq_len)
        EXCLUDE("batch too small per rank: %lld tokens / (R=%d x S=%d) = %lld < seq len %d (a larger T or C shares "
                "one sequence)", (long long)c->global_batch_tokens, l->R, l->S, (long long)per_rank_tokens, c->seq_len);
    if (per_rank_tokens / c->seq_len > PLAN_MAX_SEQS_PER_RANK)
        EXCLUDE("batch too large per rank: %lld sequences per data-parallel rank (the planner handles up to %d)",
                (long long)(per_rank_tokens / c->seq_len), PLAN_MAX_SEQS_PER_RANK);
    l->seqs_per_rank = (int)(per_rank_tokens / c->seq_len);
    if (l->micro_batch < 1 || l->seqs_per_rank % l->micro_batch)
        EXCLUDE("micro-batch %d does not divide the %d sequences per rank", l->micro_batch, l->seqs_per_rank);
    l->n_micro = l->seqs_per_rank / l->micro_batch;
    model_memory(cfg, c, l, &out->mem);
    model_time(cfg, c, p, l, &out->time);
    if (out->mem.total > out->mem.capacity)
        EXCLUDE("does not fit: needs %.1f GiB of %.1f GiB (over by %.1f GiB) at micro-batch %d",
                out->mem.total / GIB, out->mem.capacity / GIB, (out->mem.total - out->mem.capacity) / GIB,
                l->micro_batch);
    out->feasible = true;
#undef EXCLUDE
}

/* ---- enumeration ---- */

typedef struct { bool ckpt, aoff, ooff, sel; } savers_t;
static const savers_t saver_sets[] = {
    { 0, 0, 0, 0 }, { 1, 0, 0, 0 }, { 1, 1, 0, 0 }, { 0, 0, 1, 0 }, { 1, 0, 1, 0 }, { 1, 1, 1, 0 },
    { 1, 0, 0, 1 }, { 1, 1, 0, 1 }, { 1, 0, 1, 1 }, { 1, 1, 1, 1 }, /* selective checkpointing */
};
#define N_SAVERS (sizeof saver_sets / sizeof saver_sets[0])

static bool choice_ok(plan_choice_t c, bool on) { return c == PLAN_ANY || (c == PLAN_ON) == on; }

static int saver_index(bool ckpt, bool aoff, bool ooff, bool sel) {
    for (size_t i = 0; i < N_SAVERS; i++)
        if (saver_sets[i].ckpt == ckpt && saver_sets[i].aoff == aoff && saver_sets[i].ooff == ooff &&
            saver_sets[i].sel == sel)
            return (int)i;
    return -1;
}

static int cmp_feasible(const void *a, const void *b) {
    const plan_result_t *x = a, *y = b;
    if (x->time.tflops != y->time.tflops) return x->time.tflops > y->time.tflops ? -1 : 1;
    int sx = n_savers(&x->layout), sy = n_savers(&y->layout);
    if (sx != sy) return sx - sy;
    if (x->layout.T != y->layout.T) return x->layout.T - y->layout.T;
    if (x->layout.C != y->layout.C) return x->layout.C - y->layout.C;
    if (x->layout.S != y->layout.S) return x->layout.S - y->layout.S;
    return x->layout.micro_batch - y->layout.micro_batch;
}

typedef struct { plan_result_t *v; size_t n, cap; } vec_t;

static int vec_push(vec_t *v, const plan_result_t *r) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        plan_result_t *nv = realloc(v->v, cap * sizeof *nv);
        if (!nv) return -1;
        v->v = nv; v->cap = cap;
    }
    v->v[v->n++] = *r;
    return 0;
}

/* Evaluate every saver set and micro-batch of one (S, T); push the listed
 * ones and one excluded row per saver set with nothing listed. */
static int enumerate_st(const llama_config_t *cfg, const plan_cluster_t *c, const plan_params_t *p,
                        const plan_options_t *opt, int S, int T, int C, vec_t *ok, vec_t *bad) {
    plan_layout_t l = { .S = S, .T = T, .C = C, .micro_batch = 1 };
    plan_result_t r;
    plan_evaluate(cfg, c, p, &l, &r);
    if (!r.feasible && strncmp(r.reason, "does not fit", 12) != 0) return vec_push(bad, &r);
    int nseq = r.layout.seqs_per_rank;
    int nb = 0;
    int *mbs = malloc(sizeof(int) * (size_t)nseq);
    if (!mbs) return -1;
    for (int b = opt->no_accumulation ? nseq : 1; b <= nseq; b++) if (nseq % b == 0) mbs[nb++] = b;
    plan_result_t *res = calloc(N_SAVERS * (size_t)nb, sizeof *res);
    if (!res) { free(mbs); return -1; }
    for (size_t s = 0; s < N_SAVERS; s++)
        for (int i = 0; i < nb; i++) {
            plan_layout_t li = { .S = S, .T = T, .C = C, .ckpt = saver_sets[s].ckpt, .ckpt_sel = saver_sets[s].sel,
                                 .act_offload = saver_sets[s].aoff,
                                 .opt_offload = saver_sets[s].ooff, .micro_batch = mbs[i] };
            plan_evaluate(cfg, c, p, &li, &res[s * nb + i]);
        }
    bool allowed[N_SAVERS];
    for (size_t s = 0; s < N_SAVERS; s++) {
        const savers_t *sv = &saver_sets[s];
        bool mode_ok = !sv->ckpt || opt->ckpt_mode == PLAN_CKPT_BOTH ||
                       (opt->ckpt_mode == PLAN_CKPT_SELECTIVE) == sv->sel;
        allowed[s] = choice_ok(opt->ckpt, sv->ckpt) && choice_ok(opt->act_offload, sv->aoff) &&
                     choice_ok(opt->opt_offload, sv->ooff) && mode_ok;
    }
    int rc = 0;
    for (size_t s = 0; s < N_SAVERS && rc == 0; s++) {
        const savers_t *sv = &saver_sets[s];
        if (!allowed[s]) continue;
        /* the same set with one saver removed */
        int without[3] = { -1, -1, -1 };
        if (sv->ckpt) without[0] = saver_index(false, false, sv->ooff, false);
        if (sv->aoff) without[1] = saver_index(true, false, sv->ooff, sv->sel);
        if (sv->ooff) without[2] = saver_index(sv->ckpt, sv->aoff, false, sv->sel);
        int listed = 0, fitting = 0, dropped = -1;
        for (int i = 0; i < nb && rc == 0; i++) {
            plan_result_t *x = &res[s * nb + i];
            if (!x->feasible) continue;
            fitting++;
            int drop = -1;
            static const int order[3] = { 1, 2, 0 }; /* name the most specific saver first */
            for (int o = 0; o < 3 && drop < 0; o++) {
                int w = order[o];
                if (without[w] >= 0 && allowed[without[w]] && res[without[w] * nb + i].feasible) drop = w;
            }
            if (drop >= 0) { if (dropped < 0) dropped = drop; continue; }
            rc = vec_push(ok, x);
            listed++;
        }
        if (rc || listed) continue;
        plan_result_t e = res[s * nb]; /* the smallest micro-batch */
        if (fitting) {
            static const char *what[] = { "activation checkpointing", "activation offload", "optimizer offload" };
            e.feasible = false;
            snprintf(e.reason, sizeof e.reason, "%s not needed: every micro-batch that fits with it fits without it",
                     what[dropped]);
        }
        rc = vec_push(bad, &e);
    }
    free(res);
    free(mbs);
    return rc;
}

int plan_enumerate(const llama_config_t *cfg, const plan_cluster_t *c, const plan_params_t *p,
                   const plan_options_t *opt, plan_list_t *out, char *err, size_t errlen) {
    static const plan_options_t none = { 0 };
    if (!opt) opt = &none;
    memset(out, 0, sizeof *out);
    if (plan_cluster_validate(c, cfg, err, errlen)) return -1;
    if (llama_config_validate(cfg, err, errlen)) return -1;
    int G = c->gpus_per_node, W = c->nodes * G;
    vec_t ok = { 0 }, bad = { 0 };
    static const int Ts[] = { 1, 2, 4, 8 };
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        int T = Ts[ti];
        if (opt->T && T != opt->T) continue;
        plan_layout_t l = { .S = 1, .T = T, .micro_batch = 1 };
        plan_result_t r;
        if (T > G || G % T || cfg->n_heads % T || cfg->n_kv_heads % T || cfg->ffn_dim % T) {
            plan_evaluate(cfg, c, p, &l, &r); /* fills the reason */
            if (vec_push(&bad, &r)) goto oom;
            continue;
        }
        for (int C = 1; C <= CP_MAX; C *= 2) {
            if (opt->C && C != opt->C) continue;
            if (W % (T * C)) continue;
            if (C > 1 && c->seq_len % (2 * C)) {
                plan_layout_t lc = { .S = 1, .T = T, .C = C, .micro_batch = 1 };
                plan_evaluate(cfg, c, p, &lc, &r); /* fills the reason */
                if (vec_push(&bad, &r)) goto oom;
                continue;
            }
            int dp = W / (T * C);
            for (int S = 1; S <= dp; S++) {
                if (dp % S) continue;
                if (enumerate_st(cfg, c, p, opt, S, T, C, &ok, &bad)) goto oom;
            }
        }
    }
    if (ok.n) qsort(ok.v, ok.n, sizeof *ok.v, cmp_feasible);
    out->feasible = ok.v; out->n_feasible = ok.n;
    out->excluded = bad.v; out->n_excluded = bad.n;
    return 0;
oom:
    free(ok.v); free(bad.v);
    snprintf(err, errlen, "out of memory enumerating layouts");
    return -1;
}

void plan_list_free(plan_list_t *l) {
    free(l->feasible);
    free(l->excluded);
    memset(l, 0, sizeof *l);
}

int plan_key_rank(const plan_list_t *l, int S, int T, bool act_offload, plan_result_t *best) {
    /* keys seen so far, in rank order */
    int rank = 0;
    for (size_t i = 0; i < l->n_feasible; i++) {
        const plan_layout_t *x = &l->feasible[i].layout;
        if (x->opt_offload || x->C > 1) continue;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++) {
            const plan_layout_t *y = &l->feasible[j].layout;
            seen = !y->opt_offload && y->C <= 1 && y->S == x->S && y->T == x->T && y->act_offload == x->act_offload;
        }
        if (seen) continue;
        rank++;
        if (x->S == S && x->T == T && x->act_offload == act_offload) {
            if (best) *best = l->feasible[i];
            return rank;
        }
    }
    return 0;
}

int plan_choose_shard_degree(const llama_config_t *cfg, const plan_cluster_t *c, int T,
                             const plan_params_t *p, char *err, size_t errlen) {
    plan_list_t l;
    plan_options_t opt = { .T = T, .C = 1 };
    if (plan_enumerate(cfg, c, p, &opt, &l, err, errlen)) return -1;
    int S = -1;
    for (size_t i = 0; i < l.n_feasible; i++)
        if (T == 0 || l.feasible[i].layout.T == T) { S = l.feasible[i].layout.S; break; }
    if (S < 0)
        snprintf(err, errlen, "no layout with tensor-parallel degree %d fits %s on %d x %d %s: "
                 "try more nodes, a larger T, or a shorter sequence (ballast plan --show-excluded lists why)",
                 T, cfg->name, c->nodes, c->gpus_per_node, c->gpu->name);
    plan_list_free(&l);
    return S;
}

/* ---- calibration ---- */

/* Fitted: 7B at 16 and 64 nodes, 13B at 32 and 128; held out: the other
 * four (interpolation between and extrapolation beyond the fitted node
 * counts, and the one row that needs activation offload). */
static const plan_published_row_t published[] = {
    { "llama2-7b", 16, 136.76, 32, 1, false, true },
    { "llama2-7b", 32, 132.65, 64, 1, false, false },
    { "llama2-7b", 64, 125.31, 64, 1, false, true },
    { "llama2-7b", 128, 115.01, 64, 1, false, false },
    { "llama2-13b", 16, 141.43, 32, 1, true, false },
    { "llama2-13b", 32, 139.46, 256, 1, false, true },
    { "llama2-13b", 64, 132.17, 128, 1, false, false },
    { "llama2-13b", 128, 120.75, 128, 1, false, true },
};

const plan_published_row_t *plan_published_rows(size_t *n) {
    *n = sizeof published / sizeof published[0];
    return published;
}

plan_cluster_t plan_published_cluster(int nodes) {
    return (plan_cluster_t){ .nodes = nodes, .gpus_per_node = 8, .gpu = plan_gpu_lookup("a100-40gb"),
                             .net_gbps = 400, .seq_len = 4096, .global_batch_tokens = 4 * 1024 * 1024 };
}

plan_options_t plan_published_options(void) {
    return (plan_options_t){ .C = 1, .no_accumulation = true, .ckpt = PLAN_ON, .opt_offload = PLAN_OFF };
}

int plan_check_published(const plan_params_t *p, plan_check_t *checks, char *err, size_t errlen) {
    size_t n;
    const plan_published_row_t *rows = plan_published_rows(&n);
    for (size_t i = 0; i < n; i++) {
        const llama_config_t *cfg = llama_preset(rows[i].model);
        plan_cluster_t c = plan_published_cluster(rows[i].nodes);
        plan_list_t l;
        plan_options_t opt = plan_published_options();
        if (plan_enumerate(cfg, &c, p, &opt, &l, err, errlen)) return -1;
        memset(&checks[i], 0, sizeof checks[i]);
        checks[i].rank = plan_key_rank(&l, rows[i].S, rows[i].T, rows[i].act_offload, &checks[i].best);
        checks[i].predicted = checks[i].rank ? checks[i].best.time.tflops : 0;
        checks[i].residual = checks[i].predicted / rows[i].tflops - 1;
        plan_list_free(&l);
    }
    return 0;
}

static const double lo[PLAN_NUM_PARAMS] = { 0.30, 0.0, 0.40, 1.0 };
static const double hi[PLAN_NUM_PARAMS] = { 0.95, 0.6, 1.00, 60.0 };

static void params_set(plan_params_t *p, const double *v) {
    p->gemm_eff = v[0]; p->interference = v[1]; p->net_eff = v[2]; p->net_latency_us = v[3];
}

static int objective(const double *v, double *obj, char *err, size_t errlen) {
    plan_params_t p;
    params_set(&p, v);
    size_t n;
    plan_check_t ch[16];
    if (plan_check_published(&p, ch, err, errlen)) return -1;
    double s = 0;
    const plan_published_row_t *rows = plan_published_rows(&n);
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].fitted) continue;
        if (!ch[i].rank) { s += 1.0; continue; }
        double r = log(ch[i].predicted / rows[i].tflops);
        s += r * r;
        if (ch[i].rank > 3) s += 0.1 * (ch[i].rank - 3);
    }
    *obj = s;
    return 0;
}

int plan_fit(plan_params_t *out, double *obj_out, char *err, size_t errlen) {
    double v[PLAN_NUM_PARAMS], step[PLAN_NUM_PARAMS], best;
    for (int i = 0; i < PLAN_NUM_PARAMS; i++) {
        v[i] = 0.5 * (lo[i] + hi[i]);
        step[i] = 0.25 * (hi[i] - lo[i]);
    }
    if (objective(v, &best, err, errlen)) return -1;
    /* compass search: try +-step on each parameter, keep improvements,
     * halve the steps when none helps */
    for (int iter = 0; iter < 400; iter++) {
        bool improved = false;
        for (int i = 0; i < PLAN_NUM_PARAMS; i++)
            for (int dir = -1; dir <= 1; dir += 2) {
                double w[PLAN_NUM_PARAMS];
                memcpy(w, v, sizeof w);
                w[i] = dmin(hi[i], dmax(lo[i], v[i] + dir * step[i]));
                if (w[i] == v[i]) continue;
                double o;
                if (objective(w, &o, err, errlen)) return -1;
                if (o < best - 1e-12) { best = o; memcpy(v, w, sizeof v); improved = true; }
            }
        if (!improved) {
            bool small = true;
            for (int i = 0; i < PLAN_NUM_PARAMS; i++) {
                step[i] *= 0.5;
                if (step[i] > 1e-4 * (hi[i] - lo[i])) small = false;
            }
            if (small) break;
        }
    }
    params_set(out, v);
    if (obj_out) *obj_out = best;
    return 0;
}

/* ---- measured step time per layer (--calibrate FILE) ---- */

static const char *measured_cols[] = { "model", "gpu", "seq_len", "micro_batch", "tp", "cp", "ckpt", "ms_per_layer" };
#define N_MEASURED_COLS (sizeof measured_cols / sizeof measured_cols[0])

/* Split a Markdown table row into trimmed cells (in place); returns the
 * count, or -1 when the line is not a row. */
static int split_row(char *line, char **cells, int max) {
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p != '|') return -1;
    p++;
    int n = 0;
    for (;;) {
        char *bar = strchr(p, '|');
        if (!bar) break;
        *bar = 0;
        char *a = p, *e = bar;
        while (*a == ' ' || *a == '\t') a++;
        while (e > a && (e[-1] == ' ' || e[-1] == '\t')) e--;
        *e = 0;
        if (n < max) cells[n] = a;
        n++;
        p = bar + 1;
    }
    return n;
}

static bool placeholder(const char *s) {
    return !*s || !strcmp(s, "-") || !strcmp(s, "\xe2\x80\x94") /* em dash */ || !strcmp(s, "\xe2\x80\x93");
}

static int parse_pos_int(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 1 || v > (1 << 24)) return -1;
    *out = (int)v;
    return 0;
}

int plan_read_measured(const char *path, plan_measured_t **rows, char *err, size_t errlen) {
#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); goto fail; } while (0)
    *rows = NULL;
    FILE *f = fopen(path, "r");
    if (!f) { snprintf(err, errlen, "--calibrate %s: cannot open: %s", path, strerror(errno)); return -1; }
    char line[1024];
    int lineno = 0, state = 0, n = 0, cap = 0;
    plan_measured_t *v = NULL;
    /* state 0: looking for the heading; 1: header row; 2: separator; 3: rows */
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n') line[--len] = 0;
        else if (len == sizeof line - 1) FAIL("%s:%d: line longer than %zu characters", path, lineno, sizeof line - 2);
        if (len && line[len - 1] == '\r') line[--len] = 0;
        if (state == 0) {
            if (line[0] == '#' && strcasestr(line, "step time per layer")) state = 1;
            continue;
        }
        char *cells[16];
        int nc = split_row(line, cells, 16);
        if (state == 1) {
            if (nc < 0) { if (len == 0) continue; FAIL("%s:%d: expected the table's header row after the heading", path, lineno); }
            if (nc != (int)N_MEASURED_COLS) FAIL("%s:%d: the header has %d columns; it must be | model | gpu | seq_len | "
                                                 "micro_batch | tp | cp | ckpt | ms_per_layer |", path, lineno, nc);
            for (size_t i = 0; i < N_MEASURED_COLS; i++)
                if (strcasecmp(cells[i], measured_cols[i]))
                    FAIL("%s:%d: column %zu is '%s', expected '%s'", path, lineno, i + 1, cells[i], measured_cols[i]);
            state = 2;
            continue;
        }
        if (state == 2) {
            if (nc != (int)N_MEASURED_COLS || strspn(cells[0], "-:") != strlen(cells[0]) || !*cells[0])
                FAIL("%s:%d: expected the separator row |---|---|...| under the header", path, lineno);
            state = 3;
            continue;
        }
        if (nc < 0) break; /* the table ends */
        if (nc != (int)N_MEASURED_COLS)
            FAIL("%s:%d: %d cells, the table has %zu", path, lineno, nc, N_MEASURED_COLS);
        if (placeholder(cells[7])) continue; /* not measured yet */
        plan_measured_t m;
        memset(&m, 0, sizeof m);
        m.line = lineno;
        if (!*cells[0] || strlen(cells[0]) >= sizeof m.model) FAIL("%s:%d: model: empty or longer than %zu characters", path, lineno, sizeof m.model - 1);
        snprintf(m.model, sizeof m.model, "%s", cells[0]);
        const plan_gpu_t *g = plan_gpu_lookup(cells[1]);
        if (!g) FAIL("%s:%d: gpu '%s' is unknown: use one of %s", path, lineno, cells[1], plan_gpu_names());
        snprintf(m.gpu, sizeof m.gpu, "%s", g->name);
        if (parse_pos_int(cells[2], &m.seq_len)) FAIL("%s:%d: seq_len '%s' is not a positive integer", path, lineno, cells[2]);
        if (parse_pos_int(cells[3], &m.micro_batch)) FAIL("%s:%d: micro_batch '%s' is not a positive integer", path, lineno, cells[3]);
        if (parse_pos_int(cells[4], &m.T) || (m.T & (m.T - 1)) || m.T > 8) FAIL("%s:%d: tp '%s' must be 1, 2, 4 or 8", path, lineno, cells[4]);
        if (parse_pos_int(cells[5], &m.C) || m.C > CP_MAX) FAIL("%s:%d: cp '%s' must be 1..%d", path, lineno, cells[5], CP_MAX);
        if ((int64_t)m.micro_batch * m.seq_len % m.C) FAIL("%s:%d: cp %d does not divide micro_batch x seq_len", path, lineno, m.C);
        if (!strcasecmp(cells[6], "yes")) m.ckpt = true;
        else if (strcasecmp(cells[6], "no")) FAIL("%s:%d: ckpt '%s' must be yes or no", path, lineno, cells[6]);
        char *end;
        m.ms_per_layer = strtod(cells[7], &end);
        if (end == cells[7] || *end || !(m.ms_per_layer > 0) || !isfinite(m.ms_per_layer) || m.ms_per_layer > 1e7)
            FAIL("%s:%d: ms_per_layer '%s' is not a positive number of milliseconds (or '-' when not measured)", path,
                 lineno, cells[7]);
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            plan_measured_t *nv = realloc(v, sizeof *nv * (size_t)cap);
            if (!nv) FAIL("out of memory");
            v = nv;
        }
        v[n++] = m;
    }
    if (ferror(f)) FAIL("--calibrate %s: read error", path);
    if (state == 0) FAIL("%s: no heading containing 'Step time per layer' (docs/plan.md, \"--calibrate FILE\", shows the table)", path);
    if (state < 3) FAIL("%s: the 'Step time per layer' table is incomplete (header and separator rows needed)", path);
    fclose(f);
    *rows = v;
    return n;
fail:
    fclose(f);
    free(v);
    return -1;
#undef FAIL
}
