/* metrics_demo.c: a stand-in for a worker and ballastd, for
 * tests/integration/metrics_scrape.sh. Serves the process registry on
 * --metrics-bind:--metrics-port with the training metrics of
 * workers/train/progress.h and the service gauges ballastd exports, then moves
 * them one training step per "step" line read on stdin; exits on "quit" or
 * end of input.
 *
 * First stdout line, JSON: {"port": P, "tokens_per_rank_step": N,
 * "to_host_bytes_per_step": H, "to_device_bytes_per_step": D,
 * "spill_bytes_per_step": S}. Then "ok STEP" after each step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "options.h"
#include "workers/train/progress.h"

static int64_t opt_port, opt_rank, opt_gpus;
static const char *opt_bind;
static const opt_t OPTS[] = {
    { "metrics-port", OPT_INT, "0", 0, 65535, NULL, "port of /metrics (0 = any free port)", &opt_port },
    { "metrics-bind", OPT_STRING, "127.0.0.1", 0, 0, NULL, "address to bind", &opt_bind },
    { "rank", OPT_INT, "1", 0, 1 << 20, NULL, "rank label", &opt_rank },
    { "gpus", OPT_INT, "4", 1, 1 << 20, NULL, "world size", &opt_gpus },
};

#define TOKENS_PER_STEP 65536
#define TO_HOST 3000000
#define TO_DEVICE 2000000
#define SPILL 1048576

/* What ballastd mirrors at scrape time (metrics_add_collector). */
typedef struct {
    metric_t *pool_used, *sessions;
    int64_t steps;
} svc_t;

static void collect(void *arg) {
    svc_t *s = arg;
    metric_set(s->pool_used, (double)(s->steps * TO_HOST));
    metric_set(s->sessions, (double)opt_gpus);
}

int main(int argc, char **argv) {
    log_init("metrics_demo", -1);
    char err[512];
    const char *pos[1];
    int npos = 0;
    int rc = opt_parse(OPTS, sizeof OPTS / sizeof OPTS[0], argc, argv, pos, 0, &npos, "usage: metrics_demo [options]",
                       err, sizeof err);
    if (rc) { if (rc < 0) fprintf(stderr, "metrics_demo: %s\n", err); return rc < 0 ? 2 : 0; }

    metrics_registry_t *reg = metrics_default();
    progress_cfg_t cfg = { .total_steps = 1000, .tokens_per_step = TOKENS_PER_STEP * opt_gpus, .flops_per_token = 1e9,
                           .n_gpus = (int)opt_gpus, .device = "NVIDIA H200", .metrics = reg, .rank = (int)opt_rank };
    progress_t *p = progress_new(&cfg, err, sizeof err);
    if (!p) die("%s", err);

    /* the service side, as ballastd registers it */
    svc_t svc = { 0 };
    metric_t *spill = metrics_counter(reg, "ballast_spill_bytes_total", "Bytes written from the pool to NVMe", err,
                                      sizeof err);
    svc.pool_used = metrics_gauge(reg, "ballast_pool_used_bytes", "Pinned pool bytes holding blobs", err, sizeof err);
    svc.sessions = metrics_gauge(reg, "ballast_sessions", "Open client sessions", err, sizeof err);
    if (!spill || !svc.pool_used || !svc.sessions) die("%s", err);
    metrics_add_collector(reg, collect, &svc);

    /* the worker's offload client side, as it registers its counters */
    static const char *const dir[] = { "direction" };
    metric_family_t *off = metrics_register(reg, METRIC_COUNTER, "ballast_offload_bytes_total",
                                            "Bytes copied between this rank and ballastd", dir, 1, NULL, 0, err, sizeof err);
    if (!off) die("%s", err);
    metric_t *to_svc = metrics_series(off, (const char *[]){ "to_service" });
    metric_t *from_svc = metrics_series(off, (const char *[]){ "from_service" });
    if (!to_svc || !from_svc) die("out of memory");
    metrics_server_t *srv = metrics_server_start(reg, opt_bind, (int)opt_port, err, sizeof err);
    if (!srv) die("%s", err);
    printf("{\"port\": %d, \"tokens_per_rank_step\": %d, \"to_host_bytes_per_step\": %d, "
           "\"to_device_bytes_per_step\": %d, \"spill_bytes_per_step\": %d}\n",
           metrics_server_port(srv), TOKENS_PER_STEP, TO_HOST, TO_DEVICE, SPILL);
    fflush(stdout);

    char line[256];
    uint64_t seed = 12345;
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "quit", 4) == 0) break;
        if (strncmp(line, "step", 4) != 0) { printf("error unknown command\n"); fflush(stdout); continue; }
        svc.steps++;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        progress_step_t s;
        progress_step_init(&s, svc.steps);
        s.loss = 5.0 / (double)svc.steps + (double)(seed >> 40) / (double)(1ull << 26);
        s.lr = 3e-4;
        s.grad_norm = 1.0;
        s.step_s = 0.2 + 0.01 * (double)(svc.steps % 7);
        s.phase_s[PROGRESS_COMM] = 0.02;
        /* the offload client feeds its counters; progress reads them */
        progress_totals_t a, b;
        progress_totals(p, &a);
        metric_add_u64(to_svc, TO_HOST);
        metric_add_u64(from_svc, TO_DEVICE);
        progress_totals(p, &b);
        progress_step_since(&s, &a, &b);
        s.mem_gpu_bytes = 40LL << 30;
        if (progress_record(p, &s, NULL, err, sizeof err)) die("%s", err);
        metric_add_u64(spill, SPILL);
        printf("ok %lld\n", (long long)svc.steps);
        fflush(stdout);
    }
    metrics_server_stop(srv);
    progress_free(p);
    return 0;
}
