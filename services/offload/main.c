/* main.c: ballastd, the node-local offload service.
 *
 * Wires the pieces together: options -> lock file on the socket path ->
 * store (pool + NVMe tier) -> session manager (fd socket, ring threads,
 * leases) -> gRPC server (Unix socket, optional TCP) -> optional health
 * server (grpc.health.v1 only, on its own TCP port). SIGTERM and SIGINT
 * only set a flag; the main thread then drains: health NOT_SERVING, no new
 * sessions, calls in flight finish, ring threads serve what is queued,
 * persistent data is synced, and the process exits 0. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "jemalloc_stats.h"
#include "log.h"
#include "metrics.h"
#include "options.h"
#include "rpc.h"
#include "shm.h"
#include "proto/offload_ring.h"
#include "services/offload/rpc_service.h"
#include "services/offload/session.h"
#include "services/offload/store.h"
#include "services/offload/svc_metrics.h"

static volatile sig_atomic_t g_stop;
static volatile int g_drained;

static void on_signal(int sig) { g_stop = sig; }

/* ---- options ---- */

static const char *o_socket, *o_fd_socket, *o_listen, *o_health_bind, *o_spill_dir,
                  *o_token_file, *o_port_file, *o_log_level;
static int64_t o_evict_watermark;
static int64_t o_health_port, o_threads, o_max_sessions, o_ring_entries, o_queue_depth,
               o_io_threads, o_ring_spin_us;
static uint64_t o_pool_bytes, o_segment_bytes, o_spill_bytes, o_spill_file_bytes,
                o_session_quota, o_default_quota, o_max_msg, o_job_quota;
static double o_lease, o_evict_wait, o_evict_ahead, o_stats_interval, o_drain_grace;
static int o_huge, o_io_backend;
static int64_t o_metrics_port;
static const char *o_metrics_bind, *o_socket_group, *o_tls_cert, *o_tls_key, *o_tls_ca;
static bool o_mlock, o_log_json, o_direct_io, o_allow_insecure_token;

