/* cmd_train.c: `ballast train`, the launcher of one node.
 *
 * --nnodes N > 1: one launcher per node; this one starts its
 * --nproc-per-node P workers with RANK = node rank x P + local rank and
 * MASTER_PORT = --master-port + 1 (rank 0 serves the workers' store there),
 * and watches the other launchers through node 0's store on --master-port
 * (agent.h): a failed rank or a lost node stops every node's workers;
 * --max-restarts K starts them again (BALLAST_RESUME=auto) up to K times.
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
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
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
#include "topology.h"
#include "workers/cli/agent.h"
#include "workers/cli/cli.h"
#include "workers/cli/spill.h"
#include "workers/model/config.h"

#define TRAIN_MAX_NPROC 1024
#define TRAIN_KILL_GRACE_S 5
#define TRAIN_ABORT_S 1.0      /* after a second signal, ranks still running are killed */
#define TRAIN_MAX_NODES 65536
#define TRAIN_MAX_RESTARTS 1000

#define TRAIN_DEFAULT_SOCKET "unix:/run/ballast/ballastd.sock"
#define TRAIN_BD_READY_S 20
#define TRAIN_BD_STOP_S 30

static void train_usage(FILE *out) {
    fprintf(out, "usage: ballast train [--nproc N | --nnodes N --node-rank R --nproc-per-node P --master-addr HOST\n"
                 "                      --master-port PORT] [--max-restarts K] [launcher options] [worker options]\n"
                 "  --nproc N              worker processes on this machine (default 1); N > 1 trains with hybrid\n"
                 "                         sharding (--hybrid-shard-degree), rank 0 serving the rendezvous store\n"
                 "One launcher per node (torchrun's flags; defaults from PET_NNODES, PET_NODE_RANK or\n"
                 "JOB_COMPLETION_INDEX, PET_NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT):\n"
                 "  --nnodes N             launchers in the job (default 1)\n"
                 "  --node-rank R          this node, 0..N-1; its workers get ranks R*P .. R*P+P-1\n"
                 "  --nproc-per-node P     workers on this node, one per GPU (--nproc is the one-node form)\n"
                 "  --master-addr HOST     node 0's host (default 127.0.0.1)\n"
                 "  --master-port PORT     node 0's launcher serves the launchers' store there, rank 0 the workers'\n"
                 "                         store on PORT+1 (default 29500)\n"
                 "  --max-restarts K       after a failure, restart every node's workers up to K times, from the\n"
                 "                         newest complete checkpoint in --ckpt-dir (--resume auto) (default 0)\n"
                 "  --rdzv-timeout D       (also a worker flag) bounds every wait; a node without a heartbeat for\n"
                 "                         half of it (2 s to 30 s) is lost (default 300s)\n"
                 "With --activation-offload or --optimizer-offload host|nvme and no ballastd answering on\n"
                 "--offload-socket, the launcher starts one for the run and stops it at the end:\n"
                 "  --offload-pool SIZE    its host memory pool (default: 1G, at most a quarter of the RAM)\n"
                 "  --offload-spill-dir D  its NVMe spill directory, where persistent optimizer state survives for\n"
                 "                         --resume-from-service (default: RUN/ballastd, only with --optimizer-offload\n"
                 "                         nvme or --optimizer-offload-durable yes; host-only offload has no spill tier)\n"
                 "  --offload-spill-bytes SIZE  capacity of that spill tier, preallocated (default: what this node's\n"
                 "                         ranks may write there: optimizer state, two versions when durable, and\n"
                 "                         offloaded activations, plus a quarter and one spill file)\n"
                 "  --run-dir RUN          the run's directory (default: --ckpt-dir, else the directory of --log-json\n"
                 "                         FILE, else a private directory under $TMPDIR or /tmp, removed after a run\n"
                 "                         that ends well); ballastd logs to RUN/ballastd.log\n"
                 "Ctrl-C (SIGINT) or SIGTERM: the ranks finish the step in progress, save a checkpoint (with\n"
                 "--ckpt-dir) and exit 130; a second one aborts at once. A closed stdout never stops training.\n"
                 "Every other option goes to ballast-worker; `ballast-worker --help` lists them.\n");
}

/* ---- ballastd for offload runs ---- */

/* What the worker flags say about offload. */
typedef struct {
    bool on;                   /* a memory saver needs ballastd */
    bool remote;               /* --offload-remote: not ours to start */
    bool socket_given;         /* --offload-socket or BALLAST_OFFLOAD_SOCKET */
    const char *socket;        /* "unix:/path" or a path */
    bool spill;                /* the run keeps state that may or must reach the spill tier (nvme, or durable) */
    bool act, opt, durable;    /* activation offload, optimizer offload (host|nvme), durable optimizer state */
    const char *log_json, *ckpt_dir;
    /* what sizes the spill tier (spill.h): the worker flags, or their BALLAST_* variables */
    const char *model, *init_from, *seq_len, *micro_batch, *shard, *tp, *cp, *backend;
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
    const char *du = env_or(flag_value(argc, argv, "optimizer-offload-durable", false),
                            "BALLAST_OPTIMIZER_OFFLOAD_DURABLE", "auto");
    of->spill = !strcmp(oo, "nvme") || (!strcmp(oo, "host") && !strcmp(du, "yes"));
    of->act = a;
    of->opt = !strcmp(oo, "host") || !strcmp(oo, "nvme");
    of->durable = !strcmp(du, "yes") || (!strcmp(du, "auto") && !strcmp(oo, "nvme"));
    of->remote = env_or(flag_value(argc, argv, "offload-remote", false), "BALLAST_OFFLOAD_REMOTE", NULL) != NULL;
    const char *sf = flag_value(argc, argv, "offload-socket", false);
    of->socket_given = sf || getenv("BALLAST_OFFLOAD_SOCKET");
    of->socket = env_or(sf, "BALLAST_OFFLOAD_SOCKET", TRAIN_DEFAULT_SOCKET);
    of->log_json = env_or(flag_value(argc, argv, "log-json", false), "BALLAST_LOG_JSON", NULL);
    of->ckpt_dir = env_or(flag_value(argc, argv, "ckpt-dir", false), "BALLAST_CKPT_DIR", NULL);
    of->model = env_or(flag_value(argc, argv, "model", false), "BALLAST_MODEL", NULL);
    of->init_from = env_or(flag_value(argc, argv, "init-from", false), "BALLAST_INIT_FROM", NULL);
    of->seq_len = env_or(flag_value(argc, argv, "seq-len", false), "BALLAST_SEQ_LEN", "128");
    of->micro_batch = env_or(flag_value(argc, argv, "micro-batch", false), "BALLAST_MICRO_BATCH", "4");
    of->shard = env_or(flag_value(argc, argv, "hybrid-shard-degree", false), "BALLAST_HYBRID_SHARD_DEGREE", "0");
    of->tp = env_or(flag_value(argc, argv, "tensor-parallel-degree", false), "BALLAST_TENSOR_PARALLEL_DEGREE", "1");
    of->cp = env_or(flag_value(argc, argv, "context-parallel-degree", false), "BALLAST_CONTEXT_PARALLEL_DEGREE", "1");
    of->backend = env_or(flag_value(argc, argv, "backend", false), "BALLAST_BACKEND", "cpu");
}

