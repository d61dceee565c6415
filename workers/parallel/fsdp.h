/* fsdp.h: hybrid-sharded data parallelism (FSDP HYBRID_SHARD) with tensor
 * parallelism, on any backend (CPU, or CUDA with the working copy in bf16).
 *
 * The rank's TP-local parameters (model.h, model_tp_t: the whole model when
 * T = 1) are split into L + 1 flat units: unit l < L is transformer block l
 * (its contiguous local buffer, model_tp_t.blk_off), and unit L ("the rest")
 * packs [ embed (Vt*D) | final norm (D) | lm_head (Vt*D), absent when tied ]
 * with Vt = ceil(V / T) vocab rows. Each unit is padded with zeros to a
 * multiple of S and cut into S equal chunks; shard-group index i keeps chunk
 * i of every unit's fp32 master weights, gradient and AdamW moments (1/S of
 * each, the padding included and never updated). The norms are replicated
 * over the TP group: their gradients (partial over each rank's token rows)
 * are all-reduced in the TP group before the shard group's reduce-scatter.
 *
 * One micro-step (fsdp_micro_step):
 *   forward   block l's chunks are all-gathered in the shard group into one
 *             of two recycled full-block buffers; block l+1's gather is
 *             started before block l computes; the rest unit is gathered
 *             once per step (fsdp_begin_step) and kept until its end;
 *   backward  block l is gathered again (block L-1 is still in its buffer),
 *             block l-1's gather started ahead; with activation
 *             checkpointing the block is recomputed from its input first;
 *             its full gradient is reduce-scattered (sum) in the shard group
 *             into the rank's gradient chunk, asynchronously, two blocks in
 *             flight at most.
 * On a GPU nothing here blocks the host on a collective the next kernel
 * needs: the compute stream waits for each gather and reduce-scatter
 * through an event (comm_use) and the handles are collected a few
 * collectives later or at the end of the micro-step, while NCCL runs them
 * on its own stream after the compute queued before them; so block l+1's
 * gather and block l+1's reduce-scatter run under block l's compute. (The
 * shm backend, and shm staged for ranks sharing a GPU, complete each
 * collective on the host: same order, no overlap.)
 * fsdp_end_step reduce-scatters the rest unit's gradient, then all-reduces
 * (sum) the gradient chunks across the replica group. The loss scale of a
 * micro-step is 1 / (tokens of the global batch), so the sums give the
 * gradient of the global mean loss.
 *
 * S = 1 (plain data parallelism, and one process: world 1 is R = S = T = 1)
 * is direct: a unit's one chunk is the whole unit, so the blocks and the
 * rest run straight from the working copy and their gradients accumulate
 * in the gradient chunks over the step, with no gathered copies, no
 * full-block gradient buffers and no reduce-scatter (the TP sums of the
 * blocks' norm gradients move to fsdp_end_step). That costs what the whole
 * model on one device costs: weights, gradient and moments, no more.
 * A group of one rank may have no communicator (NULL: the TP, shard or
 * replica group of dist.h when it is this rank alone); every collective
 * over it is skipped or a local copy.
 *
 * Every reduction of the shm backend runs in rank order, so every run gives
 * the same bits; against one process the results differ only by the order
 * of floating-point sums. Every buffer is backend memory (be->alloc): the
 * fp32 master chunks, moments and gradients; the working copy of the
 * chunks (wact) in act storage, which the all-gathers move (bf16 on CUDA,
 * the master itself on the CPU); gradients are reduced in fp32. The
 * communicators take backend memory: on a GPU NCCL, or shm behind the
 * host staging of workers/comm/stage.h.
 *
 * Functions return 0 or a negative errno with a message in err. */
#ifndef BALLAST_FSDP_H
#define BALLAST_FSDP_H

#include <stdbool.h>
#include <stddef.h>

#include "workers/comm/comm.h"
#include "workers/model/model.h"
#include "workers/model/optim.h"

/* Where the kept block inputs go during a micro-step, for a memory saver
 * that replaces the model's own buffers (activation offload,
 * workers/offload/act.h, fills one). fsdp_micro_step calls them in this
 * order: forward_begin; produced(l) before block l's forward (l = 0..L-1);
 * in backward, fetch(l) before block l's recompute and backward, then
 * release(l); backward_end after the loop (also on an error path, where it
 * only drops what it can). Each returns 0 or -1 with a message in err. */
typedef struct {
    void *ctx;
    int (*forward_begin)(void *ctx, char *err, size_t errlen);
    int (*produced)(void *ctx, int l, char *err, size_t errlen);
    int (*fetch)(void *ctx, int l, char *err, size_t errlen);
    int (*release)(void *ctx, int l, char *err, size_t errlen);
    int (*backward_end)(void *ctx, char *err, size_t errlen);
} fsdp_act_hooks_t;

