/* gloo.c: the Gloo backend of comm.h, for CPU ranks on different hosts (or
 * containers that share no socket directory). Relies on gloo_engine.h (the
 * C++ adapter over Debian's libgloo, TCP transport) and on the rendezvous
 * client, through which Gloo's full-mesh set-up finds every peer's address
 * (keys "comm/<group>/gloo/<i>").
 *
 * Gloo's collectives block, so a progress thread runs the started
 * collectives one at a time in start order, as shm.c does. The mapping:
 *
 *   all_reduce      Gloo's ring all-reduce on fp32 (bf16: widened to fp32,
 *                   summed, rounded to nearest even once at the end); AVG
 *                   divides the fp32 sum by n. Each element is reduced once
 *                   along the ring and copied to everyone, so every rank
 *                   gets the same bits (the order differs from shm's rank
 *                   order: results agree with shm to fp32 rounding).
 *   reduce_scatter  an all-reduce of the n*count input, keeping this rank's
 *                   part (Gloo's new API has no reduce-scatter; this moves
 *                   twice a ring reduce-scatter's bytes)
 *   all_gather      Gloo's all-gather on bytes
 *   broadcast       Gloo's broadcast on bytes
 *   barrier         Gloo's barrier
 *
 * The address Gloo listens on and publishes: the interface named by
 * GLOO_SOCKET_IFNAME (as in PyTorch), else this host's address on the
 * route to the rendezvous store (127.0.0.1 for a unix: store). */
#include "workers/comm/impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "workers/comm/gloo_engine.h"

typedef struct {
    gloo_engine_t *eng;
    pthread_t thread;
    bool thread_started;
    comm_queue_t q;             /* started, not yet run */
    int broken;                 /* 0, or the error every later collective gets */
    char broken_msg[COMM_ERR_LEN];
    float *tmp;                 /* fp32 scratch (reduce-scatter, bf16) */
    size_t tmp_len;             /* elements */
} gloo_state_t;

/* ---- the listening address ---- */

/* This host's address on the route to the store at addr ("host:port" or
 * "unix:/path"), as text into out. 0 or -errno with a message. */
static int local_addr_toward(const char *addr, char *out, size_t outlen, char *err, size_t errlen) {
    if (!addr || !strncmp(addr, "unix:", 5)) {
        snprintf(out, outlen, "127.0.0.1");
        return 0;
    }
    char host[256];
    const char *colon = strrchr(addr, ':');
    size_t hl = colon ? (size_t)(colon - addr) : strlen(addr);
    if (hl == 0 || hl >= sizeof host) {
        snprintf(err, errlen, "rendezvous address '%s' has no host part", addr);
        return -EINVAL;
    }
    memcpy(host, addr, hl);
    host[hl] = 0;
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') { /* [v6] */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    struct addrinfo hints = { .ai_socktype = SOCK_DGRAM }, *ai = NULL;
    int g = getaddrinfo(host, "9", &hints, &ai);
    if (g) {
        snprintf(err, errlen, "cannot resolve the rendezvous host '%s': %s", host, gai_strerror(g));
        return -EHOSTUNREACH;
    }
    int rc = -ENETUNREACH;
    for (struct addrinfo *p = ai; p && rc; p = p->ai_next) {
        int s = socket(p->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s < 0) continue;
        struct sockaddr_storage me;
        socklen_t ml = sizeof me;
        /* a UDP connect sends nothing: it only picks the route */
        if (connect(s, p->ai_addr, p->ai_addrlen) == 0 && getsockname(s, (struct sockaddr *)&me, &ml) == 0) {
            const void *a = me.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&me)->sin6_addr
                                                     : (const void *)&((struct sockaddr_in *)&me)->sin_addr;
            if (inet_ntop(me.ss_family, a, out, (socklen_t)outlen)) rc = 0;
        }
        close(s);
    }
    freeaddrinfo(ai);
    if (rc) snprintf(err, errlen, "no route from this host to the rendezvous host '%s'", host);
    return rc;
}

/* ---- collectives ---- */

