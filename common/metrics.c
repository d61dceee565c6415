/* metrics.c: Prometheus registry (counters, gauges, histograms with labels),
 * text exposition format 0.0.4, and the /metrics endpoint on libmicrohttpd.
 *
 * Updates are lock-free: a counter keeps an integer part (one fetch_add for
 * byte and event counts, exact under any contention) and a double part
 * (compare-and-swap on its bits); a gauge is one double; a histogram keeps
 * one count per bucket and its _count is the sum of those, so a scrape never
 * sees _count disagree with the +Inf bucket. The registry's mutex guards
 * only registration, series creation and rendering. */
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef BALLAST_VERSION
#define BALLAST_VERSION "0.1.0"
#endif
#ifndef BALLAST_GIT_SHA
#define BALLAST_GIT_SHA "unknown"
#endif
#ifndef BALLAST_CUDA_VERSION
#define BALLAST_CUDA_VERSION "none"
#endif

struct metric {
    metric_family_t *fam;
    char **values;                /* n_labels label values, owned */
    _Atomic uint64_t u;           /* counter: integer part; gauge: unused */
    _Atomic uint64_t d;           /* bits of a double: counter's fractional adds, gauge value, histogram _sum */
    _Atomic uint64_t *buckets;    /* histogram: n_buckets + 1 counts (last = above every bound), not cumulative */
    metric_t *next;
};

struct metric_family {
    metrics_registry_t *reg;
    metric_type_t type;
    char *name, *help;
    int n_labels;
    char *labels[METRICS_MAX_LABELS];
    int n_buckets;
    double bounds[METRICS_MAX_BUCKETS]; /* histogram upper bounds, increasing */
    metric_t *series, *series_tail;
    metric_family_t *next;
};

#define METRICS_MAX_COLLECTORS 16

struct metrics_registry {
    pthread_mutex_t mu;
    pthread_mutex_t collect_mu;  /* one render runs the collectors at a time; removal waits for it */
    metric_family_t *fams, *fams_tail;
    int n_collectors;
    struct { void (*fn)(void *); void *arg; } collectors[METRICS_MAX_COLLECTORS]; /* run before each render */
    char *const_name, *const_value; /* label added to every series (a worker's rank), or NULL */
};

/* ---- doubles in atomics ---- */

static inline uint64_t dbits(double v) { uint64_t b; memcpy(&b, &v, sizeof b); return b; }
static inline double bitsd(uint64_t b) { double v; memcpy(&v, &b, sizeof v); return v; }

