/* loop.c: the training loop of ballast-worker, one for every layout; see
 * train.h.
 *
 * A step is A micro-steps x dp data-parallel ranks x B rows of T tokens
 * (dp = world / T: replicas x shard degree; one process: dp = 1). Rank r
 * reads rows dp_rank*B .. dp_rank*B+B-1 of each micro-step's dp*B rows
 * (data_batch with dp_rank of dp), so one process with micro-batch dp*B
 * reads the same tokens. The loss of step s is the mean token
 * cross-entropy over its global batch before its update (the ranks' sums
 * added in rank order); only rank 0 prints progress and writes --log-json
 * (progress.h), while every rank keeps its own metrics and, with
 * --metrics-port P, serves them on P + its local rank.
 *
 * The parameters, gradients and AdamW moments live in the chunks of
 * workers/parallel/fsdp.h (one process: S = 1, the whole model in place);
 * checkpoints are workers/ckpt/sharded.h's (one shard file for one
 * process); the memory savers through ballastd (--activation-offload,
 * --optimizer-offload, --resume-from-service) hook in through
 * workers/offload/run.h. Every decision that ends or changes a step (a
 * non-finite loss, a signal, a failed resume) is taken on a sum over the
 * ranks, so all take it together. */
#include "workers/train/train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "workers/ckpt/ckpt.h"
#include "workers/ckpt/hf.h"
#include "workers/ckpt/sharded.h"
#include "workers/data/data.h"
#include "workers/model/model.h"
#include "workers/model/optim.h"
#include "workers/offload/run.h"
#include "workers/parallel/fsdp.h"
#include "workers/train/hooks.h"
#include "workers/train/job.h"
#include "workers/train/progress.h"
#include "workers/train/tensorboard.h"

/* ---- signals ----
 * The first SIGINT/SIGTERM is acknowledged at once on stderr (unless a
 * launcher watching this process already did) and ends the run after the
 * step in progress, with a checkpoint; a second one aborts at once, saying
 * which steps are lost. Only async-signal-safe calls in the handler. */
static volatile sig_atomic_t g_stop;       /* signals received */
static volatile sig_atomic_t g_step;       /* the step in progress (0: before the first) */
static volatile sig_atomic_t g_saved = -1; /* the newest step saved or resumed from; -1: none */
static bool g_speak = true;                /* this process tells the terminal (rank 0, or no launcher acknowledging) */
static bool g_acked;                       /* a launcher acknowledges the first signal */
static char g_ack[512];                    /* the first signal's acknowledgement, composed before the steps */
static const char *g_prog = "ballast-worker";

static void put(const char *s) { ssize_t w = write(STDERR_FILENO, s, strlen(s)); (void)w; }

static void put_int(long v) {
    char b[24];
    int i = sizeof b;
    b[--i] = 0;
    bool neg = v < 0;
    if (neg) v = -v;
    do { b[--i] = (char)('0' + v % 10); v /= 10; } while (v && i > 1);
    if (neg) b[--i] = '-';
    put(b + i);
}

static void on_signal(int sig) {
    (void)sig;
    g_stop++;
    if (g_stop == 1) {
        if (g_speak && !g_acked) put(g_ack);
        return;
    }
    if (g_speak) {
        put(g_prog);
        long at = g_step > 0 ? (long)g_step : 1, from = g_saved > 0 ? (long)g_saved + 1 : 1;
        put(": second signal: aborting now; lost: step");
        if (from < at) { put("s "); put_int(from); put(" to"); }
        put(" ");
        put_int(at);
        if (g_saved > 0) { put(" (the newest checkpoint is step "); put_int((long)g_saved); put(")\n"); }
        else put(" (no checkpoint was saved)\n");
    }
    _exit(130);
}

/* One run: the job, its data, model, sharded state and savers. */
typedef struct {
    const train_opts_t *o;
    train_job_t job;
    const char *who;           /* "rank N: " in a job of several processes, "" for one */
    llama_config_t cfg;
    optim_config_t ocfg;
    int dp, dp_rank;           /* data-parallel ranks (world / (T x C)) and this rank's index */
    int A, B, T;               /* micro-steps per step, rows per micro-step, tokens per row */
    int C, cp_rank;            /* context-parallel degree and this rank's index in its CP group */
    int32_t *cp_in, *cp_tg;    /* (B*T/C) this rank's two chunks of each row (C > 1), else NULL */
    int64_t start;             /* the step the run continues after (0: fresh) */
    data_t *data;
    data_t *val;               /* --val-data, or NULL */
    int64_t eval_k;            /* micro-batches per evaluation on each data-parallel rank */
    model_t model;             /* activations and layout (the parameters are in fs) */
    bool have_model, have_fs;
    fsdp_t fs;
    offload_run_t orun;        /* memory savers through ballastd */
    FILE *con;                 /* console: stdout, or stderr when --log-json is stdout */
    FILE *jlog;                /* --log-json on rank 0, or NULL */
    tb_writer_t *tb;           /* --tensorboard-dir on rank 0, or NULL */
    progress_t *prog;
    metrics_server_t *msrv;
    int32_t *inputs, *targets; /* (B*T) host micro-batch */
    float *logits_host;        /* (B*T, vocab) step 1's first logits for --dump-grads, or NULL */
    char err[5000];
} run_t;

/* ---- before the model ---- */

/* The flag combinations no run can start with; 0 or -1 (logged). */
/* The memory savers' flags (workers/offload/run.h) out of the worker's. */
static offload_opts_t offload_opts(const train_opts_t *o) {
    return (offload_opts_t){ .act_offload = o->act_offload, .act_horizon = o->act_horizon,
                             .opt_offload = o->opt_offload, .opt_durable = o->opt_durable,
                             .socket = o->offload_socket, .remote = o->offload_remote, .job = o->offload_job,
                             .token_file = o->offload_token_file, .resume_from_service = o->resume_from_service,
                             .resume = o->resume, .skip_nonfinite = o->skip_nonfinite };
}

