/* rpc_service.c: handlers of ballast.offload.v1.Offload. See rpc_service.h.
 * Handlers run on the rpc layer's threads; everything they touch (store,
 * session manager) is thread-safe. */
#include "services/offload/rpc_service.h"
#include "clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "offload.pb-c.h"
#include "proto/offload_ring.h"
#include "services/offload/svc_allocator.h"

typedef Ballast__Offload__V1__Key pb_key_t;

/* Turn a request key into a store key of job_id; INVALID_ARGUMENT when the
 * key is missing or its kind is not a known value. */
static grpc_status_code key_from_pb(rpc_ctx_t *ctx, const pb_key_t *pk, uint64_t job_id,
                                    store_key_t *k) {
    if (!pk) return rpc_ctx_errf(ctx, GRPC_STATUS_INVALID_ARGUMENT, "key is missing");
    if ((int)pk->kind < (int)STORE_KIND_ACTIVATION || (int)pk->kind > (int)STORE_KIND_OTHER)
        return rpc_ctx_errf(ctx, GRPC_STATUS_INVALID_ARGUMENT,
                            "key kind %d is not one of ACTIVATION(1), OPTIMIZER_STATE(2), PARAM(3), OTHER(4)",
                            (int)pk->kind);
    k->job_id = job_id;
    k->rank = pk->rank;
    k->kind = (uint32_t)pk->kind;
    k->index = pk->index;
    k->step = pk->step;
    return GRPC_STATUS_OK;
}

/* The gRPC code of a status_t: the one mapping, proto/status.h. */
static grpc_status_code grpc_of(status_t st) { return (grpc_status_code)status_to_grpc(st); }

static grpc_status_code store_fail(rpc_ctx_t *ctx, status_t st, const char *what,
                                   const store_key_t *k, const char *detail) {
    return rpc_ctx_errf(ctx, grpc_of(st),
                        "%s of key (rank %u, kind %u, index %llu, step %llu): %s%s%s", what,
                        k->rank, k->kind, (unsigned long long)k->index, (unsigned long long)k->step,
                        status_word(st), detail && detail[0] ? ": " : "", detail ? detail : "");
}

static grpc_status_code sess_fail(rpc_ctx_t *ctx, status_t st, const char *msg) {
    return rpc_ctx_errf(ctx, grpc_of(st), "%s", msg);
}

/* ---- callers ---- */

static sess_caller_t caller_of(const rpc_ctx_t *ctx) {
    return (sess_caller_t){ ctx->peer_local, ctx->peer_uid };
}

/* Whether the caller may act on every job (Stats of all sessions, ListKeys
 * of any job, Release of any job, Drain): a Unix-socket caller running as
 * ballastd's own uid or as root. The token of --token-file is not enough:
 * every job holds it to open sessions. */
static bool caller_admin(offload_svc_t *svc, const rpc_ctx_t *ctx, const char *token) {
    (void)svc;
    (void)token;
    return ctx->peer_local && (ctx->peer_uid == 0 || ctx->peer_uid == (uint32_t)geteuid());
}

static grpc_status_code not_admin(rpc_ctx_t *ctx, const char *what) {
    return rpc_ctx_errf(ctx, GRPC_STATUS_UNAUTHENTICATED,
                        "%s needs a Unix-socket caller running as ballastd's uid or root", what);
}

/* sess_use for a caller: the session must exist and be the caller's. */
static status_t use_owned(offload_svc_t *svc, rpc_ctx_t *ctx, uint64_t sid, uint64_t *job_id,
                          char *err, size_t errlen) {
    sess_caller_t c = caller_of(ctx);
    status_t code = sess_check_owner(svc->sessions, sid, &c, err, errlen);
    if (code) return code;
    return sess_use(svc->sessions, sid, job_id, err, errlen);
}

/* ---- sessions ---- */

