/* train.c: options and the training loop of ballast-worker; see train.h.
 *
 * One step = grad_accum micro-steps of B x T tokens; the loss is the mean
 * token cross-entropy over the step's A*B*T tokens, and the logged loss of
 * step s is that of step s's batch before its update. Relies on model.h,
 * optim.h, ckpt.h, data.h and the CPU backend. */
#include "workers/train/train.h"
#include "clock.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "errbuf.h"
#include "log.h"
#include "metrics.h"
#include "topology.h"
#include "options.h"
#include "workers/backend/backend.h"
#include "workers/ckpt/ckpt.h"
#include "workers/data/data.h"
#include "workers/model/model.h"
#include "workers/model/optim.h"
#include "workers/train/progress.h"
#include "workers/ckpt/safetensors.h"


/* ---- options ---- */

static train_opts_t g_opts;

static const opt_t train_options[] = {
    { "model", OPT_STRING, NULL, 0, 0, NULL, "preset (tiny, small, demo, llama2-7b, ...), config.json or model directory; default: --init-from's config", &g_opts.model },
    { "init-from", OPT_STRING, NULL, 0, 0, NULL, "Hugging Face Llama directory to load the initial weights from", &g_opts.init_from },
    { "init-seed", OPT_INT, "1", 0, 9.2e18, NULL, "seed of the random initialisation (without --init-from)", &g_opts.init_seed },
    { "data", OPT_STRING, NULL, 0, 0, NULL, "token shard file or glob (llm.c format; ballast data synth makes one)", &g_opts.data },
    { "data-order", OPT_ENUM, "shuffled", 0, 0, "sequential|shuffled", "order of the training windows", &g_opts.data_order },
    { "data-seed", OPT_INT, "1", 0, 9.2e18, NULL, "seed of the shuffled order", &g_opts.data_seed },
    { "micro-batch", OPT_INT, "4", 1, 1 << 20, NULL, "B: rows per micro-step", &g_opts.micro_batch },
    { "seq-len", OPT_INT, "128", 1, 1 << 24, NULL, "T: tokens per row", &g_opts.seq_len },
    { "grad-accum", OPT_INT, "1", 1, 1 << 20, NULL, "A: micro-steps per optimizer step", &g_opts.grad_accum },
    { "global-batch-tokens", OPT_INT, "0", 0, 9.2e18, NULL, "tokens per step; when set, A = this / (B*T) and must divide", &g_opts.global_batch_tokens },
    { "steps", OPT_INT, "100", 0, 9.2e18, NULL, "optimizer steps of the whole run", &g_opts.steps },
    { "lr", OPT_DOUBLE, "3e-4", 0, 10, NULL, "peak learning rate", &g_opts.lr },
    { "min-lr", OPT_DOUBLE, "0", 0, 10, NULL, "final learning rate of the cosine schedule", &g_opts.min_lr },
    { "lr-schedule", OPT_ENUM, "cosine", 0, 0, "constant|cosine", "learning-rate schedule after warmup", &g_opts.lr_schedule },
    { "warmup-steps", OPT_INT, "0", 0, 9.2e18, NULL, "linear warmup steps", &g_opts.warmup_steps },
    { "beta1", OPT_DOUBLE, "0.9", 0, 0.999999, NULL, "AdamW first-moment decay", &g_opts.beta1 },
    { "beta2", OPT_DOUBLE, "0.95", 0, 0.999999999, NULL, "AdamW second-moment decay", &g_opts.beta2 },
    { "adam-eps", OPT_DOUBLE, "1e-8", 0, 1, NULL, "AdamW epsilon", &g_opts.adam_eps },
    { "weight-decay", OPT_DOUBLE, "0.1", 0, 10, NULL, "decoupled weight decay on 2-D weights", &g_opts.weight_decay },
    { "grad-clip", OPT_DOUBLE, "1.0", 0, 1e30, NULL, "max global gradient L2 norm; 0 turns clipping off", &g_opts.grad_clip },
    { "ckpt-dir", OPT_STRING, NULL, 0, 0, NULL, "directory for step-NNNNNNNN checkpoints", &g_opts.ckpt_dir },
    { "ckpt-every", OPT_INT, "0", 0, 9.2e18, NULL, "steps between checkpoints (0: only at the end); needs --ckpt-dir", &g_opts.ckpt_every },
    { "resume", OPT_BOOL, "false", 0, 0, NULL, "continue from the newest checkpoint in --ckpt-dir", &g_opts.resume },
    { "log-json", OPT_STRING, NULL, 0, 0, NULL, "write one JSON object per step to FILE (- for stdout)", &g_opts.log_json },
    { "log-every", OPT_INT, "1", 1, 9.2e18, NULL, "print a progress line every N steps", &g_opts.log_every },
    { "activation-checkpointing", OPT_BOOL, "false", 0, 0, NULL, "keep only block inputs; recompute blocks in backward", &g_opts.act_ckpt },
    { "threads", OPT_INT, "0", 0, 4096, NULL, "compute threads (0: all cores)", &g_opts.threads },
    { "backend", OPT_ENUM, "cpu", 0, 0, "cpu|cuda", "compute backend: cpu (fp32) or cuda (bf16 on GPU --device)", &g_opts.backend },
    { "device", OPT_INT, "0", 0, 1024, NULL, "GPU index for --backend cuda", &g_opts.device },
    { "attention", OPT_ENUM, "auto", 0, 0, "auto|tc|simt", "attention kernels on --backend cuda: auto (tensor cores), tc (tensor cores) or simt", &g_opts.attention },
    { "cuda-sync", OPT_BOOL, "false", 0, 0, NULL, "--backend cuda: wait for every kernel and check it, so an error names the kernel that failed (slow; for debugging)", &g_opts.cuda_sync },
    { "precision", OPT_ENUM, "bf16", 0, 0, "bf16|fp8", "GEMM precision on --backend cuda: bf16, or fp8 (compute capability 8.9+: E4M3/E5M2, delayed scaling)", &g_opts.precision },
    { "grad-reduce-dtype", OPT_ENUM, "fp32", 0, 0, "fp32|bf16", "gradient reductions across ranks in fp32, or bf16 (half the traffic; each partial sum rounded to bf16)", &g_opts.grad_reduce_dtype },
    { "metrics-port", OPT_INT, "0", 0, 65535, NULL, "serve Prometheus /metrics on this port + the local rank (0: off)", &g_opts.metrics_port },
    { "metrics-bind", OPT_STRING, "0.0.0.0", 0, 0, NULL, "address the /metrics endpoint binds (127.0.0.1: this machine only)", &g_opts.metrics_bind },
    { "skip-nonfinite", OPT_BOOL, "false", 0, 0, NULL, "skip the update of a step whose loss is NaN/inf instead of stopping (at most 9 in a row)", &g_opts.skip_nonfinite },
    { "peak-tflops", OPT_DOUBLE, "0", 0, 1e6, NULL, "per-device peak TFLOP/s for MFU (0: the device table; the CPU has none)", &g_opts.peak_tflops },
    { "dump-grads", OPT_STRING, NULL, 0, 0, NULL, "test hook: write step 1's logits, loss and gradients (before clipping) as safetensors", &g_opts.dump_grads },
    { "dump-params", OPT_STRING, NULL, 0, 0, NULL, "test hook: write the fp32 master parameters after the last step as safetensors (HF names)", &g_opts.dump_params },
    { "dump-batches", OPT_STRING, NULL, 0, 0, NULL, "test hook: append each micro-batch's input tokens (int32) to DIR/tokens-rank-NNNNN.bin", &g_opts.dump_batches },
    { "hybrid-shard-degree", OPT_INT, "0", 0, 65536, NULL, "S: ranks sharing one copy of the model state (0: the largest that fits; world / T on the CPU)", &g_opts.shard_degree },
    { "tensor-parallel-degree", OPT_INT, "1", 1, 65536, NULL, "T: tensor-parallel ranks (Megatron-style splits with sequence parallelism; must divide the world, heads, kv heads, MLP width and micro-batch tokens)", &g_opts.tp_degree },
    { "comm", OPT_ENUM, "auto", 0, 0, "auto|shm|nccl", "collectives backend: shm between CPU processes of one node, nccl between GPUs", &g_opts.comm },
    { "rdzv-timeout", OPT_DURATION, "300s", 0.001, 1e9, NULL, "how long every rank has to join the job (a missing rank is named)", &g_opts.rdzv_timeout },
    { "rank", OPT_INT, "-1", -1, 1 << 30, NULL, "this process's rank (-1: RANK or the other topology variables)", &g_opts.rank },
    { "world-size", OPT_INT, "-1", -1, 1 << 30, NULL, "processes in the job (-1: WORLD_SIZE or the other topology variables)", &g_opts.world_size },
    { "master-addr", OPT_STRING, NULL, 0, 0, NULL, "host of rank 0's rendezvous store (default MASTER_ADDR, else 127.0.0.1)", &g_opts.master_addr },
    { "master-port", OPT_INT, "-1", -1, 65535, NULL, "port of rank 0's rendezvous store (-1: MASTER_PORT, else 29500)", &g_opts.master_port },
    { "activation-offload", OPT_BOOL, "false", 0, 0, NULL, "send each kept block input to ballastd as it is produced; fetch it back for backward", &g_opts.act_offload },
    { "activation-loading-horizon", OPT_INT, "2", 0, 1 << 20, NULL, "with --activation-offload: fetch block inputs this many blocks before backward needs them", &g_opts.act_horizon },
    { "optimizer-offload", OPT_ENUM, "none", 0, 0, "none|host|nvme", "keep AdamW moments (and a master copy) in ballastd: host = pinned in its pool, nvme = may spill", &g_opts.opt_offload },
    { "optimizer-offload-durable", OPT_ENUM, "auto", 0, 0, "auto|yes|no", "optimizer state in ballastd durable for --resume-from-service (persistent blobs written to NVMe behind the steps, a step record per step) or memory only, freed as replaced; auto = yes for nvme, no for host", &g_opts.opt_durable },
    { "offload-socket", OPT_STRING, "unix:/run/ballast/ballastd.sock", 0, 0, NULL, "ballastd's Unix socket (shared-memory mode)", &g_opts.offload_socket },
    { "offload-remote", OPT_STRING, NULL, 0, 0, NULL, "HOST:PORT of a ballastd serving TCP (remote mode: bytes travel in gRPC messages)", &g_opts.offload_remote },
    { "offload-job", OPT_STRING, "ballast-train", 0, 0, NULL, "job name of this run's blobs in ballastd (1..63 of [A-Za-z0-9._-]; the same name to resume)", &g_opts.offload_job },
    { "offload-token-file", OPT_STRING, NULL, 0, 0, NULL, "file with the token ballastd asks for (its --token-file); unset: none", &g_opts.offload_token_file },
    { "resume-from-service", OPT_BOOL, "false", 0, 0, NULL, "continue from the last finished step whose state ballastd holds (needs --optimizer-offload with durable state: nvme, or --optimizer-offload-durable yes)", &g_opts.resume_from_service },
};
#define N_OPTS (sizeof train_options / sizeof train_options[0])