static int check_flags(run_t *r) {
    const train_opts_t *o = r->o;
    if (o->resume && !o->ckpt_dir && !o->resume_path) {
        log_error("--resume %s needs --ckpt-dir DIR (where the step-NNNNNNNN directories are)", o->resume_arg);
        return -1;
    }
    if (o->ckpt_every && !o->ckpt_dir) { log_error("--ckpt-every needs --ckpt-dir DIR"); return -1; }
    if (o->tokenizer) {
        struct stat st;
        char tj[4200];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", o->tokenizer);
        if (stat(o->tokenizer, &st) != 0 || (S_ISDIR(st.st_mode) && access(tj, R_OK) != 0)) {
            log_error("--tokenizer %s: neither a tokenizer.json file nor a directory holding one", o->tokenizer);
            return -1;
        }
    }
    if (o->ckpt_keep && !o->ckpt_dir) { log_error("--ckpt-keep needs --ckpt-dir DIR"); return -1; }
    if (o->min_lr_ratio >= 0 && o->min_lr != 0) {
        log_error("--min-lr %g and --min-lr-ratio %g both set the final learning rate; give one of them", o->min_lr,
                  o->min_lr_ratio);
        return -1;
    }
    if (o->lr_schedule == LR_WSD && !(o->decay_fraction > 0)) {
        log_error("--lr-schedule wsd needs --decay-fraction in (0, 1] (got %g)", o->decay_fraction);
        return -1;
    }
    if ((o->eval_every || o->eval_batches) && !o->val_data) {
        log_error("--eval-every and --eval-batches need --val-data FILE|GLOB (a validation token shard)");
        return -1;
    }
    if (o->val_data && o->act_offload) {
        log_error("--val-data does not run with --activation-offload yet (evaluation is a forward pass without the saver); "
                  "evaluate the checkpoint with `ballast eval --from CKPT --data SHARD` instead");
        return -1;
    }
    if (o->dump_grads && r->job.world > 1) {
        log_error("rank %d: --dump-grads works with one process only; use --dump-params", r->job.rank);
        return -1;
    }
    offload_opts_t oopt = offload_opts(o);
    if (offload_run_check(&oopt, r->err, sizeof r->err)) { log_error("%s", r->err); return -1; }
    return 0;
}

/* One process on the CPU without the savers: refuse a model that cannot
 * fit this machine's memory before allocating it (whole-model weights,
 * gradients, moments and activations, model_memory_bytes). With offload
 * part of that lives in ballastd, whose pool is sized on its own. 0 or -1
 * (logged). */
static int check_memory(run_t *r) {
    const train_opts_t *o = r->o;
    if (r->job.world > 1 || o->backend != 0 || o->act_offload || o->opt_offload || o->resume_from_service) return 0;
    uint64_t need = model_memory_bytes(&r->cfg, r->B, r->T, o->act_ckpt);
    uint64_t have = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGE_SIZE);
    if (!have || need <= have / 10 * 9) return 0;
    char a[32], b[32];
    format_size(need, a, sizeof a);
    format_size(have, b, sizeof b);
    log_error("model %s with micro-batch %d x %d needs about %s of memory; this machine has %s. "
              "Use a smaller model, micro-batch or seq-len, or --activation-checkpointing",
              r->cfg.name, r->B, r->T, a, b);
    return -1;
}

/* The data: the step's shape (A from the flags and dp), the shard files. */
static int open_data(run_t *r) {
    const train_opts_t *o = r->o;
    if (train_grad_accum(o, r->dp, &r->A, r->err, sizeof r->err)) { log_error("%s", r->err); return -1; }
    if (data_open(o->data, r->cfg.vocab, &r->data, r->err, sizeof r->err)) { log_error("%s", r->err); return -1; }
    if (o->val_data) {
        if (data_open(o->val_data, r->cfg.vocab, &r->val, r->err, sizeof r->err)) {
            log_error("--val-data: %s", r->err);
            return -1;
        }
        /* K whole batches of dp x B rows of T tokens, never wrapping */
        int64_t row = (int64_t)r->dp * r->B * r->T, have = (data_num_tokens(r->val) - 1) / row;
        if (have < 1) {
            log_error("--val-data %s: %lld tokens, fewer than one evaluation batch needs (data-parallel ranks x "
                      "micro-batch x seq-len + 1 = %lld); use more validation data or a smaller --micro-batch",
                      o->val_data, (long long)data_num_tokens(r->val), (long long)row + 1);
            return -1;
        }
        r->eval_k = o->eval_batches > 0 ? o->eval_batches : 8;
        if (r->eval_k > have) {
            if (o->eval_batches > 0 && r->job.rank == 0)
                log_warn("--eval-batches %lld: the validation data holds %lld whole batches; evaluating those",
                         (long long)o->eval_batches, (long long)have);
            r->eval_k = have;
        }
    }
    if (data_num_tokens(r->data) < (int64_t)r->T + 1) {
        log_error("%s: %lld tokens, fewer than seq-len + 1 = %d", o->data, (long long)data_num_tokens(r->data), r->T + 1);
        return -1;
    }
    return 0;
}

/* ---- the model and its state ---- */

/* The model's activations, the full initial weights (--init-from or the
 * seed, identical on every rank, in host memory) cut into this rank's
 * chunks, and the AdamW state. 0 or -1 (logged). */