static grpc_status_code h_open(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__OpenSessionRequest *req = (const void *)rq;
    Ballast__Offload__V1__OpenSessionResponse *resp = (void *)rs;
    sess_open_info_t info;
    char err[SESS_ERR_LEN] = "";
    sess_caller_t caller = caller_of(ctx);
    status_t code = sess_open_as(svc->sessions, &caller, req->job, req->rank, req->quota_bytes,
                                 req->token, req->shared_memory, req->client_name, &info, err,
                                 sizeof err);
    if (code) return sess_fail(ctx, code, err);
    /* the sizes of the job's segments now (informational: the attach sends
     * the job's segments with their ids and sizes, and more may follow) */
    pool_seg_info_t si[POOL_MAX_SEGS];
    int nsegs = req->shared_memory ? pool_owner_segs(store_pool(svc->store), info.job_id, si, POOL_MAX_SEGS) : 0;
    if (nsegs < 0) nsegs = 0;
    uint64_t *segs = rpc_ctx_alloc(ctx, (size_t)(nsegs ? nsegs : 1) * sizeof *segs);
    for (int i = 0; i < nsegs; i++) {
        if (segs) segs[i] = si[i].bytes;
        close(si[i].fd);
    }
    if (!segs) return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    resp->session_id = info.sid;
    resp->attach_nonce = info.nonce;
    resp->lease_seconds = sess_lease(svc->sessions);
    resp->quota_bytes = info.quota;
    resp->fd_socket = req->shared_memory ? (char *)svc->fd_socket : (char *)"";
    resp->n_segment_bytes = (size_t)nsegs;
    resp->segment_bytes = segs;
    resp->ring_capacity = info.ring_capacity;
    resp->ring_entry_bytes = RING_PROTO_ENTRY_BYTES;
    resp->ring_bytes = info.ring_bytes;
    resp->completion_ring_offset = info.cpl_offset;
    resp->protocol_version = RING_PROTO_VERSION;
    resp->job_id = info.job_id;
    resp->max_blob_bytes = info.max_blob;
    return GRPC_STATUS_OK;
}

static grpc_status_code h_close(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__CloseSessionRequest *req = (const void *)rq;
    Ballast__Offload__V1__CloseSessionResponse *resp = (void *)rs;
    char err[SESS_ERR_LEN] = "";
    sess_caller_t caller = caller_of(ctx);
    status_t code = sess_check_owner(svc->sessions, req->session_id, &caller, err, sizeof err);
    if (code) return sess_fail(ctx, code, err);
    code = sess_close(svc->sessions, req->session_id, req->keep_blobs, &resp->freed_bytes,
                               err, sizeof err);
    return code ? sess_fail(ctx, code, err) : GRPC_STATUS_OK;
}

static grpc_status_code h_heartbeat(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__HeartbeatRequest *req = (const void *)rq;
    Ballast__Offload__V1__HeartbeatResponse *resp = (void *)rs;
    char err[SESS_ERR_LEN] = "";
    sess_caller_t caller = caller_of(ctx);
    status_t code = sess_heartbeat(svc->sessions, req->session_id, &caller, &resp->lease_seconds,
                                   &resp->used_bytes, &resp->quota_bytes, err, sizeof err);
    return code ? sess_fail(ctx, code, err) : GRPC_STATUS_OK;
}

/* ---- introspection ---- */