int train_parse(int argc, char **argv, train_opts_t *o) {
    char err[OPT_ERR_LEN];
    const char *pos[1];
    int npos = 0;
    int rc = opt_parse(train_options, N_OPTS, argc, argv, pos, 0, &npos,
                       "usage: ballast-worker --data SHARDS [--model M | --init-from DIR] [options]", err, sizeof err);
    if (rc < 0) { fprintf(stderr, "ballast-worker: %s\n", err); return -1; }
    *o = g_opts;
    return rc;
}

void train_print_settings(FILE *out) { opt_print_table(train_options, N_OPTS, out); }

const opt_t *train_option_table(size_t *n) {
    *n = N_OPTS;
    return train_options;
}

/* ---- run ---- */

static int train_run_single(const train_opts_t *o);

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

/* Resolve --model / --init-from into one config. */
int train_resolve_config(const train_opts_t *o, llama_config_t *cfg, char *err, size_t errlen) {
    if (!o->model && !o->init_from) {
        snprintf(err, errlen, "no model: give --model (a preset: %s, or a config.json) or --init-from DIR", llama_preset_names());
        return -1;
    }
    if (o->model && llama_config_resolve(o->model, cfg, err, errlen)) return -1;
    if (o->init_from) {
        llama_config_t hf;
        if (llama_config_resolve(o->init_from, &hf, err, errlen)) return -1;
        if (o->model && (hf.dim != cfg->dim || hf.n_layers != cfg->n_layers || hf.n_heads != cfg->n_heads ||
                         hf.n_kv_heads != cfg->n_kv_heads || hf.ffn_dim != cfg->ffn_dim || hf.vocab != cfg->vocab)) {
            snprintf(err, errlen, "--model %s and --init-from %s describe different shapes; drop --model to use the directory's config",
                     o->model, o->init_from);
            return -1;
        }
        if (!o->model) *cfg = hf;
    }
    return llama_config_validate(cfg, err, errlen);
}

