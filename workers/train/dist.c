/* train_dist.c: the training loop of one rank among several: hybrid
 * sharding (workers/parallel/fsdp.h) with tensor parallelism (workers/model/tp.h) on the
 * CPU backend or on GPUs (--backend cuda).
 *
 * GPU ranks: local rank r uses GPU (--device + r) mod (visible GPUs). When
 * every rank of the node has a GPU of its own, --comm auto picks NCCL (device
 * buffers go to it directly); when several ranks share a GPU (NCCL refuses
 * that) it picks the shm collectives behind host staging
 * (workers/comm/stage.h), so fsdp.c and tp.c see device memory either way.
 * Sharded checkpoints (--ckpt-dir, --resume) copy the state through the
 * backend (workers/ckpt/sharded.c), so they work on GPU ranks as on the CPU.
 * A backend whose memory the host may not touch (host_memory false: a GPU,
 * or a test double of the CPU backend in the test build) gets its shm
 * collectives behind host staging.
 *
 * The global batch of a step is A micro-steps x dp data-parallel ranks x B
 * rows of T tokens (dp = world / T); rank r reads rows r*B .. r*B+B-1 of
 * each micro-step's dp*B rows (data_batch with rank r of dp), so a run of
 * one process with micro-batch dp*B reads the same tokens. The logged loss
 * is the mean over the global batch (the ranks' sums added in rank order);
 * only rank 0 prints progress and writes --log-json (workers/train/progress.h, the
 * same records as one process), while every rank keeps its own metrics and,
 * with --metrics-port P, serves them on P + its local rank. The memory savers
 * through ballastd (--activation-offload, --optimizer-offload,
 * --resume-from-service) hook in through workers/offload/run.h. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "clock.h"
#include "metrics.h"
#include "options.h"
#include "topology.h"
#include "workers/backend/backend.h"
#include "workers/ckpt/ckpt.h"
#include "workers/comm/stage.h"
#include "workers/data/data.h"
#include "workers/parallel/dist.h"
#include "workers/parallel/fsdp.h"
#include "workers/model/model.h"
#include "workers/offload/run.h"
#include "workers/model/optim.h"
#include "workers/train/progress.h"
#include "workers/train/train.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

/* Test hook: append this rank's micro-batch inputs to DIR/tokens-rank-NNNNN.bin. */
static int dump_batch(const char *dir, int rank, const int32_t *inputs, size_t n, char *err, size_t errlen) {
    char path[512];
    if (snprintf(path, sizeof path, "%s/tokens-rank-%05d.bin", dir, rank) >= (int)sizeof path) {
        snprintf(err, errlen, "--dump-batches: directory name too long");
        return -1;
    }
    FILE *fp = fopen(path, "ab");
    if (!fp || fwrite(inputs, sizeof *inputs, n, fp) != n) {
        if (fp) fclose(fp);
        snprintf(err, errlen, "--dump-batches: cannot append to %s", path);
        return -1;
    }
    fclose(fp);
    return 0;
}

/* The GPU set-up of a rank: its device (local rank r -> (--device + r) mod
 * count), the backend, and the collectives: NCCL when every local rank has
 * a GPU of its own (and --comm allows), shm with host staging when ranks
 * share a GPU. *comm gets the kind for dist_init. 0, or -1 with a message. */
static int gpu_setup(const train_opts_t *o, int rank, int world, const backend_t **be, int *device, comm_kind_t *comm,
                     char *err, size_t errlen) {
    char why[256] = "";
    int count = backend_device_count(BACKEND_CUDA, why, sizeof why);
    if (count <= 0) {
        snprintf(err, errlen, "--backend cuda: no usable GPU: %s; check nvidia-smi and CUDA_VISIBLE_DEVICES", why);
        return -1;
    }
    topo_flags_t tf;
    topo_t topo;
    topo_flags_init(&tf);
    tf.rank = rank;
    tf.world_size = world;
    int local = rank, local_world = world;
    if (topo_resolve(&tf, &topo, why, sizeof why) == 0) {
        local = topo.local_rank;
        local_world = topo.local_world_size;
    }
    *device = (int)((o->device + local) % count);
    bool shared = local_world > count; /* some GPU drives two ranks or more: NCCL refuses that */
    comm_kind_t want = (comm_kind_t)o->comm;
    if (shared && want == COMM_NCCL) {
        snprintf(err, errlen, "--comm nccl: %d ranks on this node share %d GPU%s and NCCL refuses two ranks on one GPU; "
                 "use --comm auto or shm (shared-memory collectives with host staging), or one rank per GPU",
                 local_world, count, count == 1 ? "" : "s");
        return -1;
    }
    *comm = shared ? COMM_SHM : want;
    if (!(*be = train_open_backend(o, *device, err, errlen))) return -1;
    return 0;
}