static inline float bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static int scratch(comm_t *c, size_t len) {
    gloo_state_t *st = c->backend;
    if (st->tmp_len >= len) return 0;
    float *t = realloc(st->tmp, len * sizeof(float));
    if (!t) return -ENOMEM;
    st->tmp = t;
    st->tmp_len = len;
    return 0;
}

/* out (len, dt) = buf (len fp32), divided by n for AVG. */
static void finish(void *out, const float *buf, size_t len, comm_dtype_t dt, comm_op_t op, int n) {
    float d = (float)n;
    if (dt == COMM_F32) {
        float *o = out;
        if (o != buf) memcpy(o, buf, len * sizeof(float));
        if (op == COMM_AVG)
            for (size_t i = 0; i < len; i++) o[i] /= d;
    } else {
        uint16_t *o = out;
        for (size_t i = 0; i < len; i++) o[i] = f32_bf16(op == COMM_AVG ? buf[i] / d : buf[i]);
    }
}

/* Run one collective; 0 or -errno with the message in st->broken_msg. */
static int run(comm_t *c, comm_req_t *r) {
    gloo_state_t *st = c->backend;
    char *err = st->broken_msg;
    const size_t errlen = sizeof st->broken_msg;
    const size_t es = comm_dtype_size(r->dt);
    const uint32_t tag = (uint32_t)r->seq;
    const size_t n = (size_t)c->n;
    switch (r->coll) {
    case COLL_ALL_REDUCE:
    case COLL_REDUCE_SCATTER: {
        size_t len = r->coll == COLL_ALL_REDUCE ? r->count : n * r->count;
        float *buf;
        if (r->coll == COLL_ALL_REDUCE && r->dt == COMM_F32) {
            buf = r->recv;
            if (r->send != r->recv) memcpy(buf, r->send, len * sizeof(float));
        } else {
            if (scratch(c, len)) {
                snprintf(err, errlen, "comm %s: out of memory for %zu elements", c->name, len);
                return -ENOMEM;
            }
            buf = st->tmp;
            if (r->dt == COMM_F32) memcpy(buf, r->send, len * sizeof(float));
            else
                for (size_t i = 0; i < len; i++) buf[i] = bf16_f32(((const uint16_t *)r->send)[i]);
        }
        int rc = gloo_engine_all_reduce_f32(st->eng, buf, len, tag, err, errlen);
        if (rc) return rc;
        if (r->coll == COLL_ALL_REDUCE) finish(r->recv, buf, len, r->dt, r->op, c->n);
        else finish(r->recv, buf + (size_t)c->index * r->count, r->count, r->dt, r->op, c->n);
        return 0;
    }
    case COLL_ALL_GATHER: {
        size_t bytes = r->count * es;
        const char *in = r->send;
        const char *lo = r->recv, *hi = lo + n * bytes;
        if (in + bytes > lo && in < hi) { /* in place (or overlapping): Gloo wants them apart */
            if (scratch(c, (bytes + sizeof(float) - 1) / sizeof(float))) {
                snprintf(err, errlen, "comm %s: out of memory for %zu bytes", c->name, bytes);
                return -ENOMEM;
            }
            memcpy(st->tmp, in, bytes);
            in = (const char *)st->tmp;
        }
        return gloo_engine_all_gather(st->eng, in, r->recv, bytes, tag, err, errlen);
    }
    case COLL_BROADCAST:
        return gloo_engine_broadcast(st->eng, r->recv, r->count * es, r->root, tag, err, errlen);
    case COLL_BARRIER:
        return gloo_engine_barrier(st->eng, tag, err, errlen);
    case COLL_SHIFT: {
        /* an all-gather into scratch, then the predecessor's block */
        size_t bytes = r->count * es, words = (n * bytes + sizeof(float) - 1) / sizeof(float);
        if (scratch(c, words)) {
            snprintf(err, errlen, "comm %s: out of memory for %zu bytes", c->name, n * bytes);
            return -ENOMEM;
        }
        int rc = gloo_engine_all_gather(st->eng, r->send, st->tmp, bytes, tag, err, errlen);
        if (!rc) memcpy(r->recv, (const char *)st->tmp + (size_t)((c->index + c->n - 1) % c->n) * bytes, bytes);
        return rc;
    }
    }
    snprintf(err, errlen, "comm %s: unknown collective %d", c->name, (int)r->coll);
    return -EINVAL;
}

