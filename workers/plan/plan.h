/* plan.h: a performance and memory model of one training step, used to
 * choose the parallel layout (hybrid shard degree S, tensor-parallel degree
 * T, context-parallel degree C, activation checkpointing, activation
 * offload, optimizer offload, micro-batch) for a cluster and to predict its
 * model TFLOP/s per GPU, term by term.
 *
 * The model is written down in docs/plan.md. Its four free parameters
 * (plan_params_t) are fitted to half of the published SMP rows
 * (plan_published_rows: the rows marked fitted) by plan_fit; the other half
 * is held out and checked (plan_check_published). plan_default_params
 * returns the fitted values. */
#ifndef BALLAST_PLAN_H
#define BALLAST_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/model/config.h"

/* ---- hardware ---- */

typedef struct {
    const char *name;     /* "a100-40gb", ... */
    const char *alias;    /* short name also accepted ("h100"), or NULL */
    double mem_bytes;     /* device memory capacity, bytes */
    double bf16_tflops;   /* dense bf16 tensor-core peak, TFLOP/s */
    double nvlink_gbs;    /* GPU-to-GPU bandwidth inside a node, one direction, GB/s (PCIe where no NVLink) */
    double hbm_tbs;       /* memory bandwidth, TB/s */
    double pcie_gbs;      /* host link per GPU, one direction, GB/s (line rate) */
    double attn_fwd_tflops; /* causal attention forward, head dim 128, long sequence: published kernel rate */
    double attn_bwd_tflops; /* the same for the backward (FLOPs counted as 2.5 x forward) */
    const char *attn_kernel; /* the kernel those rates are of */
} plan_gpu_t;

/* Look a GPU type up by name or alias, case-insensitively; NULL when unknown. */
const plan_gpu_t *plan_gpu_lookup(const char *name);
/* "a100-40gb|a100-80gb|h100-80gb|...", for messages. */
const char *plan_gpu_names(void);
/* The table: n gets its length. */
const plan_gpu_t *plan_gpu_table(size_t *n);

typedef struct {
    int nodes;                   /* >= 1 */
    int gpus_per_node;           /* G, >= 1 */
    const plan_gpu_t *gpu;
    double net_gbps;             /* inter-node network per node, Gb/s (p4d: 400) */
    int seq_len;                 /* tokens per sequence */
    int64_t global_batch_tokens; /* M: tokens per optimizer step, whole cluster */
    double block_time_scale;     /* measured / estimated block compute time (--calibrate FILE, plan_block_time_estimate); 0 = 1 */
} plan_cluster_t;

/* Check a cluster description; 0, or -1 with a message naming the field and
 * the fix. cfg may be NULL. */
int plan_cluster_validate(const plan_cluster_t *c, const llama_config_t *cfg, char *err, size_t errlen);

/* ---- the free parameters of the model ---- */

typedef struct {
    double gemm_eff;       /* eta: fraction of bf16 peak the block math reaches at large GEMMs */
    double interference;   /* kappa: compute time lost per second of overlapped collective */
    double net_eff;        /* beta: fraction of the network line rate NCCL reaches */
    double net_latency_us; /* alpha: latency of one inter-node ring step, microseconds */
} plan_params_t;

#define PLAN_NUM_PARAMS 4

/* The fitted values (see docs/plan.md for the fit and its residuals). */
plan_params_t plan_default_params(void);

/* ---- layouts and predictions ---- */

#define PLAN_MAX_SEQS_PER_RANK (1 << 20) /* larger per-rank batches are excluded */

typedef struct {
    int S;             /* hybrid shard degree: ranks one block's parameters are split over */
    int T;             /* tensor-parallel degree (inside a node) */
    int C;             /* context-parallel degree: ranks one sequence is split over (ring attention); 0 = 1 */
    int R;             /* replicas = world / (S * T * C) */
    bool ckpt;         /* activation checkpointing */
    bool ckpt_sel;     /* selective checkpointing (needs ckpt): attention outputs and log-sum-exp kept, not recomputed */
    bool act_offload;  /* checkpointed block inputs live in host memory (needs ckpt) */
    bool opt_offload;  /* fp32 master + AdamW moments live in host memory */
    int micro_batch;   /* sequences per micro-batch per data-parallel rank */
    int n_micro;       /* micro-batches per optimizer step */
    int seqs_per_rank; /* sequences per data-parallel rank per step */
} plan_layout_t;

