/* report.c: `ballast report`'s reader and renderer: JSON lines in (jansson),
 * one HTML page with inline SVG out, any number of runs overlaid. The
 * scaling of the plots is stated in report.h; the page format in
 * docs/observability.md. */
#include "workers/cli/report.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the fields a step record may have ---- */

enum {
    F_LOSS, F_LR, F_GNORM, F_TOKENS, F_TPS, F_TPS_GPU, F_TFLOPS, F_MFU, F_STEP_S, F_COMPUTE, F_COMM, F_OFFW,
    F_DATA, F_ELAPSED, F_MEM_GPU, F_MEM_GPU_PEAK, F_MEM_HOST, F_OFF_H, F_OFF_D, F_VAL, F_ETA, NF
};
static const char *const FIELD[NF] = {
    "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "step_s",
    "compute_s", "comm_s", "offload_wait_s", "data_s", "elapsed_s", "mem_gpu_bytes", "mem_gpu_peak_bytes",
    "mem_host_bytes", "offload_to_host_bytes", "offload_to_device_bytes", "val_loss", "eta_s",
};

typedef struct {
    int64_t step;
    double v[NF]; /* NaN where the record lacks the field (or has null) */
} rec_t;

typedef struct {
    int64_t first;   /* first step logged by this segment */
    long line;       /* its line in the log */
    double elapsed;  /* the largest elapsed_s it logged; NaN: none */
} seg_t;

struct report_log {
    char *path;
    rec_t *recs;          /* in step order */
    size_t n, cap;
    seg_t *segs;          /* the run's segments: 1, plus one per resume */
    size_t nseg, segcap;
    json_t *settings;     /* the first "settings" record, or NULL */
    char *notes;          /* one note per line */
    size_t notes_len;
};

static void add_note(report_log_t *l, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t len = strlen(line);
    char *p = realloc(l->notes, l->notes_len + len + 2);
    if (!p) return;
    l->notes = p;
    memcpy(l->notes + l->notes_len, line, len);
    l->notes_len += len;
    l->notes[l->notes_len++] = '\n';
    l->notes[l->notes_len] = 0;
}

size_t report_steps(const report_log_t *l) { return l ? l->n : 0; }
const char *report_notes(const report_log_t *l) { return l && l->notes ? l->notes : ""; }
size_t report_segments(const report_log_t *l) { return l ? l->nseg : 0; }

double report_total_elapsed(const report_log_t *l) {
    double t = 0;
    for (size_t i = 0; l && i < l->nseg; i++)
        if (isfinite(l->segs[i].elapsed)) t += l->segs[i].elapsed;
    return t;
}

void report_free(report_log_t *l) {
    if (!l) return;
    free(l->path);
    free(l->recs);
    free(l->segs);
    json_decref(l->settings);
    free(l->notes);
    free(l);
}

/* ---- round ticks ---- */

int report_ticks(double lo, double hi, int max_ticks, report_ticks_t *t) {
    if (!t || !isfinite(lo) || !isfinite(hi) || lo > hi || max_ticks < 3 || max_ticks > REPORT_MAX_TICKS) return -1;
    memset(t, 0, sizeof *t);
    static const double M[3] = { 1, 2, 5 };
    double span = hi - lo;
    int e = span > 0 ? (int)floor(log10(span / max_ticks)) - 1 : (lo != 0 ? (int)floor(log10(fabs(lo))) : 0);
    if (span == 0) {
        t->step = e < 0 ? 1 / pow(10, -e) : pow(10, e);
        t->decimals = e < 0 ? (-e > 17 ? 17 : -e) : 0;
        t->n = 1;
        t->v[0] = lo;
        return 0;
    }
    for (;; e++) {
        for (int m = 0; m < 3; m++) {
            /* 10^-e is exact for the exponents that matter, 10^e (e < 0) is not */
            double step = e < 0 ? M[m] / pow(10, -e) : M[m] * pow(10, e);
            double kmin = ceil(lo / step - 1e-9), kmax = floor(hi / step + 1e-9);
            double count = kmax - kmin + 1;
            if (count > max_ticks) continue;
            t->step = step;
            t->decimals = e < 0 ? (-e > 17 ? 17 : -e) : 0;
            double p10 = pow(10, t->decimals);
            for (double k = kmin; k <= kmax && t->n < REPORT_MAX_TICKS; k++) {
                double v = k * step;
                if (t->decimals > 0 && t->decimals <= 15) v = round(v * p10) / p10;
                t->v[t->n++] = v == 0 ? 0 : v; /* no -0 */
            }
            if (t->n == 0) { t->n = 1; t->v[0] = lo; } /* only with max_ticks < 3, refused above */
            return 0;
        }
    }
}

/* ---- reading ---- */

static bool blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return false;
    return true;
}

static int add_segment(report_log_t *l, int64_t first, long line) {
    if (l->nseg == l->segcap) {
        size_t cap = l->segcap ? 2 * l->segcap : 4;
        seg_t *s = realloc(l->segs, cap * sizeof *s);
        if (!s) return -1;
        l->segs = s;
        l->segcap = cap;
    }
    l->segs[l->nseg++] = (seg_t){ .first = first, .line = line, .elapsed = NAN };
    return 0;
}

/* Check the record's fields (numbers or null), then append it. Returns 0,
 * 1 with err on a bad field, -1 when out of memory. */
