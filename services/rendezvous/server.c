/* server.c: the rendezvous service over common/rpc: Set, Get, Wait and
 * Barrier handlers on top of store.c, plus rdzv_server_start/stop (linked
 * into rank 0 of a job, and into ballast-rdzv). */
#include "services/rendezvous/rdzv.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "rendezvous.pb-c.h"
#include "services/rendezvous/store.h"

struct rdzv_server {
    rpc_server_t *rpc;
    rdzv_store_t *store;
    char job_id[128];         /* "" = any */
    uint32_t world;           /* 0 = any */
    _Atomic uint64_t sets, gets, waits, barriers;
};

/* ---- helpers ---- */

static grpc_status_code status_of(int rc) {
    switch (rc) {
    case 0: return GRPC_STATUS_OK;
    case -EEXIST: return GRPC_STATUS_ALREADY_EXISTS;
    case -ENOENT: return GRPC_STATUS_NOT_FOUND;
    case -EMSGSIZE: return GRPC_STATUS_INVALID_ARGUMENT; /* one request over a size limit */
    case -E2BIG:
    case -ENOSPC:
    case -ENOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case -ETIMEDOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case -ESHUTDOWN: return GRPC_STATUS_UNAVAILABLE;
    default: return GRPC_STATUS_INVALID_ARGUMENT;
    }
}

/* The job check every call goes through. */
static grpc_status_code check_job(rpc_ctx_t *ctx, const rdzv_server_t *s,
                                  const Ballast__Rdzv__V1__JobRef *job) {
    const char *id = job && job->job_id ? job->job_id : "";
    uint32_t world = job ? job->world : 0;
    if (s->job_id[0] && strcmp(id, s->job_id) != 0)
        return rpc_ctx_errf(ctx, GRPC_STATUS_FAILED_PRECONDITION,
                            "this rendezvous serves job \"%s\" but the call is for job \"%.64s\": "
                            "check --job-id / the rendezvous address", s->job_id, id);
    if (s->world && world && world != s->world)
        return rpc_ctx_errf(ctx, GRPC_STATUS_FAILED_PRECONDITION,
                            "this rendezvous serves a world of %u ranks but the caller expects %u: "
                            "check --world on both sides", s->world, world);
    return GRPC_STATUS_OK;
}

/* How long a Wait/Barrier call may be held: the slice, less than the
 * caller's timeout and its gRPC deadline. */
static int hold_ms(rpc_ctx_t *ctx, uint32_t timeout_ms) {
    int64_t ms = RDZV_POLL_SLICE_MS;
    if (timeout_ms && timeout_ms < ms) ms = timeout_ms;
    int64_t left = rpc_ctx_time_left_ms(ctx) - 50;
    if (left < ms) ms = left;
    return ms > 0 ? (int)ms : 0;
}

/* ---- handlers ---- */

static grpc_status_code h_set(rpc_ctx_t *ctx, const ProtobufCMessage *reqm, ProtobufCMessage *respm) {
    rdzv_server_t *s = ctx->user;
    const Ballast__Rdzv__V1__SetRequest *req = (const void *)reqm;
    Ballast__Rdzv__V1__SetResponse *resp = (void *)respm;
    atomic_fetch_add(&s->sets, 1);
    grpc_status_code st = check_job(ctx, s, req->job);
    if (st) return st;
    char err[RPC_ERR_LEN];
    int rc = rdzv_store_set(s->store, req->key, req->value.data, req->value.len, req->overwrite,
                            &resp->version, err, sizeof err);
    return rc ? rpc_ctx_errf(ctx, status_of(rc), "%s", err) : GRPC_STATUS_OK;
}

static grpc_status_code get_common(rpc_ctx_t *ctx, const char *key, int max_ms, ProtobufCBinaryData *value,
                                   uint64_t *version, bool *found) {
    rdzv_server_t *s = ctx->user;
    char err[RPC_ERR_LEN];
    void *val;
    size_t len;
    int rc = rdzv_store_get(s->store, key, max_ms, &val, &len, version, err, sizeof err);
    *found = rc == 0;
    if (rc == -ENOENT) return GRPC_STATUS_OK;
    if (rc) return rpc_ctx_errf(ctx, status_of(rc), "%s", err);
    if (!rpc_ctx_defer_free(ctx, val))
        return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    value->data = val;
    value->len = len;
    return GRPC_STATUS_OK;
}

static grpc_status_code h_get(rpc_ctx_t *ctx, const ProtobufCMessage *reqm, ProtobufCMessage *respm) {
    rdzv_server_t *s = ctx->user;
    const Ballast__Rdzv__V1__GetRequest *req = (const void *)reqm;
    Ballast__Rdzv__V1__GetResponse *resp = (void *)respm;
    atomic_fetch_add(&s->gets, 1);
    grpc_status_code st = check_job(ctx, s, req->job);
    if (st) return st;
    bool found;
    st = get_common(ctx, req->key, 0, &resp->value, &resp->version, &found);
    resp->found = found;
    return st;
}

static grpc_status_code h_wait(rpc_ctx_t *ctx, const ProtobufCMessage *reqm, ProtobufCMessage *respm) {
    rdzv_server_t *s = ctx->user;
    const Ballast__Rdzv__V1__WaitRequest *req = (const void *)reqm;
    Ballast__Rdzv__V1__WaitResponse *resp = (void *)respm;
    atomic_fetch_add(&s->waits, 1);
    grpc_status_code st = check_job(ctx, s, req->job);
    if (st) return st;
    bool found;
    st = get_common(ctx, req->key, hold_ms(ctx, req->timeout_ms), &resp->value, &resp->version, &found);
    resp->ready = found;
    return st;
}

