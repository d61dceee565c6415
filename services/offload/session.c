/* session.c: ballastd's sessions: table, authentication, leases, the fd
 * socket handshake and the ring threads. See session.h.
 *
 * Locking: m->mu guards the session list and every sess_t field that is not
 * atomic. A session is unlinked from the list under m->mu before it is torn
 * down, so lookups never see a dying session; its ring thread is joined
 * before the struct is freed. A session being attached (s->attaching) is
 * never torn down by the reaper; sess_close waits for the attachment. */
#include "services/offload/session.h"
#include "clock.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "errbuf.h"
#include "job_name.h"
#include "log.h"
#include "ring.h"
#include "shm.h"
#include "proto/offload_ring.h"
#include "services/offload/gap.h"

#define RING_BATCH        32     /* entries popped per wakeup */
#define RING_POLL_MS      100    /* ring threads re-check their stop flag this often */
#define ATTACH_TIMEOUT_MS 2000   /* a client must send its attach message within this */
#define MAX_ATTACHING 64         /* fd-socket connections served at once */
#define MAX_LOGGED_ERRORS 8      /* bad ring entries logged per session (then counted only) */

/* ---- types ---- */

/* One gap class per op, and one each for a large PUT_ALLOC and GET
 * (services/offload/gap.h). */
#define GAP_CLASSES (RP_OP_MAX_ + 2)

typedef struct sess {
    struct sess *next;
    uint64_t sid;                       /* random, nonzero */
    uint64_t nonce;                     /* attach proof */
    uint64_t job_id;
    char job[JOB_NAME_MAX + 1];
    char client[SESS_NAME_MAX + 1];
    uint32_t rank;
    uint64_t quota;                     /* bytes, 0 = unlimited */
    bool shared;                        /* shared-memory mode requested */
    bool attached;                      /* ring created and thread running */
    bool attaching;                     /* fd handshake in progress */
    bool detached;                      /* closed with keep_blobs */
    pid_t pid;                          /* fd-socket peer */
    sess_caller_t owner;                /* who opened it; the only caller it answers */
    _Atomic int64_t last_ns;            /* last activity, CLOCK_MONOTONIC ns */
    _Atomic uint64_t ops, errors;
    _Atomic bool stop;                  /* ring thread: stop now */
    _Atomic bool finish;                /* ring thread: serve what is queued, then stop */
    _Atomic bool broken;                /* ring thread found the ring corrupt */
    uint32_t logged;                    /* bad entries logged so far */
    /* ring (attached only) */
    shm_seg_t ringseg;
    ring_t req, cpl;
    int efd[RP_FD_COUNT];               /* [RP_FD_RING] unused (ringseg.fd) */
    /* when the client's next request is due (ring_wait_data_at), learnt
     * per class of the request answered last (next_due, next_seen) */
    int64_t x_since;                    /* when that answer was pushed, ns; 0: none pending */
    uint32_t x_class;                   /* its class */
    uint64_t x_scale;                   /* the unit of that class's samples: the blob's KiB, or 1 */
    bool x_tried;                       /* ring_wait_data_at already ran for it */
    gap_class_t gaps[GAP_CLASSES];
    pthread_t thr;
    sess_mgr_t *m;
} sess_t;

struct sess_mgr {
    sess_config_t cfg;
    char fd_path[108];
    char token[SESS_TOKEN_MAX + 1];
    store_t *store;
    pthread_mutex_t mu;
    pthread_cond_t cv;                  /* attaching flags changed / stop */
    sess_t *list;
    uint32_t nsess;
    shm_uidset_t peers;                 /* allowed on the fd socket */
    _Atomic bool draining;
    _Atomic bool stopping;
    shm_listener_t lis;
    pthread_t acceptor, reaper;
    bool threads_started;
    int nconn;                          /* fd-socket connections being served (mu) */
    _Atomic uint64_t opened, expired, closed, ring_ops, ring_errors, quota_refusals;
};

/* ---- helpers ---- */

static void touch(sess_t *s) { atomic_store_explicit(&s->last_ns, clock_now_ns(), memory_order_relaxed); }

static uint64_t rand64(void) {
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
            /* getrandom cannot fail for 8 bytes after boot; mix the clock as a last resort */
            v = (uint64_t)clock_now_ns() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
        }
    }
    return v;
}

bool sess_client_name_ok(const char *s) {
    if (!s) return false;
    size_t n = strlen(s);
    if (n == 0 || n > SESS_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7e) return false;
    }
    return true;
}

bool sess_token_ok(const sess_mgr_t *m, const char *token) {
    if (!m->token[0]) return true;
    if (!token) token = "";
    size_t a = strlen(m->token), b = strlen(token);
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)(m->token[i] ^ (i < b ? token[i] : 0));
    return diff == 0;
}

/* Caller holds m->mu. */
static sess_t *find_locked(sess_mgr_t *m, uint64_t sid) {
    for (sess_t *s = m->list; s; s = s->next)
        if (s->sid == sid) return s;
    return NULL;
}

static void unlink_locked(sess_mgr_t *m, sess_t *s) {
    for (sess_t **pp = &m->list; *pp; pp = &(*pp)->next) {
        if (*pp == s) { *pp = s->next; m->nsess--; return; }
    }
}

/* Stop the ring thread (finish: serve queued entries first) and release the
 * ring. The session must be unlinked or otherwise unreachable by others. */
static void ring_teardown(sess_t *s, bool finish, bool running) {
    if (running) {
        if (finish) atomic_store(&s->finish, true);
        else atomic_store(&s->stop, true);
        ring_doorbell_notify(s->efd[RP_FD_REQ_DATA]);
        pthread_join(s->thr, NULL);
    }
    for (int i = 1; i < RP_FD_COUNT; i++) {
        if (s->efd[i] >= 0) close(s->efd[i]);
        s->efd[i] = -1;
    }
    shm_destroy(&s->ringseg);
}

/* Tear down an unlinked session and drop it from the store; when it was
 * its job's last session, the job's empty segments go back to the pool. */
static void sess_destroy(sess_mgr_t *m, sess_t *s, bool finish) {
    ring_teardown(s, finish, s->attached);
    store_drop_session(m->store, s->sid);
    uint64_t job = s->job_id;
    free(s);
    pthread_mutex_lock(&m->mu);
    bool others = false;
    for (sess_t *o = m->list; o && !others; o = o->next) others = o->job_id == job;
    pthread_mutex_unlock(&m->mu);
    if (!others) store_job_idle(m->store, job);
}