static void atomic_add_double(_Atomic uint64_t *a, double v) {
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, dbits(bitsd(old) + v), memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

/* ---- naming rules ---- */

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* Name components that mean a scaled or non-base unit, and what to use. */
static const struct { const char *word, *use; } NON_BASE[] = {
    { "ms", "seconds" }, { "msec", "seconds" }, { "millis", "seconds" }, { "milliseconds", "seconds" },
    { "us", "seconds" }, { "usec", "seconds" }, { "microseconds", "seconds" }, { "ns", "seconds" },
    { "nanoseconds", "seconds" }, { "sec", "seconds" }, { "secs", "seconds" }, { "minutes", "seconds" },
    { "hours", "seconds" }, { "days", "seconds" }, { "kb", "bytes" }, { "mb", "bytes" }, { "gb", "bytes" },
    { "tb", "bytes" }, { "kib", "bytes" }, { "mib", "bytes" }, { "gib", "bytes" }, { "tib", "bytes" },
    { "kilobytes", "bytes" }, { "megabytes", "bytes" }, { "gigabytes", "bytes" }, { "terabytes", "bytes" },
    { "percent", "ratio (0..1)" }, { "pct", "ratio (0..1)" }, { "tflops", "flops (base unit)" },
    { "gflops", "flops (base unit)" },
};

/* Labels whose values grow without bound: each value would be a new series. */
static const char *const UNBOUNDED_LABELS[] = { "step", "steps", "epoch", "iteration", "iter", "time", "timestamp",
                                                "tokens" };

int metrics_check_name(metric_type_t type, const char *name, char *err, size_t errlen) {
    if (!name || !*name) { snprintf(err, errlen, "metric name is empty"); return -1; }
    for (const char *p = name; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (p != name && c >= '0' && c <= '9');
        if (!ok) {
            snprintf(err, errlen, "metric name '%s': character '%c' not allowed; use [a-zA-Z_][a-zA-Z0-9_]*", name, c);
            return -1;
        }
    }
    if (strncmp(name, "ballast_", 8) != 0 || !name[8]) {
        snprintf(err, errlen, "metric name '%s' must start with 'ballast_' and name something after it", name);
        return -1;
    }
    for (const char *p = name; *p; p++)
        if (p[0] >= 'A' && p[0] <= 'Z') {
            snprintf(err, errlen, "metric name '%s': use lower case snake_case", name);
            return -1;
        }
    if (strstr(name, "__")) { snprintf(err, errlen, "metric name '%s': no empty components ('__')", name); return -1; }
    if (type == METRIC_COUNTER && !ends_with(name, "_total")) {
        snprintf(err, errlen, "counter '%s' must end in '_total'", name);
        return -1;
    }
    if (type != METRIC_COUNTER && ends_with(name, "_total")) {
        snprintf(err, errlen, "'%s' ends in '_total', which is for counters only; drop the suffix or make it a counter",
                 name);
        return -1;
    }
    if (ends_with(name, "_bucket") || ends_with(name, "_sum") || ends_with(name, "_count") || ends_with(name, "_")) {
        snprintf(err, errlen, "metric name '%s' ends in a suffix reserved for histogram series (or '_')", name);
        return -1;
    }
    /* every '_'-separated component against the non-base units */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", name);
    char *save = NULL;
    for (char *w = strtok_r(buf, "_", &save); w; w = strtok_r(NULL, "_", &save))
        for (size_t i = 0; i < sizeof NON_BASE / sizeof NON_BASE[0]; i++)
            if (strcmp(w, NON_BASE[i].word) == 0) {
                snprintf(err, errlen, "metric name '%s' uses the unit '%s'; use base units: %s", name, w,
                         NON_BASE[i].use);
                return -1;
            }
    return 0;
}

int metrics_check_label(metric_type_t type, const char *label, char *err, size_t errlen) {
    if (!label || !*label) { snprintf(err, errlen, "label name is empty"); return -1; }
    for (const char *p = label; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (p != label && c >= '0' && c <= '9');
        if (!ok) {
            snprintf(err, errlen, "label name '%s': character '%c' not allowed; use [a-zA-Z_][a-zA-Z0-9_]*", label, c);
            return -1;
        }
    }
    if (strncmp(label, "__", 2) == 0) {
        snprintf(err, errlen, "label name '%s': names starting with '__' are reserved by Prometheus", label);
        return -1;
    }
    if (strcmp(label, "le") == 0 || strcmp(label, "quantile") == 0) {
        snprintf(err, errlen, "label name '%s' is reserved for histogram buckets and summaries", label);
        return -1;
    }
    for (size_t i = 0; i < sizeof UNBOUNDED_LABELS / sizeof UNBOUNDED_LABELS[0]; i++)
        if (strcmp(label, UNBOUNDED_LABELS[i]) == 0) {
            snprintf(err, errlen,
                     "label '%s' takes a new value all the time and would create a series per value; "
                     "export it as a gauge or counter value instead",
                     label);
            return -1;
        }
    (void)type;
    return 0;
}

/* ---- registry ---- */

metrics_registry_t *metrics_registry_new(void) {
    metrics_registry_t *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->collect_mu, NULL);
    return r;
}

static void series_free(metric_t *m) {
    if (!m) return;
    if (m->values)
        for (int i = 0; i < m->fam->n_labels; i++) free(m->values[i]);
    free(m->values);
    free((void *)m->buckets);
    free(m);
}

static void family_free(metric_family_t *f) {
    for (metric_t *m = f->series, *n; m; m = n) { n = m->next; series_free(m); }
    for (int i = 0; i < f->n_labels; i++) free(f->labels[i]);
    free(f->name);
    free(f->help);
    free(f);
}

