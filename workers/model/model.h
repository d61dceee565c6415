/* model.h: the Llama architecture (Hugging Face LlamaForCausalLM) on a
 * backend_t.
 *
 * Parameter layout, chosen so that a block can be sharded, gathered and
 * updated as one flat buffer:
 *
 *   params = [ embed (V, D) | block 0 | ... | block L-1 | norm (D) | lm_head (V, D) ]
 *   block  = [ wq (H*Dh, D) | wk (Hkv*Dh, D) | wv (Hkv*Dh, D) | wo (D, H*Dh) |
 *              w_gate (F, D) | w_up (F, D) | w_down (D, F) | attn_norm (D) | ffn_norm (D) ]
 *
 * wq, wk, wv are thus one (H*Dh + 2*Hkv*Dh, D) matrix and w_gate, w_up one
 * (2F, D): a backend with the fused paths (backend.h) runs each as one
 * GEMM; checkpoints keep the separate tensors.
 *
 * lm_head is absent when the config ties it to embed. Weights are stored
 * (out, in) as in PyTorch. Gradients (and the optimizer's moments) use the
 * same layout. Every tensor has its Hugging Face name in the tensor table.
 *
 * Tensor parallelism (T > 1, Megatron style, workers/model/tp.h): rank t of a TP
 * group of T holds a TP-local copy of that layout: wq/wk/wv and gate/up
 * keep rows t*out/T.. (column-parallel: heads t*H/T.., kv heads t*Hkv/T..,
 * MLP rows t*F/T..), wo and down keep columns t*in/T.. (row-parallel), the
 * norms are replicated, embed and lm_head keep vocab rows t*Vt.. with
 * Vt = ceil(V / T) (rows past V are zero padding). Between blocks a rank
 * holds N/T of the N = B*seq token rows of the residual stream (sequence
 * parallelism); model_tp_t says how the local layout maps onto the full one.
 * With T = 1 the local layout is the full one and every op runs exactly as
 * without tensor parallelism.
 *
 * One training micro-step is model_forward() then model_backward(); each
 * block's forward and backward need only the block's input, so with
 * activation checkpointing the model keeps the L+1 block inputs and
 * recomputes a block's internals just before its backward (full), or keeps
 * each block's attention output and its log-sum-exp rows too and recomputes
 * everything but the attention (selective; docs/training.md weighs the
 * trade). */
#ifndef BALLAST_MODEL_H
#define BALLAST_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/backend/backend.h"
#include "workers/comm/comm.h"
#include "workers/model/config.h"
#include "workers/model/layout.h"

/* Activations of one block for its backward. Buffers named act_t hold
 * backend act storage (bf16 on CUDA); float ones fp32 (backend.h). With
 * tensor parallelism (tp = tp.size ranks) H, Hkv and F are the rank's
 * (model_tp_t) and the rows of the residual stream are the rank's N/tp. */
typedef struct {
    act_t *xn1; float *rstd1;  /* (N, D) gathered over all rows, (N/tp): attention RMSNorm output and 1/rms */
    act_t *q, *k, *v;          /* (N, H*Dh), (N, Hkv*Dh) x2, after RoPE */
    float *att;                /* attention_state_numel(B, T, H): probabilities (CPU) or log-sum-exp rows */
    act_t *ao;                 /* (N, H*Dh) attention output before wo */
    act_t *xmid;               /* (N/tp, D) residual after attention */
    act_t *xn2; float *rstd2;  /* (N, D) gathered, (N/tp): MLP RMSNorm */
    act_t *gate, *up, *h;      /* (N, F) each; gate and up are one (2, N, F) buffer, or one (N, 2F)
                                  gate | up per row when the backend has swiglu_gu_fwd (then up is unused) */
} block_acts_t;

/* Context parallelism (C > 1): the sequence of every row is cut in 2C
 * chunks of Tc tokens and rank i of the CP group holds chunks i and
 * 2C-1-i, in that order, as its T = 2 Tc tokens per row (so every rank
 * does the same causal attention work). RoPE turns each chunk by its
 * global positions; attention runs as a ring over the group (K/V blocks
 * passed on with comm_ring_shift while the block in hand is used, the
 * partial outputs merged by their log-sum-exp; backward passes dK/dV on
 * around the ring). Every other op is per token and runs unchanged. The
 * compute stream waits for each shift (an event on NCCL) and the host
 * collects the handle later (comm_use, in m->tp.held, released with TP's
 * by tp_release), unless host_wait. */
