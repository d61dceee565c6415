/* act_offload.h: activation offloading through ballastd
 * (--activation-offload, --activation-loading-horizon H).
 *
 * The kept activations of a micro-step are the block inputs xs[0..L-1]
 * (model_t.xs, (N, D) each; xs[L] feeds the head). Instead of L + 1
 * buffers, the model keeps a ring of K = min(H + 2, L + 1) of them: xs[l]
 * lives in slot l % K. In forward, an input that a later block will
 * overwrite (l < L + 1 - K) is copied into a ballastd blob as soon as it is
 * produced (put, commit asynchronous) and its slot is reused K blocks
 * later. The last K inputs never leave their slots. In backward, block j
 * first asks for block j - H's input (an asynchronous get; one more block
 * ahead a prefetch brings it from NVMe into the pool), then waits for its
 * own input, which it reads in place from the pinned region of the pool
 * (the CPU backend) or copies into a staging buffer in backend memory (a
 * GPU: workers/offload_link.h, offload_link_in_place); after block j's
 * backward the region is released and the blob freed.
 * With activation checkpointing, block j's recomputed output (scratch)
 * goes into slot (j + 1) % K, free by then.
 *
 * Without checkpointing the per-block internals (block_acts_t) stay in
 * memory; only the block inputs are offloaded.
 *
 * Keys: (rank, ACTIVATION, index = l, step = micro-step counter of this
 * process), never reused, so a free still in flight never races a put.
 *
 * The call sites are fsdp.c's block loops; every function returns 0 or -1
 * with a message in err. */
#ifndef BALLAST_ACT_OFFLOAD_H
#define BALLAST_ACT_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "workers/model.h"
#include "workers/offload_link.h"

typedef struct act_offload act_offload_t;

/* Take over m's block-input buffers (keeps K of them, frees the rest) and
 * offload through link. Returns NULL with a message on a bad horizon or
 * out of memory. act_offload_destroy must run before model_destroy. */
act_offload_t *act_offload_create(model_t *m, offload_link_t *link, int horizon, char *err, size_t errlen);
void act_offload_destroy(act_offload_t *a);

/* Block inputs kept in memory (K) and offloaded per micro-step (L + 1 - K). */
int act_offload_resident(const act_offload_t *a);
int act_offload_offloaded(const act_offload_t *a);

/* ---- forward ---- */

/* Start a micro-step's forward: point xs[] at the ring. */
int act_offload_forward_begin(act_offload_t *a, char *err, size_t errlen);
/* xs[l] has just been produced (by the embedding or block l - 1): send it
 * when its slot will be reused. */
int act_offload_produced(act_offload_t *a, int l, char *err, size_t errlen);

/* ---- backward ---- */

/* Before block l's backward: start the fetch of the input H blocks below,
 * wait for xs[l] and point m->xs[l] at it, m->xs[l + 1] at scratch. */
int act_offload_fetch(act_offload_t *a, int l, char *err, size_t errlen);
/* After block l's backward: release xs[l]'s region and free its blob. */
int act_offload_release(act_offload_t *a, int l, char *err, size_t errlen);
/* After the backward loop: wait for what is still in flight; xs[] back on
 * the ring. On an error path it only drops what it can. */
int act_offload_backward_end(act_offload_t *a, char *err, size_t errlen);

#endif