/* Test hook: logits of the first micro-batch, the step loss and every
 * parameter gradient, by Hugging Face name. */
static int dump_grads(const char *path, const model_t *m, const float *logits, double loss, char *err, size_t errlen) {
    st_writer_t *w = st_writer_new();
    float *g = malloc(m->n_params * sizeof(float));
    int rc = -1;
    if (!w || !g) { snprintf(err, errlen, "out of memory writing %s", path); goto out; }
    m->be->to_host(g, m->grads, m->n_params * sizeof(float));
    int64_t lshape[2] = { (int64_t)m->B * m->T, m->cfg.vocab }, one = 1;
    float lf = (float)loss;
    if (st_writer_add_f32(w, "logits", ST_F32, lshape, 2, logits) || st_writer_add_f32(w, "loss", ST_F32, &one, 1, &lf))
        goto nomem;
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        if (st_writer_add_f32(w, t->name, ST_F32, t->shape, t->ndim, g + t->offset)) goto nomem;
    }
    rc = st_writer_save(w, path, err, errlen);
    goto out;
nomem:
    snprintf(err, errlen, "out of memory writing %s", path);
out:
    if (w) st_writer_free(w);
    free(g);
    return rc;
}

int train_grad_accum(const train_opts_t *o, int dp, int *A, char *err, size_t errlen) {
    *A = (int)o->grad_accum;
    if (o->global_batch_tokens <= 0) return 0;
    int64_t row = (int64_t)dp * o->micro_batch * o->seq_len;
    if (o->global_batch_tokens % row)
        return errbuf_set(err, errlen, "--global-batch-tokens %lld is not a multiple of data-parallel ranks x micro-batch x "
                          "seq-len = %d x %lld x %lld = %lld", (long long)o->global_batch_tokens, dp,
                          (long long)o->micro_batch, (long long)o->seq_len, (long long)row);
    *A = (int)(o->global_batch_tokens / row);
    if (o->grad_accum != 1 && o->grad_accum != *A)
        return errbuf_set(err, errlen, "--grad-accum %lld conflicts with --global-batch-tokens %lld (which means grad-accum %d); "
                          "give one of them", (long long)o->grad_accum, (long long)o->global_batch_tokens, *A);
    return 0;
}