typedef struct {
    int size;                  /* C: ranks of the CP group (1 = no context parallelism) */
    int rank;                  /* this rank's index in the group, 0..size-1 */
    comm_t *comm;              /* the CP group's communicator; NULL when size == 1 */
    int Tc;                    /* tokens per chunk: T / 2 (the whole sequence is 2 C Tc) */
    act_t *kv[2];              /* 2 x (2, B, T, Hkv*Dh): k | v, the block in hand and the next */
    act_t *dkv[2];             /* 2 x (2, B, T, Hkv*Dh): dk | dv of the block in hand, travelling with it */
    act_t *ob;                 /* (Tc, H, Dh) one chunk pair's partial output */
    float *lb;                 /* (Tc, H) its log-sum-exp rows */
    bool host_wait;            /* wait for each shift on the host (--cp-overlap false); else the compute
                                  stream waits on the shift's event and the host collects it later */
} model_cp_t;

/* Activation checkpointing (--activation-checkpointing). */
typedef enum {
    MODEL_CKPT_NONE = 0,       /* keep every block's internals */
    MODEL_CKPT_FULL = 1,       /* keep block inputs; recompute each block before its backward */
    MODEL_CKPT_SELECTIVE = 2,  /* full, but keep each block's attention output and state: no attention recompute */
} model_ckpt_t;

typedef struct model {
    llama_config_t cfg;
    const backend_t *be;
    int B, T;                  /* micro-batch rows and sequence length */
    model_ckpt_t act_ckpt;     /* what the backward recomputes (MODEL_CKPT_NONE: nothing) */
    model_tp_t tp;             /* tensor parallelism; tp.size == 1 without */
    model_cp_t cp;             /* context parallelism; cp.size == 1 without */
    size_t act_bytes;          /* backend bytes of activations and scratch (everything but params, master, grads) */

    /* layout */
    size_t n_params;           /* floats in params (and grads) */
    size_t embed_off, blocks_off, norm_off, lm_head_off; /* floats; lm_head_off == embed_off when tied */
    size_t block_numel;        /* floats per block */
    size_t blk_off[BLK_NT];    /* offsets inside a block */
    model_tensor_t *tensors;   /* host table, n_tensors entries, in layout order */
    int n_tensors;

    /* backend memory */
    act_t *params;             /* (n_params) working copy the ops read (bf16 on CUDA) */
    float *master;             /* (n_params) fp32 master weights; == params when act_bytes == 4 */
    float *grads;              /* (n_params), accumulated over micro-steps */
    int32_t *tokens, *targets; /* (N) current micro-batch */
    act_t **xs;                /* L+1 block inputs (N/tp, D): this rank's rows; xs[L] is the last block's output.
                                  Outside model.c through model_block_input / model_set_block_input */
    act_t **xs_own;            /* L+1 the block-input buffers the model allocated (freed by model_destroy);
                                  NULL where model_drop_block_inputs freed one */
    block_acts_t *acts;        /* L sets, or 1 scratch set with act_ckpt (model_block_acts picks) */
    act_t **sel_ao;            /* selective: L kept attention outputs (N, H*Dh); else NULL */
    float **sel_att;           /* selective: L kept attention states (attention_state_numel); else NULL */
    act_t *xf; float *rstdf;   /* (N, D) final RMSNorm (all rows, gathered), (N/tp) */
    act_t *logits;             /* (N, tp.V) this rank's vocab columns; becomes dlogits in backward */
    float *losses;             /* (N) per-token loss */
    /* backward scratch */
    act_t *dx, *dtmp;          /* (N/tp, D) this rank's rows; (N, D) */
    act_t *dq, *dk, *dv, *dao; /* (N, H*Dh), (N, Hkv*Dh) x2, (N, H*Dh) */
    act_t *dgate, *dup, *dh;   /* (N, F); dgate and dup one buffer as gate and up are */
    act_t *qkv;                /* (N, H*Dh + 2*Hkv*Dh): the packed q | k | v projection's output, and its
                                  gradient in backward (backends with qkv_split_rope) */
    act_t *ftmp;               /* (N, D) forward scratch */
    float *loss_host;          /* host (N) */
} model_t;

/* Build the layout and allocate parameters, gradients and activations for
 * micro-batches of B rows of T tokens. Parameters start at zero. Returns 0,
 * or -1 with a message (bad config, T > max_seq, out of memory). */
int model_create(model_t *m, const llama_config_t *cfg, const backend_t *be, int B, int T, model_ckpt_t act_ckpt,
                 char *err, size_t errlen);

