/* cmd_train.c: `ballast train`, the local launcher.
 *
 * --nproc 1: it replaces itself with one ballast-worker (found next to
 * this program, else on PATH) given the same worker flags.
 * --nproc N > 1: it picks a free TCP port on 127.0.0.1 for rank 0's
 * rendezvous store and starts N workers with RANK, LOCAL_RANK, WORLD_SIZE,
 * LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (common/topology.h),
 * and OMP_NUM_THREADS = cores / N unless it is set; rank 0 prints the
 * progress. SIGINT/SIGTERM are forwarded to every worker.
 * When a worker fails, the launcher names its rank, stops the others
 * (SIGTERM, then SIGKILL after 5 s) and exits with that worker's status.
 * No offload option is implemented yet, so no ballastd is started. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "options.h"
#include "workers/cli.h"

#define TRAIN_MAX_NPROC 1024
#define TRAIN_KILL_GRACE_S 5

static void train_usage(FILE *out) {
    fprintf(out, "usage: ballast train [--nproc N] [worker options]\n"
                 "  --nproc N   worker processes on this machine (default 1); N > 1 trains with hybrid\n"
                 "              sharding (--hybrid-shard-degree), rank 0 serving the rendezvous store\n"
                 "Every other option goes to ballast-worker; `ballast-worker --help` lists them.\n");
}

/* A TCP port on 127.0.0.1 that was free a moment ago; -1 when none. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = 0 };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static volatile sig_atomic_t g_fwd_sig, g_alarm;
static void on_fwd(int sig) { g_fwd_sig = sig; }
static void on_alarm(int sig) { (void)sig; g_alarm = 1; }

static int launch(int nproc, char *const *wargv) {
    int port = free_port();
    if (port < 0) { fprintf(stderr, "ballast train: cannot find a free TCP port on 127.0.0.1: %s\n", strerror(errno)); return 1; }
    pid_t *pids = calloc((size_t)nproc, sizeof *pids);
    CHECK_ALLOC(pids);
    struct sigaction sa = { 0 };
    sa.sa_handler = on_fwd;          /* no SA_RESTART: waitpid returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    char val[32];
    int alive = 0;
    for (int r = 0; r < nproc; r++) {
        pid_t p = fork();
        if (p < 0) {
            fprintf(stderr, "ballast train: fork of rank %d failed: %s\n", r, strerror(errno));
            for (int i = 0; i < r; i++) kill(pids[i], SIGTERM);
            break;
        }
        if (p == 0) {
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGALRM, SIG_DFL);
            snprintf(val, sizeof val, "%d", r);
            setenv("RANK", val, 1);
            setenv("LOCAL_RANK", val, 1);
            snprintf(val, sizeof val, "%d", nproc);
            setenv("WORLD_SIZE", val, 1);
            setenv("LOCAL_WORLD_SIZE", val, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            snprintf(val, sizeof val, "%d", port);
            setenv("MASTER_PORT", val, 1);
            /* N ranks share the cores unless the user chose otherwise */
            if (!getenv("OMP_NUM_THREADS")) {
                long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
                snprintf(val, sizeof val, "%ld", ncpu / nproc > 1 ? ncpu / nproc : 1);
                setenv("OMP_NUM_THREADS", val, 1);
            }
            execv(wargv[0], wargv);
            execvp("ballast-worker", wargv);
            fprintf(stderr, "ballast train: rank %d: cannot start %s: %s\n", r, wargv[0], strerror(errno));
            _exit(127);
        }
        pids[r] = p;
        alive++;
    }
    int status = alive == nproc ? 0 : 1, failed = -1;
    bool stopping = alive != nproc;
    while (alive > 0) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno != EINTR) break;
            if (g_fwd_sig) {
                int sig = g_fwd_sig;
                g_fwd_sig = 0;
                for (int i = 0; i < nproc; i++) if (pids[i] > 0) kill(pids[i], sig);
            }
            if (g_alarm) {
                g_alarm = 0;
                for (int i = 0; i < nproc; i++) if (pids[i] > 0) kill(pids[i], SIGKILL);
            }
            continue;
        }
        int r = -1;
        for (int i = 0; i < nproc; i++) if (pids[i] == p) r = i;
        if (r < 0) continue;
        pids[r] = 0;
        alive--;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code != 0 && failed < 0 && !stopping) {
            failed = r;
            status = code;
            if (code == 130) {
                stopping = true;   /* a forwarded signal: the others stop after the same step */
            } else {
                if (WIFSIGNALED(st))
                    fprintf(stderr, "ballast train: rank %d (pid %d) was killed by signal %d (%s); stopping the other ranks\n",
                            r, (int)p, WTERMSIG(st), strsignal(WTERMSIG(st)));
                else
                    fprintf(stderr, "ballast train: rank %d (pid %d) failed with exit status %d (its message is above); "
                            "stopping the other ranks\n", r, (int)p, code);
                for (int i = 0; i < nproc; i++) if (pids[i] > 0) kill(pids[i], SIGTERM);
                stopping = true;
                alarm(TRAIN_KILL_GRACE_S);
            }
        } else if (code != 0 && status == 0) {
            status = code;
        }
    }
    alarm(0);
    free(pids);
    return status;
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
            if (parse_int64(val, &nproc, err, sizeof err) || nproc < 1 || nproc > TRAIN_MAX_NPROC) {
                fprintf(stderr, "ballast train: --nproc '%s': expected an integer from 1 to %d\n", val, TRAIN_MAX_NPROC);
                free(wargv);
                return 2;
            }
            continue;
        }
        wargv[wn++] = argv[i];
    }
    char self[PATH_MAX], worker[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    wargv[0] = "ballast-worker";
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) *slash = 0;
        snprintf(worker, sizeof worker, "%s/ballast-worker", self);
        if (access(worker, X_OK) == 0) wargv[0] = worker;
    }
    if (nproc > 1) {
        int rc = launch((int)nproc, wargv);
        free(wargv);
        return rc;
    }
    if (wargv[0] == worker) execv(worker, wargv);
    execvp("ballast-worker", wargv);
    fprintf(stderr, "ballast train: cannot start ballast-worker (%s); build it with `make` or put it on PATH\n", strerror(errno));
    free(wargv);
    return 1;
}
