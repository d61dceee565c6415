/* progress.c: per-step accounting (tokens/s, TFLOP/s, MFU, time split,
 * ETA), the console line, the JSON log and the training metrics.
 *
 * Relies on common/metrics.h for the Prometheus side and jansson for the
 * JSON lines (escaping and number formatting done by the library). */
#include "workers/train/progress.h"

#include "workers/comm/comm.h"

#include <ctype.h>
#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "workers/train/tensorboard.h"
#include "log.h"

#define ETA_WINDOW 20          /* steps averaged for the ETA */
#define LIVE_REDRAW_S 0.1      /* live line: at most ten redraws a second */

struct progress {
    progress_cfg_t cfg;
    double peak;               /* per-GPU peak TFLOP/s in use, < 0 = unknown */
    double t0;                 /* clock_now_s() at creation */
    bool live;                 /* drawing one rewritten line */
    bool drawn;                /* a live line is on screen */
    double last_draw;          /* clock_now_s() of the last live redraw */
    int64_t n_recorded;        /* steps recorded by this process */
    double first_step_s;       /* the first one (warm-up), used alone until a second arrives */
    double win[ETA_WINDOW];    /* step seconds of the recent steps, after the first */
    int n_win, i_win;
    int nonfinite_run;         /* consecutive non-finite losses */
    double val_pending;        /* progress_set_val_loss for the next step; NaN: none */
    double val_last;           /* the last validation loss recorded; NaN: none yet */
    int64_t nonfinite_total;
    uint64_t offload_total;    /* bytes, both directions, whole run */
    /* metrics; NULL without a registry */
    metric_t *m_steps, *m_tokens, *m_step_s, *m_step, *m_loss, *m_val, *m_lr, *m_gnorm, *m_tps, *m_tps_total, *m_flops, *m_mfu;
    metric_t *m_phase[PROGRESS_NPHASES], *m_nonfinite, *m_mem_gpu, *m_mem_host;
};

const char *const PROGRESS_TB_TAGS[PROGRESS_TB_NTAGS] = {
    "train/loss", "val/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/tokens_per_s_per_gpu",
    "perf/mfu", "perf/step_s", "offload/to_host_bytes", "offload/to_device_bytes", "offload/wait_s",
};

static const char *const PHASE_NAMES[PROGRESS_NPHASES] = { "compute", "comm", "offload", "data" };
static const char *const PHASE_JSON[PROGRESS_NPHASES] = { "compute_s", "comm_s", "offload_wait_s", "data_s" };

/* ---- the arithmetic ---- */

/* Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets.
 * More specific names first: an H100 PCIe card is slower than the SXM part. */
static const struct { const char *match; double tflops; } PEAKS[] = {
    { "h100 pcie", 756 }, { "h100", 989 }, { "h200", 989 }, { "h800", 989 }, { "h20", 148 },
    { "gb200", 2500 },    { "b200", 2250 }, { "b100", 1750 },
    { "a100", 312 },      { "a800", 312 },  { "l40s", 362 },  { "l40", 181 },
};

double progress_peak_tflops(const char *device) {
    if (!device || !*device) return -1;
    char low[256];
    size_t i = 0;
    for (; device[i] && i + 1 < sizeof low; i++) low[i] = (char)tolower((unsigned char)device[i]);
    low[i] = 0;
    for (size_t k = 0; k < sizeof PEAKS / sizeof PEAKS[0]; k++)
        if (strstr(low, PEAKS[k].match)) return PEAKS[k].tflops;
    return -1; /* "cpu" and devices not in the table */
}

double progress_tflops_per_gpu(double flops_per_token, double tokens, double seconds, int n_gpus) {
    if (!(seconds > 0) || n_gpus < 1) return NAN;
    return flops_per_token * tokens / seconds / n_gpus / 1e12;
}

