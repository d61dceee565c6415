/* sharded.h: a run's training state in checkpoints (the format of
 * workers/ckpt/ckpt.h). The state is that of workers/parallel/fsdp.h: each
 * rank's chunks of the fp32 master weights and AdamW moments in backend
 * memory, for any layout (world, S, T); one process is S = T = 1 and
 * writes one shard file. Collective over every rank of the job; see
 * docs/parallel.md. Functions return 0 or a negative errno with a message. */
#ifndef BALLAST_SHARDED_H
#define BALLAST_SHARDED_H

#include <stddef.h>

#include "workers/ckpt/ckpt.h"
#include "workers/parallel/fsdp.h"

/* Save DIR/step-NNNNNNNN/ for meta->step: one file per (shard index, TP
 * rank) pair, file index shard * T + tp (shard-IIIII-of-NNNNN.safetensors
 * with NNNNN = S * T, written by the ranks of replica 0: each tensor part
 * as NAME, NAME.exp_avg, NAME.exp_avg_sq, 1-D), then config.json and the
 * manifest (ckpt_write_manifest), both written by rank 0, which renames the
 * directory once every file is complete. */
int ckpt_save(fsdp_t *f, const char *dir, const ckpt_meta_t *meta, int rank, int world, char *err,
              size_t errlen);

/* Load a step directory into f (master, moments, step; the working copy
 * follows). The same S and T (any number of replicas): every rank reads its
 * own file. Another layout, or the whole-tensor form of old one-process
 * checkpoints: every rank rebuilds the full weights and moments
 * (ckpt_read_full) and keeps its TP slice and chunk (fsdp_set_full_state).
 * Sizes and crc32 are checked. Local: no collective. */
int ckpt_load(fsdp_t *f, const char *path, char *err, size_t errlen);

/* Check that every rank sees DIR as the same directory, at start (a save
 * has every rank write its file into one step directory): rank 0 creates
 * DIR and leaves a marker file named by a random token, every rank looks
 * for it (for a few seconds, for network file systems), and rank 0 removes
 * it. Collective over every rank. 0 when all see it; -ENOENT on a rank
 * that does not (err names DIR, the marker, `where` and the fix); -EXDEV on
 * the others (err says how many ranks do not); another -errno when rank 0
 * cannot write DIR. */
int ckpt_check_shared(fsdp_t *f, const char *dir, int rank, const char *where, char *err, size_t errlen);

#endif