static const opt_t opts[] = {
    { "socket", OPT_STRING, "/run/ballast/ballastd.sock", 0, 0, NULL,
      "Unix socket of the gRPC control API (a lock file <socket>.lock guards it)", &o_socket },
    { "socket-group", OPT_STRING, NULL, 0, 0, NULL,
      "group (name or gid) that may use --socket and --fd-socket besides ballastd's uid and root; "
      "the socket files get mode 0660 and this group", &o_socket_group },
    { "fd-socket", OPT_STRING, NULL, 0, 0, NULL,
      "Unix socket that hands pool and ring fds to clients (default <socket>.fd)", &o_fd_socket },
    { "listen", OPT_STRING, NULL, 0, 0, NULL,
      "also serve the API on TCP host:port (remote mode), e.g. 0.0.0.0:7070; port 0 picks one", &o_listen },
    { "tls-cert", OPT_STRING, NULL, 0, 0, NULL,
      "PEM certificate (chain) of the --listen port: remote mode over TLS", &o_tls_cert },
    { "tls-key", OPT_STRING, NULL, 0, 0, NULL, "PEM private key of --tls-cert", &o_tls_key },
    { "tls-ca", OPT_STRING, NULL, 0, 0, NULL,
      "PEM CA bundle: remote clients must present a certificate it signed (mutual TLS)", &o_tls_ca },
    { "allow-insecure-token", OPT_BOOL, "false", 0, 0, NULL,
      "accept --token-file with a plaintext --listen port (the token crosses the network in clear)",
      &o_allow_insecure_token },
    { "health-port", OPT_INT, "-1", -1, 65535, NULL,
      "TCP port serving only grpc.health.v1.Health (-1 = off, 0 = pick one)", &o_health_port },
    { "health-bind", OPT_STRING, "127.0.0.1", 0, 0, NULL,
      "address the health port binds (0.0.0.0 for Kubernetes probes)", &o_health_bind },
    { "metrics-port", OPT_INT, "0", 0, 65535, NULL, "serve Prometheus /metrics on this TCP port (0: off)", &o_metrics_port },
    { "metrics-bind", OPT_STRING, "127.0.0.1", 0, 0, NULL, "address of /metrics (0.0.0.0: every interface, e.g. for a Prometheus scraper elsewhere)", &o_metrics_bind },
    { "pool-bytes", OPT_SIZE, "1G", 1 << 20, 1ull << 50, NULL, "host memory pool size", &o_pool_bytes },
    { "segment-bytes", OPT_SIZE, "0", 0, 1ull << 50, NULL,
      "size of a new pool segment; each job gets its own (0 = a sixteenth of the pool, at most 64 MiB; a larger blob gets a segment its size)", &o_segment_bytes },
    { "huge-pages", OPT_ENUM, "thp", 0, 0, "off|2M|try|thp",
      "pages of the pool: thp, 4 KiB pages the kernel collapses into transparent 2 MiB ones when it can "
      "(Linux 6.1+, nothing to reserve); 2M, reserved 2 MiB huge pages (vm.nr_hugepages) or fail; try, "
      "reserved ones when free, else as thp; off, 4 KiB pages", &o_huge },
    { "mlock", OPT_BOOL, "true", 0, 0, NULL,
      "mlock the pool (warns and continues when RLIMIT_MEMLOCK is too low)", &o_mlock },
    { "spill-dir", OPT_STRING, NULL, 0, 0, NULL,
      "directory of the NVMe spill tier and the manifest of persistent blobs (unset: no spill)", &o_spill_dir },
    { "spill-bytes", OPT_SIZE, "16G", 1 << 20, 1ull << 55, NULL, "capacity of the spill tier", &o_spill_bytes },
    { "spill-file-bytes", OPT_SIZE, "1G", 1 << 20, 1ull << 50, NULL, "size of one spill file", &o_spill_file_bytes },
    { "io-backend", OPT_ENUM, "auto", 0, 0, "auto|io_uring|threads",
      "spill I/O: io_uring, a pread/pwrite thread pool, or auto (io_uring, else threads)", &o_io_backend },
    { "queue-depth", OPT_INT, "64", 32, 4096, NULL, "io_uring queue depth", &o_queue_depth },
    { "io-threads", OPT_INT, "4", 1, 256, NULL, "threads of the pread/pwrite fallback", &o_io_threads },
    { "direct-io", OPT_BOOL, "true", 0, 0, NULL, "open spill files with O_DIRECT (falls back when refused)", &o_direct_io },
    { "evict-wait", OPT_DURATION, "5s", 0.001, 3600, NULL,
      "how long a put waits for pool space before RESOURCE_EXHAUSTED", &o_evict_wait },
    { "evict-watermark", OPT_INT, "10", 0, 90, NULL,
      "percent of the pool kept free by spilling in the background (0: spill only when a put waits)",
      &o_evict_watermark },
    { "evict-ahead", OPT_DURATION, "50ms", 0, 10, NULL,
      "for this long after the pool was short of space, keep spilling the oldest blobs ahead of need "
      "(they stay in the pool until room is needed; 0: never)", &o_evict_ahead },
    { "session-quota", OPT_SIZE, "0", 0, 1ull << 60, NULL,
      "most bytes one session may hold (0 = no limit); requests above it are refused", &o_session_quota },
    { "job-quota", OPT_SIZE, "0", 0, 1ull << 60, NULL,
      "most bytes the blobs of one job may hold, over all its sessions, persistent ones until "
      "freed or released (0 = no limit)", &o_job_quota },
    { "default-quota", OPT_SIZE, "0", 0, 1ull << 60, NULL,
      "quota of a session that asks for none (0 = --session-quota)", &o_default_quota },
    { "max-sessions", OPT_INT, "256", 1, 65536, NULL, "open sessions at most", &o_max_sessions },
    { "lease", OPT_DURATION, "30s", 0.05, 86400, NULL,
      "session lease: a client silent this long loses its non-persistent blobs", &o_lease },
    { "ring-entries", OPT_INT, "256", 2, RING_PROTO_MAX_CAPACITY, NULL,
      "entries per session ring (power of two)", &o_ring_entries },
    { "ring-spin-us", OPT_INT, "0", 0, 1000000, NULL,
      "ring threads poll this long before sleeping (lower latency, more CPU)", &o_ring_spin_us },
    { "token-file", OPT_STRING, NULL, 0, 0, NULL,
      "file holding a token clients must present (OpenSession, Release)", &o_token_file },
    { "threads", OPT_INT, "4", 1, 256, NULL, "gRPC handler threads (one more waits for calls)", &o_threads },
    { "max-msg-bytes", OPT_SIZE, "64M", 64 << 10, 2047ull << 20, NULL,
      "largest gRPC message (limits remote-mode blobs)", &o_max_msg },
    { "drain-grace", OPT_DURATION, "10s", 0, 3600, NULL,
      "on SIGTERM, how long calls in flight may take to finish", &o_drain_grace },
    { "stats-interval", OPT_DURATION, "0", 0, 86400, NULL,
      "log a stats line this often (0 = never)", &o_stats_interval },
    { "port-file", OPT_STRING, NULL, 0, 0, NULL,
      "when ready, write \"<listen port> <health port>\" here (for scripts)", &o_port_file },
    { "log-json", OPT_BOOL, "false", 0, 0, NULL, "log JSON lines", &o_log_json },
    { "log-level", OPT_STRING, "info", 0, 0, NULL, "debug|info|warn|error", &o_log_level },
};
#define NOPTS (sizeof opts / sizeof opts[0])