static int add_record(report_log_t *l, json_t *o, int64_t step, long lineno, char *err, size_t errlen) {
    double v[NF];
    for (int f = 0; f < NF; f++) {
        json_t *x = json_object_get(o, FIELD[f]);
        if (x && !json_is_number(x) && !json_is_null(x)) {
            snprintf(err, errlen, "%s:%ld: \"%s\" is %s; step fields are numbers (or null when unknown), as "
                     "`ballast train --log-json` writes them", l->path, lineno, FIELD[f],
                     json_is_string(x) ? "a string" : json_is_boolean(x) ? "a boolean" : json_is_array(x) ? "an array"
                                                                                                        : "an object");
            return 1;
        }
        v[f] = x && json_is_number(x) ? json_number_value(x) : NAN;
        if (isfinite(v[f]) && v[f] < 0 && f != F_LOSS && f != F_VAL) {
            snprintf(err, errlen, "%s:%ld: \"%s\" is %g; it cannot be negative (is this the log of `ballast train "
                     "--log-json`?)", l->path, lineno, FIELD[f], v[f]);
            return 1;
        }
    }
    /* a step logged again (resumed run): drop what was logged from it on */
    size_t dropped = 0;
    while (l->n && l->recs[l->n - 1].step >= step) { l->n--; dropped++; }
    bool restarted = l->n && isfinite(v[F_ELAPSED]) && isfinite(l->recs[l->n - 1].v[F_ELAPSED]) &&
                     v[F_ELAPSED] < l->recs[l->n - 1].v[F_ELAPSED];
    if (dropped) add_note(l, "step %lld logged again (a resumed run?): the later records replace %zu earlier ones",
                          (long long)step, dropped);
    if (l->nseg == 0 || dropped || restarted) {
        if (add_segment(l, step, lineno) != 0) return -1;
        if (l->nseg > 1 && !dropped) add_note(l, "the run was resumed at step %lld (elapsed_s starts again)",
                                              (long long)step);
    }
    seg_t *sg = &l->segs[l->nseg - 1];
    if (isfinite(v[F_ELAPSED]) && !(v[F_ELAPSED] <= sg->elapsed)) sg->elapsed = v[F_ELAPSED];
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 1024;
        rec_t *r = realloc(l->recs, cap * sizeof *r);
        if (!r) return -1;
        l->recs = r;
        l->cap = cap;
    }
    rec_t *r = &l->recs[l->n++];
    r->step = step;
    memcpy(r->v, v, sizeof v);
    return 0;
}

int report_load(const char *path, report_log_t **out, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s; give the file written by `ballast train --log-json FILE`", path, strerror(errno));
        return -1;
    }
    report_log_t *l = calloc(1, sizeof *l);
    if (!l || !(l->path = strdup(path))) { fclose(f); free(l); snprintf(err, errlen, "out of memory"); return -1; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0, ignored = 0;
    int rc = 0;
    bool pending = false; /* a line that did not parse: fine only if it is the last one */
    long pending_no = 0;
    char pending_why[JSON_ERROR_TEXT_LENGTH + 40] = "";
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (blank(line)) continue;
        if (pending) {
            snprintf(err, errlen, "%s:%ld: not a JSON object (%s); `ballast report` reads the JSON lines of "
                     "`ballast train --log-json`", path, pending_no, pending_why);
            rc = -1;
            break;
        }
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o || !json_is_object(o)) {
            const char *s = line;
            while (*s == ' ' || *s == '\t') s++;
            if (o) snprintf(pending_why, sizeof pending_why, "a JSON %s, not an object",
                            json_is_array(o) ? "array" : json_is_string(o) ? "string" : "number or literal");
            else snprintf(pending_why, sizeof pending_why, "%s at column %d", je.text, je.column);
            if (!o && *s == '{') { /* maybe a record cut short: fine if nothing follows */
                pending = true;
                pending_no = lineno;
                continue;
            }
            json_decref(o);
            snprintf(err, errlen, "%s:%ld: not a JSON object (%s); `ballast report` reads the JSON lines of "
                     "`ballast train --log-json`", path, lineno, pending_why);
            rc = -1;
            break;
        }
        json_t *kind = json_object_get(o, "kind");
        json_t *step = json_object_get(o, "step");
        if (kind && !json_is_string(kind)) {
            snprintf(err, errlen, "%s:%ld: \"kind\" is not a string; records are of kind \"settings\", \"layout\" "
                     "or \"step\"", path, lineno);
            json_decref(o);
            rc = -1;
            break;
        }
        if (kind && strcmp(json_string_value(kind), "settings") == 0) {
            if (!l->settings) l->settings = json_incref(o);
        } else if (step && (!kind || !strcmp(json_string_value(kind), "step"))) {
            double s = json_is_number(step) ? json_number_value(step) : NAN;
            if (!(s >= 0 && s < 9e18) || s != floor(s)) {
                char shown[64];
                if (json_is_number(step)) snprintf(shown, sizeof shown, "%g", s);
                else snprintf(shown, sizeof shown, "not a number");
                snprintf(err, errlen, "%s:%ld: \"step\" is %s; steps are non-negative whole numbers", path, lineno,
                         shown);
                json_decref(o);
                rc = -1;
                break;
            }
            int ar = add_record(l, o, (int64_t)s, lineno, err, errlen);
            if (ar != 0) {
                if (ar < 0) snprintf(err, errlen, "out of memory");
                json_decref(o);
                rc = -1;
                break;
            }
        } else {
            ignored++;
        }
        json_decref(o);
    }
    if (rc == 0 && pending) {
        if (l->n == 0 && !l->settings) {
            snprintf(err, errlen, "%s:%ld: not a JSON object (%s); `ballast report` reads the JSON lines of "
                     "`ballast train --log-json`", path, pending_no, pending_why);
            rc = -1;
        } else {
            add_note(l, "line %ld is cut short (the run was still writing it, or was killed): ignored", pending_no);
        }
    }
    if (rc == 0 && ferror(f)) { snprintf(err, errlen, "%s: read error: %s", path, strerror(errno)); rc = -1; }
    if (rc == 0 && l->n == 0) {
        snprintf(err, errlen, "%s: no step records (objects with a \"step\" field) in %ld lines; is this the "
                 "--log-json output of `ballast train`?", path, lineno);
        rc = -1;
    }
    if (rc == 0 && ignored) add_note(l, "%ld records of other kinds ignored", ignored);
    free(line);
    fclose(f);
    if (rc) { report_free(l); return -1; }
    *out = l;
    return 0;
}