static grpc_status_code h_stats(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__StatsRequest *req = (const void *)rq;
    Ballast__Offload__V1__StatsResponse *r = (void *)rs;
    bool admin = caller_admin(svc, ctx, req->token);
    sess_caller_t caller = caller_of(ctx);
    store_stats_t st;
    store_stats(svc->store, &st);
    sess_counters_t sc;
    sess_counters(svc->sessions, &sc);
    r->pool_bytes = st.pool.total_bytes;
    r->pool_used_bytes = st.pool.used_bytes;
    r->pool_free_bytes = st.pool.free_bytes;
    r->spill_bytes = st.spill_capacity;
    r->spilled_bytes = st.spilled_bytes;
    r->blobs = st.blobs;
    r->persistent_blobs = st.persistent_blobs;
    char *io = rpc_ctx_alloc(ctx, sizeof st.io_backend + 1);
    if (!io) return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    memcpy(io, st.io_backend, sizeof st.io_backend);
    r->io_backend = io;
    char *fb = rpc_ctx_alloc(ctx, sizeof st.io_fallback + 1);
    if (!fb) return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    memcpy(fb, st.io_fallback, sizeof st.io_fallback);
    r->io_fallback = fb;
    r->direct_io = st.direct_io;
    r->mlocked = st.pool.mlocked;
    r->segments = st.pool.nsegs;
    r->sessions_opened = sc.opened;
    r->sessions_expired = sc.expired;
    r->ring_ops = sc.ring_ops;
    r->ring_errors = sc.ring_errors;
    r->quota_refusals = sc.quota_refusals;
    r->rpc_calls = svc->server ? rpc_server_calls(svc->server) : 0;
    r->evictions = st.evictions;
    r->spill_writes = st.spill_writes;
    r->spill_reads = st.spill_reads;
    r->draining = st.draining || sess_mgr_draining(svc->sessions);
    r->uptime_seconds = clock_now_s() - svc->start_s;
    r->pid = (uint32_t)getpid();
    r->allocator = svc_allocator_stats(ctx);

    sess_row_t *rows = NULL;
    size_t n = 0;
    if (sess_list(svc->sessions, &rows, &n) != STATUS_OK)
        return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    rpc_ctx_defer_free(ctx, rows);
    Ballast__Offload__V1__SessionStats *ss = rpc_ctx_alloc(ctx, (n ? n : 1) * sizeof *ss);
    Ballast__Offload__V1__SessionStats **pp = rpc_ctx_alloc(ctx, (n ? n : 1) * sizeof *pp);
    if (!ss || !pp) return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    size_t shown = 0;
    for (size_t j = 0; j < n; j++) {
        /* others' sessions (their ids are capabilities) only for an administrator */
        if (!admin && !sess_row_owned(&rows[j], &caller)) continue;
        size_t i = shown++;
        if (i != j) rows[i] = rows[j];
        ballast__offload__v1__session_stats__init(&ss[i]);
        ss[i].session_id = rows[i].sid;
        ss[i].job = rows[i].job;
        ss[i].rank = rows[i].rank;
        ss[i].pid = rows[i].pid;
        ss[i].client_name = rows[i].client;
        ss[i].shared_memory = rows[i].shared;
        ss[i].quota_bytes = rows[i].quota;
        ss[i].used_bytes = rows[i].used;
        ss[i].ops = rows[i].ops;
        ss[i].errors = rows[i].errors;
        ss[i].idle_seconds = rows[i].detached ? -1 : rows[i].idle_s;
        ss[i].detached = rows[i].detached;
        pp[i] = &ss[i];
    }
    r->n_sessions = shown;
    r->sessions = pp;
    return GRPC_STATUS_OK;
}

static const char *tier_name(store_tier_t t) {
    return t == STORE_TIER_POOL ? "pool" : t == STORE_TIER_NVME ? "nvme" : t == STORE_TIER_BOTH ? "both" : "?";
}

