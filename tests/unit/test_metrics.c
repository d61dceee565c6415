/* test_metrics.c: the Prometheus registry (common/metrics.h): exposition text
 * for each metric type, escaping, cumulative histogram buckets, exact sums
 * under concurrent updates, the naming rules, and the HTTP endpoint. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "metrics.h"
#include "tests/unit/helpers.h"

static uint64_t rng_state;
static uint64_t rnd(void) { return th_splitmix64(&rng_state); }
static double rnd_unit(void) { return th_unit(rnd()); }

static char *render(metrics_registry_t *r) {
    char *out = NULL;
    size_t len = 0;
    cr_assert_eq(metrics_render(r, &out, &len), 0);
    cr_assert_eq(strlen(out), len);
    return out;
}

/* ---- exposition per type ---- */

Test(metrics, counter_exposition) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    const char *labels[] = { "rank", "direction" };
    metric_family_t *f = metrics_register(r, METRIC_COUNTER, "ballast_offload_bytes_total", "Bytes moved to or from ballastd",
                                          labels, 2, NULL, 0, err, sizeof err);
    cr_assert_not_null(f, "%s", err);
    metric_t *a = metrics_series(f, (const char *[]){ "0", "to_host" });
    metric_t *b = metrics_series(f, (const char *[]){ "0", "to_device" });
    cr_assert_eq(metrics_series(f, (const char *[]){ "0", "to_host" }), a, "same labels, same series");
    metric_add_u64(a, 4096);
    metric_add_u64(a, 1000);
    metric_inc(b);
    metric_add(b, 0.5);
    metric_add(b, -3); /* counters never go down: ignored */
    char *t = render(r);
    const char *want = "# HELP ballast_offload_bytes_total Bytes moved to or from ballastd\n"
                       "# TYPE ballast_offload_bytes_total counter\n"
                       "ballast_offload_bytes_total{rank=\"0\",direction=\"to_host\"} 5096\n"
                       "ballast_offload_bytes_total{rank=\"0\",direction=\"to_device\"} 1.5\n";
    cr_assert_str_eq(t, want);
    free(t);
    metrics_registry_free(r);
}

Test(metrics, gauge_exposition_and_special_values) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    metric_t *g = metrics_gauge(r, "ballast_train_loss", "Loss of the last step", err, sizeof err);
    cr_assert_not_null(g, "%s", err);
    metric_family_t *f = metrics_register(r, METRIC_GAUGE, "ballast_pool_used_bytes", "Pool bytes in use",
                                          (const char *[]){ "tier" }, 1, NULL, 0, err, sizeof err);
    cr_assert_not_null(f, "%s", err);
    metric_set(g, 2.25);
    metric_t *ram = metrics_series(f, (const char *[]){ "ram" });
    metric_t *nvme = metrics_series(f, (const char *[]){ "nvme" });
    metric_t *gpu = metrics_series(f, (const char *[]){ "gpu" });
    metric_set(ram, -0.1);
    metric_add(ram, 0.2); /* gauges go both ways: -0.1 + 0.2 */
    metric_set(nvme, INFINITY);
    metric_set(gpu, NAN);
    char *t = render(r);
    char want[1024];
    char v[64];
    metrics_format_value(-0.1 + 0.2, v, sizeof v);
    snprintf(want, sizeof want,
             "# HELP ballast_train_loss Loss of the last step\n"
             "# TYPE ballast_train_loss gauge\n"
             "ballast_train_loss 2.25\n"
             "# HELP ballast_pool_used_bytes Pool bytes in use\n"
             "# TYPE ballast_pool_used_bytes gauge\n"
             "ballast_pool_used_bytes{tier=\"ram\"} %s\n"
             "ballast_pool_used_bytes{tier=\"nvme\"} +Inf\n"
             "ballast_pool_used_bytes{tier=\"gpu\"} NaN\n",
             v);
    cr_assert_str_eq(t, want);
    cr_assert_str_eq(v, "0.1", "-0.1+0.2 is 0.1 in its shortest round-trip form, got %s", v);
    free(t);
    metrics_registry_free(r);
}

