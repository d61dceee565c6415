/* worker_main.c: ballast-worker, one training process. With the CPU
 * backend and one rank it trains a Llama model end to end; see
 * docs/training.md for the flags. Its malloc is jemalloc's, whose figures
 * join the other metrics in /metrics (common/jemalloc_stats.h). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "jemalloc_stats.h"
#include "log.h"
#include "workers/train/train.h"

int main(int argc, char **argv) {
    /* a closed stdout (the reader of a pipe gone) must not kill training: writes fail with EPIPE instead */
    signal(SIGPIPE, SIG_IGN);
    /* started by `ballast train`: messages go under the name the user typed */
    const char *by = getenv("BALLAST_LAUNCHED_BY");
    train_set_program(by && *by ? by : "ballast-worker");
    log_init(train_program(), -1);
    train_opts_t o;
    int rc = train_parse(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    char err[JEMALLOC_STATS_ERR_LEN];
    if (!jemalloc_stats_metrics_init(metrics_default(), err, sizeof err) && o.metrics_port > 0) log_info("%s", err);
    return train_run(&o);
}
