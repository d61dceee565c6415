/* ballast_main.c: the `ballast` user CLI; dispatches to workers/cmd_*.c.
 * Commands are declared weak so that a build without one of them still
 * links and says which command is missing. */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "workers/cli/cli.h"

#pragma weak cmd_train
#pragma weak cmd_data
#pragma weak cmd_ckpt
#pragma weak cmd_plan
#pragma weak cmd_status
#pragma weak cmd_store
#pragma weak cmd_doctor
#pragma weak cmd_report

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command_t;

static void usage(const command_t *cmds, size_t n, FILE *out) {
    fprintf(out, "usage: ballast COMMAND [options]   (ballast COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "  %-8s %s%s\n", cmds[i].name, cmds[i].help, cmds[i].fn ? "" : " (not in this build)");
}

int main(int argc, char **argv) {
    const command_t cmds[] = {
        { "train", cmd_train, "train a model: starts ballastd when needed and N workers" },
        { "data", cmd_data, "token shards: synth, pack, info" },
        { "ckpt", cmd_ckpt, "checkpoints: export to Hugging Face, info" },
        { "plan", cmd_plan, "choose (S, T, offload) for a cluster and predict TFLOP/s" },
        { "status", cmd_status, "ballastd: pool, spill, sessions" },
        { "store", cmd_store, "ballastd blobs: put, get, ls, rm" },
        { "doctor", cmd_doctor, "check this machine: GPUs, io_uring, memlock, ballastd" },
        { "report", cmd_report, "HTML report of a run from its JSON log" },
    };
    size_t n = sizeof cmds / sizeof cmds[0];
    log_init("ballast", -1);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(cmds, n, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], cmds[i].name) != 0) continue;
        if (!cmds[i].fn) {
            fprintf(stderr, "ballast: command '%s' is not in this build\n", argv[1]);
            return 2;
        }
        return cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "ballast: unknown command '%s'\n", argv[1]);
    usage(cmds, n, stderr);
    return 2;
}