/* ---- progress thread ---- */

static void *progress(void *arg) {
    comm_t *c = arg;
    gloo_state_t *st = c->backend;
    for (;;) {
        comm_req_t *r = comm_queue_pop(&st->q);
        if (!r) return NULL;
        int rc = st->broken;
        if (!rc && (r->count > 0 || r->coll == COLL_BARRIER)) {
            rc = run(c, r);
            if (rc) {
                /* a connection that broke usually means a peer exited */
                if (rc == -EPIPE) {
                    size_t l = strlen(st->broken_msg);
                    snprintf(st->broken_msg + l, sizeof st->broken_msg - l,
                             " (a rank of group %s exited or lost its connection)", c->name);
                }
                st->broken = rc;
            }
        }
        comm_req_done(r, rc, rc ? st->broken_msg : NULL);
    }
}

static int gloo_start(comm_t *c, comm_req_t *r, char *err, size_t errlen) {
    gloo_state_t *st = c->backend;
    (void)err, (void)errlen;
    comm_queue_push(&st->q, r);
    return 0;
}

/* ---- set-up ---- */

static void gloo_destroy_backend(comm_t *c);

static int gloo_init(comm_t *c, const comm_config_t *cfg, char *err, size_t errlen) {
    if (!cfg->rdzv) {
        snprintf(err, errlen, "comm %s: the gloo backend needs a rendezvous client", c->name);
        return -EINVAL;
    }
    gloo_state_t *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "comm %s: out of memory", c->name);
        return -ENOMEM;
    }
    c->backend = st;
    comm_queue_init(&st->q);
    const char *iface = getenv("GLOO_SOCKET_IFNAME");
    char host[INET6_ADDRSTRLEN] = "";
    int rc = 0;
    char e[COMM_ERR_LEN];
    if (iface && iface[0]) {
        if (strlen(iface) >= IF_NAMESIZE || !if_nametoindex(iface)) {
            snprintf(err, errlen, "comm %s: GLOO_SOCKET_IFNAME=%s is not a network interface of this host: "
                     "name one that reaches the other hosts (ip -br link), or unset it", c->name, iface);
            rc = -ENODEV;
        }
    } else if ((rc = local_addr_toward(rdzv_client_addr(cfg->rdzv), host, sizeof host, e, sizeof e))) {
        snprintf(err, errlen, "comm %s: choosing the address Gloo listens on: %s; set GLOO_SOCKET_IFNAME to "
                 "the interface that reaches the other hosts", c->name, e);
    }
    if (!rc) {
        char prefix[128];
        snprintf(prefix, sizeof prefix, "comm/%s/gloo/", c->name);
        gloo_engine_opts_t o = {
            .rdzv = cfg->rdzv, .prefix = prefix, .name = c->name, .n = c->n, .index = c->index,
            .ranks = c->ranks, .timeout_s = c->timeout_s,
            .setup_timeout_s = cfg->setup_timeout_s > 0 ? cfg->setup_timeout_s : c->timeout_s,
            .hostname = iface && iface[0] ? NULL : host, .iface = iface && iface[0] ? iface : NULL,
        };
        rc = gloo_engine_open(&st->eng, &o, err, errlen);
    }
    if (!rc) {
        if (pthread_create(&st->thread, NULL, progress, c)) {
            snprintf(err, errlen, "comm %s: cannot start the progress thread", c->name);
            rc = -EAGAIN;
        } else {
            st->thread_started = true;
        }
    }
    if (rc) gloo_destroy_backend(c);
    return rc;
}

static void gloo_destroy_backend(comm_t *c) {
    gloo_state_t *st = c->backend;
    if (!st) return;
    if (st->thread_started) {
        comm_queue_stop(&st->q);
        pthread_join(st->thread, NULL);
    }
    gloo_engine_close(st->eng);
    comm_queue_destroy(&st->q);
    free(st->tmp);
    free(st);
    c->backend = NULL;
}

const comm_ops_t comm_gloo_ops = {
    .name = "gloo",
    .init = gloo_init,
    .destroy = gloo_destroy_backend,
    .start = gloo_start,
    .wait = NULL,
};
