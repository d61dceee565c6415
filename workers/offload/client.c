/* client.c: the ballastd client library. See client.h.
 *
 * Shared-memory mode: requests go into the session's request ring and one
 * completion per request comes back on the completion ring, in order. A
 * table of in-flight slots (at most the ring capacity, so neither ring can
 * overflow) maps req_id -> completion: req_id = (sequence << 16) | slot.
 * One waiting thread at a time pops the completion ring (the "reaper" role)
 * and files what it pops into the table; others sleep on a condition
 * variable. Pushes are serialised by their own mutex.
 *
 * Remote mode: each request is one gRPC call, made when it is submitted;
 * async handles then just hold the finished result. */
#include "workers/offload/client.h"
#include "clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "offload.pb-c.h"
#include "ring.h"
#include "rpc.h"
#include "shm.h"
#include "proto/offload_ring.h"

#define SVC "/ballast.offload.v1.Offload/"
#define MAX_SLOTS 4096u
#define MAX_SEGS 1024u   /* segments of one job mapped at once (ballastd's POOL_MAX_SEGS) */

typedef Ballast__Offload__V1__Key pb_key_t;

enum { SLOT_FREE = 0, SLOT_PENDING, SLOT_DONE, SLOT_ABANDONED /* waiter gave up: free on arrival */ };

typedef struct {
    uint64_t req_id;     /* current id of this slot */
    int state;           /* SLOT_* */
    rp_cpl_t cpl;        /* when DONE */
    void *priv;          /* remote GET: unpacked response */
    char *msg;           /* remote mode, a failed op: its message (malloc()ed), handed to
                            whichever thread waits for the handle */
} slot_t;

struct oc_client {
    char addr[256];                  /* as given, for messages */
    char rpc_addr[264];              /* "unix:/path" or "host:port" */
    bool shared;
    rpc_client_t *rpc;
    uint64_t sid, job_id, quota, max_blob;
    double lease_s, timeout_s;
    /* shared memory: the job's segments mapped so far (MAX_SEGS entries
     * allocated at attach; entries are only appended, under seg_mu) */
    pthread_mutex_t seg_mu;
    uint32_t nsegs;
    shm_seg_t *segs;
    uint32_t *seg_id;                /* (nsegs) ballastd's id of each */
    oc_segment_t *segview;           /* (nsegs) base and bytes of segs, for oc_segments */
    oc_segment_hook_t seg_hook;
    void *seg_hook_arg;
    char fd_socket[108];             /* for fetching later segments */
    uint64_t nonce;
    shm_seg_t ringseg;
    ring_t req, cpl;
    int efd[RP_FD_COUNT];
    /* slots */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t push_mu;
    slot_t *slots;
    uint32_t nslots;
    uint32_t *free_stack;
    uint32_t nfree;
    uint64_t seq;
    bool reaping;
    /* heartbeat */
    pthread_t hb;
    bool hb_started;
    bool hb_stop;
    pthread_cond_t hb_cv;
    _Atomic int broken;              /* nonzero: a status_t explaining why */
    char broken_msg[1024];
};

/* ---- errors ---- */

static __thread char g_err[1024];

const char *oc_last_error(void) { return g_err; }