static int build(run_t *r) {
    const train_opts_t *o = r->o;
    const groups_t *g = &r->job.d.groups;
    /* no full parameters on the device: they live in fsdp's chunks */
    if (model_create_acts(&r->model, &r->cfg, r->job.be, r->B, r->T / r->C, o->act_ckpt, g->T, g->tp,
                          r->job.d.comm[GROUP_TP], r->err, sizeof r->err)) {
        log_error("%s", r->err);
        return -1;
    }
    r->have_model = true;
    if (model_set_cp(&r->model, r->C, r->cp_rank, r->job.d.comm[GROUP_CP], r->err, sizeof r->err)) {
        log_error("%s%s", r->who, r->err);
        return -1;
    }
    r->model.cp.host_wait = !o->cp_overlap;
    if (o->max_act_bytes && r->model.act_bytes > o->max_act_bytes) {
        char need[32], lim[32];
        format_size(r->model.act_bytes, need, sizeof need);
        format_size(o->max_act_bytes, lim, sizeof lim);
        /* the activations scale with a rank's tokens: the smallest C that fits */
        uint64_t c = ((uint64_t)r->model.act_bytes * (uint64_t)r->C + o->max_act_bytes - 1) / o->max_act_bytes;
        log_error("%sseq-len %d with micro-batch %d needs %s (%zu bytes) of activations per rank at "
                  "--context-parallel-degree %d, over --max-activation-bytes %s: split each sequence over more "
                  "ranks (--context-parallel-degree %llu or more, with as many times the processes), or lower "
                  "--micro-batch or --seq-len", r->who, r->T, r->B, need, r->model.act_bytes, r->C, lim,
                  (unsigned long long)(c > (uint64_t)r->C ? c : (uint64_t)r->C + 1));
        return -1;
    }
    float *full = malloc(r->model.n_params * sizeof(float));
    CHECK_ALLOC(full);
    int rc = 0;
    if (o->init_from) rc = ckpt_read_hf_host(o->init_from, &r->model, full, r->err, sizeof r->err);
    else model_init_random_host(&r->model, (uint64_t)o->init_seed, full);
    if (rc) {
        log_error("%s", r->err);
        free(full);
        return -1;
    }
    r->ocfg = (optim_config_t){
        .lr = o->lr, .min_lr = o->min_lr_ratio >= 0 ? o->lr * o->min_lr_ratio : o->min_lr,
        .decay_fraction = o->decay_fraction, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->adam_eps,
        .weight_decay = o->weight_decay, .grad_clip = o->grad_clip, .warmup_steps = o->warmup_steps,
        .total_steps = o->steps, .schedule = (lr_schedule_t)o->lr_schedule,
        /* optimizer offload from scratch (or from the service): the moments and,
         * on a GPU, the fp32 master never take device memory; a checkpoint
         * resume loads them on the device first */
        .state_elsewhere = o->opt_offload && !o->resume,
    };
    rc = fsdp_create(&r->fs, &r->model, full, r->job.d.comm[GROUP_SHARD], r->job.d.comm[GROUP_REPLICA], &r->ocfg,
                     r->err, sizeof r->err);
    free(full);
    if (rc) { log_error("%s%s", r->who, r->err); return -1; }
    r->have_fs = true;
    r->fs.C = r->C;
    if (o->grad_reduce_dtype == 1 && fsdp_set_grad_reduce(&r->fs, COMM_BF16, r->err, sizeof r->err)) {
        log_error("%s%s", r->who, r->err);
        return -1;
    }
    return 0;
}

/* Whether checkpoint ck continues this run's data stream and model; 0, or
 * -1 with the reason in r->err. Step k reads samples k*G .. k*G+G-1
 * (G = grad-accum x data-parallel ranks x micro-batch rows) whatever the
 * split, so only G, seq-len and the order must stay. */
static int check_resume(run_t *r, const char *ck, const ckpt_meta_t *meta) {
    const train_opts_t *o = r->o;
    const llama_config_t *a = &meta->cfg, *b = &r->cfg;
    if (a->dim != b->dim || a->n_layers != b->n_layers || a->n_heads != b->n_heads || a->n_kv_heads != b->n_kv_heads ||
        a->head_dim != b->head_dim || a->ffn_dim != b->ffn_dim || a->vocab != b->vocab ||
        a->tie_embeddings != b->tie_embeddings) {
        snprintf(r->err, sizeof r->err, "%s: the checkpoint's model (dim %d, %d layers, vocab %d) differs from --model "
                 "(dim %d, %d layers, vocab %d)", ck, a->dim, a->n_layers, a->vocab, b->dim, b->n_layers, b->vocab);
        return -1;
    }
    int64_t saved = (int64_t)meta->accum * meta->dp * meta->B, rows = (int64_t)r->A * r->dp * r->B;
    if (saved == rows && meta->T == r->T && meta->data_order == o->data_order &&
        meta->data_seed == (uint64_t)o->data_seed)
        return 0;
    int n = snprintf(r->err, sizeof r->err, "%s: saved with grad-accum %d x %d data-parallel ranks x micro-batch %d = "
                     "%lld rows per step, seq-len %d, data-order %s, data-seed %llu; ", ck, meta->accum, meta->dp,
                     meta->B, (long long)saved, meta->T, meta->data_order == DATA_SEQUENTIAL ? "sequential" : "shuffled",
                     (unsigned long long)meta->data_seed);
    if (n < 0 || (size_t)n >= sizeof r->err) return -1;
    if (r->dp == 1)
        snprintf(r->err + n, sizeof r->err - (size_t)n, "this run has %d x %d = %lld rows, seq-len %d: resume with the "
                 "same seq-len, order and seed, and --grad-accum x --micro-batch = %lld, to continue the same data "
                 "stream", r->A, r->B, (long long)rows, r->T, (long long)saved);
    else
        snprintf(r->err + n, sizeof r->err - (size_t)n, "this run has %d x %d x %d = %lld rows, seq-len %d: resume "
                 "with the same seq-len, order and seed, and --grad-accum / --micro-batch whose product with the %d "
                 "data-parallel ranks is %lld, to continue the same data stream", r->A, r->dp, r->B, (long long)rows,
                 r->T, r->dp, (long long)saved);
    return -1;
}

static bool differs(double a, double b) { return fabs(a - b) > 1e-9 * fmax(fabs(a), fabs(b)); }

/* Whether the learning-rate schedule the checkpoint ck was written under
 * (saved) is the one this run sets (r->ocfg); 0, or -1 naming every
 * changed field in r->err, unless --allow-schedule-change. The schedule's
 * length matters unless it is constant (its warmup is --warmup-steps long
 * whatever --steps says). */
