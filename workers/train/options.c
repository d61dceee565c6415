/* options.c: the worker's option table (one definition per flag:
 * common/options.h), and what the flags resolve to before a run: the model
 * config, the micro-steps per step, where the process sits in its job, and
 * the backend (through the test build's wrapper when one is set). See
 * train.h; the loop that uses them is loop.c. */
#include "workers/train/train.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "options.h"
#include "topology.h"
#include "workers/backend/backend.h"

/* ---- options ---- */

static train_opts_t g_opts;

/* --activation-checkpointing: its spellings, and what each means */
#define CKPT_CHOICES "false|true|full|selective|none|0|1|no|yes"
static int g_ckpt_choice;
static const model_ckpt_t ckpt_modes[] = { MODEL_CKPT_NONE, MODEL_CKPT_FULL, MODEL_CKPT_FULL, MODEL_CKPT_SELECTIVE,
                                           MODEL_CKPT_NONE, MODEL_CKPT_NONE, MODEL_CKPT_FULL, MODEL_CKPT_NONE,
                                           MODEL_CKPT_FULL };
static const char *g_prog = "ballast-worker"; /* the name messages go under */

void train_set_program(const char *name) { if (name && *name) g_prog = name; }
const char *train_program(void) { return g_prog; }

static const opt_t train_options[] = {
    { "model", OPT_STRING, NULL, 0, 0, NULL, "preset (tiny, small, demo, llama2-7b, ...), config.json or model directory; default: --init-from's config", &g_opts.model },
    { "init-from", OPT_STRING, NULL, 0, 0, NULL, "Hugging Face Llama directory to load the initial weights from", &g_opts.init_from },
    { "init-seed", OPT_INT, "1", 0, 9.2e18, NULL, "seed of the random initialisation (without --init-from)", &g_opts.init_seed },
    { "data", OPT_STRING, NULL, 0, 0, NULL, "token shard file or glob (llm.c format; ballast data synth makes one)", &g_opts.data },
    { "val-data", OPT_STRING, NULL, 0, 0, NULL, "validation token shard file or glob: its loss is measured every --eval-every steps and at the end", &g_opts.val_data },
    { "eval-every", OPT_INT, "0", 0, 9.2e18, NULL, "steps between validation losses (0: only after the last step); needs --val-data", &g_opts.eval_every },
    { "eval-batches", OPT_INT, "0", 0, 1 << 30, NULL, "K: micro-batches of the validation data per evaluation, the same ones each time, on every data-parallel rank (0: 8)", &g_opts.eval_batches },
    { "data-order", OPT_ENUM, "shuffled", 0, 0, "sequential|shuffled", "order of the training windows", &g_opts.data_order },
    { "data-seed", OPT_INT, "1", 0, 9.2e18, NULL, "seed of the shuffled order", &g_opts.data_seed },
    { "micro-batch", OPT_INT, "4", 1, 1 << 20, NULL, "B: rows per micro-step", &g_opts.micro_batch },
    { "seq-len", OPT_INT, "128", 1, 1 << 24, NULL, "T: tokens per row", &g_opts.seq_len },
    { "grad-accum", OPT_INT, "1", 1, 1 << 20, NULL, "A: micro-steps per optimizer step", &g_opts.grad_accum },
    { "global-batch-tokens", OPT_SIZE, "0", 0, 9.2e18, NULL, "tokens per step (4M = 4194304, as ballast plan takes it); when set, A = this / (B*T) and must divide", &g_opts.global_batch_tokens },
    { "steps", OPT_INT, "100", 0, 9.2e18, NULL, "optimizer steps of the whole run", &g_opts.steps },
    { "lr", OPT_DOUBLE, "3e-4", 0, 10, NULL, "peak learning rate", &g_opts.lr },
    { "min-lr", OPT_DOUBLE, "0", 0, 10, NULL, "final learning rate of the cosine, linear and wsd schedules", &g_opts.min_lr },
    { "min-lr-ratio", OPT_DOUBLE, "-1", -1, 1, NULL, "final learning rate as a fraction of --lr (instead of --min-lr; -1: unset)", &g_opts.min_lr_ratio },
    { "lr-schedule", OPT_ENUM, "cosine", 0, 0, "constant|cosine|linear|wsd", "learning-rate schedule after warmup (wsd: warmup-stable-decay, linear decay over the last --decay-fraction of the steps)", &g_opts.lr_schedule },
    { "decay-fraction", OPT_DOUBLE, "0.2", 0, 1, NULL, "--lr-schedule wsd: fraction of --steps that decays to the final learning rate", &g_opts.decay_fraction },
    { "warmup-steps", OPT_INT, "0", 0, 9.2e18, NULL, "linear warmup steps", &g_opts.warmup_steps },
    { "beta1", OPT_DOUBLE, "0.9", 0, 0.999999, NULL, "AdamW first-moment decay", &g_opts.beta1 },
    { "beta2", OPT_DOUBLE, "0.95", 0, 0.999999999, NULL, "AdamW second-moment decay", &g_opts.beta2 },
    { "adam-eps", OPT_DOUBLE, "1e-8", 0, 1, NULL, "AdamW epsilon", &g_opts.adam_eps },
    { "weight-decay", OPT_DOUBLE, "0.1", 0, 10, NULL, "decoupled weight decay on 2-D weights", &g_opts.weight_decay },
    { "grad-clip", OPT_DOUBLE, "1.0", 0, 1e30, NULL, "max global gradient L2 norm; 0 turns clipping off", &g_opts.grad_clip },
    { "tokenizer", OPT_STRING, NULL, 0, 0, NULL, "the tokenizer the data was made with (tokenizer.json or its directory): recorded in each checkpoint for ballast ckpt export and ballast generate", &g_opts.tokenizer },
    { "ckpt-dir", OPT_STRING, NULL, 0, 0, NULL, "directory for step-NNNNNNNN checkpoints", &g_opts.ckpt_dir },
    { "ckpt-every", OPT_INT, "0", 0, 9.2e18, NULL, "steps between checkpoints (0: only at the end); needs --ckpt-dir", &g_opts.ckpt_every },
    { "ckpt-keep", OPT_INT, "0", 0, 1 << 30, NULL, "keep only the newest N complete checkpoints in --ckpt-dir, deleting older ones after each save (0: keep all)", &g_opts.ckpt_keep },
    { "resume", OPT_STRING, "false", 0, 0, NULL, "continue from a checkpoint: auto or true (the newest complete one in --ckpt-dir; none yet: start fresh), a step directory, or false", &g_opts.resume_arg },
    { "allow-schedule-change", OPT_BOOL, "false", 0, 0, NULL, "--resume: continue on this run's learning-rate schedule (--lr, --steps, --warmup-steps, ...) where it differs from the checkpoint's", &g_opts.allow_schedule_change },
    { "print-settings", OPT_BOOL, "false", 0, 0, NULL, "print the table of every setting at start (otherwise one line of those that differ from the defaults)", &g_opts.print_settings },
    { "log-json", OPT_STRING, NULL, 0, 0, NULL, "write one JSON object per step to FILE (- for stdout)", &g_opts.log_json },
    { "tensorboard-dir", OPT_STRING, NULL, 0, 0, NULL, "write TensorBoard event files of the step scalars (loss, lr, grad norm, tokens/s, offload) into DIR", &g_opts.tensorboard_dir },
    { "log-every", OPT_INT, "1", 1, 9.2e18, NULL, "print a progress line every N steps", &g_opts.log_every },
    { "activation-checkpointing", OPT_ENUM, "false", 0, 0, CKPT_CHOICES, "full (the flag alone; also true, 1, yes): keep only block inputs and recompute blocks in backward; selective: keep each block's attention output and log-sum-exp too, recompute the rest; false (none, 0, no): keep everything", &g_ckpt_choice, NULL, "full" },
    { "threads", OPT_INT, "0", 0, 4096, NULL, "compute threads (0: all cores)", &g_opts.threads },
    { "backend", OPT_ENUM, "cpu", 0, 0, "cpu|cuda", "compute backend: cpu (fp32) or cuda (bf16 on GPU --device)", &g_opts.backend },
    { "device", OPT_INT, "0", 0, 1024, NULL, "GPU index for --backend cuda", &g_opts.device },
    { "attention", OPT_ENUM, "auto", 0, 0, "auto|cudnn|own|tc|simt", "attention on --backend cuda: auto (cuDNN's fused attention when libcudnn.so.9 loads and its start-up self-check against our kernels passes, else own), cudnn (that, or stop), own (our tensor-core kernels; tc the same), simt; the CPU backend takes auto or own", &g_opts.attention },
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
    { "context-parallel-degree", OPT_INT, "1", 1, 65536, NULL, "C: context-parallel ranks splitting each sequence (2C load-balanced causal chunks, ring attention); must divide world / T, and 2C the seq-len", &g_opts.cp_degree },
    { "cp-overlap", OPT_BOOL, "true", 0, 0, NULL, "--context-parallel-degree > 1 on --backend cuda: the compute stream waits for each ring shift (K/V and dK/dV) on an event while the host queues on; false: the host waits for each shift (same results, for comparison)", &g_opts.cp_overlap },
    { "max-activation-bytes", OPT_SIZE, "0", 0, 0, NULL, "refuse to start when one rank's activations (block inputs, block internals, logits, scratch) would take more than this (0: no limit); a longer sequence fits with a larger --context-parallel-degree", &g_opts.max_act_bytes },
    { "comm", OPT_ENUM, "auto", 0, 0, "auto|shm|nccl|gloo", "collectives backend: shm between CPU processes of one node, gloo (TCP) between hosts, nccl between GPUs; auto: nccl on GPUs, else per group shm when every member is on this node and gloo otherwise", &g_opts.comm },
    { "comm-dir", OPT_STRING, NULL, 0, 0, NULL, "directory the ranks of a node share for the shm backend's fd-passing socket (mount the same one into every container of the node); default: the directory of --offload-socket, e.g. /run/ballast", &g_opts.comm_dir },
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

/* --resume alone (as when it was a switch) means --resume=true, --no-resume
 * --resume=false; a value may follow as the next argument. Rewrites argv
 * in place. */
static void resume_forms(int argc, char **argv) {
    static char on[] = "--resume=true", off[] = "--resume=false";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--no-resume")) argv[i] = off;
        else if (!strcmp(argv[i], "--resume") && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))) argv[i] = on;
    }
}

