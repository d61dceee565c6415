/* worker_test_main.c: the test build of ballast-worker
 * ($BUILD/tests/bin/ballast-worker, with a `ballast` beside it so that
 * `ballast train` starts this worker). It is ballast-worker plus one knob
 * the shipped worker does not have, read like every option
 * (common/options.h) but from the environment only, so that `ballast train`
 * passes it to every rank:
 *
 *   BALLAST_TEST_BACKEND=cpu|staged|scrambled   (default cpu)
 *     staged     the CPU backend as a GPU looks to its callers: host memory
 *                off limits (collectives staged, offload copies through
 *                staging buffers) and asynchronous copies run as late as a
 *                copy stream could (tests/lib/backend_staged.h)
 *     scrambled  the CPU backend with every byte of its memory scrambled,
 *                so a direct host access gives wrong bits
 *                (tests/lib/backend_scrambled.h)
 * Either gives the CPU backend's bits when the code is right. */
#include <stdio.h>

#include "log.h"
#include "options.h"
#include "tests/lib/backend_scrambled.h"
#include "tests/lib/backend_staged.h"
#include "workers/train/train.h"

static int g_test_backend;   /* 0 cpu, 1 staged, 2 scrambled */
static int64_t g_threads;    /* the worker's --threads, for the doubles */

static const backend_t *wrap(const backend_t *opened, char *err, size_t errlen) {
    if (g_test_backend == 0) return opened;
    if (!opened->host_memory || opened->act_bytes != 4) {
        snprintf(err, errlen, "BALLAST_TEST_BACKEND doubles the CPU backend; this run opened %s", opened->name);
        return NULL;
    }
    return g_test_backend == 1 ? backend_staged((int)g_threads) : backend_scrambled((int)g_threads);
}

int main(int argc, char **argv) {
    log_init("ballast-worker", -1);
    static const opt_t test_opts[] = {
        { "test-backend", OPT_ENUM, "cpu", 0, 0, "cpu|staged|scrambled",
          "test double of the CPU backend (environment only)", &g_test_backend },
    };
    char err[OPT_ERR_LEN];
    char *no_args[] = { argv[0], NULL };
    if (opt_parse(test_opts, 1, 1, no_args, NULL, 0, NULL, "", err, sizeof err) != 0) {
        fprintf(stderr, "ballast-worker (test build): %s\n", err);
        return 2;
    }
    train_opts_t o;
    int rc = train_parse(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    g_threads = o.threads;
    train_set_backend_wrap(wrap);
    return train_run(&o);
}
