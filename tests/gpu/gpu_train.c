/* gpu_train.c: single-GPU training with the CUDA backend, in two modes.
 *
 *   gpu_train check  end to end: the same model (weights written to and read
 *                    back from one safetensors file) trains for --steps
 *                    steps on the CPU oracle and on the GPU from the same
 *                    batches; each step's loss must agree within --tol
 *                    (bf16). TAP output.
 *   gpu_train bench  throughput of full training steps (forward, backward,
 *                    global norm, AdamW) for a Llama shape: tokens/s, model
 *                    TFLOP/s (workers/model/config.h's llama_flops_per_token:
 *                    6 x matmul params + 12 L H Dh T per token) and MFU
 *                    against --peak-tflops; then one profiled step with the
 *                    time per op. With --json FILE, one JSON line of results.
 *
 * Needs only libc, the CUDA libraries and jansson (for config and
 * safetensors), so tests/gpu/run.sh can build it on a GPU machine without
 * the project's Debian packages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "clock.h"
#include "options.h"
#include "workers/backend/backend.h"
#include "workers/backend/cuda/backend_cuda.h"
#include "workers/model/config.h"
#include "workers/model/model.h"
#include "workers/model/optim.h"
#include "workers/ckpt/safetensors.h"

/* ---- options ---- */

static struct {
    const char *model, *dir, *json;
    int64_t seq, batch, steps, warmup, seed, threads;
    double lr, tol, peak;
    int act_ckpt_choice; /* index into "false|true|full|selective" */
    model_ckpt_t act_ckpt;
    bool profile;
    int backend;
    int precision;       /* bench: 0 bf16, 1 fp8 */
    int attention;       /* index into attention_names */
} g;

static const char *const attention_names[] = { "auto", "cudnn", "own", "tc", "simt" };
static int select_attention(void);

static const opt_t options[] = {
    { "model", OPT_STRING, "demo", 0, 0, NULL, "preset or config.json (head_dim must be 64 or 128 on the GPU)", &g.model },
    { "seq-len", OPT_INT, "128", 1, 1 << 20, NULL, "T: tokens per row", &g.seq },
    { "micro-batch", OPT_INT, "4", 1, 1 << 16, NULL, "B: rows per step", &g.batch },
    { "steps", OPT_INT, "20", 1, 1 << 20, NULL, "check: steps compared; bench: timed steps", &g.steps },
    { "warmup", OPT_INT, "2", 0, 1000, NULL, "bench: untimed steps first", &g.warmup },
    { "seed", OPT_INT, "1", 0, 9.2e18, NULL, "weights and data seed", &g.seed },
    { "lr", OPT_DOUBLE, "1e-3", 0, 1, NULL, "AdamW learning rate", &g.lr },
    { "tol", OPT_DOUBLE, "1e-2", 0, 1, NULL, "check: max relative loss difference per step", &g.tol },
    { "activation-checkpointing", OPT_ENUM, "false", 0, 0, "false|true|full|selective",
      "full (the flag alone, or true): keep only block inputs, recompute in backward; selective: keep the attention output and log-sum-exp too", &g.act_ckpt_choice, NULL, "full" },
    { "profile", OPT_BOOL, "true", 0, 0, NULL, "bench: one extra step timed per op", &g.profile },
    { "peak-tflops", OPT_DOUBLE, "989", 1, 1e6, NULL, "bench: dense bf16 peak for MFU (H100/H200 SXM: 989)", &g.peak },
    { "dir", OPT_STRING, "/tmp", 0, 0, NULL, "check: where the shared safetensors file goes", &g.dir },
    { "json", OPT_STRING, NULL, 0, 0, NULL, "append one JSON line of results to FILE", &g.json },
    { "threads", OPT_INT, "0", 0, 4096, NULL, "CPU oracle threads (0: all cores)", &g.threads },
    { "precision", OPT_ENUM, "bf16", 0, 0, "bf16|fp8", "bench: GEMM precision (fp8 needs compute capability 8.9+)", &g.precision },
    { "attention", OPT_ENUM, "auto", 0, 0, "auto|cudnn|own|tc|simt", "attention on the GPU: auto (cuDNN's fused attention when it loads and passes its self-check, else own), cudnn (that, or stop), own (our tensor-core kernels; tc the same), simt", &g.attention },
    { "backend", OPT_ENUM, "cuda", 0, 0, "cuda|cpu", "check: backend compared with the CPU oracle (cpu tests the harness itself)", &g.backend },
};
#define N_OPTS (sizeof options / sizeof options[0])

/* ---- data ---- */