/* --resume's value into o->resume, resume_auto, resume_path. */
static int resume_resolve(train_opts_t *o) {
    const char *v = o->resume_arg ? o->resume_arg : "false";
    o->resume = true;
    o->resume_auto = false;
    o->resume_path = NULL;
    bool b;
    char e[64];
    if (!strcmp(v, "auto")) o->resume_auto = true;
    else if (!parse_bool(v, &b, e, sizeof e)) o->resume = b;
    else if (!v[0]) {
        fprintf(stderr, "%s: --resume '': expected auto, true, false or a checkpoint step directory\n", g_prog);
        return -1;
    } else o->resume_path = v;
    return 0;
}

/* The flags `ballast train` takes itself (workers/cli/cmd_train.c): a slip
 * in one gets its "did you mean" from the worker that sees it. */
static const char *const launcher_flags[] = { "nproc", "nproc-per-node", "nnodes", "node-rank", "max-restarts",
                                              "run-dir", "offload-pool", "offload-spill-dir", "offload-spill-bytes",
                                              NULL };

int train_parse(int argc, char **argv, train_opts_t *o) {
    char err[OPT_ERR_LEN];
    const char *pos[1];
    int npos = 0;
    resume_forms(argc, argv);
    opt_set_extra_names(launcher_flags);
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
        if (strncmp(argv[i], "--", 2)) continue;
        for (const char *const *f = launcher_flags; *f; f++) {
            size_t n = strlen(*f);
            if (strncmp(argv[i] + 2, *f, n) || (argv[i][2 + n] && argv[i][2 + n] != '=')) continue;
            fprintf(stderr, "%s: --%s is a flag of the launcher: run `ballast train --%s ...` (ballast-worker is one "
                    "process of a job)\n", g_prog, *f, *f);
            return -1;
        }
    }
    int rc = opt_parse(train_options, N_OPTS, argc, argv, pos, 0, &npos,
                       "usage: ballast-worker --data SHARDS [--model M | --init-from DIR] [options]", err, sizeof err);
    if (rc < 0) { fprintf(stderr, "%s: %s\n", g_prog, err); return -1; }
    if (rc == 0 && resume_resolve(&g_opts)) return -1;
    g_opts.act_ckpt = ckpt_modes[g_ckpt_choice];
    /* BALLAST_LOG_JSON=1 once meant "log lines as JSON": a boolean here
     * would write the step records to a file named 1 */
    if (rc == 0 && g_opts.log_json) {
        static const char *const flags[] = { "1", "0", "true", "false", "yes", "no", "on", "off", NULL };
        for (const char *const *f = flags; *f; f++)
            if (!strcasecmp(g_opts.log_json, *f)) {
                fprintf(stderr, "%s: --log-json '%s' (or BALLAST_LOG_JSON) looks like a boolean; it takes the FILE "
                        "the step records go to (- for stdout); for log lines as JSON set BALLAST_LOG_FORMAT=json\n",
                        g_prog, g_opts.log_json);
                return -1;
            }
    }
    *o = g_opts;
    return rc;
}