static const char *USAGE =
    "usage: ballastd [options]\n"
    "ballastd: the node-local offload service (pinned host memory pool + NVMe spill).\n"
    "Workers connect over --socket; see docs/ballastd.md.";

/* Read the token file: first line, trailing whitespace removed. */
static int read_token(const char *path, char *tok, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) { log_error("--token-file %s: %s", path, strerror(errno)); return -1; }
    if (!fgets(tok, (int)cap, f)) tok[0] = 0;
    fclose(f);
    size_t n = strlen(tok);
    while (n && (tok[n - 1] == '\n' || tok[n - 1] == '\r' || tok[n - 1] == ' ' || tok[n - 1] == '\t')) tok[--n] = 0;
    if (n == 0) { log_error("--token-file %s is empty: put the token on its first line", path); return -1; }
    return 0;
}

/* One line of figures: every --stats-interval, and once at exit (sm NULL:
 * the sessions are gone by then). */
static void log_stats(store_t *store, sess_mgr_t *sm) {
    store_stats_t st;
    store_stats(store, &st);
    sess_counters_t sc = { 0 };
    if (sm) sess_counters(sm, &sc);
    char used[32], tot[32], spl[32];
    format_size(st.pool.used_bytes, used, sizeof used);
    format_size(st.pool.total_bytes, tot, sizeof tot);
    format_size(st.spilled_bytes, spl, sizeof spl);
    log_info("stats%s: pool %s/%s, spilled %s, %llu blobs, %llu sessions, %llu ring ops (%llu failed), "
             "%llu evictions, %llu spill writes (%llu ahead of need), %llu spill reads (%llu prefetched), io %s",
             sm ? "" : " at exit", used, tot, spl, (unsigned long long)st.blobs, (unsigned long long)st.sessions,
             (unsigned long long)sc.ring_ops, (unsigned long long)sc.ring_errors, (unsigned long long)st.evictions,
             (unsigned long long)st.spill_writes, (unsigned long long)st.ahead_writes,
             (unsigned long long)st.spill_reads, (unsigned long long)st.prefetches, st.io_backend);
}

/* ---- metrics: the figures svc_metrics mirrors at every scrape ---- */

typedef struct {
    store_t *store;
    sess_mgr_t *sm;
} svc_ref_t;