double progress_entropy_floor(const char *data_path) {
    if (!data_path || !*data_path) return NAN;
    char first[4096];
    glob_t g;
    if (glob(data_path, 0, NULL, &g) == 0 && g.gl_pathc > 0) snprintf(first, sizeof first, "%s", g.gl_pathv[0]);
    else snprintf(first, sizeof first, "%s", data_path);
    globfree(&g);
    char side[4200];
    snprintf(side, sizeof side, "%s.json", first);
    if (access(side, R_OK) != 0) return NAN;
    json_error_t je;
    json_t *root = json_load_file(side, 0, &je);
    double h = NAN;
    json_t *v = root ? json_object_get(root, "entropy_nats") : NULL;
    if (v && json_is_number(v)) h = json_number_value(v);
    json_decref(root);
    return h;
}

int64_t progress_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long long size = 0, rss = -1;
    if (fscanf(f, "%lld %lld", &size, &rss) != 2) rss = -1;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return rss >= 0 && page > 0 ? (int64_t)rss * page : -1;
}

/* ---- setup ---- */

static int register_metrics(progress_t *p, char *err, size_t errlen) {
    metrics_registry_t *r = p->cfg.metrics;
    static const double step_buckets[] = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120 };
    static const char *const L_PART[] = { "part" };
    static const char *const L_DIR[] = { "direction" };
    /* rank="N" is the registry's constant label: it also lands on the
     * families other modules register (the offload client's) */
    char rank[24];
    snprintf(rank, sizeof rank, "%d", p->cfg.rank);
    if (metrics_set_const_label(r, "rank", rank, err, errlen)) return -1;
#define FAM(var, type, name, help, labels, nl, b, nb)                                              \
    metric_family_t *var = metrics_register(r, type, name, help, labels, nl, b, nb, err, errlen);  \
    if (!var) return -1;
    FAM(steps, METRIC_COUNTER, "ballast_train_steps_total", "Optimizer steps finished (skipped ones included)", NULL, 0, NULL, 0)
    FAM(tokens, METRIC_COUNTER, "ballast_train_tokens_total",
        "Training tokens processed, this rank's share (global tokens / world size); sum over ranks for the total", NULL, 0, NULL, 0)
    FAM(step_s, METRIC_HISTOGRAM, "ballast_train_step_duration_seconds", "Wall time of one optimizer step", NULL, 0,
        step_buckets, (int)(sizeof step_buckets / sizeof step_buckets[0]))
    FAM(step, METRIC_GAUGE, "ballast_train_step", "Last optimizer step finished", NULL, 0, NULL, 0)
    FAM(loss, METRIC_GAUGE, "ballast_train_loss", "Mean training loss of the last step (nats per token)", NULL, 0, NULL, 0)
    FAM(val, METRIC_GAUGE, "ballast_train_val_loss",
        "Mean validation loss of the last evaluation (nats per token; --val-data)", NULL, 0, NULL, 0)
    FAM(lr, METRIC_GAUGE, "ballast_train_learning_rate", "Learning rate of the last step", NULL, 0, NULL, 0)
    FAM(gnorm, METRIC_GAUGE, "ballast_train_grad_norm", "Global gradient norm of the last step, before clipping", NULL, 0, NULL, 0)
    FAM(tps, METRIC_GAUGE, "ballast_train_tokens_per_second", "Training tokens per second of the last step, per GPU (rank)", NULL, 0, NULL, 0)
    FAM(tpst, METRIC_GAUGE, "ballast_train_job_tokens_per_second", "Training tokens per second of the last step, whole job (all ranks)", NULL, 0, NULL, 0)
    FAM(flops, METRIC_GAUGE, "ballast_train_model_flops_per_second",
        "Model FLOP/s per GPU (rank) of the last step (6 x params x tokens + attention; recomputation not counted)", NULL, 0, NULL, 0)
    FAM(phase, METRIC_COUNTER, "ballast_train_time_seconds_total",
        "Step wall time by part: compute, and the exposed (not overlapped) comm, offload and data time", L_PART, 1, NULL, 0)
    FAM(off, METRIC_COUNTER, "ballast_offload_bytes_total",
        "Bytes copied between this rank and ballastd, by direction (to_service, from_service)", L_DIR, 1, NULL, 0)
    FAM(offw, METRIC_COUNTER, "ballast_offload_wait_seconds_total",
        "Seconds this rank waited on copies to or from ballastd that compute did not hide", NULL, 0, NULL, 0)
    FAM(nonf, METRIC_COUNTER, "ballast_train_nonfinite_steps_total", "Steps whose loss was NaN or infinite", NULL, 0, NULL, 0)
    if (p->peak > 0) { /* absent, not NaN or 0, when there is no peak */
        FAM(mfu, METRIC_GAUGE, "ballast_mfu_ratio",
            "Model FLOPs utilization of the last step: model FLOP/s over the device's dense bf16 peak", NULL, 0, NULL, 0)
        p->m_mfu = metrics_series(mfu, NULL);
    }