/* A learnable synthetic stream over the first min(V, 64) token ids: runs of
 * an affine recurrence with random restarts. The unused ids and then the
 * recurrence are quick to learn, so losses fall within a few steps. Row r
 * of step s is a pure function of (seed, s, r). */
static void make_batch(int32_t *tok, int32_t *tgt, int B, int T, int V, uint64_t seed, int step) {
    uint32_t U = V < 64 ? (uint32_t)V : 64u;
    for (int r = 0; r < B; r++) {
        uint64_t s = seed * 0x9E3779B97F4A7C15ull + (uint64_t)step * 1000003u + (uint64_t)r * 7919u + 1;
        uint32_t x = (uint32_t)(s % U);
        for (int t = 0; t <= T; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            if ((s >> 59) == 0) x = (uint32_t)((s >> 20) % U); /* restart 1 in 32 */
            else x = (x * 5u + 3u) % U;
            if (t < T) tok[(size_t)r * T + t] = (int32_t)x;
            if (t > 0) tgt[(size_t)r * T + t - 1] = (int32_t)x;
        }
    }
}

/* ---- one step ---- */

/* forward + backward into fresh gradients; returns the mean loss */
static double fwd_bwd(model_t *m, const int32_t *tok, const int32_t *tgt) {
    int N = m->B * m->T;
    model_zero_grads(m);
    double loss = model_forward(m, tok, tgt) / N;
    model_backward(m, 1.0f / (float)N);
    return loss;
}

/* clip + AdamW; *norm gets the gradient norm before clipping */
static void update(model_t *m, optim_t *o, double lr, double *norm) {
    *norm = optim_grad_norm(m->be, m->grads, m->n_params);
    float coef = optim_clip_coef(*norm, 1.0);
    optim_step(o, m->master, m->master == m->params ? NULL : m->params, m->grads, m->tensors, m->n_tensors, lr, coef);
}

static double train_step(model_t *m, optim_t *o, const int32_t *tok, const int32_t *tgt, double lr, double *norm) {
    double loss = fwd_bwd(m, tok, tgt);
    update(m, o, lr, norm);
    return loss;
}

/* Diagnostics for when the losses part: relative L2 difference of each
 * parameter gradient of the first step, GPU against CPU, the largest few
 * printed as TAP comments (no verdict: the loss comparison is the test). */
static void print_grad_diffs(const model_t *mc, const model_t *mg) {
    size_t n = mc->n_params;
    float *gc = malloc(n * sizeof(float)), *gg = malloc(n * sizeof(float));
    CHECK_ALLOC(gc);
    CHECK_ALLOC(gg);
    mc->be->to_host(gc, mc->grads, n * sizeof(float));
    mg->be->to_host(gg, mg->grads, n * sizeof(float));
    enum { TOP = 6 };
    double top[TOP] = { -1, -1, -1, -1, -1, -1 }, all_e = 0, all_r = 0;
    int topi[TOP] = { -1, -1, -1, -1, -1, -1 };
    for (int i = 0; i < mc->n_tensors; i++) {
        const model_tensor_t *t = &mc->tensors[i];
        double e = 0, r = 0;
        for (size_t j = t->offset; j < t->offset + t->numel; j++) {
            double d = (double)gg[j] - gc[j];
            e += d * d;
            r += (double)gc[j] * gc[j];
        }
        all_e += e;
        all_r += r;
        double rel = r > 0 ? sqrt(e / r) : sqrt(e);
        for (int k = 0; k < TOP; k++)
            if (rel > top[k] || !(rel == rel)) {
                for (int q = TOP - 1; q > k; q--) { top[q] = top[q - 1]; topi[q] = topi[q - 1]; }
                top[k] = rel;
                topi[k] = i;
                break;
            }
    }
    printf("# step 1 gradients, GPU vs CPU: relative L2 difference %.3e over all parameters; largest per tensor:\n",
           all_r > 0 ? sqrt(all_e / all_r) : 0.0);
    for (int k = 0; k < TOP && topi[k] >= 0; k++) printf("#   %-48s %.3e\n", mc->tensors[topi[k]].name, top[k]);
    free(gc);
    free(gg);
}

static optim_config_t optim_cfg(void) {
    optim_config_t c = { 0 };
    c.lr = g.lr; c.min_lr = g.lr; c.beta1 = 0.9; c.beta2 = 0.95; c.eps = 1e-8; c.weight_decay = 0.1;
    c.grad_clip = 1.0; c.warmup_steps = 0; c.total_steps = g.steps; c.schedule = LR_CONSTANT;
    return c;
}

/* ---- check ---- */