static int check_schedule(run_t *r, const char *ck, const ckpt_meta_t *meta) {
    const optim_config_t *saved = &meta->ocfg, *now = &r->ocfg;
    static const char *names[] = { "constant", "cosine", "linear", "wsd" };
    /* past the end: train_run says there is nothing to train */
    if (r->o->allow_schedule_change || meta->step >= r->o->steps) return 0;
    char diff[1024] = "";
    size_t n = 0;
#define ADD(...) n += (size_t)snprintf(diff + n, n < sizeof diff ? sizeof diff - n : 0, __VA_ARGS__)
    if (saved->schedule != now->schedule)
        ADD("%s--lr-schedule %s (now %s)", n ? ", " : "", names[saved->schedule & 3], names[now->schedule & 3]);
    if (differs(saved->lr, now->lr)) ADD("%s--lr %g (now %g)", n ? ", " : "", saved->lr, now->lr);
    if (differs(saved->min_lr, now->min_lr) && now->schedule != LR_CONSTANT)
        ADD("%sa final learning rate (--min-lr / --min-lr-ratio) of %g (now %g)", n ? ", " : "", saved->min_lr, now->min_lr);
    if (saved->warmup_steps != now->warmup_steps)
        ADD("%s--warmup-steps %lld (now %lld)", n ? ", " : "", (long long)saved->warmup_steps, (long long)now->warmup_steps);
    if (saved->total_steps != now->total_steps && now->schedule != LR_CONSTANT) /* warmup does not depend on it */
        ADD("%s--steps %lld (now %lld)", n ? ", " : "", (long long)saved->total_steps, (long long)now->total_steps);
    if (now->schedule == LR_WSD && differs(saved->decay_fraction, now->decay_fraction))
        ADD("%s--decay-fraction %g (now %g)", n ? ", " : "", saved->decay_fraction, now->decay_fraction);
#undef ADD
    if (!n) return 0;
    snprintf(r->err, sizeof r->err, "%s was trained with %s: resuming with other values would change the learning-rate "
             "schedule mid-run; give the checkpoint's values, or --allow-schedule-change to continue on the new schedule",
             ck, diff);
    return -1;
}

/* --resume: every rank reads its part of the newest checkpoint (all or
 * none: a failure on any rank stops every rank), then sets r->start. 0 or
 * -1 (logged). */
static int resume(run_t *r) {
    const train_opts_t *o = r->o;
    char ck[4200];
    int found = 1;
    if (o->resume_path) snprintf(ck, sizeof ck, "%s", o->resume_path);
    else found = ckpt_find_latest(o->ckpt_dir, ck, sizeof ck, r->err, sizeof r->err);
    int bad = found < 0;
    if (found > 0) {
        ckpt_meta_t meta;
        bad = ckpt_read_meta(ck, &meta, r->err, sizeof r->err) || check_resume(r, ck, &meta) ||
              ckpt_load(&r->fs, ck, r->err, sizeof r->err) || check_schedule(r, ck, &meta);
    }
    double nbad;
    char e[COMM_ERR_LEN];
    if (fsdp_sum_all(&r->fs, bad, &nbad, e, sizeof e)) { log_error("%s%s", r->who, e); return -1; }
    if (bad) { log_error("%s%s", r->who, r->err); return -1; }
    if (nbad > 0) { log_error("rank %d: resuming failed on another rank (see its message)", r->job.rank); return -1; }
    if (found > 0) {
        r->start = r->fs.opt.step;
        if (r->job.rank == 0) log_info("resumed from %s (step %lld)", ck, (long long)r->start);
    } else if (r->job.rank == 0 && o->resume_auto) {
        log_info("--resume auto: no complete checkpoint under %s yet: starting at step 0", o->ckpt_dir);
    } else if (r->job.rank == 0) {
        log_warn("--resume: no checkpoint under %s yet, starting from scratch", o->ckpt_dir);
    }
    return 0;
}

/* A checkpoint directory every rank shares (several processes): checked
 * at step 0, so an unshared one fails here, not at the first save. 0 or
 * -1 (logged). */
static int check_ckpt_dir(run_t *r) {
    const train_opts_t *o = r->o;
    if (!o->ckpt_dir || r->job.world == 1) return 0;
    char host[128] = "?", where[256];
    gethostname(host, sizeof host - 1);
    snprintf(where, sizeof where, "rank %d (node %d, host %s): ", r->job.rank, r->job.topo.node_rank, host);
    int rc = ckpt_check_shared(&r->fs, o->ckpt_dir, r->job.rank, where, r->err, sizeof r->err);
    if (rc == 0) return 0;
    if (rc == -ENOENT) log_error("%s", r->err);
    else log_error("%s%s", r->who, r->err);
    return -1;
}

/* ---- what the run tells ---- */

/* Rank 0's start-up lines: the settings table, the model, the layout, the
 * batch, the memory the state takes, what is offloaded. */
static void announce(run_t *r) {
    const train_opts_t *o = r->o;
    const llama_config_t *c = &r->cfg;
    const groups_t *g = &r->job.d.groups;
    FILE *con = r->con;
    if (o->print_settings) train_print_settings(con);
    else train_print_changed_settings(con);
    fprintf(con, "model: %s, %lld parameters (dim %d, %d layers, %d heads / %d kv, ffn %d, vocab %d%s)\n", c->name,
            (long long)llama_total_params(c), c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab,
            c->tie_embeddings ? ", tied" : "");
    if (g->C > 1)
        fprintf(con, "layout: world %d = %d replicas x hybrid shard degree %d x tensor-parallel degree %d x "
                     "context-parallel degree %d; comm %s\n", r->job.world, g->R, g->S, g->T, g->C,
                dist_comm_name(&r->job.d));
    else
        fprintf(con, "layout: world %d = %d replicas x hybrid shard degree %d x tensor-parallel degree %d; comm %s\n",
                r->job.world, g->R, g->S, g->T, r->job.world > 1 ? dist_comm_name(&r->job.d) : "none");
    if (r->dp == 1)
        fprintf(con, "batch: %d micro-steps x %d rows x %d tokens = %lld tokens per step; data %lld tokens\n", r->A,
                r->B, r->T, (long long)r->A * r->B * r->T, (long long)data_num_tokens(r->data));
    else
        fprintf(con, "batch: %d micro-steps x %d data-parallel ranks x %d rows x %d tokens = %lld tokens per step; "
                     "data %lld tokens\n", r->A, r->dp, r->B, r->T, (long long)r->A * r->dp * r->B * r->T,
                (long long)data_num_tokens(r->data));
    if (r->val) {
        char when[64] = "after the last step";
        if (o->eval_every) snprintf(when, sizeof when, "every %lld steps and after the last", (long long)o->eval_every);
        fprintf(con, "validation: %lld micro-batches x %d data-parallel rank%s x %d rows x %d tokens = %lld tokens "
                     "of %s, %s\n", (long long)r->eval_k, r->dp, r->dp == 1 ? "" : "s", r->B, r->T,
                (long long)r->eval_k * r->dp * r->B * r->T, o->val_data, when);
    }
    size_t state = fsdp_state_bytes(&r->fs), staging = offload_run_staging_bytes(&r->orun);
    uint64_t whole = (uint64_t)r->model.n_params * 16;
    char st[32], wh[32], tot[32];
    format_size(state, st, sizeof st);
    format_size(whole, wh, sizeof wh);
    if (r->job.world == 1) {
        /* the whole model's estimate, with the state as it is held (less what ballastd keeps) */
        uint64_t need = model_memory_bytes(c, r->B, r->T, o->act_ckpt) - whole + state + staging;
        format_size(need, tot, sizeof tot);
        fprintf(con, "memory: about %s: %s (%zu bytes) of fp32 weights, gradients and AdamW moments", tot, st, state);
    } else {
        fprintf(con, "memory: %s (%zu bytes) of sharded fp32 weights, gradients and AdamW moments per rank "
                     "(the whole model's: %s)", st, state, wh);
    }
    if (r->orun.oo) fprintf(con, ", less what ballastd holds, plus %zu bytes of optimizer staging", staging);
    const char *ck = o->act_ckpt == MODEL_CKPT_SELECTIVE ? "selectively checkpointed"
                     : o->act_ckpt == MODEL_CKPT_FULL    ? "checkpointed" : NULL;
    if (r->job.world == 1) fprintf(con, ", the rest activations%s%s%s", ck ? " (" : "", ck ? ck : "", ck ? ")" : "");
    fprintf(con, "\n");
    char ab[32];
    format_size(r->model.act_bytes, ab, sizeof ab);
    fprintf(con, "activations: %s (%zu bytes) per rank for %d rows x %d tokens%s%s%s\n", ab, r->model.act_bytes, r->B,
            r->T / r->C, r->C > 1 ? " (two chunks of each sequence)" : "", ck ? ", " : "", ck ? ck : "");
    offload_run_describe(&r->orun, &r->fs, con);
    fflush(con);
}