/* ---- formatting helpers ---- */

static void html_escape(FILE *o, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", o); break;
        case '<': fputs("&lt;", o); break;
        case '>': fputs("&gt;", o); break;
        case '"': fputs("&quot;", o); break;
        case '\'': fputs("&#39;", o); break;
        default: fputc(*s, o);
        }
    }
}

typedef enum { U_PLAIN, U_PCT, U_BYTES, U_SI, U_SECONDS } unit_t;

static void fmt_unit(double v, unit_t u, char *buf, size_t len) {
    double a = fabs(v);
    switch (u) {
    case U_PCT: snprintf(buf, len, "%.1f%%", 100 * v); break;
    case U_BYTES:
        if (a >= 1073741824.0) snprintf(buf, len, "%.3g GiB", v / 1073741824.0);
        else if (a >= 1048576.0) snprintf(buf, len, "%.3g MiB", v / 1048576.0);
        else if (a >= 1024.0) snprintf(buf, len, "%.3g KiB", v / 1024.0);
        else snprintf(buf, len, "%.0f B", v);
        break;
    case U_SI:
        if (a >= 1e9) snprintf(buf, len, "%.3gG", v / 1e9);
        else if (a >= 1e6) snprintf(buf, len, "%.3gM", v / 1e6);
        else if (a >= 1e3) snprintf(buf, len, "%.3gk", v / 1e3);
        else snprintf(buf, len, "%.3g", v);
        break;
    case U_SECONDS:
        if (a >= 1 || a == 0) snprintf(buf, len, "%.3g s", v);
        else snprintf(buf, len, "%.3g ms", v * 1e3);
        break;
    default: snprintf(buf, len, "%.4g", v);
    }
}

/* The unit an axis over values up to amax is labelled in: tick labels are
 * value / scale, then suffix. */
typedef struct {
    double scale;
    char suffix[16];
} axis_unit_t;

static axis_unit_t axis_unit(unit_t u, double amax) {
    axis_unit_t a = { 1, "" };
    switch (u) {
    case U_PCT: a.scale = 0.01; snprintf(a.suffix, sizeof a.suffix, "%%"); break;
    case U_BYTES: {
        static const char *const N[] = { " B", " KiB", " MiB", " GiB", " TiB" };
        int k = 0;
        while (k < 4 && amax >= 1024.0 * a.scale) { a.scale *= 1024.0; k++; }
        snprintf(a.suffix, sizeof a.suffix, "%s", N[k]);
        break;
    }
    case U_SI: {
        static const char *const N[] = { "", "k", "M", "G", "T" };
        int k = 0;
        while (k < 4 && amax >= 1000.0 * a.scale) { a.scale *= 1000.0; k++; }
        snprintf(a.suffix, sizeof a.suffix, "%s", N[k]);
        break;
    }
    case U_SECONDS:
        if (amax < 1) { a.scale = 1e-3; snprintf(a.suffix, sizeof a.suffix, " ms"); }
        else snprintf(a.suffix, sizeof a.suffix, " s");
        break;
    default: /* small values (learning rates): a shared power of ten, 3.0e-4 */
        if (amax > 0 && amax < 1e-2) {
            int e = (int)floor(log10(amax));
            a.scale = 1 / pow(10, -e);
            snprintf(a.suffix, sizeof a.suffix, "e%d", e);
        }
    }
    return a;
}

/* ---- plots ---- */

#define MAX_SERIES 5

typedef struct {
    const char *id, *title, *ylabel;
    unit_t unit;
    int nf;
    int fields[MAX_SERIES];
    bool floor;          /* draw the entropy floor */
    const char *zero;    /* what it means when every value is 0 */
} plot_def_t;