int train_dump_params(const char *path, const model_t *m, const float *full, char *err, size_t errlen) {
    st_writer_t *w = st_writer_new();
    if (!w) return errbuf_set(err, errlen, "out of memory writing %s", path);
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        if (st_writer_add_f32(w, t->name, ST_F32, t->shape, t->ndim, full + t->offset)) {
            st_writer_free(w);
            return errbuf_set(err, errlen, "out of memory writing %s", path);
        }
    }
    int rc = st_writer_save(w, path, err, errlen);
    st_writer_free(w);
    return rc;
}

/* Where this process sits: flags, then the environment (common/topology.h). */
static int resolve_topology(const train_opts_t *o, topo_t *t, char *err, size_t errlen) {
    topo_flags_t f;
    topo_flags_init(&f);
    if (o->rank >= 0) f.rank = (int)o->rank;
    if (o->world_size >= 0) f.world_size = (int)o->world_size;
    if (o->master_addr) f.master_addr = o->master_addr;
    if (o->master_port >= 0) f.master_port = (int)o->master_port;
    return topo_resolve(&f, t, err, errlen);
}

static train_backend_wrap_fn g_wrap;

void train_set_backend_wrap(train_backend_wrap_fn wrap) { g_wrap = wrap; }

const backend_t *train_open_backend(const train_opts_t *o, int device, char *err, size_t errlen) {
    backend_spec_t spec = { .kind = o->backend == 1 ? BACKEND_CUDA : BACKEND_CPU, .threads = (int)o->threads,
                            .device = device, .fp8 = o->precision == 1, .attention = (be_attention_t)o->attention,
                            .sync = o->cuda_sync };
    const backend_t *be = backend_open(&spec, err, errlen);
    return be && g_wrap ? g_wrap(be, err, errlen) : be;
}