/* --log-json (rank 0), --metrics-port (every rank: P + its local rank),
 * the progress reporter with its settings record, and on a fresh log the
 * layout record. 0 or -1 (logged). */
static int open_reports(run_t *r) {
    const train_opts_t *o = r->o;
    const groups_t *g = &r->job.d.groups;
    int rank = r->job.rank;
    if (o->log_json && rank == 0) {
        r->jlog = !strcmp(o->log_json, "-") ? stdout : fopen(o->log_json, r->start > 0 ? "a" : "w");
        if (!r->jlog) { log_error("--log-json %s: cannot open for writing: %s", o->log_json, strerror(errno)); return -1; }
    }
    if (o->tensorboard_dir && rank == 0) {
        r->tb = tb_open(o->tensorboard_dir, r->err, sizeof r->err);
        if (!r->tb) { log_error("%s", r->err); return -1; }
        log_info("TensorBoard events: %s", tb_path(r->tb));
    }
    if (o->metrics_port > 0) {
        /* several ranks on one node: P + local rank, so they do not collide */
        int local = r->job.topo.local_rank, port = (int)o->metrics_port + local;
        if (port > 65535) {
            log_error("%s--metrics-port %lld + local rank %d = %d is past 65535; pick a lower port", r->who,
                      (long long)o->metrics_port, local, port);
            return -1;
        }
        r->msrv = metrics_server_start(metrics_default(), o->metrics_bind, port, r->err, sizeof r->err);
        if (!r->msrv) {
            if (r->job.world > 1)
                log_error("%s%s (--metrics-port %lld + local rank %d)", r->who, r->err, (long long)o->metrics_port, local);
            else
                log_error("%s", r->err);
            return -1;
        }
        log_info("%smetrics: http://%s:%d/metrics", r->who, o->metrics_bind, metrics_server_port(r->msrv));
    }
    progress_cfg_t pcfg = { .total_steps = o->steps, .start_step = r->start,
                            .tokens_per_step = (int64_t)r->A * r->dp * r->B * r->T,
                            .flops_per_token = llama_flops_per_token(&r->cfg, r->T), .n_gpus = r->job.world,
                            .device = be_device_name(r->job.be), .peak_tflops = o->peak_tflops,
                            .log_every = o->log_every, .console = rank == 0 ? r->con : NULL, .live = -1,
                            .json = r->jlog, .tb = r->tb, .rank = rank, .metrics = metrics_default() };
    size_t nopt;
    const opt_t *opts = train_option_table(&nopt);
    r->prog = progress_new(&pcfg, r->err, sizeof r->err);
    if (!r->prog || progress_write_settings(r->prog, opts, nopt, r->cfg.name, llama_total_params(&r->cfg),
                                            rank == 0 ? progress_entropy_floor(o->data) : NAN, r->err, sizeof r->err)) {
        log_error("%s%s", r->who, r->err);
        return -1;
    }
    /* after the settings record of a fresh log: the layout and the per-rank state (tests read it) */
    if (r->jlog && r->start == 0) {
        fprintf(r->jlog, "{\"kind\": \"layout\", \"world\": %d, \"replicas\": %d, \"shard_degree\": %d, "
                         "\"tensor_parallel_degree\": %d, \"context_parallel_degree\": %d, \"state_bytes_per_rank\": %zu, "
                         "\"model_state_bytes\": %llu, \"offload_staging_bytes\": %zu, \"activation_bytes_per_rank\": %zu}\n",
                r->job.world, g->R, g->S, g->T, g->C, fsdp_state_bytes(&r->fs), (unsigned long long)r->model.n_params * 16,
                offload_run_staging_bytes(&r->orun), r->model.act_bytes);
        fflush(r->jlog);
    }
    return 0;
}

/* ---- steps ---- */

/* The model's micro-batch from the host one (B rows of T tokens): the
 * rows themselves, or with context parallelism this rank's chunks i and
 * 2C-1-i of each row (T / 2C tokens each), in that order. */
static void local_batch(run_t *r, const int32_t **in, const int32_t **tg) {
    *in = r->inputs, *tg = r->targets;
    if (r->C == 1) return;
    int Tc = r->T / (2 * r->C), Tl = 2 * Tc;
    for (int b = 0; b < r->B; b++)
        for (int j = 0; j < 2; j++) {
            size_t from = (size_t)b * r->T + (size_t)model_cp_chunk(r->C, r->cp_rank, j) * Tc,
                   to = (size_t)b * Tl + (size_t)j * Tc;
            memcpy(r->cp_in + to, r->inputs + from, (size_t)Tc * sizeof(int32_t));
            memcpy(r->cp_tg + to, r->targets + from, (size_t)Tc * sizeof(int32_t));
        }
    *in = r->cp_in, *tg = r->cp_tg;
}

