/* cmd_status.c: `ballast status`: what a ballastd holds right now (pool used
 * and free, spilled bytes, sessions and their usage, io backend, its own
 * heap as jemalloc sees it), as a table for people or JSON for scripts. One
 * Stats call; needs no session. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "jemalloc_stats.h"
#include "log.h"
#include "offload.pb-c.h"
#include "options.h"
#include "rpc.h"
#include "workers/cli/cli.h"

static const char *s_socket, *s_addr;
static bool s_json;
static double s_timeout;

static const opt_t status_opts[] = {
    { "offload-socket", OPT_STRING, "unix:/run/ballast/ballastd.sock", 0, 0, NULL, "ballastd's socket: unix:PATH, a path, or HOST:PORT", &s_socket, "socket" },
    { "offload-remote", OPT_STRING, NULL, 0, 0, NULL, "ballastd's TCP address HOST:PORT (instead of --offload-socket)", &s_addr, "addr" },
    { "json", OPT_BOOL, "false", 0, 0, NULL, "print JSON instead of a table", &s_json },
    { "timeout", OPT_DURATION, "5s", 0.01, 3600, NULL, "how long to wait for the answer", &s_timeout },
};

/* ballastd's allocator figures as jemalloc_stats_t (for the fragmentation). */
static jemalloc_stats_t heap_of(const Ballast__Offload__V1__AllocatorStats *a) {
    return (jemalloc_stats_t){ .allocated = a->allocated_bytes, .active = a->active_bytes,
                               .resident = a->resident_bytes, .mapped = a->mapped_bytes,
                               .retained = a->retained_bytes, .metadata = a->metadata_bytes };
}

/* The "allocator" object, or null from a ballastd that does not report it. */
static json_t *allocator_json(const Ballast__Offload__V1__AllocatorStats *a) {
    if (!a) return json_null();
    json_t *o = json_object();
    jemalloc_stats_t h = heap_of(a);
    json_object_set_new(o, "name", json_string(a->name ? a->name : ""));
    json_object_set_new(o, "is_malloc", json_boolean(a->is_malloc));
    json_object_set_new(o, "why_not", json_string(a->why_not ? a->why_not : ""));
    json_object_set_new(o, "allocated_bytes", json_integer((json_int_t)h.allocated));
    json_object_set_new(o, "active_bytes", json_integer((json_int_t)h.active));
    json_object_set_new(o, "resident_bytes", json_integer((json_int_t)h.resident));
    json_object_set_new(o, "mapped_bytes", json_integer((json_int_t)h.mapped));
    json_object_set_new(o, "retained_bytes", json_integer((json_int_t)h.retained));
    json_object_set_new(o, "metadata_bytes", json_integer((json_int_t)h.metadata));
    json_object_set_new(o, "fragmentation_ratio", json_real(jemalloc_stats_fragmentation(&h)));
    return o;
}

/* One line: the allocator and its figures, or why there are none. */
static void print_allocator(const Ballast__Offload__V1__AllocatorStats *a) {
    if (!a) { printf("  allocator not reported by this ballastd (it predates the field)\n"); return; }
    if (!a->is_malloc) {
        printf("  allocator %s: no figures: %s\n", a->name && a->name[0] ? a->name : "no jemalloc",
               a->why_not && a->why_not[0] ? a->why_not : "unknown reason");
        return;
    }
    jemalloc_stats_t h = heap_of(a);
    char al[32], ac[32], re[32], ma[32], rt[32], md[32];
    format_size(h.allocated, al, sizeof al);
    format_size(h.active, ac, sizeof ac);
    format_size(h.resident, re, sizeof re);
    format_size(h.mapped, ma, sizeof ma);
    format_size(h.retained, rt, sizeof rt);
    format_size(h.metadata, md, sizeof md);
    printf("  allocator %s: %s allocated, %s active (fragmentation %.3f), %s resident, %s mapped, "
           "%s retained, %s metadata\n", a->name, al, ac, jemalloc_stats_fragmentation(&h), re, ma, rt, md);
}

