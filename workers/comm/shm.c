/* shm.c: the shared-memory backend of comm.h, for the processes of one
 * node. Relies on common/shm.h (sealed memfd, fd passing) and the
 * rendezvous client (to find the group leader's fd-passing socket).
 *
 * Segment (one per group, created by group index 0):
 *
 *   header   magic, version, n, slot_bytes, attached count, abort word
 *   ctrl[n]  two 64-byte lines per rank: phase counter, waiter count, pid,
 *            the descriptor of the collective it is in (per buffer parity)
 *   data     slot[2][n] (slot_bytes each) + result[2] (slot_bytes each)
 *
 * Protocol: a collective runs as rounds over chunks that fit a slot. Round k
 * uses buffer parity b = k % 2. In a round a rank writes its input chunk
 * into slot[b][me], posts its phase counter (release), waits until every
 * rank's counter reaches the same value (acquire), then reads. An
 * all-reduce round has a second phase: rank i reduces part i of the chunk
 * into result[b] reading slots in rank order 0..n-1; everyone copies
 * result[b] out after the next round's phase (each rank posts that only
 * once it has reduced its part), and one extra phase ends the collective.
 * Because every rank waits for every rank's first phase of round k-1
 * before starting round k, nobody can still be reading buffer b from round
 * k-2 when it is overwritten: two buffers suffice.
 *
 * Determinism: every element is reduced in rank order 0..n-1 with fp32
 * accumulation (bf16 rounded to nearest even once at the end; AVG divides
 * the fp32 sum by n), and each element is computed once and copied to
 * everyone, so results are bit-identical on every rank and across runs.
 *
 * Waiting: spin briefly, then sleep on a futex of the peer's counter (woken
 * by the poster when it sees waiters), checking every 50 ms for an abort,
 * a dead peer and the timeout. A failing rank sets the abort word so its
 * peers fail at once with its message instead of timing out.
 *
 * Set-up and peers: the leader (group index 0) listens on a Unix socket in
 * the directory every rank of the node shares (--comm-dir; containers
 * mount the same one), publishes its path in the store, and passes the
 * segment's fd to each follower that connects. The connections stay open
 * for the life of the communicator: a peer that exits closes its end, so
 * the leader sees every follower go and a follower sees the leader go (and
 * the leader's abort word tells the rest). A rank leaving normally sends a
 * "bye" message first. PIDs mean nothing across PID namespaces and are
 * never used for this (only a segment passed by fork, with no sockets,
 * falls back to checking the peers' pids). Every set-up wait is bounded by
 * the set-up timeout (--rdzv-timeout) and names what is missing. */
#include "workers/comm/impl.h"
#include "clock.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/shm.h"

#define SHM_COMM_MAGIC 0x4d4d4f43424c4c42ULL /* "BLLBCOMM" */
#define SHM_COMM_VERSION 1u
#define LINE 64
#define HDR_BYTES 4096
#define SPIN_ITERS 4000
#define SLEEP_MS 50

/* ---- segment layout ---- */

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t n;                 /* ranks */
    uint64_t slot_bytes;        /* bytes per slot, multiple of 64 */
    _Atomic uint32_t attached;  /* ranks attached so far */
    _Atomic uint32_t abort_claim; /* set by the first failing rank before it writes abort_msg */
    _Atomic uint32_t abort_by;  /* 0, or index+1 of the rank that failed (after abort_msg) */
    char abort_msg[COMM_ERR_LEN]; /* its message, written before abort_by */
} seg_hdr_t;

typedef struct {
    uint32_t coll, dt, op, root; /* comm_coll_t, comm_dtype_t, comm_op_t, broadcast root */
    uint64_t count;              /* elements */
    uint64_t seq;                /* collective sequence number on this comm */
} seg_desc_t;

typedef struct {
    _Atomic uint32_t phase;     /* phases posted by this rank (wraps) */
    _Atomic uint32_t waiters;   /* peers sleeping on phase */
    _Atomic int32_t pid;        /* attached process, 0 = not yet */
    uint32_t pad;
    seg_desc_t desc[2];         /* collective of the current round, per buffer parity */
} __attribute__((aligned(2 * LINE))) seg_ctrl_t;

_Static_assert(sizeof(seg_hdr_t) <= 1024, "header too large");
_Static_assert(sizeof(seg_ctrl_t) == 2 * LINE, "ctrl entry must be two cache lines");

