/* opt.h: optimizer-state offloading through ballastd
 * (--optimizer-offload host|nvme) and resuming from it
 * (--resume-from-service).
 *
 * The rank's AdamW moments leave its memory: they live in ballastd as one
 * blob per unit (fsdp.h: a block, or the embedding/head unit)
 * holding [ exp_avg | exp_avg_sq | master ] of the rank's chunk (3 x
 * chunk[u] fp32). On the CPU backend the working parameters are the fp32
 * master, so the rank keeps its master chunk for the forward; the copy in
 * the blob is what a restarted rank resumes from. Where the working copy
 * is separate (bf16 on CUDA) the fp32 master leaves too: f->master is
 * freed once the first version is stored (NULL from then on, see fsdp.h)
 * and comes back only around a checkpoint or fsdp_gather_params
 * (opt_offload_load_moments).
 *
 * Durability (--optimizer-offload-durable, opt_offload_create's durable):
 *   durable: persistent blobs (ballastd acknowledges a commit once it is on
 *     NVMe) and a small persistent step record per step saying "step s is
 *     complete on this rank", so that --resume-from-service survives a
 *     crash of the worker or of ballastd;
 *   not durable: plain blobs (memory only; they vanish with the session),
 *     no record, and each unit's old version freed as soon as its new one
 *     is acknowledged: one version plus the units in flight live.
 *
 * Versions: the blobs written by step s have key step = s (version 0 is
 * the initial state). Step s streams version s - 1 unit by unit, unit
 * u + 1's get in flight while unit u updates, and commits version s
 * without waiting for the commits: they run on (durable: to NVMe) behind
 * step s + 1's forward and backward and are collected lazily, at the start
 * of step s + 1 before version s is read back (or before a checkpoint reads
 * it, or at shutdown); only then, when durable, is record s written. So
 * after a crash the newest recorded step may lag the last finished one by
 * one.
 * On a backend whose memory is host memory (the fp32 CPU backend) AdamW
 * runs on the moments in the pool (in place, straight into unit u's new
 * blob). Everywhere else (and on the CPU's staged test double) each unit's
 * whole blob is copied
 * asynchronously (backend.h, be_xfer_*) into one of two staging sets in
 * backend memory, updated there (the master too; the working copy in
 * f->wact follows), and copied into the new blob, double buffered: unit
 * u + 1's blob copies in while unit u updates and unit u - 1's copies out,
 * and a blob is committed only after the host waited for its copy (see
 * opt.c, step_staged). Every request and wait goes through the link
 * (link.h), which counts the host's time in those waits as exposed offload
 * wait (offload_link_t.wait_s).
 *
 * Durable: version s - 2 is freed at the start of step s, after record
 * s - 1 is written and a sum over the ranks (one double) showed every rank
 * has written its record s - 1: a resume (at s - 1 or later) always finds
 * the versions it needs; two versions live. host pins the current version
 * in the pool; nvme lets ballastd spill it (persistent blobs are on NVMe
 * from their commit on; not durable, eviction writes them to the spill
 * tier only when the pool is full).
 *
 * Keys: state (rank, OPTIMIZER_STATE, index = unit, step = version);
 * record (rank, OTHER, index = s % 2, step = 0), two slots so that the
 * previous record stays valid while the next is written. A fresh run
 * clears what an earlier durable run of the job left, durable or not.
 *
 * Resume (durable only): every rank reads its records; the job resumes at c = the lowest
 * complete step over ranks (ranks differ by at most one); each rank loads
 * its master chunk from version c (then frees it again when it is away)
 * and continues at step c + 1.
 *
 * Functions return 0 or -1 with a message in err. */
#ifndef BALLAST_OPT_OFFLOAD_H
#define BALLAST_OPT_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/parallel/fsdp.h"
#include "workers/offload/link.h"

typedef enum { OPT_OFFLOAD_NONE = 0, OPT_OFFLOAD_HOST = 1, OPT_OFFLOAD_NVME = 2 } opt_offload_mode_t;

typedef struct opt_offload opt_offload_t;

/* Take over f's moments (freed by opt_offload_start) and keep them in
 * ballastd through link. durable: persistent blobs and step records (see
 * above). world: ranks of the job (recorded, checked on resume). NULL with
 * a message on failure. */
opt_offload_t *opt_offload_create(fsdp_t *f, offload_link_t *link, opt_offload_mode_t mode, bool durable, int world,
                                  char *err, size_t errlen);
void opt_offload_destroy(opt_offload_t *o);

/* Collective over every rank. resume = false: clear what an earlier run of
 * this job and rank left, store the current state (the moments in f->opt,
 * zero or loaded by --resume, and the master) as version f->opt.step and
 * free f's moment buffers; *start is left alone. resume = true: find the
 * last step complete on every rank, load the master chunk (and the working
 * copy from it) and the optimizer step from it and set *start to it; no
 * state in ballastd for this job is an error naming the job. Either way a
 * separate working copy's rank frees f->master at the end. */
int opt_offload_start(opt_offload_t *o, bool resume, int64_t *start, char *err, size_t errlen);

/* The AdamW update of step s (1-based; lr, gradients scaled by grad_scale)
 * streamed through ballastd. First it collects version s - 1 (its commits,
 * durable: its record, then the sum over ranks and the free of s - 2);
 * version s's commits are left running. Replaces fsdp_optim_step.
 * Collective over every rank when durable. Every asynchronous backend copy
 * it queued has been waited when it returns (on the CPU backend a copy
 * still queued is an error). */
int opt_offload_step(opt_offload_t *o, int64_t s, double lr, float grad_scale, char *err, size_t errlen);

/* For a checkpoint or fsdp_gather_params: bring the current moments into
 * f->opt.m/v (allocated here) and, when the master is away, the master
 * into f->master (allocated here; a staging CPU rank re-reads it over its
 * working copy, the same bits); opt_offload_drop_moments frees what was
 * brought back. Collects the pending version first. */
int opt_offload_load_moments(opt_offload_t *o, char *err, size_t errlen);
void opt_offload_drop_moments(opt_offload_t *o);

/* Collect the last version's commits and, durable, write its step record
 * (at shutdown; nothing to do when nothing is pending). Local. */
int opt_offload_finish(opt_offload_t *o, char *err, size_t errlen);

/* Whether the state is durable (persistent blobs, step records). */
bool opt_offload_durable(const opt_offload_t *o);

/* Bytes of optimizer state this rank keeps in ballastd per version. */
size_t opt_offload_bytes(const opt_offload_t *o);

/* Bytes of backend memory in the two staging sets (0 in place). */
size_t opt_offload_staging_bytes(const opt_offload_t *o);

/* Whether f->master was freed (it lives in ballastd only). */
bool opt_offload_master_away(const opt_offload_t *o);

#endif
