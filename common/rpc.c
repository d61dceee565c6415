/* rpc.c: unary gRPC server and client over the gRPC C core API, carrying
 * protobuf-c messages. See rpc.h for the contract and docs/rpc.md for the
 * conventions.
 *
 * Server design. Every known method is registered with
 * grpc_server_register_method(GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER), so
 * gRPC hands us a call only once its request message has arrived; a call
 * never parks a thread waiting for its payload. Unknown paths arrive through
 * grpc_server_request_call, the catch-all, which answers UNIMPLEMENTED.
 * Each server thread owns one completion queue and keeps, on it, one
 * request posted per method plus one catch-all. Every tag is completed on
 * the queue it was posted to, so each call's state is touched by one thread
 * only. A method's request is reposted after its handler returns: while a
 * thread runs an Open handler, the next Open call goes to another thread
 * instead of queueing behind it (gRPC prefers one queue per connection).
 *
 * Stop: set `stopping` (no more posting), grpc_server_shutdown_and_notify,
 * wait for the notification and for every live call to finish (cancelling
 * them after the grace period), then shut down and drain each queue, join
 * the threads, destroy the server and the queues. Queues are shut down only
 * after the last call is gone, because starting a batch on a shut-down queue
 * is fatal in gRPC. */
#include "rpc.h"
#include "clock.h"
#include "errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "log.h"

/* A call's tag goes to gRPC with an operation (request_call, start_batch)
 * and comes back from a completion queue, often on another thread: the
 * queue orders everything before the hand-off before everything after it,
 * which ThreadSanitizer cannot see in Debian's uninstrumented libgrpc; it
 * reported our own sc_free and on_event as races (tsan.h). */
#include "tsan.h"
#define TAG_HANDED(t)   TSAN_RELEASE(t)
#define TAG_RETURNED(t) TSAN_ACQUIRE(t)

#define HEALTH_CHECK_PATH "/grpc.health.v1.Health/Check"
#define CLIENT_DEFAULT_MAX_MSG (64u << 20)
#define MAX_UNIX_LISTENERS 4
#define NUL_SCAN_DEPTH 16         /* nested messages searched for NUL-bearing strings */

/* ---- small helpers ---- */


const char *rpc_status_name(grpc_status_code code) {
    static const char *names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if ((int)code >= 0 && (size_t)code < sizeof names / sizeof names[0]) return names[code];
    return "UNKNOWN_STATUS";
}

/* A method path must look like "/pkg.Service/Method": leading slash, exactly
 * one more slash, non-empty parts, printable ASCII. */
static bool path_ok(const char *p) {
    if (!p || p[0] != '/') return false;
    const char *slash = strchr(p + 1, '/');
    if (!slash || slash == p + 1 || slash[1] == '\0' || strchr(slash + 1, '/')) return false;
    for (const char *q = p; *q; q++)
        if (*q <= ' ' || *q > '~') return false;
    return true;
}

/* A byte buffer as one contiguous slice: a new reference to its only slice
 * when it is one uncompressed slice (a small message, most of them), else a
 * copy (decompressing if needed). Returns false when gRPC cannot read the
 * buffer. */
static bool bb_flatten(grpc_byte_buffer *bb, grpc_slice *out) {
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
        bb->data.raw.slice_buffer.count == 1) {
        *out = grpc_slice_ref(bb->data.raw.slice_buffer.slices[0]);
        return true;
    }
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return false;
    *out = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    return true;
}

/* Pack msg, whose packed size is n, into a new byte buffer; NULL when out
 * of memory. */