static void read_svc(void *arg, svc_metrics_sample_t *out) {
    svc_ref_t *r = arg;
    store_stats_t st;
    sess_counters_t sc;
    store_stats(r->store, &st);
    sess_counters(r->sm, &sc);
    out->pool_used_bytes = st.pool.used_bytes;
    out->pool_capacity_bytes = st.pool.total_bytes;
    out->pool_segment_bytes = st.pool.segment_bytes;
    out->pool_huge_bytes = st.pool.huge ? st.pool.segment_bytes : st.pool.thp_bytes;
    out->spill_used_bytes = st.spilled_bytes;
    out->blobs = st.blobs;
    out->sessions = st.sessions;
    out->spill_write_bytes = st.spill_write_bytes;
    out->spill_read_bytes = st.spill_read_bytes;
    out->evictions = st.evictions;
    out->ahead_writes = st.ahead_writes;
    out->crc_errors = st.crc_errors;
    out->quota_refusals = sc.quota_refusals;
    out->put_bytes = st.put_bytes;
    out->get_bytes = st.get_bytes;
}

/* One limit of the block device under dir's filesystem, from
 * /sys/dev/block/M:m/queue/NAME (a partition's queue/ is its disk's, one
 * level up); 0 when there is none (tmpfs, overlay, no sysfs). */
