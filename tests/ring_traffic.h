/* tests/ring_traffic.h: the ring's end-to-end traffic check, shared by the
 * Criterion test (tests/unit/test_ring.c) and the stand-alone program that
 * ThreadSanitizer runs (tests/integration/ring_stress.c; Criterion itself
 * cannot start under TSan).
 *
 * A producer pushes N requests (sequence number, random payload, checksum of
 * the payload) through a small request ring; the consumer checks that each
 * arrives in order with a matching checksum and answers it with a completion
 * (sequence number, checksum it computed) through a completion ring; the
 * producer checks every completion against the checksum it recorded. Both
 * rings live in one memfd and both sides sleep on eventfd doorbells, so the
 * full/empty paths and the wakeup protocol run many times. Header-only:
 * static functions, no test framework. */
#ifndef BALLAST_TESTS_RING_TRAFFIC_H
#define BALLAST_TESTS_RING_TRAFFIC_H

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ring.h"
#include "shm.h"

#define TRAFFIC_WAIT_MS 20000 /* a side that waits this long is stuck: fail */

static uint64_t traffic_rng(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static uint64_t traffic_fnv1a(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* A request: sequence number, checksum of the payload, random payload. */
typedef struct {
    uint64_t seq;          /* 0, 1, 2, ... */
    uint64_t sum;          /* fnv1a(payload) */
    uint8_t payload[48];   /* random bytes */
} traffic_req_t;

/* A completion: the sequence number and the checksum the consumer computed. */
typedef struct {
    uint64_t seq;
    uint64_t sum;
} traffic_cpl_t;

static void traffic_make_req(traffic_req_t *q, uint64_t seq, uint64_t seed) {
    uint64_t s = seed ^ (seq * 0x9e3779b97f4a7c15ull) ^ 0x5851f42d4c957f2dull;
    if (!s) s = 1;
    q->seq = seq;
    for (size_t i = 0; i < sizeof q->payload; i += 8) {
        uint64_t v = traffic_rng(&s);
        memcpy(q->payload + i, &v, 8);
    }
    q->sum = traffic_fnv1a(q->payload, sizeof q->payload);
}

/* Lives in the shared mapping after the two rings. */
typedef struct {
    uint64_t req_full;    /* producer found the request ring full */
    uint64_t req_sleeps;  /* producer woke on the space doorbell */
    uint64_t cpl_sleeps;  /* producer woke on the completion doorbell */
    uint64_t cons_sleeps; /* consumer found the ring empty and waited */
    uint64_t cons_bad;    /* consumer: entries out of order or with a bad checksum */
    char cons_err[200];   /* consumer: the first problem seen */
} traffic_stats_t;

typedef struct {
    void *req_mem, *cpl_mem;  /* the two rings, inside one mapping */
    size_t req_bytes, cpl_bytes;
    int req_data, req_space, cpl_data, cpl_space; /* eventfds */
    traffic_stats_t *st;      /* in the mapping */
    uint64_t seed;            /* payload seed */
    uint64_t n;               /* entries to pass */
    uint32_t cap;             /* ring capacity, entries */
} traffic_t;

/* Consumer side. 0 or -1 (details in st->cons_err); bad entries counted. */
static int traffic_consumer(traffic_t *p) {
    ring_t req, cpl;
    char err[RING_ERR_LEN];
    if (ring_attach(&req, p->req_mem, p->req_bytes, sizeof(traffic_req_t), err, sizeof err) ||
        ring_attach(&cpl, p->cpl_mem, p->cpl_bytes, sizeof(traffic_cpl_t), err, sizeof err)) {
        snprintf(p->st->cons_err, sizeof p->st->cons_err, "attach: %s", err);
        return -1;
    }
    ring_set_doorbells(&req, p->req_data, p->req_space);
    ring_set_doorbells(&cpl, p->cpl_data, p->cpl_space);
    traffic_req_t batch[16];
    uint64_t expect = 0;
    while (expect < p->n) {
        int n = ring_pop_batch(&req, batch, 16);
        if (n < 0) {
            snprintf(p->st->cons_err, sizeof p->st->cons_err, "pop: %s", req.err);
            return -1;
        }
        if (n == 0) {
            p->st->cons_sleeps++;
            int rc = ring_wait_data(&req, TRAFFIC_WAIT_MS);
            if (rc) {
                snprintf(p->st->cons_err, sizeof p->st->cons_err, "waiting for entry %llu: %s",
                         (unsigned long long)expect, strerror(-rc));
                return -1;
            }
            continue;
        }
        for (int i = 0; i < n; i++, expect++) {
            uint64_t sum = traffic_fnv1a(batch[i].payload, sizeof batch[i].payload);
            if ((batch[i].seq != expect || sum != batch[i].sum) && !p->st->cons_bad++)
                snprintf(p->st->cons_err, sizeof p->st->cons_err,
                         "entry %llu arrived with seq %llu, checksum %s", (unsigned long long)expect,
                         (unsigned long long)batch[i].seq, sum == batch[i].sum ? "ok" : "BAD");
            traffic_cpl_t c = { batch[i].seq, sum };
            int rc = ring_push_wait(&cpl, &c, TRAFFIC_WAIT_MS);
            if (rc) {
                snprintf(p->st->cons_err, sizeof p->st->cons_err, "pushing completion %llu: %s",
                         (unsigned long long)expect, rc == -EBADMSG ? cpl.err : strerror(-rc));
                return -1;
            }
        }
    }
    traffic_req_t extra;
    int rc = ring_pop_wait(&req, &extra, 50);
    if (rc != -ETIMEDOUT) {
        snprintf(p->st->cons_err, sizeof p->st->cons_err, "after %llu entries the ring still "
                 "gave %d", (unsigned long long)p->n, rc);
        return -1;
    }
    return 0;
}

/* Producer side: push n requests and collect n completions, sleeping on
 * both doorbells (poll) when neither ring moves. 0 or -1 with err. */
static int traffic_producer(traffic_t *p, char *err, size_t errlen) {
    ring_t req, cpl;
    if (ring_attach(&req, p->req_mem, p->req_bytes, sizeof(traffic_req_t), err, errlen) ||
        ring_attach(&cpl, p->cpl_mem, p->cpl_bytes, sizeof(traffic_cpl_t), err, errlen))
        return -1;
    ring_set_doorbells(&req, p->req_data, p->req_space);
    ring_set_doorbells(&cpl, p->cpl_data, p->cpl_space);
    uint64_t *sums = malloc(p->n * sizeof *sums);
    if (!sums) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    uint64_t sent = 0, done = 0, bad = 0, first_bad = 0;
    traffic_req_t out[16];
    traffic_cpl_t in[32];
    int rc = -1;
    while (done < p->n) {
        int moved = 0;
        if (sent < p->n) {
            uint32_t n = 1 + (uint32_t)(sent % 16); /* varied batch sizes */
            if (n > p->n - sent) n = (uint32_t)(p->n - sent);
            for (uint32_t i = 0; i < n; i++) {
                traffic_make_req(&out[i], sent + i, p->seed);
                sums[sent + i] = out[i].sum;
            }
            int k = ring_push_batch(&req, out, n);
            if (k < 0) {
                snprintf(err, errlen, "push: %s", req.err);
                goto out;
            }
            if ((uint32_t)k < n) p->st->req_full++;
            sent += (uint64_t)k;
            moved += k;
        }
        int k = ring_pop_batch(&cpl, in, 32);
        if (k < 0) {
            snprintf(err, errlen, "pop completion: %s", cpl.err);
            goto out;
        }
        for (int i = 0; i < k; i++, done++)
            if ((in[i].seq != done || in[i].sum != sums[done]) && !bad++) first_bad = done;
        moved += k;
        if (moved) continue;
        /* Neither ring moved: arm both doorbells, then sleep on both. */
        bool want_space = sent < p->n;
        int a = want_space ? ring_arm_space(&req) : 0;
        int b = ring_arm_data(&cpl);
        if (a < 0 || b < 0) {
            snprintf(err, errlen, "arm: %.100s%.100s", a < 0 ? req.err : "", b < 0 ? cpl.err : "");
            goto out;
        }
        if (a == 0 && b == 0) {
            struct pollfd pf[2] = { { .fd = p->cpl_data, .events = POLLIN },
                                    { .fd = p->req_space, .events = POLLIN } };
            int r = poll(pf, want_space ? 2 : 1, TRAFFIC_WAIT_MS);
            if (r <= 0) {
                snprintf(err, errlen, "stuck: no doorbell within %d ms (sent %llu, done %llu, "
                         "consumer: %.80s)", TRAFFIC_WAIT_MS, (unsigned long long)sent,
                         (unsigned long long)done, p->st->cons_err);
                goto out;
            }
            if (want_space && pf[1].revents) p->st->req_sleeps++;
            if (pf[0].revents) p->st->cpl_sleeps++;
        }
        if (want_space) ring_disarm_space(&req);
        ring_disarm_data(&cpl);
    }
    if (bad) {
        snprintf(err, errlen, "%llu completions wrong, the first at %llu", (unsigned long long)bad,
                 (unsigned long long)first_bad);
        goto out;
    }
    if (ring_count(&cpl) != 0) {
        snprintf(err, errlen, "%u completions beyond %llu", ring_count(&cpl),
                 (unsigned long long)p->n);
        goto out;
    }
    rc = 0;
out:
    free(sums);
    return rc;
}

/* Lay out both rings and the stats in seg and create the doorbells. */
static int traffic_setup(traffic_t *p, shm_seg_t *seg, uint64_t n, uint32_t cap, uint64_t seed,
                         char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->req_data = p->req_space = p->cpl_data = p->cpl_space = -1;
    p->n = n;
    p->cap = cap;
    p->seed = seed ? seed : 1;
    p->req_bytes = ring_bytes(cap, sizeof(traffic_req_t));
    p->cpl_bytes = ring_bytes(cap, sizeof(traffic_cpl_t));
    if (!p->req_bytes || p->req_bytes + p->cpl_bytes + sizeof(traffic_stats_t) > seg->bytes) {
        snprintf(err, errlen, "a %u-entry ring pair does not fit in %zu bytes", cap, seg->bytes);
        return -1;
    }
    p->req_mem = seg->base;
    p->cpl_mem = (char *)seg->base + p->req_bytes; /* a multiple of 64 */
    p->st = (traffic_stats_t *)((char *)p->cpl_mem + p->cpl_bytes);
    memset(p->st, 0, sizeof *p->st);
    if (ring_init(p->req_mem, p->req_bytes, cap, sizeof(traffic_req_t), err, errlen) ||
        ring_init(p->cpl_mem, p->cpl_bytes, cap, sizeof(traffic_cpl_t), err, errlen) ||
        ring_doorbell_create(&p->req_data, err, errlen) ||
        ring_doorbell_create(&p->req_space, err, errlen) ||
        ring_doorbell_create(&p->cpl_data, err, errlen) ||
        ring_doorbell_create(&p->cpl_space, err, errlen))
        return -1;
    return 0;
}

static void traffic_close(traffic_t *p) {
    int *fds[] = { &p->req_data, &p->req_space, &p->cpl_data, &p->cpl_space };
    for (int i = 0; i < 4; i++)
        if (*fds[i] >= 0) close(*fds[i]), *fds[i] = -1;
}

/* Run the traffic between this process (producer) and a forked child
 * (consumer) that maps the memfd on its own. *st gets the statistics. */
static int traffic_fork(uint64_t n, uint32_t cap, uint64_t seed, traffic_stats_t *st,
                        char *err, size_t errlen) {
    shm_seg_t seg;
    if (shm_create(&seg, "ring-traffic", 64 << 10, 0, err, errlen)) return -1;
    traffic_t p;
    int rc = traffic_setup(&p, &seg, n, cap, seed, err, errlen);
    pid_t pid = rc ? -1 : fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed producer */
        shm_seg_t mine; /* the child maps the memfd itself, as a worker would */
        char cerr[SHM_ERR_LEN];
        if (shm_map_fd(&mine, dup(seg.fd), seg.bytes, cerr, sizeof cerr)) _exit(3);
        ptrdiff_t shift = (char *)mine.base - (char *)seg.base;
        traffic_t q = p;
        q.req_mem = (char *)p.req_mem + shift;
        q.cpl_mem = (char *)p.cpl_mem + shift;
        q.st = (traffic_stats_t *)((char *)p.st + shift);
        munmap(seg.base, seg.bytes);
        _exit(traffic_consumer(&q) ? 1 : q.st->cons_bad ? 2 : 0);
    }
    if (rc == 0 && pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        rc = -1;
    }
    if (rc == 0) {
        rc = traffic_producer(&p, err, errlen);
        if (rc) kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        if (rc == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            snprintf(err, errlen, "consumer process failed (status 0x%x): %s", status,
                     p.st->cons_err);
            rc = -1;
        }
    }
    if (p.st) *st = *p.st;
    traffic_close(&p);
    shm_destroy(&seg);
    return rc;
}

static void *traffic_consumer_thread(void *arg) {
    return (void *)(intptr_t)traffic_consumer(arg);
}

/* The same traffic between two threads of this process. */
static int traffic_threads(uint64_t n, uint32_t cap, uint64_t seed, traffic_stats_t *st,
                           char *err, size_t errlen) {
    shm_seg_t seg;
    if (shm_create(&seg, "ring-traffic", 64 << 10, 0, err, errlen)) return -1;
    traffic_t p;
    int rc = traffic_setup(&p, &seg, n, cap, seed, err, errlen);
    pthread_t th;
    if (rc == 0 && pthread_create(&th, NULL, traffic_consumer_thread, &p) != 0) {
        snprintf(err, errlen, "pthread_create failed");
        rc = -1;
    } else if (rc == 0) {
        rc = traffic_producer(&p, err, errlen);
        /* on a producer failure the consumer times out on its own */
        void *ret;
        pthread_join(th, &ret);
        if (rc == 0 && ((intptr_t)ret != 0 || p.st->cons_bad)) {
            snprintf(err, errlen, "consumer thread failed: %s", p.st->cons_err);
            rc = -1;
        }
    }
    if (p.st) *st = *p.st;
    traffic_close(&p);
    shm_destroy(&seg);
    return rc;
}

#endif
