/* progress.h: what a training run reports while it goes.
 *
 * The loop fills one progress_step_t per optimizer step (loss, step time,
 * the exposed time of communication, offload waits and data loading,
 * offload bytes, memory when known) and hands it to progress_record(),
 * which derives the figures the field uses (tokens/s in total and per GPU,
 * model TFLOP/s per GPU, MFU, ETA), draws the console line, writes the JSON
 * log line and moves the Prometheus metrics. The formulas and the peak
 * table are in docs/observability.md.
 *
 * Accounting: model FLOPs per token come from llama_flops_per_token()
 * (6 x matmul parameters + 12 x L x H x Dh x T for attention); recomputed
 * forward passes of activation checkpointing are not counted, as in the
 * MFU of the PaLM paper and Megatron-LM. */
#ifndef BALLAST_PROGRESS_H
#define BALLAST_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "metrics.h"
#include "options.h"

/* Where a step's wall time went. Only compute overlaps nothing by
 * definition; the others count the time the step waited on them
 * (communication or copies hidden behind compute are not counted). */
typedef enum {
    PROGRESS_COMPUTE = 0, /* kernels; by default the rest of the step */
    PROGRESS_COMM,        /* exposed collective time (waiting on NCCL / shm) */
    PROGRESS_OFFLOAD,     /* exposed waits on ballastd copies */
    PROGRESS_DATA,        /* loading the next batch */
    PROGRESS_NPHASES
} progress_phase_t;

typedef struct {
    int64_t total_steps;     /* the run's last step */
    int64_t start_step;      /* last step finished before this process started (resume), else 0 */
    int64_t tokens_per_step; /* global tokens per optimizer step (all data-parallel ranks) */
    double flops_per_token;  /* llama_flops_per_token(cfg, T) */
    int n_gpus;              /* world size: ranks (GPUs or CPU ranks) sharing the work */
    const char *device;      /* "cpu" or the CUDA device name (cudaGetDeviceProperties().name) */
    double peak_tflops;      /* per-GPU dense peak override; 0 = look device up in the table */
    int64_t log_every;       /* plain console line every N steps (and at the first and last) */
    FILE *console;           /* stderr normally; NULL = no console output */
    int live;                /* 1 = one rewritten line, 0 = plain lines, -1 = live when console is a tty */
    FILE *json;              /* --log-json stream, or NULL */
    struct tb_writer *tb;    /* --tensorboard-dir event file (tensorboard.h), or NULL */
    int rank;                /* rank="N": set as the registry's constant label (on every series) */
    metrics_registry_t *metrics; /* registry to export to (metrics_default()), or NULL; also where the
                                    offload client's counters are read (progress_totals) */
} progress_cfg_t;

/* One step as the loop saw it. progress_step_init() sets the unknowns. */
typedef struct {
    int64_t step;                     /* 1-based optimizer step */
    double loss;                      /* mean loss over the global batch (may be non-finite when skipped) */
    double lr;                        /* learning rate used */
    double grad_norm;                 /* global gradient norm before clipping; NaN = unknown */
    double step_s;                    /* wall time of the whole step, seconds */
    double phase_s[PROGRESS_NPHASES]; /* exposed seconds per phase; compute < 0 = the rest of step_s */
    uint64_t offload_to_host_bytes;   /* this step, rank -> ballastd (to_service) */
    uint64_t offload_to_device_bytes; /* this step, ballastd -> rank (from_service) */
    int64_t mem_gpu_bytes;            /* device memory in use at the end of the step, -1 = unknown */
    int64_t mem_gpu_peak_bytes;       /* peak device memory during the step, -1 = unknown */
    int64_t mem_host_bytes;           /* host memory of this process (or its ballastd share), -1 = unknown */
    bool skipped;                     /* the update was skipped (non-finite loss with --skip-nonfinite) */
    double val_loss;                  /* mean validation loss after this step's update; NaN = none this step */
} progress_step_t;

/* What progress_record() derived from a step. */
typedef struct {
    double tokens_per_s;         /* global tokens / step_s */
    double tokens_per_s_per_gpu; /* tokens_per_s / n_gpus */
    double tflops_per_gpu;       /* flops_per_token * tokens / step_s / n_gpus / 1e12 */
    double mfu;                  /* tflops_per_gpu / peak; NaN when the peak is unknown */
    double phase_s[PROGRESS_NPHASES]; /* compute filled in when it was the rest */
    double eta_s;                /* (total - step) x mean step time of the recent window; NaN before a step */
    double elapsed_s;            /* since progress_new() */
    double offload_bytes_per_s;  /* (to_host + to_device) / step_s */
} progress_stats_t;

typedef struct progress progress_t;

/* The TensorBoard tags a step writes, with the JSON log field each one
 * carries (as a float): loss, val_loss, lr, grad_norm, tokens_per_s,
 * tokens_per_s_per_gpu, mfu, step_s, offload_to_host_bytes,
 * offload_to_device_bytes, offload_wait_s. Fields that are null (or absent)
 * in the JSON record are left out of the event. */
#define PROGRESS_TB_NTAGS 11
extern const char *const PROGRESS_TB_TAGS[PROGRESS_TB_NTAGS];

/* Non-finite loss policy. */
typedef enum {
    PROGRESS_LOSS_OK = 0,    /* finite: go on */
    PROGRESS_LOSS_SKIP = 1,  /* non-finite, --skip-nonfinite: skip this step's update and go on */
    PROGRESS_LOSS_STOP = -1, /* non-finite: stop the run at this step */
} progress_loss_action_t;