static unsigned long queue_limit(const char *dir, const char *name) {
    struct stat sb;
    if (stat(dir, &sb) != 0 || major(sb.st_dev) == 0) return 0;
    static const char *const where[] = { "", "../" };
    for (int i = 0; i < 2; i++) {
        char path[192];
        snprintf(path, sizeof path, "/sys/dev/block/%u:%u/%squeue/%s", major(sb.st_dev), minor(sb.st_dev),
                 where[i], name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long v = 0;
        int n = fscanf(f, "%lu", &v);
        fclose(f);
        if (n == 1) return v;
    }
    return 0;
}

/* Say so when the pool's pages may cap the spill writes' request size: a
 * direct-I/O request carries at most max_segments contiguous pieces of its
 * buffer, and on 4 KiB pages that are not contiguous (a host whose free
 * memory is fragmented) that is well under what the device takes. */
static void spill_request_hint(const char *dir, const store_stats_t *st) {
    if (!dir || !*dir || !st->direct_io || st->pool.huge || st->pool.thp) return;
    unsigned long segs = queue_limit(dir, "max_segments"), kb = queue_limit(dir, "max_sectors_kb");
    unsigned long pg_kb = (unsigned long)sysconf(_SC_PAGESIZE) / 1024;
    if (!segs || !kb || segs * pg_kb >= kb) return;
    log_info("spill: the pool is on %lu KiB pages, so a spill write can reach the disk in requests as small as "
             "%lu KiB (max_segments %lu, when its pages are not physically contiguous) where the device takes "
             "%lu KiB; %s (see docs/ballastd-storage.md, \"Known gaps\")",
             pg_kb, segs * pg_kb, segs, kb, st->pool.thp_errno
                 ? "transparent huge pages were refused (see the pool: line above); --huge-pages 2M keeps them at that size"
                 : "--huge-pages thp or 2M keeps them at that size");
}

int main(int argc, char **argv) {
    log_init("ballastd", -1);
    opt_set_env_prefix("BALLASTD_"); /* the service's own variables: a trainer's BALLAST_* never reach its options */
    opt_warn_moved_env(opts, NOPTS, "BALLAST_", "ballastd", stderr); /* `ballast train` passes it none */
    char err[OPT_ERR_LEN];
    const char *pos[1];
    int npos = 0;
    int rc = opt_parse(opts, NOPTS, argc, argv, pos, 0, &npos, USAGE, err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) { fprintf(stderr, "ballastd: %s\n", err); return 2; }
    /* --socket takes unix:PATH as the clients' flags do, or the bare path */
    if (o_socket && !strncmp(o_socket, "unix:", 5)) o_socket += 5;
    log_set_json(o_log_json);
    int lvl = log_level_parse(o_log_level);
    if (lvl < 0) { fprintf(stderr, "ballastd: --log-level '%s': use debug, info, warn or error\n", o_log_level); return 2; }
    log_set_level((log_level_t)lvl);
    if (o_ring_entries & (o_ring_entries - 1)) {
        fprintf(stderr, "ballastd: --ring-entries %lld must be a power of two\n", (long long)o_ring_entries);
        return 2;
    }
    if (strlen(o_socket) + 8 >= 108) {
        fprintf(stderr, "ballastd: --socket path '%s' is too long for a Unix socket (keep it under 100 bytes)\n", o_socket);
        return 2;
    }
    if (o_default_quota && o_session_quota && o_default_quota > o_session_quota) {
        fprintf(stderr, "ballastd: --default-quota is larger than --session-quota\n");
        return 2;
    }
    char token[SESS_TOKEN_MAX + 2] = "";
    if (o_token_file && o_token_file[0] && read_token(o_token_file, token, sizeof token)) return 2;
    bool tls = o_tls_cert && o_tls_cert[0];
    if (tls != (o_tls_key && o_tls_key[0]) || (o_tls_ca && o_tls_ca[0] && !tls)) {
        fprintf(stderr, "ballastd: --tls-cert and --tls-key go together (and --tls-ca needs them)\n");
        return 2;
    }
    if (tls && !(o_listen && o_listen[0])) {
        fprintf(stderr, "ballastd: --tls-cert applies to the --listen port; give --listen too\n");
        return 2;
    }
    if (o_listen && o_listen[0] && token[0] && !tls && !o_allow_insecure_token) {
        fprintf(stderr, "ballastd: --token-file with a plaintext --listen %s would send the token in clear: "
                "give --tls-cert/--tls-key, or --allow-insecure-token on a trusted network\n", o_listen);
        return 2;
    }
    if (o_listen && o_listen[0] && !token[0])
        log_warn("--listen %s without --token-file: anyone who reaches that address can open sessions", o_listen);
    shm_uidset_t peers;
    shm_uidset_default(&peers);
    gid_t sgid = 0;
    bool sgroup = o_socket_group && o_socket_group[0];
    if (sgroup) {
        char gerr[SHM_ERR_LEN];
        if (shm_group_lookup(o_socket_group, &sgid, gerr, sizeof gerr)) {
            fprintf(stderr, "ballastd: --socket-group: %s\n", gerr);
            return 2;
        }
        shm_uidset_allow_group(&peers, sgid);
    }

    /* One instance per socket path: take the lock before touching anything. */
    char serr[SHM_ERR_LEN];
    int lock_fd = -1;
    rc = shm_lock_path(o_socket, &lock_fd, serr, sizeof serr);
    if (rc) {
        fprintf(stderr, "ballastd: refusing to start: %s\n", serr);
        if (rc == -EADDRINUSE)
            fprintf(stderr, "ballastd: another ballastd already serves %s; stop it first or pick another --socket\n", o_socket);
        return 1;
    }
    char fd_path[128];
    if (o_fd_socket && o_fd_socket[0]) snprintf(fd_path, sizeof fd_path, "%s", o_fd_socket);
    else snprintf(fd_path, sizeof fd_path, "%s.fd", o_socket);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    store_config_t sc;
    store_config_default(&sc);
    sc.pool.pool_bytes = o_pool_bytes;
    sc.pool.segment_bytes = o_segment_bytes;
    sc.pool.huge = o_huge == 1 ? POOL_HUGE_ON : o_huge == 2 ? POOL_HUGE_TRY : o_huge == 3 ? POOL_HUGE_THP
                 : POOL_HUGE_OFF;
    sc.pool.mlock = o_mlock;
    sc.spill_dir = o_spill_dir && o_spill_dir[0] ? o_spill_dir : NULL;
    sc.spill_bytes = o_spill_bytes;
    sc.spill_file_bytes = o_spill_file_bytes;
    sc.job_quota = o_job_quota;
    sc.io_backend = o_io_backend == 1 ? STORE_IO_URING : o_io_backend == 2 ? STORE_IO_THREADS : STORE_IO_AUTO;
    sc.queue_depth = (uint32_t)o_queue_depth;
    sc.io_threads = (uint32_t)o_io_threads;
    sc.evict_wait_ms = (uint32_t)(o_evict_wait * 1000);
    sc.evict_watermark_pct = (uint32_t)o_evict_watermark;
    sc.evict_ahead_ms = (uint32_t)(o_evict_ahead * 1000 + 0.5);
    sc.direct_io = o_direct_io;
    store_t *store = NULL;
    char sterr[STORE_ERR_LEN];
    rc = store_open(&store, &sc, sterr, sizeof sterr);
    if (rc) {
        log_error("cannot open the store: %s", sterr);
        shm_unlock_path(o_socket, lock_fd);
        return 1;
    }

    sess_config_t cfg = {
        .lease_s = o_lease,
        .default_quota = o_default_quota ? o_default_quota : o_session_quota,
        .max_quota = o_session_quota,
        .max_sessions = (uint32_t)o_max_sessions,
        .ring_capacity = (uint32_t)o_ring_entries,
        .fd_socket = fd_path,
        .token = token,
        .ring_spin_us = (uint32_t)o_ring_spin_us,
        .peers = &peers,
        .socket_group_set = sgroup,
        .socket_gid = sgid,
    };
    sess_mgr_t *sm = NULL;
    char e2[SESS_ERR_LEN];
    rc = sess_mgr_open(&sm, &cfg, store, e2, sizeof e2);
    if (rc) {
        log_error("cannot open the fd socket %s: %s", fd_path, e2);
        store_close(store);
        shm_unlock_path(o_socket, lock_fd);
        return 1;
    }

    svc_ref_t sref = { store, sm };
    svc_metrics_t *smx = NULL;
    jemalloc_metrics_t *jmx = NULL;
    metrics_server_t *msrv = NULL;
    rpc_server_opts_t ro = { .threads = (int)o_threads, .max_msg_bytes = (size_t)o_max_msg,
                             .unix_peers = &peers, .unix_group_set = sgroup, .unix_gid = sgid,
                             .tls_cert = tls ? o_tls_cert : NULL, .tls_key = tls ? o_tls_key : NULL,
                             .tls_ca = tls && o_tls_ca && o_tls_ca[0] ? o_tls_ca : NULL };
    char rerr[RPC_ERR_LEN];
    rpc_server_t *srv = rpc_server_new(&ro, rerr, sizeof rerr);
    rpc_server_t *hsrv = NULL;
    offload_svc_t svc = { store, sm, srv, fd_path, o_max_msg, 0, &g_drained, token[0] != 0 };
    int listen_port = 0, health_port = 0;
    char addr[160];
    snprintf(addr, sizeof addr, "unix:%s", o_socket);
    if (!srv || offload_svc_register(srv, &svc, rerr, sizeof rerr) ||
        rpc_server_listen(srv, addr, NULL, rerr, sizeof rerr) ||
        (o_listen && o_listen[0] && rpc_server_listen(srv, o_listen, &listen_port, rerr, sizeof rerr)) ||
        rpc_server_start(srv, rerr, sizeof rerr)) {
        log_error("cannot start the gRPC server: %s", rerr);
        goto fail;
    }
    if (o_health_port >= 0) {
        char haddr[160];
        snprintf(haddr, sizeof haddr, "%s:%lld", o_health_bind, (long long)o_health_port);
        rpc_server_opts_t ho = { 1, 0 };
        hsrv = rpc_server_new(&ho, rerr, sizeof rerr);
        if (!hsrv || rpc_server_listen(hsrv, haddr, &health_port, rerr, sizeof rerr) ||
            rpc_server_start(hsrv, rerr, sizeof rerr)) {
            log_error("cannot serve health checks on %s: %s", haddr, rerr);
            goto fail;
        }
    }
    {
        store_stats_t st;
        store_stats(store, &st);
        char pb[32];
        format_size(st.pool.total_bytes, pb, sizeof pb);
        log_info("ready: socket %s, fd socket %s%s%s, pool %s on %s in %u segment(s)%s, spill %s "
                 "(io %s%s%s), lease %.3gs, %llu persistent blob(s) recovered",
                 o_socket, fd_path, listen_port ? ", tcp port " : "", listen_port ? o_listen : "",
                 pb, st.pool.huge ? "2 MiB huge pages" : st.pool.thp ? "transparent huge pages" : "4 KiB pages",
                 st.pool.nsegs, st.pool.mlocked ? " mlocked" : " not mlocked",
                 sc.spill_dir ? sc.spill_dir : "off", st.io_backend, st.io_fallback[0] ? ": " : "",
                 st.io_fallback, o_lease, (unsigned long long)st.persistent_blobs);
        spill_request_hint(sc.spill_dir, &st);
        if (hsrv) log_info("health: grpc.health.v1 on %s:%d", o_health_bind, health_port);
        if (listen_port) log_info("remote mode: listening on TCP port %d", listen_port);
    }
    if (o_metrics_port > 0) {
        char merr[METRICS_ERR_LEN];
        if (!(smx = svc_metrics_init(metrics_default(), read_svc, &sref, merr, sizeof merr))) {
            log_error("metrics: %s", merr);
            goto fail;
        }
        if (!(jmx = jemalloc_stats_metrics_init(metrics_default(), merr, sizeof merr))) log_info("metrics: %s", merr);
        if (!(msrv = metrics_server_start(metrics_default(), o_metrics_bind, (int)o_metrics_port, merr, sizeof merr))) {
            log_error("metrics: %s", merr);
            goto fail;
        }
        log_info("metrics: http://%s:%d/metrics", o_metrics_bind, metrics_server_port(msrv));
    }
    if (o_port_file && o_port_file[0]) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", o_port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d %d\n", listen_port, health_port) < 0 || fclose(f) || rename(tmp, o_port_file)) {
            log_error("cannot write --port-file %s: %s", o_port_file, strerror(errno));
            goto fail;
        }
    }

    double next_stats = o_stats_interval;
    double waited = 0;
    while (!g_stop && !g_drained) {
        struct timespec ts = { 0, 100 * 1000000 };
        nanosleep(&ts, NULL);
        waited += 0.1;
        if (o_stats_interval > 0 && waited >= next_stats) { log_stats(store, sm); next_stats += o_stats_interval; }
    }

    log_info("%s: draining (calls in flight may take up to %.3gs)",
             g_drained && !g_stop ? "Drain RPC" : g_stop == SIGINT ? "SIGINT" : "SIGTERM", o_drain_grace);
    if (hsrv) rpc_server_set_health(hsrv, "", RPC_HEALTH_NOT_SERVING);
    rpc_server_set_health(srv, "", RPC_HEALTH_NOT_SERVING);
    sess_mgr_set_draining(sm);
    rpc_server_stop(srv, (int)(o_drain_grace * 1000));
    metrics_server_stop(msrv); /* before what the collector reads goes away */
    svc_metrics_free(smx);
    jemalloc_stats_metrics_free(jmx);
    sess_mgr_close(sm); /* ring threads serve what is queued, then sessions end */
    sm = NULL;
    rc = store_drain(store, sterr, sizeof sterr);
    if (rc) log_error("drain: %s", sterr);
    log_stats(store, NULL);
    rpc_server_free(srv);
    rpc_server_free(hsrv);
    store_close(store);
    if (o_port_file && o_port_file[0]) unlink(o_port_file);
    shm_unlock_path(o_socket, lock_fd);
    log_info("drained, exiting");
    return rc ? 1 : 0;

fail:
    metrics_server_stop(msrv);
    svc_metrics_free(smx);
    jemalloc_stats_metrics_free(jmx);
    rpc_server_free(srv);
    rpc_server_free(hsrv);
    sess_mgr_close(sm);
    store_close(store);
    shm_unlock_path(o_socket, lock_fd);
    return 1;
}
