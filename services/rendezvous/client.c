/* client.c: the rendezvous client (rdzv.h) over common/rpc. Wait and
 * Barrier loop over the server's long polls until their own timeout;
 * every call retries while the server is not reachable yet (ranks start
 * before rank 0's server), up to the caller's timeout. */
#include "services/rendezvous/rdzv.h"
#include "clock.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/rpc.h"
#include "rendezvous.pb-c.h"
#include "services/rendezvous/store.h"

#define RDZV_SVC "/ballast.rdzv.v1.Rendezvous/"

struct rdzv_client {
    rpc_client_t *rpc;
    char job_id[128];
    uint32_t world;
    char addr[300];             /* the store's HOST:PORT, for messages */
    bool answered;              /* some call reached the store (else nothing may listen there) */
};

rdzv_client_t *rdzv_client_open(const char *addr, const char *job_id, int world, char *err, size_t errlen) {
    if (job_id && strlen(job_id) >= 128) {
        snprintf(err, errlen, "rendezvous: job id longer than 127 bytes");
        return NULL;
    }
    if (world < 0) {
        snprintf(err, errlen, "rendezvous: world %d is negative", world);
        return NULL;
    }
    rdzv_client_t *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "rendezvous: out of memory");
        return NULL;
    }
    c->rpc = rpc_client_open(addr, NULL, err, errlen);
    if (!c->rpc) {
        free(c);
        return NULL;
    }
    snprintf(c->job_id, sizeof c->job_id, "%s", job_id ? job_id : "");
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    c->world = (uint32_t)world;
    return c;
}

void rdzv_client_close(rdzv_client_t *c) {
    if (!c) return;
    rpc_client_close(c->rpc);
    free(c);
}

const char *rdzv_client_addr(const rdzv_client_t *c) { return rpc_client_addr(c->rpc); }

static int errno_of(grpc_status_code st) {
    switch (st) {
    case GRPC_STATUS_ALREADY_EXISTS: return -EEXIST;
    case GRPC_STATUS_NOT_FOUND: return -ENOENT;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return -ETIMEDOUT;
    case GRPC_STATUS_UNAVAILABLE: return -ECONNREFUSED;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return -ENOSPC;
    case GRPC_STATUS_FAILED_PRECONDITION: return -EPERM;
    default: return -EINVAL;
    }
}

/* One call, retried while the server is unreachable (UNAVAILABLE, or a
 * call deadline hit while connecting) until end. Returns the final status;
 * msg holds the last message. */
static grpc_status_code call(rdzv_client_t *c, const char *method, const ProtobufCMessage *req,
                             const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp, double end,
                             char *msg, size_t msglen) {
    for (;;) {
        double left = end - clock_now_s();
        int64_t ms = (int64_t)(left * 1000);
        if (ms < 100) ms = 100;
        /* each attempt gets the poll slice plus margin, or less when the
         * caller's time is nearly up */
        int64_t per = RDZV_POLL_SLICE_MS + 2000;
        grpc_status_code st = rpc_call(c->rpc, method, req, rd, resp, ms < per ? ms : per, true, msg, msglen);
        if (st == GRPC_STATUS_OK) { c->answered = true; return st; }
        bool retry = st == GRPC_STATUS_UNAVAILABLE ||
                     (st == GRPC_STATUS_DEADLINE_EXCEEDED && !strstr(msg, "did not arrive"));
        if (!retry) c->answered = true; /* the store said no: it is there */
        if (retry && clock_now_s() >= end && !c->answered) {
            /* never reached: the usual cause is that no store runs there (yet) */
            char m[RDZV_ERR_LEN];
            snprintf(m, sizeof m, "%s", msg);
            snprintf(msg, msglen, "nothing listens at %s (no rendezvous store answered: %s): start rank 0, which "
                     "serves it, or check MASTER_ADDR and MASTER_PORT (--master-addr, --master-port)", c->addr, m);
            return st;
        }
        if (!retry || clock_now_s() >= end) return st;
        usleep(50000);
    }
}

static void job_ref(rdzv_client_t *c, Ballast__Rdzv__V1__JobRef *j) {
    ballast__rdzv__v1__job_ref__init(j);
    j->job_id = c->job_id;
    j->world = c->world;
}