/* --dump-grads after step 1's backward: the first micro-batch's logits,
 * the step's loss and the full gradient before clipping. */
static int dump_grads(run_t *r, double loss) {
    float *g = malloc(r->model.n_params * sizeof(float));
    CHECK_ALLOC(g);
    int rc = fsdp_gather_grads(&r->fs, g, r->err, sizeof r->err);
    if (!rc) rc = train_dump_grads(r->o->dump_grads, &r->model, r->logits_host, loss, g, r->err, sizeof r->err);
    free(g);
    return rc;
}

/* Checkpoint of step s: every rank writes its part (the moments back from
 * ballastd first where optimizer offload keeps them). 0 or -1 (logged). */
static int save(run_t *r, int64_t s) {
    const train_opts_t *o = r->o;
    ckpt_meta_t meta = { .step = s, .cfg = r->cfg, .ocfg = r->ocfg, .data_order = o->data_order,
                         .data_seed = (uint64_t)o->data_seed, .init_seed = (uint64_t)o->init_seed,
                         .B = r->B, .T = r->T, .accum = r->A, .dp = r->dp };
    snprintf(meta.data, sizeof meta.data, "%s", o->data);
    if (o->tokenizer) {
        char *abs = realpath(o->tokenizer, NULL);
        snprintf(meta.tokenizer, sizeof meta.tokenizer, "%s", abs ? abs : o->tokenizer);
        free(abs);
    }
    int rc = offload_run_before_ckpt(&r->orun, r->err, sizeof r->err);
    if (!rc) rc = ckpt_save(&r->fs, o->ckpt_dir, &meta, r->job.rank, r->job.world, r->err, sizeof r->err);
    offload_run_after_ckpt(&r->orun);
    if (rc) {
        log_error("%scheckpoint of step %lld: %s", r->who, (long long)s, r->err);
        return -1;
    }
    progress_clear_line(r->prog);
    int nf = r->fs.S * r->fs.T;
    if (r->job.rank == 0)
        log_info("saved checkpoint %s/step-%08lld (%d shard file%s)", o->ckpt_dir, (long long)s, nf, nf == 1 ? "" : "s");
    /* rank 0 renamed it complete before ckpt_save returned; older ones may go */
    int removed = 0;
    if (r->job.rank == 0 && o->ckpt_keep > 0 &&
        ckpt_prune(o->ckpt_dir, (int)o->ckpt_keep, &removed, r->err, sizeof r->err))
        log_warn("--ckpt-keep: %s", r->err);
    if (removed) log_info("--ckpt-keep %lld: removed %d older checkpoint%s", (long long)o->ckpt_keep, removed,
                          removed == 1 ? "" : "s");
    return 0;
}

/* The validation loss of the current weights: eval_k micro-batches of the
 * validation data in sequential order from its start (the same windows at
 * every evaluation; data-parallel rank r reads its disjoint rows as in
 * training), forward only, the token mean over the job. 0 or -1 (logged). */
static int evaluate(run_t *r, double *val_loss) {
    fsdp_t *fs = &r->fs;
    double sum = 0, total;
    if (fsdp_begin_step(fs, r->err, sizeof r->err)) goto fail;
    for (int64_t j = 0; j < r->eval_k; j++) {
        if (data_batch(r->val, DATA_SEQUENTIAL, 0, j, 0, 1, r->dp_rank, r->dp, r->B, r->T, r->inputs, r->targets,
                       r->err, sizeof r->err)) {
            progress_clear_line(r->prog);
            log_error("--val-data: %s", r->err);
            return -1;
        }
        double ls;
        const int32_t *in, *tg;
        local_batch(r, &in, &tg);
        if (fsdp_forward_loss(fs, in, tg, &ls, r->err, sizeof r->err)) goto fail;
        sum += ls;
    }
    if (fsdp_sum_all(fs, sum, &total, r->err, sizeof r->err)) goto fail;
    *val_loss = total / ((double)r->eval_k * r->dp * r->B * r->T);
    return 0;
fail:
    progress_clear_line(r->prog);
    log_error("%sevaluation: %s", r->who, r->err);
    return -1;
}

/* Step s: A micro-steps, the gradient summed over the job, the loss and
 * its check, the update. *stop gets the number of ranks that saw a
 * signal. 0 or -1 (logged). */