/* model_create for rank tp_rank of a TP group of tp_size ranks (comm: the
 * group's communicator, NULL when tp_size == 1). Parameters, master and
 * gradients keep the full layout (for initialisation and I/O; a sharding
 * driver drops them); activations, logits and scratch are TP-local.
 * tp_size > 1 needs H, Hkv, F and B*T divisible by
 * tp_size; otherwise -1 with a message naming the numbers. The whole-model
 * model_forward / model_backward need tp_size == 1. */
int model_create_tp(model_t *m, const llama_config_t *cfg, const backend_t *be, int B, int T, model_ckpt_t act_ckpt,
                    int tp_size, int tp_rank, comm_t *comm, char *err, size_t errlen);

/* The same without the full parameter, master and gradient buffers
 * (params, master, grads stay NULL): for the sharded trainer, whose
 * parameters live in fsdp's chunks, so a rank never holds the whole model
 * on its device (initial weights come from model_init_random_host or
 * ckpt_read_hf_host in host memory). */
int model_create_acts(model_t *m, const llama_config_t *cfg, const backend_t *be, int B, int T, model_ckpt_t act_ckpt,
                      int tp_size, int tp_rank, comm_t *comm, char *err, size_t errlen);

/* The flat index in the full tensor full (of the model's tensor table) of
 * element i of TP rank tp_rank's part, whose local shape is lshape; -1 for
 * vocab padding. tp_size is implied by the shapes. */
int64_t model_tp_full_index(const model_tensor_t *full, const int64_t lshape[2], int tp_rank, size_t i);

/* Cut this rank's TP-local parameters (local layout, tp.n_params floats,
 * padding zero) out of full ones (full layout), or write them back:
 * model_tp_unslice writes the parts of TP rank tp_rank into full. */
void model_tp_slice(const model_t *m, const float *full, float *local);
void model_tp_unslice(const model_t *m, int tp_rank, const float *local, float *full);

/* Make m (from model_create_acts, its T the rank's 2 Tc tokens per row)
 * rank cp_rank of a context-parallel group of cp_size ranks (comm: the
 * group's communicator): allocates the ring buffers, keeps only
 * log-sum-exp rows as attention state, and from then on every block runs
 * ring attention with RoPE at the chunks' global positions. Failures of
 * the ring's collectives are kept in m->tp.rc / m->tp.err like the TP
 * group's. -1 with a message: a backend without the ring ops, T odd, the
 * whole sequence past max_position_embeddings, a communicator that does
 * not match, out of memory. cp_size 1 does nothing. */
int model_set_cp(model_t *m, int cp_size, int cp_rank, comm_t *comm, char *err, size_t errlen);

/* The global chunk index of chunk j (0 or 1) of CP rank i of C: i, 2C-1-i. */
static inline int model_cp_chunk(int C, int i, int j) { return j == 0 ? i : 2 * C - 1 - i; }

/* Bytes model_create would allocate (parameters, gradients, activations
 * and scratch), plus the optimizer's two moment buffers. */
uint64_t model_memory_bytes(const llama_config_t *cfg, int B, int T, model_ckpt_t act_ckpt);

/* Only the layout and tensor table (no backend, no memory beyond the
 * table): for tools that move weights between files. Free with
 * model_destroy. */
int model_layout(model_t *m, const llama_config_t *cfg, char *err, size_t errlen);
void model_destroy(model_t *m);

/* Deterministic initialisation from a seed: 2-D weights ~ N(0, 0.02^2)
 * (Hugging Face's initializer_range), norm gains 1. */
void model_init_random(model_t *m, uint64_t seed);
/* The same values into host (n_params floats, full layout); needs only
 * the layout. */
void model_init_random_host(const model_t *m, uint64_t seed, float *host);

/* Find a tensor by Hugging Face name; NULL if absent. */
const model_tensor_t *model_find(const model_t *m, const char *name);

/* Pointer to block l's flat parameter buffer (block_numel act elements). */
act_t *model_block_params(model_t *m, int l);
float *model_block_grads(model_t *m, int l);

/* Copy the fp32 master parameters to/from host memory in layout order
 * (n_params floats); setting also refreshes the working copy. */
void model_get_params(const model_t *m, float *host);
void model_set_params(model_t *m, const float *host);

/* Run the forward pass on one micro-batch (host tokens and targets, B*T
 * each, already checked < V). Returns the sum over the B*T tokens of the
 * cross-entropy (double, host). Logits stay available until backward. */