typedef struct {
    shm_seg_t seg;
    seg_hdr_t *hdr;
    seg_ctrl_t *ctrl;           /* n entries */
    char *data;                 /* slot[2][n] then result[2] */
    size_t slot_bytes;
    uint32_t phase;             /* my phase counter (mirror of ctrl[me].phase) */
    uint64_t round;             /* rounds done on this comm */
    /* queue of started collectives, run in order by the progress thread */
    pthread_t thread;
    bool thread_started;
    comm_queue_t q;             /* started, not yet run */
    int broken;                 /* 0, or the error every later collective gets */
    char broken_msg[COMM_ERR_LEN];
    /* peer connections (rendezvous set-up only): the leader holds one per
     * follower (conn[i], i = 1..n-1), a follower one to the leader (conn[0]) */
    int *conn;                  /* n entries, -1 = none */
    bool *left;                 /* n entries: said bye */
    bool watch;                 /* peers are watched through conn, not by pid */
} shm_state_t;

#define BYE_MSG "ballast-comm bye"

size_t comm_shm_segment_bytes(int n, size_t slot_bytes) {
    size_t ctrl = (size_t)n * sizeof(seg_ctrl_t);
    size_t head = (HDR_BYTES + ctrl + 4095) & ~(size_t)4095;
    return head + (2 * (size_t)n + 2) * slot_bytes;
}

static int check_slot_bytes(int n, size_t *slot_bytes, char *err, size_t errlen) {
    size_t s = *slot_bytes ? *slot_bytes : COMM_DEFAULT_SLOT_BYTES;
    if (s % LINE || s < 4096 || s < (size_t)LINE * (size_t)n || s > (1ull << 32)) {
        snprintf(err, errlen, "comm shm: slot size %zu bytes is invalid: use a multiple of 64 "
                 "between 4096 (and 64 x group size %d) and 4G", s, n);
        return -EINVAL;
    }
    *slot_bytes = s;
    return 0;
}

static void seg_bind(shm_state_t *st, int n) {
    st->hdr = st->seg.base;
    st->ctrl = (seg_ctrl_t *)((char *)st->seg.base + HDR_BYTES);
    size_t ctrl = (size_t)n * sizeof(seg_ctrl_t);
    st->data = (char *)st->seg.base + ((HDR_BYTES + ctrl + 4095) & ~(size_t)4095);
}

int comm_shm_segment_create(int n, size_t slot_bytes, char *err, size_t errlen) {
    if (n < 1 || n > COMM_MAX_RANKS) {
        snprintf(err, errlen, "comm shm: group size %d out of range 1..%d", n, COMM_MAX_RANKS);
        return -EINVAL;
    }
    int rc = check_slot_bytes(n, &slot_bytes, err, errlen);
    if (rc) return rc;
    shm_seg_t seg;
    rc = shm_create(&seg, "ballast-comm", comm_shm_segment_bytes(n, slot_bytes), 0, err, errlen);
    if (rc) return rc;
    seg_hdr_t *h = seg.base;
    h->magic = SHM_COMM_MAGIC;
    h->version = SHM_COMM_VERSION;
    h->n = (uint32_t)n;
    h->slot_bytes = slot_bytes;
    int fd = seg.fd;
    munmap(seg.base, seg.bytes);
    return fd;
}