static json_t *to_json(const Ballast__Offload__V1__StatsResponse *r) {
    json_t *o = json_object();
    json_object_set_new(o, "pid", json_integer(r->pid));
    json_object_set_new(o, "uptime_seconds", json_real(r->uptime_seconds));
    json_object_set_new(o, "pool_bytes", json_integer((json_int_t)r->pool_bytes));
    json_object_set_new(o, "pool_used_bytes", json_integer((json_int_t)r->pool_used_bytes));
    json_object_set_new(o, "pool_free_bytes", json_integer((json_int_t)r->pool_free_bytes));
    json_object_set_new(o, "segments", json_integer(r->segments));
    json_object_set_new(o, "mlocked", json_boolean(r->mlocked));
    json_object_set_new(o, "spill_bytes", json_integer((json_int_t)r->spill_bytes));
    json_object_set_new(o, "spilled_bytes", json_integer((json_int_t)r->spilled_bytes));
    json_object_set_new(o, "io_backend", json_string(r->io_backend ? r->io_backend : ""));
    json_object_set_new(o, "io_fallback", json_string(r->io_fallback ? r->io_fallback : ""));
    json_object_set_new(o, "direct_io", json_boolean(r->direct_io));
    json_object_set_new(o, "blobs", json_integer((json_int_t)r->blobs));
    json_object_set_new(o, "persistent_blobs", json_integer((json_int_t)r->persistent_blobs));
    size_t live = 0;
    for (size_t i = 0; i < r->n_sessions; i++) live += !r->sessions[i]->detached;
    json_object_set_new(o, "sessions_open", json_integer((json_int_t)live));
    json_object_set_new(o, "sessions_detached", json_integer((json_int_t)(r->n_sessions - live)));
    json_object_set_new(o, "sessions_opened", json_integer((json_int_t)r->sessions_opened));
    json_object_set_new(o, "sessions_expired", json_integer((json_int_t)r->sessions_expired));
    json_object_set_new(o, "ring_ops", json_integer((json_int_t)r->ring_ops));
    json_object_set_new(o, "ring_errors", json_integer((json_int_t)r->ring_errors));
    json_object_set_new(o, "quota_refusals", json_integer((json_int_t)r->quota_refusals));
    json_object_set_new(o, "rpc_calls", json_integer((json_int_t)r->rpc_calls));
    json_object_set_new(o, "evictions", json_integer((json_int_t)r->evictions));
    json_object_set_new(o, "spill_writes", json_integer((json_int_t)r->spill_writes));
    json_object_set_new(o, "spill_reads", json_integer((json_int_t)r->spill_reads));
    json_object_set_new(o, "draining", json_boolean(r->draining));
    json_object_set_new(o, "allocator", allocator_json(r->allocator));
    json_t *arr = json_array();
    for (size_t i = 0; i < r->n_sessions; i++) {
        const Ballast__Offload__V1__SessionStats *s = r->sessions[i];
        json_t *j = json_object();
        char id[20];
        snprintf(id, sizeof id, "%016llx", (unsigned long long)s->session_id);
        json_object_set_new(j, "id", json_string(id));
        json_object_set_new(j, "job", json_string(s->job ? s->job : ""));
        json_object_set_new(j, "rank", json_integer(s->rank));
        json_object_set_new(j, "pid", json_integer(s->pid));
        json_object_set_new(j, "client", json_string(s->client_name ? s->client_name : ""));
        json_object_set_new(j, "mode", json_string(s->shared_memory ? "shm" : "remote"));
        json_object_set_new(j, "state", json_string(s->detached ? "closed, holds blobs" : "open"));
        json_object_set_new(j, "quota_bytes", json_integer((json_int_t)s->quota_bytes));
        json_object_set_new(j, "used_bytes", json_integer((json_int_t)s->used_bytes));
        json_object_set_new(j, "ops", json_integer((json_int_t)s->ops));
        json_object_set_new(j, "errors", json_integer((json_int_t)s->errors));
        json_object_set_new(j, "idle_seconds", s->idle_seconds < 0 ? json_null() : json_real(s->idle_seconds));
        json_array_append_new(arr, j);
    }
    json_object_set_new(o, "sessions", arr);
    return o;
}

