/* train.h: ballast-worker's options and its training loop.
 *
 * train_parse() fills the options from defaults, BALLAST_* environment
 * variables and flags (common/options.h; the table is options.c);
 * train_run() (loop.c) joins the job, builds the model, its sharded state,
 * the optimizer and the data loader, then runs the steps, logging and
 * checkpointing. One loop for every layout: a world of several processes
 * is one rank of a hybrid-sharded, tensor-parallel job
 * (workers/parallel/fsdp.h), and one process is world 1 of the same loop
 * (replicas = S = T = 1: no rendezvous, no collectives, the state in place).
 * Both return a process exit status. */
#ifndef BALLAST_TRAIN_H
#define BALLAST_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

#include "options.h"
#include "topology.h"
#include "workers/backend/backend.h"
#include "workers/model/config.h"
#include "workers/model/model.h"

typedef struct {
    const char *model;        /* preset name, config.json or model directory */
    const char *init_from;    /* Hugging Face directory to load weights from */
    int64_t init_seed;        /* seed of the random initialisation */
    const char *data;         /* shard file or glob */
    const char *val_data;     /* validation shard file or glob, or NULL */
    int64_t eval_every;       /* steps between evaluations; 0 = after the last step only */
    int64_t eval_batches;     /* micro-batches per evaluation (per data-parallel rank); 0 = 8 */
    int data_order;           /* data_order_t */
    int64_t data_seed;
    int64_t micro_batch;      /* B rows per micro-step */
    int64_t seq_len;          /* T tokens per row */
    int64_t grad_accum;       /* A micro-steps per step */
    int64_t global_batch_tokens; /* when > 0, sets A = tokens / (B*T) */
    int64_t steps;            /* optimizer steps in the whole run */
    double lr, min_lr, beta1, beta2, adam_eps, weight_decay, grad_clip;
    int lr_schedule;          /* lr_schedule_t */
    double min_lr_ratio;      /* final lr / lr; < 0: unset (min_lr applies) */
    double decay_fraction;    /* wsd: fraction of the steps that decays */
    int64_t warmup_steps;
    const char *tokenizer;    /* recorded in checkpoints, or NULL */
    const char *ckpt_dir;
    int64_t ckpt_every;       /* steps between checkpoints; 0 = only at the end */
    int64_t ckpt_keep;        /* newest complete checkpoints kept; 0 = all */
    const char *resume_arg;   /* --resume as given: false|true|auto|PATH */
    bool resume;              /* continue from a checkpoint (resolved from resume_arg) */
    bool resume_auto;         /* --resume auto: no checkpoint yet is a normal fresh start */
    const char *resume_path;  /* --resume PATH: that step directory; NULL = the newest in ckpt_dir */
    bool allow_schedule_change; /* --resume may continue on a different learning-rate schedule */
    bool print_settings;      /* the full settings table at start (else the changed ones on one line) */
    const char *log_json;     /* file, "-" for stdout, or NULL */
    const char *tensorboard_dir; /* TensorBoard event files (rank 0), or NULL */
    int64_t log_every;        /* console line every N steps */
    model_ckpt_t act_ckpt;    /* --activation-checkpointing: none, full or selective */
    bool cp_overlap;          /* --cp-overlap: the GPU, not the host, waits for the ring's shifts */
    int64_t threads;          /* OpenMP threads; 0 = all cores */
    int backend;              /* 0 = cpu, 1 = cuda */
    int64_t device;           /* GPU index for the cuda backend */
    int precision;            /* --precision: 0 = bf16, 1 = fp8 (cuda only) */
    int attention;            /* --attention: be_attention_t (cuda only) */
    bool cuda_sync;           /* --cuda-sync: check every kernel as it finishes (cuda only) */
    int grad_reduce_dtype;    /* --grad-reduce-dtype: 0 = fp32, 1 = bf16 */
    const char *dump_grads;   /* test hook: step 1's logits, loss and gradients */
    int64_t metrics_port;     /* Prometheus /metrics port (docs/observability.md); 0 = off */
    const char *metrics_bind; /* address /metrics binds */
    bool skip_nonfinite;      /* skip the update of a step with a NaN/inf loss instead of stopping */
    double peak_tflops;       /* per-device peak for MFU; 0 = the device table (none for the CPU) */
    const char *dump_params;  /* test hook: the master parameters after the last step */
    const char *dump_batches; /* test hook: directory for each rank's micro-batch inputs */
    /* the job (one process: world 1) */
    int64_t shard_degree;     /* --hybrid-shard-degree S; 0 = largest that fits */
    int64_t tp_degree;        /* --tensor-parallel-degree T */
    int64_t cp_degree;        /* --context-parallel-degree C */
    uint64_t max_act_bytes;   /* --max-activation-bytes: per-rank activation limit; 0 = none */
    int comm;                 /* comm_kind_t: auto|shm|nccl */
    double rdzv_timeout;      /* seconds every rank has to join */
    const char *comm_dir;     /* --comm-dir; NULL = the directory of offload_socket */
    int64_t rank, world_size; /* -1 = from the environment (common/topology.h) */
    const char *master_addr;  /* rendezvous host; NULL = environment */
    int64_t master_port;      /* -1 = environment */
    /* memory savers through ballastd (workers/offload/act.h, workers/offload/opt.h) */
    bool act_offload;         /* --activation-offload: kept block inputs go to ballastd */
    int64_t act_horizon;      /* --activation-loading-horizon H: blocks fetched ahead in backward */
    int opt_offload;          /* --optimizer-offload: 0 none, 1 host, 2 nvme */
    int opt_durable;          /* --optimizer-offload-durable: 0 auto (yes for nvme, no for host), 1 yes, 2 no */
    const char *offload_socket; /* ballastd's Unix socket ("unix:/path" or a path) */
    const char *offload_remote; /* "host:port": remote mode instead of the socket; NULL = off */
    const char *offload_job;  /* job name of this run's blobs in ballastd */
    const char *offload_token_file; /* token for a ballastd started with --token-file; NULL = none */
    bool resume_from_service; /* continue from the state ballastd holds (no checkpoint file) */
} train_opts_t;