int rdzv_set(rdzv_client_t *c, const char *key, const void *value, size_t len, bool overwrite,
             double timeout_s, char *err, size_t errlen) {
    int rc = rdzv_key_check(key, "rendezvous key", err, errlen);
    if (rc) return rc;
    Ballast__Rdzv__V1__JobRef job;
    job_ref(c, &job);
    Ballast__Rdzv__V1__SetRequest req;
    ballast__rdzv__v1__set_request__init(&req);
    req.job = &job;
    req.key = (char *)key;
    req.value.data = (uint8_t *)value;
    req.value.len = len;
    req.overwrite = overwrite;
    ProtobufCMessage *resp = NULL;
    grpc_status_code st = call(c, RDZV_SVC "Set", &req.base, &ballast__rdzv__v1__set_response__descriptor,
                               &resp, clock_now_s() + timeout_s, err, errlen);
    if (st) return errno_of(st);
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

/* Get (hold_ms = -1) or one Wait poll. *ready: the key was there. */
static int get_once(rdzv_client_t *c, const char *key, int hold_ms, double end, void **value, size_t *len,
                    bool *ready, char *err, size_t errlen) {
    Ballast__Rdzv__V1__JobRef job;
    job_ref(c, &job);
    ProtobufCMessage *resp = NULL;
    grpc_status_code st;
    ProtobufCBinaryData *v;
    if (hold_ms < 0) {
        Ballast__Rdzv__V1__GetRequest req;
        ballast__rdzv__v1__get_request__init(&req);
        req.job = &job;
        req.key = (char *)key;
        st = call(c, RDZV_SVC "Get", &req.base, &ballast__rdzv__v1__get_response__descriptor, &resp, end,
                  err, errlen);
        if (st) return errno_of(st);
        *ready = ((Ballast__Rdzv__V1__GetResponse *)resp)->found;
        v = &((Ballast__Rdzv__V1__GetResponse *)resp)->value;
    } else {
        Ballast__Rdzv__V1__WaitRequest req;
        ballast__rdzv__v1__wait_request__init(&req);
        req.job = &job;
        req.key = (char *)key;
        req.timeout_ms = (uint32_t)hold_ms;
        st = call(c, RDZV_SVC "Wait", &req.base, &ballast__rdzv__v1__wait_response__descriptor, &resp, end,
                  err, errlen);
        if (st) return errno_of(st);
        *ready = ((Ballast__Rdzv__V1__WaitResponse *)resp)->ready;
        v = &((Ballast__Rdzv__V1__WaitResponse *)resp)->value;
    }
    if (*ready) {
        *value = malloc(v->len ? v->len : 1);
        if (!*value) {
            protobuf_c_message_free_unpacked(resp, NULL);
            snprintf(err, errlen, "rendezvous: out of memory for key %s (%zu bytes)", key, v->len);
            return -ENOMEM;
        }
        if (v->len) memcpy(*value, v->data, v->len);
        *len = v->len;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

/* After a poll the server answered at once (all its threads busy with
 * other waiters): sleep 20 ms, doubling up to 200 ms while that repeats,
 * so thousands of waiting ranks do not flood it. */
static void backoff(double held_s, unsigned *idle_us) {
    if (held_s >= 0.02) {
        *idle_us = 0;
        return;
    }
    *idle_us = *idle_us ? (*idle_us * 2 > 200000 ? 200000 : *idle_us * 2) : 20000;
    usleep(*idle_us);
}

int rdzv_get(rdzv_client_t *c, const char *key, void **value, size_t *len, double timeout_s,
             char *err, size_t errlen) {
    *value = NULL;
    *len = 0;
    int rc = rdzv_key_check(key, "rendezvous key", err, errlen);
    if (rc) return rc;
    bool ready = false;
    rc = get_once(c, key, -1, clock_now_s() + timeout_s, value, len, &ready, err, errlen);
    if (rc) return rc;
    if (!ready) {
        snprintf(err, errlen, "rendezvous %s: key %s is not set", rdzv_client_addr(c), key);
        return -ENOENT;
    }
    return 0;
}

int rdzv_wait(rdzv_client_t *c, const char *key, void **value, size_t *len, double timeout_s,
              char *err, size_t errlen) {
    *value = NULL;
    *len = 0;
    int rc = rdzv_key_check(key, "rendezvous key", err, errlen);
    if (rc) return rc;
    double end = clock_now_s() + timeout_s;
    unsigned idle_us = 0;
    for (;;) {
        double left = end - clock_now_s();
        int hold = left * 1000 < RDZV_POLL_SLICE_MS ? (int)(left * 1000) : RDZV_POLL_SLICE_MS;
        if (hold < 1) hold = 1;
        double t0 = clock_now_s();
        bool ready = false;
        rc = get_once(c, key, hold, end, value, len, &ready, err, errlen);
        if (rc) return rc;
        if (ready) return 0;
        if (clock_now_s() >= end) {
            snprintf(err, errlen, "rendezvous %s: key %s was not set within %.1f s: the rank that "
                     "publishes it did not get there", rdzv_client_addr(c), key, timeout_s);
            return -ETIMEDOUT;
        }
        backoff(clock_now_s() - t0, &idle_us); /* the server was too busy to hold the call */
    }
}

/* "3, 5" from a response's missing list */
static void list_ranks(const uint32_t *r, size_t n, char *buf, size_t len) {
    size_t off = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && off + 24 < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%u", i ? ", " : "", r[i]);
}

int rdzv_barrier(rdzv_client_t *c, const char *name, int rank, int world, double timeout_s,
                 char *err, size_t errlen) {
    int rc = rdzv_key_check(name, "barrier name", err, errlen);
    if (rc) return rc;
    if (world < 1 || rank < 0 || rank >= world) {
        snprintf(err, errlen, "barrier %s: rank %d / world %d out of range", name, rank, world);
        return -EINVAL;
    }
    Ballast__Rdzv__V1__JobRef job;
    job_ref(c, &job);
    Ballast__Rdzv__V1__BarrierRequest req;
    ballast__rdzv__v1__barrier_request__init(&req);
    req.job = &job;
    req.name = (char *)name;
    req.rank = (uint32_t)rank;
    req.world = (uint32_t)world;
    double tms = timeout_s * 1000;
    req.timeout_ms = tms < 1 ? 1 : tms > 4e9 ? 4000000000u : (uint32_t)tms;
    req.round = 0;
    /* the server fails the round at its own deadline; we allow a margin
     * past ours to hear its verdict (and the missing ranks) */
    double end = clock_now_s() + timeout_s + 2.0;
    char last_missing[256] = "";
    unsigned idle_us = 0;
    for (;;) {
        ProtobufCMessage *resp = NULL;
        double t0 = clock_now_s();
        grpc_status_code st = call(c, RDZV_SVC "Barrier", &req.base,
                                   &ballast__rdzv__v1__barrier_response__descriptor, &resp, end, err, errlen);
        if (st) {
            if (st == GRPC_STATUS_UNAVAILABLE || st == GRPC_STATUS_DEADLINE_EXCEEDED) {
                if (!strstr(err, "did not arrive")) {
                    char m[RDZV_ERR_LEN];
                    snprintf(m, sizeof m, "%s", err);
                    snprintf(err, errlen, "barrier %s (rank %d of %d): %s%s%s", name, rank, world, m,
                             last_missing[0] ? "; ranks still missing at the last answer: " : "",
                             last_missing);
                }
            }
            return errno_of(st);
        }
        Ballast__Rdzv__V1__BarrierResponse *br = (void *)resp;
        bool done = br->done;
        req.round = br->round;
        list_ranks(br->missing, br->n_missing, last_missing, sizeof last_missing);
        protobuf_c_message_free_unpacked(resp, NULL);
        if (done) return 0;
        if (clock_now_s() >= end) {
            snprintf(err, errlen, "barrier %s (rank %d of %d): not complete within %.1f s; ranks %s "
                     "did not arrive", name, rank, world, timeout_s, last_missing);
            return -ETIMEDOUT;
        }
        backoff(clock_now_s() - t0, &idle_us);
    }
}
