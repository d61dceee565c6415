/* run.h: the memory savers of one training rank, set up from the worker's
 * flags: the ballastd session (link.h), activation offload (act.h) and
 * optimizer offload (opt.h). The training loop (workers/train/loop.c) fills
 * offload_opts_t from its options and calls these; see docs/offload.md.
 *
 * Functions return 0 or -1 with a message in err; messages name the
 * worker's flags. */
#ifndef BALLAST_OFFLOAD_RUN_H
#define BALLAST_OFFLOAD_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "workers/offload/act.h"
#include "workers/parallel/fsdp.h"
#include "workers/offload/link.h"
#include "workers/offload/opt.h"

/* The worker flags the savers read (workers/train/options.c's option table
 * defines them; the train layer copies them here). */
typedef struct {
    bool act_offload;          /* --activation-offload */
    int64_t act_horizon;       /* --activation-loading-horizon H */
    int opt_offload;           /* --optimizer-offload: opt_offload_mode_t (0 none, 1 host, 2 nvme) */
    int opt_durable;           /* --optimizer-offload-durable: 0 auto (yes for nvme, no for host), 1 yes, 2 no */
    const char *socket;        /* --offload-socket: ballastd's Unix socket ("unix:/path" or a path) */
    const char *remote;        /* --offload-remote HOST:PORT (remote mode), NULL = off */
    const char *job;           /* --offload-job: job name of the run's blobs */
    const char *token_file;    /* --offload-token-file, NULL = none */
    bool resume_from_service;  /* --resume-from-service */
    bool resume;               /* --resume (from a checkpoint): refused with resume_from_service */
    bool skip_nonfinite;       /* --skip-nonfinite: refused with optimizer offload */
} offload_opts_t;

typedef struct {
    bool on;                   /* any saver on (the link is open) */
    offload_link_t link;
    act_offload_t *ao;         /* --activation-offload, or NULL (also set as f->ao) */
    opt_offload_t *oo;         /* --optimizer-offload, or NULL */
    struct be_pinned **regs;   /* the job's pool segments pinned by the backend (host_register), one each */
    uint32_t nregs, cap_regs;
    const backend_t *be;       /* the backend that pins them (NULL: none does) */
    int rank;                  /* for messages */
    bool reg_warned;           /* a failed registration was reported */
} offload_run_t;

/* Whether the flags make the optimizer state durable
 * (--optimizer-offload-durable; auto = yes for nvme, no for host). */
bool offload_run_opt_durable(const offload_opts_t *o);

/* Check the flag combination (no service contact). */
int offload_run_check(const offload_opts_t *o, char *err, size_t errlen);

/* Open the session and the savers the flags ask for, on f (built by
 * fsdp_create) of global rank `rank` among world. On a GPU backend in
 * shared-memory mode every pool segment of the job is registered with the
 * driver once, when the session maps it (pinned for DMA); a failed
 * registration warns and the copies stay pageable. Collective when the
 * optimizer is offloaded: *start gets the step to continue after (0 for a
 * fresh run; the resumed step with --resume-from-service). With no saver
 * on, it does nothing and leaves *start alone. */
int offload_run_open(offload_run_t *r, const offload_opts_t *o, fsdp_t *f, int rank, int world, int64_t *start,
                     char *err, size_t errlen);

/* One line describing what is offloaded (rank 0 prints it). */
void offload_run_describe(const offload_run_t *r, const fsdp_t *f, FILE *out);

/* The optimizer step s: streamed through ballastd when offloaded, else
 * fsdp_optim_step. */
int offload_run_optim_step(offload_run_t *r, fsdp_t *f, int64_t s, double lr, float grad_scale, char *err,
                           size_t errlen);

/* Around a sharded checkpoint or fsdp_gather_params: the moments (and the
 * fp32 master where optimizer offload keeps it in ballastd only) back in
 * backend memory, then gone again. */
int offload_run_before_ckpt(offload_run_t *r, char *err, size_t errlen);
void offload_run_after_ckpt(offload_run_t *r);

/* Backend memory of the optimizer's staging sets (0 when none). */
size_t offload_run_staging_bytes(const offload_run_t *r);

/* Collective: the job's offload traffic and waits (summed over ranks),
 * printed by rank 0 to out as one "offload:" line. */
int offload_run_summary(offload_run_t *r, fsdp_t *f, int rank, FILE *out, char *err, size_t errlen);

/* Tear down (before model_destroy). Optimizer offload first collects the
 * last step's commits and, when durable, writes its step record (a failure
 * there is logged as a warning). */
void offload_run_close(offload_run_t *r, fsdp_t *f);

#endif