void train_print_settings(FILE *out) { opt_print_table(train_options, N_OPTS, out); }

void train_print_changed_settings(FILE *out) {
    fprintf(out, "settings: ");
    if (!opt_print_changed(train_options, N_OPTS, out)) fprintf(out, "the defaults");
    fprintf(out, " (every one: --print-settings)\n");
}

const opt_t *train_option_table(size_t *n) {
    *n = N_OPTS;
    return train_options;
}

/* ---- what the flags resolve to ---- */

/* A directory given as a model (flag: "--init-from", "--model") that holds
 * no config.json: say what it is instead (a ballast checkpoint, a
 * directory of them, something else). 0 when it is not such a directory. */
static int not_hf_dir(const char *flag, const char *dir, char *err, size_t errlen) {
    struct stat st;
    char p[4200];
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    /* a checkpoint step holds a config.json too: its manifest tells it apart */
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    bool step = access(p, F_OK) == 0;
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (!step && access(p, F_OK) == 0) return 0;
    bool steps = false;
    glob_t g;
    snprintf(p, sizeof p, "%s/step-*/manifest.json", dir);
    if (!step && glob(p, 0, NULL, &g) == 0) { steps = g.gl_pathc > 0; globfree(&g); }
    if (step || steps)
        return errbuf_set(err, errlen, "%s %s is a ballast checkpoint%s, not a Hugging Face model directory: continue "
                          "that run with --ckpt-dir %s --resume%s, or convert it with `ballast ckpt export --from %s "
                          "--out DIR` and give that DIR", flag, dir, steps ? " directory" : "", steps ? dir : "DIR",
                          steps ? "" : " (or --resume PATH)", dir);
    return errbuf_set(err, errlen, "%s %s: no config.json there: not a Hugging Face model directory (config.json and "
                      "*.safetensors, as `ballast ckpt export` writes)", flag, dir);
}

/* Resolve --model / --init-from into one config. */
int train_resolve_config(const train_opts_t *o, llama_config_t *cfg, char *err, size_t errlen) {
    if (o->init_from && not_hf_dir("--init-from", o->init_from, err, errlen)) return -1;
    if (o->model && not_hf_dir("--model", o->model, err, errlen)) return -1;
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

int train_resolve_topology(const train_opts_t *o, topo_t *t, char *err, size_t errlen) {
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
