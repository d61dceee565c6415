/* metrics_concurrency.c: threads update counters, gauges and a histogram of
 * one registry while others create labelled series and scrape it over HTTP;
 * the final values must be the exact sums. A plain program (not Criterion)
 * so that `make tsan` runs it under ThreadSanitizer; metrics_concurrency.sh
 * runs it. Prints TAP lines. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "metrics.h"

enum { NUPD = 6, NSCRAPE = 2, ITERS = 20000 };

static metric_t *g_counter, *g_gauge, *g_hist;
static metric_family_t *g_labeled;
static int g_port;
static metric_t *g_mirror;
static _Atomic int g_collects; /* collector calls */
static _Atomic int g_removed;  /* set once the collector is unhooked */
static _Atomic int g_late;     /* calls after that: must stay 0 */

static void collector(void *arg) {
    (void)arg;
    if (g_removed) g_late++;
    g_collects++;
    metric_set(g_mirror, (double)g_collects);
}

typedef struct { int id; uint64_t added; } arg_t;

static void *updater(void *p) {
    arg_t *a = p;
    uint64_t s = 977 + (uint64_t)a->id;
    char lab[16];
    snprintf(lab, sizeof lab, "%d", a->id % 3);
    metric_t *mine = metrics_series(g_labeled, (const char *[]){ lab }); /* shared by ids with the same label */
    for (int i = 0; i < ITERS; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t k = (s >> 35) % 4096;
        metric_add_u64(g_counter, k);
        metric_add(g_gauge, 1);
        metric_observe(g_hist, (double)(k % 100) / 10);
        metric_inc(mine);
        a->added += k;
    }
    return NULL;
}

static int scrape_once(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)g_port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) { if (fd >= 0) close(fd); return -1; }
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) { close(fd); return -1; }
    char buf[8192];
    ssize_t n, total = 0;
    int ok = 0;
    while ((n = read(fd, buf, sizeof buf - 1)) > 0) {
        buf[n] = 0;
        if (total == 0 && strncmp(buf, "HTTP/1.", 7) == 0 && strstr(buf, " 200 ")) ok = 1;
        total += n;
    }
    close(fd);
    return ok ? 0 : -1;
}

static void *scraper(void *p) {
    int *fails = p;
    for (int i = 0; i < 25; i++) *fails += scrape_once() != 0;
    return NULL;
}

int main(void) {
    char err[METRICS_ERR_LEN];
    int failed = 0;
    metrics_registry_t *r = metrics_registry_new();
    g_counter = metrics_counter(r, "ballast_test_bytes_total", "x", err, sizeof err);
    g_gauge = metrics_gauge(r, "ballast_test_inflight", "x", err, sizeof err);
    const double b[] = { 1, 2, 5 };
    g_hist = metrics_series(metrics_register(r, METRIC_HISTOGRAM, "ballast_test_wait_seconds", "x", NULL, 0, b, 3, err,
                                             sizeof err), NULL);
    g_labeled = metrics_register(r, METRIC_COUNTER, "ballast_test_events_total", "x", (const char *[]){ "worker" }, 1,
                                 NULL, 0, err, sizeof err);
    g_mirror = metrics_gauge(r, "ballast_test_mirror", "x", err, sizeof err);
    if (!g_mirror || metrics_add_collector(r, collector, NULL) != 0) { printf("not ok - collector: %s\n", err); return 1; }
    if (!g_counter || !g_gauge || !g_hist || !g_labeled) { printf("not ok - setup: %s\n", err); return 1; }
    metrics_server_t *srv = metrics_server_start(r, "127.0.0.1", 0, err, sizeof err);
    if (!srv) { printf("not ok - server: %s\n", err); return 1; }
    g_port = metrics_server_port(srv);

    pthread_t up[NUPD], sc[NSCRAPE];
    arg_t args[NUPD];
    int scrape_fails[NSCRAPE] = { 0 };
    for (int i = 0; i < NSCRAPE; i++) pthread_create(&sc[i], NULL, scraper, &scrape_fails[i]);
    for (int i = 0; i < NUPD; i++) { args[i] = (arg_t){ .id = i }; pthread_create(&up[i], NULL, updater, &args[i]); }
    uint64_t want = 0;
    for (int i = 0; i < NUPD; i++) { pthread_join(up[i], NULL); want += args[i].added; }
    /* one scrape of our own before the unhook, so the collector has run at
     * least once however the threads were scheduled (a loaded machine can
     * finish every update before the scrapers' first render) */
    int own_fail = scrape_once() != 0;
    /* unhook while the scrapers may still be rendering */
    metrics_remove_collector(r, collector, NULL);
    g_removed = 1;
    int sf = own_fail;
    for (int i = 0; i < NSCRAPE; i++) { pthread_join(sc[i], NULL); sf += scrape_fails[i]; }

#define CHECK(cond, ...) do { if (cond) printf("ok - " __VA_ARGS__); else { failed++; printf("not ok - " __VA_ARGS__); } printf("\n"); } while (0)
    CHECK(metric_value(g_counter) == (double)want, "counter is the exact sum (%.0f vs %llu)", metric_value(g_counter),
          (unsigned long long)want);
    CHECK(metric_value(g_gauge) == (double)NUPD * ITERS, "gauge adds are exact");
    CHECK(metric_count(g_hist) == (uint64_t)NUPD * ITERS, "histogram counted every observation");
    double lab = 0;
    for (int k = 0; k < 3; k++) {
        char l[4];
        snprintf(l, sizeof l, "%d", k);
        lab += metric_value(metrics_series(g_labeled, (const char *[]){ l }));
    }
    CHECK(lab == (double)NUPD * ITERS, "series created concurrently share their counts");
    CHECK(g_collects > 0 && g_late == 0, "collector ran %d times, never after its removal (%d late)", g_collects, g_late);
    CHECK(sf == 0, "%d scrapes answered 200 (%d failed)", NSCRAPE * 25 + 1, sf);
    metrics_server_stop(srv);
    metrics_registry_free(r);
    return failed != 0;
}