static grpc_status_code h_list(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__ListKeysRequest *req = (const void *)rq;
    Ballast__Offload__V1__ListKeysResponse *resp = (void *)rs;
    store_filter_t f = { 0, -1, 0, true };
    bool known = true;
    if (req->job && req->job[0]) {
        if (!job_name_ok(req->job))
            return rpc_ctx_errf(ctx, GRPC_STATUS_INVALID_ARGUMENT,
                                "job name '%.80s' is invalid: use " JOB_NAME_RULE, req->job);
    }
    if (!caller_admin(svc, ctx, req->token)) {
        if (!req->session_id) return not_admin(ctx, "ListKeys without a session_id");
        char err[SESS_ERR_LEN] = "";
        uint64_t job_id;
        status_t code = use_owned(svc, ctx, req->session_id, &job_id, err, sizeof err);
        if (code) return sess_fail(ctx, code, err);
        uint64_t asked;
        if (req->job && req->job[0] &&
            (store_job_find(svc->store, req->job, &asked) != STATUS_OK || asked != job_id))
            return rpc_ctx_errf(ctx, GRPC_STATUS_PERMISSION_DENIED,
                                "a session lists only its own job's keys: leave job empty or name "
                                "the session's job");
        f.job_id = job_id;
    } else if (req->job && req->job[0]) {
        known = store_job_find(svc->store, req->job, &f.job_id) == STATUS_OK;
    }
    uint32_t max = req->max_keys ? req->max_keys : 10000;
    if (max > 100000)
        return rpc_ctx_errf(ctx, GRPC_STATUS_INVALID_ARGUMENT, "max_keys %u is above 100000", max);
    store_blob_info_t *list = NULL;
    size_t n = 0;
    if (known && store_list(svc->store, &f, &list, &n) != STATUS_OK)
        return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory listing blobs");
    if (list) rpc_ctx_defer_free(ctx, list);
    size_t m = n < max ? n : max;
    resp->truncated = n > m;
    Ballast__Offload__V1__BlobInfo *bi = rpc_ctx_alloc(ctx, (m ? m : 1) * sizeof *bi);
    pb_key_t *keys = rpc_ctx_alloc(ctx, (m ? m : 1) * sizeof *keys);
    Ballast__Offload__V1__BlobInfo **pp = rpc_ctx_alloc(ctx, (m ? m : 1) * sizeof *pp);
    if (!bi || !keys || !pp) return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < m; i++) {
        ballast__offload__v1__blob_info__init(&bi[i]);
        ballast__offload__v1__key__init(&keys[i]);
        keys[i].rank = list[i].key.rank;
        keys[i].kind = (Ballast__Offload__V1__Kind)list[i].key.kind;
        keys[i].index = list[i].key.index;
        keys[i].step = list[i].key.step;
        bi[i].job = list[i].job;
        bi[i].key = &keys[i];
        bi[i].length = list[i].length;
        bi[i].persistent = (list[i].flags & STORE_F_PERSISTENT) != 0;
        bi[i].tier = (char *)tier_name(list[i].tier);
        bi[i].crc32c = list[i].crc32c;
        bi[i].crc32c_known = list[i].crc_known;
        pp[i] = &bi[i];
    }
    resp->n_blobs = m;
    resp->blobs = pp;
    return GRPC_STATUS_OK;
}

/* ---- administration ---- */

static grpc_status_code h_release(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__ReleaseRequest *req = (const void *)rq;
    Ballast__Offload__V1__ReleaseResponse *resp = (void *)rs;
    if (!job_name_ok(req->job))
        return rpc_ctx_errf(ctx, GRPC_STATUS_INVALID_ARGUMENT,
                            "job name '%.80s' is invalid: use " JOB_NAME_RULE, req->job ? req->job : "");
    if (!sess_token_ok(svc->sessions, req->token))
        return rpc_ctx_errf(ctx, GRPC_STATUS_UNAUTHENTICATED,
                            "token missing or wrong: pass the contents of ballastd's --token-file");
    uint64_t job_id;
    bool admin = caller_admin(svc, ctx, req->token);
    if (store_job_find(svc->store, req->job, &job_id) != STATUS_OK) {
        if (admin) return GRPC_STATUS_OK; /* nothing held */
        return rpc_ctx_errf(ctx, GRPC_STATUS_PERMISSION_DENIED, "job '%s' is not yours to release", req->job);
    }
    /* the job's owner (its first caller) or an administrator */
    if (!admin && store_job_claim(svc->store, job_id, ctx->peer_local, ctx->peer_uid, false) != STATUS_OK)
        return rpc_ctx_errf(ctx, GRPC_STATUS_PERMISSION_DENIED,
                            "job '%s' belongs to another user: Release needs its owner, or a Unix-socket "
                            "caller running as ballastd's uid or root", req->job);
    sess_release_job(svc->sessions, job_id, &resp->freed_blobs, &resp->freed_bytes);
    return GRPC_STATUS_OK;
}