double model_forward(model_t *m, const int32_t *tokens, const int32_t *targets);

/* Backward of the last forward; gradients accumulate into m->grads scaled
 * by loss_scale (1 / tokens in the global batch for a mean loss). */
void model_backward(model_t *m, float loss_scale);

/* Zero the gradients. */
void model_zero_grads(model_t *m);

/* Free the full parameter, master and gradient buffers (n_params each) for
 * a driver that places parameters itself (workers/parallel/fsdp.h keeps 1/S of
 * them); model_forward/model_backward and the functions reading m->params
 * must not be called afterwards, the block/embed/head pieces still work. */
void model_drop_params(model_t *m);

/* The pieces of model_forward / model_backward, in their order, for a
 * driver that places parameters itself (sharded training gathers each
 * block's buffer just before it runs). Parameter and gradient pointers are
 * explicit; activations stay in m (xs[0..L], m->dx).
 *   model_embed_forward   tokens -> xs[0]
 *   model_block_forward   for l = 0..L-1: xs[l] -> xs[l+1]
 *   model_head_forward    xs[L] -> final norm, logits, loss (sum over B*T tokens)
 *   model_head_backward   loss -> m->dx = dL/d xs[L]; dnorm, dlm_head accumulate
 *   model_block_backward  for l = L-1..0 (after recomputing block l when
 *                         activations were not kept): m->dx -> dL/d xs[l]
 *   model_embed_backward  m->dx -> dembed (accumulates) */
void model_embed_forward(model_t *m, const act_t *embed, const int32_t *tokens, const int32_t *targets);
double model_head_forward(model_t *m, const act_t *norm, const act_t *lm_head);
void model_head_backward(model_t *m, const act_t *norm, const act_t *lm_head, float *dnorm, float *dlm_head,
                         float loss_scale);
void model_embed_backward(model_t *m, float *dembed);

/* With T > 1: model_embed_forward / model_block_* / model_head_* run the
 * TP collectives themselves (a failure is kept in m->tp.rc / m->tp.err, and
 * later collectives are skipped); parameter pointers are TP-local; norm
 * gradients are partial (this rank's rows) and the caller sums them over the
 * TP group; model_head_forward returns the loss sum over this rank's N/tp
 * rows, so adding it over every rank gives the batch's sum. */

/* ---- block inputs (what a memory saver may replace) ----
 * Block input l (0..L; L is the last block's output, the head's input) is
 * the (N/tp, D) buffer block l reads and block l - 1 writes. The model
 * allocates one per l; a saver (workers/offload/act.h) may keep fewer of
 * them and point block inputs at buffers of its own between blocks. The
 * model frees only the buffers it allocated, wherever the inputs point. */

/* The buffer block input l is in now. */
act_t *model_block_input(const model_t *m, int l);
/* Block input l is in buf from now on (buf stays the caller's; NULL: none,
 * until set again). */
void model_set_block_input(model_t *m, int l, act_t *buf);
/* Free the model's own buffers of block inputs keep..L (they are NULL
 * until set); the first keep stay the model's, each still the buffer of its
 * block input unless set otherwise. */
void model_drop_block_inputs(model_t *m, int keep);
/* Every block input back in the model's own buffer (NULL for a dropped one). */
void model_reset_block_inputs(model_t *m);

/* Block-level pieces (also used by the tests and by sharded training):
 * forward of block l from x_in (N, D) into x_out (N, D) keeping activations
 * in a; backward from dx (N, D) = dL/dx_out, replaced by dL/dx_in, with the
 * block's parameter gradients accumulated into grads (block_numel floats). */
void model_block_forward(model_t *m, const act_t *bp, const act_t *x_in, act_t *x_out, block_acts_t *a);
void model_block_backward(model_t *m, const act_t *bp, float *bg, const act_t *x_in, block_acts_t *a, act_t *dx);

/* Checkpointing: the activation set block l runs with (its own without
 * checkpointing; the one scratch set otherwise, whose attention output and
 * state point at block l's kept ones with selective checkpointing). */
block_acts_t *model_block_acts(model_t *m, int l);
/* Before block l's backward under checkpointing: its internals again from
 * x_in (x_out gets the values it already holds), skipping the attention
 * whose output and state were kept (selective); nothing without
 * checkpointing. The ops are deterministic, so the backward sees the
 * forward's bits either way. */
void model_block_recompute(model_t *m, int l, const act_t *bp, const act_t *x_in, act_t *x_out);

#endif