static const plot_def_t PLOTS[] = {
    { "loss", "Loss", "nats per token", U_PLAIN, 2, { F_LOSS, F_VAL }, true, NULL },
    { "lr", "Learning rate", "learning rate", U_PLAIN, 1, { F_LR }, false, NULL },
    { "grad_norm", "Gradient norm (before clipping)", "global L2 norm", U_PLAIN, 1, { F_GNORM }, false, NULL },
    { "throughput", "Throughput, all GPUs", "tokens/s", U_SI, 1, { F_TPS }, false, NULL },
    { "mfu", "Model FLOPs utilization", "MFU", U_PCT, 1, { F_MFU }, false, NULL },
    { "memory", "Memory", "bytes", U_BYTES, 3, { F_MEM_GPU, F_MEM_GPU_PEAK, F_MEM_HOST }, false, NULL },
    { "offload", "Offload traffic per step", "bytes per step", U_BYTES, 2, { F_OFF_H, F_OFF_D }, false,
      "No offload traffic: the run moved no bytes to or from ballastd (it ran without --activation-offload and "
      "--optimizer-offload)." },
    { "time", "Step time and its split", "seconds", U_SECONDS, 5, { F_STEP_S, F_COMPUTE, F_COMM, F_OFFW, F_DATA },
      false, NULL },
};
#define NPLOTS (sizeof PLOTS / sizeof PLOTS[0])
static const char *const COLORS[MAX_SERIES] = { "#1f5fbf", "#d9480f", "#2b8a3e", "#862e9c", "#868e96" };
static const char *const RUN_COLORS[REPORT_MAX_RUNS] = { "#1f5fbf", "#d9480f", "#2b8a3e", "#862e9c",
                                                         "#e67700", "#0b7285", "#c2255c", "#5c940d" };
static const char *const DASH[MAX_SERIES] = { "", "7 3", "2 3", "10 3 2 3", "1 2" };

static bool has_field(const report_log_t *l, int f) {
    for (size_t i = 0; i < l->n; i++)
        if (isfinite(l->recs[i].v[f])) return true;
    return false;
}

static size_t stride_of(const report_log_t *l) {
    return l->n > REPORT_MAX_POINTS ? (l->n + REPORT_MAX_POINTS - 1) / REPORT_MAX_POINTS : 1;
}

/* Is record i of l drawn for field f (thinning keeps every validation loss)? */
static bool drawn(const report_log_t *l, size_t i, int f, size_t stride) {
    if (!isfinite(l->recs[i].v[f])) return false;
    return f == F_VAL || i % stride == 0 || i == l->n - 1;
}

typedef struct {
    report_log_t *const *logs;
    size_t n;
    const char *const *names; /* run names for legends */
} runs_t;

