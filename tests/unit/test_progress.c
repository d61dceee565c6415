/* test_progress.c: the accounting of workers/train/progress.h against figures
 * derived by hand (TFLOP/s, MFU, tokens/s, time split, ETA), the console
 * lines, the JSON log fields, the non-finite loss policy and the metrics it
 * moves. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"
#include "workers/model/config.h"
#include "workers/train/progress.h"
#include "tests/unit/helpers.h"

static uint64_t rng_state;
static double rnd_unit(void) { return th_unit(th_splitmix64(&rng_state)); }

static void close_rel(double got, double want, double rel, const char *what) {
    cr_assert(fabs(got - want) <= rel * fabs(want), "%s: %.17g, expected %.17g", what, got, want);
}

/* ---- hand-derived FLOPs ----
 * llama2-7b: D 4096, L 32, H 32 (KV 32), Dh 128, FFN 11008, V 32000, untied.
 * One block: q,k,v,o 4 x 4096^2 = 67,108,864; MLP 3 x 4096 x 11008 =
 * 135,266,304; two RMSNorm weights 8,192: 202,383,360.
 * Matmul params N = 32 x 202,383,360 + lm_head 32000 x 4096 = 6,607,339,520.
 * 6N = 39,644,037,120; attention 12 x L x H x Dh x T at T = 4096:
 * 12 x 32 x 4096 x 4096 = 6,442,450,944. Sum: 46,086,488,064 FLOP/token. */
#define FPT_7B_4096 46086488064.0
/* tiny: D 64, L 2, H 4, KV 2, Dh 16, FFN 176, V 256: block 4096 + 2x2048 +
 * 4096 + 33792 + 128 = 46,208; N = 92,416 + 16,384 = 108,800; 6N = 652,800;
 * attention at T = 256: 12 x 2 x 4 x 16 x 256 = 393,216. Sum 1,046,016. */
#define FPT_TINY_256 1046016.0

Test(progress, flops_per_token_by_hand) {
    cr_assert_eq(llama_flops_per_token(llama_preset("llama2-7b"), 4096), FPT_7B_4096);
    cr_assert_eq(llama_flops_per_token(llama_preset("tiny"), 256), FPT_TINY_256);
}

Test(progress, peak_table) {
    cr_assert_eq(progress_peak_tflops("NVIDIA A100-SXM4-80GB"), 312);
    cr_assert_eq(progress_peak_tflops("NVIDIA A100-PCIE-40GB"), 312);
    cr_assert_eq(progress_peak_tflops("NVIDIA H100 80GB HBM3"), 989);
    cr_assert_eq(progress_peak_tflops("NVIDIA H200"), 989);
    cr_assert_eq(progress_peak_tflops("NVIDIA GH200 480GB"), 989);
    cr_assert_eq(progress_peak_tflops("NVIDIA H100 PCIe"), 756);
    cr_assert_eq(progress_peak_tflops("nvidia h100 nvl"), 989);
    cr_assert_eq(progress_peak_tflops("NVIDIA L40S"), 362);
    cr_assert_eq(progress_peak_tflops("NVIDIA L40"), 181);
    cr_assert_eq(progress_peak_tflops("NVIDIA H20"), 148);
    cr_assert_eq(progress_peak_tflops("NVIDIA B200"), 2250);
    cr_assert_lt(progress_peak_tflops("cpu"), 0);
    cr_assert_lt(progress_peak_tflops("Tesla V100-SXM2-16GB"), 0);
    cr_assert_lt(progress_peak_tflops(NULL), 0);
}

/* 32 H100s, 256 x 4096 tokens a step, 16 s a step:
 * 1,048,576 / 16 = 65,536 tok/s; / 32 = 2,048 per GPU;
 * 46,086,488,064 x 2,048 / 1e12 = 94.385127555072 TFLOP/s per GPU;
 * MFU = 94.385127555072 / 989 = 0.09543491... */