Test(metrics, unlabeled_family_shows_zero_before_updates) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    cr_assert_not_null(metrics_counter(r, "ballast_spill_bytes_total", "Bytes written to NVMe", err, sizeof err));
    metrics_register(r, METRIC_GAUGE, "ballast_sessions", "Open sessions", (const char *[]){ "kind" }, 1, NULL, 0, err,
                     sizeof err);
    char *t = render(r);
    cr_assert_str_eq(t, "# HELP ballast_spill_bytes_total Bytes written to NVMe\n"
                        "# TYPE ballast_spill_bytes_total counter\n"
                        "ballast_spill_bytes_total 0\n"
                        "# HELP ballast_sessions Open sessions\n"
                        "# TYPE ballast_sessions gauge\n");
    free(t);
    metrics_registry_free(r);
}

Test(metrics, histogram_hand_case) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    const double b[] = { 0.25, 0.5, 1, 2.5 };
    metric_family_t *f = metrics_register(r, METRIC_HISTOGRAM, "ballast_train_step_duration_seconds", "Step time",
                                          (const char *[]){ "rank" }, 1, b, 4, err, sizeof err);
    cr_assert_not_null(f, "%s", err);
    metric_t *m = metrics_series(f, (const char *[]){ "3" });
    /* 0.25 falls in le=0.25 (bounds are inclusive), 0.5 in le=0.5, 3 above all */
    const double obs[] = { 0.125, 0.25, 0.5, 0.75, 3, 2.5 };
    for (size_t i = 0; i < 6; i++) metric_observe(m, obs[i]);
    metric_observe(m, NAN); /* ignored */
    char *t = render(r);
    cr_assert_str_eq(t, "# HELP ballast_train_step_duration_seconds Step time\n"
                        "# TYPE ballast_train_step_duration_seconds histogram\n"
                        "ballast_train_step_duration_seconds_bucket{rank=\"3\",le=\"0.25\"} 2\n"
                        "ballast_train_step_duration_seconds_bucket{rank=\"3\",le=\"0.5\"} 3\n"
                        "ballast_train_step_duration_seconds_bucket{rank=\"3\",le=\"1\"} 4\n"
                        "ballast_train_step_duration_seconds_bucket{rank=\"3\",le=\"2.5\"} 5\n"
                        "ballast_train_step_duration_seconds_bucket{rank=\"3\",le=\"+Inf\"} 6\n"
                        "ballast_train_step_duration_seconds_sum{rank=\"3\"} 7.125\n"
                        "ballast_train_step_duration_seconds_count{rank=\"3\"} 6\n");
    free(t);
    metrics_registry_free(r);
}

/* Random observations: the rendered buckets are cumulative counts of v <= le. */
Test(metrics, histogram_buckets_cumulative_random) {
    char err[METRICS_ERR_LEN];
    rng_state = 20261130;
    metrics_registry_t *r = metrics_registry_new();
    double b[12];
    for (int i = 0; i < 12; i++) b[i] = 0.01 * pow(2, i);
    metric_family_t *f =
        metrics_register(r, METRIC_HISTOGRAM, "ballast_test_latency_seconds", "x", NULL, 0, b, 12, err, sizeof err);
    cr_assert_not_null(f, "%s", err);
    metric_t *m = metrics_series(f, NULL);
    enum { NOBS = 5000 };
    static double v[NOBS];
    double sum = 0;
    for (int i = 0; i < NOBS; i++) {
        v[i] = rnd_unit() * 50 * rnd_unit(); /* 0..50, many above the last bound 20.48 */
        if (i % 97 == 0) v[i] = b[i % 12];   /* exactly on a bound */
        metric_observe(m, v[i]);
        sum += v[i];
    }
    char *t = render(r);
    uint64_t prev = 0;
    for (int k = 0; k <= 12; k++) {
        uint64_t want = 0;
        for (int i = 0; i < NOBS; i++) want += k == 12 || v[i] <= b[k];
        char le[64], key[128];
        if (k < 12) metrics_format_value(b[k], le, sizeof le); else strcpy(le, "+Inf");
        snprintf(key, sizeof key, "ballast_test_latency_seconds_bucket{le=\"%s\"} ", le);
        char *p = strstr(t, key);
        cr_assert_not_null(p, "no line %s in\n%s", key, t);
        unsigned long long got = strtoull(p + strlen(key), NULL, 10);
        cr_assert_eq(got, want, "bucket le=%s: %llu, expected %llu", le, got, (unsigned long long)want);
        cr_assert_geq(got, prev, "buckets must be cumulative");
        prev = got;
    }
    char *c = strstr(t, "ballast_test_latency_seconds_count ");
    cr_assert_not_null(c);
    cr_assert_eq(strtoull(c + strlen("ballast_test_latency_seconds_count "), NULL, 10), NOBS);
    char *s = strstr(t, "ballast_test_latency_seconds_sum ");
    cr_assert_not_null(s);
    double got_sum = strtod(s + strlen("ballast_test_latency_seconds_sum "), NULL);
    cr_assert(fabs(got_sum - sum) <= 1e-9 * sum, "sum %.17g vs %.17g", got_sum, sum);
    cr_assert_eq(metric_count(m), NOBS);
    free(t);
    metrics_registry_free(r);
}