static int step(run_t *r, int64_t s, double *stop) {
    const train_opts_t *o = r->o;
    fsdp_t *fs = &r->fs;
    const char *who = r->who;
    size_t N = (size_t)r->B * r->T;
    double global_tokens = (double)r->A * r->dp * r->B * r->T;
    float scale = (float)(1.0 / global_tokens);
    double ts = clock_now_s(), data_s = 0, loss_sum = 0;
    progress_totals_t tot0;
    progress_totals(r->prog, &tot0);
    int64_t k = s - 1;
    bool first = s == r->start + 1;
    if (fsdp_begin_step(fs, r->err, sizeof r->err)) { log_error("%s%s", who, r->err); return -1; }
    for (int a = 0; a < r->A; a++) {
        double td = clock_now_s();
        int bad = data_batch(r->data, (data_order_t)o->data_order, (uint64_t)o->data_seed, k, a, r->A, r->dp_rank,
                             r->dp, r->B, r->T, r->inputs, r->targets, r->err, sizeof r->err);
        data_s += clock_now_s() - td;
        if (bad) {
            progress_clear_line(r->prog);
            log_error("%s", r->err);
            return -1;
        }
        if (o->dump_batches && train_dump_batch(o->dump_batches, r->job.rank, r->inputs, N, r->err, sizeof r->err)) {
            log_error("%s", r->err);
            return -1;
        }
        if (r->logits_host && first && a == 0) fs->logits_host = r->logits_host;
        double ls;
        const int32_t *in, *tg;
        local_batch(r, &in, &tg);
        if (fsdp_micro_step(fs, in, tg, scale, &ls, r->err, sizeof r->err)) {
            log_error("%s%s", who, r->err);
            return -1;
        }
        loss_sum += ls;
    }
    double total, norm;
    if (fsdp_end_step(fs, r->err, sizeof r->err) || fsdp_sum_all(fs, loss_sum, &total, r->err, sizeof r->err) ||
        fsdp_grad_norm(fs, &norm, r->err, sizeof r->err) || fsdp_sum_all(fs, g_stop ? 1 : 0, stop, r->err, sizeof r->err)) {
        log_error("%s%s", who, r->err);
        return -1;
    }
    double loss = total / global_tokens;
    /* every rank saw the same summed loss, so all take the same decision */
    char lmsg[512];
    progress_loss_action_t act = progress_check_loss(r->prog, s, loss, o->skip_nonfinite, lmsg, sizeof lmsg);
    if (act != PROGRESS_LOSS_OK) {
        progress_clear_line(r->prog);
        if (act == PROGRESS_LOSS_STOP) {
            if (r->job.rank == 0) log_error("%s", lmsg);
            else log_error("rank %d: stopping at step %lld with the others: the loss is not finite (rank 0 says why)",
                           r->job.rank, (long long)s);
            return -1;
        }
        if (r->job.rank == 0) log_warn("%s", lmsg);
    }
    if (r->logits_host && first && dump_grads(r, loss)) { log_error("%s", r->err); return -1; }
    float coef = optim_clip_coef(norm, o->grad_clip);
    double lr = optim_lr(&r->ocfg, k);
    if (act == PROGRESS_LOSS_OK) {
        if (offload_run_optim_step(&r->orun, fs, s, lr, coef, r->err, sizeof r->err)) {
            log_error("%s%s", who, r->err);
            return -1;
        }
    } else {
        fs->opt.step++; /* skipped: keep the update count equal to the step, as a resume sets it */
    }
    double step_s = clock_now_s() - ts;
    if (r->val && ((o->eval_every && s % o->eval_every == 0) || s == o->steps)) {
        double vl;
        if (evaluate(r, &vl)) return -1;
        progress_set_val_loss(r->prog, vl);
    }
    if (progress_end_step(r->prog, s, &tot0, loss, lr, norm, step_s, data_s, act != PROGRESS_LOSS_OK,
                          r->err, sizeof r->err)) {
        log_error("%s%s", who, r->err);
        return -1;
    }
    return 0;
}

/* After the last step: the offload summary, --dump-params. */
static int finish(run_t *r) {
    const train_opts_t *o = r->o;
    if (r->orun.on && offload_run_summary(&r->orun, &r->fs, r->job.rank, r->con, r->err, sizeof r->err)) {
        log_error("%s%s", r->who, r->err);
        return -1;
    }
    if (!o->dump_params) return 0;
    float *full = malloc(r->model.n_params * sizeof(float));
    CHECK_ALLOC(full);
    /* the master back from ballastd where optimizer offload keeps it there */
    int rc = offload_run_before_ckpt(&r->orun, r->err, sizeof r->err);
    if (!rc) rc = fsdp_gather_params(&r->fs, full, r->err, sizeof r->err);
    offload_run_after_ckpt(&r->orun);
    if (rc) log_error("%s%s", r->who, r->err);
    else if (r->job.rank == 0 && (rc = train_dump_params(o->dump_params, &r->model, full, r->err, sizeof r->err)))
        log_error("%s", r->err);
    free(full);
    return rc ? -1 : 0;
}

/* ---- the run ---- */