/* Draw one plot over every run. Returns true when an SVG was drawn. */
static bool write_plot(FILE *o, const runs_t *rs, const plot_def_t *pd, double floor_v) {
    const double X0 = REPORT_PLOT_X0, Y0 = REPORT_PLOT_Y0, W = REPORT_PLOT_W, H = REPORT_PLOT_H;
    bool any = false, nonzero = false;
    int64_t smin = INT64_MAX, smax = INT64_MIN;
    double lo = INFINITY, hi = -INFINITY;
    for (size_t r = 0; r < rs->n; r++) {
        const report_log_t *l = rs->logs[r];
        size_t stride = stride_of(l);
        for (size_t i = 0; i < l->n; i++) {
            bool has = false;
            for (int k = 0; k < pd->nf; k++) {
                if (!drawn(l, i, pd->fields[k], stride)) continue;
                double v = l->recs[i].v[pd->fields[k]];
                has = true;
                nonzero |= v != 0;
                if (v < lo) lo = v;
                if (v > hi) hi = v;
            }
            if (!has) continue;
            if (l->recs[i].step < smin) smin = l->recs[i].step;
            if (l->recs[i].step > smax) smax = l->recs[i].step;
            any = true;
        }
    }
    fprintf(o, "<figure class=\"plot\" id=\"plot-%s\">\n<figcaption>%s</figcaption>\n", pd->id, pd->title);
    if (!any) {
        fprintf(o, "<p class=\"missing\">Not in the log:");
        for (int k = 0; k < pd->nf; k++) fprintf(o, " <code>%s</code>", FIELD[pd->fields[k]]);
        fprintf(o, ".</p>\n</figure>\n");
        return false;
    }
    if (!nonzero) { /* nothing but zeros: a sentence, not an axis around 0 */
        fprintf(o, "<p class=\"none\" data-none=\"%s\">", pd->id);
        if (pd->zero) html_escape(o, pd->zero);
        else {
            fputs("Always 0 in this run:", o);
            for (int k = 0; k < pd->nf; k++) fprintf(o, " <code>%s</code>", FIELD[pd->fields[k]]);
            fputs(".", o);
        }
        fputs("</p>\n</figure>\n", o);
        return false;
    }
    bool show_floor = pd->floor && isfinite(floor_v);
    bool nonneg = lo >= 0;
    if (show_floor) {
        if (floor_v < lo) lo = floor_v;
        if (floor_v > hi) hi = floor_v;
        nonneg = nonneg && floor_v >= 0;
    }
    double span = hi - lo, pad = span > 0 ? 0.05 * span : 0.05 * fabs(lo);
    double ymin = lo - pad, ymax = hi + pad;
    if (nonneg && ymin < 0) ymin = 0;
    double xspan = (double)(smax - smin);
#define PX(s) (xspan > 0 ? X0 + W * (double)((s) - smin) / xspan : X0 + W / 2)
#define PY(v) (Y0 + H * (ymax - (v)) / (ymax - ymin))
    fprintf(o,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" "
            "data-plot=\"%s\" data-xmin=\"%lld\" data-xmax=\"%lld\" data-ymin=\"%.17g\" data-ymax=\"%.17g\" "
            "data-nonneg=\"%d\" role=\"img\" aria-label=\"%s against step\">\n",
            X0 + W + 20, Y0 + H + 45, X0 + W + 20, Y0 + H + 45, pd->id, (long long)smin, (long long)smax, ymin, ymax,
            nonneg ? 1 : 0, pd->title);
    fprintf(o, "<rect class=\"area\" x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\"/>\n", X0, Y0, W, H);
    /* value grid at round values of the axis unit */
    axis_unit_t au = axis_unit(pd->unit, fmax(fabs(ymin), fabs(ymax)));
    report_ticks_t tk;
    if (report_ticks(ymin / au.scale, ymax / au.scale, 6, &tk) == 0) {
        for (int t = 0; t < tk.n; t++) {
            double v = tk.v[t] * au.scale, y = PY(v);
            fprintf(o, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.3f\" x2=\"%.1f\" y2=\"%.3f\"/>"
                       "<text class=\"ylab\" data-value=\"%.17g\" data-tick=\"%.*f\" data-tick-step=\"%.17g\" "
                       "x=\"%.1f\" y=\"%.3f\">%.*f%s</text>\n",
                    X0, y, X0 + W, y, v, tk.decimals, tk.v[t], tk.step, X0 - 6, y + 4, tk.decimals, tk.v[t],
                    au.suffix);
        }
    }
    /* step labels: round steps, whole numbers */
    if (xspan < 5) {
        for (int64_t s = smin; s <= smax; s++)
            fprintf(o, "<text class=\"xlab\" data-tick=\"%lld\" x=\"%.1f\" y=\"%.1f\">%lld</text>\n", (long long)s,
                    PX(s), Y0 + H + 16, (long long)s);
    } else if (report_ticks((double)smin, (double)smax, 6, &tk) == 0) {
        for (int t = 0; t < tk.n; t++)
            fprintf(o, "<text class=\"xlab\" data-tick=\"%.0f\" x=\"%.1f\" y=\"%.1f\">%.0f</text>\n", tk.v[t],
                    PX(tk.v[t]), Y0 + H + 16, tk.v[t]);
    }
    fprintf(o, "<text class=\"axis\" x=\"%.1f\" y=\"%.1f\">step</text>\n", X0 + W / 2, Y0 + H + 36);
    fprintf(o, "<text class=\"axis\" transform=\"rotate(-90)\" x=\"%.1f\" y=\"12\">%s</text>\n", -(Y0 + H / 2),
            pd->ylabel);
    /* where a run was resumed */
    for (size_t r = 0; r < rs->n; r++) {
        const report_log_t *l = rs->logs[r];
        for (size_t g = 1; g < l->nseg; g++) {
            int64_t s = l->segs[g].first;
            if (s < smin || s > smax) continue;
            fprintf(o, "<line class=\"resume\" data-run=\"%zu\" data-step=\"%lld\" stroke=\"%s\" x1=\"%.3f\" "
                       "y1=\"%.1f\" x2=\"%.3f\" y2=\"%.1f\"><title>",
                    r, (long long)s, rs->n > 1 ? RUN_COLORS[r] : "#888", PX(s), Y0, PX(s), Y0 + H);
            html_escape(o, rs->names[r]);
            fprintf(o, ": resumed at step %lld</title></line>\n", (long long)s);
        }
    }
    for (size_t r = 0; r < rs->n; r++) {
        const report_log_t *l = rs->logs[r];
        size_t stride = stride_of(l);
        for (int k = 0; k < pd->nf; k++) {
            int f = pd->fields[k];
            const char *color = rs->n > 1 ? RUN_COLORS[r] : COLORS[k];
            const char *dash = rs->n > 1 ? DASH[k] : "";
            bool open = false;
            for (size_t i = 0; i < l->n; i++) {
                double v = l->recs[i].v[f];
                if (isfinite(v) && !drawn(l, i, f, stride)) continue; /* thinned out */
                if (!isfinite(v) && f == F_VAL) continue; /* measured every --eval-every steps: one line */
                if (!isfinite(v)) { /* a gap splits the line */
                    if (open) fputs("\"/>\n", o);
                    open = false;
                    continue;
                }
                if (!open) {
                    fprintf(o, "<polyline class=\"series\" data-series=\"%s\" data-run=\"%zu\" stroke=\"%s\"", FIELD[f],
                            r, color);
                    if (*dash) fprintf(o, " stroke-dasharray=\"%s\"", dash);
                    fputs(" points=\"", o);
                } else fputc(' ', o);
                fprintf(o, "%.3f,%.3f", PX(l->recs[i].step), PY(v));
                open = true;
            }
            if (open) fputs("\"/>\n", o);
        }
    }
    if (show_floor) {
        double y = PY(floor_v);
        fprintf(o, "<line class=\"floor\" data-value=\"%.17g\" x1=\"%.1f\" y1=\"%.3f\" x2=\"%.1f\" y2=\"%.3f\"/>"
                   "<text class=\"floorlab\" x=\"%.1f\" y=\"%.1f\">entropy floor %.4f</text>\n",
                floor_v, X0, y, X0 + W, y, X0 + W - 4, y - 4, floor_v);
    }
    fputs("</svg>\n<div class=\"legend\">", o);
    if (rs->n > 1) {
        for (size_t r = 0; r < rs->n; r++) {
            fprintf(o, "<span class=\"run\" data-run=\"%zu\"><i style=\"background:%s\"></i>", r, RUN_COLORS[r]);
            html_escape(o, rs->names[r]);
            fputs("</span> ", o);
        }
        fputs("<br>", o);
    }
    for (int k = 0; k < pd->nf; k++) {
        bool has = false;
        for (size_t r = 0; r < rs->n; r++) has |= has_field(rs->logs[r], pd->fields[k]);
        fprintf(o, "<span class=\"key%s\" data-series=\"%s\">", has ? "" : " absent", FIELD[pd->fields[k]]);
        if (rs->n > 1)
            fprintf(o, "<svg class=\"dash\" width=\"24\" height=\"6\"><line x1=\"0\" y1=\"3\" x2=\"24\" y2=\"3\" "
                       "stroke=\"#555\" stroke-width=\"2\"%s%s%s/></svg>",
                    *DASH[k] ? " stroke-dasharray=\"" : "", DASH[k], *DASH[k] ? "\"" : "");
        else fprintf(o, "<i style=\"background:%s\"></i>", COLORS[k]);
        fprintf(o, "<code>%s</code>%s</span> ", FIELD[pd->fields[k]], has ? "" : " (not in the log)");
    }
    if (show_floor) fputs("<span><i class=\"dash\"></i>corpus entropy floor</span>", o);
    bool resumed = false;
    for (size_t r = 0; r < rs->n; r++) resumed |= rs->logs[r]->nseg > 1;
    if (resumed) fputs("<span><i class=\"resume\"></i>resumed</span>", o);
    fputs("</div>\n</figure>\n", o);
#undef PX
#undef PY
    return true;
}

