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
 *
 * Offload (--activation-offload, --optimizer-offload host|nvme among the
 * worker flags or their BALLAST_* variables): when nothing answers on the
 * offload socket (and no --offload-remote is given), the launcher starts a
 * ballastd (next to this program, else on PATH) in its own process group
 * with --offload-pool bytes of pool and its spill directory under the run
 * directory (so a later --resume-from-service finds the persistent state
 * again), waits until it is ready, runs the workers even with --nproc 1,
 * and stops it (SIGTERM: drain) when they are done. When the default
 * socket's directory cannot be created, the socket goes to the run
 * directory and the workers learn it through BALLAST_OFFLOAD_SOCKET. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "clock.h"
#include "options.h"
#include "workers/cli/cli.h"

#define TRAIN_MAX_NPROC 1024
#define TRAIN_KILL_GRACE_S 5

#define TRAIN_DEFAULT_SOCKET "unix:/run/ballast/ballastd.sock"
#define TRAIN_BD_READY_S 20
#define TRAIN_BD_STOP_S 30

static void train_usage(FILE *out) {
    fprintf(out, "usage: ballast train [--nproc N] [launcher options] [worker options]\n"
                 "  --nproc N              worker processes on this machine (default 1); N > 1 trains with hybrid\n"
                 "                         sharding (--hybrid-shard-degree), rank 0 serving the rendezvous store\n"
                 "With --activation-offload or --optimizer-offload host|nvme and no ballastd answering on\n"
                 "--offload-socket, the launcher starts one for the run and stops it at the end:\n"
                 "  --offload-pool SIZE    its host memory pool (default: 1G, at most a quarter of the RAM)\n"
                 "  --offload-spill-dir D  its NVMe spill directory, where persistent optimizer state survives for\n"
                 "                         --resume-from-service (default: RUN/ballastd)\n"
                 "  --offload-spill-bytes SIZE  capacity of that spill tier, preallocated (default: 2 x the pool)\n"
                 "  --run-dir RUN          the run's directory (default: the directory of --log-json FILE, else\n"
                 "                         --ckpt-dir, else the current directory); ballastd logs to RUN/ballastd.log\n"
                 "Every other option goes to ballast-worker; `ballast-worker --help` lists them.\n");
}

/* ---- ballastd for offload runs ---- */

/* What the worker flags say about offload. */
typedef struct {
    bool on;                   /* a memory saver needs ballastd */
    bool remote;               /* --offload-remote: not ours to start */
    bool socket_given;         /* --offload-socket or BALLAST_OFFLOAD_SOCKET */
    const char *socket;        /* "unix:/path" or a path */
    const char *log_json, *ckpt_dir;
} offload_flags_t;

/* Value of worker flag `name` (argv scan: --name V or --name=V); for a
 * bool, "true" when it stands alone. NULL when absent. */
static const char *flag_value(int argc, char *const *argv, const char *name, bool is_bool) {
    const char *v = NULL;
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) continue;
        a += 2;
        if (is_bool && !strncmp(a, "no-", 3) && !strcmp(a + 3, name)) { v = "false"; continue; }
        if (strncmp(a, name, n)) continue;
        if (a[n] == '=') v = a + n + 1;
        else if (a[n] == 0) v = is_bool ? "true" : (i + 1 < argc ? argv[++i] : NULL);
    }
    return v;
}

static const char *env_or(const char *flag, const char *env, const char *def) {
    if (flag) return flag;
    const char *e = getenv(env);
    return e && *e ? e : def;
}

static void offload_flags(int argc, char *const *argv, offload_flags_t *of) {
    memset(of, 0, sizeof *of);
    const char *ao = env_or(flag_value(argc, argv, "activation-offload", true), "BALLAST_ACTIVATION_OFFLOAD", "false");
    const char *oo = env_or(flag_value(argc, argv, "optimizer-offload", false), "BALLAST_OPTIMIZER_OFFLOAD", "none");
    bool a = false;
    char e[64];
    if (parse_bool(ao, &a, e, sizeof e)) a = false;
    of->on = a || strcmp(oo, "none") != 0;
    of->remote = env_or(flag_value(argc, argv, "offload-remote", false), "BALLAST_OFFLOAD_REMOTE", NULL) != NULL;
    const char *sf = flag_value(argc, argv, "offload-socket", false);
    of->socket_given = sf || getenv("BALLAST_OFFLOAD_SOCKET");
    of->socket = env_or(sf, "BALLAST_OFFLOAD_SOCKET", TRAIN_DEFAULT_SOCKET);
    of->log_json = env_or(flag_value(argc, argv, "log-json", false), "BALLAST_LOG_JSON", NULL);
    of->ckpt_dir = env_or(flag_value(argc, argv, "ckpt-dir", false), "BALLAST_CKPT_DIR", NULL);
}

static const char *sock_path(const char *addr) { return strncmp(addr, "unix:", 5) ? addr : addr + 5; }

/* Something accepts connections on the Unix socket path. */
static bool socket_answers(const char *path) {
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof a.sun_path) return false;
    strcpy(a.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static int mkdirs(const char *path) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return -1;
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = 0;
        if (mkdir(p, 0755) && errno != EEXIST) return -1;
        *c = '/';
    }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