/* ---- escaping ---- */

Test(metrics, label_and_help_escaping) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    metric_family_t *f = metrics_register(r, METRIC_GAUGE, "ballast_test_info", "path C:\\tmp\nsecond \"line\"",
                                          (const char *[]){ "path" }, 1, NULL, 0, err, sizeof err);
    cr_assert_not_null(f, "%s", err);
    metric_set(metrics_series(f, (const char *[]){ "a\"b\\c\nd" }), 1);
    char *t = render(r);
    cr_assert_str_eq(t, "# HELP ballast_test_info path C:\\\\tmp\\nsecond \"line\"\n"
                        "# TYPE ballast_test_info gauge\n"
                        "ballast_test_info{path=\"a\\\"b\\\\c\\nd\"} 1\n");
    free(t);
    metrics_registry_free(r);
}

Test(metrics, value_format_round_trips) {
    rng_state = 77;
    char buf[64];
    for (int i = 0; i < 20000; i++) {
        uint64_t bits = rnd();
        double v;
        memcpy(&v, &bits, sizeof v);
        if (!isfinite(v)) continue;
        metrics_format_value(v, buf, sizeof buf);
        cr_assert_eq(strtod(buf, NULL), v, "%s does not read back as %.17g", buf, v);
    }
    metrics_format_value(1e6, buf, sizeof buf);
    cr_assert_str_eq(buf, "1000000");
    metrics_format_value(-INFINITY, buf, sizeof buf);
    cr_assert_str_eq(buf, "-Inf");
    metrics_format_value(3e-7, buf, sizeof buf);
    cr_assert_str_eq(buf, "3e-07");
}

/* ---- concurrency ---- */

typedef struct {
    metric_t *c, *g, *h;
    uint64_t seed, added;
    int n;
} worker_arg_t;

static void *hammer(void *p) {
    worker_arg_t *a = p;
    uint64_t s = a->seed;
    for (int i = 0; i < a->n; i++) {
        uint64_t k = (th_lcg64(&s) >> 33) % 1000 + 1;
        metric_add_u64(a->c, k);
        metric_add(a->c, 0.25);   /* exact in binary: sums stay exact */
        metric_add(a->g, 1.0);
        metric_observe(a->h, (double)(k % 10));
        a->added += k;
    }
    return NULL;
}

Test(metrics, concurrent_updates_sum_exactly) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    metric_t *c = metrics_counter(r, "ballast_test_bytes_total", "x", err, sizeof err);
    metric_t *g = metrics_gauge(r, "ballast_test_inflight", "x", err, sizeof err);
    const double b[] = { 2, 5, 8 };
    metric_family_t *hf = metrics_register(r, METRIC_HISTOGRAM, "ballast_test_size_bytes", "x", NULL, 0, b, 3, err,
                                           sizeof err);
    cr_assert(c && g && hf, "%s", err);
    metric_t *h = metrics_series(hf, NULL);
    enum { NT = 8, N = 50000 };
    pthread_t th[NT];
    worker_arg_t args[NT];
    for (int i = 0; i < NT; i++) {
        args[i] = (worker_arg_t){ .c = c, .g = g, .h = h, .seed = 1000 + (uint64_t)i * 7919, .n = N };
        pthread_create(&th[i], NULL, hammer, &args[i]);
    }
    /* scrape while they run: must not crash or tear */
    for (int i = 0; i < 20; i++) { char *t = render(r); free(t); }
    uint64_t total = 0;
    for (int i = 0; i < NT; i++) { pthread_join(th[i], NULL); total += args[i].added; }
    cr_assert_eq(metric_value(c), (double)total + 0.25 * NT * N, "%.17g vs %.17g", metric_value(c),
                 (double)total + 0.25 * NT * N);
    cr_assert_eq(metric_value(g), (double)NT * N);
    cr_assert_eq(metric_count(h), (uint64_t)NT * N);
    metrics_registry_free(r);
}

/* ---- naming rules ---- */