static grpc_status_code h_drain(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__DrainRequest *req = (const void *)rq;
    Ballast__Offload__V1__DrainResponse *resp = (void *)rs;
    if (!caller_admin(svc, ctx, req->token)) return not_admin(ctx, "Drain");
    sess_mgr_set_draining(svc->sessions);
    if (svc->server) rpc_server_set_health(svc->server, "", RPC_HEALTH_NOT_SERVING);
    char err[STORE_ERR_LEN] = "";
    if (store_drain(svc->store, err, sizeof err) != 0)
        return rpc_ctx_errf(ctx, GRPC_STATUS_INTERNAL, "drain: %s", err);
    store_stats_t st;
    store_stats(svc->store, &st);
    resp->persisted_blobs = st.persistent_blobs;
    if (svc->drain_flag) *svc->drain_flag = 1;
    return GRPC_STATUS_OK;
}

/* ---- remote-mode data ---- */

/* The common start of Put, Get and Free: the session must be live (its lease
 * is renewed) and the key valid; a bad key counts as a failed request of
 * that session. Fills *k from the session's job. */
static grpc_status_code session_key(rpc_ctx_t *ctx, offload_svc_t *svc, uint64_t session_id,
                                    const pb_key_t *pk, store_key_t *k) {
    char err[STORE_ERR_LEN] = "";
    uint64_t job_id;
    status_t code = use_owned(svc, ctx, session_id, &job_id, err, sizeof err);
    if (code) return sess_fail(ctx, code, err);
    grpc_status_code gc = key_from_pb(ctx, pk, job_id, k);
    if (gc) sess_count(svc->sessions, session_id, true, false);
    return gc;
}

static grpc_status_code h_put(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__PutRequest *req = (const void *)rq;
    Ballast__Offload__V1__PutResponse *resp = (void *)rs;
    char err[STORE_ERR_LEN] = "";
    store_key_t k;
    grpc_status_code gc = session_key(ctx, svc, req->session_id, req->key, &k);
    if (gc) return gc;
    uint64_t max = pool_max_alloc(store_pool(svc->store));
    if (req->data.len == 0 || req->data.len > max) {
        sess_count(svc->sessions, req->session_id, true, false);
        return rpc_ctx_errf(ctx, GRPC_STATUS_INVALID_ARGUMENT,
                            "blob length %zu must be in [1, %llu] bytes (the pool's --pool-bytes)",
                            req->data.len, (unsigned long long)max);
    }
    store_crc_t crc = { 0, false };
    status_t st = store_put_copy(svc->store, req->session_id, &k, req->data.data, req->data.len,
                                 req->persistent ? STORE_F_PERSISTENT : 0, &crc,
                                 err, sizeof err);
    resp->crc32c = crc.value;
    resp->crc32c_known = crc.known;
    sess_count(svc->sessions, req->session_id, st != STATUS_OK, st == STATUS_QUOTA_EXCEEDED || st == STATUS_JOB_QUOTA_EXCEEDED);
    if (st != STATUS_OK) return store_fail(ctx, st, "put", &k, err);
    return GRPC_STATUS_OK;
}