static void dir_of(const char *file, char *out, size_t len) {
    snprintf(out, len, "%s", file);
    char *sl = strrchr(out, '/');
    if (!sl) snprintf(out, len, ".");
    else if (sl == out) out[1] = 0;
    else *sl = 0;
}

static pid_t g_bd_pid;            /* the ballastd this launcher started, 0 = none */
static bool g_bd_died;            /* it exited before the workers were done */

/* Start ballastd when offload is on and none answers. 0 = fine (started,
 * already running, or not needed), 1 = failed (message printed). */
static int ballastd_ensure(const offload_flags_t *of, const char *run_dir_flag, const char *pool_flag,
                           const char *spill_flag, const char *spill_bytes_flag, const char *self_dir) {
    if (!of->on || of->remote) return 0;
    const char *path = sock_path(of->socket);
    if (socket_answers(path)) return 0;

    char run[PATH_MAX], spill[PATH_MAX + 16], logp[PATH_MAX + 16], ports[PATH_MAX + 16], sockp[PATH_MAX + 16];
    if (run_dir_flag) snprintf(run, sizeof run, "%s", run_dir_flag);
    else if (of->log_json && strcmp(of->log_json, "-")) dir_of(of->log_json, run, sizeof run);
    else if (of->ckpt_dir) snprintf(run, sizeof run, "%s", of->ckpt_dir);
    else snprintf(run, sizeof run, ".");
    if (mkdirs(run)) {
        fprintf(stderr, "ballast train: cannot create the run directory %s: %s (give --run-dir DIR)\n", run, strerror(errno));
        return 1;
    }
    snprintf(spill, sizeof spill, "%s", spill_flag ? spill_flag : "");
    if (!spill_flag) snprintf(spill, sizeof spill, "%s/ballastd", run);
    snprintf(logp, sizeof logp, "%s/ballastd.log", run);
    snprintf(ports, sizeof ports, "%s/ballastd.ports", run);

    /* the socket: the one the workers were told, else somewhere writable */
    snprintf(sockp, sizeof sockp, "%s", path);
    char sdir[PATH_MAX + 16];
    dir_of(sockp, sdir, sizeof sdir);
    if (mkdirs(sdir) || access(sdir, W_OK)) {
        if (of->socket_given) {
            fprintf(stderr, "ballast train: cannot create ballastd's socket %s (directory %s: %s); pick another "
                    "--offload-socket or start ballastd yourself\n", path, sdir, strerror(errno ? errno : EACCES));
            return 1;
        }
        snprintf(sockp, sizeof sockp, "%s/ballastd.sock", run);
        if (strlen(sockp) >= sizeof(((struct sockaddr_un *)0)->sun_path) - 4)
            snprintf(sockp, sizeof sockp, "/tmp/ballastd-%d-%d.sock", (int)getuid(), (int)getpid());
        setenv("BALLAST_OFFLOAD_SOCKET", sockp, 1);
    }
    uint64_t pool = 1ull << 30;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && psz > 0 && (uint64_t)pages * (uint64_t)psz / 4 < pool) pool = (uint64_t)pages * (uint64_t)psz / 4;
    if (pool_flag) {
        char e[256];
        if (parse_size(pool_flag, &pool, e, sizeof e) || pool == 0) {
            fprintf(stderr, "ballast train: --offload-pool '%s': %s\n", pool_flag, e);
            return 1;
        }
    }
    /* the spill tier is preallocated: keep it proportionate */
    uint64_t spill_bytes = 2 * pool;
    if (spill_bytes_flag) {
        char e[256];
        if (parse_size(spill_bytes_flag, &spill_bytes, e, sizeof e) || spill_bytes < (1u << 20)) {
            fprintf(stderr, "ballast train: --offload-spill-bytes '%s': expected a size of at least 1M\n", spill_bytes_flag);
            return 1;
        }
    }
    uint64_t file_bytes = spill_bytes / 4 < (1ull << 30) ? spill_bytes / 4 : (1ull << 30);
    if (file_bytes < (1u << 20)) file_bytes = 1u << 20;
    char bd[PATH_MAX + 32], pool_s[32], spill_s[32], file_s[32];
    snprintf(bd, sizeof bd, "%s/ballastd", self_dir ? self_dir : ".");
    snprintf(pool_s, sizeof pool_s, "%llu", (unsigned long long)pool);
    snprintf(spill_s, sizeof spill_s, "%llu", (unsigned long long)spill_bytes);
    snprintf(file_s, sizeof file_s, "%llu", (unsigned long long)file_bytes);
    unlink(ports);
    pid_t parent = getpid();
    pid_t p = fork();
    if (p < 0) { fprintf(stderr, "ballast train: fork of ballastd failed: %s\n", strerror(errno)); return 1; }
    if (p == 0) {
        setpgid(0, 0); /* a Ctrl-C at the terminal is for the workers; the launcher stops ballastd after them */
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* and a launcher that dies takes it along (it drains) */
        if (getppid() != parent) _exit(1);
        FILE *lf = freopen(logp, "a", stdout);
        if (lf) dup2(fileno(stdout), 2);
        char *av[] = { bd, "--socket", sockp, "--pool-bytes", pool_s, "--spill-dir", spill, "--spill-bytes", spill_s,
                       "--spill-file-bytes", file_s, "--port-file", ports, NULL };
        if (self_dir && access(bd, X_OK) == 0) execv(bd, av);
        av[0] = "ballastd";
        execvp("ballastd", av);
        fprintf(stderr, "ballast train: cannot start ballastd (%s); build it with `make` or put it on PATH\n", strerror(errno));
        _exit(127);
    }
    g_bd_pid = p;
    double t0 = clock_now_s();
    while (clock_now_s() - t0 < TRAIN_BD_READY_S) {
        struct stat st;
        if (stat(ports, &st) == 0 && st.st_size > 0) {
            char sz[32], ssz[32];
            format_size(pool, sz, sizeof sz);
            format_size(spill_bytes, ssz, sizeof ssz);
            fprintf(stderr, "ballast train: started ballastd (pid %d) on %s: pool %s, spill %s of %s, log %s\n", (int)p,
                    sockp, sz, ssz, spill, logp);
            return 0;
        }
        int wst;
        if (waitpid(p, &wst, WNOHANG) == p) {
            g_bd_pid = 0;
            fprintf(stderr, "ballast train: ballastd exited at start (status %d); its log %s says:\n",
                    WIFEXITED(wst) ? WEXITSTATUS(wst) : 128 + WTERMSIG(wst), logp);
            FILE *lf = fopen(logp, "r");
            char line[1024];
            while (lf && fgets(line, sizeof line, lf)) fputs(line, stderr);
            if (lf) fclose(lf);
            return 1;
        }
        usleep(20000);
    }
    fprintf(stderr, "ballast train: ballastd (pid %d) not ready after %d s; see %s\n", (int)p, TRAIN_BD_READY_S, logp);
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    g_bd_pid = 0;
    return 1;
}

