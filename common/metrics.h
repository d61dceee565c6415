/* metrics.h: a Prometheus metrics registry and its /metrics HTTP endpoint.
 *
 * A registry holds metric families (counter, gauge, histogram), each with a
 * fixed list of label names. A family has one series per set of label
 * values; metrics_series() finds or creates it (under the registry's lock)
 * and returns a pointer that stays valid until the registry is freed. Hot
 * paths keep that pointer and update it with atomics only: no lock, no
 * allocation.
 *
 * metrics_render() writes the text exposition format 0.0.4. Names are
 * checked when a family is registered: the prefix "ballast_", Prometheus'
 * character set, counters (and only counters) ending in "_total", base
 * units (seconds, bytes, ratio; no "_ms", "_mb", "_percent"...), and no
 * label that grows without bound ("step", "epoch", "time"...).
 *
 * metrics_server_start() serves GET /metrics with libmicrohttpd from its own
 * thread; every other path gets 404. */
#ifndef BALLAST_METRICS_H
#define BALLAST_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define METRICS_MAX_LABELS 8     /* label names per family */
#define METRICS_MAX_BUCKETS 64   /* histogram bucket bounds, +Inf excluded */
#define METRICS_ERR_LEN 256

typedef enum { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM } metric_type_t;

typedef struct metrics_registry metrics_registry_t;
typedef struct metric_family metric_family_t;
typedef struct metric metric_t; /* one series: a family with its label values */

/* ---- registry ---- */

metrics_registry_t *metrics_registry_new(void);
/* Frees the registry, its families and series. No update may run concurrently. */
void metrics_registry_free(metrics_registry_t *r);

/* The process-wide registry that a worker or ballastd serves, created on
 * first use with ballast_build_info already in it. Never freed. */
metrics_registry_t *metrics_default(void);

/* Register a family. labels: n_labels label names (may be NULL when 0).
 * buckets: histogram upper bounds, strictly increasing and finite (+Inf is
 * implicit); NULL/0 for other types. Registering the same name again with
 * the same type and labels returns the existing family; anything else that
 * breaks the naming rules, or conflicts with an existing family, returns
 * NULL with the reason in err. A family without labels gets its one series
 * at once, so it shows in the output with value 0 before the first update. */
metric_family_t *metrics_register(metrics_registry_t *r, metric_type_t type, const char *name, const char *help,
                                  const char *const *labels, int n_labels, const double *buckets, int n_buckets,
                                  char *err, size_t errlen);

/* Add the label name="value" to every series the registry renders, first
 * (a worker's rank="N", so that families registered by any module carry
 * it), except in families that have a label of that name themselves.
 * Setting it again replaces it. 0, or -1 with err (bad name, no memory). */
int metrics_set_const_label(metrics_registry_t *r, const char *name, const char *value, char *err, size_t errlen);

/* Sum of the values of family `name`'s series whose label `label` is
 * `value` (label NULL: every series; histograms add their _sum). NAN when
 * no family has that name, or it has no such label. For reading totals
 * that another module feeds (the offload client's bytes and waits). */
double metrics_sum(metrics_registry_t *r, const char *name, const char *label, const char *value);

/* Check a metric or label name against the rules above without registering
 * (0 ok, -1 with the reason in err). */
int metrics_check_name(metric_type_t type, const char *name, char *err, size_t errlen);
int metrics_check_label(metric_type_t type, const char *label, char *err, size_t errlen);

/* The series for these label values (n_labels of them, in the family's
 * order; NULL when the family has none), created on first use. Returns NULL
 * on a NULL family, a NULL value or out of memory. Takes the registry lock:
 * look a series up once and keep the pointer. */
metric_t *metrics_series(metric_family_t *f, const char *const *values);

/* Shorthands: register a family without labels and return its series
 * (NULL with err filled on a rule violation). */
metric_t *metrics_counter(metrics_registry_t *r, const char *name, const char *help, char *err, size_t errlen);
metric_t *metrics_gauge(metrics_registry_t *r, const char *name, const char *help, char *err, size_t errlen);

/* Call fn(arg) at the start of every metrics_render(), before the registry
 * lock is taken: a place to set gauges that mirror state read on demand
 * (pool bytes in use, open sessions) instead of on every change. fn runs on
 * the HTTP server's thread. Returns 0, or -1 when 16 are registered already. */
int metrics_add_collector(metrics_registry_t *r, void (*fn)(void *arg), void *arg);
/* Remove the collector added with this fn and arg (before arg is freed). */
void metrics_remove_collector(metrics_registry_t *r, void (*fn)(void *arg), void *arg);

/* ---- updates (lock-free; each is safe from any thread) ---- */

void metric_inc(metric_t *m);                /* counter or gauge += 1 */
void metric_add_u64(metric_t *m, uint64_t v); /* counter or gauge += v, one atomic add */
void metric_add(metric_t *m, double v);      /* counter += v (v >= 0, others ignored) or gauge += v */
void metric_set(metric_t *m, double v);      /* gauge = v */
/* Counter mirroring a running total kept elsewhere (a store's byte count,
 * read by a collector): set its integer part to total. A total lower than
 * the current one is ignored, so the counter never goes down. */
void metric_set_total(metric_t *m, uint64_t total);
void metric_observe(metric_t *m, double v);  /* histogram: count v in its bucket, add to _sum */
double metric_value(const metric_t *m);      /* counter/gauge value; histogram: _sum */
uint64_t metric_count(const metric_t *m);    /* histogram: _count; others 0 */

/* ---- exposition ---- */

/* Render every family in registration order as text format 0.0.4 into a
 * malloc'ed NUL-terminated string (*out, caller frees; *len its length).
 * Returns 0, or -1 when out of memory. */
int metrics_render(metrics_registry_t *r, char **out, size_t *len);

/* Format a sample value the way the format wants it: shortest decimal that
 * reads back to the same double, "+Inf", "-Inf", "NaN". */
void metrics_format_value(double v, char *buf, size_t len);

/* Add ballast_build_info{version,git_sha,cuda} = 1 (done by metrics_default). */
int metrics_register_build_info(metrics_registry_t *r, char *err, size_t errlen);

/* Build identity baked in at compile time (common/module.mk passes them). */
const char *metrics_build_version(void);
const char *metrics_build_git_sha(void);
const char *metrics_build_cuda(void);

/* ---- HTTP endpoint ---- */

typedef struct metrics_server metrics_server_t;

/* Serve r on bind_addr:port (an IPv4 or IPv6 literal; NULL = "0.0.0.0";
 * port 0 = any free port) from a libmicrohttpd thread. GET or HEAD /metrics
 * answers 200 with the exposition; any other path 404, any other method 405.
 * Returns the server, or NULL with the reason in err (address in use, bad
 * address...). */
metrics_server_t *metrics_server_start(metrics_registry_t *r, const char *bind_addr, int port, char *err,
                                       size_t errlen);
/* The port actually bound (useful with port 0). */
int metrics_server_port(const metrics_server_t *s);
/* Stop serving and free. NULL is fine. */
void metrics_server_stop(metrics_server_t *s);

#endif