/* Parse argv (argv[0] is the program name). Returns 0 to run, 1 when help
 * was printed, -1 on error (message printed). */
int train_parse(int argc, char **argv, train_opts_t *o);

/* The name the messages go under: "ballast-worker", or the command the
 * user typed when a launcher started this process ("ballast train"). */
void train_set_program(const char *name);
const char *train_program(void);

/* Print the effective settings table to out. */
void train_print_settings(FILE *out);

/* One line of the settings that differ from the defaults. */
void train_print_changed_settings(FILE *out);

/* The worker's option table (for the JSON log's settings record); *n gets
 * its length. */
const opt_t *train_option_table(size_t *n);

/* Run training as this process's rank of its job (world 1 for one
 * process); 0 on success, 130 after SIGINT/SIGTERM (the step finished and,
 * with --ckpt-dir, a checkpoint saved), 1 with a logged message otherwise. */
int train_run(const train_opts_t *o);

/* The backend the flags name (backend_open), passed through the test
 * build's wrapper when one is set; NULL with a message. */
const backend_t *train_open_backend(const train_opts_t *o, int device, char *err, size_t errlen);

/* A test build of ballast-worker (tests/lib/worker_test_main.c) swaps the
 * backend train_run opens for a test double (a CPU backend whose memory the
 * host may not touch): wrap gets the opened table and returns the one to
 * train on, or NULL with a message. NULL (the default) trains on the
 * opened one. */
typedef const backend_t *(*train_backend_wrap_fn)(const backend_t *opened, char *err, size_t errlen);
void train_set_backend_wrap(train_backend_wrap_fn wrap);

/* ---- what the flags resolve to (options.c) ---- */

/* --model / --init-from into one validated config. */
int train_resolve_config(const train_opts_t *o, llama_config_t *cfg, char *err, size_t errlen);
/* Micro-steps per step from --grad-accum / --global-batch-tokens, with dp
 * data-parallel ranks reading B x T tokens each per micro-step; -1 with a
 * message when they conflict. */
int train_grad_accum(const train_opts_t *o, int dp, int *A, char *err, size_t errlen);
/* Where this process sits: --rank, --world-size, --master-addr,
 * --master-port, then the environment (common/topology.h). */
int train_resolve_topology(const train_opts_t *o, topo_t *t, char *err, size_t errlen);

#endif