/* A positive integer worker flag for the spill estimate; def when it does
 * not parse (the worker names a bad value itself). */
static int flag_int(const char *v, int def) {
    int64_t x;
    char e[64];
    return v && !parse_int64(v, &x, e, sizeof e) && x > 0 && x <= (1 << 24) ? (int)x : def;
}

/* The spill tier for this node's `local` ranks of a job of `world`: what
 * they may write there (spill.h). 0, or -1 with why in err when the model's
 * config cannot be read. */
static int spill_for_run(const offload_flags_t *of, int world, int local, spill_plan_t *sp, char *err, size_t errlen) {
    llama_config_t cfg;
    const char *m = of->model ? of->model : of->init_from;
    if (!m) return snprintf(err, errlen, "no --model or --init-from"), -1;
    if (llama_config_resolve(m, &cfg, err, errlen)) return -1;
    int T = flag_int(of->tp, 1), C = flag_int(of->cp, 1), S = flag_int(of->shard, 0);
    /* S = 0: the largest that fits, world / (T C) on the CPU; on a GPU the planner may pick less, which
     * --hybrid-shard-degree or --offload-spill-bytes then states */
    if (S == 0) S = world / (T * C) > 0 ? world / (T * C) : 1;
    spill_run_t r = { .cfg = &cfg, .local_ranks = local, .S = S, .T = T, .C = C,
                      .micro_batch = flag_int(of->micro_batch, 4), .seq_len = flag_int(of->seq_len, 128),
                      .act_bytes = of->backend && !strcmp(of->backend, "cuda") ? 2 : 4, .act_offload = of->act,
                      .opt_offload = of->opt, .durable = of->durable };
    spill_plan(&r, sp);
    return 0;
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

/* In the ballastd child: drop the trainer's BALLAST_* variables (its own are
 * BALLASTD_*), so none of them reaches it, nor its warning about them. */
static void scrub_trainer_env(void) {
    extern char **environ;
    for (;;) {
        char name[256] = "";
        for (char **e = environ; e && *e; e++) {
            const char *eq = strchr(*e, '=');
            if (strncmp(*e, "BALLAST_", 8) || !eq || (size_t)(eq - *e) >= sizeof name) continue;
            snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
            break;
        }
        if (!name[0] || unsetenv(name)) return;
    }
}

static pid_t g_bd_pid;            /* the ballastd this launcher started, 0 = none */
static bool g_bd_died;            /* it exited before the workers were done */
static char g_bd_tmp[PATH_MAX];   /* a run directory made for it alone (removed at the end), "" = none */
static char g_bd_ports[PATH_MAX + 16], g_bd_sock[PATH_MAX + 16]; /* its files the run does not need after it */

/* Start ballastd when offload is on and none answers. 0 = fine (started,
 * already running, or not needed), 1 = failed (message printed). */
static int ballastd_ensure(const offload_flags_t *of, const char *run_dir_flag, const char *pool_flag,
                           const char *spill_flag, const char *spill_bytes_flag, const char *self_dir, int world,
                           int local) {
    if (!of->on || of->remote) return 0;
    const char *path = sock_path(of->socket);
    if (socket_answers(path)) return 0;

    char run[PATH_MAX], spill[PATH_MAX + 16], logp[PATH_MAX + 16], ports[PATH_MAX + 16], sockp[PATH_MAX + 16];
    if (run_dir_flag) snprintf(run, sizeof run, "%s", run_dir_flag);
    else if (of->ckpt_dir) snprintf(run, sizeof run, "%s", of->ckpt_dir);
    else if (of->log_json && strcmp(of->log_json, "-")) dir_of(of->log_json, run, sizeof run);
    else {
        /* no run directory: a private one, removed when the run is done (never the working directory) */
        const char *t = getenv("TMPDIR");
        snprintf(g_bd_tmp, sizeof g_bd_tmp, "%s/ballast-run-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(g_bd_tmp)) {
            fprintf(stderr, "ballast train: cannot create a run directory %s: %s (give --run-dir DIR)\n", g_bd_tmp,
                    strerror(errno));
            g_bd_tmp[0] = 0;
            return 1;
        }
        snprintf(run, sizeof run, "%s", g_bd_tmp);
    }
    if (mkdirs(run)) {
        fprintf(stderr, "ballast train: cannot create the run directory %s: %s (give --run-dir DIR)\n", run, strerror(errno));
        return 1;
    }
    /* a spill tier only where the run may spill or keeps durable state; none with host-only offload */
    snprintf(spill, sizeof spill, "%s", spill_flag ? spill_flag : "");
    if (!spill_flag && of->spill) snprintf(spill, sizeof spill, "%s/ballastd", run);
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
    /* the spill tier is preallocated: sized to what this node's ranks may write there (spill.h) */
    spill_plan_t sp;
    char why[512] = "", sizing[400] = "";
    bool known = spill[0] && !spill_for_run(of, world, local, &sp, why, sizeof why);
    bool estimated = known && !spill_bytes_flag;
    uint64_t spill_bytes = 2 * pool, file_bytes = 0;
    if (estimated) {
        spill_bytes = sp.spill_bytes;
        file_bytes = sp.file_bytes;
        char o[32], a[32];
        format_size(sp.opt, o, sizeof o);
        format_size(sp.act, a, sizeof a);
        snprintf(sizing, sizeof sizing, "sized for %d local rank%s: optimizer state %s (%s), activations %s, plus a "
                 "quarter and one file of headroom; --offload-spill-bytes overrides", local, local == 1 ? "" : "s", o,
                 !of->opt ? "none" : of->durable ? "two versions, durable" : "one version", a);
    } else if (spill[0] && !spill_bytes_flag) {
        snprintf(sizing, sizeof sizing, "2 x the pool: the model's size is unknown here (%s)", why);
    }
    if (spill_bytes_flag) {
        char e[256];
        if (parse_size(spill_bytes_flag, &spill_bytes, e, sizeof e) || spill_bytes < (1u << 20) ||
            spill_bytes > (1ull << 55)) {
            fprintf(stderr, "ballast train: --offload-spill-bytes '%s': expected a size from 1M to 32P, such as 64G\n",
                    spill_bytes_flag);
            return 1;
        }
        snprintf(sizing, sizeof sizing, "--offload-spill-bytes");
    }
    if (!file_bytes) {
        file_bytes = spill_bytes / 4 < (1ull << 30) ? spill_bytes / 4 : (1ull << 30);
        if (known && file_bytes < sp.largest_blob) file_bytes = sp.largest_blob; /* a blob never spans two files */
        if (file_bytes > spill_bytes) file_bytes = spill_bytes;
        file_bytes = file_bytes < (1u << 20) ? 1u << 20 : file_bytes & ~((uint64_t)(1u << 20) - 1);
    }
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
        scrub_trainer_env();
        char *av[] = { bd, "--socket", sockp, "--pool-bytes", pool_s, "--port-file", ports, "--spill-dir", spill,
                       "--spill-bytes", spill_s, "--spill-file-bytes", file_s, NULL };
        if (!spill[0]) av[7] = NULL; /* no spill tier */
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
            if (spill[0])
                fprintf(stderr, "ballast train: started ballastd (pid %d) on %s: pool %s, spill %s (%llu bytes; %s) in "
                        "%s, log %s\n", (int)p, sockp, sz, ssz, (unsigned long long)spill_bytes, sizing, spill, logp);
            else
                fprintf(stderr, "ballast train: started ballastd (pid %d) on %s: pool %s, no spill tier (nothing "
                        "of this run goes to NVMe), log %s\n", (int)p, sockp, sz, logp);
            snprintf(g_bd_ports, sizeof g_bd_ports, "%s", ports);
            snprintf(g_bd_sock, sizeof g_bd_sock, "%s", sockp);
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
static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *f) {
    (void)st; (void)flag; (void)f;
    remove(path);
    return 0;
}

/* What the run does not need once ballastd is gone: its port file and
 * socket; a private run directory entirely when the run succeeded (ok),
 * else kept for its log, and said so. */
static void ballastd_cleanup(bool ok) {
    if (g_bd_ports[0]) unlink(g_bd_ports);
    if (g_bd_sock[0]) unlink(g_bd_sock);
    g_bd_ports[0] = g_bd_sock[0] = 0;
    if (!g_bd_tmp[0]) return;
    if (ok) nftw(g_bd_tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    else fprintf(stderr, "ballast train: ballastd's log is kept in %s/ballastd.log\n", g_bd_tmp);
    g_bd_tmp[0] = 0;
}

static void ballastd_stop_ok(bool ok) {
    if (!g_bd_pid) { ballastd_cleanup(ok); return; }
    pid_t p = g_bd_pid;
    g_bd_pid = 0;
    if (g_bd_died) { ballastd_cleanup(false); return; }
    kill(p, SIGTERM);
    double t0 = clock_now_s();
    int st;
    while (waitpid(p, &st, WNOHANG) == 0) {
        if (clock_now_s() - t0 > TRAIN_BD_STOP_S) {
            fprintf(stderr, "ballast train: ballastd (pid %d) did not drain within %d s; killing it\n", (int)p, TRAIN_BD_STOP_S);
            kill(p, SIGKILL);
            waitpid(p, &st, 0);
            ballastd_cleanup(false);
            return;
        }
        usleep(20000);
    }
    ballastd_cleanup(ok && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void ballastd_stop(void) { ballastd_stop_ok(false); }

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

static volatile sig_atomic_t g_fwd_sig;  /* a signal to forward to the workers, 0 = none */
static volatile sig_atomic_t g_nsig;     /* signals received in all */
static void on_fwd(int sig) { g_fwd_sig = sig; g_nsig++; }

/* ---- the workers of one attempt ---- */

/* Where this launcher's workers sit and what they are told. */
typedef struct {
    int nnodes, node_rank, nproc;  /* nodes, this node, workers per node (P) */
    char master_addr[TOPO_ADDR_MAX];
    int worker_port;               /* the workers' store: rank 0 serves it */
    int max_restarts;              /* --max-restarts */
    double rdzv_timeout;           /* --rdzv-timeout (seconds) */
    bool resume_given;             /* --resume / BALLAST_RESUME set by the user */
    const char *ckpt_dir;          /* --ckpt-dir, NULL = none */
    char host[128];                /* this node's host name */
} launch_t;

typedef enum { RUN_OK = 0, RUN_FAILED, RUN_STOPPED } run_end_t;

static void child_env(const launch_t *L, int local, int attempt) {
    char val[32];
    snprintf(val, sizeof val, "%d", L->node_rank * L->nproc + local);
    setenv("RANK", val, 1);
    snprintf(val, sizeof val, "%d", local);
    setenv("LOCAL_RANK", val, 1);
    snprintf(val, sizeof val, "%d", L->nnodes * L->nproc);
    setenv("WORLD_SIZE", val, 1);
    snprintf(val, sizeof val, "%d", L->nproc);
    setenv("LOCAL_WORLD_SIZE", val, 1);
    setenv("MASTER_ADDR", L->master_addr, 1);
    snprintf(val, sizeof val, "%d", L->worker_port);
    setenv("MASTER_PORT", val, 1);
    setenv("BALLAST_LAUNCHED_BY", "ballast train", 1); /* the workers' messages go under the command typed */
    /* the launcher resolved these already; the workers go by RANK and WORLD_SIZE */
    static const char *const stale[] = { "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR",
                                         "PET_MASTER_PORT", "JOB_COMPLETION_INDEX", "GROUP_RANK" };
    for (size_t i = 0; i < sizeof stale / sizeof stale[0]; i++) unsetenv(stale[i]);
    /* a restart continues from the newest complete checkpoint */
    if (attempt > 0 && !L->resume_given) setenv("BALLAST_RESUME", "auto", 1);
    /* P ranks share the cores unless the user chose otherwise */
    if (!getenv("OMP_NUM_THREADS")) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        snprintf(val, sizeof val, "%ld", ncpu / L->nproc > 1 ? ncpu / L->nproc : 1);
        setenv("OMP_NUM_THREADS", val, 1);
    }
}

static void kill_all(pid_t *pids, int n, int sig) {
    for (int i = 0; i < n; i++) if (pids[i] > 0) kill(pids[i], sig);
}

static void describe_exit(const launch_t *L, int local, pid_t p, int st, char *out, size_t len) {
    int r = L->node_rank * L->nproc + local;
    char where[200] = "";
    if (L->nnodes > 1) snprintf(where, sizeof where, " (node %d, host %s)", L->node_rank, L->host);
    if (WIFSIGNALED(st))
        snprintf(out, len, "rank %d%s (pid %d) was killed by signal %d (%s)", r, where, (int)p, WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
    else
        snprintf(out, len, "rank %d%s (pid %d) failed with exit status %d (its message is above%s)", r, where, (int)p,
                 WEXITSTATUS(st), L->nnodes > 1 ? ", in that node's log" : "");
}

/* ---- the workers' stderr: each distinct message once, with its ranks ----
 * With several workers each one's stderr is a pipe to the launcher, read
 * line by line. Log lines below error pass at once; an error or a plain
 * line (a bad flag's message) is held, and the same message from other
 * ranks (the same text once the time stamp, the process header and a
 * leading "rank N: " are set aside) joins it. It is printed once, as it came
 * when one rank sent it, else as "ballast train: LEVEL on ranks 0-3:
 * MESSAGE", when no other copy can come: every rank sent it, or every rank
 * that did not has exited (its pipe at EOF; after a failure the launcher
 * stops the others, SIGKILL after TRAIN_KILL_GRACE_S, so that is bounded).
 * No timing decides it: a rank however slowed still joins. Only a message
 * that ends no rank while the others train on is let out after
 * TRAIN_HOLD_S. Held messages leave in the order they came. */

#define TRAIN_HOLD_S 30.0
#define TRAIN_HELD_MAX 64

typedef struct {
    char raw[1024];        /* the first rank's line as it came */
    char key[1024];        /* level and message without rank or header */
    char level[16];        /* "error", "warn", ... or "" for a plain line */
    const char *msg;       /* into key: the message */
    bool *ranks;           /* [nproc] local ranks that sent it */
    int count;
    double t;              /* when it first came */
} held_t;

typedef struct {
    int n;                 /* workers */
    int base;              /* global rank of local rank 0 */
    int *fd;               /* [n] read ends, -1 once at EOF */
    char (*buf)[2048];     /* [n] partial lines */
    size_t *len;           /* [n] */
    held_t held[TRAIN_HELD_MAX];
    int nheld;
} errmux_t;

/* "2026-12-02T01:02:03 [prog rank 1 pid 7] error: rank 1: text" -> level "error", key "error\ttext". */
static void err_key(const char *line, held_t *h) {
    const char *p = line, *lv = "", *body = line;
    size_t lvn = 0;
    if (strlen(p) > 21 && p[4] == '-' && p[10] == 'T' && p[19] == ' ' && p[20] == '[') {
        const char *close = strstr(p, "] ");
        const char *colon = close ? strstr(close + 2, ": ") : NULL;
        if (close && colon && colon - (close + 2) < 8) { lv = close + 2; lvn = (size_t)(colon - lv); body = colon + 2; }
    } else if (!strncmp(p, "ballast train: ", 15)) {
        body = p + 15;
    }
    int r, off = 0;
    if (sscanf(body, "rank %d: %n", &r, &off) == 1 && off > 0) body += off;
    snprintf(h->level, sizeof h->level, "%.*s", (int)(lvn < sizeof h->level ? lvn : sizeof h->level - 1), lv);
    snprintf(h->key, sizeof h->key, "%s\t%s", h->level, body);
    h->msg = strchr(h->key, '\t') + 1;
}

static void err_print(errmux_t *m, held_t *h) {
    if (h->count == 1) {
        fprintf(stderr, "%s\n", h->raw);
    } else {
        char who[512];
        size_t n = 0;
        for (int i = 0; i < m->n && n + 24 < sizeof who; i++) {
            if (!h->ranks[i]) continue;
            int j = i;
            while (j + 1 < m->n && h->ranks[j + 1]) j++;
            n += (size_t)snprintf(who + n, sizeof who - n, "%s%d", n ? ", " : "", m->base + i);
            if (j > i) n += (size_t)snprintf(who + n, sizeof who - n, "-%d", m->base + j);
            i = j;
        }
        fprintf(stderr, "ballast train: %s%son ranks %s: %s\n", h->level, h->level[0] ? " " : "", who, h->msg);
    }
    free(h->ranks);
}

/* No other copy of h can come: each rank sent it or has exited, or it was
 * held TRAIN_HOLD_S. */
static bool err_complete(const errmux_t *m, const held_t *h, double now) {
    if (now - h->t >= TRAIN_HOLD_S) return true;
    for (int i = 0; i < m->n; i++)
        if (!h->ranks[i] && m->fd[i] >= 0) return false;
    return true;
}

/* Print the held lines that are complete (all: every one), in the order
 * they came: a line waits for the ones before it. */
static void err_flush(errmux_t *m, bool all) {
    double now = clock_now_s();
    int done = 0;
    while (done < m->nheld && (all || err_complete(m, &m->held[done], now))) err_print(m, &m->held[done++]);
    memmove(m->held, m->held + done, (size_t)(m->nheld - done) * sizeof *m->held);
    m->nheld -= done;
}

static void err_line(errmux_t *m, int r, const char *line) {
    held_t h = { 0 };
    err_key(line, &h);
    /* only errors (and plain lines, such as a bad flag's) repeat on every rank; the rest pass at once */
    if (h.level[0] && strcmp(h.level, "error")) { fprintf(stderr, "%s\n", line); return; }
    for (int i = 0; i < m->nheld; i++) {
        held_t *o = &m->held[i];
        if (strcmp(o->key, h.key) || o->ranks[r]) continue;
        o->ranks[r] = true;
        o->count++;
        return;
    }
    if (m->nheld == TRAIN_HELD_MAX) {
        err_print(m, &m->held[0]);
        memmove(m->held, m->held + 1, (TRAIN_HELD_MAX - 1) * sizeof *m->held);
        m->nheld--;
    }
    held_t *n = &m->held[m->nheld++];
    *n = h;
    n->msg = strchr(n->key, '\t') + 1;
    snprintf(n->raw, sizeof n->raw, "%s", line);
    n->ranks = calloc((size_t)m->n, sizeof *n->ranks);
    CHECK_ALLOC(n->ranks);
    n->ranks[r] = true;
    n->count = 1;
    n->t = clock_now_s();
}

/* Read what the pipes hold, waiting up to wait_s for the first byte. */
static void err_pump(errmux_t *m, double wait_s) {
    struct pollfd pf[TRAIN_MAX_NPROC];
    int idx[TRAIN_MAX_NPROC], k = 0;
    for (int i = 0; i < m->n; i++)
        if (m->fd[i] >= 0) { pf[k] = (struct pollfd){ .fd = m->fd[i], .events = POLLIN }; idx[k++] = i; }
    if (!k) { if (wait_s > 0) usleep((useconds_t)(wait_s * 1e6)); err_flush(m, false); return; }
    if (poll(pf, (nfds_t)k, (int)(wait_s * 1000)) > 0) {
        for (int j = 0; j < k; j++) {
            if (!(pf[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            int i = idx[j];
            ssize_t got = read(m->fd[i], m->buf[i] + m->len[i], sizeof m->buf[i] - 1 - m->len[i]);
            if (got <= 0) {
                if (got < 0 && errno == EINTR) continue;
                if (m->len[i]) { m->buf[i][m->len[i]] = 0; err_line(m, i, m->buf[i]); m->len[i] = 0; }
                close(m->fd[i]);
                m->fd[i] = -1;
                continue;
            }
            m->len[i] += (size_t)got;
            char *st = m->buf[i], *nl;
            while ((nl = memchr(st, '\n', m->len[i] - (size_t)(st - m->buf[i])))) {
                *nl = 0;
                err_line(m, i, st);
                st = nl + 1;
            }
            size_t rest = m->len[i] - (size_t)(st - m->buf[i]);
            memmove(m->buf[i], st, rest);
            m->len[i] = rest;
            if (m->len[i] == sizeof m->buf[i] - 1) { m->buf[i][m->len[i]] = 0; err_line(m, i, m->buf[i]); m->len[i] = 0; }
        }
    }
    err_flush(m, false);
}

/* Once the workers have exited: what their pipes still hold (up to settle_s
 * for a pipe a grandchild keeps open), then every held line. */
static void err_settle(errmux_t *m, double settle_s) {
    if (!m) return;
    double t0 = clock_now_s();
    bool open = true;
    while (open && clock_now_s() - t0 < settle_s) {
        err_pump(m, 0.05);
        open = false;
        for (int i = 0; i < m->n; i++) open |= m->fd[i] >= 0;
    }
    err_flush(m, true);
}

/* Start this node's P workers for attempt `attempt` and watch them (and,
 * with ag, the other nodes) until all have exited. *status: the exit
 * status to return; cause: why the attempt failed. */
static run_end_t run_attempt(const launch_t *L, agent_t *ag, int attempt, char *const *wargv, int *status,
                             char *cause, size_t clen) {
    int nproc = L->nproc;
    pid_t *pids = calloc((size_t)nproc, sizeof *pids);
    CHECK_ALLOC(pids);
    int alive = 0;
    run_end_t end = RUN_OK;
    bool stopping = false, graceful = false; /* graceful: stopping on a signal, after the step */
    double stop_t = 0, abort_t = 0;
    char note[2 * AGENT_ERR_LEN + 128] = ""; /* the launcher's line on the first failure, after the ranks' messages */
    *status = 0;
    cause[0] = 0;
    /* several workers: their stderr through the launcher, each distinct message once */
    errmux_t mux = { 0 }, *mx = NULL;
    if (nproc > 1) {
        mux.n = nproc;
        mux.base = L->node_rank * nproc;
        mux.fd = malloc((size_t)nproc * sizeof *mux.fd);
        mux.buf = malloc((size_t)nproc * sizeof *mux.buf);
        mux.len = calloc((size_t)nproc, sizeof *mux.len);
        CHECK_ALLOC(mux.fd);
        CHECK_ALLOC(mux.buf);
        CHECK_ALLOC(mux.len);
        for (int r = 0; r < nproc; r++) mux.fd[r] = -1;
        mx = &mux;
    }
    for (int r = 0; r < nproc; r++) {
        int pfd[2] = { -1, -1 };
        if (mx && pipe2(pfd, O_CLOEXEC)) pfd[0] = pfd[1] = -1; /* no pipe: that worker writes to stderr itself */
        pid_t p = fork();
        if (p < 0) {
            snprintf(cause, clen, "node %d: fork of local rank %d failed: %s", L->node_rank, r, strerror(errno));
            fprintf(stderr, "ballast train: %s\n", cause);
            end = RUN_FAILED;
            *status = 1;
            break;
        }
        if (p == 0) {
            /* a process group of its own: a Ctrl-C at the terminal reaches the launcher only, which
             * acknowledges it and forwards it once, so a worker never mistakes it for a second one */
            setpgid(0, 0);
            prctl(PR_SET_PDEATHSIG, SIGTERM); /* a launcher killed outright leaves no worker behind */
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            child_env(L, r, attempt);
            setenv("BALLAST_LAUNCHER_ACKS", "1", 1);
            if (pfd[1] >= 0) dup2(pfd[1], STDERR_FILENO); /* dup2 clears close-on-exec on fd 2 */
            execv(wargv[0], wargv);
            execvp("ballast-worker", wargv);
            fprintf(stderr, "ballast train: rank %d: cannot start %s: %s\n", L->node_rank * nproc + r, wargv[0],
                    strerror(errno));
            _exit(127);
        }
        setpgid(p, p); /* also here: a signal may come before the child ran */
        if (pfd[1] >= 0) close(pfd[1]);
        if (mx) mx->fd[r] = pfd[0];
        pids[r] = p;
        alive++;
    }
    if (end != RUN_OK) {
        kill_all(pids, nproc, SIGTERM);
        stopping = true;
        stop_t = clock_now_s();
        if (ag) { char c2[AGENT_ERR_LEN]; agent_fail(ag, cause, c2, sizeof c2); }
    }
    while (alive > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p < 0 && errno != EINTR) break;
        if (g_fwd_sig && g_nsig >= 2 && !abort_t) {
            /* the second signal: no waiting for the step */
            int sig = g_fwd_sig;
            g_fwd_sig = 0;
            fprintf(stderr, "ballast train: second %s: aborting the ranks now (killed after 1 s); the step in "
                    "progress is lost\n", sig == SIGINT ? "Ctrl-C" : strsignal(sig));
            kill_all(pids, nproc, sig);
            abort_t = clock_now_s();
            graceful = false;
        } else if (g_fwd_sig) {
            int sig = g_fwd_sig;
            g_fwd_sig = 0;
            if (!stopping) {
                if (L->ckpt_dir)
                    fprintf(stderr, "ballast train: %s: the ranks finish the step in progress, save a checkpoint in "
                            "%s and stop; a second Ctrl-C aborts at once\n", strsignal(sig), L->ckpt_dir);
                else
                    fprintf(stderr, "ballast train: %s: the ranks finish the step in progress and stop (no "
                            "--ckpt-dir: nothing is saved); a second Ctrl-C aborts at once\n", strsignal(sig));
                graceful = true; /* a step may take long: no kill after the grace period */
            }
            kill_all(pids, nproc, sig);
            if (end == RUN_OK) {
                end = RUN_STOPPED;
                *status = 128 + sig;
                snprintf(cause, clen, "node %d (host %s) was stopped by signal %d (%s)", L->node_rank, L->host, sig,
                         strsignal(sig));
                if (ag) agent_stop(ag, cause);
            }
            stopping = true;
            if (!stop_t) stop_t = clock_now_s();
        }
        if (p <= 0) {
            /* nothing exited: watch the other nodes, enforce the grace period */
            if (ag && !stopping && agent_poll(ag, cause, clen)) {
                fprintf(stderr, "ballast train: node %d: %s; stopping this node's ranks\n", L->node_rank, cause);
                end = agent_stopped(ag) ? RUN_STOPPED : RUN_FAILED;
                *status = 1;
                kill_all(pids, nproc, SIGTERM);
                stopping = true;
                graceful = false;
                stop_t = clock_now_s();
            }
            if (stopping && !graceful && clock_now_s() - stop_t > TRAIN_KILL_GRACE_S) kill_all(pids, nproc, SIGKILL);
            if (abort_t && clock_now_s() - abort_t > TRAIN_ABORT_S) kill_all(pids, nproc, SIGKILL);
            if (mx) err_pump(mx, 0.05);
            else usleep(50000);
            continue;
        }
        if (p == g_bd_pid && g_bd_pid) {
            g_bd_died = true;
            fprintf(stderr, "ballast train: the ballastd this launcher started (pid %d) exited with status %d while "
                    "training; the workers will fail\n", (int)p, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        }
        int r = -1;
        for (int i = 0; i < nproc; i++) if (pids[i] == p) r = i;
        if (r < 0) continue;
        pids[r] = 0;
        alive--;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code == 0 || stopping) {
            if (code != 0 && *status == 0) *status = code;
            continue;
        }
        /* the first failure of this attempt on this node */
        *status = code;
        stopping = true;
        if (code != 130) graceful = false;
        stop_t = clock_now_s();
        if (code == 130) {         /* a signal at the terminal: the others stop after the same step */
            end = RUN_STOPPED;
            snprintf(cause, clen, "rank %d was interrupted", L->node_rank * nproc + r);
            if (ag) agent_stop(ag, cause);
            continue;
        }
        end = RUN_FAILED;
        char msg[AGENT_ERR_LEN];
        describe_exit(L, r, p, st, msg, sizeof msg);
        kill_all(pids, nproc, SIGTERM);
        if (ag) agent_fail(ag, msg, cause, clen);
        else snprintf(cause, clen, "%s", msg);
        /* with the ranks' stderr held, this line waits for their messages ("its message is above") */
        if (!strcmp(cause, msg))
            snprintf(note, sizeof note, "ballast train: %s; %s\n", msg,
                     mx ? "the other ranks were stopped" : "stopping the other ranks");
        else
            snprintf(note, sizeof note, "ballast train: node %d: %s; %s this node's ranks (here %s after it)\n",
                     L->node_rank, cause, mx ? "stopped" : "stopping", msg);
        if (!mx) { fputs(note, stderr); note[0] = 0; }
        if (ag && agent_stopped(ag)) end = RUN_STOPPED;
    }
    free(pids);
    if (mx) {
        err_settle(mx, 2.0); /* every worker exited: their pipes are at EOF, or soon */
        if (note[0]) fputs(note, stderr);
        for (int i = 0; i < nproc; i++) if (mux.fd[i] >= 0) close(mux.fd[i]);
        free(mux.fd);
        free(mux.buf);
        free(mux.len);
    }
    if (end == RUN_OK && ag && agent_finish(ag, cause, clen)) {
        fprintf(stderr, "ballast train: node %d: this node's ranks finished, but %s\n", L->node_rank, cause);
        end = agent_stopped(ag) ? RUN_STOPPED : RUN_FAILED;
        *status = 1;
    }
    return end;
}

/* Attempts until one succeeds, a signal stops the job or the restarts
 * are used up. Returns the launcher's exit status. */
static int launch(const launch_t *L, char *const *wargv) {
    struct sigaction sa = { 0 };
    sa.sa_handler = on_fwd;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    agent_t *ag = NULL;
    char err[AGENT_ERR_LEN], cause[AGENT_ERR_LEN];
    if (L->nnodes > 1) {
        agent_cfg_t ac = { .nnodes = L->nnodes, .node_rank = L->node_rank, .master_addr = L->master_addr,
                           .master_port = L->worker_port - 1, .rdzv_timeout_s = L->rdzv_timeout };
        if (!(ag = agent_open(&ac, err, sizeof err))) {
            fprintf(stderr, "ballast train: %s\n", err);
            return 1;
        }
    }
    int attempt = -1, status = 1;
    for (;;) {
        if (ag) {
            if (agent_begin(ag, &attempt, err, sizeof err)) {
                fprintf(stderr, "ballast train: %s\n", err);
                status = 1;
                break;
            }
        } else {
            attempt++;
        }
        if (attempt > L->max_restarts) {
            fprintf(stderr, "ballast train: node %d: the job is at attempt %d, past --max-restarts %d; not starting "
                    "again\n", L->node_rank, attempt, L->max_restarts);
            status = 1;
            break;
        }
        if (attempt > 0)
            fprintf(stderr, "ballast train: restart %d of %d: starting this node's %d rank%s again, from %s\n", attempt,
                    L->max_restarts, L->nproc, L->nproc == 1 ? "" : "s",
                    L->resume_given ? "what --resume says"
                    : L->ckpt_dir ? "the newest complete checkpoint in --ckpt-dir (--resume auto)"
                    : "step 0 (no --ckpt-dir to resume from)");
        run_end_t end = run_attempt(L, ag, attempt, wargv, &status, cause, sizeof cause);
        if (end == RUN_OK) { status = 0; break; }
        if (end == RUN_STOPPED) break;
        if (attempt >= L->max_restarts) {
            fprintf(stderr, "ballast train: the job failed (%s)%s\n", cause,
                    L->max_restarts ? "; no restarts left (--max-restarts)" : "; --max-restarts K restarts it");
            break;
        }
    }
    agent_close(ag);
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

/* Parse launcher integer flag `name` from val into *out within [lo, hi]. */
static int int_flag(const char *name, const char *val, int lo, int hi, int *out) {
    int64_t v;
    char err[256];
    if (parse_int64(val, &v, err, sizeof err) || v < lo || v > hi) {
        fprintf(stderr, "ballast train: --%s '%s': expected an integer from %d to %d\n", name, val, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Where this launcher sits: flags first, then the environment as
 * topology.h reads it (PET_*, JOB_COMPLETION_INDEX, MASTER_*). 0 or -1
 * (message printed). */
static int resolve_launch(launch_t *L, int nproc, int per_node, int nnodes, int node_rank, const char *maddr,
                          int mport) {
    if (nproc != TOPO_UNSET && per_node != TOPO_UNSET && nproc != per_node) {
        fprintf(stderr, "ballast train: --nproc %d and --nproc-per-node %d disagree; --nproc is the one-node form of "
                "--nproc-per-node: give one of them\n", nproc, per_node);
        return -1;
    }
    if (per_node == TOPO_UNSET) per_node = nproc;
    topo_flags_t f;
    topo_flags_init(&f);
    f.nnodes = nnodes;
    f.node_rank = node_rank;
    f.local_world_size = per_node;
    f.local_rank = 0;
    f.master_addr = maddr;
    f.master_port = mport;
    /* the launcher's own view: a RANK or WORLD_SIZE in its environment is for workers, not for it */
    const char *hide[] = { "RANK", "LOCAL_RANK", "WORLD_SIZE" };
    char *saved[3];
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(hide[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(hide[i]);
    }
    topo_t t;
    char err[TOPO_ERR_LEN];
    int rc = topo_resolve(&f, &t, err, sizeof err);
    for (int i = 0; i < 3; i++) if (saved[i]) { setenv(hide[i], saved[i], 1); free(saved[i]); }
    if (rc) { fprintf(stderr, "ballast train: %s\n", err); return -1; }
    L->nnodes = t.nnodes;
    L->node_rank = t.node_rank;
    L->nproc = t.local_world_size;
    if (L->nproc > TRAIN_MAX_NPROC) {
        fprintf(stderr, "ballast train: %d workers per node: at most %d\n", L->nproc, TRAIN_MAX_NPROC);
        return -1;
    }
    snprintf(L->master_addr, sizeof L->master_addr, "%s", t.master_addr);
    bool port_default = !strcmp(t.origin[TOPO_MASTER_PORT], "default");
    if (L->nnodes > 1) {
        if (t.master_port >= 65535) {
            fprintf(stderr, "ballast train: --master-port %d: the workers' store takes the port after it; pick a "
                    "port below 65535\n", t.master_port);
            return -1;
        }
        if (!strcmp(t.origin[TOPO_MASTER_ADDR], "default"))
            fprintf(stderr, "ballast train: warning: --nnodes %d without --master-addr (or MASTER_ADDR): node 0 is "
                    "taken to be %s\n", L->nnodes, L->master_addr);
        L->worker_port = t.master_port + 1;
    } else if (port_default) {
        L->worker_port = 0; /* a free port, picked at start */
    } else {
        L->worker_port = t.master_port;
    }
    return 0;
}

int cmd_train(int argc, char **argv) {
    int nproc = TOPO_UNSET, per_node = TOPO_UNSET, nnodes = TOPO_UNSET, node_rank = TOPO_UNSET;
    int mport = TOPO_UNSET, max_restarts = 0;
    const char *maddr = NULL;
    const char *run_dir = NULL, *pool = NULL, *spill = NULL, *spill_bytes = NULL;
    char **wargv = calloc((size_t)argc + 2, sizeof *wargv);
    CHECK_ALLOC(wargv);
    int wn = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            train_usage(stdout);
            free(wargv);
            return 0;
        }
        bool bad = false;
        const char *ov;
        int irc = 0;
        if ((ov = own_flag(argc, argv, &i, "run-dir", &bad))) { run_dir = ov; continue; }
        if ((ov = own_flag(argc, argv, &i, "offload-pool", &bad))) { pool = ov; continue; }
        if ((ov = own_flag(argc, argv, &i, "offload-spill-dir", &bad))) { spill = ov; continue; }
        if ((ov = own_flag(argc, argv, &i, "offload-spill-bytes", &bad))) { spill_bytes = ov; continue; }
        if ((ov = own_flag(argc, argv, &i, "nproc", &bad))) irc = int_flag("nproc", ov, 1, TRAIN_MAX_NPROC, &nproc);
        else if ((ov = own_flag(argc, argv, &i, "nproc-per-node", &bad)))
            irc = int_flag("nproc-per-node", ov, 1, TRAIN_MAX_NPROC, &per_node);
        else if ((ov = own_flag(argc, argv, &i, "nnodes", &bad))) irc = int_flag("nnodes", ov, 1, TRAIN_MAX_NODES, &nnodes);
        else if ((ov = own_flag(argc, argv, &i, "node-rank", &bad)))
            irc = int_flag("node-rank", ov, 0, TRAIN_MAX_NODES - 1, &node_rank);
        else if ((ov = own_flag(argc, argv, &i, "master-port", &bad))) irc = int_flag("master-port", ov, 1, 65535, &mport);
        else if ((ov = own_flag(argc, argv, &i, "max-restarts", &bad)))
            irc = int_flag("max-restarts", ov, 0, TRAIN_MAX_RESTARTS, &max_restarts);
        else if ((ov = own_flag(argc, argv, &i, "master-addr", &bad))) {
            if (!ov[0] || strlen(ov) >= TOPO_ADDR_MAX || strpbrk(ov, " /:\t")) {
                fprintf(stderr, "ballast train: --master-addr '%s': expected node 0's host name or IPv4 address\n", ov);
                irc = -1;
            }
            maddr = ov;
        }
        if (bad || irc) { free(wargv); return 2; }
        if (ov) continue;
        if (!strncmp(a, "--rank", 6) || !strncmp(a, "--world-size", 12) || !strncmp(a, "--local-rank", 12)) {
            fprintf(stderr, "ballast train: %s: the launcher gives every worker its rank and the world size; use "
                    "--nnodes, --node-rank and --nproc-per-node\n", a);
            free(wargv);
            return 2;
        }
        wargv[wn++] = argv[i];
    }
    launch_t L = { 0 };
    if (nnodes != TOPO_UNSET && nnodes > 1 && nproc != TOPO_UNSET && per_node == TOPO_UNSET) {
        fprintf(stderr, "ballast train: --nproc is the one-node form; with --nnodes %d give --nproc-per-node %d\n",
                nnodes, nproc);
        free(wargv);
        return 2;
    }
    if (resolve_launch(&L, nproc, per_node, nnodes, node_rank, maddr, mport)) { free(wargv); return 2; }
    L.max_restarts = max_restarts;
    if (gethostname(L.host, sizeof L.host - 1)) snprintf(L.host, sizeof L.host, "?");
    const char *rt = env_or(flag_value(wn, wargv, "rdzv-timeout", false), "BALLAST_RDZV_TIMEOUT", "300s");
    char e[256];
    if (parse_duration(rt, &L.rdzv_timeout, e, sizeof e) || L.rdzv_timeout <= 0) {
        fprintf(stderr, "ballast train: --rdzv-timeout '%s': expected a duration such as 30s or 5m\n", rt);
        free(wargv);
        return 2;
    }
    L.resume_given = env_or(flag_value(wn, wargv, "resume", true), "BALLAST_RESUME", NULL) != NULL;
    L.ckpt_dir = env_or(flag_value(wn, wargv, "ckpt-dir", false), "BALLAST_CKPT_DIR", NULL);
    if (max_restarts > 0 && !L.ckpt_dir && !L.resume_given)
        fprintf(stderr, "ballast train: warning: --max-restarts %d without --ckpt-dir: a restart begins at step 0\n",
                max_restarts);

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
    if (ballastd_ensure(&of, run_dir, pool, spill, spill_bytes, n > 0 ? self : NULL, L.nnodes * L.nproc, L.nproc)) {
        free(wargv);
        return 1;
    }
    if (L.nnodes > 1 || L.nproc > 1 || g_bd_pid || L.max_restarts > 0) {
        if (L.nnodes == 1 && !L.worker_port) {
            snprintf(L.master_addr, sizeof L.master_addr, "127.0.0.1");
            if ((L.worker_port = free_port()) < 0) {
                fprintf(stderr, "ballast train: cannot find a free TCP port on 127.0.0.1: %s\n", strerror(errno));
                ballastd_stop();
                free(wargv);
                return 1;
            }
        }
        int rc = launch(&L, wargv);
        ballastd_stop_ok(rc == 0 || rc == 130);
        free(wargv);
        return rc;
    }
    setenv("BALLAST_LAUNCHED_BY", "ballast train", 1);
    if (wargv[0] == worker) execv(worker, wargv);
    execvp("ballast-worker", wargv);
    fprintf(stderr, "ballast train: cannot start ballast-worker (%s); build it with `make` or put it on PATH\n", strerror(errno));
    free(wargv);
    return 1;
}