void metrics_registry_free(metrics_registry_t *r) {
    if (!r) return;
    for (metric_family_t *f = r->fams, *n; f; f = n) { n = f->next; family_free(f); }
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->collect_mu);
    free(r->const_name);
    free(r->const_value);
    free(r);
}

/* Create a series; the caller holds the lock. */
static metric_t *series_new_locked(metric_family_t *f, const char *const *values) {
    metric_t *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->fam = f;
    if (f->n_labels) {
        m->values = calloc((size_t)f->n_labels, sizeof *m->values);
        if (!m->values) { free(m); return NULL; }
        for (int i = 0; i < f->n_labels; i++)
            if (!(m->values[i] = strdup(values[i]))) { series_free(m); return NULL; }
    }
    if (f->type == METRIC_HISTOGRAM) {
        m->buckets = calloc((size_t)f->n_buckets + 1, sizeof *m->buckets);
        if (!m->buckets) { series_free(m); return NULL; }
    }
    atomic_store(&m->d, dbits(0.0));
    if (f->series_tail) f->series_tail->next = m; else f->series = m;
    f->series_tail = m;
    return m;
}

static const char *type_name(metric_type_t t) {
    return t == METRIC_COUNTER ? "counter" : t == METRIC_GAUGE ? "gauge" : "histogram";
}

metric_family_t *metrics_register(metrics_registry_t *r, metric_type_t type, const char *name, const char *help,
                                  const char *const *labels, int n_labels, const double *buckets, int n_buckets,
                                  char *err, size_t errlen) {
    if (!r) { snprintf(err, errlen, "no registry"); return NULL; }
    if (metrics_check_name(type, name, err, errlen)) return NULL;
    if (!help || !*help) { snprintf(err, errlen, "metric '%s' needs a help text", name); return NULL; }
    if (n_labels < 0 || n_labels > METRICS_MAX_LABELS || (n_labels && !labels)) {
        snprintf(err, errlen, "metric '%s': %d labels; at most %d", name, n_labels, METRICS_MAX_LABELS);
        return NULL;
    }
    for (int i = 0; i < n_labels; i++) {
        if (metrics_check_label(type, labels[i], err, errlen)) return NULL;
        for (int j = 0; j < i; j++)
            if (strcmp(labels[i], labels[j]) == 0) {
                snprintf(err, errlen, "metric '%s': label '%s' given twice", name, labels[i]);
                return NULL;
            }
    }
    if (type == METRIC_HISTOGRAM) {
        if (n_buckets < 1 || n_buckets > METRICS_MAX_BUCKETS || !buckets) {
            snprintf(err, errlen, "histogram '%s' needs 1..%d bucket bounds (got %d)", name, METRICS_MAX_BUCKETS,
                     n_buckets);
            return NULL;
        }
        for (int i = 0; i < n_buckets; i++) {
            if (!isfinite(buckets[i]) || (i && buckets[i] <= buckets[i - 1])) {
                snprintf(err, errlen, "histogram '%s': bucket bounds must be finite and strictly increasing (bound %d)",
                         name, i);
                return NULL;
            }
        }
    } else if (n_buckets) {
        snprintf(err, errlen, "metric '%s': only histograms have buckets", name);
        return NULL;
    }

    pthread_mutex_lock(&r->mu);
    for (metric_family_t *f = r->fams; f; f = f->next) {
        if (strcmp(f->name, name) != 0) continue;
        bool same = f->type == type && f->n_labels == n_labels &&
                    (type != METRIC_HISTOGRAM || (f->n_buckets == n_buckets &&
                                                  memcmp(f->bounds, buckets, sizeof(double) * (size_t)n_buckets) == 0));
        for (int i = 0; same && i < n_labels; i++) same = strcmp(f->labels[i], labels[i]) == 0;
        pthread_mutex_unlock(&r->mu);
        if (same) return f;
        snprintf(err, errlen, "metric '%s' is already registered as a %s with other labels or buckets", name,
                 type_name(f->type));
        return NULL;
    }
    metric_family_t *f = calloc(1, sizeof *f);
    if (!f) goto oom;
    f->reg = r;
    f->type = type;
    f->name = strdup(name);
    f->help = strdup(help);
    if (!f->name || !f->help) goto oom;
    for (int i = 0; i < n_labels; i++) {
        if (!(f->labels[i] = strdup(labels[i]))) goto oom;
        f->n_labels = i + 1;
    }
    f->n_labels = n_labels;
    f->n_buckets = type == METRIC_HISTOGRAM ? n_buckets : 0;
    if (f->n_buckets) memcpy(f->bounds, buckets, sizeof(double) * (size_t)n_buckets);
    if (n_labels == 0 && !series_new_locked(f, NULL)) goto oom;
    if (r->fams_tail) r->fams_tail->next = f; else r->fams = f;
    r->fams_tail = f;
    pthread_mutex_unlock(&r->mu);
    return f;
oom:
    pthread_mutex_unlock(&r->mu);
    if (f) family_free(f);
    snprintf(err, errlen, "out of memory registering metric '%s'", name);
    return NULL;
}