typedef struct {
    model_t *m;                /* activations and layout; its full params/grads are dropped */
    const backend_t *be;       /* the model's backend; every buffer below is its memory */
    comm_t *shard, *replica;   /* shard group (S ranks), replica group (R ranks); NULL for one rank */
    comm_t *tp;                /* TP group (T ranks; the model's, NULL when T == 1) */
    int S, sidx;               /* shard degree and this rank's index in its shard group */
    int R, ridx;               /* replicas and this rank's index in its replica group */
    bool direct;               /* S == 1: compute on wact and sum into grad in place (no gbuf, bgrad, rs_out) */
    int T, tidx;               /* tensor-parallel degree and this rank's index in its TP group */
    int C;                     /* context-parallel degree (1 unless the caller sets it): the replica
                                  group then holds R x C ranks, and the writer of (shard s, TP rank t)
                                  in the manifest is global rank s * C * T + t */
    int n_units;               /* L + 1 */
    size_t *numel;             /* (n_units) floats of each unit, unpadded */
    size_t *chunk;             /* (n_units) floats of each unit's chunk: ceil(numel / S) */
    size_t *shard_off;         /* (n_units) offset of each unit's chunk in the local buffers */
    size_t shard_total;        /* floats in master, grad, and each moment */
    size_t rest_norm, rest_lm; /* offsets of norm and lm_head inside the rest unit */
    float *master;             /* (shard_total) fp32 master chunks; NULL while optimizer offload keeps
                                  them in ballastd only (separate wact, workers/offload/opt.h) */
    act_t *wact;               /* (shard_total) working copy in act storage (== master when act_bytes == 4) */
    float *grad;               /* (shard_total) gradient chunks, summed over the step */
    act_t *rest_full;          /* (S * chunk[L]) gathered rest unit, act storage (direct: wact's chunk) */
    float *rest_grad;          /* (S * chunk[L]) full rest gradient of this rank's data (direct: grad's chunk) */
    act_t *gbuf[2];            /* (S * max block chunk) gathered block parameters, act storage; NULL when direct */
    float *bgrad[2];           /* (S * max block chunk) full block gradient; NULL when direct */
    float *rs_out[2];          /* (max block chunk) reduce-scatter results; NULL when direct */
    comm_req_t *rs_req[2];     /* reduce-scatters in flight, or NULL */
    int rs_unit[2];            /* the unit each of them belongs to */
    comm_hold_t held;          /* gathers and reduce-scatters the compute stream waits for, collected later */
    comm_dtype_t grad_dt;      /* gradient reductions: COMM_F32, or COMM_BF16 (fsdp_set_grad_reduce) */
    void *rs16_in[2];          /* (S * max block chunk) bf16 block gradients on the wire, when grad_dt is bf16 */
    void *rs16_out[2];         /* (max block chunk) their bf16 reduce-scatter results */
    void *g16;                 /* bf16 scratch of the rest unit's reduce-scatter and the replica all-reduce */
    model_tensor_t *segs;      /* optimizer segments, offsets in the local buffers */
    int n_segs;
    optim_t opt;               /* AdamW moments over shard_total floats */
    const fsdp_act_hooks_t *ao; /* block inputs through a memory saver (--activation-offload), or NULL */
    float *init_host;          /* (shard_total) host copy of the initial fp32 chunks when the optimizer
                                  state lives elsewhere (ocfg->state_elsewhere), until fsdp_drop_init */
    float *logits_host;        /* test hook (--dump-grads): when set, the next micro-step copies its logits
                                  (B*T, tp.V) there after the forward, then clears it */
} fsdp_t;

/* Set up sharding over m (created by model_create_tp or model_create_acts;
 * this drops any full parameter and gradient buffers) from the full host
 * parameters `full` (full model layout, n_params floats, identical on every
 * rank): the rank keeps its chunk of its TP slice. shard and replica are
 * this rank's communicators, NULL for a group of one rank (the TP one is
 * m->tp.comm). Returns 0 or a negative errno. */
int fsdp_create(fsdp_t *f, model_t *m, const float *full, comm_t *shard, comm_t *replica,
                const optim_config_t *ocfg, char *err, size_t errlen);

/* With ocfg->state_elsewhere (optimizer offload starting fresh) fsdp_create
 * allocates no AdamW moments and, when the working copy is separate (bf16
 * on CUDA), no fp32 master: the backend holds the working copy and the
 * gradient only (6 bytes a parameter of the chunk instead of 18), and the
 * initial fp32 chunks stay in host memory (init_host) for the first version
 * stored in ballastd (workers/offload/opt.c), which then calls this to
 * free them. */