int train_run(const train_opts_t *o) {
    char err[1024];
    if (o->precision == 1 && o->backend != 1) {
        log_error("--precision fp8 runs the matmuls on FP8 tensor cores: it needs --backend cuda (the CPU backend is fp32)");
        return 1;
    }
    topo_t topo;
    if (resolve_topology(o, &topo, err, sizeof err)) { log_error("%s", err); return 1; }
    if (o->tp_degree > 1 && topo.world_size == 1) {
        log_error("--tensor-parallel-degree %lld needs %lld or more processes (e.g. ballast train --nproc %lld); "
                  "one process trains with --tensor-parallel-degree 1", (long long)o->tp_degree,
                  (long long)o->tp_degree, (long long)o->tp_degree);
        return 1;
    }
    if (topo.world_size > 1) {
        char addr[TOPO_ADDR_MAX + 16];
        snprintf(addr, sizeof addr, "%s:%d", topo.master_addr, topo.master_port);
        return train_run_sharded(o, topo.rank, topo.world_size, addr);
    }
    /* offload runs through the sharded loop (S = T = 1), so one code path
     * drives ballastd, on the CPU or a GPU (copies through the backend);
     * its store is private to this process */
    if (o->act_offload || o->opt_offload || o->resume_from_service) {
        char addr[64];
        snprintf(addr, sizeof addr, "unix:/tmp/ballast-rdzv-%d.sock", (int)getpid());
        int rc = train_run_sharded(o, 0, 1, addr);
        unlink(addr + 5);
        return rc;
    }
    return train_run_single(o);
}