/* Write the CPU model's initial weights to DIR/gpu_train_init.safetensors and
 * read them back into host (n_params floats, layout order). */
static int roundtrip_safetensors(const model_t *m, float *host, char *path, size_t plen, char *err, size_t errlen) {
    snprintf(path, plen, "%s/gpu_train_init.%d.safetensors", g.dir, (int)getpid());
    st_writer_t *w = st_writer_new();
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        if (st_writer_add_f32(w, t->name, ST_F32, t->shape, t->ndim, host + t->offset)) {
            snprintf(err, errlen, "cannot add %s to the safetensors writer", t->name);
            st_writer_free(w);
            return -1;
        }
    }
    int rc = st_writer_save(w, path, err, errlen);
    st_writer_free(w);
    if (rc) return -1;
    memset(host, 0, m->n_params * sizeof(float));
    st_t *st;
    if (st_open(path, &st, err, errlen)) return -1;
    for (int i = 0; i < m->n_tensors && rc == 0; i++) {
        const model_tensor_t *t = &m->tensors[i];
        rc = st_read_f32(st, t->name, t->shape, t->ndim, host + t->offset, err, errlen);
    }
    st_close(st);
    return rc;
}

static int run_check(const llama_config_t *cfg) {
    char err[512], path[600];
    int B = (int)g.batch, T = (int)g.seq, N = B * T, S = (int)g.steps;
    printf("TAP version 13\n");
    char why[256];
    const backend_t *cpu = backend_cpu((int)g.threads), *gpu = cpu;
    if (g.backend == 0) {
        if (cuda_device_count(why, sizeof why) <= 0) {
            printf("ok - e2e/%s_losses_track_cpu # SKIP no GPU\n1..1\n# %s\n", cfg->name, why);
            return 0;
        }
        gpu = backend_cuda(0, err, sizeof err);
        if (!gpu) { printf("not ok - e2e/%s: %s\n1..1\n", cfg->name, err); return 1; }
        if (select_attention()) { printf("not ok - e2e/%s: --attention\n1..1\n", cfg->name); return 1; }
    }
    model_t mc, mg;
    if (model_create(&mc, cfg, cpu, B, T, false, err, sizeof err)) { printf("not ok - e2e: cpu model: %s\n1..1\n", err); return 1; }
    if (model_create(&mg, cfg, gpu, B, T, g.act_ckpt, err, sizeof err)) { printf("not ok - e2e: gpu model: %s\n1..1\n", err); return 1; }
    model_init_random(&mc, (uint64_t)g.seed);
    float *host = malloc(mc.n_params * sizeof(float));
    CHECK_ALLOC(host);
    model_get_params(&mc, host);
    if (roundtrip_safetensors(&mc, host, path, sizeof path, err, sizeof err)) {
        printf("not ok - e2e: safetensors round trip: %s\n1..1\n", err);
        return 1;
    }
    model_set_params(&mc, host);
    model_set_params(&mg, host);
    remove(path);
    free(host);
    optim_config_t oc = optim_cfg();
    optim_t oc_cpu, oc_gpu;
    if (optim_create(&oc_cpu, &oc, cpu, mc.n_params, err, sizeof err) || optim_create(&oc_gpu, &oc, gpu, mg.n_params, err, sizeof err)) {
        printf("not ok - e2e: optimizer: %s\n1..1\n", err);
        return 1;
    }
    int32_t *tok = malloc((size_t)N * sizeof(int32_t)), *tgt = malloc((size_t)N * sizeof(int32_t));
    CHECK_ALLOC(tok);
    CHECK_ALLOC(tgt);
    printf("# model %s (%zu params), B=%d T=%d, %d steps, lr %g, tolerance %g relative, %s against cpu\n", cfg->name,
           mc.n_params, B, T, S, g.lr, g.tol, gpu->name);
    printf("# %4s %12s %12s %10s %12s %12s\n", "step", "loss cpu", "loss gpu", "rel diff", "norm cpu", "norm gpu");
    double worst = 0, first_c = 0, last_c = 0;
    int bad = 0, worst_step = 1;
    for (int s = 0; s < S; s++) {
        make_batch(tok, tgt, B, T, cfg->vocab, (uint64_t)g.seed, s);
        double nc, ng;
        double lc = fwd_bwd(&mc, tok, tgt), lg = fwd_bwd(&mg, tok, tgt);
        if (s == 0) print_grad_diffs(&mc, &mg);
        update(&mc, &oc_cpu, g.lr, &nc);
        update(&mg, &oc_gpu, g.lr, &ng);
        double rel = fabs(lg - lc) / fabs(lc);
        if (!(rel <= g.tol)) bad++;
        if (!(rel <= worst)) { worst = rel; worst_step = s + 1; }
        if (s == 0) first_c = lc;
        last_c = lc;
        printf("# %4d %12.6f %12.6f %10.2e %12.5g %12.5g%s\n", s + 1, lc, lg, rel, nc, ng, rel <= g.tol ? "" : "  <-- out of tolerance");
    }
    printf("%s - e2e/%s_losses_track_cpu (%d steps, worst rel diff %.2e at step %d, tol %g)\n", bad ? "not ok" : "ok",
           cfg->name, S, worst, worst_step, g.tol);
    /* the run must actually train, or tracking proves little */
    bool learns = last_c < first_c;
    printf("%s - e2e/%s_loss_decreases (cpu %.4f -> %.4f)\n", learns ? "ok" : "not ok", cfg->name, first_c, last_c);
    printf("1..2\n");
    if (g.json) {
        FILE *f = fopen(g.json, "a");
        if (f) {
            fprintf(f, "{\"kind\":\"e2e\",\"model\":\"%s\",\"steps\":%d,\"worst_rel\":%.3e,\"ok\":%s}\n", cfg->name, S, worst,
                    bad || !learns ? "false" : "true");
            fclose(f);
        }
    }
    optim_destroy(&oc_cpu); optim_destroy(&oc_gpu);
    model_destroy(&mc); model_destroy(&mg);
    free(tok); free(tgt);
    return bad || !learns ? 1 : 0;
}