metric_t *metrics_series(metric_family_t *f, const char *const *values) {
    if (!f) return NULL;
    for (int i = 0; i < f->n_labels; i++)
        if (!values || !values[i]) return NULL;
    pthread_mutex_lock(&f->reg->mu);
    metric_t *m = f->series;
    for (; m; m = m->next) {
        int i = 0;
        while (i < f->n_labels && strcmp(m->values[i], values[i]) == 0) i++;
        if (i == f->n_labels) break;
    }
    if (!m) m = series_new_locked(f, values);
    pthread_mutex_unlock(&f->reg->mu);
    return m;
}

metric_t *metrics_counter(metrics_registry_t *r, const char *name, const char *help, char *err, size_t errlen) {
    metric_family_t *f = metrics_register(r, METRIC_COUNTER, name, help, NULL, 0, NULL, 0, err, errlen);
    return f ? metrics_series(f, NULL) : NULL;
}

metric_t *metrics_gauge(metrics_registry_t *r, const char *name, const char *help, char *err, size_t errlen) {
    metric_family_t *f = metrics_register(r, METRIC_GAUGE, name, help, NULL, 0, NULL, 0, err, errlen);
    return f ? metrics_series(f, NULL) : NULL;
}

/* ---- updates ---- */

void metric_add_u64(metric_t *m, uint64_t v) {
    if (!m) return;
    if (m->fam->type == METRIC_COUNTER) atomic_fetch_add_explicit(&m->u, v, memory_order_relaxed);
    else if (m->fam->type == METRIC_GAUGE) atomic_add_double(&m->d, (double)v);
}

void metric_inc(metric_t *m) { metric_add_u64(m, 1); }

void metric_add(metric_t *m, double v) {
    if (!m || m->fam->type == METRIC_HISTOGRAM) return;
    if (m->fam->type == METRIC_COUNTER && !(v >= 0)) return; /* counters only go up; NaN ignored */
    atomic_add_double(&m->d, v);
}

void metric_set(metric_t *m, double v) {
    if (!m || m->fam->type != METRIC_GAUGE) return;
    atomic_store_explicit(&m->d, dbits(v), memory_order_relaxed);
}

void metric_set_total(metric_t *m, uint64_t total) {
    if (!m || m->fam->type != METRIC_COUNTER) return;
    uint64_t old = atomic_load_explicit(&m->u, memory_order_relaxed);
    while (total > old &&
           !atomic_compare_exchange_weak_explicit(&m->u, &old, total, memory_order_relaxed, memory_order_relaxed)) {
    }
}

void metric_observe(metric_t *m, double v) {
    if (!m || m->fam->type != METRIC_HISTOGRAM || isnan(v)) return;
    const metric_family_t *f = m->fam;
    int lo = 0, hi = f->n_buckets; /* first bound >= v; n_buckets = above all */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v <= f->bounds[mid]) hi = mid; else lo = mid + 1;
    }
    atomic_fetch_add_explicit(&m->buckets[lo], 1, memory_order_relaxed);
    atomic_add_double(&m->d, v);
}

double metric_value(const metric_t *m) {
    if (!m) return 0;
    double d = bitsd(atomic_load_explicit(&((metric_t *)m)->d, memory_order_relaxed));
    if (m->fam->type == METRIC_COUNTER) d += (double)atomic_load_explicit(&((metric_t *)m)->u, memory_order_relaxed);
    return d;
}

