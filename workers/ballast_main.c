/* ballast_main.c: the `ballast` user CLI; dispatches to the subcommands of
 * workers/cli/ (cli.h). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "workers/cli/cli.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command_t;

static void usage(const command_t *cmds, size_t n, FILE *out) {
    fprintf(out, "usage: ballast COMMAND [options]   (ballast COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "  %-8s %s\n", cmds[i].name, cmds[i].help);
}

int main(int argc, char **argv) {
    const command_t cmds[] = {
        { "train", cmd_train, "train a model: starts ballastd when needed and N workers" },
        { "data", cmd_data, "token shards: synth, pack, info, tokenize" },
        { "ckpt", cmd_ckpt, "checkpoints: export to Hugging Face, info" },
        { "eval", cmd_eval, "loss and perplexity of a checkpoint or model on token shards" },
        { "generate", cmd_generate, "continue a prompt with a checkpoint or model (KV cache, CPU)" },
        { "plan", cmd_plan, "choose (S, T, offload) for a cluster and predict TFLOP/s" },
        { "status", cmd_status, "ballastd: pool, spill, sessions" },
        { "store", cmd_store, "ballastd blobs: put, get, ls, rm" },
        { "doctor", cmd_doctor, "check this machine: GPUs, io_uring, memlock, ballastd" },
        { "report", cmd_report, "HTML report of a run from its JSON log" },
    };
    size_t n = sizeof cmds / sizeof cmds[0];
    log_init("ballast", -1);
    /* a closed stdout gives EPIPE, never a SIGPIPE death (the workers inherit this) */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(cmds, n, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], cmds[i].name) != 0) continue;
        return cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "ballast: unknown command '%s'\n", argv[1]);
    usage(cmds, n, stderr);
    return 2;
}