/* --attention on the GPU backend (after backend_cuda): prints the line
 * saying which path runs and why; non-zero when it cannot be had. */
static bool g_on_cudnn;
static int select_attention(void) {
    char msg[1536];
    int rc = cuda_attention_select(attention_names[g.attention], msg, sizeof msg);
    printf("%s%s\n", rc ? "gpu_train: " : "# ", msg);
    g_on_cudnn = rc == 0 && strstr(msg, "-> cudnn") != NULL;
    return rc;
}

/* ---- bench ---- */

static int run_bench(const llama_config_t *cfg) {
    char err[512];
    int B = (int)g.batch, T = (int)g.seq, N = B * T;
    const backend_t *gpu = backend_cuda(0, err, sizeof err);
    if (!gpu) { fprintf(stderr, "gpu_train: %s\n", err); return 2; }
    if (select_attention()) return 2;
    if (g.precision == 1 && cuda_set_precision(CUDA_PRECISION_FP8, err, sizeof err)) {
        fprintf(stderr, "gpu_train: %s\n", err);
        return 2;
    }
    model_t m;
    double t0 = clock_now_s();
    if (model_create(&m, cfg, gpu, B, T, g.act_ckpt, err, sizeof err)) { fprintf(stderr, "gpu_train: %s\n", err); return 1; }
    /* random weights on the GPU (2-D: N(0, 0.02^2); norms: 1) */
    for (int i = 0; i < m.n_tensors; i++) {
        const model_tensor_t *t = &m.tensors[i];
        cuda_fill_normal(m.master + t->offset, t->numel, t->ndim == 2 ? 0.f : 1.f, t->ndim == 2 ? 0.02f : 0.f,
                         (uint64_t)g.seed * 1000 + (uint64_t)i);
    }
    gpu->to_act(m.params, m.master, m.n_params);
    optim_config_t oc = optim_cfg();
    optim_t o;
    if (optim_create(&o, &oc, gpu, m.n_params, err, sizeof err)) { fprintf(stderr, "gpu_train: %s\n", err); return 1; }
    int32_t *tok = malloc((size_t)N * sizeof(int32_t)), *tgt = malloc((size_t)N * sizeof(int32_t));
    CHECK_ALLOC(tok);
    CHECK_ALLOC(tgt);
    cuda_sync();
    printf("bench: %s, %zu params, B=%d T=%d%s, %s GEMMs, set-up %.1f s\n", cfg->name, m.n_params, B, T,
           g.act_ckpt == MODEL_CKPT_SELECTIVE ? ", selective activation checkpointing" : g.act_ckpt ? ", activation checkpointing" : "", g.precision ? "fp8" : "bf16", clock_now_s() - t0);
    double norm, loss = 0;
    for (int s = 0; s < g.warmup; s++) {
        make_batch(tok, tgt, B, T, cfg->vocab, (uint64_t)g.seed, s);
        loss = train_step(&m, &o, tok, tgt, g.lr, &norm);
    }
    cuda_sync();
    double t1 = clock_now_s();
    for (int s = 0; s < g.steps; s++) {
        make_batch(tok, tgt, B, T, cfg->vocab, (uint64_t)g.seed, (int)g.warmup + s);
        loss = train_step(&m, &o, tok, tgt, g.lr, &norm);
    }
    cuda_sync();
    double dt = (clock_now_s() - t1) / (double)g.steps;
    double tps = N / dt, flops = llama_flops_per_token(cfg, T) * N / dt / 1e12;
    printf("bench: %.3f s/step, %.0f tokens/s, %.1f model TFLOP/s, MFU %.1f%% of %.0f (last loss %.4f)\n", dt, tps, flops,
           100.0 * flops / g.peak, g.peak, loss);
    if (g.precision == 1) {
        long n8, n16;
        cuda_fp8_counts(&n8, &n16);
        printf("bench: %ld GEMMs ran in fp8, %ld fell back to bf16 (shapes not multiples of 16)\n", n8, n16);
    }
    if (g.profile) {
        cuda_prof_reset();
        cuda_prof_enable(true);
        make_batch(tok, tgt, B, T, cfg->vocab, (uint64_t)g.seed, 999);
        train_step(&m, &o, tok, tgt, g.lr, &norm);
        cuda_prof_enable(false);
        const char *dev = cuda_device_name();
        bool emu = dev && strstr(dev, "gpu-emu");
        printf("bench: per op in one step: ms between events on the compute stream%s; calls; kernel launches; "
               "cuBLASLt matmuls; host waits; MB of operands read once and results written once\n",
               emu ? " (emulation, no GPU: the CPU's time, not a GPU's)" : "");
        cuda_prof_report(stdout);
    }
    if (g.json) {
        FILE *f = fopen(g.json, "a");
        if (f) {
            fprintf(f, "{\"kind\":\"bench\",\"impl\":\"%s\",\"model\":\"%s\",\"seq\":%d,\"batch\":%d,\"act_ckpt\":%s,\"ckpt_mode\":\"%s\","
                       "\"s_per_step\":%.4f,\"tokens_per_s\":%.1f,\"tflops\":%.2f,\"mfu\":%.4f}\n",
                    g.precision ? (g_on_cudnn ? "ballast-cudnn-fp8" : "ballast-fp8") : g_on_cudnn ? "ballast-cudnn" : "ballast",
                    cfg->name, T, B, g.act_ckpt ? "true" : "false",
                    g.act_ckpt == MODEL_CKPT_SELECTIVE ? "selective" : g.act_ckpt ? "full" : "none", dt, tps, flops, flops / g.peak);
            fclose(f);
        }
    }
    optim_destroy(&o);
    model_destroy(&m);
    free(tok); free(tgt);
    return 0;
}