Test(metrics, names_rejected_with_reason) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    const struct { metric_type_t t; const char *name; const char *why; } bad[] = {
        { METRIC_COUNTER, "train_tokens_total", "start with 'ballast_'" },
        { METRIC_COUNTER, "ballast_", "start with 'ballast_'" },
        { METRIC_COUNTER, "ballast_train_tokens", "must end in '_total'" },
        { METRIC_GAUGE, "ballast_sessions_total", "counters only" },
        { METRIC_HISTOGRAM, "ballast_step_total", "counters only" },
        { METRIC_GAUGE, "ballast_step_time_ms", "unit 'ms'" },
        { METRIC_GAUGE, "ballast_pool_used_mb", "unit 'mb'" },
        { METRIC_GAUGE, "ballast_mfu_percent", "ratio" },
        { METRIC_COUNTER, "ballast_wait_milliseconds_total", "seconds" },
        { METRIC_GAUGE, "ballast_train-loss", "not allowed" },
        { METRIC_GAUGE, "ballast_train:loss", "not allowed" },
        { METRIC_GAUGE, "ballast_Train_loss", "lower case" },
        { METRIC_GAUGE, "ballast_step_duration_seconds_count", "reserved" },
        { METRIC_GAUGE, "ballast_x__y", "empty components" },
        { METRIC_GAUGE, "", "empty" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        const double bk[] = { 1 };
        metric_family_t *f = metrics_register(r, bad[i].t, bad[i].name, "help", NULL, 0,
                                              bad[i].t == METRIC_HISTOGRAM ? bk : NULL,
                                              bad[i].t == METRIC_HISTOGRAM ? 1 : 0, err, sizeof err);
        cr_assert_null(f, "'%s' was accepted", bad[i].name);
        cr_assert(strstr(err, bad[i].why), "'%s': message '%s' lacks '%s'", bad[i].name, err, bad[i].why);
    }
    const struct { const char *label; const char *why; } bad_labels[] = {
        { "step", "series per value" }, { "epoch", "series per value" }, { "le", "reserved" },
        { "__name", "reserved" }, { "1rank", "not allowed" }, { "ra-nk", "not allowed" },
    };
    for (size_t i = 0; i < sizeof bad_labels / sizeof bad_labels[0]; i++) {
        err[0] = 0;
        metric_family_t *f = metrics_register(r, METRIC_GAUGE, "ballast_train_loss", "help",
                                              (const char *[]){ "rank", bad_labels[i].label }, 2, NULL, 0, err, sizeof err);
        cr_assert_null(f, "label '%s' was accepted", bad_labels[i].label);
        cr_assert(strstr(err, bad_labels[i].why), "label '%s': '%s'", bad_labels[i].label, err);
    }
    /* duplicates, missing help, bad buckets */
    cr_assert_null(metrics_register(r, METRIC_GAUGE, "ballast_a", "h", (const char *[]){ "rank", "rank" }, 2, NULL, 0,
                                    err, sizeof err));
    cr_assert(strstr(err, "twice"), "%s", err);
    cr_assert_null(metrics_register(r, METRIC_GAUGE, "ballast_a", "", NULL, 0, NULL, 0, err, sizeof err));
    cr_assert(strstr(err, "help"), "%s", err);
    const double dec[] = { 1, 0.5 };
    cr_assert_null(metrics_register(r, METRIC_HISTOGRAM, "ballast_h_seconds", "h", NULL, 0, dec, 2, err, sizeof err));
    cr_assert(strstr(err, "increasing"), "%s", err);
    cr_assert_null(metrics_register(r, METRIC_HISTOGRAM, "ballast_h_seconds", "h", NULL, 0, NULL, 0, err, sizeof err));
    /* the good names of the project pass */
    const char *good[] = { "ballast_train_tokens_total", "ballast_offload_bytes_total", "ballast_spill_bytes_total" };
    for (size_t i = 0; i < 3; i++) cr_assert_not_null(metrics_counter(r, good[i], "h", err, sizeof err), "%s", err);
    cr_assert_not_null(metrics_gauge(r, "ballast_mfu_ratio", "h", err, sizeof err), "%s", err);
    /* re-registering: same signature returns the family, another is refused */
    metric_family_t *f1 = metrics_register(r, METRIC_GAUGE, "ballast_x", "h", (const char *[]){ "rank" }, 1, NULL, 0,
                                           err, sizeof err);
    cr_assert_not_null(f1);
    cr_assert_eq(metrics_register(r, METRIC_GAUGE, "ballast_x", "h", (const char *[]){ "rank" }, 1, NULL, 0, err,
                                  sizeof err), f1);
    cr_assert_null(metrics_register(r, METRIC_GAUGE, "ballast_x", "h", (const char *[]){ "node" }, 1, NULL, 0, err,
                                    sizeof err));
    cr_assert(strstr(err, "already registered"), "%s", err);
    metrics_registry_free(r);
}