typedef struct {        /* bytes per GPU */
    double params;      /* fp32 master shard + bf16 shard + gathered bf16 working set */
    double grads;       /* fp32 sharded gradient accumulator */
    double optim;       /* AdamW moments (or the streaming buffers with optimizer offload) */
    double acts;        /* activations of one micro-batch, logits and attention's working set included */
    double attn_ws;     /* of which attention's working set (fp32 dQ accumulator, ring buffers with C > 1) */
    double comm;        /* unsharded block-gradient buffers + NCCL buffers */
    double overhead;    /* CUDA context and workspaces + allocator reserve */
    double total;
    double capacity;    /* the GPU's memory */
} plan_mem_t;

typedef struct {         /* seconds per optimizer step, per GPU */
    double compute;      /* gemm + attention + elementwise (recompute included) */
    double gemm;         /* block and output-projection GEMMs at the shape-dependent efficiency */
    double attn_fwd;     /* causal attention forward (recompute included) at the kernel's rate */
    double attn_bwd;     /* causal attention backward */
    double elementwise;  /* norms, RoPE, residuals, SwiGLU: HBM-bound passes */
    double recompute;    /* the part of compute spent recomputing checkpointed blocks */
    double tp_comm;      /* TP all-reduces (on the compute stream, not overlapped) */
    double cp_comm;      /* ring-attention K/V (and dK/dV) transfers of the CP group */
    double cp_exposed;   /* the part of cp_comm not hidden behind attention, + its interference */
    double shard_comm;   /* all-gathers + reduce-scatters of the shard group */
    double replica_comm; /* gradient all-reduce across replicas */
    double offload;      /* PCIe time of activation copies */
    double optimizer;    /* AdamW step (streamed over PCIe with optimizer offload) */
    double interference; /* compute slowed by overlapped FSDP collectives (kappa x overlap) */
    double fill;         /* first gather + last reduce-scatter + last all-reduce: overlap nothing */
    double exposed;      /* step time not covered by compute + TP + optimizer: exposed comm, interference, fill */
    double step;         /* total */
    double tflops;       /* model TFLOP/s per GPU (6N + 12 L q seq: attention counted non-causal, as SMP) */
    double tflops_causal;/* the same with causal attention counted at half (6 L q seq) */
    double tokens_per_gpu_s; /* tokens per second per GPU */
    double tokens;       /* tokens per step actually processed by the cluster */
} plan_time_t;

typedef struct {
    plan_layout_t layout;
    plan_mem_t mem;
    plan_time_t time;
    bool feasible;
    char reason[160];    /* why it is excluded, when !feasible */
} plan_result_t;

/* Predict one layout (micro_batch set; R, n_micro, seqs_per_rank are
 * derived). Always fills what it can; feasible is false with a reason when
 * the layout cannot run (S does not divide, heads do not divide by T, batch
 * too small per rank, does not fit: by how much). */
void plan_evaluate(const llama_config_t *cfg, const plan_cluster_t *c, const plan_params_t *p,
                   const plan_layout_t *l, plan_result_t *out);

typedef enum { PLAN_ANY = 0, PLAN_ON, PLAN_OFF } plan_choice_t;
/* Checkpointing layouts: full only (the default, and the published runs'), selective only, or both. */
typedef enum { PLAN_CKPT_FULL = 0, PLAN_CKPT_SELECTIVE, PLAN_CKPT_BOTH } plan_ckpt_mode_t;

typedef struct {
    int T;                     /* only this tensor-parallel degree; 0 = any of 1, 2, 4, 8 */
    int C;                     /* only this context-parallel degree; 0 = any of 1, 2, 4, ..., 32 */
    bool no_accumulation;      /* one micro-batch per step: micro-batch = sequences per rank */
    plan_choice_t ckpt;        /* activation checkpointing: either, forced on, forced off */
    plan_ckpt_mode_t ckpt_mode; /* which checkpointing the layouts with it use */
    plan_choice_t act_offload; /* activation offload */
    plan_choice_t opt_offload; /* optimizer offload */
} plan_options_t;