/* With --skip-nonfinite, this many non-finite steps in a row stop the run
 * anyway (the ones before are skipped): the run is not recovering. */
#define PROGRESS_MAX_NONFINITE_RUN 10

/* Start reporting. cfg is copied (its FILE pointers and strings must
 * outlive p). Registers the training metrics in cfg->metrics when set.
 * Returns NULL only when out of memory or a metric failed to register (the
 * message in err). */
progress_t *progress_new(const progress_cfg_t *cfg, char *err, size_t errlen);
/* End the live line (newline) and free. NULL is fine. */
void progress_free(progress_t *p);

/* A step record with everything unknown: NaN grad norm, compute = the rest,
 * memory -1, zero bytes. */
void progress_step_init(progress_step_t *s, int64_t step);

/* Running totals that the step loop reads at the start and at the end of
 * a step; their differences are the step's exposed communication and
 * offload figures. */
typedef struct {
    double comm_s;             /* comm_wait_seconds(): blocked in comm_wait, every communicator */
    double offload_wait_s;     /* ballast_offload_wait_seconds_total (fed by the offload client) */
    double to_service_bytes;   /* ballast_offload_bytes_total{direction="to_service"} */
    double from_service_bytes; /* ballast_offload_bytes_total{direction="from_service"} */
} progress_totals_t;

/* Read the totals now (the offload ones from p's registry; 0 without one,
 * or when nothing feeds them). p may be NULL. */
void progress_totals(const progress_t *p, progress_totals_t *t);

/* Set s's comm and offload phases and its offload bytes to b - a (two
 * readings of progress_totals around the step). progress_record() does not
 * add these bytes and waits to the offload counters: the client that moves
 * the bytes feeds those. */
void progress_step_since(progress_step_t *s, const progress_totals_t *a, const progress_totals_t *b);

/* Derive the figures for s, draw the console line, write the JSON line and
 * the TensorBoard event (the scalars of PROGRESS_TB_TAGS) and update the
 * metrics. stats may be NULL. Returns 0, or -1 when writing the JSON log or
 * the event file failed (message in err: disk full, closed pipe). */
int progress_record(progress_t *p, const progress_step_t *s, progress_stats_t *stats, char *err, size_t errlen);

/* The end of a training step of the training loop (workers/train/loop.c,
 * every layout): a step record for step `step` with the comm and offload
 * figures since `before` (progress_totals at the step's start), the loss,
 * learning rate, gradient norm, wall time, data-loading time and process
 * memory, then progress_record(). Returns what progress_record returns. */
int progress_end_step(progress_t *p, int64_t step, const progress_totals_t *before, double loss, double lr,
                      double grad_norm, double step_s, double data_s, bool skipped, char *err, size_t errlen);

/* The validation loss the next progress_end_step records (once). */
void progress_set_val_loss(progress_t *p, double val_loss);

/* Erase the live line so that a log message starts on a clean line (no-op
 * in plain mode); the next progress_record() draws it again. */
void progress_clear_line(progress_t *p);

/* The console line for s (live = the compact form), without a newline. */
void progress_format_line(const progress_t *p, const progress_step_t *s, const progress_stats_t *st, bool live,
                          char *buf, size_t len);

/* Decide what a loss means for the run: PROGRESS_LOSS_OK when finite; else
 * STOP, or SKIP with skip_nonfinite unless PROGRESS_MAX_NONFINITE_RUN steps
 * in a row were non-finite. msg gets the sentence to log, naming the step,
 * the value, the cause and the fix. Counts skipped steps in the metrics. */
progress_loss_action_t progress_check_loss(progress_t *p, int64_t step, double loss, bool skip_nonfinite, char *msg,
                                           size_t msglen);

/* Write the JSON log's first line: {"kind": "settings", "settings": {flag:
 * value...}, "model", "params", "n_gpus", "device", "peak_tflops",
 * "flops_per_token", "tokens_per_step", "total_steps", "entropy_nats"}.
 * opts: the program's option table (values as strings, as --help shows
 * them); model may be NULL; entropy_nats NaN when unknown. Returns 0 or -1
 * with err on a write error. */
int progress_write_settings(progress_t *p, const opt_t *opts, size_t n_opts, const char *model, int64_t params,
                            double entropy_nats, char *err, size_t errlen);

/* Resident memory of this process in bytes (/proc/self/statm), -1 when
 * unknown: the CPU backend's "device" memory. */
int64_t progress_rss_bytes(void);

/* ---- the arithmetic, for tests and `ballast plan` ---- */

/* Dense bf16 peak TFLOP/s of one device, from its CUDA name ("NVIDIA
 * H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", ...), case-insensitive.
 * Returns -1 when unknown, and for "cpu" (no fixed peak: pass a measured one
 * as peak_tflops). */
double progress_peak_tflops(const char *device);

/* flops_per_token * tokens / seconds / n_gpus / 1e12. */
double progress_tflops_per_gpu(double flops_per_token, double tokens, double seconds, int n_gpus);

/* The corpus entropy floor written by `ballast data synth` next to a shard
 * (SHARD.json, "entropy_nats"); for a glob, the first match's. NaN when
 * there is none. */
double progress_entropy_floor(const char *data_path);

#endif