/* ---- the page ---- */

static const char CSS[] =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:760px;color:#222}"
    "h1{font-size:20px}h2{font-size:16px;margin-top:28px}h3{font-size:14px}table{border-collapse:collapse}"
    "td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}th{font-weight:600}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}"
    ".notes{background:#fff4e6;border-left:3px solid #e8590c;padding:6px 10px;white-space:pre-wrap}"
    "figure{margin:18px 0}figcaption{font-weight:600}svg{display:block;max-width:100%;height:auto}"
    "svg text{font-size:11px;fill:#555}.ylab{text-anchor:end}.xlab,.axis{text-anchor:middle}"
    ".area{fill:#fafafa;stroke:#ccc}.grid{stroke:#e6e6e6}"
    ".series{fill:none;stroke-width:1.5;stroke-linejoin:round}"
    ".floor{stroke:#c92a2a;stroke-dasharray:6 4}.floorlab{text-anchor:end;fill:#c92a2a}"
    "line.resume{stroke-width:1;stroke-dasharray:3 3}"
    ".legend span{margin-right:14px}.legend i{display:inline-block;width:14px;height:3px;margin-right:4px;"
    "vertical-align:middle}.legend i.dash{border-top:2px dashed #c92a2a;height:0}"
    ".legend i.resume{border-left:1px dashed #888;width:0;height:12px}.legend svg.dash{display:inline-block;"
    "vertical-align:middle;margin-right:4px}.absent{color:#999}"
    ".missing,.none{color:#999;font-style:italic}code{font-size:12px}";

/* mean of field f over the records (the first left out when there are more: warm-up) */
static double mean_of(const report_log_t *l, int f) {
    double s = 0;
    size_t n = 0;
    for (size_t i = l->n > 1 ? 1 : 0; i < l->n; i++)
        if (isfinite(l->recs[i].v[f])) { s += l->recs[i].v[f]; n++; }
    return n ? s / n : NAN;
}

static void row(FILE *o, const char *k, const char *v) {
    fputs("<tr><th>", o);
    html_escape(o, k);
    fputs("</th><td>", o);
    html_escape(o, v);
    fputs("</td></tr>\n", o);
}