/* ---- ring processing ---- */

static uint32_t detail_of(status_t st) {
    switch (st) {
    case STATUS_NOT_FOUND: return RP_D_NO_KEY;
    case STATUS_ALREADY_EXISTS: return RP_D_EXISTS;
    case STATUS_QUOTA_EXCEEDED: return RP_D_OVER_QUOTA;
    case STATUS_JOB_QUOTA_EXCEEDED: return RP_D_JOB_QUOTA;
    case STATUS_NO_SPACE: return RP_D_POOL_FULL;
    case STATUS_DATA_LOSS: return RP_D_CRC;
    case STATUS_IO_ERROR: return RP_D_IO;
    case STATUS_UNAVAILABLE: return RP_D_DRAINING;
    case STATUS_NOT_HELD: return RP_D_NOT_HELD;
    default: return RP_D_NONE;
    }
}

/* A completion carries the wire value of st (proto/status.h) and the detail. */
static void cpl_fail(rp_cpl_t *c, status_t st, uint32_t detail) {
    c->status = (uint32_t)status_wire(st);
    c->detail = detail;
}

static void cpl_store(rp_cpl_t *c, status_t st) {
    if (st != STATUS_OK) cpl_fail(c, st, detail_of(st));
}

static bool region_held(sess_mgr_t *m, sess_t *s, const store_key_t *k, const rp_req_t *q) {
    if (q->length == 0 || q->offset + q->length < q->offset) return false;
    /* a segment of another job is refused before anything else is looked at */
    if (!pool_range_ok(store_pool(m->store), s->job_id, q->seg, q->offset, q->length)) return false;
    return store_session_holds(m->store, s->sid, k, q->seg, q->offset, q->length);
}

/* Validate one request and run it; fill *c. Never trusts any field of q. */
static void ring_process(sess_mgr_t *m, sess_t *s, const rp_req_t *q, rp_cpl_t *c) {
    char err[STORE_ERR_LEN] = "";
    memset(c, 0, sizeof *c);
    c->req_id = q->req_id;
    c->op = q->op;
    if (q->op == 0 || q->op >= RP_OP_MAX_) { cpl_fail(c, STATUS_INVALID_ARGUMENT, RP_D_BAD_OP); goto out; }
    if (q->reserved != 0) { cpl_fail(c, STATUS_INVALID_ARGUMENT, RP_D_BAD_PAD); goto out; }
    if ((q->flags & ~RP_FLAGS_KNOWN) || (q->flags && q->op != RP_OP_PUT_ALLOC)) {
        cpl_fail(c, STATUS_INVALID_ARGUMENT, RP_D_BAD_FLAGS);
        goto out;
    }
    if (q->op == RP_OP_NOP) goto out;
    if (q->kind < STORE_KIND_ACTIVATION || q->kind > STORE_KIND_OTHER) {
        cpl_fail(c, STATUS_INVALID_ARGUMENT, RP_D_BAD_KIND);
        goto out;
    }
    store_key_t k = { s->job_id, q->rank, q->kind, q->index, q->step };
    status_t st = STATUS_OK;
    switch (q->op) {
    case RP_OP_PUT_ALLOC: {
        if (q->length == 0 || q->length > m->cfg.max_blob) { cpl_fail(c, STATUS_INVALID_ARGUMENT, RP_D_BAD_LENGTH); break; }
        pool_region_t r;
        uint32_t fl = (q->flags & RP_FLAG_PERSISTENT) ? STORE_F_PERSISTENT : 0;
        st = store_put_alloc(m->store, s->sid, &k, q->length, fl, &r, err, sizeof err);
        if (st == STATUS_OK) { c->seg = r.seg; c->offset = r.off; c->length = q->length; }
        else if (st == STATUS_QUOTA_EXCEEDED || st == STATUS_JOB_QUOTA_EXCEEDED)
            atomic_fetch_add(&m->quota_refusals, 1);
        break;
    }
    case RP_OP_PUT_COMMIT: {
        if (!region_held(m, s, &k, q)) { cpl_fail(c, STATUS_INVALID_ARGUMENT, RP_D_BAD_REGION); break; }
        store_crc_t crc = { 0, false };
        st = store_put_commit(m->store, s->sid, &k, &crc, err, sizeof err);
        c->crc32c = crc.value;
        c->blob_flags = crc.known ? RP_CPL_CRC_KNOWN : 0;
        break;
    }
    case RP_OP_GET: {
        pool_region_t r;
        store_blob_info_t info;
        st = store_get(m->store, s->sid, &k, &r, &info, err, sizeof err);
        if (st == STATUS_OK) {
            c->seg = r.seg; c->offset = r.off; c->length = info.length; c->crc32c = info.crc32c;
            c->blob_flags = ((info.flags & STORE_F_PERSISTENT) ? RP_CPL_PERSISTENT : 0) |
                            (info.crc_known ? RP_CPL_CRC_KNOWN : 0);
        }
        break;
    }
    case RP_OP_GET_DONE:
        if (!region_held(m, s, &k, q)) { cpl_fail(c, STATUS_INVALID_ARGUMENT, RP_D_BAD_REGION); break; }
        st = store_get_done(m->store, s->sid, &k);
        break;
    case RP_OP_PREFETCH: st = store_prefetch(m->store, &k); break;
    case RP_OP_FREE: st = store_free(m->store, s->sid, &k); break;
    case RP_OP_PIN: st = store_pin(m->store, s->sid, &k, err, sizeof err); break;
    case RP_OP_UNPIN: st = store_unpin(m->store, s->sid, &k); break;
    default: cpl_fail(c, STATUS_INVALID_ARGUMENT, RP_D_BAD_OP); break;
    }
    cpl_store(c, st);
out:
    atomic_fetch_add_explicit(&s->ops, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->ring_ops, 1, memory_order_relaxed);
    if (c->status != STATUS_OK) {
        atomic_fetch_add_explicit(&s->errors, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&m->ring_errors, 1, memory_order_relaxed);
        /* client mistakes are normal traffic (e.g. NOT_FOUND); log a few at debug */
        if (s->logged < MAX_LOGGED_ERRORS && c->status != STATUS_NOT_FOUND) {
            s->logged++;
            log_debug("session %016llx: %s req %llu failed: status %u (%s)%s%s",
                      (unsigned long long)s->sid, rp_op_name(q->op), (unsigned long long)q->req_id,
                      c->status, rp_detail_text(c->detail), err[0] ? ": " : "", err);
        }
    }
    if (q->op != RP_OP_NOP) {
        store_session_stats_t ss;
        if (store_session_usage(m->store, s->sid, &ss) == STATUS_OK) c->used_bytes = ss.used_bytes;
    }
}