void fsdp_drop_init(fsdp_t *f);
void fsdp_destroy(fsdp_t *f);

/* --grad-reduce-dtype: gradients travel and are summed in dt (COMM_F32,
 * the default, or COMM_BF16: each rank's fp32 gradient is rounded to bf16,
 * reduced in bf16 by the communicator, and widened into the fp32
 * chunks). Halves the gradient traffic at the cost of bf16 rounding of
 * every partial sum. Groups of one rank never round. Allocates the bf16
 * buffers; call before the first step. 0 or -ENOMEM with a message. */
int fsdp_set_grad_reduce(fsdp_t *f, comm_dtype_t dt, char *err, size_t errlen);

/* Start a step: zero the gradients, gather the rest unit. */
int fsdp_begin_step(fsdp_t *f, char *err, size_t errlen);

/* Forward and backward of one micro-batch (host tokens and targets, B*T
 * each); *loss_sum receives this rank's token cross-entropy sum. */
int fsdp_micro_step(fsdp_t *f, const int32_t *tokens, const int32_t *targets, float loss_scale,
                    double *loss_sum, char *err, size_t errlen);

/* Forward only of one micro-batch (evaluation): *loss_sum receives this
 * rank's token cross-entropy sum; nothing accumulates. Call after
 * fsdp_begin_step (which gathers the embedding/head unit) and before the
 * step's first fsdp_micro_step; not with an activation saver (-EINVAL). */
int fsdp_forward_loss(fsdp_t *f, const int32_t *tokens, const int32_t *targets, double *loss_sum, char *err,
                      size_t errlen);

/* Finish the gradients: reduce-scatter the rest unit, all-reduce the
 * chunks across replicas. */
int fsdp_end_step(fsdp_t *f, char *err, size_t errlen);

/* Global L2 norm of the gradient (each parameter once): the chunks'
 * sums of squares added over the TP and shard groups (replicas hold the
 * same; the replicated norms count on TP rank 0 only). */
int fsdp_grad_norm(fsdp_t *f, double *norm, char *err, size_t errlen);

/* AdamW on the local chunks, gradients scaled by grad_scale first (the
 * working copy follows). */
void fsdp_optim_step(fsdp_t *f, double lr, float grad_scale);

/* After writing f->master directly (a checkpoint load): refresh the
 * working copy from it (nothing when the master is away, NULL). */
void fsdp_state_changed(fsdp_t *f);

/* Sum of x over every rank of the job, in global-rank order (the same
 * bits on every rank). */
int fsdp_sum_all(fsdp_t *f, double x, double *out, char *err, size_t errlen);

/* The full master parameters in model layout (n_params floats) on every
 * rank, gathered from the chunks (and the TP slices). Needs f->master
 * (-EINVAL while optimizer offload keeps it away). */
int fsdp_gather_params(fsdp_t *f, float *full, char *err, size_t errlen);

/* The same for the gradient of the step (after fsdp_end_step: summed over
 * the job, before clipping). */
int fsdp_gather_grads(fsdp_t *f, float *full, char *err, size_t errlen);

/* The parts of the model's tensors inside chunk sidx (any shard index):
 * at most m->n_tensors entries with the tensor's name, shape and decay,
 * offset = position in the local buffers of the rank holding that chunk,
 * numel = elements; start[i] (when not NULL) = the first element's index
 * in the flat tensor. Returns the count. */
int fsdp_segments(const fsdp_t *f, int sidx, model_tensor_t *segs, size_t *start);

/* Replace the rank's state with its part of full tensors (full model
 * layout, n_params floats each): master weights, both AdamW moments, and
 * the optimizer's step count. Local, no collective. */
void fsdp_set_full_state(fsdp_t *f, const float *params, const float *exp_avg, const float *exp_avg_sq,
                         int64_t step);

/* All-gather n 4-byte words of host memory per rank of group c into host
 * out (size(c) * n words), bit for bit, through backend memory (which the
 * collectives take); a group of one rank (c NULL or of size 1) copies in to
 * out. 0 or a negative errno with a message. */
int fsdp_all_gather_host(const backend_t *be, comm_t *c, const void *in, size_t n, void *out, char *err,
                         size_t errlen);

/* Bytes of sharded state this rank holds in backend memory: gradient,
 * master and moments where present (optimizer offload frees the moments,
 * and the master where the working copy is separate), and a separate
 * working copy. */
size_t fsdp_state_bytes(const fsdp_t *f);

#endif