static void write_summary(FILE *o, const report_log_t *l, double floor_v) {
    char v[512], a[64], b[64];
    fputs("<table class=\"summary\">\n", o);
    snprintf(v, sizeof v, "%lld to %lld (%zu records)", (long long)l->recs[0].step, (long long)l->recs[l->n - 1].step,
             l->n);
    row(o, "steps", v);
    double last = NAN, best = INFINITY;
    int64_t best_step = 0;
    for (size_t i = 0; i < l->n; i++) {
        double x = l->recs[i].v[F_LOSS];
        if (!isfinite(x)) continue;
        last = x;
        if (x < best) { best = x; best_step = l->recs[i].step; }
    }
    if (isfinite(last)) {
        snprintf(v, sizeof v, "%.4f (lowest %.4f at step %lld)", last, best, (long long)best_step);
        row(o, "final loss", v);
    }
    double vlast = NAN;
    int64_t vstep = 0;
    for (size_t i = 0; i < l->n; i++)
        if (isfinite(l->recs[i].v[F_VAL])) { vlast = l->recs[i].v[F_VAL]; vstep = l->recs[i].step; }
    if (isfinite(vlast)) {
        snprintf(v, sizeof v, "%.4f at step %lld (perplexity %.2f)", vlast, (long long)vstep, exp(vlast));
        row(o, "validation loss", v);
    }
    if (isfinite(floor_v) && isfinite(last)) {
        snprintf(v, sizeof v, "%.4f nats; final loss is %.4f above it", floor_v, last - floor_v);
        row(o, "entropy floor", v);
    }
    double tps = mean_of(l, F_TPS), tpg = mean_of(l, F_TPS_GPU), tfl = mean_of(l, F_TFLOPS), mfu = mean_of(l, F_MFU);
    if (isfinite(tps)) {
        fmt_unit(tps, U_SI, a, sizeof a);
        fmt_unit(tpg, U_SI, b, sizeof b);
        snprintf(v, sizeof v, "%s tokens/s (%s per GPU), mean over the steps after the first", a, isfinite(tpg) ? b : "?");
        row(o, "throughput", v);
    }
    if (isfinite(tfl)) { snprintf(v, sizeof v, "%.2f TFLOP/s per GPU", tfl); row(o, "model FLOP/s", v); }
    if (isfinite(mfu)) { snprintf(v, sizeof v, "%.1f%%", 100 * mfu); row(o, "MFU", v); }
    double st = 0, ph[4] = { 0 }, off = 0;
    for (size_t i = 0; i < l->n; i++) {
        const rec_t *r = &l->recs[i];
        if (!isfinite(r->v[F_STEP_S])) continue;
        st += r->v[F_STEP_S];
        const int pf[4] = { F_COMPUTE, F_COMM, F_OFFW, F_DATA };
        for (int k = 0; k < 4; k++) if (isfinite(r->v[pf[k]])) ph[k] += r->v[pf[k]];
        if (isfinite(r->v[F_OFF_H])) off += r->v[F_OFF_H];
        if (isfinite(r->v[F_OFF_D])) off += r->v[F_OFF_D];
    }
    if (st > 0) {
        snprintf(v, sizeof v, "compute %.1f%%, exposed comm %.1f%%, offload waits %.1f%%, data %.1f%%", 100 * ph[0] / st,
                 100 * ph[1] / st, 100 * ph[2] / st, 100 * ph[3] / st);
        row(o, "time split", v);
        if (off > 0) { fmt_unit(off / st, U_BYTES, a, sizeof a); snprintf(v, sizeof v, "%s/s", a); row(o, "offload traffic", v); }
        else row(o, "offload traffic", "none (no bytes moved to or from ballastd)");
    }
    double tok = l->recs[l->n - 1].v[F_TOKENS];
    if (isfinite(tok)) { fmt_unit(tok, U_SI, a, sizeof a); row(o, "tokens", a); }
    bool have_el = false;
    for (size_t g = 0; g < l->nseg; g++) have_el |= isfinite(l->segs[g].elapsed);
    if (have_el) {
        double total = report_total_elapsed(l);
        int n = snprintf(v, sizeof v, "%.1f s", total);
        if (l->nseg > 1) {
            n += snprintf(v + n, sizeof v - n, " in %zu segments (", l->nseg);
            for (size_t g = 0; g < l->nseg && n < (int)sizeof v - 40; g++)
                n += snprintf(v + n, sizeof v - n, "%sfrom step %lld: %.1f s", g ? ", " : "", (long long)l->segs[g].first,
                              isfinite(l->segs[g].elapsed) ? l->segs[g].elapsed : 0.0);
            if (n < (int)sizeof v - 1) snprintf(v + n, sizeof v - n, ")");
        }
        fprintf(o, "<tr data-field=\"elapsed\" data-value=\"%.17g\" data-segments=\"%zu\"><th>elapsed</th><td>", total,
                l->nseg);
        html_escape(o, v);
        fputs("</td></tr>\n", o);
    }
    fputs("</table>\n", o);
}

static void write_settings(FILE *o, const report_log_t *l) {
    if (!l->settings) {
        fputs("<p class=\"missing\">The log has no settings record (a first line of kind \"settings\").</p>\n", o);
        return;
    }
    fputs("<table>\n", o);
    const char *k;
    json_t *v;
    json_object_foreach(l->settings, k, v) {
        if (!strcmp(k, "kind") || !strcmp(k, "settings")) continue;
        char *s = json_is_string(v) ? strdup(json_string_value(v)) : json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(10));
        row(o, k, s ? s : "?");
        free(s);
    }
    json_t *set = json_object_get(l->settings, "settings");
    if (json_is_object(set)) {
        json_object_foreach(set, k, v) {
            char name[256];
            snprintf(name, sizeof name, "--%s", k);
            char *s = json_is_string(v) ? strdup(json_string_value(v)) : json_dumps(v, JSON_ENCODE_ANY);
            row(o, name, s ? s : "?");
            free(s);
        }
    }
    fputs("</table>\n", o);
}