/* One process: the whole model, no collectives. */
static int train_run_single(const train_opts_t *o) {
    char err[1024];
    int status = 1;
    data_t *data = NULL;
    model_t model = { 0 };
    optim_t opt = { 0 };
    FILE *jlog = NULL;
    progress_t *prog = NULL;
    metrics_server_t *msrv = NULL;
    int32_t *inputs = NULL, *targets = NULL;
    float *logits_host = NULL;
    bool have_model = false, have_opt = false;

    const backend_t *be = train_open_backend(o, (int)o->device, err, sizeof err);
    if (!be) { log_error("%s", err); return 1; }
    llama_config_t cfg;
    if (train_resolve_config(o, &cfg, err, sizeof err)) { log_error("%s", err); return 1; }
    if (!o->data) {
        log_error("--data is required: a token shard file or glob (make one with `ballast data synth --out FILE ...`)");
        return 1;
    }
    if (o->resume && !o->ckpt_dir) { log_error("--resume needs --ckpt-dir DIR (where the step-NNNNNNNN directories are)"); return 1; }
    if (o->ckpt_every && !o->ckpt_dir) { log_error("--ckpt-every needs --ckpt-dir DIR"); return 1; }
    int B = (int)o->micro_batch, T = (int)o->seq_len, A;
    if (train_grad_accum(o, 1, &A, err, sizeof err)) { log_error("%s", err); return 1; }
    if (data_open(o->data, cfg.vocab, &data, err, sizeof err)) { log_error("%s", err); return 1; }
    if (data_num_tokens(data) < (int64_t)T + 1) {
        log_error("%s: %lld tokens, fewer than seq-len + 1 = %d", o->data, (long long)data_num_tokens(data), T + 1);
        goto out;
    }
    uint64_t need = model_memory_bytes(&cfg, B, T, o->act_ckpt);
    uint64_t have = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGE_SIZE);
    if (o->backend == 0 && have && need > have / 10 * 9) {
        char a[32], b[32];
        format_size(need, a, sizeof a);
        format_size(have, b, sizeof b);
        log_error("model %s with micro-batch %d x %d needs about %s of memory; this machine has %s. "
                  "Use a smaller model, micro-batch or seq-len, or --activation-checkpointing",
                  cfg.name, B, T, a, b);
        goto out;
    }
    if (model_create(&model, &cfg, be, B, T, o->act_ckpt, err, sizeof err)) { log_error("%s", err); goto out; }
    have_model = true;
    optim_config_t ocfg = {
        .lr = o->lr, .min_lr = o->min_lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->adam_eps,
        .weight_decay = o->weight_decay, .grad_clip = o->grad_clip, .warmup_steps = o->warmup_steps,
        .total_steps = o->steps, .schedule = (lr_schedule_t)o->lr_schedule,
    };
    if (optim_create(&opt, &ocfg, be, model.n_params, err, sizeof err)) { log_error("%s", err); goto out; }
    have_opt = true;

    /* starting point: a checkpoint, a Hugging Face directory, or a seed */
    int64_t start = 0;
    char ck[4200];
    int found = 0;
    if (o->resume) {
        found = ckpt_find_latest(o->ckpt_dir, ck, sizeof ck, err, sizeof err);
        if (found < 0) { log_error("%s", err); goto out; }
        if (!found) log_warn("--resume: no checkpoint under %s yet, starting from scratch", o->ckpt_dir);
    }
    if (found) {
        ckpt_meta_t meta;
        if (ckpt_read_meta(ck, &meta, err, sizeof err)) { log_error("%s", err); goto out; }
        /* step k reads samples k*G .. k*G+G-1 (G = grad-accum x data-parallel ranks x micro-batch rows)
         * whatever the split, so a checkpoint of a sharded run continues here when G, seq-len and the
         * order stay; ckpt_load reshards its parts into the full tensors */
        if ((int64_t)meta.accum * meta.dp * meta.B != (int64_t)A * B || meta.T != T || meta.data_order != o->data_order ||
            meta.data_seed != (uint64_t)o->data_seed) {
            log_error("%s: saved with grad-accum %d x %d data-parallel ranks x micro-batch %d = %lld rows per step, "
                      "seq-len %d, data-order %s, data-seed %llu; this run has %d x %d = %d rows, seq-len %d: resume "
                      "with the same seq-len, order and seed, and --grad-accum x --micro-batch = %lld, to continue the "
                      "same data stream",
                      ck, meta.accum, meta.dp, meta.B, (long long)meta.accum * meta.dp * meta.B, meta.T,
                      meta.data_order == DATA_SEQUENTIAL ? "sequential" : "shuffled", (unsigned long long)meta.data_seed,
                      A, B, A * B, T, (long long)meta.accum * meta.dp * meta.B);
            goto out;
        }
        if (ckpt_load(ck, &model, &opt, err, sizeof err)) { log_error("%s", err); goto out; }
        start = opt.step;
        log_info("resumed from %s (step %lld)", ck, (long long)start);
    } else if (o->init_from) {
        if (ckpt_load_hf(o->init_from, &model, err, sizeof err)) { log_error("%s", err); goto out; }
        log_info("loaded weights from %s", o->init_from);
    } else {
        model_init_random(&model, (uint64_t)o->init_seed);
    }

    FILE *con = o->log_json && !strcmp(o->log_json, "-") ? stderr : stdout;
    train_print_settings(con);
    fprintf(con, "model: %s, %lld parameters (dim %d, %d layers, %d heads / %d kv, ffn %d, vocab %d%s)\n",
            cfg.name, (long long)llama_total_params(&cfg), cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
            cfg.ffn_dim, cfg.vocab, cfg.tie_embeddings ? ", tied" : "");
    fprintf(con, "batch: %d micro-steps x %d rows x %d tokens = %lld tokens per step; data %lld tokens\n", A, B, T,
            (long long)A * B * T, (long long)data_num_tokens(data));
    {
        char tot[32], st[32];
        format_size(need, tot, sizeof tot);
        format_size((uint64_t)model.n_params * 16, st, sizeof st);
        fprintf(con, "memory: about %s: %s of fp32 weights, gradients and AdamW moments, the rest activations%s\n", tot, st,
                o->act_ckpt ? " (checkpointed)" : "");
    }
    fflush(con);
    if (o->log_json) {
        jlog = !strcmp(o->log_json, "-") ? stdout : fopen(o->log_json, start > 0 ? "a" : "w");
        if (!jlog) { log_error("--log-json %s: cannot open for writing", o->log_json); goto out; }
    }
    if (o->metrics_port > 0) {
        msrv = metrics_server_start(metrics_default(), o->metrics_bind, (int)o->metrics_port, err, sizeof err);
        if (!msrv) { log_error("%s", err); goto out; }
        log_info("metrics: http://%s:%d/metrics", o->metrics_bind, metrics_server_port(msrv));
    }
    progress_cfg_t pcfg = { .total_steps = o->steps, .start_step = start, .tokens_per_step = (int64_t)A * B * T,
                            .flops_per_token = llama_flops_per_token(&cfg, T), .n_gpus = 1,
                            .device = be_device_name(be),
                            .peak_tflops = o->peak_tflops, .log_every = o->log_every, .console = con, .live = -1,
                            .json = jlog, .rank = 0, .metrics = metrics_default() };
    prog = progress_new(&pcfg, err, sizeof err);
    if (!prog || progress_write_settings(prog, train_options, N_OPTS, cfg.name, llama_total_params(&cfg),
                                         progress_entropy_floor(o->data), err, sizeof err)) {
        log_error("%s", err);
        goto out;
    }

    size_t N = (size_t)B * T;
    inputs = malloc(N * sizeof(int32_t));
    targets = malloc(N * sizeof(int32_t));
    CHECK_ALLOC(inputs);
    CHECK_ALLOC(targets);
    if (o->dump_grads) { logits_host = malloc(N * cfg.vocab * sizeof(float)); CHECK_ALLOC(logits_host); }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    double inv_tokens = 1.0 / ((double)A * B * T);
    int64_t last_saved = start;
    for (int64_t s = start + 1; s <= o->steps; s++) {
        double ts = clock_now_s();
        progress_totals_t tot0;
        progress_totals(prog, &tot0);
        int64_t k = s - 1;
        model_zero_grads(&model);
        double loss_sum = 0, data_s = 0;
        for (int a = 0; a < A; a++) {
            double td = clock_now_s();
            int bad = data_batch(data, (data_order_t)o->data_order, (uint64_t)o->data_seed, k, a, A, 0, 1, B, T, inputs,
                                 targets, err, sizeof err);
            data_s += clock_now_s() - td;
            if (bad) {
                log_error("%s", err);
                goto out;
            }
            if (o->dump_batches) {
                char path[4200];
                snprintf(path, sizeof path, "%s/tokens-rank-00000.bin", o->dump_batches);
                FILE *fp = fopen(path, "ab");
                bool ok = fp && fwrite(inputs, sizeof *inputs, N, fp) == N;
                if (fp) fclose(fp);
                if (!ok) { log_error("--dump-batches: cannot append to %s", path); goto out; }
            }
            loss_sum += model_forward(&model, inputs, targets);
            if (logits_host && s == start + 1 && a == 0)
                be->act_to_host(logits_host, model.logits, N * cfg.vocab);
            model_backward(&model, (float)inv_tokens);
        }
        double loss = loss_sum * inv_tokens;
        char lmsg[512];
        progress_loss_action_t act = progress_check_loss(prog, s, loss, o->skip_nonfinite, lmsg, sizeof lmsg);
        if (act != PROGRESS_LOSS_OK) {
            progress_clear_line(prog);
            if (act == PROGRESS_LOSS_STOP) { log_error("%s", lmsg); goto out; }
            log_warn("%s", lmsg);
        }
        double norm = optim_grad_norm(be, model.grads, model.n_params);
        if (logits_host && s == start + 1) {
            if (dump_grads(o->dump_grads, &model, logits_host, loss, err, sizeof err)) { log_error("%s", err); goto out; }
        }
        float coef = optim_clip_coef(norm, o->grad_clip);
        double lr = optim_lr(&ocfg, k);
        if (act == PROGRESS_LOSS_OK)
            optim_step(&opt, model.master, model.master == model.params ? NULL : model.params, model.grads, model.tensors,
                       model.n_tensors, lr, coef);
        else
            opt.step++; /* skipped: keep the update count equal to the step, as a resume sets it */

        if (progress_end_step(prog, s, &tot0, loss, lr, norm, clock_now_s() - ts, data_s, act != PROGRESS_LOSS_OK, err,
                              sizeof err)) {
            log_error("%s", err);
            goto out;
        }
        bool save = o->ckpt_dir && ((o->ckpt_every && s % o->ckpt_every == 0) || s == o->steps || g_stop);
        if (save) {
            ckpt_meta_t meta = { .step = s, .cfg = cfg, .ocfg = ocfg, .data_order = o->data_order,
                                 .data_seed = (uint64_t)o->data_seed, .init_seed = (uint64_t)o->init_seed,
                                 .B = B, .T = T, .accum = A, .dp = 1 };
            snprintf(meta.data, sizeof meta.data, "%s", o->data);
            if (ckpt_save(o->ckpt_dir, &meta, &model, &opt, err, sizeof err)) { log_error("%s", err); goto out; }
            last_saved = s;
            progress_clear_line(prog);
            log_info("saved checkpoint %s/step-%08lld", o->ckpt_dir, (long long)s);
        }
        if (g_stop) {
            progress_clear_line(prog);
            log_warn("stopping after step %lld on a signal%s", (long long)s, last_saved == s ? " (checkpoint saved)" : "");
            status = 130;
            goto out;
        }
    }
    if (o->dump_params) {
        float *full = malloc(model.n_params * sizeof(float));
        CHECK_ALLOC(full);
        model_get_params(&model, full);
        int rc = train_dump_params(o->dump_params, &model, full, err, sizeof err);
        free(full);
        if (rc) { log_error("%s", err); goto out; }
    }
    status = 0;
out:
    progress_free(prog);
    metrics_server_stop(msrv);
    if (jlog && jlog != stdout) fclose(jlog);
    free(inputs);
    free(targets);
    free(logits_host);
    if (have_opt) optim_destroy(&opt);
    if (have_model) model_destroy(&model);
    if (data) data_close(data);
    return status;
}