static status_t fail(status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static status_t fail(status_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return st;
}

static const char *HINT = "is ballastd running? start it with `ballastd --socket PATH` "
                          "(or `ballast train`, which starts one), or pass the right address";
static const char *FULL_HINT = "ballastd is out of pool memory (or this session's quota): free blobs the job no "
                               "longer needs, or restart ballastd with a larger --pool-bytes, a --spill-dir (NVMe "
                               "tier) or a larger --session-quota";

/* Message for a failed RPC; adds the start hint when the service is unreachable. */
static status_t rpc_fail(oc_client_t *c, grpc_status_code code, const char *what, const char *msg) {
    status_t st = status_from_grpc(code);
    if (st == STATUS_UNAVAILABLE || st == STATUS_DEADLINE_EXCEEDED)
        return fail(st, "ballastd at %s: %s failed: %s; %s", c->addr, what, msg, HINT);
    if (st == STATUS_RESOURCE_EXHAUSTED)
        return fail(st, "ballastd at %s: %s: %s; %s", c->addr, what, msg, FULL_HINT);
    return fail(st, "ballastd at %s: %s: %s", c->addr, what, msg);
}

/* ---- rpc helpers ---- */

static grpc_status_code call_path(oc_client_t *c, const char *path, const void *req,
                                  const ProtobufCMessageDescriptor *rd, void **resp, char *msg, size_t ml) {
    return rpc_call(c->rpc, path, (const ProtobufCMessage *)req, rd, (ProtobufCMessage **)resp,
                    (int64_t)(c->timeout_s * 1000), false, msg, ml);
}
/* method is a string literal: its path is put together by the compiler */
#define CALL(c, method, ...) call_path(c, SVC method, __VA_ARGS__)

static void set_pb_key(pb_key_t *pk, const oc_key_t *k) {
    ballast__offload__v1__key__init(pk);
    pk->rank = k->rank;
    pk->kind = (Ballast__Offload__V1__Kind)k->kind;
    pk->index = k->index;
    pk->step = k->step;
}

/* ---- heartbeat ---- */

/* One Heartbeat RPC: the lease thread and oc_heartbeat share it. */
static grpc_status_code heartbeat_call(oc_client_t *c, char *msg, size_t ml) {
    Ballast__Offload__V1__HeartbeatRequest req = BALLAST__OFFLOAD__V1__HEARTBEAT_REQUEST__INIT;
    req.session_id = c->sid;
    void *resp = NULL;
    grpc_status_code st = CALL(c, "Heartbeat", &req, &ballast__offload__v1__heartbeat_response__descriptor,
                               &resp, msg, ml);
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    return st;
}

static void *hb_main(void *arg) {
    oc_client_t *c = arg;
    double period = c->lease_s / 3;
    if (period > 10) period = 10;
    if (period < 0.01) period = 0.01;
    pthread_mutex_lock(&c->mu);
    while (!c->hb_stop) {
        struct timespec ts = clock_after(period);
        pthread_cond_timedwait(&c->hb_cv, &c->mu, &ts);
        if (c->hb_stop) break;
        pthread_mutex_unlock(&c->mu);
        char msg[256];
        grpc_status_code st = heartbeat_call(c, msg, sizeof msg);
        pthread_mutex_lock(&c->mu);
        if (st == GRPC_STATUS_NOT_FOUND && !atomic_load(&c->broken)) {
            snprintf(c->broken_msg, sizeof c->broken_msg,
                     "ballastd at %s: session expired or was closed (lease %.3gs); its non-persistent "
                     "blobs are gone: open a new session", c->addr, c->lease_s);
            atomic_store(&c->broken, STATUS_FAILED_PRECONDITION);
            pthread_cond_broadcast(&c->cv);
        } else if (st == GRPC_STATUS_UNAVAILABLE && !atomic_load(&c->broken)) {
            snprintf(c->broken_msg, sizeof c->broken_msg, "ballastd at %s is gone (%s); %s", c->addr, msg, HINT);
            atomic_store(&c->broken, STATUS_UNAVAILABLE);
            pthread_cond_broadcast(&c->cv);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

status_t oc_heartbeat(oc_client_t *c) {
    char msg[256];
    grpc_status_code st = heartbeat_call(c, msg, sizeof msg);
    return st ? rpc_fail(c, st, "Heartbeat", msg) : STATUS_OK;
}

/* ---- attaching (shared memory) ---- */

static status_t attach(oc_client_t *c, const Ballast__Offload__V1__OpenSessionResponse *r) {
    char err[SHM_ERR_LEN];
    if (r->protocol_version != RING_PROTO_VERSION || r->ring_entry_bytes != RING_PROTO_ENTRY_BYTES)
        return fail(STATUS_FAILED_PRECONDITION, "ballastd at %s speaks ring protocol %u with %u-byte entries; "
                    "this client speaks %u with %u: use matching versions", c->addr, r->protocol_version,
                    r->ring_entry_bytes, RING_PROTO_VERSION, RING_PROTO_ENTRY_BYTES);
    if (r->n_segment_bytes > MAX_SEGS || r->ring_capacity < 2 || r->ring_capacity > RING_PROTO_MAX_CAPACITY ||
        strlen(r->fd_socket) >= sizeof c->fd_socket)
        return fail(STATUS_INTERNAL, "ballastd at %s sent an implausible session layout", c->addr);
    snprintf(c->fd_socket, sizeof c->fd_socket, "%s", r->fd_socket);
    c->nonce = r->attach_nonce;
    int fd = -1;
    int rc = shm_connect(r->fd_socket, &fd, err, sizeof err);
    if (rc) return fail(STATUS_UNAVAILABLE, "ballastd at %s: fd socket %s: %s; %s", c->addr, r->fd_socket, err, HINT);
    rp_attach_t att = { RP_ATTACH_MAGIC, r->session_id, r->attach_nonce, RING_PROTO_VERSION, 0 };
    status_t st = STATUS_OK;
    rc = shm_send_fds(fd, &att, sizeof att, NULL, 0, err, sizeof err);
    if (rc) { st = fail(STATUS_UNAVAILABLE, "ballastd at %s: fd socket %s: %s", c->addr, r->fd_socket, err); goto out; }
    rp_attach_reply_t rep;
    size_t len = 0;
    int tmo = (int)(c->timeout_s * 1000);
    rc = shm_recv_fds(fd, &rep, sizeof rep, &len, NULL, 0, tmo, err, sizeof err);
    if (rc || len != sizeof rep) {
        st = fail(STATUS_UNAVAILABLE, "ballastd at %s: fd socket %s: no attach reply: %s", c->addr, r->fd_socket,
                  rc ? err : "short message");
        goto out;
    }
    rep.msg[sizeof rep.msg - 1] = 0;
    if (rep.status != STATUS_OK) {
        st = fail(status_from_grpc(rep.status), "ballastd at %s refused to attach the session: %s", c->addr, rep.msg);
        goto out;
    }
    if (rep.nsegs > MAX_SEGS) {
        st = fail(STATUS_INTERNAL, "ballastd at %s announced %u segments, at most %u expected", c->addr, rep.nsegs,
                  MAX_SEGS);
        goto out;
    }
    c->segs = calloc(MAX_SEGS, sizeof *c->segs);
    c->seg_id = calloc(MAX_SEGS, sizeof *c->seg_id);
    c->segview = calloc(MAX_SEGS, sizeof *c->segview);
    if (!c->segs || !c->seg_id || !c->segview) { st = fail(STATUS_RESOURCE_EXHAUSTED, "out of memory"); goto out; }
    for (uint32_t i = 0; i < MAX_SEGS; i++) c->segs[i].fd = -1;
    for (uint32_t got = 0; got < rep.nsegs;) {
        rp_fd_chunk_t ch;
        int fds[RP_CHUNK_FDS];
        uint32_t want = rep.nsegs - got < RP_CHUNK_FDS ? rep.nsegs - got : RP_CHUNK_FDS;
        rc = shm_recv_fds(fd, &ch, sizeof ch, &len, fds, (int)want, tmo, err, sizeof err);
        if (rc || len != sizeof ch || ch.count != want || ch.ring) {
            st = fail(STATUS_INTERNAL, "ballastd at %s: receiving pool fds: %s", c->addr, rc ? err : "bad chunk");
            if (!rc) for (uint32_t i = 0; i < want; i++) close(fds[i]);
            goto out;
        }
        for (uint32_t i = 0; i < want; i++) {
            rc = shm_map_fd(&c->segs[c->nsegs], fds[i], ch.bytes[i], err, sizeof err);
            if (rc) {
                for (uint32_t j = i + 1; j < want; j++) close(fds[j]);
                st = fail(STATUS_INTERNAL, "ballastd at %s: mapping pool segment %u: %s", c->addr, ch.seg[i], err);
                goto out;
            }
            c->seg_id[c->nsegs] = ch.seg[i];
            c->segview[c->nsegs] = (oc_segment_t){ c->segs[c->nsegs].base, c->segs[c->nsegs].bytes };
            c->nsegs++;
        }
        got += want;
    }
    rp_fd_chunk_t ch;
    int rfds[RP_FD_COUNT];
    rc = shm_recv_fds(fd, &ch, sizeof ch, &len, rfds, RP_FD_COUNT, tmo, err, sizeof err);
    if (rc || len != sizeof ch || !ch.ring || ch.count != RP_FD_COUNT) {
        st = fail(STATUS_INTERNAL, "ballastd at %s: receiving ring fds: %s", c->addr, rc ? err : "bad chunk");
        if (!rc) for (int i = 0; i < RP_FD_COUNT; i++) close(rfds[i]);
        goto out;
    }
    for (int i = 1; i < RP_FD_COUNT; i++) c->efd[i] = rfds[i];
    rc = shm_map_fd(&c->ringseg, rfds[RP_FD_RING], r->ring_bytes, err, sizeof err);
    if (rc) { st = fail(STATUS_INTERNAL, "ballastd at %s: mapping the ring: %s", c->addr, err); goto out; }
    uint64_t off = r->completion_ring_offset;
    if (off >= r->ring_bytes || off % 64) { st = fail(STATUS_INTERNAL, "bad completion ring offset"); goto out; }
    uint8_t *base = c->ringseg.base;
    if (ring_attach(&c->req, base, off, RING_PROTO_ENTRY_BYTES, err, sizeof err) ||
        ring_attach(&c->cpl, base + off, r->ring_bytes - off, RING_PROTO_ENTRY_BYTES, err, sizeof err)) {
        st = fail(STATUS_INTERNAL, "ballastd at %s: ring: %s", c->addr, err);
        goto out;
    }
    ring_set_doorbells(&c->req, c->efd[RP_FD_REQ_DATA], c->efd[RP_FD_REQ_SPACE]);
    ring_set_doorbells(&c->cpl, c->efd[RP_FD_CPL_DATA], c->efd[RP_FD_CPL_SPACE]);
out:
    close(fd);
    return st;
}

/* ---- open / close ---- */

static void client_free(oc_client_t *c) {
    if (!c) return;
    if (c->hb_started) {
        pthread_mutex_lock(&c->mu);
        c->hb_stop = true;
        pthread_cond_broadcast(&c->hb_cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->hb, NULL);
    }
    for (uint32_t i = 0; i < c->nsegs && c->segs; i++) shm_destroy(&c->segs[i]);
    free(c->segs);
    free(c->seg_id);
    free(c->segview);
    pthread_mutex_destroy(&c->seg_mu);
    shm_destroy(&c->ringseg);
    for (int i = 1; i < RP_FD_COUNT; i++) if (c->efd[i] >= 0) close(c->efd[i]);
    if (c->slots) {
        for (uint32_t i = 0; i < c->nslots; i++) {
            if (c->slots[i].priv) protobuf_c_message_free_unpacked(c->slots[i].priv, NULL);
            free(c->slots[i].msg);
        }
    }
    free(c->slots);
    free(c->free_stack);
    if (c->rpc) rpc_client_close(c->rpc);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->push_mu);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->hb_cv);
    free(c);
}

static int read_token_file(const char *path, char *tok, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -errno;
    if (!fgets(tok, (int)cap, f)) tok[0] = 0;
    fclose(f);
    size_t n = strlen(tok);
    while (n && (tok[n - 1] == '\n' || tok[n - 1] == '\r' || tok[n - 1] == ' ' || tok[n - 1] == '\t')) tok[--n] = 0;
    return 0;
}

status_t oc_open(const oc_options_t *o, oc_client_t **out) {
    *out = NULL;
    if (!o || !o->addr || !o->addr[0]) return fail(STATUS_INVALID_ARGUMENT, "no ballastd address given (e.g. unix:/run/ballast/ballastd.sock or host:port)");
    if (!job_name_ok(o->job))
        return fail(STATUS_INVALID_ARGUMENT, "job name '%.80s' is invalid: use " JOB_NAME_RULE, o->job ? o->job : "");
    if (strlen(o->addr) >= 250) return fail(STATUS_INVALID_ARGUMENT, "address too long");
    oc_client_t *c = calloc(1, sizeof *c);
    if (!c) return fail(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->push_mu, NULL);
    pthread_mutex_init(&c->seg_mu, NULL);
    clock_cond_init(&c->cv);
    clock_cond_init(&c->hb_cv);
    c->ringseg.fd = -1;
    for (int i = 0; i < RP_FD_COUNT; i++) c->efd[i] = -1;
    snprintf(c->addr, sizeof c->addr, "%s", o->addr);
    /* a bare path (no "unix:", no ':' at all) is a Unix socket; a relative
     * one is taken from the current directory */
    bool bare_path = o->addr[0] == '/' || (!strchr(o->addr, ':') && strchr(o->addr, '/'));
    bool is_unix = strncmp(o->addr, "unix:", 5) == 0 || bare_path;
    if (bare_path && o->addr[0] != '/') {
        char cwd[4096];
        if (!getcwd(cwd, sizeof cwd) || strlen(cwd) + strlen(o->addr) + 7 >= sizeof c->rpc_addr) {
            client_free(c);
            return fail(STATUS_INVALID_ARGUMENT, "socket path %s: give it as an absolute path (the current directory "
                        "is too long or unknown)", o->addr);
        }
        size_t nc = strlen(cwd), na = strlen(o->addr); /* fits: checked above */
        memcpy(c->rpc_addr, "unix:", 5);
        memcpy(c->rpc_addr + 5, cwd, nc);
        c->rpc_addr[5 + nc] = '/';
        memcpy(c->rpc_addr + 6 + nc, o->addr, na + 1);
    } else if (bare_path) {
        snprintf(c->rpc_addr, sizeof c->rpc_addr, "unix:%s", o->addr);
    } else {
        snprintf(c->rpc_addr, sizeof c->rpc_addr, "%s", o->addr);
    }
    c->shared = is_unix && !(o->flags & OC_REMOTE);
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : 30;

    char token[300] = "";
    if (o->token) snprintf(token, sizeof token, "%s", o->token);
    else if (o->token_file && o->token_file[0]) {
        int rc = read_token_file(o->token_file, token, sizeof token);
        if (rc) { client_free(c); return fail(STATUS_INVALID_ARGUMENT, "token file %s: %s", o->token_file, strerror(-rc)); }
    }

    char err[RPC_ERR_LEN];
    rpc_client_opts_t ro = { 0 };
    ro.tls_ca = o->tls_ca ? o->tls_ca : getenv("BALLAST_TLS_CA");
    ro.tls_cert = o->tls_cert ? o->tls_cert : getenv("BALLAST_TLS_CERT");
    ro.tls_key = o->tls_key ? o->tls_key : getenv("BALLAST_TLS_KEY");
    if (ro.tls_ca && !ro.tls_ca[0]) ro.tls_ca = NULL;
    if (ro.tls_cert && !ro.tls_cert[0]) ro.tls_cert = NULL;
    if (ro.tls_key && !ro.tls_key[0]) ro.tls_key = NULL;
    c->rpc = rpc_client_open(c->rpc_addr, &ro, err, sizeof err);
    if (!c->rpc) { client_free(c); return fail(STATUS_INVALID_ARGUMENT, "ballastd address %s: %s", o->addr, err); }
    const char *ait = getenv("BALLAST_ALLOW_INSECURE_TOKEN");
    if (token[0] && !rpc_client_private(c->rpc) && !o->allow_insecure_token && !(ait && strcmp(ait, "1") == 0)) {
        client_free(c);
        return fail(STATUS_INVALID_ARGUMENT, "refusing to send the token to %s over plaintext TCP: set "
                    "BALLAST_TLS_CA to the CA of ballastd's --tls-cert, or BALLAST_ALLOW_INSECURE_TOKEN=1 on a "
                    "trusted network", o->addr);
    }

    Ballast__Offload__V1__OpenSessionRequest req = BALLAST__OFFLOAD__V1__OPEN_SESSION_REQUEST__INIT;
    req.job = (char *)o->job;
    req.rank = o->rank;
    req.quota_bytes = o->quota_bytes;
    req.token = token;
    req.shared_memory = c->shared;
    char cname[64];
    snprintf(cname, sizeof cname, "%s", o->client_name ? o->client_name : program_invocation_short_name);
    req.client_name = cname;
    Ballast__Offload__V1__OpenSessionResponse *r = NULL;
    char msg[512];
    grpc_status_code gs = CALL(c, "OpenSession", &req, &ballast__offload__v1__open_session_response__descriptor,
                               (void **)&r, msg, sizeof msg);
    if (gs) { status_t st = rpc_fail(c, gs, "OpenSession", msg); client_free(c); return st; }
    c->sid = r->session_id;
    c->job_id = r->job_id;
    c->quota = r->quota_bytes;
    c->lease_s = r->lease_seconds > 0 ? r->lease_seconds : 30;
    c->max_blob = r->max_blob_bytes;
    c->nslots = c->shared ? r->ring_capacity : 256;
    if (c->nslots > MAX_SLOTS) c->nslots = MAX_SLOTS;
    c->slots = calloc(c->nslots, sizeof *c->slots);
    c->free_stack = calloc(c->nslots, sizeof *c->free_stack);
    status_t st = STATUS_OK;
    if (!c->slots || !c->free_stack) st = fail(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    for (uint32_t i = 0; i < c->nslots && st == STATUS_OK; i++) c->free_stack[c->nfree++] = c->nslots - 1 - i;
    if (st == STATUS_OK && c->shared) st = attach(c, r);
    protobuf_c_message_free_unpacked((ProtobufCMessage *)r, NULL);
    if (st == STATUS_OK) {
        if (pthread_create(&c->hb, NULL, hb_main, c) == 0) c->hb_started = true;
        else st = fail(STATUS_RESOURCE_EXHAUSTED, "cannot start the heartbeat thread");
    }
    if (st != STATUS_OK) {
        char keep[sizeof g_err];
        snprintf(keep, sizeof keep, "%s", g_err);
        Ballast__Offload__V1__CloseSessionRequest cr = BALLAST__OFFLOAD__V1__CLOSE_SESSION_REQUEST__INIT;
        cr.session_id = c->sid;
        void *resp = NULL;
        if (CALL(c, "CloseSession", &cr, &ballast__offload__v1__close_session_response__descriptor, &resp, msg,
                 sizeof msg) == 0 && resp)
            protobuf_c_message_free_unpacked(resp, NULL);
        client_free(c);
        snprintf(g_err, sizeof g_err, "%s", keep);
        return st;
    }
    *out = c;
    return STATUS_OK;
}

status_t oc_close(oc_client_t *c, bool keep_blobs) {
    if (!c) return STATUS_OK;
    Ballast__Offload__V1__CloseSessionRequest cr = BALLAST__OFFLOAD__V1__CLOSE_SESSION_REQUEST__INIT;
    cr.session_id = c->sid;
    cr.keep_blobs = keep_blobs;
    void *resp = NULL;
    char msg[256];
    /* stop heartbeats first so a NOT_FOUND from them cannot race the close */
    if (c->hb_started) {
        pthread_mutex_lock(&c->mu);
        c->hb_stop = true;
        pthread_cond_broadcast(&c->hb_cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->hb, NULL);
        c->hb_started = false;
    }
    grpc_status_code gs = CALL(c, "CloseSession", &cr, &ballast__offload__v1__close_session_response__descriptor,
                               &resp, msg, sizeof msg);
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    status_t st = gs ? rpc_fail(c, gs, "CloseSession", msg) : STATUS_OK;
    client_free(c);
    return st;
}

void oc_abandon(oc_client_t *c) { client_free(c); }

bool oc_is_shared(const oc_client_t *c) { return c->shared; }
uint64_t oc_session_id(const oc_client_t *c) { return c->sid; }
uint64_t oc_quota(const oc_client_t *c) { return c->quota; }
uint64_t oc_max_blob(const oc_client_t *c) { return c->max_blob; }
const char *oc_addr(const oc_client_t *c) { return c->addr; }

const oc_segment_t *oc_segments(const oc_client_t *c, uint32_t *n) {
    pthread_mutex_lock((pthread_mutex_t *)&c->seg_mu);
    *n = c->shared && c->segview ? c->nsegs : 0;
    pthread_mutex_unlock((pthread_mutex_t *)&c->seg_mu);
    return *n ? c->segview : NULL;
}

void oc_set_segment_hook(oc_client_t *c, oc_segment_hook_t fn, void *arg) {
    pthread_mutex_lock(&c->seg_mu);
    c->seg_hook = fn;
    c->seg_hook_arg = arg;
    for (uint32_t i = 0; fn && i < c->nsegs; i++) fn(arg, &c->segview[i]);
    pthread_mutex_unlock(&c->seg_mu);
}

/* Fetch segment id over the fd socket and map it as entry c->nsegs. With
 * seg_mu held. */
static status_t fetch_segment(oc_client_t *c, uint32_t id) {
    if (c->nsegs >= MAX_SEGS)
        return fail(STATUS_RESOURCE_EXHAUSTED, "ballastd at %s: the job has more than %u segments mapped", c->addr, MAX_SEGS);
    char err[SHM_ERR_LEN];
    int fd = -1;
    if (shm_connect(c->fd_socket, &fd, err, sizeof err))
        return fail(STATUS_UNAVAILABLE, "ballastd at %s: fd socket %s: %s; %s", c->addr, c->fd_socket, err, HINT);
    rp_segment_req_t q = { RP_SEGMENT_MAGIC, c->sid, c->nonce, RING_PROTO_VERSION, id };
    status_t st = STATUS_OK;
    rp_attach_reply_t rep;
    size_t len = 0;
    int tmo = (int)(c->timeout_s * 1000);
    if (shm_send_fds(fd, &q, sizeof q, NULL, 0, err, sizeof err) ||
        shm_recv_fds(fd, &rep, sizeof rep, &len, NULL, 0, tmo, err, sizeof err) || len != sizeof rep) {
        st = fail(STATUS_UNAVAILABLE, "ballastd at %s: fetching pool segment %u: %s", c->addr, id, err);
        goto out;
    }
    rep.msg[sizeof rep.msg - 1] = 0;
    if (rep.status != STATUS_OK || rep.nsegs != 1) {
        st = fail(rep.status != STATUS_OK ? status_from_grpc(rep.status) : STATUS_INTERNAL,
                  "ballastd at %s refused pool segment %u: %s", c->addr, id, rep.msg);
        goto out;
    }
    rp_fd_chunk_t ch;
    int sfd = -1;
    if (shm_recv_fds(fd, &ch, sizeof ch, &len, &sfd, 1, tmo, err, sizeof err) || len != sizeof ch ||
        ch.count != 1 || ch.ring || ch.seg[0] != id) {
        if (sfd >= 0) close(sfd);
        st = fail(STATUS_INTERNAL, "ballastd at %s: receiving pool segment %u: %s", c->addr, id, err);
        goto out;
    }
    if (shm_map_fd(&c->segs[c->nsegs], sfd, ch.bytes[0], err, sizeof err)) {
        st = fail(STATUS_INTERNAL, "ballastd at %s: mapping pool segment %u: %s", c->addr, id, err);
        goto out;
    }
    c->seg_id[c->nsegs] = id;
    c->segview[c->nsegs] = (oc_segment_t){ c->segs[c->nsegs].base, c->segs[c->nsegs].bytes };
    c->nsegs++;
    if (c->seg_hook) c->seg_hook(c->seg_hook_arg, &c->segview[c->nsegs - 1]);
out:
    close(fd);
    return st;
}

/* ---- slots ---- */

/* Take a free slot; returns its req_id, 0 when all are in use. */
static uint64_t slot_take(oc_client_t *c) {
    pthread_mutex_lock(&c->mu);
    if (c->nfree == 0) { pthread_mutex_unlock(&c->mu); return 0; }
    uint32_t i = c->free_stack[--c->nfree];
    uint64_t id = (++c->seq << 16) | i;
    c->slots[i].req_id = id;
    c->slots[i].state = SLOT_PENDING;
    pthread_mutex_unlock(&c->mu);
    return id;
}

/* Caller holds c->mu. */
static void slot_release_locked(oc_client_t *c, uint32_t i) {
    c->slots[i].state = SLOT_FREE;
    c->slots[i].req_id = 0;
    c->slots[i].priv = NULL;
    free(c->slots[i].msg);
    c->slots[i].msg = NULL;
    c->free_stack[c->nfree++] = i;
}

static slot_t *slot_of(oc_client_t *c, uint64_t id) {
    uint32_t i = (uint32_t)(id & 0xffff);
    if (id == 0 || i >= c->nslots || c->slots[i].req_id != id) return NULL;
    return &c->slots[i];
}

static status_t key_check(const oc_key_t *k) {
    if (!k) return fail(STATUS_INVALID_ARGUMENT, "key is NULL");
    if (k->kind < OC_KIND_ACTIVATION || k->kind > OC_KIND_OTHER)
        return fail(STATUS_INVALID_ARGUMENT, "key kind %u: use 1..4 (ACTIVATION, OPTIMIZER_STATE, PARAM, OTHER)", k->kind);
    return STATUS_OK;
}

/* Submit one ring request; *id gets the handle. */
static status_t submit(oc_client_t *c, rp_req_t *q, uint64_t *id) {
    int br = atomic_load(&c->broken);
    if (br) {
        pthread_mutex_lock(&c->mu);
        fail((status_t)br, "%s", c->broken_msg);
        pthread_mutex_unlock(&c->mu);
        return (status_t)br;
    }
    uint64_t rid = slot_take(c);
    if (!rid) return fail(STATUS_RESOURCE_EXHAUSTED, "more than %u requests in flight: oc_wait() on some handles first", c->nslots);
    q->req_id = rid;
    pthread_mutex_lock(&c->push_mu);
    int rc = ring_push_wait(&c->req, q, (int)(c->timeout_s * 1000));
    pthread_mutex_unlock(&c->push_mu);
    if (rc) {
        pthread_mutex_lock(&c->mu);
        slot_release_locked(c, (uint32_t)(rid & 0xffff));
        pthread_mutex_unlock(&c->mu);
        return fail(rc == -ETIMEDOUT ? STATUS_UNAVAILABLE : STATUS_INTERNAL, "ballastd at %s: request ring %s; %s", c->addr,
                    rc == -ETIMEDOUT ? "stayed full (the service is not serving this session)" : c->req.err, HINT);
    }
    *id = rid;
    return STATUS_OK;
}

/* Wait for the completion of id; on STATUS_OK *out is the completion (its
 * status may be a failure: a parked remote failure's message then becomes
 * this thread's oc_last_error()). */
static status_t wait_cpl(oc_client_t *c, uint64_t id, rp_cpl_t *out, void **priv, double timeout_s) {
    double deadline = timeout_s < 0 ? 1e300 : clock_now_s() + timeout_s;
    bool poll = timeout_s == 0, polled = false; /* 0: one look at the completion ring, no blocking */
    pthread_mutex_lock(&c->mu);
    slot_t *s = slot_of(c, id);
    if (!s || s->state == SLOT_FREE || s->state == SLOT_ABANDONED) {
        pthread_mutex_unlock(&c->mu);
        return fail(STATUS_INVALID_ARGUMENT, "unknown handle %llu (already waited for?)", (unsigned long long)id);
    }
    for (;;) {
        if (s->state == SLOT_DONE) {
            *out = s->cpl;
            if (priv) *priv = s->priv;
            else if (s->priv) protobuf_c_message_free_unpacked(s->priv, NULL);
            if (s->cpl.status != STATUS_OK && !c->shared) {
                if (s->msg) fail(STATUS_OK, "%s", s->msg);
                else fail(STATUS_OK, "ballastd at %s: %s failed: %s (out of memory for its message)", c->addr,
                          rp_op_name(s->cpl.op), status_name(status_from_grpc(s->cpl.status)));
            }
            slot_release_locked(c, (uint32_t)(id & 0xffff));
            pthread_mutex_unlock(&c->mu);
            return STATUS_OK;
        }
        int br = atomic_load(&c->broken);
        if (br) {
            pthread_mutex_unlock(&c->mu);
            return fail((status_t)br, "%s", c->broken_msg);
        }
        double left = deadline - clock_now_s();
        if (polled || (left <= 0 && !poll)) {
            pthread_mutex_unlock(&c->mu);
            return fail(STATUS_DEADLINE_EXCEEDED, "ballastd at %s: no completion within %.3gs (handle stays valid)",
                        c->addr, timeout_s);
        }
        int wait_ms = left > 0.1 ? 100 : (int)(left * 1000) + 1;
        if (!c->reaping) {
            c->reaping = true;
            pthread_mutex_unlock(&c->mu);
            rp_cpl_t batch[32];
            int n = ring_pop_batch(&c->cpl, batch, 32);
            if (n == 0 && !poll) {
                int rc = ring_wait_data(&c->cpl, wait_ms);
                if (rc == 0) n = ring_pop_batch(&c->cpl, batch, 32);
                else if (rc == -EBADMSG) n = -EBADMSG;
            }
            pthread_mutex_lock(&c->mu);
            c->reaping = false;
            if (n < 0) {
                snprintf(c->broken_msg, sizeof c->broken_msg, "ballastd at %s: completion ring corrupt: %s",
                         c->addr, c->cpl.err);
                atomic_store(&c->broken, STATUS_INTERNAL);
            }
            for (int i = 0; i < n; i++) {
                slot_t *t = slot_of(c, batch[i].req_id);
                if (t && t->state == SLOT_PENDING) { t->cpl = batch[i]; t->state = SLOT_DONE; }
                else if (t && t->state == SLOT_ABANDONED) slot_release_locked(c, (uint32_t)(batch[i].req_id & 0xffff));
            }
            pthread_cond_broadcast(&c->cv);
        } else if (!poll) {
            struct timespec ts = clock_after((double)wait_ms * 1e-3);
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        polled = poll;
    }
}

/* The status of a completion, read off the wire (anything that is not a
 * wire value is STATUS_UNKNOWN), with its message. */
static status_t cpl_status(oc_client_t *c, const rp_cpl_t *p, const oc_key_t *k) {
    status_t st = status_from_grpc(p->status);
    if (st == STATUS_OK) return STATUS_OK;
    /* a quota refusal's detail names its own fix */
    bool quota = p->detail == RP_D_OVER_QUOTA || p->detail == RP_D_JOB_QUOTA;
    const char *sep = st == STATUS_RESOURCE_EXHAUSTED && !quota ? "; " : "";
    const char *hint = st == STATUS_RESOURCE_EXHAUSTED && !quota ? FULL_HINT : "";
    if (k)
        return fail(st, "ballastd at %s: %s of key (rank %u, kind %u, index %llu, step %llu) "
                    "failed: %s: %s%s%s", c->addr, rp_op_name(p->op), k->rank, k->kind,
                    (unsigned long long)k->index, (unsigned long long)k->step,
                    status_name(st), rp_detail_text(p->detail), sep, hint);
    return fail(st, "ballastd at %s: %s failed: %s: %s%s%s", c->addr, rp_op_name(p->op),
                status_name(st), rp_detail_text(p->detail), sep, hint);
}

static void fill_req(rp_req_t *q, uint32_t op, const oc_key_t *k) {
    memset(q, 0, sizeof *q);
    q->op = op;
    if (k) { q->rank = k->rank; q->kind = k->kind; q->index = k->index; q->step = k->step; }
}

/* Synchronous ring op. */
static status_t ring_op(oc_client_t *c, rp_req_t *q, const oc_key_t *k, rp_cpl_t *out) {
    uint64_t id;
    status_t st = submit(c, q, &id);
    if (st) return st;
    st = wait_cpl(c, id, out, NULL, c->timeout_s);
    if (st == STATUS_DEADLINE_EXCEEDED) {
        /* nobody will wait for it any more: let the reaper free the slot */
        pthread_mutex_lock(&c->mu);
        slot_t *sl = slot_of(c, id);
        if (sl && sl->state == SLOT_PENDING) sl->state = SLOT_ABANDONED;
        else if (sl && sl->state == SLOT_DONE) slot_release_locked(c, (uint32_t)(id & 0xffff));
        pthread_mutex_unlock(&c->mu);
    }
    if (st) return st;
    return cpl_status(c, out, k);
}

/* The bytes of a region a completion named, mapping its segment first when
 * it is new to this session; NULL (with the error set when fetching failed)
 * when the region lies outside it. */
static void *region_ptr(oc_client_t *c, const rp_cpl_t *p) {
    pthread_mutex_lock(&c->seg_mu);
    uint32_t i = 0;
    while (i < c->nsegs && c->seg_id[i] != p->seg) i++;
    if (i == c->nsegs && fetch_segment(c, p->seg) != STATUS_OK) i = UINT32_MAX;
    const shm_seg_t *sg = i < c->nsegs ? &c->segs[i] : NULL;
    pthread_mutex_unlock(&c->seg_mu);
    if (!sg || p->offset > sg->bytes || p->length > sg->bytes - p->offset) return NULL;
    return (uint8_t *)sg->base + p->offset;
}

/* ---- remote-mode calls ---- */

static status_t remote_free(oc_client_t *c, const oc_key_t *k) {
    pb_key_t pk;
    set_pb_key(&pk, k);
    Ballast__Offload__V1__FreeRequest req = BALLAST__OFFLOAD__V1__FREE_REQUEST__INIT;
    req.session_id = c->sid;
    req.key = &pk;
    void *resp = NULL;
    char msg[512];
    grpc_status_code gs = CALL(c, "Free", &req, &ballast__offload__v1__free_response__descriptor, &resp, msg, sizeof msg);
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    return gs ? rpc_fail(c, gs, "Free", msg) : STATUS_OK;
}

static status_t remote_get(oc_client_t *c, const oc_key_t *k, Ballast__Offload__V1__GetResponse **out) {
    pb_key_t pk;
    set_pb_key(&pk, k);
    Ballast__Offload__V1__GetRequest req = BALLAST__OFFLOAD__V1__GET_REQUEST__INIT;
    req.session_id = c->sid;
    req.key = &pk;
    char msg[512];
    grpc_status_code gs = CALL(c, "Get", &req, &ballast__offload__v1__get_response__descriptor, (void **)out, msg, sizeof msg);
    return gs ? rpc_fail(c, gs, "Get", msg) : STATUS_OK;
}

static void buf_from_get(oc_buf_t *b, Ballast__Offload__V1__GetResponse *r) {
    memset(b, 0, sizeof *b);
    b->ptr = r->data.data;
    b->len = r->data.len;
    b->crc32c = r->crc32c;
    b->crc_known = r->crc32c_known;
    b->persistent = r->persistent;
    b->_priv = r;
}

/* ---- put ---- */

status_t oc_put_alloc(oc_client_t *c, const oc_key_t *k, uint64_t len, bool persistent, oc_buf_t *b) {
    status_t st = key_check(k);
    if (st) return st;
    memset(b, 0, sizeof *b);
    if (len == 0 || (c->max_blob && len > c->max_blob))
        return fail(STATUS_INVALID_ARGUMENT, "blob length %llu must be in [1, %llu] bytes (ballastd's --pool-bytes): "
                    "split the blob, or restart ballastd with a larger --pool-bytes",
                    (unsigned long long)len, (unsigned long long)c->max_blob);
    if (!c->shared) {
        b->ptr = malloc(len);
        if (!b->ptr) return fail(STATUS_RESOURCE_EXHAUSTED, "out of memory for a %llu-byte put buffer", (unsigned long long)len);
        b->len = len;
        b->persistent = persistent;
        b->_priv = b->ptr;
        return STATUS_OK;
    }
    rp_req_t q;
    fill_req(&q, RP_OP_PUT_ALLOC, k);
    q.flags = persistent ? RP_FLAG_PERSISTENT : 0;
    q.length = len;
    rp_cpl_t p;
    if ((st = ring_op(c, &q, k, &p))) return st;
    g_err[0] = 0;
    b->ptr = region_ptr(c, &p);
    if (!b->ptr && g_err[0]) return STATUS_UNAVAILABLE; /* the segment could not be fetched: g_err says why */
    if (!b->ptr || p.length != len)
        return fail(STATUS_INTERNAL, "ballastd at %s returned a region outside the pool", c->addr);
    b->len = len;
    b->persistent = persistent;
    b->_seg = p.seg;
    b->_off = p.offset;
    return STATUS_OK;
}

static void region_req(rp_req_t *q, const oc_buf_t *b) {
    q->seg = b->_seg;
    q->offset = b->_off;
    q->length = b->len;
}

status_t oc_put_commit(oc_client_t *c, const oc_key_t *k, oc_buf_t *b) {
    oc_handle_t h;
    status_t st = oc_put_commit_async(c, k, b, &h);
    if (st) return st;
    return oc_wait(c, h, NULL, c->timeout_s);
}

status_t oc_put_abort(oc_client_t *c, const oc_key_t *k, oc_buf_t *b) {
    if (!c->shared) { free(b->_priv); memset(b, 0, sizeof *b); return STATUS_OK; }
    memset(b, 0, sizeof *b);
    return oc_free(c, k);
}

status_t oc_put_copy(oc_client_t *c, const oc_key_t *k, const void *data, uint64_t len, bool persistent) {
    status_t st = key_check(k);
    if (st) return st;
    if (!c->shared) {
        if (len == 0) return fail(STATUS_INVALID_ARGUMENT, "blob length must be > 0");
        pb_key_t pk;
        set_pb_key(&pk, k);
        Ballast__Offload__V1__PutRequest req = BALLAST__OFFLOAD__V1__PUT_REQUEST__INIT;
        req.session_id = c->sid;
        req.key = &pk;
        req.data.data = (uint8_t *)data;
        req.data.len = len;
        req.persistent = persistent;
        void *resp = NULL;
        char msg[512];
        grpc_status_code gs = CALL(c, "Put", &req, &ballast__offload__v1__put_response__descriptor, &resp, msg, sizeof msg);
        if (resp) protobuf_c_message_free_unpacked(resp, NULL);
        return gs ? rpc_fail(c, gs, "Put", msg) : STATUS_OK;
    }
    oc_buf_t b;
    if ((st = oc_put_alloc(c, k, len, persistent, &b))) return st;
    memcpy(b.ptr, data, len);
    st = oc_put_commit(c, k, &b);
    return st;
}

/* ---- get ---- */

status_t oc_get(oc_client_t *c, const oc_key_t *k, oc_buf_t *b) {
    oc_handle_t h;
    status_t st = oc_get_async(c, k, &h);
    if (st) return st;
    return oc_wait(c, h, b, c->timeout_s);
}

status_t oc_get_done(oc_client_t *c, const oc_key_t *k, oc_buf_t *b) {
    if (!c->shared) {
        if (b->_priv) protobuf_c_message_free_unpacked(b->_priv, NULL);
        memset(b, 0, sizeof *b);
        return STATUS_OK;
    }
    status_t st = key_check(k);
    if (st) return st;
    rp_req_t q;
    fill_req(&q, RP_OP_GET_DONE, k);
    region_req(&q, b);
    rp_cpl_t p;
    st = ring_op(c, &q, k, &p);
    memset(b, 0, sizeof *b);
    return st;
}

status_t oc_get_copy(oc_client_t *c, const oc_key_t *k, void *dst, uint64_t cap, uint64_t *len) {
    oc_buf_t b;
    status_t st = oc_get(c, k, &b);
    if (st) return st;
    if (len) *len = b.len;
    if (b.len > cap) {
        oc_get_done(c, k, &b);
        return fail(STATUS_INVALID_ARGUMENT, "blob is %llu bytes, buffer only %llu", (unsigned long long)b.len,
                    (unsigned long long)cap);
    }
    memcpy(dst, b.ptr, b.len);
    return oc_get_done(c, k, &b);
}

/* ---- simple ops ---- */

static status_t simple_async(oc_client_t *c, uint32_t op, const oc_key_t *k, oc_handle_t *h) {
    status_t st = key_check(k);
    if (st) return st;
    rp_req_t q;
    fill_req(&q, op, k);
    return submit(c, &q, h);
}

static status_t simple(oc_client_t *c, uint32_t op, const oc_key_t *k) {
    status_t st = key_check(k);
    if (st) return st;
    rp_req_t q;
    fill_req(&q, op, k);
    rp_cpl_t p;
    return ring_op(c, &q, k, &p);
}

status_t oc_free(oc_client_t *c, const oc_key_t *k) {
    if (!c->shared) { status_t st = key_check(k); return st ? st : remote_free(c, k); }
    return simple(c, RP_OP_FREE, k);
}

status_t oc_prefetch(oc_client_t *c, const oc_key_t *k) {
    if (!c->shared) return key_check(k); /* remote: the Get itself reads back */
    return simple(c, RP_OP_PREFETCH, k);
}

status_t oc_pin(oc_client_t *c, const oc_key_t *k) {
    if (!c->shared) return fail(STATUS_FAILED_PRECONDITION, "pin needs shared-memory mode (remote sessions cannot pin)");
    return simple(c, RP_OP_PIN, k);
}

status_t oc_unpin(oc_client_t *c, const oc_key_t *k) {
    if (!c->shared) return fail(STATUS_FAILED_PRECONDITION, "unpin needs shared-memory mode");
    return simple(c, RP_OP_UNPIN, k);
}

status_t oc_nop(oc_client_t *c) {
    if (!c->shared) return oc_heartbeat(c);
    rp_req_t q;
    fill_req(&q, RP_OP_NOP, NULL);
    rp_cpl_t p;
    return ring_op(c, &q, NULL, &p);
}

/* ---- async ---- */

/* Remote mode: run now, park the result in a slot; a failure's message
 * (this thread's oc_last_error(), just set by the call) goes with it. */
static status_t remote_park(oc_client_t *c, uint32_t op, status_t st, void *priv, oc_handle_t *h) {
    uint64_t rid = slot_take(c);
    if (!rid) {
        if (priv) protobuf_c_message_free_unpacked(priv, NULL);
        return fail(STATUS_RESOURCE_EXHAUSTED, "more than %u requests in flight: oc_wait() on some handles first", c->nslots);
    }
    pthread_mutex_lock(&c->mu);
    slot_t *s = slot_of(c, rid);
    if (!s) { pthread_mutex_unlock(&c->mu); return fail(STATUS_INTERNAL, "slot table corrupt"); }
    memset(&s->cpl, 0, sizeof s->cpl);
    s->cpl.req_id = rid;
    s->cpl.op = op;
    s->cpl.status = (uint32_t)st;
    s->priv = priv;
    s->msg = st != STATUS_OK ? strdup(oc_last_error()) : NULL; /* the failing call's, on this thread */
    s->state = SLOT_DONE;
    pthread_mutex_unlock(&c->mu);
    *h = rid;
    return STATUS_OK;
}

status_t oc_get_async(oc_client_t *c, const oc_key_t *k, oc_handle_t *h) {
    *h = 0;
    status_t st = key_check(k);
    if (st) return st;
    if (!c->shared) {
        Ballast__Offload__V1__GetResponse *r = NULL;
        st = remote_get(c, k, &r);
        return remote_park(c, RP_OP_GET, st, r, h);
    }
    return simple_async(c, RP_OP_GET, k, h);
}

status_t oc_prefetch_async(oc_client_t *c, const oc_key_t *k, oc_handle_t *h) {
    *h = 0;
    if (!c->shared) { status_t st = key_check(k); return st ? st : remote_park(c, RP_OP_PREFETCH, STATUS_OK, NULL, h); }
    return simple_async(c, RP_OP_PREFETCH, k, h);
}

status_t oc_free_async(oc_client_t *c, const oc_key_t *k, oc_handle_t *h) {
    *h = 0;
    if (!c->shared) {
        status_t st = oc_free(c, k);
        return remote_park(c, RP_OP_FREE, st, NULL, h);
    }
    return simple_async(c, RP_OP_FREE, k, h);
}

status_t oc_put_commit_async(oc_client_t *c, const oc_key_t *k, oc_buf_t *b, oc_handle_t *h) {
    *h = 0;
    status_t st = key_check(k);
    if (st) return st;
    if (!c->shared) {
        if (!b->_priv) return fail(STATUS_INVALID_ARGUMENT, "buffer does not come from oc_put_alloc");
        st = oc_put_copy(c, k, b->ptr, b->len, b->persistent);
        free(b->_priv);
        memset(b, 0, sizeof *b);
        return remote_park(c, RP_OP_PUT_COMMIT, st, NULL, h);
    }
    rp_req_t q;
    fill_req(&q, RP_OP_PUT_COMMIT, k);
    region_req(&q, b);
    return submit(c, &q, h);
}

status_t oc_wait(oc_client_t *c, oc_handle_t h, oc_buf_t *b, double timeout_s) {
    rp_cpl_t p;
    void *priv = NULL;
    status_t st = wait_cpl(c, h, &p, &priv, timeout_s);
    if (st) return st;
    if (!c->shared) {
        if (p.status != STATUS_OK) { /* wait_cpl set the message */
            if (priv) protobuf_c_message_free_unpacked(priv, NULL);
            return (status_t)p.status;
        }
        if (b && priv) buf_from_get(b, priv);
        else if (priv) protobuf_c_message_free_unpacked(priv, NULL);
        return STATUS_OK;
    }
    if (p.status != STATUS_OK) return cpl_status(c, &p, NULL);
    if (b && p.op == RP_OP_GET) {
        memset(b, 0, sizeof *b);
        g_err[0] = 0;
        b->ptr = region_ptr(c, &p);
        if (!b->ptr && g_err[0]) return STATUS_UNAVAILABLE; /* the segment could not be fetched: g_err says why */
        if (!b->ptr) return fail(STATUS_INTERNAL, "ballastd at %s returned a region outside the pool", c->addr);
        b->len = p.length;
        b->crc32c = p.crc32c;
        b->crc_known = (p.blob_flags & RP_CPL_CRC_KNOWN) != 0;
        b->persistent = (p.blob_flags & RP_CPL_PERSISTENT) != 0;
        b->_seg = p.seg;
        b->_off = p.offset;
    }
    return STATUS_OK;
}

/* ---- testing ---- */

status_t oc_raw_call(oc_client_t *c, const void *req64, void *cpl64, double timeout_s) {
    if (!c->shared) return fail(STATUS_FAILED_PRECONDITION, "raw ring calls need shared-memory mode");
    rp_req_t q;
    memcpy(&q, req64, sizeof q);
    uint64_t id;
    status_t st = submit(c, &q, &id);
    if (st) return st;
    rp_cpl_t p;
    if ((st = wait_cpl(c, id, &p, NULL, timeout_s))) return st;
    memcpy(cpl64, &p, sizeof p);
    return status_from_grpc(p.status);
}