static const char *base_name(const char *p) {
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* A heading per run when there are several (name and colour). */
static void run_heading(FILE *o, const runs_t *rs, size_t r) {
    if (rs->n < 2) return;
    fprintf(o, "<h3 data-run=\"%zu\"><span style=\"color:%s\">&#9632;</span> ", r, RUN_COLORS[r]);
    html_escape(o, rs->names[r]);
    fputs("</h3>\n", o);
}

int report_write_html(report_log_t *const *logs, size_t nlogs, const report_opts_t *opt, FILE *o, char *plotted,
                      size_t plotted_len, char *missing, size_t missing_len, char *err, size_t errlen) {
    if (nlogs < 1 || nlogs > REPORT_MAX_RUNS) {
        snprintf(err, errlen, "%zu logs given; a report overlays 1 to %d runs", nlogs, REPORT_MAX_RUNS);
        return -1;
    }
    /* run names: the file's base name, or the whole path when two base names are the same */
    const char *names[REPORT_MAX_RUNS];
    bool clash = false;
    for (size_t r = 0; r < nlogs; r++)
        for (size_t q = 0; q < r; q++) clash |= !strcmp(base_name(logs[r]->path), base_name(logs[q]->path));
    for (size_t r = 0; r < nlogs; r++) names[r] = clash ? logs[r]->path : base_name(logs[r]->path);
    runs_t rs = { logs, nlogs, names };

    double floor_v = opt && isfinite(opt->entropy_nats) ? opt->entropy_nats : NAN;
    if (!isfinite(floor_v) && logs[0]->settings) {
        json_t *e = json_object_get(logs[0]->settings, "entropy_nats");
        if (e && json_is_number(e)) floor_v = json_number_value(e);
    }
    char title[1024];
    if (opt && opt->title) snprintf(title, sizeof title, "%s", opt->title);
    else {
        int n = snprintf(title, sizeof title, "ballast run%s: ", nlogs > 1 ? "s" : "");
        for (size_t r = 0; r < nlogs && n < (int)sizeof title; r++)
            n += snprintf(title + n, sizeof title - n, "%s%s", r ? ", " : "", names[r]);
    }

    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>", o);
    html_escape(o, title);
    fprintf(o, "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>", CSS);
    html_escape(o, title);
    fputs("</h1>\n<p>From ", o);
    for (size_t r = 0; r < nlogs; r++) {
        fprintf(o, "%s<code class=\"run\" data-run=\"%zu\">", r ? ", " : "", r);
        html_escape(o, logs[r]->path);
        fputs("</code>", o);
    }
    fputs(".</p>\n", o);

    if (plotted_len) plotted[0] = 0;
    if (missing_len) missing[0] = 0;
    /* notes: what the reader met, what is missing */
    char miss[512] = "";
    for (int f = 0; f < NF; f++) {
        bool used = false, has = false;
        for (size_t p = 0; p < NPLOTS; p++)
            for (int k = 0; k < PLOTS[p].nf; k++) used |= PLOTS[p].fields[k] == f;
        for (size_t r = 0; r < nlogs; r++) has |= has_field(logs[r], f);
        if (used && !has) {
            size_t n = strlen(miss);
            snprintf(miss + n, sizeof miss - n, "%s%s", n ? ", " : "", FIELD[f]);
        }
    }
    if (missing_len) snprintf(missing, missing_len, "%s", miss);
    bool any_notes = false;
    for (size_t r = 0; r < nlogs; r++) any_notes |= *report_notes(logs[r]) != 0;
    json_t *dev = logs[0]->settings ? json_object_get(logs[0]->settings, "device") : NULL;
    bool no_mfu = !has_field(logs[0], F_MFU) && json_is_string(dev);
    if (any_notes || *miss || !isfinite(floor_v) || no_mfu) {
        fputs("<div class=\"notes\">", o);
        for (size_t r = 0; r < nlogs; r++) {
            const char *notes = report_notes(logs[r]);
            if (!*notes) continue;
            if (nlogs > 1) { html_escape(o, names[r]); fputs(":\n", o); }
            html_escape(o, notes);
        }
        if (*miss) {
            fputs("Not in the log, not plotted: ", o);
            html_escape(o, miss);
            fputs(".\n", o);
        }
        if (no_mfu) {
            fputs("No MFU: no peak TFLOP/s is known for the device \"", o);
            html_escape(o, json_string_value(dev));
            fputs("\" (train with --peak-tflops X to count MFU against a measured peak).\n", o);
        }
        if (!isfinite(floor_v))
            fputs("Corpus entropy floor unknown: the loss plot has no floor line (give --entropy NATS, or train on "
                  "data from `ballast data synth`).\n", o);
        fputs("</div>\n", o);
    }
    fputs("<h2>Summary</h2>\n", o);
    for (size_t r = 0; r < nlogs; r++) {
        run_heading(o, &rs, r);
        write_summary(o, logs[r], floor_v);
    }
    fputs("<h2>Plots</h2>\n", o);
    for (size_t p = 0; p < NPLOTS; p++) {
        if (write_plot(o, &rs, &PLOTS[p], floor_v) && plotted_len) {
            size_t n = strlen(plotted);
            snprintf(plotted + n, plotted_len - n, "%s%s", n ? ", " : "", PLOTS[p].id);
        }
    }
    fputs("<h2>Settings</h2>\n", o);
    for (size_t r = 0; r < nlogs; r++) {
        run_heading(o, &rs, r);
        write_settings(o, logs[r]);
    }
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    fprintf(o, "<p class=\"missing\">Written by ballast report, %s.</p>\n</body>\n</html>\n", when);
    if (fflush(o) != 0 || ferror(o)) {
        snprintf(err, errlen, "writing the report failed: %s", strerror(errno));
        return -1;
    }
    return 0;
}