#undef FAM
    p->m_steps = metrics_series(steps, NULL);
    p->m_tokens = metrics_series(tokens, NULL);
    p->m_step_s = metrics_series(step_s, NULL);
    p->m_step = metrics_series(step, NULL);
    p->m_loss = metrics_series(loss, NULL);
    p->m_val = metrics_series(val, NULL);
    p->m_lr = metrics_series(lr, NULL);
    p->m_gnorm = metrics_series(gnorm, NULL);
    p->m_tps = metrics_series(tps, NULL);
    p->m_tps_total = metrics_series(tpst, NULL);
    p->m_flops = metrics_series(flops, NULL);
    for (int i = 0; i < PROGRESS_NPHASES; i++) p->m_phase[i] = metrics_series(phase, (const char *[]){ PHASE_NAMES[i] });
    /* the offload client adds to these; they show (at 0) without offload too */
    metric_t *to = metrics_series(off, (const char *[]){ "to_service" });
    metric_t *from = metrics_series(off, (const char *[]){ "from_service" });
    p->m_nonfinite = metrics_series(nonf, NULL);
    if (!p->m_steps || !p->m_tokens || !p->m_step_s || !p->m_phase[PROGRESS_NPHASES - 1] || !to || !from ||
        !metrics_series(offw, NULL) || !p->m_nonfinite) {
        snprintf(err, errlen, "out of memory creating the training metrics");
        return -1;
    }
    return 0;
}

progress_t *progress_new(const progress_cfg_t *cfg, char *err, size_t errlen) {
    progress_t *p = calloc(1, sizeof *p);
    if (!p) { snprintf(err, errlen, "out of memory"); return NULL; }
    p->cfg = *cfg;
    p->val_pending = p->val_last = NAN;
    if (p->cfg.n_gpus < 1) p->cfg.n_gpus = 1;
    if (p->cfg.log_every < 1) p->cfg.log_every = 1;
    p->peak = cfg->peak_tflops > 0 ? cfg->peak_tflops : progress_peak_tflops(cfg->device);
    p->t0 = clock_now_s();
    p->live = cfg->console && (cfg->live == 1 || (cfg->live < 0 && isatty(fileno(cfg->console))));
    if (cfg->metrics && register_metrics(p, err, errlen) != 0) { free(p); return NULL; }
    return p;
}

/* Flush the console; when its reader is gone (EPIPE: the end of a pipe
 * closed), stop writing to it and say so once on stderr: training goes on. */
static void console_flush(progress_t *p) {
    if (!p->cfg.console) return;
    if (fflush(p->cfg.console) == 0 && !ferror(p->cfg.console)) return;
    if (errno != EPIPE) { clearerr(p->cfg.console); return; }
    p->cfg.console = NULL;
    p->drawn = false;
    log_warn("the console output is closed (the reader of the pipe went away): training goes on without progress "
             "lines%s", p->cfg.json ? "; the JSON log (--log-json) keeps every step" : "");
}