typedef struct {
    plan_result_t *feasible;  /* best first (model TFLOP/s, then fewer memory savers) */
    size_t n_feasible;
    plan_result_t *excluded;  /* one row per excluded (S, T, savers) combination */
    size_t n_excluded;
} plan_list_t;

/* Enumerate S | world/(T C), T in {1,2,4,8} (<= G), C in {1,2,..,32}, checkpointing, activation
 * offload (with checkpointing), optimizer offload and every micro-batch that
 * divides the per-rank sequences. A memory saver is listed only where it lets
 * a micro-batch run that does not fit without it; otherwise the combination
 * is excluded with that reason. opt may be NULL (no restriction). Returns 0, or -1 with a message (bad cluster,
 * out of memory). Free with plan_list_free. */
int plan_enumerate(const llama_config_t *cfg, const plan_cluster_t *c, const plan_params_t *p,
                   const plan_options_t *opt, plan_list_t *out, char *err, size_t errlen);
void plan_list_free(plan_list_t *l);

/* Rank (1-based) of the best feasible layout with this (S, T, activation
 * offload) among distinct (S, T, activation offload) keys ranked by their
 * best variant (optimizer offload off, as in the published grid); 0 when no
 * feasible layout has that key. best (optional) gets that variant. */
int plan_key_rank(const plan_list_t *l, int S, int T, bool act_offload, plan_result_t *best);

/* The S the worker uses for --hybrid-shard-degree 0: that of the best
 * feasible layout with tensor-parallel degree T (T = 0: any T) and no context
 * parallelism. Returns S > 0,
 * or -1 with a message when nothing fits. */
int plan_choose_shard_degree(const llama_config_t *cfg, const plan_cluster_t *c, int T,
                             const plan_params_t *p, char *err, size_t errlen);

/* ---- calibration ---- */

typedef struct {
    const char *model;  /* preset name */
    int nodes;
    double tflops;      /* published model TFLOP/s per GPU */
    int S, T;
    bool act_offload;
    bool fitted;        /* used by plan_fit; the others are held out */
} plan_published_row_t;

/* The published rows (A100 40GB, 8 per node, 400 Gb/s EFA, seq 4096,
 * 4M-token batch): n gets their count. */
const plan_published_row_t *plan_published_rows(size_t *n);
/* The cluster those rows ran on, for nodes. */
plan_cluster_t plan_published_cluster(int nodes);
/* The grid the published rows were searched over. */
plan_options_t plan_published_options(void);

typedef struct {
    double predicted;   /* TFLOP/s of the published layout's best variant */
    double residual;    /* predicted / published - 1 */
    int rank;           /* plan_key_rank of the published layout */
    plan_result_t best; /* that variant */
} plan_check_t;

/* Predict each published row at its published layout, ranking within the
 * published regime (plan_published_options): one micro-batch per step,
 * checkpointing on, no optimizer offload; S, T and activation offload free. checks[n] must hold
 * as many entries as rows. Returns 0, or -1 with a message. */
int plan_check_published(const plan_params_t *p, plan_check_t *checks, char *err, size_t errlen);

/* Fit the free parameters to the fitted published rows from a fixed neutral
 * start: minimises their squared log residuals plus a penalty for each of
 * their published layouts ranked below third, within physical bounds. The
 * held-out rows take no part. Deterministic. */
int plan_fit(plan_params_t *out, double *objective, char *err, size_t errlen);

/* ---- calibration from a measured step ---- */

typedef struct {
    char model[64];     /* preset name or config path as written */
    char gpu[32];       /* GPU name as in the table */
    int seq_len, micro_batch, T, C;
    bool ckpt;
    double ms_per_layer; /* measured forward + backward (+ recompute) of one block, one GPU */
    int line;           /* line in the file */
} plan_measured_t;

/* Read the "step time per layer" table of FILE (docs/plan.md, "--calibrate
 * FILE"): rows whose figure is a placeholder are skipped. *rows is malloc'd.
 * Returns the number of rows (>= 0), or -1 with a message naming the line. */
int plan_read_measured(const char *path, plan_measured_t **rows, char *err, size_t errlen);

/* The block compute time the model estimates for a measured row's shape on
 * cluster c's GPU, seconds per layer per micro-batch. */
double plan_block_time_estimate(const llama_config_t *cfg, const plan_cluster_t *c, const plan_params_t *p,
                                const plan_measured_t *m);

#endif
