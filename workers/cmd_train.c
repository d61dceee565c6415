/* cmd_train.c: `ballast train`, the local launcher. With --nproc 1 and no
 * offload option it needs no ballastd: it replaces itself with one
 * ballast-worker (found next to this program, else on PATH) given the same
 * worker flags. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "options.h"
#include "workers/cli.h"

static void train_usage(FILE *out) {
    fprintf(out, "usage: ballast train [--nproc N] [worker options]\n"
                 "  --nproc N   worker processes (this build: 1)\n"
                 "Every other option goes to ballast-worker; `ballast-worker --help` lists them.\n");
}

int cmd_train(int argc, char **argv) {
    int64_t nproc = 1;
    char **wargv = calloc((size_t)argc + 2, sizeof *wargv);
    CHECK_ALLOC(wargv);
    int wn = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            train_usage(stdout);
            free(wargv);
            return 0;
        }
        if (!strcmp(a, "--nproc")) {
            if (i + 1 >= argc) { fprintf(stderr, "ballast train: --nproc needs a value\n"); free(wargv); return 2; }
            val = argv[++i];
        } else if (!strncmp(a, "--nproc=", 8)) {
            val = a + 8;
        }
        if (val) {
            char err[256];
            if (parse_int64(val, &nproc, err, sizeof err) || nproc < 1) {
                fprintf(stderr, "ballast train: --nproc '%s': expected a positive integer\n", val);
                free(wargv);
                return 2;
            }
            continue;
        }
        wargv[wn++] = argv[i];
    }
    if (nproc != 1) {
        fprintf(stderr, "ballast train: --nproc %lld: this build trains in one process; use --nproc 1\n", (long long)nproc);
        free(wargv);
        return 2;
    }
    char self[PATH_MAX], worker[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    wargv[0] = "ballast-worker";
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) *slash = 0;
        snprintf(worker, sizeof worker, "%s/ballast-worker", self);
        if (access(worker, X_OK) == 0) {
            wargv[0] = worker;
            execv(worker, wargv);
        }
    }
    execvp("ballast-worker", wargv);
    fprintf(stderr, "ballast train: cannot start ballast-worker (%s); build it with `make` or put it on PATH\n", strerror(errno));
    free(wargv);
    return 1;
}