Test(metrics, build_info_in_default_registry) {
    char *t = render(metrics_default());
    char want[512];
    snprintf(want, sizeof want, "ballast_build_info{version=\"%s\",git_sha=\"%s\",cuda=\"%s\"} 1\n",
             metrics_build_version(), metrics_build_git_sha(), metrics_build_cuda());
    cr_assert(strstr(t, "# TYPE ballast_build_info gauge\n"), "%s", t);
    cr_assert(strstr(t, want), "%s lacks %s", t, want);
    cr_assert(strlen(metrics_build_git_sha()) > 0);
    free(t);
}

/* ---- collectors: state read at scrape time ---- */

typedef struct {
    metric_t *used, *spilled;
    uint64_t pool_used, spill_total; /* what a store would keep */
    int calls;
} fake_store_t;

static void collect(void *arg) {
    fake_store_t *s = arg;
    s->calls++;
    metric_set(s->used, (double)s->pool_used);
    metric_set_total(s->spilled, s->spill_total);
}

Test(metrics, collector_runs_before_each_render) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    fake_store_t st = { 0 };
    st.used = metrics_gauge(r, "ballast_pool_used_bytes", "Pool bytes in use", err, sizeof err);
    st.spilled = metrics_counter(r, "ballast_spill_bytes_total", "Bytes spilled", err, sizeof err);
    cr_assert(st.used && st.spilled, "%s", err);
    cr_assert_eq(metrics_add_collector(r, collect, &st), 0);
    rng_state = 31337;
    uint64_t last_total = 0;
    for (int i = 0; i < 5; i++) {
        st.pool_used = rnd() >> 20;
        uint64_t before = st.spill_total;
        st.spill_total += rnd() >> 40;
        if (i == 3) st.spill_total = before / 2; /* a total that went down (store reopened): ignored */
        char *t = render(r);
        char want[256];
        snprintf(want, sizeof want, "ballast_pool_used_bytes %llu\n", (unsigned long long)st.pool_used);
        cr_assert(strstr(t, want), "%s lacks %s", t, want);
        uint64_t expect = st.spill_total > last_total ? st.spill_total : last_total;
        snprintf(want, sizeof want, "ballast_spill_bytes_total %llu\n", (unsigned long long)expect);
        cr_assert(strstr(t, want), "%s lacks %s", t, want);
        last_total = expect;
        free(t);
    }
    cr_assert_eq(st.calls, 5);
    metrics_registry_free(r);
}

/* ---- HTTP endpoint ---- */

/* One HTTP/1.0 request to 127.0.0.1:port; returns the status code, the
 * body in body (malloc'ed). */