void progress_clear_line(progress_t *p) {
    if (!p || !p->drawn) return;
    fputs("\r\x1b[K", p->cfg.console);
    p->drawn = false;
    console_flush(p);
}

void progress_free(progress_t *p) {
    if (!p) return;
    if (p->drawn && p->cfg.console) { fputc('\n', p->cfg.console); fflush(p->cfg.console); }
    free(p);
}

void progress_step_init(progress_step_t *s, int64_t step) {
    memset(s, 0, sizeof *s);
    s->step = step;
    s->loss = NAN;
    s->grad_norm = NAN;
    s->val_loss = NAN;
    s->phase_s[PROGRESS_COMPUTE] = -1;
    s->mem_gpu_bytes = s->mem_gpu_peak_bytes = s->mem_host_bytes = -1;
}

/* ---- formatting ---- */

static void fmt_duration(double s, char *buf, size_t len) {
    if (!isfinite(s) || s < 0) { snprintf(buf, len, "?"); return; }
    long long t = (long long)(s + 0.5);
    if (t < 60) snprintf(buf, len, "%llds", t);
    else if (t < 3600) snprintf(buf, len, "%lldm%02llds", t / 60, t % 60);
    else if (t < 86400) snprintf(buf, len, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
    else snprintf(buf, len, "%lldd%02lldh", t / 86400, (t % 86400) / 3600);
}

/* 950, 12.3k, 4.56M */
static void fmt_si(double v, char *buf, size_t len) {
    if (!isfinite(v)) snprintf(buf, len, "?");
    else if (v >= 1e9) snprintf(buf, len, "%.3gG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, len, "%.3gM", v / 1e6);
    else if (v >= 1e4) snprintf(buf, len, "%.3gk", v / 1e3);
    else snprintf(buf, len, "%.0f", v);
}

static void fmt_rate_bytes(double v, char *buf, size_t len) {
    if (!isfinite(v)) snprintf(buf, len, "?");
    else if (v >= 1e9) snprintf(buf, len, "%.2f GB/s", v / 1e9);
    else if (v >= 1e6) snprintf(buf, len, "%.1f MB/s", v / 1e6);
    else if (v >= 1e3) snprintf(buf, len, "%.1f kB/s", v / 1e3);
    else snprintf(buf, len, "%.0f B/s", v);
}

void progress_format_line(const progress_t *p, const progress_step_t *s, const progress_stats_t *st, bool live,
                          char *buf, size_t len) {
    char tps[32], eta[32], mfu[32], off[48] = "", tpg[32];
    fmt_si(st->tokens_per_s, tps, sizeof tps);
    fmt_si(st->tokens_per_s_per_gpu, tpg, sizeof tpg);
    fmt_duration(st->eta_s, eta, sizeof eta);
    if (isfinite(st->mfu)) snprintf(mfu, sizeof mfu, "%.1f%%", 100 * st->mfu);
    else snprintf(mfu, sizeof mfu, "n/a");
    if (p->offload_total) {
        char r[32];
        fmt_rate_bytes(st->offload_bytes_per_s, r, sizeof r);
        snprintf(off, sizeof off, " | offload %s", r);
    }
    const char *skip = s->skipped ? " | skipped (non-finite loss)" : "";
    /* the live line keeps the last validation loss in view */
    double vl = isfinite(s->val_loss) ? s->val_loss : live ? p->val_last : NAN;
    char val[48] = "";
    if (isfinite(vl)) snprintf(val, sizeof val, live ? " | val %.4f" : " | val loss %.6f", vl);
    if (live)
        snprintf(buf, len, "step %lld/%lld | loss %.4f%s | %s tok/s | MFU %s | %.3f s/step | ETA %s%s%s",
                 (long long)s->step, (long long)p->cfg.total_steps, s->loss, val, tps, mfu, s->step_s, eta, off, skip);
    else {
        /* per GPU on a GPU; a CPU rank is no GPU */
        const char *unit = p->cfg.device && strcmp(p->cfg.device, "cpu") == 0 ? "rank" : "GPU";
        snprintf(buf, len,
                 "step %6lld/%lld | loss %.6f%s | lr %.4e | grad norm %.4f | %s tok/s | %s tok/s/%s | "
                 "%.*f TFLOP/s/%s | MFU %s | %.3f s/step | ETA %s%s%s | elapsed %.1f s",
                 (long long)s->step, (long long)p->cfg.total_steps, s->loss, val, s->lr, s->grad_norm, tps, tpg, unit,
                 st->tflops_per_gpu >= 1 ? 2 : 4, st->tflops_per_gpu, unit, mfu, s->step_s, eta, off, skip,
                 st->elapsed_s);
    }
}

/* ---- JSON ---- */

/* Non-finite numbers are not JSON: they become null. */
static void put_num(json_t *o, const char *k, double v) {
    json_object_set_new(o, k, isfinite(v) ? json_real(v) : json_null());
}

static int write_json(progress_t *p, json_t *o, char *err, size_t errlen) {
    if (!p->cfg.json) return 0;
    int rc = json_dumpf(o, p->cfg.json, JSON_REAL_PRECISION(17));
    if (rc == 0 && fputc('\n', p->cfg.json) == EOF) rc = -1;
    if (rc == 0 && fflush(p->cfg.json) != 0) rc = -1;
    if (rc != 0 && errno == EPIPE && p->cfg.json == stdout) {
        /* --log-json - into a pipe whose reader went away: the run matters more than its log */
        p->cfg.json = NULL;
        log_warn("the JSON log (--log-json -) lost its reader (the pipe closed): training goes on without it");
        return 0;
    }
    if (rc != 0) snprintf(err, errlen, "writing the JSON log (--log-json) failed: disk full or the reader went away?");
    return rc;
}

int progress_write_settings(progress_t *p, const opt_t *opts, size_t n_opts, const char *model, int64_t params,
                            double entropy_nats, char *err, size_t errlen) {
    if (!p->cfg.json) return 0;
    json_t *o = json_object(), *set = json_object();
    json_object_set_new(o, "kind", json_string("settings"));
    for (size_t i = 0; i < n_opts; i++) {
        char v[1024];
        opt_format_value(&opts[i], v, sizeof v);
        json_object_set_new(set, opts[i].name, json_string(v));
    }
    json_object_set_new(o, "settings", set);
    if (model) json_object_set_new(o, "model", json_string(model));
    if (params > 0) json_object_set_new(o, "params", json_integer(params));
    json_object_set_new(o, "n_gpus", json_integer(p->cfg.n_gpus));
    if (p->cfg.device) json_object_set_new(o, "device", json_string(p->cfg.device));
    put_num(o, "peak_tflops", p->peak > 0 ? p->peak : NAN);
    put_num(o, "flops_per_token", p->cfg.flops_per_token);
    json_object_set_new(o, "tokens_per_step", json_integer(p->cfg.tokens_per_step));
    json_object_set_new(o, "total_steps", json_integer(p->cfg.total_steps));
    put_num(o, "entropy_nats", entropy_nats);
    int rc = write_json(p, o, err, errlen);
    json_decref(o);
    return rc;
}

static int write_step(progress_t *p, const progress_step_t *s, const progress_stats_t *st, char *err, size_t errlen) {
    json_t *o = json_object();
    json_object_set_new(o, "step", json_integer(s->step));
    put_num(o, "loss", s->loss);
    if (isfinite(s->val_loss)) put_num(o, "val_loss", s->val_loss);
    put_num(o, "lr", s->lr);
    put_num(o, "grad_norm", s->grad_norm);
    json_object_set_new(o, "tokens", json_integer(s->step * p->cfg.tokens_per_step));
    put_num(o, "tokens_per_s", st->tokens_per_s);
    put_num(o, "tokens_per_s_per_gpu", st->tokens_per_s_per_gpu);
    put_num(o, "tflops_per_gpu", st->tflops_per_gpu);
    put_num(o, "mfu", st->mfu);
    put_num(o, "step_s", s->step_s);
    for (int i = 0; i < PROGRESS_NPHASES; i++) put_num(o, PHASE_JSON[i], st->phase_s[i]);
    put_num(o, "elapsed_s", st->elapsed_s);
    put_num(o, "eta_s", st->eta_s);
    json_object_set_new(o, "offload_to_host_bytes", json_integer((json_int_t)s->offload_to_host_bytes));
    json_object_set_new(o, "offload_to_device_bytes", json_integer((json_int_t)s->offload_to_device_bytes));
    if (s->mem_gpu_bytes >= 0) json_object_set_new(o, "mem_gpu_bytes", json_integer(s->mem_gpu_bytes));
    if (s->mem_gpu_peak_bytes >= 0) json_object_set_new(o, "mem_gpu_peak_bytes", json_integer(s->mem_gpu_peak_bytes));
    if (s->mem_host_bytes >= 0) json_object_set_new(o, "mem_host_bytes", json_integer(s->mem_host_bytes));
    if (s->skipped) json_object_set_new(o, "skipped", json_true());
    int rc = write_json(p, o, err, errlen);
    json_decref(o);
    return rc;
}

/* ---- per step ---- */

/* A gauge without labels, registered when it first has a value (so that it
 * is absent, not 0, while unknown). */
static metric_t *lazy_gauge(progress_t *p, const char *name, const char *help) {
    char err[METRICS_ERR_LEN];
    metric_family_t *f = metrics_register(p->cfg.metrics, METRIC_GAUGE, name, help, NULL, 0, NULL, 0, err, sizeof err);
    return f ? metrics_series(f, NULL) : NULL;
}

static void update_metrics(progress_t *p, const progress_step_t *s, const progress_stats_t *st) {
    if (!p->cfg.metrics) return;
    metric_inc(p->m_steps);
    metric_add_u64(p->m_tokens, (uint64_t)(p->cfg.tokens_per_step / p->cfg.n_gpus));
    metric_observe(p->m_step_s, s->step_s);
    metric_set(p->m_step, (double)s->step);
    if (isfinite(s->loss)) metric_set(p->m_loss, s->loss);
    if (isfinite(s->val_loss)) metric_set(p->m_val, s->val_loss);
    metric_set(p->m_lr, s->lr);
    if (isfinite(s->grad_norm)) metric_set(p->m_gnorm, s->grad_norm);
    metric_set(p->m_tps, st->tokens_per_s_per_gpu);
    metric_set(p->m_tps_total, st->tokens_per_s);
    metric_set(p->m_flops, st->tflops_per_gpu * 1e12);
    if (p->m_mfu) metric_set(p->m_mfu, st->mfu);
    for (int i = 0; i < PROGRESS_NPHASES; i++) metric_add(p->m_phase[i], st->phase_s[i]);
    if (s->mem_gpu_bytes >= 0) {
        if (!p->m_mem_gpu)
            p->m_mem_gpu = lazy_gauge(p, "ballast_gpu_memory_used_bytes", "Device memory in use at the end of the last step");
        metric_set(p->m_mem_gpu, (double)s->mem_gpu_bytes);
    }
    if (s->mem_host_bytes >= 0) {
        if (!p->m_mem_host)
            p->m_mem_host = lazy_gauge(p, "ballast_host_memory_used_bytes", "Host memory used by this rank at the end of the last step");
        metric_set(p->m_mem_host, (double)s->mem_host_bytes);
    }
}

void progress_totals(const progress_t *p, progress_totals_t *t) {
    memset(t, 0, sizeof *t);
    t->comm_s = comm_wait_seconds();
    metrics_registry_t *r = p ? p->cfg.metrics : NULL;
    if (!r) return;
    double v;
    if (isfinite(v = metrics_sum(r, "ballast_offload_wait_seconds_total", NULL, NULL))) t->offload_wait_s = v;
    if (isfinite(v = metrics_sum(r, "ballast_offload_bytes_total", "direction", "to_service"))) t->to_service_bytes = v;
    if (isfinite(v = metrics_sum(r, "ballast_offload_bytes_total", "direction", "from_service"))) t->from_service_bytes = v;
}

void progress_step_since(progress_step_t *s, const progress_totals_t *a, const progress_totals_t *b) {
    s->phase_s[PROGRESS_COMM] = b->comm_s > a->comm_s ? b->comm_s - a->comm_s : 0;
    s->phase_s[PROGRESS_OFFLOAD] = b->offload_wait_s > a->offload_wait_s ? b->offload_wait_s - a->offload_wait_s : 0;
    s->offload_to_host_bytes = b->to_service_bytes > a->to_service_bytes ? (uint64_t)(b->to_service_bytes - a->to_service_bytes) : 0;
    s->offload_to_device_bytes =
        b->from_service_bytes > a->from_service_bytes ? (uint64_t)(b->from_service_bytes - a->from_service_bytes) : 0;
}

int progress_end_step(progress_t *p, int64_t step, const progress_totals_t *before, double loss, double lr,
                      double grad_norm, double step_s, double data_s, bool skipped, char *err, size_t errlen) {
    progress_totals_t now;
    progress_step_t ps;
    progress_step_init(&ps, step);
    progress_totals(p, &now);
    progress_step_since(&ps, before, &now);
    ps.loss = loss;
    ps.lr = lr;
    ps.grad_norm = grad_norm;
    ps.step_s = step_s;
    ps.phase_s[PROGRESS_DATA] = data_s;
    ps.mem_host_bytes = progress_rss_bytes();
    ps.skipped = skipped;
    ps.val_loss = p->val_pending;
    p->val_pending = NAN;
    return progress_record(p, &ps, NULL, err, errlen);
}

void progress_set_val_loss(progress_t *p, double val_loss) {
    if (p) p->val_pending = val_loss;
}

int progress_record(progress_t *p, const progress_step_t *s, progress_stats_t *stats, char *err, size_t errlen) {
    progress_stats_t st;
    memset(&st, 0, sizeof st);
    double dt = s->step_s;
    double tokens = (double)p->cfg.tokens_per_step;
    st.tokens_per_s = dt > 0 ? tokens / dt : NAN;
    st.tokens_per_s_per_gpu = st.tokens_per_s / p->cfg.n_gpus;
    st.tflops_per_gpu = progress_tflops_per_gpu(p->cfg.flops_per_token, tokens, dt, p->cfg.n_gpus);
    st.mfu = p->peak > 0 ? st.tflops_per_gpu / p->peak : NAN;
    double other = 0;
    for (int i = 1; i < PROGRESS_NPHASES; i++) {
        st.phase_s[i] = s->phase_s[i] > 0 ? s->phase_s[i] : 0;
        other += st.phase_s[i];
    }
    st.phase_s[PROGRESS_COMPUTE] = s->phase_s[PROGRESS_COMPUTE] >= 0 ? s->phase_s[PROGRESS_COMPUTE]
                                                                     : (dt - other > 0 ? dt - other : 0);
    st.offload_bytes_per_s = dt > 0 ? (double)(s->offload_to_host_bytes + s->offload_to_device_bytes) / dt : NAN;
    p->offload_total += s->offload_to_host_bytes + s->offload_to_device_bytes;

    /* ETA: the first step of a process includes warm-up (allocation, first
     * kernels, cold caches); leave it out once a second step is there. */
    if (p->n_recorded == 0) p->first_step_s = dt;
    else {
        p->win[p->i_win] = dt;
        p->i_win = (p->i_win + 1) % ETA_WINDOW;
        if (p->n_win < ETA_WINDOW) p->n_win++;
    }
    p->n_recorded++;
    double mean = p->first_step_s;
    if (p->n_win) {
        mean = 0;
        for (int i = 0; i < p->n_win; i++) mean += p->win[i];
        mean /= p->n_win;
    }
    int64_t left = p->cfg.total_steps - s->step;
    st.eta_s = (left > 0 ? (double)left : 0) * mean;
    st.elapsed_s = clock_now_s() - p->t0;

    update_metrics(p, s, &st);
    if (stats) *stats = st;
    if (isfinite(s->val_loss)) p->val_last = s->val_loss;

    if (p->cfg.console) {
        char line[512];
        bool last = s->step >= p->cfg.total_steps;
        if (p->live) {
            double now = clock_now_s();
            if (last || !p->drawn || now - p->last_draw >= LIVE_REDRAW_S) {
                progress_format_line(p, s, &st, true, line, sizeof line);
                fprintf(p->cfg.console, "\r%s\x1b[K", line);
                console_flush(p);
                p->drawn = true;
                p->last_draw = now;
            }
        } else if ((s->step - p->cfg.start_step) % p->cfg.log_every == 0 || last || p->n_recorded == 1 || s->skipped ||
                   isfinite(s->val_loss)) {
            progress_format_line(p, s, &st, false, line, sizeof line);
            fprintf(p->cfg.console, "%s\n", line);
            console_flush(p);
        }
    }
    if (p->cfg.json && write_step(p, s, &st, err, errlen) != 0) return -1;
    if (p->cfg.tb) {
        const double v[PROGRESS_TB_NTAGS] = {
            s->loss, s->val_loss, s->lr, s->grad_norm, st.tokens_per_s, st.tokens_per_s_per_gpu, st.mfu, s->step_s,
            (double)s->offload_to_host_bytes, (double)s->offload_to_device_bytes, st.phase_s[PROGRESS_OFFLOAD],
        };
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        if (tb_write_scalars(p->cfg.tb, s->step, (double)now.tv_sec + now.tv_nsec * 1e-9, PROGRESS_TB_TAGS, v,
                             PROGRESS_TB_NTAGS, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* ---- non-finite loss ---- */

progress_loss_action_t progress_check_loss(progress_t *p, int64_t step, double loss, bool skip_nonfinite, char *msg,
                                           size_t msglen) {
    if (isfinite(loss)) {
        if (p) p->nonfinite_run = 0;
        if (msglen) msg[0] = 0;
        return PROGRESS_LOSS_OK;
    }
    int run = 1;
    if (p) {
        run = ++p->nonfinite_run;
        p->nonfinite_total++;
        metric_inc(p->m_nonfinite);
    }
    const char *what = isnan(loss) ? "NaN" : loss > 0 ? "+inf" : "-inf";
    if (!skip_nonfinite) {
        snprintf(msg, msglen,
                 "step %lld: the loss is %s; stopping the run at this step. Usual causes: a learning rate too high "
                 "for the batch (lower --lr or lengthen --warmup-steps) or bad token ids in the data; "
                 "--skip-nonfinite skips such steps instead",
                 (long long)step, what);
        return PROGRESS_LOSS_STOP;
    }
    if (run >= PROGRESS_MAX_NONFINITE_RUN) {
        snprintf(msg, msglen,
                 "step %lld: the loss is %s, %d steps in a row; stopping the run (--skip-nonfinite skips at most %d "
                 "in a row). Lower --lr or check the data, then resume from the last checkpoint",
                 (long long)step, what, run, PROGRESS_MAX_NONFINITE_RUN - 1);
        return PROGRESS_LOSS_STOP;
    }
    snprintf(msg, msglen, "step %lld: the loss is %s; skipping this step's update (--skip-nonfinite; %lld skipped so far)",
             (long long)step, what, (long long)(p ? p->nonfinite_total : 1));
    return PROGRESS_LOSS_SKIP;
}
