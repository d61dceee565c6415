/* act.h: activation offloading through ballastd
 * (--activation-offload, --activation-loading-horizon H).
 *
 * The kept activations of a micro-step are the block inputs xs[0..L-1]
 * ((N, D) each; xs[L] feeds the head), which the saver reaches through the
 * model's functions (model.h: model_block_input, model_set_block_input,
 * model_drop_block_inputs, model_reset_block_inputs). Instead of L + 1
 * buffers, the model keeps a ring of K = min(H + 2, L + 1) of them: xs[l]
 * lives in slot l % K. In forward, an input that a later block will
 * overwrite (l < L + 1 - K) is copied out as soon as it is produced: an
 * asynchronous copy (backend.h xfer ops; a copy stream on a GPU) into a
 * ballastd put region, committed once the copy is done, with the compute
 * that reuses its slot (block l + K - 1's forward) ordered after the copy
 * on the device, not on the host. The last K inputs never leave their
 * slots. In backward, block j first asks for block j - H's input (an
 * asynchronous get; one more block ahead a prefetch brings it from NVMe
 * into the pool); as soon as a get has completed its input is copied into
 * one of S = min(H + 1, L + 1 - K) staging buffers in backend memory
 * (input t in buffer t % S), so it arrives H blocks ahead; block j's
 * compute is ordered after its copy. The fp32 CPU backend reads a fetched
 * input in place in the pinned pool instead (no staging buffers; see
 * workers/offload/link.h, offload_link_in_place). After block j's backward
 * the region is handed back (once its copy in is done) and the blob freed.
 * With activation checkpointing, block j's recomputed output (scratch)
 * goes into slot (j + 1) % K, free by then.
 *
 * Memory in the backend for block inputs: K ring slots + S staging
 * buffers (0 in place), each (N / TP degree) x D x act_bytes, against
 * L + 1 without offload. Everything that reaches ballastd goes through the
 * link (link.h), and so does every wait: the host never waits for a copy
 * where it is queued; it waits (the link counts it as exposed offload
 * wait) only when a copy it
 * must use the host side of has not finished: a put not yet copied out
 * when backward asks for it, a get that has not arrived when its block
 * starts. Neither happens when the link moves one block input in less
 * time than a block computes.
 *
 * Without checkpointing the per-block internals (block_acts_t) stay in
 * memory; only the block inputs are offloaded.
 *
 * Keys: (rank, ACTIVATION, index = l, step = micro-step counter of this
 * process), never reused, so a free still in flight never races a put.
 *
 * The call sites are fsdp.c's block loops, through the hooks of
 * act_offload_hooks() (one process is world 1 of the same loop); every
 * function returns 0 or -1 with a message in err. */
#ifndef BALLAST_ACT_OFFLOAD_H
#define BALLAST_ACT_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "workers/model/model.h"
#include "workers/parallel/fsdp.h"
#include "workers/offload/link.h"

typedef struct act_offload act_offload_t;

/* Take over m's block-input buffers (keeps K of them, model_drop_block_inputs
 * frees the rest) and offload through link. Returns NULL with a message on a bad horizon or
 * out of memory. act_offload_destroy must run before model_destroy. */
act_offload_t *act_offload_create(model_t *m, offload_link_t *link, int horizon, char *err, size_t errlen);
void act_offload_destroy(act_offload_t *a);

/* Block inputs kept in memory (K) and offloaded per micro-step (L + 1 - K). */
int act_offload_resident(const act_offload_t *a);
int act_offload_offloaded(const act_offload_t *a);
/* Staging buffers in backend memory for fetched inputs (S; 0 in place). */
int act_offload_staging(const act_offload_t *a);

/* The functions below as fsdp's hooks (workers/parallel/fsdp.h), ctx = a;
 * the table lives as long as a. */
const fsdp_act_hooks_t *act_offload_hooks(act_offload_t *a);

/* ---- forward ---- */

/* Start a micro-step's forward: point the block inputs at the ring. */
int act_offload_forward_begin(act_offload_t *a, char *err, size_t errlen);
/* xs[l] has just been produced (by the embedding or block l - 1) and
 * block l's forward comes next: queue its copy out when its slot will be
 * reused, order block l's forward after the copy out of the input whose
 * slot it overwrites, commit the puts whose copies are done. */
int act_offload_produced(act_offload_t *a, int l, char *err, size_t errlen);

/* ---- backward ---- */

/* Before block l's backward: start the fetch of the input H blocks below,
 * queue the copies in whose gets arrived, point block input l at its
 * fetched bytes (its get waited for only if it has not arrived; its copy in
 * ordered before the compute queued next) and block input l + 1 at
 * scratch. */
int act_offload_fetch(act_offload_t *a, int l, char *err, size_t errlen);
/* After block l's backward is queued: its staging buffer may be refilled;
 * release xs[l]'s region (once its copy in is done) and free its blob. */
int act_offload_release(act_offload_t *a, int l, char *err, size_t errlen);
/* After the backward loop: wait for what is still in flight; the block
 * inputs back on the ring. On the CPU backend a deferred copy still pending is an error
 * ("copies still pending"). On an error path it only drops what it can. */
int act_offload_backward_end(act_offload_t *a, char *err, size_t errlen);

#endif
