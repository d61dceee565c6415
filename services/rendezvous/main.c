/* main.c: ballast-rdzv, the standalone rendezvous server (the same store
 * rank 0 serves in-process). Runs until SIGINT/SIGTERM, or until --idle-timeout
 * passes without a call. See docs/comm.md. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "clock.h"
#include "options.h"
#include "services/rendezvous/rdzv.h"

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { stop_flag = sig; }

int main(int argc, char **argv) {
    const char *listen = NULL, *job_id = NULL, *port_file = NULL;
    int64_t world = 0, threads = 0;
    uint64_t max_value = 0;
    int64_t max_keys = 0;
    uint64_t max_bytes = 0;
    double timeout = 0;
    const opt_t opts[] = {
        { "listen", OPT_STRING, "127.0.0.1:29500", 0, 0, NULL,
          "address to serve: host:port (port 0 = any free port) or unix:/path", &listen },
        { "world-size", OPT_INT, "0", 0, 1 << 20, NULL,
          "ranks in the job; calls that say otherwise are refused (0 = accept any)", &world, "world" },
        { "job-id", OPT_STRING, "", 0, 0, NULL,
          "serve only calls carrying this job id (empty = any)", &job_id },
        { "idle-timeout", OPT_DURATION, "0", 0, 0, NULL,
          "exit after this long without a call (0 = run until SIGINT/SIGTERM)", &timeout, "timeout" },
        { "threads", OPT_INT, "4", 2, 256, NULL, "server threads", &threads },
        { "max-value", OPT_SIZE, "1M", 1, 1ull << 30, NULL, "largest value accepted", &max_value },
        { "max-keys", OPT_INT, "65536", 1, 1 << 24, NULL, "most keys held", &max_keys },
        { "max-bytes", OPT_SIZE, "256M", 4096, 1ull << 40, NULL,
          "most bytes held in keys, values and barriers together", &max_bytes },
        { "port-file", OPT_STRING, NULL, 0, 0, NULL,
          "write the bound TCP port to this file once serving (for port 0)", &port_file },
    };
    size_t nopts = sizeof opts / sizeof opts[0];
    char err[OPT_ERR_LEN];
    int np = 0;
    log_init("ballast-rdzv", -1);
    opt_set_env_prefix("BALLAST_RDZV_");
    opt_warn_moved_env(opts, nopts, "BALLAST_", "ballast-rdzv", stderr); /* its variables before the prefix */
    int rc = opt_parse(opts, nopts, argc, argv, NULL, 0, &np,
                       "ballast-rdzv [options]: the rendezvous key/value and barrier store",
                       err, sizeof err);
    if (rc == 1) return 0;
    if (rc) {
        fprintf(stderr, "ballast-rdzv: %s\n", err);
        return 2;
    }
    if (timeout < 0) {
        fprintf(stderr, "ballast-rdzv: --idle-timeout must not be negative\n");
        return 2;
    }
    rdzv_server_opts_t so = { .listen = listen, .job_id = job_id, .world = (int)world,
                              .threads = (int)threads, .max_value_bytes = max_value,
                              .max_keys = (size_t)max_keys, .max_bytes = max_bytes };
    char serr[RDZV_ERR_LEN];
    int port = 0;
    rdzv_server_t *s = rdzv_server_start(&so, &port, serr, sizeof serr);
    if (!s) {
        log_error("%s", serr);
        return 1;
    }
    if (port_file) {
        FILE *f = fopen(port_file, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f)) {
            log_error("cannot write --port-file %s", port_file);
            rdzv_server_stop(s);
            return 1;
        }
    }
    log_info("serving on %s (port %d), world %lld, job \"%s\"", listen, port, (long long)world, job_id);
    struct sigaction sa = { .sa_handler = on_signal };
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    uint64_t last_calls = 0;
    double last_t = clock_now_s();
    while (!stop_flag) {
        usleep(100 * 1000);
        rdzv_stats_t st;
        rdzv_server_stats(s, &st);
        uint64_t calls = st.sets + st.gets + st.waits + st.barriers;
        if (calls != last_calls) last_calls = calls, last_t = clock_now_s();
        if (timeout > 0 && clock_now_s() - last_t > timeout) {
            log_info("no call for %.1f s (--idle-timeout): exiting", timeout);
            break;
        }
    }
    rdzv_stats_t st;
    rdzv_server_stats(s, &st);
    log_info("stopping: %llu keys, %llu set, %llu get, %llu wait, %llu barrier calls, %llu rounds "
             "completed, %llu failed", (unsigned long long)st.keys, (unsigned long long)st.sets,
             (unsigned long long)st.gets, (unsigned long long)st.waits, (unsigned long long)st.barriers,
             (unsigned long long)st.barriers_done, (unsigned long long)st.barriers_failed);
    rdzv_server_stop(s);
    return 0;
}
