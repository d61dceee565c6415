/* tp.h: the collectives and vocab-parallel ops of tensor parallelism
 * (Megatron style, with sequence parallelism) over a model's TP group.
 *
 * Rows are token rows of the (N, width) activations, N = B*T; rank t of a
 * group of T holds rows t*N/T .. (t+1)*N/T - 1 between blocks. Vocabulary
 * rows are split the same way: rank t holds rows t*Vt .. t*Vt + Vt - 1 of
 * embed and lm_head (Vt = ceil(V / T); rows past V are padding, kept out of
 * the loss). Buffers are backend memory (workers/backend/backend.h); act_t ones
 * travel in act storage (bf16 on CUDA), float ones in fp32.
 *
 * Every function is collective over the TP group: each rank calls it in the
 * same order with the same sizes. A failure is kept in tp->rc / tp->err (the
 * first one); after it the collectives are skipped, so the caller checks
 * tp->rc once after a forward or backward. Reductions run in rank order
 * (comm shm), so results are the same bits on every rank and every run. */
#ifndef BALLAST_TP_H
#define BALLAST_TP_H

#include <stddef.h>
#include <stdint.h>

#include "workers/model/layout.h"

/* full (N, width) = the local rows (N/T, width) of every rank, in rank order. */
void tp_gather_rows(model_tp_t *tp, act_t *full, const act_t *loc, size_t width);

/* loc (N/T, width) = this rank's rows of the sum over ranks of full (N, width). */
void tp_scatter_rows(model_tp_t *tp, act_t *loc, const act_t *full, size_t width);

/* x (n) = sum over ranks of x, in place. */
void tp_all_reduce(model_tp_t *tp, float *x, size_t n);

/* The collectives above leave the compute stream waiting for their results
 * (no host wait on a GPU) and keep their handles; this collects them (at
 * the end of a micro-step). 0, or the first failure with a message (also
 * recorded in tp->rc). */
int tp_release(model_tp_t *tp, char *err, size_t errlen);

/* out (N, D) = this rank's vocab rows of wte (Vt, D) for the tokens in its
 * range, zero rows for the others: summed over ranks it is the embedding. */
void tp_embedding_fwd(model_tp_t *tp, act_t *out, const int32_t *tokens, const act_t *wte, int N, int D);

/* dwte (Vt, D) accumulates dout (N, D) rows whose token is in this rank's range. */
void tp_embedding_bwd(model_tp_t *tp, float *dwte, const act_t *dout, const int32_t *tokens, int N, int D);

/* Vocab-parallel cross-entropy over logits (N, Vt), this rank's columns of
 * the full (N, V) logits (never gathered): the row max, the sum of exp and
 * the target's logit are reduced over the group. losses (N) = lse - logit
 * of the target, on every rank; tp->lse keeps the log-sum-exp for backward. */
void tp_xent_fwd(model_tp_t *tp, float *losses, const act_t *logits, const int32_t *targets, int N, int V);

/* dlogits (N, Vt) = (softmax - onehot(target)) * scale over this rank's
 * columns (padding columns 0); may alias logits. Uses tp->lse of the
 * forward. */
void tp_xent_bwd(model_tp_t *tp, act_t *dlogits, const act_t *logits, const int32_t *targets, float scale, int N,
                 int V);

#endif