static grpc_byte_buffer *pack_sized(const ProtobufCMessage *msg, size_t n) {
    grpc_slice s = grpc_slice_malloc(n);
    size_t w = protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    if (w != n) {
        grpc_slice_unref(s);
        return NULL;
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Pack msg into a new byte buffer; NULL when out of memory. */
static grpc_byte_buffer *pack_msg(const ProtobufCMessage *msg) {
    return pack_sized(msg, protobuf_c_message_get_packed_size(msg));
}

/* ---- server types ---- */

typedef struct {
    char *path;                                  /* owned copy */
    const ProtobufCMessageDescriptor *req_desc;
    const ProtobufCMessageDescriptor *resp_desc;
    rpc_handler_fn handler;
    void *user;
    bool quick;                                  /* run on the receiving thread */
    void *handle;                                /* grpc_server_register_method's result */
} srv_method_t;

typedef struct {
    char *service;                               /* owned */
    rpc_health_t status;
} health_entry_t;

typedef struct srv_thread srv_thread_t;

enum { SC_REQUESTED = 1, SC_SENDING };

/* One posted request and, once matched, the call it became. Owned by the
 * thread that took its event off the queue (th is set to it then). */
typedef struct srv_call {
    int state;                    /* SC_REQUESTED | SC_SENDING */
    int method;                   /* index into srv->methods; -1 = catch-all */
    srv_thread_t *th;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;       /* request metadata (unused, but owned) */
    grpc_call_details details;    /* catch-all only: method path, host */
    grpc_byte_buffer *payload;    /* registered only: the request message */
    grpc_byte_buffer *resp;       /* response being sent */
    grpc_slice status_details;    /* status message being sent */
    int cancelled;                /* set by RECV_CLOSE_ON_SERVER */
    struct srv_call *next;        /* in the handler queue */
} srv_call_t;

struct srv_thread {
    rpc_server_t *srv;
    int index;                    /* 0..N-1 */
    grpc_completion_queue *cq;    /* the server's one queue */
    pthread_t tid;
    bool started;
};

struct rpc_server {
    grpc_server *gs;
    /* One completion queue, and one thread (threads[0]) waiting on it; the
     * others take handlers from the queue below. With several threads on
     * the completion queue (or a queue each), gRPC hands the polling over to
     * another waiting thread whenever the polling one takes an event, a
     * wakeup per call: two context switches when the client shares the CPU.
     * A quick method's handler therefore runs on threads[0] itself. */
    grpc_completion_queue *cq;
    int nthreads;
    pthread_mutex_t hq_mu;                        /* the handler queue */
    pthread_cond_t hq_cv;
    srv_call_t *hq_head, *hq_tail;
    bool hq_stop;                                 /* workers exit once it is empty */
    size_t max_msg;                               /* bytes */
    srv_thread_t *threads;                        /* [nthreads] */
    srv_method_t *methods;                        /* [nmethods] */
    size_t nmethods, cap_methods;
    int nlisteners;
    bool started, stopped;

    pthread_mutex_t mu;                           /* guards everything below */
    pthread_cond_t cv;
    bool stopping;                                /* no more posting */
    bool notified;                                /* shutdown tag arrived */
    int live_calls;                               /* matched calls not yet destroyed */
    health_entry_t *health;                       /* [nhealth] */
    size_t nhealth, cap_health;

    atomic_uint_fast64_t calls;                   /* calls answered */
    int shutdown_tag;                             /* its address is the tag */

    /* Unix listeners, accepted by our own thread (peer credentials) */
    shm_uidset_t unix_peers;
    bool unix_group_set;
    gid_t unix_gid;
    int ufd[MAX_UNIX_LISTENERS];                  /* listening sockets */
    char upath[MAX_UNIX_LISTENERS][108];
    int nunix;
    pthread_t acc_tid;
    bool acc_started;
    atomic_bool acc_stop;
    /* The credentials of each connection the acceptor handed to gRPC, by
     * descriptor (see ctx_peer); grown by the acceptor, read per call. */
    pthread_mutex_t fdp_mu;
    struct fd_peer { bool set; shm_peer_t peer; } *fdp;  /* [nfdp] */
    size_t nfdp;
    /* TLS for TCP listeners (PEM text, owned), NULL = plaintext */
    char *tls_cert, *tls_key, *tls_ca;
};

struct rpc_ctx_priv {
    void **defer;                                 /* pointers freed after packing */
    size_t n, cap;
    gpr_timespec deadline;                        /* GPR_CLOCK_MONOTONIC */
};

/* ---- handler context ---- */

void *rpc_ctx_defer_free(rpc_ctx_t *ctx, void *p) {
    if (!p) return NULL;
    rpc_ctx_priv_t *pv = ctx->priv;
    if (pv->n == pv->cap) {
        size_t cap = pv->cap ? 2 * pv->cap : 8;
        void **d = realloc(pv->defer, cap * sizeof *d);
        if (!d) {
            free(p);
            return NULL;
        }
        pv->defer = d;
        pv->cap = cap;
    }
    pv->defer[pv->n++] = p;
    return p;
}

void *rpc_ctx_alloc(rpc_ctx_t *ctx, size_t n) {
    return rpc_ctx_defer_free(ctx, calloc(1, n ? n : 1));
}

grpc_status_code rpc_ctx_errf(rpc_ctx_t *ctx, grpc_status_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    return code;
}

int64_t rpc_ctx_time_left_ms(const rpc_ctx_t *ctx) {
    gpr_timespec dl = ctx->priv->deadline;
    if (gpr_time_cmp(dl, gpr_inf_future(dl.clock_type)) == 0) return INT64_MAX;
    gpr_timespec left = gpr_time_sub(dl, gpr_now(GPR_CLOCK_MONOTONIC));
    return gpr_time_to_millis(left);
}

/* ---- health service ---- */

static grpc_status_code health_check(rpc_ctx_t *ctx, const ProtobufCMessage *reqm,
                                     ProtobufCMessage *respm) {
    rpc_server_t *s = ctx->user;
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)reqm;
    Grpc__Health__V1__HealthCheckResponse *resp = (void *)respm;
    const char *svc = req->service ? req->service : "";
    int st = -1;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nhealth; i++)
        if (strcmp(s->health[i].service, svc) == 0) st = (int)s->health[i].status;
    pthread_mutex_unlock(&s->mu);
    if (st < 0)
        return rpc_ctx_errf(ctx, GRPC_STATUS_NOT_FOUND,
                            "health: unknown service \"%.100s\" (ask for \"\" for the whole server)",
                            svc);
    resp->status = st;
    return GRPC_STATUS_OK;
}

void rpc_server_set_health(rpc_server_t *s, const char *service, rpc_health_t st) {
    if (!s) return;
    if (!service) service = "";
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nhealth; i++) {
        if (strcmp(s->health[i].service, service) == 0) {
            s->health[i].status = st;
            pthread_mutex_unlock(&s->mu);
            return;
        }
    }
    if (s->nhealth == s->cap_health) {
        size_t cap = s->cap_health ? 2 * s->cap_health : 4;
        health_entry_t *h = realloc(s->health, cap * sizeof *h);
        if (!h) goto oom;
        s->health = h;
        s->cap_health = cap;
    }
    char *name = strdup(service);
    if (!name) goto oom;
    s->health[s->nhealth++] = (health_entry_t){name, st};
    pthread_mutex_unlock(&s->mu);
    return;
oom:
    pthread_mutex_unlock(&s->mu);
    log_error("rpc: out of memory recording health of service \"%s\"", service);
}

/* ---- server: posting requests ---- */

static srv_call_t *sc_new(srv_thread_t *th, int method) {
    srv_call_t *sc = calloc(1, sizeof *sc);
    if (!sc) return NULL;
    sc->state = SC_REQUESTED;
    sc->method = method;
    sc->th = th;
    grpc_metadata_array_init(&sc->md);
    grpc_call_details_init(&sc->details);
    return sc;
}

static void sc_free(srv_call_t *sc) {
    if (sc->call) grpc_call_unref(sc->call);
    if (sc->payload) grpc_byte_buffer_destroy(sc->payload);
    if (sc->resp) grpc_byte_buffer_destroy(sc->resp);
    if (sc->state == SC_SENDING) grpc_slice_unref(sc->status_details);
    grpc_metadata_array_destroy(&sc->md);
    grpc_call_details_destroy(&sc->details);
    free(sc);
}

/* Post one request (method >= 0) or catch-all (-1) on th's queue, unless the
 * server is stopping. Holding mu while posting orders every post before the
 * queues are shut down. */
static void post_request(srv_thread_t *th, int method) {
    rpc_server_t *s = th->srv;
    srv_call_t *sc = sc_new(th, method);
    if (!sc) {
        log_error("rpc: out of memory posting a request; thread %d serves one method fewer",
                  th->index);
        return;
    }
    grpc_call_error e;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        sc_free(sc);
        return;
    }
    TAG_HANDED(sc);
    if (method >= 0)
        e = grpc_server_request_registered_call(s->gs, s->methods[method].handle, &sc->call,
                                                &sc->deadline, &sc->md, &sc->payload, th->cq,
                                                th->cq, sc);
    else
        e = grpc_server_request_call(s->gs, &sc->call, &sc->details, &sc->md, th->cq, th->cq, sc);
    pthread_mutex_unlock(&s->mu);
    if (e != GRPC_CALL_OK) {
        log_error("rpc: posting a request failed (grpc_call_error %d)", (int)e);
        sc_free(sc);
    }
}