/* ---- time and futexes ---- */

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Whether pid is a live process (a zombie counts as dead). */
static bool pid_alive(int32_t pid) {
    if (pid <= 0) return true;
    if (kill(pid, 0) < 0 && errno == ESRCH) return false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t m = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[m] = 0;
    char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* Whether the peer behind conn[j] is gone (its end closed without a bye).
 * Reads a pending bye. */
static bool conn_dead(shm_state_t *st, int j) {
    int fd = st->conn[j];
    if (fd < 0 || st->left[j]) return false;
    struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & POLLIN) {
        char buf[64];
        ssize_t m = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (m > 0 && (size_t)m == strlen(BYE_MSG) && !memcmp(buf, BYE_MSG, (size_t)m)) {
            st->left[j] = true;
            return false;
        }
        if (m < 0 && (errno == EAGAIN || errno == EINTR)) return false;
        return true; /* EOF (m == 0), an error, or garbage */
    }
    return (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

/* The group index of a peer that is gone, or -1. */
static int dead_peer(comm_t *c, int waiting_for) {
    shm_state_t *st = c->backend;
    if (!st->watch) {
        int32_t pid = atomic_load(&st->ctrl[waiting_for].pid);
        return pid_alive(pid) ? -1 : waiting_for;
    }
    for (int j = 0; j < c->n; j++)
        if (conn_dead(st, j)) return j;
    return -1;
}

/* ---- failure ---- */

/* Record an error: this comm is broken from now on, and the peers learn it
 * through the abort word. */
static int fail(comm_t *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(comm_t *c, int rc, const char *fmt, ...) {
    shm_state_t *st = c->backend;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->broken_msg, sizeof st->broken_msg, fmt, ap);
    va_end(ap);
    st->broken = rc;
    /* only the first failing rank's message is published, and only once
     * it is written whole */
    if (atomic_exchange(&st->hdr->abort_claim, 1) == 0) {
        snprintf(st->hdr->abort_msg, sizeof st->hdr->abort_msg, "%s", st->broken_msg);
        atomic_store_explicit(&st->hdr->abort_by, (uint32_t)c->index + 1, memory_order_release);
    }
    for (int i = 0; i < c->n; i++) futex_wake(&st->ctrl[i].phase);
    return rc;
}

/* ---- phases ---- */

static void post(shm_state_t *st, int me) {
    st->phase++;
    atomic_store_explicit(&st->ctrl[me].phase, st->phase, memory_order_seq_cst);
    if (atomic_load_explicit(&st->ctrl[me].waiters, memory_order_seq_cst))
        futex_wake(&st->ctrl[me].phase);
}

static inline bool reached(uint32_t have, uint32_t want) { return (int32_t)(have - want) >= 0; }

/* Wait until every rank has posted our current phase. what: the collective
 * for messages. 0, or a negative errno after fail(). */
static int wait_all(comm_t *c, const char *what) {
    shm_state_t *st = c->backend;
    uint32_t want = st->phase;
    double t0 = 0, last_check = 0;
    for (int j = 0; j < c->n; j++) {
        seg_ctrl_t *cj = &st->ctrl[j];
        int spins = 0;
        for (;;) {
            uint32_t have = atomic_load_explicit(&cj->phase, memory_order_acquire);
            if (reached(have, want)) break;
            uint32_t ab = atomic_load_explicit(&st->hdr->abort_by, memory_order_acquire);
            if (ab)
                return fail(c, -EPIPE, "comm %s: %s: rank %d (index %u) failed: %s", c->name, what,
                            c->ranks[ab - 1], ab - 1, st->hdr->abort_msg);
            if (spins < SPIN_ITERS) {
                spins++;
                cpu_relax();
                if ((spins & 255) == 0) sched_yield();
                continue;
            }
            double t = clock_now_s();
            if (t0 == 0) t0 = last_check = t;
            if (t - last_check >= 0.1) {
                last_check = t;
                int gone = dead_peer(c, j);
                if (gone >= 0)
                    return fail(c, -EPIPE, "comm %s: %s: rank %d (index %d) exited in the middle of the "
                                "collective (its connection to %s closed)", c->name, what, c->ranks[gone], gone,
                                st->watch && c->index != 0 ? "the group leader" : "this rank");
                if (t - t0 > c->timeout_s) {
                    char list[256];
                    size_t off = 0;
                    int late = 0;
                    for (int k = 0; k < c->n && off + 16 < sizeof list; k++)
                        if (!reached(atomic_load(&st->ctrl[k].phase), want))
                            off += (size_t)snprintf(list + off, sizeof list - off, "%s%d",
                                                    late++ ? ", " : "", c->ranks[k]);
                    return fail(c, -ETIMEDOUT, "comm %s: %s: rank%s %s did not reach it within %.0f s: "
                                "check that every rank runs the same collectives in the same order",
                                c->name, what, late > 1 ? "s" : "", list, c->timeout_s);
                }
            }
            atomic_fetch_add(&cj->waiters, 1);
            if (!reached(atomic_load(&cj->phase), want)) futex_wait(&cj->phase, have, SLEEP_MS);
            atomic_fetch_sub(&cj->waiters, 1);
        }
    }
    return 0;
}

/* ---- element kernels ---- */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* out[e] = op over i = 0..n-1 (in that order) of src_i[e], for len elements
 * at element offset off of each source. srcs: n pointers to slot bases. */
static void reduce_f32(float *out, char *const *srcs, size_t off, int n, size_t len, comm_op_t op) {
    const float *s0 = (const float *)srcs[0] + off;
    for (size_t e = 0; e < len; e++) out[e] = s0[e];
    for (int i = 1; i < n; i++) {
        const float *si = (const float *)srcs[i] + off;
        for (size_t e = 0; e < len; e++) out[e] += si[e];
    }
    if (op == COMM_AVG) {
        float d = (float)n;
        for (size_t e = 0; e < len; e++) out[e] /= d;
    }
}

static void reduce_bf16(uint16_t *out, char *const *srcs, size_t off, int n, size_t len, comm_op_t op) {
    float acc[1024];
    for (size_t b = 0; b < len; b += 1024) {
        size_t m = len - b < 1024 ? len - b : 1024;
        const uint16_t *s0 = (const uint16_t *)srcs[0] + off + b;
        for (size_t e = 0; e < m; e++) acc[e] = bf16_to_f32(s0[e]);
        for (int i = 1; i < n; i++) {
            const uint16_t *si = (const uint16_t *)srcs[i] + off + b;
            for (size_t e = 0; e < m; e++) acc[e] += bf16_to_f32(si[e]);
        }
        if (op == COMM_AVG) {
            float d = (float)n;
            for (size_t e = 0; e < m; e++) acc[e] /= d;
        }
        for (size_t e = 0; e < m; e++) out[b + e] = f32_to_bf16(acc[e]);
    }
}

static void reduce(void *out, char *const *srcs, size_t off, int n, size_t len, comm_dtype_t dt,
                   comm_op_t op) {
    if (dt == COMM_BF16) reduce_bf16(out, srcs, off, n, len, op);
    else reduce_f32(out, srcs, off, n, len, op);
}

/* ---- rounds ---- */

static char *slot(shm_state_t *st, int n, int b, int i) {
    return st->data + ((size_t)b * (size_t)n + (size_t)i) * st->slot_bytes;
}

static char *result(shm_state_t *st, int n, int b) {
    return st->data + (2 * (size_t)n + (size_t)b) * st->slot_bytes;
}

/* Publish my descriptor for buffer b (first round of a collective). */
static void set_desc(shm_state_t *st, int me, int b, const comm_req_t *r) {
    seg_desc_t *d = &st->ctrl[me].desc[b];
    d->coll = r->coll, d->dt = r->dt, d->op = r->op, d->root = (uint32_t)r->root;
    d->count = r->count, d->seq = r->seq;
}

/* After the first phase of a collective: every peer must be in the same one. */
static int check_descs(comm_t *c, int b, const comm_req_t *r) {
    shm_state_t *st = c->backend;
    for (int j = 0; j < c->n; j++) {
        const seg_desc_t *d = &st->ctrl[j].desc[b];
        if (d->coll != (uint32_t)r->coll || d->dt != (uint32_t)r->dt || d->op != (uint32_t)r->op ||
            d->root != (uint32_t)r->root || d->count != r->count || d->seq != r->seq) {
            const char *pc = d->coll <= COLL_SHIFT ? comm_coll_name((comm_coll_t)d->coll) : "?";
            return fail(c, -EPROTO, "comm %s: collective #%llu differs between ranks: rank %d runs "
                        "%s(count %llu, %s, root %u) but rank %d runs %s(count %zu, %s, root %d): every "
                        "rank must start the same collectives in the same order",
                        c->name, (unsigned long long)r->seq, c->ranks[j], pc,
                        (unsigned long long)d->count, d->dt == COMM_BF16 ? "bf16" : "fp32", d->root,
                        c->ranks[c->index], comm_coll_name(r->coll), r->count, comm_dtype_name(r->dt),
                        r->root);
        }
    }
    return 0;
}

/* Run one collective to completion; 0 or a negative errno (after fail()). */
static int run(comm_t *c, comm_req_t *r) {
    shm_state_t *st = c->backend;
    const int n = c->n, me = c->index;
    const size_t es = comm_dtype_size(r->dt);
    const char *what = comm_coll_name(r->coll);
    char *srcs[COMM_MAX_RANKS > 64 ? 64 : COMM_MAX_RANKS];
    char **src = n <= 64 ? srcs : malloc(sizeof(char *) * (size_t)n);
    if (!src) return fail(c, -ENOMEM, "comm %s: out of memory", c->name);
    int rc = 0;

    size_t per_round; /* elements of `count` covered per round */
    switch (r->coll) {
    case COLL_REDUCE_SCATTER: per_round = st->slot_bytes / (es * (size_t)n); break;
    default: per_round = st->slot_bytes / es; break;
    }
    size_t total = r->coll == COLL_BARRIER ? 1 : r->count;
    bool first = true;
    /* all-reduce: the reduced chunk of round k is copied out in round k+1,
     * after its first phase (every rank posts it only once done reducing
     * chunk k), so a round costs one phase; one extra phase ends it. */
    char *pend_res = NULL;
    size_t pend_off = 0, pend_len = 0;
    for (size_t off = 0; off < total && !rc; off += per_round, first = false) {
        size_t len = total - off < per_round ? total - off : per_round;
        int b = (int)(st->round++ & 1);
        for (int i = 0; i < n; i++) src[i] = slot(st, n, b, i);
        if (first) set_desc(st, me, b, r);
        char *mine = src[me];
        const char *in = r->send;
        char *out = r->recv;
        switch (r->coll) {
        case COLL_ALL_GATHER:
            memcpy(mine, in + off * es, len * es);
            break;
        case COLL_REDUCE_SCATTER:
            for (int j = 0; j < n; j++)
                memcpy(mine + (size_t)j * len * es, in + ((size_t)j * r->count + off) * es, len * es);
            break;
        case COLL_ALL_REDUCE:
            memcpy(mine, in + off * es, len * es);
            break;
        case COLL_BROADCAST:
            if (me == r->root) memcpy(mine, out + off * es, len * es);
            break;
        case COLL_BARRIER:
            break;
        case COLL_SHIFT:
            memcpy(mine, in + off * es, len * es);
            break;
        }
        post(st, me);
        if ((rc = wait_all(c, what))) break;
        if (first && (rc = check_descs(c, b, r))) break;
        switch (r->coll) {
        case COLL_ALL_GATHER:
            for (int i = 0; i < n; i++)
                memcpy(out + ((size_t)i * r->count + off) * es, src[i], len * es);
            break;
        case COLL_REDUCE_SCATTER: {
            /* rank j's part for me sits at me*len of its slot */
            reduce(out + off * es, src, (size_t)me * len, n, len, r->dt, r->op);
            break;
        }
        case COLL_ALL_REDUCE: {
            if (pend_res) memcpy(out + pend_off * es, pend_res, pend_len * es);
            size_t lo = len * (size_t)me / (size_t)n, hi = len * (size_t)(me + 1) / (size_t)n;
            char *res = result(st, n, b);
            if (hi > lo) reduce(res + lo * es, src, lo, n, hi - lo, r->dt, r->op);
            pend_res = res, pend_off = off, pend_len = len;
            break;
        }
        case COLL_BROADCAST:
            if (me != r->root) memcpy(out + off * es, src[r->root], len * es);
            break;
        case COLL_BARRIER:
            break;
        case COLL_SHIFT:
            memcpy(out + off * es, src[(me + n - 1) % n], len * es);
            break;
        }
    }
    if (!rc && pend_res) {
        post(st, me);
        if (!(rc = wait_all(c, what))) memcpy((char *)r->recv + pend_off * es, pend_res, pend_len * es);
    }
    if (src != srcs) free(src);
    return rc;
}

/* ---- progress thread ---- */

static void *progress(void *arg) {
    comm_t *c = arg;
    shm_state_t *st = c->backend;
    for (;;) {
        comm_req_t *r = comm_queue_pop(&st->q);
        if (!r) return NULL;
        int rc = st->broken;
        if (!rc && (r->count > 0 || r->coll == COLL_BARRIER)) rc = run(c, r);
        comm_req_done(r, rc, rc ? st->broken_msg : NULL);
    }
}

static int shm_start(comm_t *c, comm_req_t *r, char *err, size_t errlen) {
    shm_state_t *st = c->backend;
    (void)err, (void)errlen;
    comm_queue_push(&st->q, r);
    return 0;
}

/* ---- set-up ---- */

/* Leader: create the segment and hand its fd to n-1 peers that find our
 * socket through the rendezvous key "comm/<name>/shm". */
static int leader_share(comm_t *c, const comm_config_t *cfg, int fd, double setup_s, char *err, size_t errlen) {
    shm_state_t *st = c->backend;
    shm_listener_t l;
    char path[256];
    /* a random name: PIDs repeat across containers sharing the directory */
    uint64_t nonce = 0;
    FILE *ur = fopen("/dev/urandom", "r");
    if (!ur || fread(&nonce, sizeof nonce, 1, ur) != 1) nonce = (uint64_t)clock_now_s() * 1000003u ^ (uint64_t)getpid();
    if (ur) fclose(ur);
    int pl = snprintf(path, sizeof path, "%s/ballast-comm-%s-%016llx.sock", cfg->sock_dir ? cfg->sock_dir : "/tmp",
                      c->name, (unsigned long long)nonce);
    if (pl < 0 || pl >= 108) {
        snprintf(err, errlen, "comm %s: socket path %s is longer than 107 bytes: use a shorter "
                 "socket directory", c->name, path);
        return -ENAMETOOLONG;
    }
    int rc = shm_listen(&l, path, c->n, err, errlen);
    if (rc) return rc;
    char key[RDZV_MAX_KEY];
    snprintf(key, sizeof key, "comm/%s/shm", c->name);
    rc = rdzv_set(cfg->rdzv, key, path, strlen(path), true, setup_s, err, errlen);
    double deadline = clock_now_s() + setup_s;
    for (int sent = 0; !rc && sent < c->n - 1;) {
        struct pollfd p = { .fd = l.fd, .events = POLLIN };
        int left = (int)((deadline - clock_now_s()) * 1000);
        if (left <= 0) {
            snprintf(err, errlen, "comm %s: only %d of %d peers fetched the shared segment from %s within "
                     "%.1f s (--rdzv-timeout): the others did not reach comm set-up, or do not share the "
                     "directory %s (--comm-dir: mount the same one into every container of the node)",
                     c->name, sent, c->n - 1, path, setup_s, cfg->sock_dir ? cfg->sock_dir : "/tmp");
            rc = -ETIMEDOUT;
            break;
        }
        int pr = poll(&p, 1, left < 200 ? left : 200);
        if (pr <= 0) continue;
        int conn;
        char aerr[SHM_ERR_LEN];
        if (shm_accept(l.fd, NULL, &conn, NULL, aerr, sizeof aerr)) continue; /* refused peer */
        char msg[64];
        int m = snprintf(msg, sizeof msg, "ballast-comm %d %zu", c->n, (size_t)cfg->slot_bytes);
        /* the follower says which index it is, so that its connection is
         * watched as that peer */
        char hello[64];
        size_t hl = 0;
        int idx = -1;
        if (shm_recv_fds(conn, hello, sizeof hello - 1, &hl, NULL, 0, 2000, aerr, sizeof aerr) == 0) {
            hello[hl] = 0;
            if (sscanf(hello, "ballast-comm index %d", &idx) != 1) idx = -1;
        }
        if (idx < 1 || idx >= c->n || st->conn[idx] >= 0 ||
            shm_send_fds(conn, msg, (size_t)m, &fd, 1, aerr, sizeof aerr) != 0) {
            close(conn); /* not one of ours, a second claim of an index, or gone */
            continue;
        }
        st->conn[idx] = conn;
        sent++;
    }
    shm_listener_close(&l);
    return rc;
}

/* Follower: find the leader's socket and receive the segment fd. */
static int follower_fetch(comm_t *c, const comm_config_t *cfg, int *fd_out, double setup_s, char *err,
                          size_t errlen) {
    shm_state_t *st = c->backend;
    char key[RDZV_MAX_KEY], last_path[108] = "", cerr[SHM_ERR_LEN] = "";
    snprintf(key, sizeof key, "comm/%s/shm", c->name);
    double deadline = clock_now_s() + setup_s;
    for (;;) {
        double left = deadline - clock_now_s();
        if (left <= 0) {
            if (last_path[0])
                snprintf(err, errlen, "comm %s: rank %d (the group leader) listens on %s, which this rank cannot "
                         "reach (%s) within %.1f s (--rdzv-timeout): the ranks do not share the directory %s "
                         "(--comm-dir: mount the same one into every container of the node), or use --comm auto "
                         "or gloo between nodes", c->name, c->ranks[0], last_path, cerr, setup_s,
                         cfg->sock_dir ? cfg->sock_dir : "/tmp");
            else
                snprintf(err, errlen, "comm %s: rank %d (the group leader) did not publish its socket within "
                         "%.1f s (--rdzv-timeout)", c->name, c->ranks[0], setup_s);
            return -ETIMEDOUT;
        }
        void *val = NULL;
        size_t len = 0;
        int rc = rdzv_wait(cfg->rdzv, key, &val, &len, left, err, errlen);
        if (rc) return rc;
        char path[108];
        if (len == 0 || len >= sizeof path || memchr(val, 0, len)) {
            free(val);
            snprintf(err, errlen, "comm %s: rendezvous key %s holds %zu bytes, not a socket path: "
                     "is another job using this rendezvous address?", c->name, key, len);
            return -EBADMSG;
        }
        memcpy(path, val, len);
        path[len] = 0;
        free(val);
        int sock;
        snprintf(last_path, sizeof last_path, "%s", path);
        if (shm_connect(path, &sock, cerr, sizeof cerr)) {
            /* not (yet) reachable: a stale key from an earlier run that the
             * leader overwrites, or a directory this rank does not share */
            usleep(50000);
            continue;
        }
        char hello[64], msg[64];
        int hl = snprintf(hello, sizeof hello, "ballast-comm index %d", c->index);
        size_t mlen;
        rc = shm_send_fds(sock, hello, (size_t)hl, NULL, 0, err, errlen);
        if (!rc) rc = shm_recv_fds(sock, msg, sizeof msg - 1, &mlen, fd_out, 1, (int)(left * 1000), err, errlen);
        if (rc == -ECONNRESET || rc == -EPIPE) { /* the leader went away between key and connect */
            close(sock);
            usleep(50000);
            continue;
        }
        if (rc) close(sock);
        else st->conn[0] = sock;
        return rc;
    }
}

/* Map the segment, check it against our config, claim our ctrl line and
 * wait until all n ranks have. */
static int attach(comm_t *c, int fd, size_t slot_bytes, double setup_s, char *err, size_t errlen) {
    shm_state_t *st = c->backend;
    int rc = shm_map_fd(&st->seg, fd, 0, err, errlen);
    if (rc) return rc;
    if (st->seg.bytes < HDR_BYTES) {
        snprintf(err, errlen, "comm %s: shared segment of %zu bytes is too small", c->name, st->seg.bytes);
        return -EINVAL;
    }
    seg_hdr_t *h = st->seg.base;
    if (h->magic != SHM_COMM_MAGIC || h->version != SHM_COMM_VERSION) {
        snprintf(err, errlen, "comm %s: the shared segment is not a ballast comm segment (version %u): "
                 "ranks built from different versions?", c->name, h->version);
        return -EINVAL;
    }
    if (h->n != (uint32_t)c->n || h->slot_bytes != slot_bytes ||
        st->seg.bytes < comm_shm_segment_bytes(c->n, slot_bytes)) {
        snprintf(err, errlen, "comm %s: the shared segment is for %u ranks with %llu-byte slots, this "
                 "rank expects %d ranks with %zu-byte slots: every rank of a group must use the same "
                 "layout and slot size (comm_config_t.slot_bytes)", c->name, h->n, (unsigned long long)h->slot_bytes,
                 c->n, slot_bytes);
        return -EINVAL;
    }
    seg_bind(st, c->n);
    st->slot_bytes = slot_bytes;
    int32_t zero = 0;
    if (!atomic_compare_exchange_strong(&st->ctrl[c->index].pid, &zero, (int32_t)getpid())) {
        snprintf(err, errlen, "comm %s: group index %d is already taken by pid %d: two processes "
                 "claim the same rank", c->name, c->index, (int)zero);
        return -EADDRINUSE;
    }
    atomic_fetch_add(&h->attached, 1);
    double t0 = clock_now_s();
    while (atomic_load(&h->attached) < (uint32_t)c->n) {
        int gone = st->watch ? dead_peer(c, 0) : -1;
        if (gone >= 0) {
            snprintf(err, errlen, "comm %s: rank %d (index %d) exited during set-up", c->name, c->ranks[gone], gone);
            return -EPIPE;
        }
        if (clock_now_s() - t0 > setup_s) {
            char list[256];
            size_t off = 0;
            int late = 0;
            for (int k = 0; k < c->n && off + 16 < sizeof list; k++)
                if (atomic_load(&st->ctrl[k].pid) == 0)
                    off += (size_t)snprintf(list + off, sizeof list - off, "%s%d", late++ ? ", " : "", c->ranks[k]);
            snprintf(err, errlen, "comm %s: rank%s %s did not attach to the shared segment within %.1f s "
                     "(--rdzv-timeout)", c->name, late > 1 ? "s" : "", list, setup_s);
            return -ETIMEDOUT;
        }
        usleep(1000);
    }
    return 0;
}

static void shm_destroy_backend(comm_t *c);

static int shm_init(comm_t *c, const comm_config_t *cfg, char *err, size_t errlen) {
    shm_state_t *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "comm %s: out of memory", c->name);
        return -ENOMEM;
    }
    st->seg.fd = -1;
    c->backend = st;
    st->conn = malloc(sizeof(int) * (size_t)c->n);
    st->left = calloc((size_t)c->n, sizeof(bool));
    if (!st->conn || !st->left) {
        free(st->conn);
        free(st->left);
        free(st);
        c->backend = NULL;
        snprintf(err, errlen, "comm %s: out of memory", c->name);
        return -ENOMEM;
    }
    for (int i = 0; i < c->n; i++) st->conn[i] = -1;
    double setup_s = cfg->setup_timeout_s > 0 ? cfg->setup_timeout_s : c->timeout_s;
    comm_queue_init(&st->q);
    size_t slot_bytes = cfg->slot_bytes;
    int rc = check_slot_bytes(c->n, &slot_bytes, err, errlen);
    int fd = -1;
    if (!rc && cfg->shm_fd >= 0) {
        fd = dup(cfg->shm_fd);
        if (fd < 0) {
            rc = -errno;
            snprintf(err, errlen, "comm %s: dup of segment fd %d: %s", c->name, cfg->shm_fd, strerror(errno));
        }
    } else if (!rc && !cfg->rdzv) {
        snprintf(err, errlen, "comm %s: the shm backend needs a rendezvous client or a segment fd", c->name);
        rc = -EINVAL;
    } else if (!rc && c->index == 0) {
        fd = comm_shm_segment_create(c->n, slot_bytes, err, errlen);
        if (fd < 0) rc = fd;
        else {
            comm_config_t cf = *cfg;
            cf.slot_bytes = slot_bytes;
            st->watch = true;
            rc = leader_share(c, &cf, fd, setup_s, err, errlen);
        }
    } else if (!rc) {
        st->watch = true;
        rc = follower_fetch(c, cfg, &fd, setup_s, err, errlen);
    }
    if (!rc) {
        rc = attach(c, fd, slot_bytes, setup_s, err, errlen);
        fd = -1; /* owned by the mapping now (closed on error too) */
    }
    if (fd >= 0) close(fd);
    if (!rc) {
        st->phase = atomic_load(&st->ctrl[c->index].phase);
        if (pthread_create(&st->thread, NULL, progress, c)) {
            snprintf(err, errlen, "comm %s: cannot start the progress thread", c->name);
            rc = -EAGAIN;
        } else {
            st->thread_started = true;
        }
    }
    if (rc) {
        shm_destroy_backend(c);
        c->backend = NULL;
    }
    return rc;
}

static void shm_destroy_backend(comm_t *c) {
    shm_state_t *st = c->backend;
    if (!st) return;
    if (st->thread_started) {
        comm_queue_stop(&st->q);
        pthread_join(st->thread, NULL);
    }
    for (int i = 0; i < c->n; i++)
        if (st->conn[i] >= 0) {
            send(st->conn[i], BYE_MSG, strlen(BYE_MSG), MSG_NOSIGNAL | MSG_DONTWAIT);
            close(st->conn[i]);
        }
    free(st->conn);
    free(st->left);
    shm_destroy(&st->seg);
    comm_queue_destroy(&st->q);
    free(st);
    c->backend = NULL;
}

const comm_ops_t comm_shm_ops = {
    .name = "shm",
    .init = shm_init,
    .destroy = shm_destroy_backend,
    .start = shm_start,
    .wait = NULL,
};