int main(int argc, char **argv) {
    log_init("gpu_train", -1);
    char err[OPT_ERR_LEN];
    const char *pos[1];
    int npos = 0;
    int rc = opt_parse(options, N_OPTS, argc, argv, pos, 1, &npos, "usage: gpu_train check|bench [options]", err, sizeof err);
    if (rc < 0) { fprintf(stderr, "gpu_train: %s\n", err); return 2; }
    if (rc > 0) return 0;
    static const model_ckpt_t ckpt_modes[] = { MODEL_CKPT_NONE, MODEL_CKPT_FULL, MODEL_CKPT_FULL, MODEL_CKPT_SELECTIVE };
    g.act_ckpt = ckpt_modes[g.act_ckpt_choice];
    if (npos != 1 || (strcmp(pos[0], "check") && strcmp(pos[0], "bench"))) {
        fprintf(stderr, "gpu_train: say what to run: gpu_train check|bench [options] (--help lists them)\n");
        return 2;
    }
    if (g.precision == 1 && strcmp(pos[0], "bench")) {
        fprintf(stderr, "gpu_train: --precision fp8 is for bench (check compares bf16 with the CPU oracle; "
                "tests/gpu/check_fp8 checks the FP8 GEMMs)\n");
        return 2;
    }
    llama_config_t cfg;
    if (llama_config_resolve(g.model, &cfg, err, sizeof err)) { fprintf(stderr, "gpu_train: %s\n", err); return 2; }
    if (g.backend == 0 && cfg.head_dim != 64 && cfg.head_dim != 128) {
        fprintf(stderr, "gpu_train: model %s has head_dim %d; the CUDA attention supports 64 and 128 (try --model demo)\n",
                cfg.name, cfg.head_dim);
        return 2;
    }
    return strcmp(pos[0], "check") == 0 ? run_check(&cfg) : run_bench(&cfg);
}