static int http(int port, const char *req, char **body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect to port %d", port);
    cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t n;
    while ((n = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)n;
        if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    close(fd);
    int code = 0;
    sscanf(buf, "HTTP/1.%*d %d", &code);
    char *b = strstr(buf, "\r\n\r\n");
    *body = strdup(b ? b + 4 : "");
    free(buf);
    return code;
}

Test(metrics, http_endpoint) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    metric_t *c = metrics_counter(r, "ballast_train_tokens_total", "Tokens trained on", err, sizeof err);
    metrics_server_t *s = metrics_server_start(r, "127.0.0.1", 0, err, sizeof err);
    cr_assert_not_null(s, "%s", err);
    int port = metrics_server_port(s);
    cr_assert_gt(port, 0);
    char *body;
    cr_assert_eq(http(port, "GET /metrics HTTP/1.0\r\n\r\n", &body), 200);
    cr_assert(strstr(body, "ballast_train_tokens_total 0\n"), "%s", body);
    free(body);
    metric_add_u64(c, 123456);
    cr_assert_eq(http(port, "GET /metrics HTTP/1.0\r\n\r\n", &body), 200);
    cr_assert(strstr(body, "ballast_train_tokens_total 123456\n"), "%s", body);
    free(body);
    cr_assert_eq(http(port, "GET / HTTP/1.0\r\n\r\n", &body), 404);
    free(body);
    cr_assert_eq(http(port, "GET /metricsx HTTP/1.0\r\n\r\n", &body), 404);
    free(body);
    cr_assert_eq(http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n", &body), 405);
    free(body);

    /* the same port again: a clear message */
    metrics_server_t *s2 = metrics_server_start(r, "127.0.0.1", port, err, sizeof err);
    cr_assert_null(s2);
    cr_assert(strstr(err, "in use") && strstr(err, "--metrics-port"), "%s", err);
    cr_assert_null(metrics_server_start(r, "localhost:80", 0, err, sizeof err));
    cr_assert(strstr(err, "not an IPv4 or IPv6 address"), "%s", err);
    cr_assert_null(metrics_server_start(r, "127.0.0.1", 70000, err, sizeof err));
    cr_assert(strstr(err, "out of range"), "%s", err);
    metrics_server_stop(s);
    /* stopped: the port is free again */
    s = metrics_server_start(r, "127.0.0.1", port, err, sizeof err);
    cr_assert_not_null(s, "port %d not released on stop: %s", port, err);
    metrics_server_stop(s);
    metrics_registry_free(r);
}

/* A worker's rank goes on every series of its registry, first, whoever
 * registered the family; a family with its own "rank" label keeps it. */
Test(metrics, const_label_on_every_series) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    static const char *const dir[] = { "direction" }, *const rk[] = { "rank" };
    metric_t *plain = metrics_counter(r, "ballast_a_total", "a", err, sizeof err);
    metric_family_t *fd = metrics_register(r, METRIC_COUNTER, "ballast_b_bytes_total", "b", dir, 1, NULL, 0, err, sizeof err);
    metric_family_t *fr = metrics_register(r, METRIC_GAUGE, "ballast_c", "c", rk, 1, NULL, 0, err, sizeof err);
    static const double bk[] = { 1 };
    metric_family_t *fh = metrics_register(r, METRIC_HISTOGRAM, "ballast_d_seconds", "d", NULL, 0, bk, 1, err, sizeof err);
    cr_assert(plain && fd && fr && fh, "%s", err);
    cr_assert_eq(metrics_set_const_label(r, "rank", "7", err, sizeof err), 0, "%s", err);
    cr_assert_eq(metrics_set_const_label(r, "bad-name", "1", err, sizeof err), -1);
    metric_add_u64(plain, 5);
    metric_add_u64(metrics_series(fd, (const char *[]){ "up" }), 11);
    metric_set(metrics_series(fr, (const char *[]){ "3" }), 2);
    metric_observe(metrics_series(fh, NULL), 0.5);
    char *t = NULL;
    cr_assert_eq(metrics_render(r, &t, NULL), 0);
    const char *want[] = { "ballast_a_total{rank=\"7\"} 5\n", "ballast_b_bytes_total{rank=\"7\",direction=\"up\"} 11\n",
                           "ballast_c{rank=\"3\"} 2\n", "ballast_d_seconds_bucket{rank=\"7\",le=\"1\"} 1\n",
                           "ballast_d_seconds_count{rank=\"7\"} 1\n" };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) cr_assert(strstr(t, want[i]), "no %s in\n%s", want[i], t);
    free(t);
    metrics_registry_free(r);
}

/* metrics_sum reads totals fed by another module, filtered by one label. */
Test(metrics, sum_by_label) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    static const char *const lab[] = { "direction", "tier" };
    metric_family_t *f = metrics_register(r, METRIC_COUNTER, "ballast_x_bytes_total", "x", lab, 2, NULL, 0, err, sizeof err);
    cr_assert_not_null(f, "%s", err);
    srand(99);
    uint64_t up = 0, all = 0;
    for (int i = 0; i < 40; i++) {
        uint64_t v = 1 + (uint64_t)(rand() % 100000);
        const char *d = rand() % 2 ? "up" : "down", *tier = rand() % 2 ? "pool" : "nvme";
        metric_add_u64(metrics_series(f, (const char *[]){ d, tier }), v);
        all += v;
        if (!strcmp(d, "up")) up += v;
    }
    cr_assert_eq(metrics_sum(r, "ballast_x_bytes_total", "direction", "up"), (double)up);
    cr_assert_eq(metrics_sum(r, "ballast_x_bytes_total", NULL, NULL), (double)all);
    cr_assert_eq(metrics_sum(r, "ballast_x_bytes_total", "direction", "sideways"), 0);
    cr_assert(isnan(metrics_sum(r, "ballast_x_bytes_total", "rank", "0")), "no such label");
    cr_assert(isnan(metrics_sum(r, "ballast_nothere_total", NULL, NULL)), "no such family");
    metrics_registry_free(r);
}
