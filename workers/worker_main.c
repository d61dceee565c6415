/* worker_main.c: ballast-worker, one training process. With the CPU
 * backend and one rank it trains a Llama model end to end; see
 * docs/training.md for the flags. Its malloc is jemalloc's, whose figures
 * join the other metrics in /metrics (common/jemalloc_stats.h). */
#include <stdio.h>

#include "jemalloc_stats.h"
#include "log.h"
#include "workers/train/train.h"

int main(int argc, char **argv) {
    log_init("ballast-worker", -1);
    train_opts_t o;
    int rc = train_parse(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    char err[JEMALLOC_STATS_ERR_LEN];
    if (!jemalloc_stats_metrics_init(metrics_default(), err, sizeof err) && o.metrics_port > 0) log_info("%s", err);
    return train_run(&o);
}