/* Push a completion, waiting for space while the session lives.
 * false when the session is stopping (the completion is dropped). */
static bool push_cpl(sess_t *s, const rp_cpl_t *c) {
    for (;;) {
        int rc = ring_push(&s->cpl, c);
        if (rc == 0) return true;
        if (rc != -EAGAIN) { atomic_store(&s->broken, true); return false; }
        if (atomic_load(&s->stop)) return false;
        rc = ring_wait_space(&s->cpl, RING_POLL_MS);
        if (rc == -EBADMSG) { atomic_store(&s->broken, true); return false; }
    }
}

/* The class of an answer just pushed, and the unit its gap is kept in. */
static void gap_expect(sess_t *s, const rp_cpl_t *c) {
    s->x_since = 0;
    if (c->op == 0 || c->op >= RP_OP_MAX_) return;
    s->x_class = c->op;
    s->x_scale = 1;
    if ((c->op == RP_OP_PUT_ALLOC || c->op == RP_OP_GET) && c->status == (uint32_t)status_wire(STATUS_OK) &&
        c->length >= (uint64_t)GAP_COPY_MIN_KIB << 10) {
        s->x_class = RP_OP_MAX_ + (c->op == RP_OP_GET);
        s->x_scale = c->length >> 10;
    }
    s->x_tried = false;
    s->x_since = clock_now_ns();
}

/* When the client's next request is due (absolute times), once per
 * answer; false: not worth waiting for in time (gap.h). */
static bool next_due(sess_t *s, int64_t *from, int64_t *to) {
    if (!s->x_since || s->x_tried) return false;
    s->x_tried = true;
    if (!gap_window(&s->gaps[s->x_class], s->x_scale, from, to)) return false;
    *from += s->x_since;
    *to += s->x_since;
    return true;
}

/* A request came: how long after the pending answer. */
static void next_seen(sess_t *s) {
    if (!s->x_since) return;
    gap_record(&s->gaps[s->x_class], clock_now_ns() - s->x_since, s->x_scale);
    s->x_since = 0;
}

static void *ring_main(void *arg) {
    sess_t *s = arg;
    sess_mgr_t *m = s->m;
    rp_req_t batch[RING_BATCH];
    for (;;) {
        if (atomic_load(&s->stop)) break;
        int n = ring_pop_batch(&s->req, batch, RING_BATCH);
        if (n < 0) {
            log_warn("session %016llx (job %s): request ring corrupt (%s); closing its ring",
                     (unsigned long long)s->sid, s->job, s->req.err);
            atomic_store(&s->broken, true);
            break;
        }
        if (n == 0) {
            if (atomic_load(&s->finish)) break;
            int64_t from, to;
            if (next_due(s, &from, &to)) {
                /* the client's next request is due (it copies a large
                 * blob, or does what it did after the last answers of
                 * this kind): be awake when it comes */
                int rc = ring_wait_data_at(&s->req, from, to);
                if (rc >= 0) gap_waited(&s->gaps[s->x_class], rc > 0);
                if (rc == -EBADMSG) {
                    log_warn("session %016llx (job %s): request ring corrupt (%s)",
                             (unsigned long long)s->sid, s->job, s->req.err);
                    atomic_store(&s->broken, true);
                    break;
                }
                if (rc > 0) continue;
            }
            if (m->cfg.ring_spin_us) {
                int64_t until = clock_now_ns() + (int64_t)m->cfg.ring_spin_us * 1000;
                while (ring_count(&s->req) == 0 && clock_now_ns() < until) {
                    __builtin_ia32_pause();
                }
                if (ring_count(&s->req)) continue;
            }
            int rc = ring_wait_data(&s->req, RING_POLL_MS);
            if (rc == -EBADMSG) {
                log_warn("session %016llx (job %s): request ring corrupt (%s)",
                         (unsigned long long)s->sid, s->job, s->req.err);
                atomic_store(&s->broken, true);
                break;
            }
            continue;
        }
        next_seen(s);
        touch(s);
        rp_cpl_t c;
        for (int i = 0; i < n; i++) {
            ring_process(m, s, &batch[i], &c);
            if (!push_cpl(s, &c)) goto done;
        }
        gap_expect(s, &c);
        touch(s);
    }
done:
    if (atomic_load(&s->broken)) atomic_store_explicit(&s->last_ns, 0, memory_order_relaxed);
    return NULL;
}

/* ---- fd socket: attaching a session ---- */

static int send_reply(int fd, status_t st, uint32_t nsegs, const char *msg) {
    rp_attach_reply_t rep;
    memset(&rep, 0, sizeof rep);
    rep.status = (uint32_t)status_wire(st);
    rep.nsegs = nsegs;
    snprintf(rep.msg, sizeof rep.msg, "%s", msg ? msg : "");
    char err[SHM_ERR_LEN];
    return shm_send_fds(fd, &rep, sizeof rep, NULL, 0, err, sizeof err);
}

/* Create the ring memfd and doorbells for s. 0 or -errno with a message. */
static int ring_create(sess_mgr_t *m, sess_t *s, char *err, size_t errlen) {
    uint32_t cap = m->cfg.ring_capacity;
    size_t rb = ring_bytes(cap, RING_PROTO_ENTRY_BYTES);
    uint64_t coff = ring_proto_comp_offset(rb);
    int rc = shm_create(&s->ringseg, "ballast-ring", ring_proto_comp_offset(coff + rb), 0, err, errlen);
    if (rc) return rc;
    uint8_t *base = s->ringseg.base;
    if ((rc = ring_init(base, rb, cap, RING_PROTO_ENTRY_BYTES, err, errlen)) ||
        (rc = ring_init(base + coff, rb, cap, RING_PROTO_ENTRY_BYTES, err, errlen)) ||
        (rc = ring_attach(&s->req, base, rb, RING_PROTO_ENTRY_BYTES, err, errlen)) ||
        (rc = ring_attach(&s->cpl, base + coff, rb, RING_PROTO_ENTRY_BYTES, err, errlen)))
        return rc;
    for (int i = 1; i < RP_FD_COUNT; i++)
        if ((rc = ring_doorbell_create(&s->efd[i], err, errlen))) return rc;
    ring_set_doorbells(&s->req, s->efd[RP_FD_REQ_DATA], s->efd[RP_FD_REQ_SPACE]);
    ring_set_doorbells(&s->cpl, s->efd[RP_FD_CPL_DATA], s->efd[RP_FD_CPL_SPACE]);
    return 0;
}