/* With device buffers on the shm backend: put each communicator behind
 * host staging. 0, or -1 with a message. */
static int stage_comms(dist_t *d, const backend_t *be, char *err, size_t errlen) {
    for (int k = 0; k < GROUP_NKINDS; k++) {
        if (!d->comm[k]) continue; /* a group of one rank */
        comm_t *w = NULL;
        if (comm_stage_wrap(&w, d->comm[k], be, err, errlen)) return -1;
        d->comm[k] = w;
    }
    return 0;
}

int train_run_sharded(const train_opts_t *o, int rank, int world, const char *rdzv_addr) {
    char err[5000];
    int status = 1;
    bool on_gpu = o->backend == 1;
    const backend_t *be = NULL;
    int device = 0;
    comm_kind_t comm_kind = (comm_kind_t)o->comm;
    if (on_gpu && gpu_setup(o, rank, world, &be, &device, &comm_kind, err, sizeof err)) {
        log_error("rank %d: %s", rank, err);
        return 1;
    }
    if (!on_gpu && !(be = train_open_backend(o, 0, err, sizeof err))) {
        log_error("rank %d: %s", rank, err);
        return 1;
    }
    if (o->resume && !o->ckpt_dir) { log_error("--resume needs --ckpt-dir DIR (where the step-NNNNNNNN directories are)"); return 1; }
    if (o->ckpt_every && !o->ckpt_dir) { log_error("--ckpt-every needs --ckpt-dir DIR"); return 1; }
    if (o->dump_grads) {
        log_error("rank %d: --dump-grads works with one process only; use --dump-params", rank);
        return 1;
    }
    if (offload_run_check(o, err, sizeof err)) { log_error("%s", err); return 1; }
    log_set_rank(rank);
    llama_config_t cfg;
    if (train_resolve_config(o, &cfg, err, sizeof err)) { log_error("%s", err); return 1; }
    if (!o->data) {
        log_error("--data is required: a token shard file or glob (make one with `ballast data synth --out FILE ...`)");
        return 1;
    }

    /* join the job: groups, rendezvous, communicators */
    dist_opts_t dopt = {
        .world = world, .rank = rank, .S = (int)o->shard_degree, .T = (int)o->tp_degree,
        .comm = comm_kind, .on_gpu = on_gpu, .device = device, .compute_stream = be_stream(be), .rdzv_addr = rdzv_addr, .rdzv_serve = true,
        .job_id = "ballast-train", .rdzv_timeout_s = o->rdzv_timeout,
    };
    dist_t d;
    if (dist_init(&d, &dopt, err, sizeof err)) { log_error("%s", err); return 1; }
    /* shm collectives read and write host memory: stage them for a backend
     * whose memory the host may not touch */
    bool stage = d.kind == COMM_SHM && !be->host_memory;
    if (stage && stage_comms(&d, be, err, sizeof err)) {
        log_error("rank %d: %s", rank, err);
        for (int kk = 0; kk < GROUP_NKINDS; kk++) comm_destroy(d.comm[kk]);
        rdzv_client_close(d.rdzv);
        rdzv_server_stop(d.server);
        groups_free(&d.groups);
        return 1;
    }
    if (on_gpu) log_info("rank %d: GPU %d, collectives %s", rank, device, dist_comm_name(&d));
    else if (stage) log_info("rank %d: %s backend, collectives %s", rank, be->name, dist_comm_name(&d));
    const groups_t *g = &d.groups;
    int dp = world / g->T, dp_rank = g->replica * g->S + g->shard;
    int B = (int)o->micro_batch, T = (int)o->seq_len, A = 0;
    data_t *data = NULL;
    model_t model = { 0 };
    fsdp_t fs = { 0 };
    offload_run_t orun = { 0 };   /* memory savers through ballastd (offload_run.h) */
    bool have_model = false, have_fs = false;
    float *full = NULL;
    int32_t *inputs = NULL, *targets = NULL;
    FILE *jlog = NULL;
    progress_t *prog = NULL;
    metrics_server_t *msrv = NULL;
    FILE *con = o->log_json && !strcmp(o->log_json, "-") ? stderr : stdout;

    if (train_grad_accum(o, dp, &A, err, sizeof err)) { log_error("%s", err); goto out; }
    if (data_open(o->data, cfg.vocab, &data, err, sizeof err)) { log_error("%s", err); goto out; }
    if (data_num_tokens(data) < (int64_t)T + 1) {
        log_error("%s: %lld tokens, fewer than seq-len + 1 = %d", o->data, (long long)data_num_tokens(data), T + 1);
        goto out;
    }
    /* no full parameters on the device: they live in fsdp's chunks */
    if (model_create_acts(&model, &cfg, be, B, T, o->act_ckpt, g->T, g->tp, d.comm[GROUP_TP], err, sizeof err)) {
        log_error("%s", err);
        goto out;
    }
    have_model = true;
    /* every rank builds the same full initial weights in host memory, then keeps its chunks */
    full = malloc(model.n_params * sizeof(float));
    CHECK_ALLOC(full);
    if (o->init_from) {
        if (ckpt_read_hf_host(o->init_from, &model, full, err, sizeof err)) { log_error("%s", err); goto out; }
    } else {
        model_init_random_host(&model, (uint64_t)o->init_seed, full);
    }
    optim_config_t ocfg = {
        .lr = o->lr, .min_lr = o->min_lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->adam_eps,
        .weight_decay = o->weight_decay, .grad_clip = o->grad_clip, .warmup_steps = o->warmup_steps,
        .total_steps = o->steps, .schedule = (lr_schedule_t)o->lr_schedule,
        /* optimizer offload from scratch (or from the service): the moments and,
         * on a GPU, the fp32 master never take device memory; a checkpoint
         * resume loads them on the device first */
        .state_elsewhere = o->opt_offload && !o->resume,
    };
    if (fsdp_create(&fs, &model, full, d.comm[GROUP_SHARD], d.comm[GROUP_REPLICA], &ocfg, err, sizeof err)) {
        log_error("rank %d: %s", rank, err);
        goto out;
    }
    have_fs = true;
    if (o->grad_reduce_dtype == 1 && fsdp_set_grad_reduce(&fs, COMM_BF16, err, sizeof err)) {
        log_error("rank %d: %s", rank, err);
        goto out;
    }
    free(full);
    full = NULL;

    /* --resume: every rank reads its own shard of the newest checkpoint */
    int64_t start = 0;
    if (o->resume) {
        char ck[4200];
        int found = ckpt_find_latest(o->ckpt_dir, ck, sizeof ck, err, sizeof err), bad = found < 0;
        if (found > 0) {
            ckpt_meta_t meta;
            if (ckpt_read_meta(ck, &meta, err, sizeof err)) {
                bad = 1;
            } else if ((int64_t)meta.accum * meta.dp * meta.B != (int64_t)A * dp * B || meta.T != T ||
                       meta.data_order != o->data_order || meta.data_seed != (uint64_t)o->data_seed) {
                /* step k reads samples k*G .. k*G+G-1 (G = grad-accum x dp x micro-batch rows) whatever the
                 * split, so only G, seq-len and the order must stay */
                snprintf(err, sizeof err, "%s: saved with grad-accum %d x %d data-parallel ranks x micro-batch %d = %lld rows "
                         "per step, seq-len %d, data-order %s, data-seed %llu; this run has %d x %d x %d = %lld rows, "
                         "seq-len %d: resume with the same seq-len, order and seed, and --grad-accum / --micro-batch "
                         "whose product with the %d data-parallel ranks is %lld, to continue the same data stream",
                         ck, meta.accum, meta.dp, meta.B, (long long)meta.accum * meta.dp * meta.B, meta.T,
                         meta.data_order == DATA_SEQUENTIAL ? "sequential" : "shuffled",
                         (unsigned long long)meta.data_seed, A, dp, B, (long long)A * dp * B, T, dp,
                         (long long)meta.accum * meta.dp * meta.B);
                bad = 1;
            } else if (fsdp_ckpt_load(&fs, ck, err, sizeof err)) {
                bad = 1;
            }
        }
        double nbad;
        char e[COMM_ERR_LEN];
        if (fsdp_sum_all(&fs, bad, &nbad, e, sizeof e)) { log_error("rank %d: %s", rank, e); goto out; }
        if (bad) { log_error("rank %d: %s", rank, err); goto out; }
        if (nbad > 0) { log_error("rank %d: resuming failed on another rank (see its message)", rank); goto out; }
        if (found > 0) {
            start = fs.opt.step;
            if (rank == 0) log_info("resumed from %s (step %lld)", ck, (long long)start);
        } else if (rank == 0) {
            log_warn("--resume: no checkpoint under %s yet, starting from scratch", o->ckpt_dir);
        }
    }
    /* offload: the ballastd session; --resume-from-service sets start */
    if (offload_run_open(&orun, o, &fs, rank, world, &start, err, sizeof err)) { log_error("rank %d: %s", rank, err); goto out; }
    if (o->resume_from_service && rank == 0) log_info("resumed from ballastd (job %s) after step %lld", o->offload_job, (long long)start);

    if (rank == 0) {
        train_print_settings(con);
        fprintf(con, "model: %s, %lld parameters (dim %d, %d layers, %d heads / %d kv, ffn %d, vocab %d%s)\n",
                cfg.name, (long long)llama_total_params(&cfg), cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                cfg.ffn_dim, cfg.vocab, cfg.tie_embeddings ? ", tied" : "");
        fprintf(con, "layout: world %d = %d replicas x hybrid shard degree %d x tensor-parallel degree %d; comm %s\n",
                world, g->R, g->S, g->T, comm_kind_name(d.kind));
        fprintf(con, "batch: %d micro-steps x %d data-parallel ranks x %d rows x %d tokens = %lld tokens per step\n", A,
                dp, B, T, (long long)A * dp * B * T);
        char st[32], whole[32];
        format_size(fsdp_state_bytes(&fs), st, sizeof st);
        format_size((uint64_t)model.n_params * 16, whole, sizeof whole);
        fprintf(con, "memory: %s (%zu bytes) of sharded fp32 weights, gradients and AdamW moments per rank "
                     "(the whole model's: %s)", st, fsdp_state_bytes(&fs), whole);
        if (orun.oo) fprintf(con, ", less what ballastd holds, plus %zu bytes of optimizer staging",
                             offload_run_staging_bytes(&orun));
        fprintf(con, "\n");
        offload_run_describe(&orun, &fs, con);
        fflush(con);
    }
    log_info("rank %d: replica %d, shard %d of %d; data-parallel rank %d of %d", rank, g->replica, g->shard, g->S,
             dp_rank, dp);
    if (o->log_json && rank == 0) {
        jlog = !strcmp(o->log_json, "-") ? stdout : fopen(o->log_json, start > 0 ? "a" : "w");
        if (!jlog) { log_error("--log-json %s: cannot open for writing", o->log_json); goto out; }
    }
    if (o->metrics_port > 0) {
        /* several ranks on one node: P + local rank, so they do not collide */
        topo_flags_t tf;
        topo_t topo;
        topo_flags_init(&tf);
        tf.rank = rank;
        tf.world_size = world;
        int local = topo_resolve(&tf, &topo, err, sizeof err) == 0 ? topo.local_rank : rank;
        int port = (int)o->metrics_port + local;
        if (port > 65535) {
            log_error("rank %d: --metrics-port %lld + local rank %d = %d is past 65535; pick a lower port", rank,
                      (long long)o->metrics_port, local, port);
            goto out;
        }
        msrv = metrics_server_start(metrics_default(), o->metrics_bind, port, err, sizeof err);
        if (!msrv) { log_error("rank %d: %s (--metrics-port %lld + local rank %d)", rank, err, (long long)o->metrics_port, local); goto out; }
        log_info("rank %d: metrics: http://%s:%d/metrics", rank, o->metrics_bind, metrics_server_port(msrv));
    }
    {
        progress_cfg_t pcfg = { .total_steps = o->steps, .start_step = start, .tokens_per_step = (int64_t)A * dp * B * T,
                                .flops_per_token = llama_flops_per_token(&cfg, T), .n_gpus = world,
                                .device = be_device_name(be),
                                .peak_tflops = o->peak_tflops, .log_every = o->log_every,
                                .console = rank == 0 ? con : NULL, .live = -1, .json = jlog, .rank = rank,
                                .metrics = metrics_default() };
        size_t nopt;
        const opt_t *opts = train_option_table(&nopt);
        prog = progress_new(&pcfg, err, sizeof err);
        if (!prog || progress_write_settings(prog, opts, nopt, cfg.name, llama_total_params(&cfg),
                                             rank == 0 ? progress_entropy_floor(o->data) : NAN, err, sizeof err)) {
            log_error("rank %d: %s", rank, err);
            goto out;
        }
    }
    /* after the settings record of a fresh log: the layout and the per-rank sharded state (tests read it) */
    if (jlog && start == 0) {
        fprintf(jlog, "{\"kind\": \"layout\", \"world\": %d, \"replicas\": %d, \"shard_degree\": %d, "
                      "\"tensor_parallel_degree\": %d, \"state_bytes_per_rank\": %zu, \"model_state_bytes\": %llu, "
                      "\"offload_staging_bytes\": %zu}\n",
                world, g->R, g->S, g->T, fsdp_state_bytes(&fs), (unsigned long long)model.n_params * 16,
                offload_run_staging_bytes(&orun));
        fflush(jlog);
    }
    size_t N = (size_t)B * T;
    inputs = malloc(N * sizeof(int32_t));
    targets = malloc(N * sizeof(int32_t));
    CHECK_ALLOC(inputs);
    CHECK_ALLOC(targets);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    double global_tokens = (double)A * dp * B * T;
    float scale = (float)(1.0 / global_tokens);
    for (int64_t s = start + 1; s <= o->steps; s++) {
        double ts = clock_now_s(), data_s = 0;
        progress_totals_t tot0;
        progress_totals(prog, &tot0);
        int64_t k = s - 1;
        double loss_sum = 0;
        if (fsdp_begin_step(&fs, err, sizeof err)) { log_error("rank %d: %s", rank, err); goto out; }
        for (int a = 0; a < A; a++) {
            double td = clock_now_s();
            int bad = data_batch(data, (data_order_t)o->data_order, (uint64_t)o->data_seed, k, a, A, dp_rank, dp, B, T,
                                 inputs, targets, err, sizeof err);
            data_s += clock_now_s() - td;
            if (bad) {
                progress_clear_line(prog);
                log_error("%s", err);
                goto out;
            }
            if (o->dump_batches && dump_batch(o->dump_batches, rank, inputs, N, err, sizeof err)) {
                log_error("%s", err);
                goto out;
            }
            double ls;
            if (fsdp_micro_step(&fs, inputs, targets, scale, &ls, err, sizeof err)) {
                log_error("rank %d: %s", rank, err);
                goto out;
            }
            loss_sum += ls;
        }
        double total, norm, stop;
        if (fsdp_end_step(&fs, err, sizeof err) || fsdp_sum_all(&fs, loss_sum, &total, err, sizeof err) ||
            fsdp_grad_norm(&fs, &norm, err, sizeof err) || fsdp_sum_all(&fs, g_stop ? 1 : 0, &stop, err, sizeof err)) {
            log_error("rank %d: %s", rank, err);
            goto out;
        }
        double loss = total / global_tokens;
        /* every rank saw the same summed loss, so all take the same decision */
        char lmsg[512];
        progress_loss_action_t act = progress_check_loss(prog, s, loss, o->skip_nonfinite, lmsg, sizeof lmsg);
        if (act != PROGRESS_LOSS_OK) {
            progress_clear_line(prog);
            if (act == PROGRESS_LOSS_STOP) {
                if (rank == 0) log_error("%s", lmsg);
                else log_error("rank %d: stopping at step %lld with the others: the loss is not finite (rank 0 says why)",
                               rank, (long long)s);
                goto out;
            }
            if (rank == 0) log_warn("%s", lmsg);
        }
        float coef = optim_clip_coef(norm, o->grad_clip);
        double lr = optim_lr(&ocfg, k);
        if (act == PROGRESS_LOSS_OK) {
            if (offload_run_optim_step(&orun, &fs, s, lr, coef, err, sizeof err)) { log_error("rank %d: %s", rank, err); goto out; }
        } else
            fs.opt.step++; /* skipped: keep the update count equal to the step, as a resume sets it */
        if (progress_end_step(prog, s, &tot0, loss, lr, norm, clock_now_s() - ts, data_s, act != PROGRESS_LOSS_OK, err,
                              sizeof err)) {
            log_error("rank %d: %s", rank, err);
            goto out;
        }
        /* every rank saw the same sum, so all save and stop after the same step */
        if (o->ckpt_dir && ((o->ckpt_every && s % o->ckpt_every == 0) || s == o->steps || stop > 0)) {
            ckpt_meta_t meta = { .step = s, .cfg = cfg, .ocfg = ocfg, .data_order = o->data_order,
                                 .data_seed = (uint64_t)o->data_seed, .init_seed = (uint64_t)o->init_seed,
                                 .B = B, .T = T, .accum = A, .dp = dp };
            snprintf(meta.data, sizeof meta.data, "%s", o->data);
            int ck_rc = offload_run_before_ckpt(&orun, err, sizeof err);
            if (!ck_rc) ck_rc = fsdp_ckpt_save(&fs, o->ckpt_dir, &meta, rank, world, err, sizeof err);
            offload_run_after_ckpt(&orun);
            if (ck_rc) {
                log_error("rank %d: checkpoint of step %lld: %s", rank, (long long)s, err);
                goto out;
            }
            progress_clear_line(prog);
            if (rank == 0) log_info("saved checkpoint %s/step-%08lld (%d shard files)", o->ckpt_dir, (long long)s, g->S * g->T);
        }
        if (stop > 0) {
            progress_clear_line(prog);
            if (rank == 0) log_warn("stopping after step %lld on a signal", (long long)s);
            status = 130;
            goto leave;
        }
    }
    if (orun.on && offload_run_summary(&orun, &fs, rank, con, err, sizeof err)) { log_error("rank %d: %s", rank, err); goto out; }
    if (o->dump_params) {
        full = malloc(model.n_params * sizeof(float));
        CHECK_ALLOC(full);
        /* the master back from ballastd where optimizer offload keeps it there */
        int gp_rc = offload_run_before_ckpt(&orun, err, sizeof err);
        if (!gp_rc) gp_rc = fsdp_gather_params(&fs, full, err, sizeof err);
        offload_run_after_ckpt(&orun);
        if (gp_rc) { log_error("rank %d: %s", rank, err); goto out; }
        if (rank == 0 && train_dump_params(o->dump_params, &model, full, err, sizeof err)) {
            log_error("%s", err);
            goto out;
        }
    }
    status = 0;
leave:
    /* a clean exit meets every rank at the last barrier */
    offload_run_close(&orun, &fs);
    if (have_fs) fsdp_destroy(&fs);
    have_fs = false;
    if (dist_destroy(&d, err, sizeof err)) {
        log_error("%s", err);
        status = 1;
    }
    d.rdzv = NULL;
    goto done;
out:
    offload_run_close(&orun, &fs);
    if (have_fs) fsdp_destroy(&fs);
    /* on failure leave without the last barrier: peers see this process exit */
    for (int kk = 0; kk < GROUP_NKINDS; kk++) comm_destroy(d.comm[kk]);
    rdzv_client_close(d.rdzv);
    rdzv_server_stop(d.server);
    groups_free(&d.groups);
done:
    progress_free(prog);
    metrics_server_stop(msrv);
    if (jlog && jlog != stdout) fclose(jlog);
    free(full);
    free(inputs);
    free(targets);
    if (have_model) model_destroy(&model);
    if (data) data_close(data);
    return status;
}