/* Stop the ballastd we started: SIGTERM (it drains and syncs), SIGKILL after
 * TRAIN_BD_STOP_S. */
static void ballastd_stop(void) {
    if (!g_bd_pid) return;
    pid_t p = g_bd_pid;
    g_bd_pid = 0;
    if (g_bd_died) return;
    kill(p, SIGTERM);
    double t0 = clock_now_s();
    int st;
    while (waitpid(p, &st, WNOHANG) == 0) {
        if (clock_now_s() - t0 > TRAIN_BD_STOP_S) {
            fprintf(stderr, "ballast train: ballastd (pid %d) did not drain within %d s; killing it\n", (int)p, TRAIN_BD_STOP_S);
            kill(p, SIGKILL);
            waitpid(p, &st, 0);
            return;
        }
        usleep(20000);
    }
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
            prctl(PR_SET_PDEATHSIG, SIGTERM); /* a launcher killed outright leaves no worker behind */
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
        if (p == g_bd_pid && g_bd_pid) {
            g_bd_died = true;
            fprintf(stderr, "ballast train: the ballastd this launcher started (pid %d) exited with status %d while "
                    "training; the workers will fail\n", (int)p, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        }
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

/* Launcher-only flag NAME (--NAME V or --NAME=V) at argv[*i]: its value, else NULL. */
static const char *own_flag(int argc, char **argv, int *i, const char *name, bool *bad) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, "--", 2) || strncmp(a + 2, name, n)) return NULL;
    if (a[2 + n] == '=') return a + 3 + n;
    if (a[2 + n]) return NULL;
    if (*i + 1 >= argc) { fprintf(stderr, "ballast train: --%s needs a value\n", name); *bad = true; return NULL; }
    return argv[++*i];
}

int cmd_train(int argc, char **argv) {
    int64_t nproc = 1;
    const char *run_dir = NULL, *pool = NULL, *spill = NULL, *spill_bytes = NULL;
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
        bool bad = false;
        const char *ov;
        if ((ov = own_flag(argc, argv, &i, "run-dir", &bad))) { run_dir = ov; continue; }
        if ((ov = own_flag(argc, argv, &i, "offload-pool", &bad))) { pool = ov; continue; }
        if ((ov = own_flag(argc, argv, &i, "offload-spill-dir", &bad))) { spill = ov; continue; }
        if ((ov = own_flag(argc, argv, &i, "offload-spill-bytes", &bad))) { spill_bytes = ov; continue; }
        if (bad) { free(wargv); return 2; }
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
    offload_flags_t of;
    offload_flags(wn, wargv, &of);
    if (ballastd_ensure(&of, run_dir, pool, spill, spill_bytes, n > 0 ? self : NULL)) { free(wargv); return 1; }
    if (nproc > 1 || g_bd_pid) {
        int rc = launch((int)nproc, wargv);
        ballastd_stop();
        free(wargv);
        return rc;
    }
    if (wargv[0] == worker) execv(worker, wargv);
    execvp("ballast-worker", wargv);
    fprintf(stderr, "ballast train: cannot start ballast-worker (%s); build it with `make` or put it on PATH\n", strerror(errno));
    free(wargv);
    return 1;
}