uint64_t metric_count(const metric_t *m) {
    if (!m || m->fam->type != METRIC_HISTOGRAM) return 0;
    uint64_t n = 0;
    for (int i = 0; i <= m->fam->n_buckets; i++) n += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
    return n;
}

/* ---- exposition ---- */

typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void sb_str(sbuf_t *b, const char *s) { sb_put(b, s, strlen(s)); }

/* HELP text: escape backslash and newline. Label values: also '"'. */
static void sb_escaped(sbuf_t *b, const char *s, bool quote) {
    for (; *s; s++) {
        if (*s == '\\') sb_str(b, "\\\\");
        else if (*s == '\n') sb_str(b, "\\n");
        else if (quote && *s == '"') sb_str(b, "\\\"");
        else sb_put(b, s, 1);
    }
}

void metrics_format_value(double v, char *buf, size_t len) {
    if (isnan(v)) { snprintf(buf, len, "NaN"); return; }
    if (isinf(v)) { snprintf(buf, len, v > 0 ? "+Inf" : "-Inf"); return; }
    if (v == floor(v) && fabs(v) < 1e15) { snprintf(buf, len, "%.0f", v); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* name{labels[,le="x"]} value\n */
static void sb_sample(sbuf_t *b, const char *name, const char *suffix, const metric_t *m, const char *le, double v) {
    sb_str(b, name);
    sb_str(b, suffix);
    const metric_family_t *f = m->fam;
    const metrics_registry_t *r = f->reg;
    bool cl = r->const_name != NULL;
    for (int i = 0; cl && i < f->n_labels; i++) cl = strcmp(f->labels[i], r->const_name) != 0;
    if (f->n_labels || le || cl) {
        sb_str(b, "{");
        if (cl) {
            sb_str(b, r->const_name);
            sb_str(b, "=\"");
            sb_escaped(b, r->const_value, true);
            sb_str(b, "\"");
        }
        for (int i = 0; i < f->n_labels; i++) {
            if (i || cl) sb_str(b, ",");
            sb_str(b, f->labels[i]);
            sb_str(b, "=\"");
            sb_escaped(b, m->values[i], true);
            sb_str(b, "\"");
        }
        if (le) {
            if (f->n_labels || cl) sb_str(b, ",");
            sb_str(b, "le=\"");
            sb_str(b, le);
            sb_str(b, "\"");
        }
        sb_str(b, "}");
    }
    char num[64];
    metrics_format_value(v, num, sizeof num);
    sb_str(b, " ");
    sb_str(b, num);
    sb_str(b, "\n");
}

int metrics_add_collector(metrics_registry_t *r, void (*fn)(void *arg), void *arg) {
    pthread_mutex_lock(&r->mu);
    int rc = -1;
    if (r->n_collectors < METRICS_MAX_COLLECTORS) {
        r->collectors[r->n_collectors].fn = fn;
        r->collectors[r->n_collectors].arg = arg;
        r->n_collectors++;
        rc = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void metrics_remove_collector(metrics_registry_t *r, void (*fn)(void *arg), void *arg) {
    pthread_mutex_lock(&r->collect_mu); /* no render is running a collector after this */
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_collectors; i++) {
        if (r->collectors[i].fn != fn || r->collectors[i].arg != arg) continue;
        memmove(&r->collectors[i], &r->collectors[i + 1], sizeof r->collectors[0] * (size_t)(r->n_collectors - i - 1));
        r->n_collectors--;
        break;
    }
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&r->collect_mu);
}

int metrics_render(metrics_registry_t *r, char **out, size_t *len) {
    sbuf_t b = { 0 };
    sb_str(&b, "");
    /* Collectors run under collect_mu, not the registry lock: they set
     * metrics, and metrics_series() may take the registry lock. */
    pthread_mutex_lock(&r->collect_mu);
    pthread_mutex_lock(&r->mu);
    int nc = r->n_collectors;
    struct { void (*fn)(void *); void *arg; } cs[METRICS_MAX_COLLECTORS];
    memcpy(cs, r->collectors, sizeof cs[0] * (size_t)nc);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < nc; i++) cs[i].fn(cs[i].arg);
    pthread_mutex_unlock(&r->collect_mu);
    pthread_mutex_lock(&r->mu);
    for (const metric_family_t *f = r->fams; f; f = f->next) {
        sb_str(&b, "# HELP ");
        sb_str(&b, f->name);
        sb_str(&b, " ");
        sb_escaped(&b, f->help, false);
        sb_str(&b, "\n# TYPE ");
        sb_str(&b, f->name);
        sb_str(&b, " ");
        sb_str(&b, type_name(f->type));
        sb_str(&b, "\n");
        for (const metric_t *m = f->series; m; m = m->next) {
            if (f->type != METRIC_HISTOGRAM) {
                sb_sample(&b, f->name, "", m, NULL, metric_value(m));
                continue;
            }
            uint64_t cum = 0;
            char le[64];
            for (int i = 0; i <= f->n_buckets; i++) {
                cum += atomic_load_explicit(&((metric_t *)m)->buckets[i], memory_order_relaxed);
                if (i < f->n_buckets) metrics_format_value(f->bounds[i], le, sizeof le);
                else snprintf(le, sizeof le, "+Inf");
                sb_sample(&b, f->name, "_bucket", m, le, (double)cum);
            }
            sb_sample(&b, f->name, "_sum", m, NULL, metric_value(m));
            sb_sample(&b, f->name, "_count", m, NULL, (double)cum);
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (b.oom) { free(b.p); return -1; }
    *out = b.p;
    if (len) *len = b.len;
    return 0;
}

/* ---- build info and the default registry ---- */

const char *metrics_build_version(void) { return BALLAST_VERSION; }
const char *metrics_build_git_sha(void) { return BALLAST_GIT_SHA; }
const char *metrics_build_cuda(void) { return BALLAST_CUDA_VERSION; }

int metrics_register_build_info(metrics_registry_t *r, char *err, size_t errlen) {
    static const char *const labels[] = { "version", "git_sha", "cuda" };
    metric_family_t *f = metrics_register(r, METRIC_GAUGE, "ballast_build_info",
                                          "Build of this program: version, git commit and CUDA release; always 1",
                                          labels, 3, NULL, 0, err, errlen);
    if (!f) return -1;
    const char *values[] = { BALLAST_VERSION, BALLAST_GIT_SHA, BALLAST_CUDA_VERSION };
    metric_t *m = metrics_series(f, values);
    if (!m) { snprintf(err, errlen, "out of memory"); return -1; }
    metric_set(m, 1);
    return 0;
}

int metrics_set_const_label(metrics_registry_t *r, const char *name, const char *value, char *err, size_t errlen) {
    if (!r || !name || !value) { snprintf(err, errlen, "metrics_set_const_label: NULL argument"); return -1; }
    if (metrics_check_label(METRIC_GAUGE, name, err, errlen)) return -1;
    char *n = strdup(name), *v = strdup(value);
    if (!n || !v) {
        free(n);
        free(v);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_lock(&r->mu);
    free(r->const_name);
    free(r->const_value);
    r->const_name = n;
    r->const_value = v;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

double metrics_sum(metrics_registry_t *r, const char *name, const char *label, const char *value) {
    if (!r || !name) return NAN;
    double sum = NAN;
    pthread_mutex_lock(&r->mu);
    for (const metric_family_t *f = r->fams; f; f = f->next) {
        if (strcmp(f->name, name) != 0) continue;
        int li = -1;
        for (int i = 0; label && i < f->n_labels; i++)
            if (strcmp(f->labels[i], label) == 0) li = i;
        if (label && li < 0) break; /* no such label: nothing matches */
        sum = 0;
        for (const metric_t *m = f->series; m; m = m->next)
            if (li < 0 || strcmp(m->values[li], value) == 0) sum += metric_value(m);
        break;
    }
    pthread_mutex_unlock(&r->mu);
    return sum;
}

static metrics_registry_t *g_default;
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;

static void default_init(void) {
    char err[METRICS_ERR_LEN];
    g_default = metrics_registry_new();
    if (g_default) metrics_register_build_info(g_default, err, sizeof err);
}

metrics_registry_t *metrics_default(void) {
    pthread_once(&g_default_once, default_init);
    return g_default;
}

/* ---- HTTP endpoint ---- */

struct metrics_server {
    struct MHD_Daemon *daemon;
    metrics_registry_t *reg;
    int port;
};

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, char *body, size_t len, bool owned) {
    struct MHD_Response *resp =
        owned ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE)
              : MHD_create_response_from_buffer(len, body, MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        if (owned) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            code == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain; charset=utf-8");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size, void **req_cls) {
    static char not_found[] = "not found: the metrics are at /metrics\n";
    static char bad_method[] = "method not allowed: use GET /metrics\n";
    struct metrics_server *s = cls;
    (void)version; (void)upload_data; (void)upload_data_size; (void)req_cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return send_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, bad_method, sizeof bad_method - 1, false);
    if (strcmp(url, "/metrics") != 0) return send_text(c, MHD_HTTP_NOT_FOUND, not_found, sizeof not_found - 1, false);
    char *body = NULL;
    size_t len = 0;
    if (metrics_render(s->reg, &body, &len) != 0) return MHD_NO;
    return send_text(c, MHD_HTTP_OK, body, len, true);
}

metrics_server_t *metrics_server_start(metrics_registry_t *r, const char *bind_addr, int port, char *err,
                                       size_t errlen) {
    if (!r) { snprintf(err, errlen, "no registry"); return NULL; }
    if (!bind_addr || !*bind_addr) bind_addr = "0.0.0.0";
    if (port < 0 || port > 65535) {
        snprintf(err, errlen, "metrics port %d is out of range; use 1..65535 (0 = any free port)", port);
        return NULL;
    }
    /* Bind the socket here so that a failure has an errno to report. */
    struct sockaddr_storage ss;
    socklen_t sl;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    bool v6 = false;
    if (inet_pton(AF_INET, bind_addr, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        sl = sizeof *a4;
    } else if (inet_pton(AF_INET6, bind_addr, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        sl = sizeof *a6;
        v6 = true;
    } else {
        snprintf(err, errlen, "metrics bind address '%s' is not an IPv4 or IPv6 address; use e.g. 0.0.0.0 or 127.0.0.1",
                 bind_addr);
        return NULL;
    }
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { snprintf(err, errlen, "metrics socket: %s", strerror(errno)); return NULL; }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0) {
        int e = errno;
        close(fd);
        snprintf(err, errlen, "metrics endpoint: cannot bind %s%s%s:%d: %s; %s", v6 ? "[" : "", bind_addr,
                 v6 ? "]" : "", port, strerror(e),
                 e == EADDRINUSE ? "another program holds it: choose another --metrics-port"
                                 : "check --metrics-bind names an address of this machine");
        return NULL;
    }
    if (listen(fd, 64) != 0) {
        int e = errno;
        close(fd);
        snprintf(err, errlen, "metrics endpoint: listen on port %d: %s", port, strerror(e));
        return NULL;
    }
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    getsockname(fd, (struct sockaddr *)&got, &gl);
    int bound = ntohs(v6 ? ((struct sockaddr_in6 *)&got)->sin6_port : ((struct sockaddr_in *)&got)->sin_port);

    metrics_server_t *s = calloc(1, sizeof *s);
    if (!s) { close(fd); snprintf(err, errlen, "out of memory"); return NULL; }
    s->reg = r;
    s->port = bound;
    s->daemon = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | (v6 ? MHD_USE_IPv6 : 0), (uint16_t)bound, NULL, NULL,
                                 handle, s, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned int)10, MHD_OPTION_END);
    if (!s->daemon) {
        close(fd);
        free(s);
        snprintf(err, errlen, "metrics endpoint: libmicrohttpd could not start on port %d", bound);
        return NULL;
    }
    return s;
}

int metrics_server_port(const metrics_server_t *s) { return s ? s->port : 0; }

void metrics_server_stop(metrics_server_t *s) {
    if (!s) return;
    MHD_stop_daemon(s->daemon); /* closes the listening socket too */
    free(s);
}