static void print_table(const Ballast__Offload__V1__StatsResponse *r, const char *addr) {
    char a[32], b[32], c[32], d[32];
    format_size(r->pool_used_bytes, a, sizeof a);
    format_size(r->pool_free_bytes, b, sizeof b);
    format_size(r->pool_bytes, c, sizeof c);
    printf("ballastd %s (pid %u, up %.0fs)%s\n", addr, r->pid, r->uptime_seconds, r->draining ? "  DRAINING" : "");
    printf("  pool      %s used, %s free of %s in %u segment(s), %s\n", a, b, c, r->segments,
           r->mlocked ? "mlocked" : "NOT mlocked (raise RLIMIT_MEMLOCK)");
    format_size(r->spilled_bytes, a, sizeof a);
    format_size(r->spill_bytes, b, sizeof b);
    printf("  spill     %s of %s, io backend %s, %llu evictions, %llu writes, %llu reads\n", a,
           r->spill_bytes ? b : "0 (no --spill-dir)", r->io_backend, (unsigned long long)r->evictions,
           (unsigned long long)r->spill_writes, (unsigned long long)r->spill_reads);
    if (r->io_fallback && r->io_fallback[0]) printf("            io_uring not used: %s\n", r->io_fallback);
    printf("  blobs     %llu (%llu persistent)\n", (unsigned long long)r->blobs, (unsigned long long)r->persistent_blobs);
    size_t live = 0;
    for (size_t i = 0; i < r->n_sessions; i++) live += !r->sessions[i]->detached;
    printf("  sessions  %zu open, %zu closed holding blobs, %llu opened, %llu expired; ring ops %llu (%llu failed), quota refusals %llu\n",
           live, r->n_sessions - live, (unsigned long long)r->sessions_opened, (unsigned long long)r->sessions_expired,
           (unsigned long long)r->ring_ops, (unsigned long long)r->ring_errors, (unsigned long long)r->quota_refusals);
    print_allocator(r->allocator);
    if (!r->n_sessions) return;
    printf("\n  %-16s %-20s %5s %7s %-6s %10s %10s %10s %7s %8s\n", "SESSION", "JOB", "RANK", "PID", "MODE",
           "USED", "QUOTA", "OPS", "ERRORS", "IDLE");
    for (size_t i = 0; i < r->n_sessions; i++) {
        const Ballast__Offload__V1__SessionStats *s = r->sessions[i];
        format_size(s->used_bytes, a, sizeof a);
        if (s->quota_bytes) format_size(s->quota_bytes, d, sizeof d);
        else snprintf(d, sizeof d, "-");
        char idle[24];
        if (s->idle_seconds < 0) snprintf(idle, sizeof idle, "closed");
        else snprintf(idle, sizeof idle, "%.1fs", s->idle_seconds);
        printf("  %016llx %-20.20s %5u %7d %-6s %10s %10s %10llu %7llu %8s\n", (unsigned long long)s->session_id,
               s->job, s->rank, s->pid, s->shared_memory ? "shm" : "remote", a, d, (unsigned long long)s->ops,
               (unsigned long long)s->errors, idle);
    }
}

/* The address of ballastd from --offload-remote (HOST:PORT) or
 * --offload-socket (unix:PATH, a bare path, or HOST:PORT). */
static void status_addr(char *buf, size_t n) {
    const char *s = s_socket;
    if (s_addr && s_addr[0]) snprintf(buf, n, "%s", s_addr);
    else if (!strncmp(s, "unix:", 5) || (strchr(s, ':') && !strchr(s, '/'))) snprintf(buf, n, "%s", s);
    else snprintf(buf, n, "unix:%s", s);
}

int cmd_status(int argc, char **argv) {
    char err[OPT_ERR_LEN];
    int npos = 0;
    int rc = opt_parse(status_opts, sizeof status_opts / sizeof status_opts[0], argc, argv, NULL, 0, &npos,
                       "usage: ballast status [--offload-socket unix:PATH | --offload-remote HOST:PORT] [--json]\n"
                       "Show what ballastd holds: pool, spill tier, sessions, its own heap.", err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) { fprintf(stderr, "ballast status: %s\n", err); return 2; }
    char addr[300];
    status_addr(addr, sizeof addr);
    char rerr[RPC_ERR_LEN];
    rpc_client_t *c = rpc_client_open(addr, NULL, rerr, sizeof rerr);
    if (!c) { fprintf(stderr, "ballast status: %s\n", rerr); return 1; }
    Ballast__Offload__V1__StatsRequest req = BALLAST__OFFLOAD__V1__STATS_REQUEST__INIT;
    Ballast__Offload__V1__StatsResponse *r = NULL;
    char msg[512];
    grpc_status_code st = rpc_call(c, "/ballast.offload.v1.Offload/Stats", (ProtobufCMessage *)&req,
                                   &ballast__offload__v1__stats_response__descriptor, (ProtobufCMessage **)&r,
                                   (int64_t)(s_timeout * 1000), false, msg, sizeof msg);
    if (st != GRPC_STATUS_OK) {
        fprintf(stderr, "ballast status: %s\n", msg);
        if (st == GRPC_STATUS_UNAVAILABLE || st == GRPC_STATUS_DEADLINE_EXCEEDED)
            fprintf(stderr, "ballast status: is ballastd running at %s? start it with `ballastd --socket PATH` "
                    "or point --offload-socket/--offload-remote at it\n", addr);
        rpc_client_close(c);
        return 1;
    }
    if (s_json) {
        json_t *o = to_json(r);
        json_object_set_new(o, "address", json_string(addr));
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        print_table(r, addr);
    }
    protobuf_c_message_free_unpacked((ProtobufCMessage *)r, NULL);
    rpc_client_close(c);
    return 0;
}