static grpc_status_code h_get(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__GetRequest *req = (const void *)rq;
    Ballast__Offload__V1__GetResponse *resp = (void *)rs;
    char err[STORE_ERR_LEN] = "";
    store_key_t k;
    grpc_status_code gc = session_key(ctx, svc, req->session_id, req->key, &k);
    if (gc) return gc;
    store_blob_info_t info;
    status_t st = store_info(svc->store, &k, &info);
    if (st == STATUS_OK && info.length + 64 > svc->max_msg_bytes) {
        sess_count(svc->sessions, req->session_id, true, false);
        return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED,
                            "blob of %llu bytes does not fit in a message (--max-msg-bytes %llu): "
                            "use shared-memory mode or raise the limit",
                            (unsigned long long)info.length, (unsigned long long)svc->max_msg_bytes);
    }
    void *data = NULL;
    uint64_t len = 0;
    st = store_get_copy(svc->store, req->session_id, &k, &data, &len, err, sizeof err);
    sess_count(svc->sessions, req->session_id, st != STATUS_OK, false);
    if (st != STATUS_OK) return store_fail(ctx, st, "get", &k, err);
    if (data && !rpc_ctx_defer_free(ctx, data))
        return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    resp->data.data = data;
    resp->data.len = len;
    if (store_info(svc->store, &k, &info) == STATUS_OK) {
        resp->crc32c = info.crc32c;
        resp->crc32c_known = info.crc_known;
        resp->persistent = (info.flags & STORE_F_PERSISTENT) != 0;
    }
    return GRPC_STATUS_OK;
}

static grpc_status_code h_free(rpc_ctx_t *ctx, const ProtobufCMessage *rq, ProtobufCMessage *rs) {
    offload_svc_t *svc = ctx->user;
    const Ballast__Offload__V1__FreeRequest *req = (const void *)rq;
    Ballast__Offload__V1__FreeResponse *resp = (void *)rs;
    store_key_t k;
    grpc_status_code gc = session_key(ctx, svc, req->session_id, req->key, &k);
    if (gc) return gc;
    store_blob_info_t info;
    uint64_t len = store_info(svc->store, &k, &info) == STATUS_OK ? info.length : 0;
    status_t st = store_free(svc->store, req->session_id, &k);
    sess_count(svc->sessions, req->session_id, st != STATUS_OK, false);
    if (st != STATUS_OK) return store_fail(ctx, st, "free", &k, NULL);
    resp->freed_bytes = len;
    return GRPC_STATUS_OK;
}

/* ---- table ---- */

#define M(name, fn, req, resp) \
    { OFFLOAD_SVC name, &ballast__offload__v1__##req##__descriptor, \
      &ballast__offload__v1__##resp##__descriptor, fn, NULL, false }
/* Heartbeat's handler only stamps the session: quick (common/rpc.h) */
#define M_QUICK(name, fn, req, resp) \
    { OFFLOAD_SVC name, &ballast__offload__v1__##req##__descriptor, \
      &ballast__offload__v1__##resp##__descriptor, fn, NULL, true }

static const rpc_method_t methods_tmpl[] = {
    M("OpenSession", h_open, open_session_request, open_session_response),
    M("CloseSession", h_close, close_session_request, close_session_response),
    M_QUICK("Heartbeat", h_heartbeat, heartbeat_request, heartbeat_response),
    M("Stats", h_stats, stats_request, stats_response),
    M("ListKeys", h_list, list_keys_request, list_keys_response),
    M("Release", h_release, release_request, release_response),
    M("Drain", h_drain, drain_request, drain_response),
    M("Put", h_put, put_request, put_response),
    M("Get", h_get, get_request, get_response),
    M("Free", h_free, free_request, free_response),
};
#define NMETHODS (sizeof methods_tmpl / sizeof methods_tmpl[0])

const rpc_method_t *offload_svc_methods(offload_svc_t *svc, size_t *n) {
    static __thread rpc_method_t tab[NMETHODS];
    for (size_t i = 0; i < NMETHODS; i++) {
        tab[i] = methods_tmpl[i];
        tab[i].user = svc;
    }
    *n = NMETHODS;
    return tab;
}

int offload_svc_register(rpc_server_t *s, offload_svc_t *svc, char *err, size_t errlen) {
    if (svc->start_s == 0) svc->start_s = clock_now_s();
    size_t n;
    const rpc_method_t *tab = offload_svc_methods(svc, &n);
    return rpc_server_add_methods(s, tab, n, err, errlen);
}
