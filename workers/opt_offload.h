/* opt_offload.h: optimizer-state offloading through ballastd
 * (--optimizer-offload host|nvme) and resuming from it
 * (--resume-from-service).
 *
 * The rank's AdamW moments leave its memory: they live in ballastd as one
 * persistent blob per unit (fsdp.h: a block, or the embedding/head unit)
 * holding [ exp_avg | exp_avg_sq | master ] of the rank's chunk (3 x
 * chunk[u] fp32). On the CPU backend the working parameters are the fp32
 * master, so the rank keeps its master chunk for the forward; the copy in
 * the blob is what a restarted rank resumes from.
 *
 * Versions: the blobs written by step s have key step = s (version 0 is
 * the initial state). Step s streams version s - 1 unit by unit, double
 * buffered (unit u + 1's get in flight while AdamW updates unit u, straight
 * into unit u's new blob on the CPU backend; on a GPU through a staging
 * buffer in device memory, then copied into it), commits version s, then a small persistent
 * step record saying "step s is complete on this rank". Version s - 2 is
 * freed at the start of step s: every rank has committed record s - 1 by
 * then (step s's collectives came after it), so a resume always finds the
 * versions it needs. host pins the current version in the pool; nvme lets
 * ballastd spill it (persistent blobs are on NVMe from their commit on).
 *
 * Keys: state (rank, OPTIMIZER_STATE, index = unit, step = version);
 * record (rank, OTHER, index = s % 2, step = 0), two slots so that the
 * previous record stays valid while the next is written.
 *
 * Resume: every rank reads its records; the job resumes at c = the lowest
 * complete step over ranks (ranks differ by at most one); each rank loads
 * its master chunk from version c and continues at step c + 1.
 *
 * Functions return 0 or -1 with a message in err. */
#ifndef BALLAST_OPT_OFFLOAD_H
#define BALLAST_OPT_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/fsdp.h"
#include "workers/offload_link.h"

typedef enum { OPT_OFFLOAD_NONE = 0, OPT_OFFLOAD_HOST = 1, OPT_OFFLOAD_NVME = 2 } opt_offload_mode_t;

typedef struct opt_offload opt_offload_t;

/* Take over f's moments (freed by opt_offload_start) and keep them in
 * ballastd through link. world: ranks of the job (recorded, checked on
 * resume). NULL with a message on failure. */
opt_offload_t *opt_offload_create(fsdp_t *f, offload_link_t *link, opt_offload_mode_t mode, int world, char *err,
                                  size_t errlen);
void opt_offload_destroy(opt_offload_t *o);

/* Collective over every rank. resume = false: clear what an earlier run of
 * this job and rank left, store the current state (the moments in f->opt,
 * zero or loaded by --resume, and the master) as version f->opt.step and
 * free f's moment buffers; *start is left alone. resume = true: find the last step complete on
 * every rank, load the master chunk and the optimizer step from it and set
 * *start to it; no state in ballastd for this job is an error naming the
 * job. */
int opt_offload_start(opt_offload_t *o, bool resume, int64_t *start, char *err, size_t errlen);

/* The AdamW update of step s (1-based; lr, gradients scaled by grad_scale)
 * streamed through ballastd, then step s's record. Replaces
 * fsdp_optim_step. */
int opt_offload_step(opt_offload_t *o, int64_t s, double lr, float grad_scale, char *err, size_t errlen);

/* For a checkpoint: bring the current moments into f->opt.m/v (allocated
 * here); opt_offload_drop_moments frees them again. */
int opt_offload_load_moments(opt_offload_t *o, char *err, size_t errlen);
void opt_offload_drop_moments(opt_offload_t *o);

/* Bytes of optimizer state this rank keeps in ballastd per version. */
size_t opt_offload_bytes(const opt_offload_t *o);

#endif