static void call_done(rpc_server_t *s) {
    pthread_mutex_lock(&s->mu);
    s->live_calls--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Send status (and, on OK, sc->resp) and ask to hear when the call closes.
 * On failure to start, the call is released here. */
static void send_answer(srv_call_t *sc, grpc_status_code code, const char *msg) {
    rpc_server_t *s = sc->th->srv;
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    sc->status_details = grpc_slice_from_copied_string(msg ? msg : "");
    sc->state = SC_SENDING;
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n++].data.send_initial_metadata.count = 0;
    if (code == GRPC_STATUS_OK && sc->resp) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = sc->resp;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    ops[n].data.send_status_from_server.status = code;
    ops[n++].data.send_status_from_server.status_details = &sc->status_details;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &sc->cancelled;
    atomic_fetch_add(&s->calls, 1);
    grpc_call *call = sc->call; /* read before the hand-off: sc may be freed on another thread from then on */
    TAG_HANDED(sc);
    grpc_call_error e = grpc_call_start_batch(call, ops, n, sc, NULL);
    if (e != GRPC_CALL_OK) {
        log_error("rpc: starting the answer batch failed (grpc_call_error %d)", (int)e);
        sc_free(sc);
        call_done(s);
    }
}

/* ---- request checks ---- */

/* Read a base-128 varint at *p (below end); false when it runs off the end. */
static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

/* protobuf-c hands a string field over as a NUL-terminated C string, so a
 * string with an embedded NUL would reach the handler cut short (validated,
 * then used as its prefix). Walk the wire form of a message that already
 * unpacked and return the name of the first string field (of d or of a
 * nested message) holding a NUL byte; NULL when there is none. */
static const char *wire_nul_string(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                                   size_t n, int depth) {
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t tag, len;
        if (!wire_varint(&p, end, &tag)) return NULL;
        switch (tag & 7) {
        case 0: if (!wire_varint(&p, end, &len)) return NULL; break;
        case 1: p += 8; break;
        case 5: p += 4; break;
        case 2: {
            if (!wire_varint(&p, end, &len) || len > (uint64_t)(end - p)) return NULL;
            const ProtobufCFieldDescriptor *f =
                tag >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3)) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)len)) return f->name;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < NUL_SCAN_DEPTH) {
                const char *bad = wire_nul_string(f->descriptor, p, (size_t)len, depth + 1);
                if (bad) return bad;
            }
            p += len;
            break;
        }
        default: return NULL; /* groups: protobuf-c already refused them */
        }
    }
    return NULL;
}

/* Fill the peer fields of ctx: a connection accepted on one of our Unix
 * listeners is named "fd:N" by gRPC. N stays open (and so cannot name
 * another connection) while the call lives; its credentials are the ones
 * the acceptor read from N before handing it over (fd_peer_note), or, when
 * it has none, N's SO_PEERCRED. */
static void ctx_peer(rpc_server_t *s, rpc_ctx_t *ctx) {
    if (strncmp(ctx->peer, "fd:", 3) == 0) {
        char *end;
        long fd = strtol(ctx->peer + 3, &end, 10);
        shm_peer_t pc;
        char e[SHM_ERR_LEN];
        if (*end || fd < 0 || fd > INT32_MAX) return;
        bool known = false;
        pthread_mutex_lock(&s->fdp_mu);
        if ((size_t)fd < s->nfdp && s->fdp[fd].set) {
            pc = s->fdp[fd].peer;
            known = true;
        }
        pthread_mutex_unlock(&s->fdp_mu);
        if (known || shm_peer_cred((int)fd, &pc, e, sizeof e) == 0) {
            ctx->peer_local = true;
            ctx->peer_uid = (uint32_t)pc.uid;
            ctx->peer_gid = (uint32_t)pc.gid;
            ctx->peer_pid = (int32_t)pc.pid;
        }
        return;
    }
    ctx->peer_tls = s->tls_cert != NULL && strncmp(ctx->peer, "unix", 4) != 0;
}

/* Run the method's handler on the request in sc->payload and fill sc->resp.
 * Returns the status; *msg is set for non-OK. */