/* Everything up to the first step; 0 or -1 (logged). */
static int setup(run_t *r) {
    const train_opts_t *o = r->o;
    if (o->precision == 1 && o->backend != 1) {
        log_error("--precision fp8 runs the matmuls on FP8 tensor cores: it needs --backend cuda (the CPU backend is fp32)");
        return -1;
    }
    if (train_job_open(&r->job, o, r->err, sizeof r->err)) {
        log_error("%s%s", r->job.who, r->err);
        return -1;
    }
    r->who = r->job.who;
    if (o->tp_degree > 1 && r->job.world == 1) {
        log_error("--tensor-parallel-degree %lld needs %lld or more processes (e.g. ballast train --nproc %lld); "
                  "one process trains with --tensor-parallel-degree 1", (long long)o->tp_degree,
                  (long long)o->tp_degree, (long long)o->tp_degree);
        return -1;
    }
    if (o->cp_degree > 1 && r->job.world == 1) {
        log_error("--context-parallel-degree %lld needs %lld or more processes (e.g. ballast train --nproc %lld); "
                  "one process trains with --context-parallel-degree 1", (long long)o->cp_degree,
                  (long long)o->cp_degree, (long long)o->cp_degree);
        return -1;
    }
    if (o->cp_degree > 1 && o->seq_len % (2 * o->cp_degree)) {
        log_error("--context-parallel-degree %lld cuts each sequence in %lld chunks: --seq-len %lld is not divisible "
                  "by %lld; choose a seq-len that is", (long long)o->cp_degree, (long long)(2 * o->cp_degree),
                  (long long)o->seq_len, (long long)(2 * o->cp_degree));
        return -1;
    }
    if (check_flags(r)) return -1;
    if (r->job.world > 1) log_set_rank(r->job.rank);
    if (train_resolve_config(o, &r->cfg, r->err, sizeof r->err)) { log_error("%s", r->err); return -1; }
    if (!o->data) {
        log_error("--data is required: a token shard file or glob (make one with `ballast data synth --out FILE ...`)");
        return -1;
    }
    /* before the memory it would take and before the rendezvous */
    if (o->seq_len > r->cfg.max_seq) {
        log_error("--seq-len %lld exceeds the model's max_position_embeddings %d (model %s): give --seq-len %d or "
                  "less, or a model config with more positions", (long long)o->seq_len, r->cfg.max_seq, r->cfg.name,
                  r->cfg.max_seq);
        return -1;
    }
    if (o->log_json && strcmp(o->log_json, "-") && r->job.rank == 0) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s", o->log_json);
        char *sl = strrchr(dir, '/');
        if (!sl) snprintf(dir, sizeof dir, ".");
        else if (sl == dir) dir[1] = 0;
        else *sl = 0;
        if (access(dir, W_OK | X_OK)) {
            log_error("--log-json %s: cannot write in %s: %s; create the directory first or give another path",
                      o->log_json, dir, strerror(errno));
            return -1;
        }
    }
    /* join the job: groups, and with several processes rendezvous and communicators */
    if (train_job_join(&r->job, o, r->err, sizeof r->err)) { log_error("%s%s", r->who, r->err); return -1; }
    const groups_t *g = &r->job.d.groups;
    r->C = g->C;
    r->cp_rank = g->cp;
    r->dp = r->job.world / (g->T * g->C);
    r->dp_rank = g->replica * g->S + g->shard;
    r->B = (int)o->micro_batch;
    r->T = (int)o->seq_len;
    if (open_data(r) || check_memory(r) || build(r)) return -1;
    if (check_ckpt_dir(r)) return -1;
    if (o->resume && resume(r)) return -1;
    if (r->start == 0 && o->init_from && r->job.rank == 0) log_info("loaded weights from %s", o->init_from);
    /* offload: the ballastd session; --resume-from-service sets start */
    offload_opts_t oopt = offload_opts(o);
    if (offload_run_open(&r->orun, &oopt, &r->fs, r->job.rank, r->job.world, &r->start, r->err, sizeof r->err)) {
        log_error("%s%s", r->who, r->err);
        return -1;
    }
    if (o->resume_from_service && r->job.rank == 0)
        log_info("resumed from ballastd (job %s) after step %lld", o->offload_job, (long long)r->start);
    r->con = o->log_json && !strcmp(o->log_json, "-") ? stderr : stdout;
    if (r->job.rank == 0) announce(r);
    if (r->job.world > 1 && g->C > 1)
        log_info("rank %d: replica %d, shard %d of %d, context-parallel rank %d of %d (chunks %d and %d of %d); "
                 "data-parallel rank %d of %d", r->job.rank, g->replica, g->shard, g->S, g->cp, g->C,
                 model_cp_chunk(g->C, g->cp, 0), model_cp_chunk(g->C, g->cp, 1), 2 * g->C, r->dp_rank, r->dp);
    else if (r->job.world > 1)
        log_info("rank %d: replica %d, shard %d of %d; data-parallel rank %d of %d", r->job.rank, g->replica, g->shard,
                 g->S, r->dp_rank, r->dp);
    if (open_reports(r)) return -1;
    size_t N = (size_t)r->B * r->T;
    r->inputs = malloc(N * sizeof(int32_t));
    r->targets = malloc(N * sizeof(int32_t));
    CHECK_ALLOC(r->inputs);
    CHECK_ALLOC(r->targets);
    if (r->C > 1) {
        r->cp_in = malloc(N / (size_t)r->C * sizeof(int32_t));
        r->cp_tg = malloc(N / (size_t)r->C * sizeof(int32_t));
        CHECK_ALLOC(r->cp_in);
        CHECK_ALLOC(r->cp_tg);
    }
    if (o->dump_grads) {
        r->logits_host = malloc(N * (size_t)r->cfg.vocab * sizeof(float));
        CHECK_ALLOC(r->logits_host);
    }
    return 0;
}

int train_run(const train_opts_t *o) {
    static run_t run; /* large (messages); one run per process */
    run_t *r = &run;
    memset(r, 0, sizeof *r);
    r->o = o;
    r->who = "";
    int status = 1;
    if (setup(r)) goto out;
    if (r->start >= o->steps && (o->resume || o->resume_from_service)) {
        if (r->job.rank == 0)
            log_error("nothing to train: the run is at step %lld and --steps is %lld; give a larger --steps to "
                      "continue it", (long long)r->start, (long long)o->steps);
        goto out;
    }
    g_prog = train_program();
    g_speak = r->job.rank == 0;
    g_acked = getenv("BALLAST_LAUNCHER_ACKS") != NULL;
    if (o->ckpt_dir)
        snprintf(g_ack, sizeof g_ack, "%s: signal received: stopping after the step in progress and saving a checkpoint "
                 "in %s; a second Ctrl-C aborts at once\n", g_prog, o->ckpt_dir);
    else
        snprintf(g_ack, sizeof g_ack, "%s: signal received: stopping after the step in progress (no --ckpt-dir: "
                 "nothing is saved); a second Ctrl-C aborts at once\n", g_prog);
    g_saved = r->start > 0 && o->resume ? (sig_atomic_t)r->start : -1;
    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int64_t last_saved = r->start;
    for (int64_t s = r->start + 1; s <= o->steps; s++) {
        double stop;
        g_step = (sig_atomic_t)s;
        if (step(r, s, &stop)) goto out;
        /* every rank saw the same sum, so all save and stop after the same step */
        if (o->ckpt_dir && ((o->ckpt_every && s % o->ckpt_every == 0) || s == o->steps || stop > 0)) {
            if (save(r, s)) goto out;
            last_saved = s;
            g_saved = (sig_atomic_t)s;
        }
        if (stop > 0) {
            progress_clear_line(r->prog);
            if (r->job.rank == 0)
                log_warn("stopping after step %lld on a signal%s", (long long)s,
                         last_saved == s ? " (checkpoint saved)" : "");
            status = 130;
            goto leave;
        }
    }
    if (finish(r)) goto out;
    status = 0;
leave:
    /* a clean exit meets every rank at the last barrier */
    offload_run_close(&r->orun, &r->fs);
    if (r->have_fs) fsdp_destroy(&r->fs);
    r->have_fs = false;
    if (train_job_leave(&r->job, r->err, sizeof r->err)) {
        log_error("%s", r->err);
        status = 1;
    }
    goto done;
out:
    /* on failure leave without the last barrier: peers see this process exit */
    offload_run_close(&r->orun, &r->fs);
    if (r->have_fs) fsdp_destroy(&r->fs);
    train_job_abort(&r->job);
done:
    progress_free(r->prog);
    metrics_server_stop(r->msrv);
    if (r->jlog && r->jlog != stdout) fclose(r->jlog);
    tb_close(r->tb);
    free(r->inputs);
    free(r->targets);
    free(r->cp_in);
    free(r->cp_tg);
    free(r->logits_host);
    if (r->have_model) model_destroy(&r->model);
    if (r->data) data_close(r->data);
    if (r->val) data_close(r->val);
    return status;
}