/* Send the segments in v[0..n) in chunks of RP_CHUNK_FDS. 0 or -errno. */
static int send_segments(int fd, const pool_seg_info_t *v, int n, char *err, size_t errlen) {
    for (int first = 0; first < n; first += RP_CHUNK_FDS) {
        int fds[RP_CHUNK_FDS];
        rp_fd_chunk_t ch;
        memset(&ch, 0, sizeof ch);
        ch.count = (uint32_t)(n - first < RP_CHUNK_FDS ? n - first : RP_CHUNK_FDS);
        for (uint32_t i = 0; i < ch.count; i++) {
            fds[i] = v[first + (int)i].fd;
            ch.seg[i] = v[first + (int)i].id;
            ch.bytes[i] = v[first + (int)i].bytes;
        }
        int rc = shm_send_fds(fd, &ch, sizeof ch, fds, (int)ch.count, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

/* A later segment for an attached session (rp_segment_req_t): only a
 * segment of the session's own job, only to the uid that owns the session. */
static void handle_segment(sess_mgr_t *m, int fd, const shm_peer_t *peer, const rp_segment_req_t *q) {
    char err[SHM_ERR_LEN] = "";
    pthread_mutex_lock(&m->mu);
    sess_t *s = find_locked(m, q->session_id);
    const char *why = NULL;
    status_t code = STATUS_OK;
    uint64_t job = 0;
    /* attaching too: the ring thread runs (and may have handed out a region
     * in a new segment) before the handshake thread marks the session attached */
    if (!s || s->detached || !(s->attached || s->attaching) || !s->shared) {
        why = "unknown or unattached session id: attach first";
        code = STATUS_NOT_FOUND;
    }
    else if (s->nonce != q->nonce) { why = "attach nonce does not match the session"; code = STATUS_PERMISSION_DENIED; }
    else if (s->owner.local && s->owner.uid != (uint32_t)peer->uid) { why = "session was opened by another uid"; code = STATUS_PERMISSION_DENIED; }
    else job = s->job_id;
    if (code == STATUS_OK) touch(s);
    pthread_mutex_unlock(&m->mu);
    pool_seg_info_t si = { 0, -1, 0 };
    if (code == STATUS_OK && pool_owner_seg(store_pool(m->store), job, q->seg, &si) != 0) {
        why = "no such segment of this session's job";
        code = STATUS_NOT_FOUND;
    }
    if (code != STATUS_OK) {
        log_warn("fd socket: pid %d uid %d: segment %u refused: %s", (int)peer->pid, (int)peer->uid, q->seg, why);
        send_reply(fd, code, 0, why);
        return;
    }
    if (send_reply(fd, STATUS_OK, 1, NULL) == 0 && send_segments(fd, &si, 1, err, sizeof err) != 0)
        log_warn("session %016llx: sending segment %u failed: %s", (unsigned long long)q->session_id, q->seg, err);
    close(si.fd);
}

/* Serve one connection on the fd socket: read the attach (or segment)
 * message, check it, send the job's segment fds and the ring fds, start the
 * ring thread. */
static void handle_attach(sess_mgr_t *m, int fd, const shm_peer_t *peer) {
    char err[SHM_ERR_LEN] = "";
    union { rp_attach_t att; rp_segment_req_t seg; } u;
    rp_attach_t att;
    size_t len = 0;
    int rc = shm_recv_fds(fd, &u, sizeof u, &len, NULL, 0, ATTACH_TIMEOUT_MS, err, sizeof err);
    if (rc) { log_warn("fd socket: pid %d: %s", (int)peer->pid, err); return; }
    if (len == sizeof u.seg && u.seg.magic == RP_SEGMENT_MAGIC && u.seg.version == RING_PROTO_VERSION) {
        handle_segment(m, fd, peer, &u.seg);
        return;
    }
    att = u.att;
    if (len != sizeof att || att.magic != RP_ATTACH_MAGIC || att.version != RING_PROTO_VERSION ||
        att.reserved) {
        log_warn("fd socket: pid %d sent a malformed attach message (%zu bytes)", (int)peer->pid, len);
        send_reply(fd, STATUS_INVALID_ARGUMENT, 0, "malformed attach message or ring protocol version "
                   "mismatch: use a client library that matches this ballastd");
        return;
    }
    pthread_mutex_lock(&m->mu);
    sess_t *s = find_locked(m, att.session_id);
    const char *why = NULL;
    status_t code = STATUS_OK;
    if (!s || s->detached) { why = "unknown session id (expired or closed): open a new session"; code = STATUS_NOT_FOUND; }
    else if (s->nonce != att.nonce) { why = "attach nonce does not match the session"; code = STATUS_PERMISSION_DENIED; }
    else if (s->owner.local && s->owner.uid != (uint32_t)peer->uid) { why = "session was opened by another uid"; code = STATUS_PERMISSION_DENIED; }
    else if (!s->shared) { why = "session was opened in remote mode (shared_memory=false)"; code = STATUS_FAILED_PRECONDITION; }
    else if (s->attached || s->attaching) { why = "session is already attached"; code = STATUS_FAILED_PRECONDITION; }
    else if (atomic_load(&m->stopping)) { why = "service is shutting down"; code = STATUS_UNAVAILABLE; }
    if (code == STATUS_OK) { s->attaching = true; s->pid = peer->pid; touch(s); }
    pthread_mutex_unlock(&m->mu);
    if (code != STATUS_OK) {
        log_warn("fd socket: pid %d uid %d: attach refused: %s", (int)peer->pid, (int)peer->uid, why);
        send_reply(fd, code, 0, why);
        return;
    }

    bool ok = false;
    pool_seg_info_t *segs = NULL;
    int nsegs = 0;
    if ((rc = ring_create(m, s, err, sizeof err))) {
        log_error("session %016llx: cannot create its ring: %s", (unsigned long long)s->sid, err);
        send_reply(fd, STATUS_RESOURCE_EXHAUSTED, 0, err);
        goto done;
    }
    /* only the segments of the session's own job */
    segs = calloc(POOL_MAX_SEGS, sizeof *segs);
    nsegs = segs ? pool_owner_segs(store_pool(m->store), s->job_id, segs, POOL_MAX_SEGS) : -ENOMEM;
    if (nsegs < 0) {
        snprintf(err, sizeof err, "cannot hand over the job's segments: %s", strerror(-nsegs));
        send_reply(fd, STATUS_RESOURCE_EXHAUSTED, 0, err);
        nsegs = 0;
        goto done;
    }
    if (send_reply(fd, STATUS_OK, (uint32_t)nsegs, NULL)) goto done;
    if (send_segments(fd, segs, nsegs, err, sizeof err)) goto fail_send;
    int rfds[RP_FD_COUNT];
    rfds[RP_FD_RING] = s->ringseg.fd;
    for (int i = 1; i < RP_FD_COUNT; i++) rfds[i] = s->efd[i];
    rp_fd_chunk_t ch;
    memset(&ch, 0, sizeof ch);
    ch.count = RP_FD_COUNT;
    ch.ring = 1;
    if (shm_send_fds(fd, &ch, sizeof ch, rfds, RP_FD_COUNT, err, sizeof err)) goto fail_send;
    s->m = m;
    if (pthread_create(&s->thr, NULL, ring_main, s) != 0) {
        log_error("session %016llx: cannot start its ring thread", (unsigned long long)s->sid);
        goto done;
    }
    ok = true;
    log_info("session %016llx (job %s rank %u) attached: pid %d, %d segment(s) of its job, ring of %u entries",
             (unsigned long long)s->sid, s->job, s->rank, (int)peer->pid, nsegs, m->cfg.ring_capacity);
    goto done;
fail_send:
    log_warn("session %016llx: sending fds failed: %s", (unsigned long long)s->sid, err);
done:
    for (int i = 0; i < nsegs; i++) close(segs[i].fd);
    free(segs);
    if (!ok) ring_teardown(s, false, false);
    pthread_mutex_lock(&m->mu);
    s->attached = ok;
    s->attaching = false;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

static bool owner_ok(const sess_t *s, const sess_caller_t *c) {
    if (s->owner.local) return c->local && c->uid == s->owner.uid;
    return !c->local;
}

bool sess_row_owned(const sess_row_t *r, const sess_caller_t *c) {
    if (r->owner_local) return c->local && c->uid == r->owner_uid;
    return !c->local;
}

/* The answer to a caller that does not own session sid (or names none). */
static status_t not_owner(uint64_t sid, char *err, size_t errlen) {
    errbuf_set(err, errlen, "no session %016llx of this caller (closed, expired, or opened by another "
               "user): open a new session", (unsigned long long)sid);
    return STATUS_NOT_FOUND;
}

status_t sess_check_owner(sess_mgr_t *m, uint64_t sid, const sess_caller_t *caller,
                          char *err, size_t errlen) {
    pthread_mutex_lock(&m->mu);
    sess_t *s = find_locked(m, sid);
    bool ok = s && owner_ok(s, caller);
    pthread_mutex_unlock(&m->mu);
    return ok ? STATUS_OK : not_owner(sid, err, errlen);
}

typedef struct {
    sess_mgr_t *m;
    int fd;
    shm_peer_t peer;
} conn_t;

/* One fd-socket connection, on its own thread: a client that connects and
 * sends nothing holds only this thread, for at most ATTACH_TIMEOUT_MS. */
static void *conn_main(void *arg) {
    conn_t *c = arg;
    sess_mgr_t *m = c->m;
    handle_attach(m, c->fd, &c->peer);
    close(c->fd);
    free(c);
    pthread_mutex_lock(&m->mu);
    m->nconn--;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* Accept connections and hand each to a thread of its own (at most
 * MAX_ATTACHING at once; past that a connection is refused with a reason),
 * so idle or slow clients cannot hold up another's attach. */
static void *acceptor_main(void *arg) {
    sess_mgr_t *m = arg;
    while (!atomic_load(&m->stopping)) {
        struct pollfd p = { m->lis.fd, POLLIN, 0 };
        int r = poll(&p, 1, 200);
        if (r <= 0) continue;
        int fd = -1;
        shm_peer_t peer;
        char err[SHM_ERR_LEN];
        int rc = shm_accept(m->lis.fd, &m->peers, &fd, &peer, err, sizeof err);
        if (rc == -EACCES) { log_warn("fd socket: %s", err); continue; }
        if (rc) { if (rc != -EAGAIN && rc != -EINTR) log_warn("fd socket: accept: %s", err); continue; }
        pthread_mutex_lock(&m->mu);
        bool room = m->nconn < MAX_ATTACHING;
        if (room) m->nconn++;
        pthread_mutex_unlock(&m->mu);
        conn_t *c = room ? malloc(sizeof *c) : NULL;
        pthread_attr_t at;
        pthread_t t;
        bool started = false;
        if (c && pthread_attr_init(&at) == 0) {
            *c = (conn_t){ m, fd, peer };
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            started = pthread_create(&t, &at, conn_main, c) == 0;
            pthread_attr_destroy(&at);
        }
        if (started) continue;
        free(c);
        if (room) {
            pthread_mutex_lock(&m->mu);
            m->nconn--;
            pthread_mutex_unlock(&m->mu);
        }
        log_warn("fd socket: pid %d: %s", (int)peer.pid, room ? "cannot start a thread for the connection"
                 : "too many connections attaching at once");
        send_reply(fd, STATUS_RESOURCE_EXHAUSTED, 0, room ? "ballastd cannot start a thread: retry"
                   : "too many clients attaching at once: retry in a moment");
        close(fd);
    }
    /* the connection threads use m: wait for them (each ends within its deadline) */
    pthread_mutex_lock(&m->mu);
    while (m->nconn > 0) pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* ---- lease expiry ---- */

static void *reaper_main(void *arg) {
    sess_mgr_t *m = arg;
    int64_t lease_ns = (int64_t)(m->cfg.lease_s * 1e9);
    int period_ms = (int)(m->cfg.lease_s * 1000 / 4);
    if (period_ms < 20) period_ms = 20;
    if (period_ms > 250) period_ms = 250;
    while (!atomic_load(&m->stopping)) {
        struct timespec ts = { period_ms / 1000, (long)(period_ms % 1000) * 1000000 };
        nanosleep(&ts, NULL);
        int64_t now = clock_now_ns();
        sess_t *dead = NULL;
        pthread_mutex_lock(&m->mu);
        for (sess_t *s = m->list, *nx; s; s = nx) {
            nx = s->next;
            if (s->attaching) continue;
            bool expire = false;
            if (s->detached) {
                store_session_stats_t ss;
                expire = store_session_usage(m->store, s->sid, &ss) != STATUS_OK || ss.blobs == 0;
            } else {
                expire = now - atomic_load_explicit(&s->last_ns, memory_order_relaxed) > lease_ns;
            }
            if (!expire) continue;
            unlink_locked(m, s);
            s->next = dead;
            dead = s;
        }
        pthread_mutex_unlock(&m->mu);
        while (dead) {
            sess_t *s = dead;
            dead = s->next;
            if (!s->detached) {
                atomic_fetch_add(&m->expired, 1);
                store_session_stats_t ss = { 0 };
                store_session_usage(m->store, s->sid, &ss);
                log_warn("session %016llx (job %s rank %u pid %d) %s: freeing its non-persistent "
                         "blobs (%llu bytes charged)", (unsigned long long)s->sid, s->job, s->rank,
                         (int)s->pid, atomic_load(&s->broken) ? "has a corrupt ring" : "lease expired",
                         (unsigned long long)ss.used_bytes);
            }
            sess_destroy(m, s, false);
        }
    }
    return NULL;
}

/* ---- lifetime ---- */

int sess_mgr_open(sess_mgr_t **out, const sess_config_t *cfg, store_t *store,
                  char *err, size_t errlen) {
    *out = NULL;
    if (!cfg->fd_socket || !cfg->fd_socket[0] || strlen(cfg->fd_socket) >= 108) {
        errbuf_set(err, errlen, "fd socket path '%s' is empty or longer than 107 bytes",
               cfg->fd_socket ? cfg->fd_socket : "");
        return -EINVAL;
    }
    uint32_t cap = cfg->ring_capacity;
    if (cap < 2 || cap > RING_PROTO_MAX_CAPACITY || (cap & (cap - 1))) {
        errbuf_set(err, errlen, "ring capacity %u must be a power of two in [2, %u]", cap, RING_PROTO_MAX_CAPACITY);
        return -EINVAL;
    }
    if (!(cfg->lease_s > 0)) { errbuf_set(err, errlen, "lease must be > 0 seconds"); return -EINVAL; }
    if (cfg->token && strlen(cfg->token) > SESS_TOKEN_MAX) {
        errbuf_set(err, errlen, "token longer than %d bytes", SESS_TOKEN_MAX);
        return -EINVAL;
    }
    sess_mgr_t *m = calloc(1, sizeof *m);
    if (!m) { errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    m->cfg = *cfg;
    snprintf(m->fd_path, sizeof m->fd_path, "%s", cfg->fd_socket);
    m->cfg.fd_socket = m->fd_path;
    snprintf(m->token, sizeof m->token, "%s", cfg->token ? cfg->token : "");
    m->cfg.token = NULL;
    uint64_t pmax = pool_max_alloc(store_pool(store));
    if (m->cfg.max_blob == 0 || m->cfg.max_blob > pmax) m->cfg.max_blob = pmax;
    m->store = store;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    m->lis.fd = -1;
    m->lis.lock_fd = -1;
    if (cfg->peers) m->peers = *cfg->peers;
    else shm_uidset_default(&m->peers);
    m->cfg.peers = NULL;
    int rc = shm_listen(&m->lis, m->fd_path, 64, err, errlen);
    if (!rc && (rc = shm_socket_access(m->fd_path, cfg->socket_group_set, cfg->socket_gid, err, errlen)))
        shm_listener_close(&m->lis);
    if (rc) { pthread_mutex_destroy(&m->mu); pthread_cond_destroy(&m->cv); free(m); return rc; }
    if (pthread_create(&m->acceptor, NULL, acceptor_main, m) != 0) {
        shm_listener_close(&m->lis);
        free(m);
        errbuf_set(err, errlen, "cannot start the fd socket thread");
        return -EAGAIN;
    }
    if (pthread_create(&m->reaper, NULL, reaper_main, m) != 0) {
        atomic_store(&m->stopping, true);
        pthread_join(m->acceptor, NULL);
        shm_listener_close(&m->lis);
        free(m);
        errbuf_set(err, errlen, "cannot start the lease thread");
        return -EAGAIN;
    }
    m->threads_started = true;
    *out = m;
    return 0;
}

void sess_mgr_close(sess_mgr_t *m) {
    if (!m) return;
    atomic_store(&m->stopping, true);
    if (m->threads_started) {
        pthread_join(m->acceptor, NULL);
        pthread_join(m->reaper, NULL);
    }
    shm_listener_close(&m->lis);
    pthread_mutex_lock(&m->mu);
    sess_t *all = m->list;
    m->list = NULL;
    m->nsess = 0;
    pthread_mutex_unlock(&m->mu);
    while (all) {
        sess_t *s = all;
        all = s->next;
        sess_destroy(m, s, true);
    }
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}

void sess_mgr_set_draining(sess_mgr_t *m) { atomic_store(&m->draining, true); }
bool sess_mgr_draining(const sess_mgr_t *m) { return atomic_load(&((sess_mgr_t *)m)->draining); }
double sess_lease(const sess_mgr_t *m) { return m->cfg.lease_s; }

/* ---- the calls behind the RPCs ---- */

status_t sess_open(sess_mgr_t *m, const char *job, uint32_t rank, uint64_t quota,
                   const char *token, bool shared, const char *client_name,
                   sess_open_info_t *info, char *err, size_t errlen) {
    sess_caller_t me = { true, (uint32_t)geteuid() };
    return sess_open_as(m, &me, job, rank, quota, token, shared, client_name, info, err, errlen);
}

status_t sess_open_as(sess_mgr_t *m, const sess_caller_t *caller, const char *job, uint32_t rank,
                      uint64_t quota, const char *token, bool shared, const char *client_name,
                      sess_open_info_t *info, char *err, size_t errlen) {
    memset(info, 0, sizeof *info);
    if (!sess_token_ok(m, token)) {
        errbuf_set(err, errlen, "token missing or wrong: pass the contents of ballastd's --token-file");
        return STATUS_UNAUTHENTICATED;
    }
    if (!job_name_ok(job)) {
        errbuf_set(err, errlen, "job name '%.80s' is invalid: use " JOB_NAME_RULE, job ? job : "");
        return STATUS_INVALID_ARGUMENT;
    }
    if (client_name && client_name[0] && !sess_client_name_ok(client_name)) {
        errbuf_set(err, errlen, "client name must be 1..%d printable ASCII characters", SESS_NAME_MAX);
        return STATUS_INVALID_ARGUMENT;
    }
    if (m->cfg.max_quota && quota > m->cfg.max_quota) {
        char a[32], b[32];
        snprintf(a, sizeof a, "%llu", (unsigned long long)quota);
        snprintf(b, sizeof b, "%llu", (unsigned long long)m->cfg.max_quota);
        errbuf_set(err, errlen, "requested quota %s bytes exceeds the service's --session-quota of %s bytes: "
               "ask for less (0 takes the default)", a, b);
        atomic_fetch_add(&m->quota_refusals, 1);
        return STATUS_RESOURCE_EXHAUSTED;
    }
    if (quota == 0) quota = m->cfg.default_quota;
    if (atomic_load(&m->draining) || atomic_load(&m->stopping)) {
        errbuf_set(err, errlen, "ballastd is draining and accepts no new sessions: retry on the new instance");
        return STATUS_UNAVAILABLE;
    }
    uint64_t job_id;
    char serr[STORE_ERR_LEN] = "";
    status_t st = store_job_id(m->store, job, &job_id, serr, sizeof serr);
    if (st != STATUS_OK) {
        errbuf_set(err, errlen, "job '%s': %s", job, serr[0] ? serr : status_word(st));
        return st;
    }
    bool none = true;
    pthread_mutex_lock(&m->mu);
    for (sess_t *o = m->list; o; o = o->next) none &= o->job_id != job_id;
    pthread_mutex_unlock(&m->mu);
    if (store_job_claim(m->store, job_id, caller->local, caller->uid, none) != STATUS_OK) {
        errbuf_set(err, errlen, "job '%s' belongs to another user: pick another job name", job);
        return STATUS_PERMISSION_DENIED;
    }
    sess_t *s = calloc(1, sizeof *s);
    if (!s) { errbuf_set(err, errlen, "out of memory"); return STATUS_RESOURCE_EXHAUSTED; }
    s->nonce = rand64();
    s->job_id = job_id;
    snprintf(s->job, sizeof s->job, "%s", job);
    snprintf(s->client, sizeof s->client, "%s", client_name ? client_name : "");
    s->rank = rank;
    s->quota = quota;
    s->shared = shared;
    s->owner = *caller;
    s->ringseg.fd = -1;
    for (int i = 0; i < RP_FD_COUNT; i++) s->efd[i] = -1;
    touch(s);
    pthread_mutex_lock(&m->mu);
    uint32_t live = 0; /* sessions closed with kept blobs hold no slot */
    for (sess_t *o = m->list; o; o = o->next) live += !o->detached;
    if (live >= m->cfg.max_sessions) {
        pthread_mutex_unlock(&m->mu);
        free(s);
        errbuf_set(err, errlen, "too many sessions (%u, --max-sessions): close idle ones or raise the limit",
               m->cfg.max_sessions);
        return STATUS_RESOURCE_EXHAUSTED;
    }
    do { s->sid = rand64(); } while (find_locked(m, s->sid));
    st = store_session_open(m->store, s->sid, quota);
    if (st != STATUS_OK) {
        pthread_mutex_unlock(&m->mu);
        free(s);
        errbuf_set(err, errlen, "cannot open a store session: %s", status_word(st));
        return st;
    }
    s->next = m->list;
    m->list = s;
    m->nsess++;
    /* s may expire and be freed as soon as the lock drops: copy out first */
    uint64_t sid = s->sid, nonce = s->nonce;
    char client[SESS_NAME_MAX + 1];
    memcpy(client, s->client, sizeof client);
    pthread_mutex_unlock(&m->mu);
    atomic_fetch_add(&m->opened, 1);

    size_t rb = ring_bytes(m->cfg.ring_capacity, RING_PROTO_ENTRY_BYTES);
    info->sid = sid;
    info->nonce = shared ? nonce : 0;
    info->job_id = job_id;
    info->quota = quota;
    info->ring_capacity = m->cfg.ring_capacity;
    info->cpl_offset = ring_proto_comp_offset(rb);
    info->ring_bytes = ring_proto_comp_offset(info->cpl_offset + rb); /* page-rounded memfd size */
    info->max_blob = m->cfg.max_blob;
    log_info("session %016llx opened: job %s rank %u%s%s, quota %llu bytes, %s mode",
             (unsigned long long)sid, job, rank, client[0] ? " client " : "", client,
             (unsigned long long)quota, shared ? "shared-memory" : "remote");
    return STATUS_OK;
}

status_t sess_close(sess_mgr_t *m, uint64_t sid, bool keep_blobs, uint64_t *freed_bytes,
                    char *err, size_t errlen) {
    if (freed_bytes) *freed_bytes = 0;
    pthread_mutex_lock(&m->mu);
    sess_t *s;
    for (;;) {
        s = find_locked(m, sid);
        if (!s || s->detached) {
            pthread_mutex_unlock(&m->mu);
            errbuf_set(err, errlen, "no session %016llx (closed or its lease expired)", (unsigned long long)sid);
            return STATUS_NOT_FOUND;
        }
        if (!s->attaching) break;
        pthread_cond_wait(&m->cv, &m->mu);
    }
    if (keep_blobs) {
        s->detached = true;
        bool att = s->attached;
        s->attached = false;
        s->attaching = true; /* keeps the reaper away while the ring goes */
        pthread_mutex_unlock(&m->mu);
        if (att) ring_teardown(s, true, true);
        pthread_mutex_lock(&m->mu);
        s->attaching = false;
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
    } else {
        unlink_locked(m, s);
        pthread_mutex_unlock(&m->mu);
        store_session_stats_t ss = { 0 };
        store_session_usage(m->store, sid, &ss);
        if (freed_bytes) *freed_bytes = ss.used_bytes;
        sess_destroy(m, s, true);
    }
    atomic_fetch_add(&m->closed, 1);
    log_info("session %016llx closed%s", (unsigned long long)sid, keep_blobs ? " (blobs kept)" : "");
    return STATUS_OK;
}

status_t sess_heartbeat(sess_mgr_t *m, uint64_t sid, const sess_caller_t *caller, double *lease_s,
                        uint64_t *used, uint64_t *quota, char *err, size_t errlen) {
    pthread_mutex_lock(&m->mu);
    sess_t *s = find_locked(m, sid);
    if (caller && !(s && owner_ok(s, caller))) {
        pthread_mutex_unlock(&m->mu);
        return not_owner(sid, err, errlen);
    }
    if (!s || s->detached) {
        pthread_mutex_unlock(&m->mu);
        errbuf_set(err, errlen, "no session %016llx (closed or its lease expired): open a new session",
               (unsigned long long)sid);
        return STATUS_NOT_FOUND;
    }
    touch(s);
    if (quota) *quota = s->quota;
    pthread_mutex_unlock(&m->mu);
    if (lease_s) *lease_s = m->cfg.lease_s;
    if (used) {
        store_session_stats_t ss = { 0 };
        store_session_usage(m->store, sid, &ss);
        *used = ss.used_bytes;
    }
    return STATUS_OK;
}

status_t sess_use(sess_mgr_t *m, uint64_t sid, uint64_t *job_id, char *err, size_t errlen) {
    pthread_mutex_lock(&m->mu);
    sess_t *s = find_locked(m, sid);
    if (!s || s->detached) {
        pthread_mutex_unlock(&m->mu);
        errbuf_set(err, errlen, "no session %016llx (closed or its lease expired): open a new session",
               (unsigned long long)sid);
        return STATUS_NOT_FOUND;
    }
    touch(s);
    *job_id = s->job_id;
    pthread_mutex_unlock(&m->mu);
    return STATUS_OK;
}

void sess_count(sess_mgr_t *m, uint64_t sid, bool failed, bool quota) {
    if (quota) atomic_fetch_add(&m->quota_refusals, 1);
    pthread_mutex_lock(&m->mu);
    sess_t *s = find_locked(m, sid);
    if (s) {
        atomic_fetch_add(&s->ops, 1);
        if (failed) atomic_fetch_add(&s->errors, 1);
    }
    pthread_mutex_unlock(&m->mu);
}

status_t sess_release_job(sess_mgr_t *m, uint64_t job_id, uint64_t *blobs, uint64_t *bytes) {
    store_filter_t f = { job_id, -1, 0, false };
    store_blob_info_t *list = NULL;
    size_t n = 0;
    uint64_t sum = 0;
    if (store_list(m->store, &f, &list, &n) == STATUS_OK) {
        for (size_t i = 0; i < n; i++) sum += list[i].length;
        free(list);
    }
    int freed = store_release_job(m->store, job_id);
    if (blobs) *blobs = freed > 0 ? (uint64_t)freed : 0;
    if (bytes) *bytes = sum;
    /* detached sessions of the job hold nothing any more */
    sess_t *dead = NULL;
    pthread_mutex_lock(&m->mu);
    for (sess_t *s = m->list, *nx; s; s = nx) {
        nx = s->next;
        if (s->detached && s->job_id == job_id && !s->attaching) {
            unlink_locked(m, s);
            s->next = dead;
            dead = s;
        }
    }
    bool live = false; /* a live session of the job keeps its table entry */
    for (sess_t *s = m->list; s; s = s->next) live |= s->job_id == job_id && !s->detached;
    pthread_mutex_unlock(&m->mu);
    while (dead) { sess_t *s = dead; dead = s->next; sess_destroy(m, s, false); }
    if (!live) store_job_forget(m->store, job_id);
    return STATUS_OK;
}

status_t sess_list(sess_mgr_t *m, sess_row_t **rows, size_t *n) {
    *rows = NULL;
    *n = 0;
    pthread_mutex_lock(&m->mu);
    size_t cnt = m->nsess;
    sess_row_t *r = calloc(cnt ? cnt : 1, sizeof *r);
    if (!r) { pthread_mutex_unlock(&m->mu); return STATUS_RESOURCE_EXHAUSTED; }
    int64_t now = clock_now_ns();
    size_t i = 0;
    for (sess_t *s = m->list; s && i < cnt; s = s->next, i++) {
        r[i].sid = s->sid;
        snprintf(r[i].job, sizeof r[i].job, "%s", s->job);
        snprintf(r[i].client, sizeof r[i].client, "%s", s->client);
        r[i].rank = s->rank;
        r[i].pid = s->pid;
        r[i].shared = s->shared;
        r[i].attached = s->attached;
        r[i].detached = s->detached;
        r[i].quota = s->quota;
        r[i].ops = atomic_load(&s->ops);
        r[i].errors = atomic_load(&s->errors);
        r[i].idle_s = (now - atomic_load(&s->last_ns)) / 1e9;
        r[i].owner_local = s->owner.local;
        r[i].owner_uid = s->owner.uid;
    }
    pthread_mutex_unlock(&m->mu);
    for (size_t j = 0; j < i; j++) {
        store_session_stats_t ss = { 0 };
        if (store_session_usage(m->store, r[j].sid, &ss) == STATUS_OK) r[j].used = ss.used_bytes;
    }
    *rows = r;
    *n = i;
    return STATUS_OK;
}

void sess_counters(sess_mgr_t *m, sess_counters_t *out) {
    out->opened = atomic_load(&m->opened);
    out->expired = atomic_load(&m->expired);
    out->closed = atomic_load(&m->closed);
    out->ring_ops = atomic_load(&m->ring_ops);
    out->ring_errors = atomic_load(&m->ring_errors);
    out->quota_refusals = atomic_load(&m->quota_refusals);
}