Test(progress, tflops_and_mfu_7b_on_h100) {
    close_rel(progress_tflops_per_gpu(FPT_7B_4096, 1048576, 16, 32), 94.385127555072, 1e-15, "tflops");
    char err[256];
    progress_cfg_t cfg = { .total_steps = 1000, .tokens_per_step = 1048576, .flops_per_token = FPT_7B_4096,
                           .n_gpus = 32, .device = "NVIDIA H100 80GB HBM3" };
    progress_t *p = progress_new(&cfg, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    progress_step_t s;
    progress_step_init(&s, 1);
    s.loss = 2.5;
    s.step_s = 16;
    progress_stats_t st;
    cr_assert_eq(progress_record(p, &s, &st, err, sizeof err), 0);
    cr_assert_eq(st.tokens_per_s, 65536);
    cr_assert_eq(st.tokens_per_s_per_gpu, 2048);
    close_rel(st.tflops_per_gpu, 94.385127555072, 1e-15, "tflops");
    close_rel(st.mfu, 94.385127555072 / 989, 1e-15, "mfu");
    close_rel(st.mfu, 0.0954349115824793, 1e-12, "mfu literal");
    progress_free(p);
}

/* CPU: no peak in the table (MFU n/a) unless a measured one is given. */
Test(progress, cpu_mfu_na_or_measured) {
    char err[256];
    progress_cfg_t cfg = { .total_steps = 10, .tokens_per_step = 4 * 256, .flops_per_token = FPT_TINY_256,
                           .n_gpus = 2, .device = "cpu" };
    progress_t *p = progress_new(&cfg, err, sizeof err);
    progress_step_t s;
    progress_step_init(&s, 1);
    s.step_s = 0.5;
    progress_stats_t st;
    progress_record(p, &s, &st, err, sizeof err);
    /* 1,046,016 x 1024 / 0.5 / 2 / 1e12 = 0.001071120384 */
    close_rel(st.tflops_per_gpu, 0.001071120384, 1e-14, "cpu tflops");
    cr_assert(isnan(st.mfu));
    char line[512];
    progress_format_line(p, &s, &st, false, line, sizeof line);
    cr_assert(strstr(line, "MFU n/a"), "%s", line);
    progress_free(p);
    cfg.peak_tflops = 0.004; /* measured peak of this CPU */
    p = progress_new(&cfg, err, sizeof err);
    progress_record(p, &s, &st, err, sizeof err);
    close_rel(st.mfu, 0.001071120384 / 0.004, 1e-14, "cpu mfu");
    progress_format_line(p, &s, &st, false, line, sizeof line);
    cr_assert(strstr(line, "MFU 26.8%"), "%s", line); /* 0.267780096 */
    progress_free(p);
}

Test(progress, time_split) {
    char err[256];
    progress_cfg_t cfg = { .total_steps = 10, .tokens_per_step = 1000, .flops_per_token = 1e6, .n_gpus = 1 };
    progress_t *p = progress_new(&cfg, err, sizeof err);
    progress_step_t s;
    progress_stats_t st;
    progress_step_init(&s, 1);
    s.step_s = 2.0;
    s.phase_s[PROGRESS_COMM] = 0.25;
    s.phase_s[PROGRESS_OFFLOAD] = 0.125;
    s.phase_s[PROGRESS_DATA] = 0.0625;
    progress_record(p, &s, &st, err, sizeof err);
    cr_assert_eq(st.phase_s[PROGRESS_COMPUTE], 1.5625, "the rest: 2 - 0.4375");
    cr_assert_eq(st.phase_s[PROGRESS_COMM], 0.25);
    cr_assert_eq(st.phase_s[PROGRESS_OFFLOAD], 0.125);
    cr_assert_eq(st.phase_s[PROGRESS_DATA], 0.0625);
    progress_step_init(&s, 2);
    s.step_s = 2.0;
    s.phase_s[PROGRESS_COMPUTE] = 1.0; /* reported: kept, the rest is unattributed */
    s.phase_s[PROGRESS_DATA] = 0.5;
    progress_record(p, &s, &st, err, sizeof err);
    cr_assert_eq(st.phase_s[PROGRESS_COMPUTE], 1.0);
    cr_assert_eq(st.phase_s[PROGRESS_DATA], 0.5);
    progress_free(p);
}

/* ETA = steps left x mean of the last 20 step times, the process's first
 * step (warm-up) left out once there is a second. */
Test(progress, eta) {
    char err[256];
    progress_cfg_t cfg = { .total_steps = 10, .tokens_per_step = 100, .flops_per_token = 1, .n_gpus = 1 };
    progress_t *p = progress_new(&cfg, err, sizeof err);
    progress_step_t s;
    progress_stats_t st;
    const double dt[] = { 5, 1, 2, 3 };
    for (int i = 0; i < 4; i++) {
        progress_step_init(&s, i + 1);
        s.step_s = dt[i];
        progress_record(p, &s, &st, err, sizeof err);
        if (i == 0) cr_assert_eq(st.eta_s, 9 * 5.0, "only the first step known: 9 x 5 s");
    }
    cr_assert_eq(st.eta_s, 6 * 2.0, "6 steps left x mean(1, 2, 3)");
    progress_free(p);

    /* random step times over a resumed run longer than the window */
    rng_state = 4242;
    cfg.start_step = 100;
    cfg.total_steps = 500;
    p = progress_new(&cfg, err, sizeof err);
    double hist[64];
    for (int i = 0; i < 60; i++) {
        hist[i] = 0.1 + rnd_unit();
        progress_step_init(&s, 101 + i);
        s.step_s = hist[i];
        progress_record(p, &s, &st, err, sizeof err);
    }
    double mean = 0;
    for (int i = 40; i < 60; i++) mean += hist[i];
    mean /= 20;
    close_rel(st.eta_s, (500 - 160) * mean, 1e-12, "eta over the window");
    progress_step_init(&s, 500);
    s.step_s = 1;
    progress_record(p, &s, &st, err, sizeof err);
    cr_assert_eq(st.eta_s, 0);
    progress_free(p);
}

static json_t *parse_line(const char *line) {
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    cr_assert_not_null(o, "not JSON: %s (%s)", line, je.text);
    return o;
}

static double num(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    cr_assert_not_null(v, "missing field %s", k);
    cr_assert(json_is_number(v), "%s is not a number", k);
    return json_number_value(v);
}

Test(progress, json_lines_fields) {
    char err[256];
    char *buf = NULL;
    size_t blen = 0;
    FILE *js = open_memstream(&buf, &blen);
    progress_cfg_t cfg = { .total_steps = 50, .tokens_per_step = 1048576, .flops_per_token = FPT_7B_4096,
                           .n_gpus = 32, .device = "NVIDIA A100-SXM4-80GB", .json = js };
    progress_t *p = progress_new(&cfg, err, sizeof err);
    static int64_t i_val = 7;
    static const char *s_val = "data/*.bin";
    const opt_t opts[] = {
        { "steps", OPT_INT, "7", 1, 100, NULL, "steps", &i_val },
        { "data", OPT_STRING, NULL, 0, 0, NULL, "data", &s_val },
    };
    cr_assert_eq(progress_write_settings(p, opts, 2, "llama2-7b", 6738415616, 1.25, err, sizeof err), 0);
    rng_state = 99;
    double loss[3], gn[3];
    for (int i = 0; i < 3; i++) {
        progress_step_t s;
        progress_step_init(&s, i + 1);
        s.loss = loss[i] = 2 + rnd_unit();
        s.lr = 3e-4 * (i + 1);
        s.grad_norm = gn[i] = rnd_unit();
        s.step_s = 8;
        s.phase_s[PROGRESS_COMM] = 0.5;
        s.offload_to_host_bytes = 1000 + i;
        s.offload_to_device_bytes = 2000 + i;
        if (i == 2) { s.mem_gpu_bytes = 123456789; s.mem_host_bytes = 987654321; s.mem_gpu_peak_bytes = 2222; }
        cr_assert_eq(progress_record(p, &s, NULL, err, sizeof err), 0, "%s", err);
    }
    fclose(js);
    char *save = NULL;
    char *line = strtok_r(buf, "\n", &save);
    json_t *h = parse_line(line);
    cr_assert_str_eq(json_string_value(json_object_get(h, "kind")), "settings");
    json_t *set = json_object_get(h, "settings");
    cr_assert_str_eq(json_string_value(json_object_get(set, "steps")), "7");
    cr_assert_str_eq(json_string_value(json_object_get(set, "data")), "data/*.bin");
    cr_assert_eq(num(h, "entropy_nats"), 1.25);
    cr_assert_eq(num(h, "peak_tflops"), 312);
    cr_assert_eq(num(h, "n_gpus"), 32);
    cr_assert_eq(num(h, "params"), 6738415616.0);
    cr_assert_str_eq(json_string_value(json_object_get(h, "model")), "llama2-7b");
    json_decref(h);
    for (int i = 0; i < 3; i++) {
        line = strtok_r(NULL, "\n", &save);
        cr_assert_not_null(line, "step line %d missing", i + 1);
        json_t *o = parse_line(line);
        cr_assert_eq(num(o, "step"), i + 1);
        cr_assert_eq(num(o, "loss"), loss[i], "loss written at full precision");
        cr_assert_eq(num(o, "grad_norm"), gn[i]);
        cr_assert_eq(num(o, "lr"), 3e-4 * (i + 1));
        cr_assert_eq(num(o, "tokens"), 1048576.0 * (i + 1));
        cr_assert_eq(num(o, "tokens_per_s"), 131072);
        cr_assert_eq(num(o, "tokens_per_s_per_gpu"), 4096);
        /* 46,086,488,064 x 4096 / 1e12 = 188.770255110144 */
        close_rel(num(o, "tflops_per_gpu"), 188.770255110144, 1e-15, "json tflops");
        close_rel(num(o, "mfu"), 188.770255110144 / 312, 1e-15, "json mfu");
        cr_assert_eq(num(o, "step_s"), 8);
        cr_assert_eq(num(o, "compute_s"), 7.5);
        cr_assert_eq(num(o, "comm_s"), 0.5);
        cr_assert_eq(num(o, "offload_wait_s"), 0);
        cr_assert_eq(num(o, "data_s"), 0);
        cr_assert_eq(num(o, "eta_s"), (50.0 - (i + 1)) * 8);
        cr_assert_geq(num(o, "elapsed_s"), 0);
        cr_assert_eq(num(o, "offload_to_host_bytes"), 1000 + i);
        cr_assert_eq(num(o, "offload_to_device_bytes"), 2000 + i);
        if (i < 2) {
            cr_assert_null(json_object_get(o, "mem_gpu_bytes"), "unknown memory is left out");
            cr_assert_null(json_object_get(o, "mem_host_bytes"));
        } else {
            cr_assert_eq(num(o, "mem_gpu_bytes"), 123456789);
            cr_assert_eq(num(o, "mem_gpu_peak_bytes"), 2222);
            cr_assert_eq(num(o, "mem_host_bytes"), 987654321);
        }
        cr_assert_null(json_object_get(o, "skipped"));
        json_decref(o);
    }
    cr_assert_null(strtok_r(NULL, "\n", &save));
    progress_free(p);
    free(buf);
}

Test(progress, nonfinite_policy) {
    char err[256], msg[512];
    char *buf = NULL;
    size_t blen = 0;
    FILE *js = open_memstream(&buf, &blen);
    metrics_registry_t *r = metrics_registry_new();
    progress_cfg_t cfg = { .total_steps = 100, .tokens_per_step = 10, .flops_per_token = 1, .n_gpus = 1, .json = js,
                           .metrics = r, .rank = 0 };
    progress_t *p = progress_new(&cfg, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    cr_assert_eq(progress_check_loss(p, 5, 3.25, false, msg, sizeof msg), PROGRESS_LOSS_OK);
    cr_assert_eq(progress_check_loss(p, 17, NAN, false, msg, sizeof msg), PROGRESS_LOSS_STOP);
    cr_assert(strstr(msg, "step 17") && strstr(msg, "NaN") && strstr(msg, "--lr") && strstr(msg, "--skip-nonfinite"),
              "%s", msg);
    cr_assert_eq(progress_check_loss(p, 18, INFINITY, true, msg, sizeof msg), PROGRESS_LOSS_SKIP);
    cr_assert(strstr(msg, "step 18") && strstr(msg, "+inf") && strstr(msg, "skipping"), "%s", msg);
    /* a skipped step is logged with loss null and "skipped": true */
    progress_step_t s;
    progress_step_init(&s, 18);
    s.loss = INFINITY;
    s.skipped = true;
    s.step_s = 1;
    cr_assert_eq(progress_record(p, &s, NULL, err, sizeof err), 0);
    fflush(js);
    json_t *o = parse_line(buf);
    cr_assert(json_is_null(json_object_get(o, "loss")));
    cr_assert(json_is_true(json_object_get(o, "skipped")));
    json_decref(o);
    /* a finite loss resets the run; then 10 in a row stop even with skipping */
    cr_assert_eq(progress_check_loss(p, 19, 3.0, true, msg, sizeof msg), PROGRESS_LOSS_OK);
    for (int i = 1; i < PROGRESS_MAX_NONFINITE_RUN; i++)
        cr_assert_eq(progress_check_loss(p, 19 + i, NAN, true, msg, sizeof msg), PROGRESS_LOSS_SKIP, "i=%d", i);
    cr_assert_eq(progress_check_loss(p, 29, NAN, true, msg, sizeof msg), PROGRESS_LOSS_STOP);
    cr_assert(strstr(msg, "step 29") && strstr(msg, "10 steps in a row"), "%s", msg);
    char *t = NULL;
    metrics_render(r, &t, NULL);
    /* 1 (step 17) + 1 (18) + 10 (20..29) */
    cr_assert(strstr(t, "ballast_train_nonfinite_steps_total{rank=\"0\"} 12\n"), "%s", t);
    free(t);
    progress_free(p);
    fclose(js);
    free(buf);
    metrics_registry_free(r);
}

/* The per-device figures name their unit: a CPU rank is no GPU. */
Test(progress, units_per_backend) {
    const char *devs[] = { "cpu", "NVIDIA H100 80GB HBM3" }, *unit[] = { "rank", "GPU" };
    for (int d = 0; d < 2; d++) {
        char err[256];
        char *buf = NULL;
        size_t blen = 0;
        FILE *con = open_memstream(&buf, &blen);
        progress_cfg_t cfg = { .total_steps = 2, .tokens_per_step = 100, .flops_per_token = 1e6, .n_gpus = 2,
                               .device = devs[d], .log_every = 1, .console = con, .live = 0 };
        progress_t *p = progress_new(&cfg, err, sizeof err);
        cr_assert(p, "%s", err);
        progress_step_t s;
        progress_step_init(&s, 1);
        s.loss = 3.5;
        s.step_s = 0.5;
        progress_record(p, &s, NULL, err, sizeof err);
        progress_free(p);
        fclose(con);
        char a[32], b[32], other[32];
        snprintf(a, sizeof a, " tok/s/%s |", unit[d]);
        snprintf(b, sizeof b, " TFLOP/s/%s |", unit[d]);
        snprintf(other, sizeof other, "/%s |", unit[1 - d]);
        cr_assert(strstr(buf, a) && strstr(buf, b) && !strstr(buf, other), "device %s: %s", devs[d], buf);
        free(buf);
    }
}

/* Plain lines at the first step, every log_every-th and the last; the live
 * line rewrites itself with a carriage return and ends with one newline. */
Test(progress, console_plain_and_live) {
    char err[256];
    char *buf = NULL;
    size_t blen = 0;
    FILE *con = open_memstream(&buf, &blen);
    progress_cfg_t cfg = { .total_steps = 10, .tokens_per_step = 100, .flops_per_token = 1e6, .n_gpus = 1,
                           .log_every = 3, .console = con, .live = 0 };
    progress_t *p = progress_new(&cfg, err, sizeof err);
    for (int i = 1; i <= 10; i++) {
        progress_step_t s;
        progress_step_init(&s, i);
        s.loss = 10 - i * 0.5;
        s.step_s = 0.25;
        progress_record(p, &s, NULL, err, sizeof err);
    }
    progress_free(p);
    fclose(con);
    int steps[8], n = 0;
    char *save = NULL;
    for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cr_assert_lt(n, 8, "too many lines");
        cr_assert_eq(sscanf(l, "step %d/10", &steps[n]), 1, "%s", l);
        cr_assert(strstr(l, "| 400 tok/s | 400 tok/s/GPU |") && strstr(l, "| 0.250 s/step | ETA"), "%s", l);
        size_t ll = strlen(l);
        cr_assert(strstr(l, "| elapsed ") && ll > 2 && strcmp(l + ll - 2, " s") == 0, "ends with the elapsed time: %s", l);
        n++;
    }
    const int want[] = { 1, 3, 6, 9, 10 };
    cr_assert_eq(n, 5);
    for (int i = 0; i < 5; i++) cr_assert_eq(steps[i], want[i]);
    cr_assert_null(strchr(buf, '\r'));
    free(buf);

    buf = NULL;
    con = open_memstream(&buf, &blen);
    cfg.console = con;
    cfg.live = 1;
    p = progress_new(&cfg, err, sizeof err);
    for (int i = 1; i <= 10; i++) {
        progress_step_t s;
        progress_step_init(&s, i);
        s.loss = 1;
        s.step_s = 0.25;
        s.offload_to_host_bytes = 3000000000ull;
        progress_record(p, &s, NULL, err, sizeof err);
    }
    fflush(con);
    cr_assert_null(strchr(buf, '\n'), "live mode does not scroll");
    cr_assert_eq(buf[0], '\r');
    cr_assert(strstr(buf, "step 10/10"), "the last step is always drawn: %s", buf);
    cr_assert(strstr(buf, "offload 12.00 GB/s"), "%s", buf);
    progress_free(p);
    fclose(con);
    cr_assert_eq(buf[strlen(buf) - 1], '\n');
    free(buf);
}

Test(progress, metrics_move) {
    char err[256];
    metrics_registry_t *r = metrics_registry_new();
    cr_assert_eq(metrics_register_build_info(r, err, sizeof err), 0, "%s", err);
    progress_cfg_t cfg = { .total_steps = 10, .tokens_per_step = 4096, .flops_per_token = 1e9, .n_gpus = 4,
                           .device = "NVIDIA H200", .metrics = r, .rank = 2 };
    progress_t *p = progress_new(&cfg, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    /* the offload client's side: it registers the same families and feeds them */
    static const char *const dir[] = { "direction" };
    metric_family_t *off = metrics_register(r, METRIC_COUNTER, "ballast_offload_bytes_total", "bytes", dir, 1, NULL, 0,
                                            err, sizeof err);
    cr_assert_not_null(off, "the client registers the family progress made: %s", err);
    metric_t *to = metrics_series(off, (const char *[]){ "to_service" });
    metric_t *from = metrics_series(off, (const char *[]){ "from_service" });
    metric_t *wait = metrics_counter(r, "ballast_offload_wait_seconds_total", "waits", err, sizeof err);
    cr_assert(to && from && wait, "%s", err);
    for (int i = 1; i <= 3; i++) {
        progress_totals_t a, b;
        progress_totals(p, &a);
        metric_add_u64(to, 100 * (uint64_t)i);
        metric_add_u64(from, 50);
        metric_add(wait, 0.0625);
        progress_totals(p, &b);
        progress_step_t s;
        progress_step_init(&s, i);
        progress_step_since(&s, &a, &b);
        cr_assert_eq(s.offload_to_host_bytes, 100 * (uint64_t)i, "the step's bytes are the counter's difference");
        cr_assert_eq(s.offload_to_device_bytes, 50);
        cr_assert_eq(s.phase_s[PROGRESS_OFFLOAD], 0.0625);
        s.loss = 4.0 - i;
        s.lr = 0.5;
        s.step_s = 0.5;
        s.phase_s[PROGRESS_DATA] = 0.125;
        s.phase_s[PROGRESS_COMM] = 0; /* no communicator in this test */
        progress_stats_t st;
        progress_record(p, &s, &st, err, sizeof err);
        cr_assert_eq(st.offload_bytes_per_s, (100.0 * i + 50) / 0.5);
    }
    char *t = NULL;
    metrics_render(r, &t, NULL);
    const char *want[] = {
        "ballast_train_steps_total{rank=\"2\"} 3\n",
        "ballast_train_tokens_total{rank=\"2\"} 3072\n", /* 3 x 4096 / 4 */
        "ballast_train_step{rank=\"2\"} 3\n",
        "ballast_train_loss{rank=\"2\"} 1\n",
        "ballast_train_step_duration_seconds_bucket{rank=\"2\",le=\"0.25\"} 0\n",
        "ballast_train_step_duration_seconds_bucket{rank=\"2\",le=\"0.5\"} 3\n",
        "ballast_train_step_duration_seconds_count{rank=\"2\"} 3\n",
        "ballast_train_tokens_per_second{rank=\"2\"} 2048\n", /* 4096 / 0.5 / 4 */
        "ballast_train_model_flops_per_second{rank=\"2\"} 2048000000000\n",
        "ballast_train_job_tokens_per_second{rank=\"2\"} 8192\n",
        "ballast_offload_bytes_total{rank=\"2\",direction=\"to_service\"} 600\n", /* 100 + 200 + 300, not added twice */
        "ballast_offload_bytes_total{rank=\"2\",direction=\"from_service\"} 150\n",
        "ballast_offload_wait_seconds_total{rank=\"2\"} 0.1875\n",
        "ballast_train_time_seconds_total{rank=\"2\",part=\"data\"} 0.375\n",
        "ballast_train_time_seconds_total{rank=\"2\",part=\"offload\"} 0.1875\n",
        "ballast_train_time_seconds_total{rank=\"2\",part=\"compute\"} 0.9375\n", /* 3 x (0.5 - 0.125 - 0.0625) */
        "ballast_build_info{rank=\"2\",version=",
        "# TYPE ballast_mfu_ratio gauge\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) cr_assert(strstr(t, want[i]), "no %s in\n%s", want[i], t);
    /* 2.048 TFLOP/s over 989 */
    char mfu[128], v[64];
    metrics_format_value(2.048 / 989, v, sizeof v);
    snprintf(mfu, sizeof mfu, "ballast_mfu_ratio{rank=\"2\"} %s\n", v);
    cr_assert(strstr(t, mfu), "no %s in\n%s", mfu, t);
    cr_assert_null(strstr(t, "ballast_gpu_memory_used_bytes{"), "memory not known yet");
    free(t);
    progress_free(p);
    metrics_registry_free(r);
}

Test(progress, entropy_floor_sidecar) {
    char dir[64];
    th_tmpdir(dir, sizeof dir, NULL, "progress");
    char shard[256], side[300];
    snprintf(shard, sizeof shard, "%s/train_000.bin", dir);
    snprintf(side, sizeof side, "%s.json", shard);
    th_write_str(shard, "");
    cr_assert(isnan(progress_entropy_floor(shard)), "no sidecar yet");
    th_write_str(side, "{\"generator\": \"markov1\", \"entropy_nats\": 1.0986122886681098}\n");
    cr_assert_eq(progress_entropy_floor(shard), 1.0986122886681098);
    char pat[256];
    snprintf(pat, sizeof pat, "%s/train_*.bin", dir);
    cr_assert_eq(progress_entropy_floor(pat), 1.0986122886681098);
    th_rm_rf(dir);
}

Test(progress, rss_tracks_touched_memory) {
    int64_t before = progress_rss_bytes();
    cr_assert_gt(before, 0);
    size_t n = 64u << 20;
    char *p = malloc(n);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i += 4096) p[i] = (char)i | 1; /* touch every page */
    int64_t after = progress_rss_bytes();
    cr_assert_geq(after - before, (int64_t)(n * 9 / 10), "rss %lld -> %lld after touching 64 MiB", (long long)before,
                  (long long)after);
    free(p);
}
