/* worker_main.c: ballast-worker, one training process. With the CPU
 * backend and one rank it trains a Llama model end to end; see
 * docs/training.md for the flags. */
#include <stdio.h>

#include "log.h"
#include "workers/train/train.h"

int main(int argc, char **argv) {
    log_init("ballast-worker", -1);
    train_opts_t o;
    int rc = train_parse(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    return train_run(&o);
}