static grpc_status_code run_handler(srv_call_t *sc, char *msg, size_t msglen) {
    rpc_server_t *s = sc->th->srv;
    const srv_method_t *m = &s->methods[sc->method];
    grpc_status_code code;

    if (!sc->payload) {
        errbuf_set(msg, msglen, "%s: the call carried no request message; send one %s", m->path,
             m->req_desc->name);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    grpc_slice in;
    if (!bb_flatten(sc->payload, &in)) {
        errbuf_set(msg, msglen, "%s: cannot read the request (unsupported compression?)", m->path);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    ProtobufCMessage *req = protobuf_c_message_unpack(m->req_desc, NULL, GRPC_SLICE_LENGTH(in),
                                                      GRPC_SLICE_START_PTR(in));
    size_t inlen = GRPC_SLICE_LENGTH(in);
    const char *nul = req ? wire_nul_string(m->req_desc, GRPC_SLICE_START_PTR(in), inlen, 0) : NULL;
    grpc_slice_unref(in);
    if (!req) {
        errbuf_set(msg, msglen, "%s: the request (%zu bytes) does not parse as %s; send a serialized %s",
             m->path, inlen, m->req_desc->name, m->req_desc->name);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    if (nul) {
        errbuf_set(msg, msglen, "%s: string field '%s' holds a NUL byte; send it without one",
                   m->path, nul);
        protobuf_c_message_free_unpacked(req, NULL);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }

    ProtobufCMessage *resp = calloc(1, m->resp_desc->sizeof_message);
    if (!resp) {
        protobuf_c_message_free_unpacked(req, NULL);
        errbuf_set(msg, msglen, "%s: server out of memory", m->path);
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    protobuf_c_message_init(m->resp_desc, resp);

    rpc_ctx_priv_t pv = {.deadline = gpr_convert_clock_type(sc->deadline, GPR_CLOCK_MONOTONIC)};
    rpc_ctx_t ctx = {.method = m->path, .user = m->user, .thread = sc->th->index, .priv = &pv};
    char *peer = grpc_call_get_peer(sc->call);
    ctx.peer = peer ? peer : "unknown";
    ctx_peer(s, &ctx);

    if (rpc_ctx_time_left_ms(&ctx) <= 0) {
        code = GRPC_STATUS_DEADLINE_EXCEEDED;
        errbuf_set(msg, msglen, "%s: deadline passed before the handler ran", m->path);
    } else {
        code = m->handler(&ctx, req, resp);
        if (code != GRPC_STATUS_OK) {
            errbuf_set(msg, msglen, "%s", ctx.err[0] ? ctx.err : rpc_status_name(code));
        } else if (!protobuf_c_message_check(resp)) {
            code = GRPC_STATUS_INTERNAL;
            errbuf_set(msg, msglen, "%s: handler produced an invalid %s", m->path, m->resp_desc->name);
        } else {
            size_t outlen = protobuf_c_message_get_packed_size(resp);
            if (outlen > s->max_msg) {
                code = GRPC_STATUS_RESOURCE_EXHAUSTED;
                errbuf_set(msg, msglen, "%s: response of %zu bytes exceeds the server's limit of %zu",
                     m->path, outlen, s->max_msg);
            } else if (!(sc->resp = pack_sized(resp, outlen))) {
                code = GRPC_STATUS_INTERNAL;
                errbuf_set(msg, msglen, "%s: packing the response failed", m->path);
            }
        }
    }

    for (size_t i = 0; i < pv.n; i++) free(pv.defer[i]);
    free(pv.defer);
    free(resp);
    if (peer) gpr_free(peer);
    protobuf_c_message_free_unpacked(req, NULL);
    return code;
}

/* ---- server: event loop ---- */

/* Run sc's handler, answer, and post a new request for its method. */
static void handle_call(srv_thread_t *th, srv_call_t *sc) {
    char msg[RPC_ERR_LEN + 128] = "";
    int method = sc->method;
    grpc_status_code code = run_handler(sc, msg, sizeof msg);
    send_answer(sc, code, code == GRPC_STATUS_OK ? "" : msg);
    post_request(th, method);
}

static void on_event(srv_thread_t *th, srv_call_t *sc, bool ok) {
    rpc_server_t *s = th->srv;
    if (sc->state == SC_SENDING) {
        sc_free(sc);
        call_done(s);
        return;
    }
    /* SC_REQUESTED */
    if (!ok) { /* the server is shutting down */
        sc_free(sc);
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->live_calls++;
    pthread_mutex_unlock(&s->mu);
    sc->th = th; /* posted by any thread, now this one's */

    if (sc->method < 0) {
        /* catch-all: repost first, nothing here blocks */
        post_request(th, -1);
        char msg[RPC_ERR_LEN + 64];
        const grpc_slice *p = &sc->details.method;
        snprintf(msg, sizeof msg, "unknown method \"%.*s\"; this server has no such method",
                 (int)(GRPC_SLICE_LENGTH(*p) > 200 ? 200 : GRPC_SLICE_LENGTH(*p)),
                 (const char *)GRPC_SLICE_START_PTR(*p));
        send_answer(sc, GRPC_STATUS_UNIMPLEMENTED, msg);
        return;
    }
    if (s->nthreads > 1 && !s->methods[sc->method].quick) {
        pthread_mutex_lock(&s->hq_mu);
        sc->next = NULL;
        if (s->hq_tail) s->hq_tail->next = sc;
        else s->hq_head = sc;
        s->hq_tail = sc;
        pthread_cond_signal(&s->hq_cv);
        pthread_mutex_unlock(&s->hq_mu);
        return;
    }
    handle_call(th, sc);
}

/* A handler thread: run queued calls until the queue is stopped and empty. */
static void *handler_thread(void *arg) {
    srv_thread_t *th = arg;
    rpc_server_t *s = th->srv;
    pthread_mutex_lock(&s->hq_mu);
    for (;;) {
        srv_call_t *sc = s->hq_head;
        if (!sc) {
            if (s->hq_stop) break;
            pthread_cond_wait(&s->hq_cv, &s->hq_mu);
            continue;
        }
        s->hq_head = sc->next;
        if (!s->hq_head) s->hq_tail = NULL;
        pthread_mutex_unlock(&s->hq_mu);
        sc->th = th;
        handle_call(th, sc);
        pthread_mutex_lock(&s->hq_mu);
    }
    pthread_mutex_unlock(&s->hq_mu);
    return NULL;
}

static void *server_thread(void *arg) {
    srv_thread_t *th = arg;
    rpc_server_t *s = th->srv;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(th->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        if (ev.tag == &s->shutdown_tag) {
            pthread_mutex_lock(&s->mu);
            s->notified = true;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        TAG_RETURNED(ev.tag);
        on_event(th, ev.tag, ev.success != 0);
    }
    return NULL;
}

/* ---- server: Unix listeners ---- */

/* Record fd's credentials before gRPC gets fd. An older entry for the same
 * number belonged to a connection gRPC has closed (it keeps a descriptor
 * open while any call on it lives), so it is overwritten. Out of memory: no
 * entry, and ctx_peer asks the kernel. */
static void fd_peer_note(rpc_server_t *s, int fd, const shm_peer_t *peer) {
    pthread_mutex_lock(&s->fdp_mu);
    if ((size_t)fd >= s->nfdp) {
        size_t n = s->nfdp ? s->nfdp : 64;
        while (n <= (size_t)fd) n *= 2;
        struct fd_peer *p = realloc(s->fdp, n * sizeof *p);
        if (p) {
            memset(p + s->nfdp, 0, (n - s->nfdp) * sizeof *p);
            s->fdp = p;
            s->nfdp = n;
        }
    }
    if ((size_t)fd < s->nfdp) s->fdp[fd] = (struct fd_peer){ true, *peer };
    pthread_mutex_unlock(&s->fdp_mu);
}

/* Hand each connection on our Unix listeners to gRPC once its peer
 * credentials pass the allowed set; refused peers are closed and logged. */
static void *unix_acceptor(void *arg) {
    rpc_server_t *s = arg;
    struct pollfd pf[MAX_UNIX_LISTENERS];
    for (int i = 0; i < s->nunix; i++) pf[i] = (struct pollfd){s->ufd[i], POLLIN, 0};
    while (!atomic_load(&s->acc_stop)) {
        int r = poll(pf, (nfds_t)s->nunix, 100);
        if (r <= 0) continue;
        for (int i = 0; i < s->nunix; i++) {
            if (!(pf[i].revents & POLLIN)) continue;
            int fd = accept4(s->ufd[i], NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd < 0) continue;
            shm_peer_t peer;
            char e[SHM_ERR_LEN];
            if (shm_check_peer(fd, &s->unix_peers, &peer, e, sizeof e) != 0) {
                log_warn("rpc: %s: %s", s->upath[i], e);
                close(fd);
                continue;
            }
            if (atomic_load(&s->acc_stop)) {
                close(fd);
                break;
            }
            fd_peer_note(s, fd, &peer);
            grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
            grpc_server_add_channel_from_fd(s->gs, fd, cr); /* gRPC owns fd now */
            grpc_server_credentials_release(cr);
        }
    }
    return NULL;
}

/* socket + bind + 0660 (+ group) + listen on a Unix path; a stale socket
 * file (the caller holds the path's lock) is replaced. */
static int unix_listen(rpc_server_t *s, const char *path, char *err, size_t errlen) {
    if (s->nunix >= MAX_UNIX_LISTENERS) {
        errbuf_set(err, errlen, "rpc server: more than %d Unix listeners", MAX_UNIX_LISTENERS);
        return -1;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            errbuf_set(err, errlen, "rpc server: %s exists and is not a socket; remove it or pick "
                       "another path", path);
            return -1;
        }
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    char e[SHM_ERR_LEN] = "";
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        errbuf_set(err, errlen, "rpc server: cannot listen on unix:%s: %s (missing directory or no "
                   "permission?); pick another address", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (shm_socket_access(path, s->unix_group_set, s->unix_gid, e, sizeof e) != 0 ||
        listen(fd, SOMAXCONN) < 0) {
        errbuf_set(err, errlen, "rpc server: unix:%s: %s", path, e[0] ? e : strerror(errno));
        close(fd);
        unlink(path);
        return -1;
    }
    s->ufd[s->nunix] = fd;
    snprintf(s->upath[s->nunix], sizeof s->upath[0], "%s", path);
    s->nunix++;
    return 0;
}

static void unix_stop(rpc_server_t *s) {
    atomic_store(&s->acc_stop, true);
    if (s->acc_started) pthread_join(s->acc_tid, NULL);
    s->acc_started = false;
    for (int i = 0; i < s->nunix; i++) {
        if (s->ufd[i] >= 0) {
            close(s->ufd[i]);
            unlink(s->upath[i]);
        }
        s->ufd[i] = -1;
    }
}

/* The whole of a PEM file as a string (malloc'ed); NULL with a message. */
static char *read_pem(const char *what, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        errbuf_set(err, errlen, "%s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    if (b) n = fread(b, 1, cap, f);
    bool more = b && fgetc(f) != EOF;
    fclose(f);
    if (!b || more || n == 0) {
        errbuf_set(err, errlen, "%s %s: %s", what, path,
                   !b ? "out of memory" : more ? "larger than 64 KiB; is it a PEM file?" : "empty");
        free(b);
        return NULL;
    }
    b[n] = 0;
    if (!strstr(b, "-----BEGIN ")) {
        errbuf_set(err, errlen, "%s %s holds no PEM block (-----BEGIN ...)", what, path);
        free(b);
        return NULL;
    }
    return b;
}

/* ---- server: lifecycle ---- */

rpc_server_t *rpc_server_new(const rpc_server_opts_t *opts, char *err, size_t errlen) {
    rpc_server_opts_t o = opts ? *opts : (rpc_server_opts_t){0};
    if (o.threads < 0 || o.threads > 256) {
        errbuf_set(err, errlen, "rpc server: %d threads is out of range; use 1..256 (0 = %d)", o.threads,
             RPC_DEFAULT_THREADS);
        return NULL;
    }
    if (o.max_msg_bytes > (size_t)INT32_MAX) {
        errbuf_set(err, errlen, "rpc server: max message size %zu bytes is over gRPC's limit of %d",
             o.max_msg_bytes, INT32_MAX);
        return NULL;
    }
    rpc_server_t *s = calloc(1, sizeof *s);
    if (!s) {
        errbuf_set(err, errlen, "rpc server: out of memory");
        return NULL;
    }
    /* N handler threads and, with more than one, one more that waits on the
     * completion queue (threads[0]) */
    s->nthreads = o.threads ? o.threads : RPC_DEFAULT_THREADS;
    if (s->nthreads > 1) s->nthreads++;
    s->max_msg = o.max_msg_bytes ? o.max_msg_bytes : RPC_DEFAULT_MAX_MSG;
    if (o.unix_peers) s->unix_peers = *o.unix_peers;
    else shm_uidset_default(&s->unix_peers);
    s->unix_group_set = o.unix_group_set;
    s->unix_gid = o.unix_gid;
    for (int i = 0; i < MAX_UNIX_LISTENERS; i++) s->ufd[i] = -1;
    atomic_init(&s->acc_stop, false);
    if ((o.tls_cert != NULL) != (o.tls_key != NULL) || (o.tls_ca && !o.tls_cert)) {
        errbuf_set(err, errlen, "rpc server: TLS needs both a certificate and its key (and a CA only "
                   "with them)");
        free(s);
        return NULL;
    }
    if (o.tls_cert && (!(s->tls_cert = read_pem("TLS certificate", o.tls_cert, err, errlen)) ||
                       !(s->tls_key = read_pem("TLS key", o.tls_key, err, errlen)) ||
                       (o.tls_ca && !(s->tls_ca = read_pem("TLS CA", o.tls_ca, err, errlen))))) {
        free(s->tls_cert);
        free(s->tls_key);
        free(s);
        return NULL;
    }
    s->threads = calloc((size_t)s->nthreads, sizeof *s->threads);
    if (!s->threads) {
        free(s->tls_cert);
        free(s->tls_key);
        free(s->tls_ca);
        free(s);
        errbuf_set(err, errlen, "rpc server: out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->fdp_mu, NULL);
    clock_cond_init(&s->cv);
    pthread_mutex_init(&s->hq_mu, NULL);
    pthread_cond_init(&s->hq_cv, NULL);
    atomic_init(&s->calls, 0);

    grpc_init();
    grpc_arg args[2] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)s->max_msg},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = (int)s->max_msg},
    };
    grpc_channel_args ca = {.num_args = 2, .args = args};
    s->gs = grpc_server_create(&ca, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->gs, s->cq, NULL);
    for (int i = 0; i < s->nthreads; i++) {
        srv_thread_t *th = &s->threads[i];
        th->srv = s;
        th->index = i;
        th->cq = s->cq;
    }
    rpc_server_set_health(s, "", RPC_HEALTH_SERVING);
    rpc_method_t hm = {HEALTH_CHECK_PATH, &grpc__health__v1__health_check_request__descriptor,
                       &grpc__health__v1__health_check_response__descriptor, health_check, s, true};
    if (rpc_server_add_method(s, &hm, err, errlen) != 0) {
        rpc_server_free(s);
        return NULL;
    }
    return s;
}

int rpc_server_add_method(rpc_server_t *s, const rpc_method_t *m, char *err, size_t errlen) {
    if (s->started) {
        errbuf_set(err, errlen, "rpc server: add method %s before rpc_server_start", m->path);
        return -1;
    }
    if (!path_ok(m->path)) {
        errbuf_set(err, errlen, "rpc server: method path \"%s\" is malformed; write \"/pkg.Service/Method\"",
             m->path ? m->path : "(null)");
        return -1;
    }
    if (!m->req_desc || !m->resp_desc || !m->handler ||
        m->req_desc->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC ||
        m->resp_desc->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC) {
        errbuf_set(err, errlen, "rpc server: method %s needs a handler and request/response message "
             "descriptors", m->path);
        return -1;
    }
    for (size_t i = 0; i < s->nmethods; i++) {
        if (strcmp(s->methods[i].path, m->path) == 0) {
            errbuf_set(err, errlen, "rpc server: method %s registered twice", m->path);
            return -1;
        }
    }
    if (s->nmethods == s->cap_methods) {
        size_t cap = s->cap_methods ? 2 * s->cap_methods : 8;
        srv_method_t *nm = realloc(s->methods, cap * sizeof *nm);
        if (!nm) goto oom;
        s->methods = nm;
        s->cap_methods = cap;
    }
    srv_method_t e = {.path = strdup(m->path), .req_desc = m->req_desc,
                      .resp_desc = m->resp_desc, .handler = m->handler, .user = m->user,
                      .quick = m->quick};
    if (!e.path) goto oom;
    e.handle = grpc_server_register_method(s->gs, e.path, NULL,
                                           GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (!e.handle) {
        errbuf_set(err, errlen, "rpc server: gRPC refused to register method %s", m->path);
        free(e.path);
        return -1;
    }
    s->methods[s->nmethods++] = e;
    return 0;
oom:
    errbuf_set(err, errlen, "rpc server: out of memory adding method %s", m->path);
    return -1;
}

int rpc_server_add_methods(rpc_server_t *s, const rpc_method_t *m, size_t n, char *err,
                           size_t errlen) {
    for (size_t i = 0; i < n; i++)
        if (rpc_server_add_method(s, &m[i], err, errlen) != 0) return -1;
    return 0;
}

/* Check the shape of a listen address: "unix:/path", "unix:path",
 * "unix-abstract:name", or "host:port" / "[v6]:port" with port 0..65535. */
static bool addr_ok(const char *addr, char *why, size_t whylen) {
    if (!addr || !*addr) {
        errbuf_set(why, whylen, "empty address");
        return false;
    }
    if (strncmp(addr, "unix:", 5) == 0 || strncmp(addr, "unix-abstract:", 14) == 0) {
        const char *p = strchr(addr, ':') + 1;
        if (!*p) {
            errbuf_set(why, whylen, "no socket path after \"unix:\"");
            return false;
        }
        if (strncmp(addr, "unix:", 5) == 0 && strlen(p) >= 108) {
            errbuf_set(why, whylen, "socket path is %zu bytes; Unix sockets allow 107", strlen(p));
            return false;
        }
        return true;
    }
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || !colon[1]) {
        errbuf_set(why, whylen, "expected \"host:port\" or \"unix:/path\"");
        return false;
    }
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (*end || errno || port < 0 || port > 65535) {
        errbuf_set(why, whylen, "port \"%s\" is not a number in 0..65535", colon + 1);
        return false;
    }
    return true;
}

int rpc_server_listen(rpc_server_t *s, const char *addr, int *bound_port, char *err,
                      size_t errlen) {
    char why[160];
    if (s->started) {
        errbuf_set(err, errlen, "rpc server: listen on %s before rpc_server_start", addr);
        return -1;
    }
    if (!addr_ok(addr, why, sizeof why)) {
        errbuf_set(err, errlen, "rpc server: bad listen address \"%s\": %s", addr ? addr : "(null)", why);
        return -1;
    }
    if (strncmp(addr, "unix:", 5) == 0) {
        if (unix_listen(s, addr + 5, err, errlen) != 0) return -1;
        s->nlisteners++;
        if (bound_port) *bound_port = 0;
        return 0;
    }
    grpc_server_credentials *cr;
    if (s->tls_cert && strncmp(addr, "unix", 4) != 0) {
        grpc_ssl_pem_key_cert_pair kp = {s->tls_key, s->tls_cert};
        cr = grpc_ssl_server_credentials_create_ex(
            s->tls_ca, &kp, 1,
            s->tls_ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                      : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, NULL);
    } else {
        cr = grpc_insecure_server_credentials_create();
    }
    int port = cr ? grpc_server_add_http2_port(s->gs, addr, cr) : 0;
    grpc_server_credentials_release(cr);
    if (port == 0) {
        errbuf_set(err, errlen, "rpc server: cannot listen on %s (address in use, no permission, or "
             "missing directory?); pick another address", addr);
        return -1;
    }
    s->nlisteners++;
    if (bound_port) *bound_port = strncmp(addr, "unix", 4) == 0 ? 0 : port;
    return 0;
}

int rpc_server_start(rpc_server_t *s, char *err, size_t errlen) {
    if (s->started) {
        errbuf_set(err, errlen, "rpc server: already started");
        return -1;
    }
    if (s->nlisteners == 0) {
        errbuf_set(err, errlen, "rpc server: no address to listen on; call rpc_server_listen first");
        return -1;
    }
    grpc_server_start(s->gs);
    s->started = true;
    if (s->nunix) {
        int rc = pthread_create(&s->acc_tid, NULL, unix_acceptor, s);
        if (rc != 0) {
            errbuf_set(err, errlen, "rpc server: cannot start the Unix acceptor: %s", strerror(rc));
            rpc_server_stop(s, 0);
            return -1;
        }
        s->acc_started = true;
    }
    /* Initial requests are posted here, before the threads exist, so a stop
     * that follows at once still finds them on the queues. */
    for (int i = 0; i < s->nthreads; i++) {
        post_request(&s->threads[i], -1);
        for (size_t m = 0; m < s->nmethods; m++) post_request(&s->threads[i], (int)m);
    }
    for (int i = 0; i < s->nthreads; i++) {
        srv_thread_t *th = &s->threads[i];
        int rc = pthread_create(&th->tid, NULL, i == 0 ? server_thread : handler_thread, th);
        if (rc != 0) {
            errbuf_set(err, errlen, "rpc server: cannot start thread %d: %s", i, strerror(rc));
            rpc_server_stop(s, 0);
            return -1;
        }
        th->started = true;
    }
    return 0;
}

/* Wait until the shutdown notification came and no call is live, or until
 * abs_deadline (common/clock.h's clock; NULL = forever). True when both happened. */
static bool wait_quiet(rpc_server_t *s, const struct timespec *abs_deadline) {
    bool done;
    pthread_mutex_lock(&s->mu);
    while (!(done = s->notified && s->live_calls == 0)) {
        if (!abs_deadline) {
            pthread_cond_wait(&s->cv, &s->mu);
        } else if (pthread_cond_timedwait(&s->cv, &s->mu, abs_deadline) == ETIMEDOUT) {
            done = s->notified && s->live_calls == 0;
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return done;
}

static void drain_cq(rpc_server_t *s);

/* Let the handler threads finish the queue and join them. */
static void stop_handlers(rpc_server_t *s) {
    pthread_mutex_lock(&s->hq_mu);
    s->hq_stop = true;
    pthread_cond_broadcast(&s->hq_cv);
    pthread_mutex_unlock(&s->hq_mu);
    for (int i = 1; i < s->nthreads; i++)
        if (s->threads[i].started) pthread_join(s->threads[i].tid, NULL);
}

void rpc_server_stop(rpc_server_t *s, int grace_ms) {
    if (!s || s->stopped) return;
    s->stopped = true;
    unix_stop(s); /* no new connection reaches gRPC once it shuts down */
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);

    grpc_server_shutdown_and_notify(s->gs, s->cq, &s->shutdown_tag);
    if (s->started && s->threads[0].started) {
        struct timespec dl = clock_after((grace_ms > 0 ? grace_ms : 0) * 1e-3);
        if (!wait_quiet(s, &dl)) {
            grpc_server_cancel_all_calls(s->gs);
            wait_quiet(s, NULL);
        }
        /* the polling thread drains the queue and returns at its shutdown;
         * no call is live, so the handler queue is empty */
        grpc_completion_queue_shutdown(s->cq);
        pthread_join(s->threads[0].tid, NULL);
        stop_handlers(s);
        return;
    }
    /* Never served (or the polling thread did not start): drain the queue
     * here, shutting it down once the shutdown tag came. */
    grpc_server_cancel_all_calls(s->gs);
    stop_handlers(s);
    drain_cq(s);
}

/* Take every event off the (shut down or shutting down) queue and free its
 * call, shutting the queue down once the shutdown tag came. */
static void drain_cq(rpc_server_t *s) {
    for (bool down = false;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        if (ev.tag != &s->shutdown_tag) {
            TAG_RETURNED(ev.tag);
            sc_free(ev.tag);
        } else if (!down) {
            down = true;
            grpc_completion_queue_shutdown(s->cq);
        }
    }
}

void rpc_server_free(rpc_server_t *s) {
    if (!s) return;
    if (s->gs) {
        rpc_server_stop(s, 0);
        grpc_server_destroy(s->gs);
    }
    unix_stop(s);
    free(s->tls_cert);
    free(s->tls_key);
    free(s->tls_ca);
    if (s->cq) grpc_completion_queue_destroy(s->cq);
    for (size_t i = 0; i < s->nmethods; i++) free(s->methods[i].path);
    free(s->methods);
    for (size_t i = 0; i < s->nhealth; i++) free(s->health[i].service);
    free(s->health);
    free(s->threads);
    free(s->fdp);
    pthread_mutex_destroy(&s->fdp_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->hq_mu);
    pthread_cond_destroy(&s->hq_cv);
    free(s);
    grpc_shutdown();
}

uint64_t rpc_server_calls(const rpc_server_t *s) {
    return atomic_load(&((rpc_server_t *)s)->calls);
}

/* ---- client ---- */

#define CLIENT_SPARE_CQS 8        /* idle completion queues kept for reuse */
#define CLIENT_METHODS   64       /* registered method paths kept per client */

typedef struct {
    char *path;                  /* "/pkg.Service/Method" */
    void *handle;                /* grpc_channel_register_call's, owned by the channel */
} client_method_t;

/* Calls reuse what outlives one call: completion queues (a stack of idle
 * ones, one taken per call in flight, so concurrent callers never share a
 * queue) and the registered handle of each method path (so a call does not
 * intern its path again). A grpc_call itself serves one RPC only. */
struct rpc_client {
    char *addr;                  /* as given */
    grpc_channel *ch;
    bool private_;               /* TLS or a Unix socket */
    pthread_mutex_t mu;          /* guards spare and methods */
    grpc_completion_queue *spare[CLIENT_SPARE_CQS];
    int nspare;
    client_method_t methods[CLIENT_METHODS];
    int nmethods;
};

bool rpc_client_private(const rpc_client_t *c) { return c && c->private_; }

rpc_client_t *rpc_client_open(const char *addr, const rpc_client_opts_t *opts, char *err,
                              size_t errlen) {
    char why[160];
    if (!addr_ok(addr, why, sizeof why)) {
        errbuf_set(err, errlen, "rpc client: bad address \"%s\": %s", addr ? addr : "(null)", why);
        return NULL;
    }
    size_t max = opts && opts->max_msg_bytes ? opts->max_msg_bytes : CLIENT_DEFAULT_MAX_MSG;
    if (max > (size_t)INT32_MAX) {
        errbuf_set(err, errlen, "rpc client: max message size %zu bytes is over gRPC's limit of %d", max,
             INT32_MAX);
        return NULL;
    }
    rpc_client_t *c = calloc(1, sizeof *c);
    if (!c || !(c->addr = strdup(addr))) {
        free(c);
        errbuf_set(err, errlen, "rpc client: out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    grpc_init();
    /* Node-local services restart quickly: keep reconnect backoff short so a
     * wait-for-ready call notices a restarted server within about a second. */
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)max},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = -1},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, .value.integer = 1},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
         .value.integer = 100},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 1000},
    };
    grpc_channel_args ca = {.num_args = sizeof args / sizeof args[0], .args = args};
    bool is_unix = strncmp(addr, "unix", 4) == 0;
    grpc_channel_credentials *cr = NULL;
    if (opts && opts->tls_ca && !is_unix) {
        char *ca_pem = read_pem("TLS CA", opts->tls_ca, err, errlen), *cert = NULL, *key = NULL;
        if (ca_pem && (opts->tls_cert != NULL) != (opts->tls_key != NULL))
            errbuf_set(err, errlen, "rpc client: a TLS client certificate needs its key, and the key its "
                       "certificate");
        else if (ca_pem && opts->tls_cert && (!(cert = read_pem("TLS certificate", opts->tls_cert, err, errlen)) ||
                                              !(key = read_pem("TLS key", opts->tls_key, err, errlen))))
            ;
        else if (ca_pem) {
            grpc_ssl_pem_key_cert_pair kp = {key, cert};
            cr = grpc_ssl_credentials_create(ca_pem, cert ? &kp : NULL, NULL, NULL);
        }
        free(ca_pem);
        free(cert);
        free(key);
        if (!cr) {
            free(c->addr);
            free(c);
            grpc_shutdown();
            return NULL;
        }
        c->private_ = true;
    } else {
        cr = grpc_insecure_credentials_create();
        c->private_ = is_unix;
    }
    c->ch = grpc_channel_create(addr, cr, &ca);
    grpc_channel_credentials_release(cr);
    if (!c->ch) {
        errbuf_set(err, errlen, "rpc client: cannot create a channel to %s", addr);
        free(c->addr);
        free(c);
        grpc_shutdown();
        return NULL;
    }
    return c;
}

void rpc_client_close(rpc_client_t *c) {
    if (!c) return;
    for (int i = 0; i < c->nspare; i++) {
        grpc_completion_queue_shutdown(c->spare[i]);
        grpc_completion_queue_destroy(c->spare[i]);
    }
    for (int i = 0; i < c->nmethods; i++) free(c->methods[i].path);
    grpc_channel_destroy(c->ch);
    pthread_mutex_destroy(&c->mu);
    free(c->addr);
    free(c);
    grpc_shutdown();
}

const char *rpc_client_addr(const rpc_client_t *c) { return c->addr; }

/* An idle completion queue for one call (a spare one, or a new one). */
static grpc_completion_queue *cq_take(rpc_client_t *c) {
    grpc_completion_queue *cq = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->nspare) cq = c->spare[--c->nspare];
    pthread_mutex_unlock(&c->mu);
    return cq ? cq : grpc_completion_queue_create_for_pluck(NULL);
}

/* Hand back a queue whose call has completed and been unreffed (nothing is
 * pending on it); beyond CLIENT_SPARE_CQS it is destroyed. */
static void cq_give(rpc_client_t *c, grpc_completion_queue *cq) {
    pthread_mutex_lock(&c->mu);
    if (c->nspare < CLIENT_SPARE_CQS) {
        c->spare[c->nspare++] = cq;
        cq = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (cq) {
        grpc_completion_queue_shutdown(cq);
        grpc_completion_queue_destroy(cq);
    }
}

/* The channel's registered handle for method, registering it on first use
 * (only a well-formed path is registered, so a path found here needs no
 * check); NULL when the table is full or out of memory (the call then
 * names its path itself). */
static void *method_handle(rpc_client_t *c, const char *method) {
    void *h = NULL;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->nmethods && !h; i++)
        if (strcmp(c->methods[i].path, method) == 0) h = c->methods[i].handle;
    if (!h && c->nmethods < CLIENT_METHODS && path_ok(method)) {
        char *p = strdup(method);
        if (p && (h = grpc_channel_register_call(c->ch, p, NULL, NULL)))
            c->methods[c->nmethods++] = (client_method_t){ p, h };
        else
            free(p);
    }
    pthread_mutex_unlock(&c->mu);
    return h;
}

/* The one call path: send req_bb, receive the status and, on OK, the
 * response bytes in *out (caller unrefs; empty slice when none). */
static grpc_status_code call_bb(rpc_client_t *c, const char *method, grpc_byte_buffer *req_bb,
                                grpc_slice *out, int64_t deadline_ms, bool wait_for_ready,
                                char *msg, size_t msglen) {
    *out = grpc_empty_slice();
    void *mh = method ? method_handle(c, method) : NULL;
    if (!mh && !path_ok(method)) {
        errbuf_set(msg, msglen, "rpc %s to %s: malformed method path; write \"/pkg.Service/Method\"",
             method ? method : "(null)", c->addr);
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    gpr_timespec dl = deadline_ms > 0
                          ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(deadline_ms, GPR_TIMESPAN))
                          : gpr_inf_future(GPR_CLOCK_MONOTONIC);
    grpc_completion_queue *cq = cq_take(c);
    grpc_call *call;
    if (mh) {
        call = grpc_channel_create_registered_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, mh, dl, NULL);
    } else {
        grpc_slice mslice = grpc_slice_from_copied_string(method);
        call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, mslice, NULL, dl, NULL);
        grpc_slice_unref(mslice);
    }

    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_byte_buffer *resp_bb = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].flags = GRPC_INITIAL_METADATA_WAIT_FOR_READY_EXPLICITLY_SET |
                   (wait_for_ready ? GRPC_INITIAL_METADATA_WAIT_FOR_READY : 0);
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &resp_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;

    int tag;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, &tag, NULL);
    if (e != GRPC_CALL_OK) {
        status = GRPC_STATUS_INTERNAL;
        errbuf_set(msg, msglen, "rpc %s to %s: cannot start the call (grpc_call_error %d)", method,
             c->addr, (int)e);
    } else {
        grpc_event ev = grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME),
                                                    NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
            status = GRPC_STATUS_INTERNAL;
            errbuf_set(msg, msglen, "rpc %s to %s: the call's batch failed", method, c->addr);
        } else if (status != GRPC_STATUS_OK) {
            errbuf_set(msg, msglen, "rpc %s to %s: %s: %.*s", method, c->addr, rpc_status_name(status),
                 (int)GRPC_SLICE_LENGTH(details), (const char *)GRPC_SLICE_START_PTR(details));
        } else if (resp_bb && !bb_flatten(resp_bb, out)) {
            status = GRPC_STATUS_INTERNAL;
            errbuf_set(msg, msglen, "rpc %s to %s: cannot read the response", method, c->addr);
        } else if (!resp_bb) {
            status = GRPC_STATUS_INTERNAL;
            errbuf_set(msg, msglen, "rpc %s to %s: server answered OK without a message", method,
                 c->addr);
        } else if (msglen) {
            msg[0] = '\0';
        }
    }

    if (resp_bb) grpc_byte_buffer_destroy(resp_bb);
    grpc_slice_unref(details);
    if (error_string) gpr_free((void *)error_string);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_call_unref(call);
    cq_give(c, cq);
    return status;
}

