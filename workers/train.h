/* train.h: the training loop of ballast-worker (one process, CPU or CUDA backend).
 *
 * train_parse() fills the options from defaults, BALLAST_* environment
 * variables and flags (common/options.h); train_run() builds the model, the
 * optimizer and the data loader, then runs the steps, logging and
 * checkpointing. Both return a process exit status. */
#ifndef BALLAST_TRAIN_H
#define BALLAST_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    const char *model;        /* preset name, config.json or model directory */
    const char *init_from;    /* Hugging Face directory to load weights from */
    int64_t init_seed;        /* seed of the random initialisation */
    const char *data;         /* shard file or glob */
    int data_order;           /* data_order_t */
    int64_t data_seed;
    int64_t micro_batch;      /* B rows per micro-step */
    int64_t seq_len;          /* T tokens per row */
    int64_t grad_accum;       /* A micro-steps per step */
    int64_t global_batch_tokens; /* when > 0, sets A = tokens / (B*T) */
    int64_t steps;            /* optimizer steps in the whole run */
    double lr, min_lr, beta1, beta2, adam_eps, weight_decay, grad_clip;
    int lr_schedule;          /* lr_schedule_t */
    int64_t warmup_steps;
    const char *ckpt_dir;
    int64_t ckpt_every;       /* steps between checkpoints; 0 = only at the end */
    bool resume;              /* continue from the newest checkpoint in ckpt_dir */
    const char *log_json;     /* file, "-" for stdout, or NULL */
    int64_t log_every;        /* console line every N steps */
    bool act_ckpt;            /* --activation-checkpointing */
    int64_t threads;          /* OpenMP threads; 0 = all cores */
    int backend;              /* 0 = cpu, 1 = cuda */
    int64_t device;           /* GPU index for the cuda backend */
    const char *dump_grads;   /* test hook: step 1's logits, loss and gradients */
    int64_t metrics_port;     /* Prometheus /metrics port (docs/observability.md); 0 = off */
    const char *metrics_bind; /* address /metrics binds */
    bool skip_nonfinite;      /* skip the update of a step with a NaN/inf loss instead of stopping */
    double peak_tflops;       /* per-device peak for MFU; 0 = the device table (none for the CPU) */
} train_opts_t;

/* Parse argv (argv[0] is the program name). Returns 0 to run, 1 when help
 * was printed, -1 on error (message printed). */
int train_parse(int argc, char **argv, train_opts_t *o);

/* Print the effective settings table to out. */
void train_print_settings(FILE *out);

/* Run training; 0 on success, non-zero with a logged message otherwise. */
int train_run(const train_opts_t *o);

#endif