static grpc_status_code h_barrier(rpc_ctx_t *ctx, const ProtobufCMessage *reqm, ProtobufCMessage *respm) {
    rdzv_server_t *s = ctx->user;
    const Ballast__Rdzv__V1__BarrierRequest *req = (const void *)reqm;
    Ballast__Rdzv__V1__BarrierResponse *resp = (void *)respm;
    atomic_fetch_add(&s->barriers, 1);
    grpc_status_code st = check_job(ctx, s, req->job);
    if (st) return st;
    if (s->world && req->world != s->world)
        return rpc_ctx_errf(ctx, GRPC_STATUS_INVALID_ARGUMENT, "barrier %.64s: world %u, but this "
                            "rendezvous serves %u ranks", req->name, req->world, s->world);
    char err[RPC_ERR_LEN];
    rdzv_barrier_state_t bs;
    uint32_t timeout = req->timeout_ms ? req->timeout_ms : 300000;
    /* an arrival answers at once so the client learns its round even if it
     * then has to wait */
    int max_ms = req->round ? hold_ms(ctx, 0) : 0;
    int rc = rdzv_store_barrier(s->store, req->name, req->rank, req->world, timeout, req->round,
                                max_ms, &bs, err, sizeof err);
    if (rc) return rpc_ctx_errf(ctx, status_of(rc), "%s", err);
    resp->generation = bs.generation;
    resp->round = bs.round;
    resp->done = bs.done;
    if (bs.missing) {
        if (!rpc_ctx_defer_free(ctx, bs.missing))
            return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        resp->missing = bs.missing;
        resp->n_missing = bs.n_missing;
    }
    return GRPC_STATUS_OK;
}

#define RDZV_SVC "/ballast.rdzv.v1.Rendezvous/"

/* ---- start / stop ---- */

rdzv_server_t *rdzv_server_start(const rdzv_server_opts_t *o, int *bound_port, char *err, size_t errlen) {
    if (!o || !o->listen || !o->listen[0]) {
        snprintf(err, errlen, "rendezvous server: no listen address (e.g. 127.0.0.1:29500 or unix:/tmp/rdzv.sock)");
        return NULL;
    }
    if (o->job_id && strlen(o->job_id) >= 128) {
        snprintf(err, errlen, "rendezvous server: job id longer than 127 bytes");
        return NULL;
    }
    if (o->world < 0) {
        snprintf(err, errlen, "rendezvous server: world %d is negative", o->world);
        return NULL;
    }
    rdzv_server_t *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "rendezvous server: out of memory");
        return NULL;
    }
    snprintf(s->job_id, sizeof s->job_id, "%s", o->job_id ? o->job_id : "");
    s->world = (uint32_t)o->world;
    int threads = o->threads > 0 ? o->threads : 4;
    size_t max_value = o->max_value_bytes ? o->max_value_bytes : RDZV_DEFAULT_MAX_VALUE;
    s->store = rdzv_store_new(o->max_keys ? o->max_keys : 65536, max_value, threads - 1);
    rpc_server_opts_t ro = { .threads = threads, .max_msg_bytes = max_value + 64 * 1024 };
    /* A barrier reply lists the missing ranks, at most 5 bytes each as
     * varints: the world is bounded so that the list fits the message limit
     * with room for the rest of the reply. */
    if (s->store)
        rdzv_store_limits(s->store, (uint32_t)((ro.max_msg_bytes - 4096) / 5),
                          o->max_bytes ? o->max_bytes : RDZV_DEFAULT_MAX_BYTES);
    if (!s->store || !(s->rpc = rpc_server_new(&ro, err, errlen))) {
        if (!s->store) snprintf(err, errlen, "rendezvous server: out of memory");
        goto fail;
    }
    const rpc_method_t methods[] = {
        { RDZV_SVC "Set", &ballast__rdzv__v1__set_request__descriptor,
          &ballast__rdzv__v1__set_response__descriptor, h_set, s },
        { RDZV_SVC "Get", &ballast__rdzv__v1__get_request__descriptor,
          &ballast__rdzv__v1__get_response__descriptor, h_get, s },
        { RDZV_SVC "Wait", &ballast__rdzv__v1__wait_request__descriptor,
          &ballast__rdzv__v1__wait_response__descriptor, h_wait, s },
        { RDZV_SVC "Barrier", &ballast__rdzv__v1__barrier_request__descriptor,
          &ballast__rdzv__v1__barrier_response__descriptor, h_barrier, s },
    };
    if (rpc_server_add_methods(s->rpc, methods, 4, err, errlen)) goto fail;
    if (rpc_server_listen(s->rpc, o->listen, bound_port, err, errlen)) goto fail;
    if (rpc_server_start(s->rpc, err, errlen)) goto fail;
    return s;
fail:
    rpc_server_free(s->rpc);
    rdzv_store_free(s->store);
    free(s);
    return NULL;
}

void rdzv_server_stop(rdzv_server_t *s) {
    if (!s) return;
    rdzv_store_quiesce(s->store, 5000);
    rdzv_store_shutdown(s->store);
    rpc_server_stop(s->rpc, 1000);
    rpc_server_free(s->rpc);
    rdzv_store_free(s->store);
    free(s);
}

void rdzv_server_stats(rdzv_server_t *s, rdzv_stats_t *out) {
    rdzv_store_stats_t st;
    rdzv_store_stats(s->store, &st);
    out->keys = st.keys;
    out->barriers_done = st.barriers_done;
    out->barriers_failed = st.barriers_failed;
    out->sets = atomic_load(&s->sets);
    out->gets = atomic_load(&s->gets);
    out->waits = atomic_load(&s->waits);
    out->barriers = atomic_load(&s->barriers);
}