grpc_status_code rpc_call_raw(rpc_client_t *c, const char *method, const void *req,
                              size_t req_len, void **resp, size_t *resp_len, int64_t deadline_ms,
                              bool wait_for_ready, char *msg, size_t msglen) {
    *resp = NULL;
    *resp_len = 0;
    grpc_slice s = grpc_slice_from_copied_buffer(req, req_len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_slice out;
    grpc_status_code st = call_bb(c, method, bb, &out, deadline_ms, wait_for_ready, msg, msglen);
    grpc_byte_buffer_destroy(bb);
    if (st == GRPC_STATUS_OK) {
        size_t n = GRPC_SLICE_LENGTH(out);
        void *p = malloc(n ? n : 1);
        if (!p) {
            st = GRPC_STATUS_RESOURCE_EXHAUSTED;
            errbuf_set(msg, msglen, "rpc %s to %s: out of memory for a %zu-byte response", method,
                 c->addr, n);
        } else {
            memcpy(p, GRPC_SLICE_START_PTR(out), n);
            *resp = p;
            *resp_len = n;
        }
    }
    grpc_slice_unref(out);
    return st;
}

grpc_status_code rpc_call(rpc_client_t *c, const char *method, const ProtobufCMessage *req,
                          const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                          int64_t deadline_ms, bool wait_for_ready, char *msg, size_t msglen) {
    *resp = NULL;
    grpc_byte_buffer *bb = pack_msg(req);
    if (!bb) {
        errbuf_set(msg, msglen, "rpc %s to %s: cannot pack the %s request", method, c->addr,
             req->descriptor->name);
        return GRPC_STATUS_INTERNAL;
    }
    grpc_slice out;
    grpc_status_code st = call_bb(c, method, bb, &out, deadline_ms, wait_for_ready, msg, msglen);
    grpc_byte_buffer_destroy(bb);
    if (st == GRPC_STATUS_OK) {
        *resp = protobuf_c_message_unpack(resp_desc, NULL, GRPC_SLICE_LENGTH(out),
                                          GRPC_SLICE_START_PTR(out));
        if (!*resp) {
            st = GRPC_STATUS_INTERNAL;
            errbuf_set(msg, msglen, "rpc %s to %s: the %zu-byte response does not parse as %s", method,
                 c->addr, (size_t)GRPC_SLICE_LENGTH(out), resp_desc->name);
        }
    }
    grpc_slice_unref(out);
    return st;
}
