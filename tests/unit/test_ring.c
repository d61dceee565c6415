/* test_ring.c: the SPSC ring (common/ring.c): single-thread semantics,
 * 10^6 entries between two processes and between two threads over small
 * rings with eventfd doorbells, and corrupt headers from an untrusted peer. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"

#include "ring.h"
#include "shm.h"

/* ---- helpers ---- */

#include "tests/ring_traffic.h"
#include "tests/unit/helpers.h"

#define rng_next traffic_rng
typedef traffic_req_t req_t;

static void make_req(req_t *q, uint64_t seq, uint64_t seed) { traffic_make_req(q, seq, seed); }

/* 64-byte aligned memory (aligned_alloc wants a multiple of the alignment). */
static void *amem(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    cr_assert(p);
    return p;
}

static uint64_t test_seed(void) { return th_seed(0x2545f4914f6cdd1dull ^ (uint64_t)getpid()); }

/* ---- single thread ---- */

Test(ring, bytes_and_init_validate_parameters) {
    cr_assert_eq(ring_bytes(64, 64), RING_HDR_BYTES + 64 * 64);
    cr_assert_eq(ring_bytes(0, 64), 0);
    cr_assert_eq(ring_bytes(48, 64), 0, "capacity not a power of two");
    cr_assert_eq(ring_bytes(64, 12), 0, "entry size not a multiple of 8");
    cr_assert_eq(ring_bytes(64, 0), 0);
    cr_assert_eq(ring_bytes(RING_MAX_CAPACITY * 2, 8), 0);
    cr_assert_eq(ring_bytes(4, RING_MAX_ENTRY + 8), 0);

    void *mem = amem(8192);
    char err[RING_ERR_LEN];
    cr_assert_eq(ring_init(mem, 8192, 48, 64, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "power of two"), "%s", err);
    cr_assert_eq(ring_init(mem, 1000, 64, 64, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "needs"), "%s", err);
    cr_assert_eq(ring_init((char *)mem + 8, 4096, 8, 8, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "aligned"), "%s", err);
    free(mem);
}

Test(ring, fifo_full_empty_batches_wraparound) {
    enum { CAP = 8, ESZ = sizeof(req_t) };
    size_t bytes = ring_bytes(CAP, ESZ);
    void *mem = amem(bytes);
    char err[RING_ERR_LEN];
    cr_assert_eq(ring_init(mem, bytes, CAP, ESZ, err, sizeof err), 0, "%s", err);
    ring_t r;
    cr_assert_eq(ring_attach(&r, mem, bytes, ESZ, err, sizeof err), 0, "%s", err);
    uint64_t seed = test_seed();
    req_t q, out[CAP + 3];
    cr_assert_eq(ring_pop(&r, &q), -EAGAIN, "empty ring pops nothing");
    uint64_t next_in = 0, next_out = 0;
    uint64_t s = seed;
    /* Random mixes of single and batch pushes and pops, checked against a
     * model FIFO (the sequence numbers). */
    for (int round = 0; round < 20000; round++) {
        uint32_t count = ring_count(&r);
        cr_assert_eq(count, next_in - next_out);
        uint64_t op = rng_next(&s);
        if (op & 1) {
            uint32_t n = 1 + (uint32_t)((op >> 8) % (CAP + 2));
            req_t in[CAP + 2];
            for (uint32_t i = 0; i < n; i++) make_req(&in[i], next_in + i, seed);
            int k = (op & 2) ? ring_push_batch(&r, in, n) : (int)(ring_push(&r, in) == 0);
            uint32_t want = (op & 2) ? (n < CAP - count ? n : CAP - count) : (count < CAP);
            cr_assert_eq(k, (int)want, "pushed %d of %u with %u queued", k, n, count);
            if (!(op & 2) && count == CAP) cr_assert_eq(ring_push(&r, in), -EAGAIN);
            next_in += (uint64_t)k;
        } else {
            uint32_t n = 1 + (uint32_t)((op >> 8) % (CAP + 3));
            int k = (op & 2) ? ring_pop_batch(&r, out, n) : (int)(ring_pop(&r, out) == 0);
            uint32_t want = (op & 2) ? (n < count ? n : count) : (count > 0);
            cr_assert_eq(k, (int)want, "popped %d of %u with %u queued", k, n, count);
            for (int i = 0; i < k; i++) {
                req_t ref;
                make_req(&ref, next_out + (uint64_t)i, seed);
                cr_assert_eq(memcmp(&out[i], &ref, sizeof ref), 0, "entry %llu differs",
                             (unsigned long long)(next_out + (uint64_t)i));
            }
            next_out += (uint64_t)k;
        }
    }
    cr_assert_gt(next_out, 5000, "the random walk moved entries (%llu)", (unsigned long long)next_out);
    free(mem);
}

Test(ring, counters_wrap_past_2_32) {
    enum { CAP = 4, ESZ = 16 };
    size_t bytes = ring_bytes(CAP, ESZ);
    void *mem = amem(bytes);
    cr_assert_eq(ring_init(mem, bytes, CAP, ESZ, NULL, 0), 0);
    ring_hdr_t *h = mem;
    atomic_store(&h->head, UINT32_MAX - 5); /* a long-lived ring */
    atomic_store(&h->tail, UINT32_MAX - 5);
    ring_t r;
    char err[RING_ERR_LEN];
    cr_assert_eq(ring_attach(&r, mem, bytes, 0, err, sizeof err), 0, "%s", err);
    for (uint64_t i = 0; i < 40; i++) {
        uint64_t v[2] = { i, ~i }, o[2];
        cr_assert_eq(ring_push(&r, v), 0);
        cr_assert_eq(ring_count(&r), 1);
        cr_assert_eq(ring_pop(&r, o), 0, "%s", r.err);
        cr_assert(o[0] == i && o[1] == ~i);
    }
    free(mem);
}

Test(ring, wait_times_out_on_empty_and_full) {
    enum { CAP = 2, ESZ = 8 };
    size_t bytes = ring_bytes(CAP, ESZ);
    void *mem = amem(bytes);
    cr_assert_eq(ring_init(mem, bytes, CAP, ESZ, NULL, 0), 0);
    ring_t r;
    cr_assert_eq(ring_attach(&r, mem, bytes, ESZ, NULL, 0), 0);
    uint64_t v = 7;
    cr_assert_eq(ring_pop_wait(&r, &v, 10), -EINVAL, "no doorbell set");
    int dfd, sfd;
    char err[RING_ERR_LEN];
    cr_assert_eq(ring_doorbell_create(&dfd, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ring_doorbell_create(&sfd, err, sizeof err), 0, "%s", err);
    ring_set_doorbells(&r, dfd, sfd);
    double a = clock_now_s();
    cr_assert_eq(ring_pop_wait(&r, &v, 50), -ETIMEDOUT);
    double ms = (clock_now_s() - a) * 1e3;
    cr_assert(ms >= 45 && ms < 2000, "waited %.1f ms for a 50 ms timeout", ms);
    cr_assert_eq(atomic_load(&((ring_hdr_t *)mem)->cons_waiting), 0, "flag cleared after timeout");
    cr_assert_eq(ring_push_wait(&r, &v, 0), 0);
    cr_assert_eq(ring_push_wait(&r, &v, 0), 0);
    cr_assert_eq(ring_push_wait(&r, &v, 30), -ETIMEDOUT, "full ring");
    cr_assert_eq(atomic_load(&((ring_hdr_t *)mem)->prod_waiting), 0);
    cr_assert_eq(ring_pop_wait(&r, &v, 0), 0);
    cr_assert_eq(ring_push_wait(&r, &v, 0), 0);
    /* a doorbell rung before the wait is not lost */
    cr_assert_eq(ring_doorbell_notify(dfd), 0);
    cr_assert_eq(ring_doorbell_wait(dfd, 1000), 0);
    cr_assert_eq(ring_doorbell_wait(dfd, 0), -ETIMEDOUT, "reset by the wait");
    close(dfd);
    close(sfd);
    free(mem);
}

/* ---- 10^6 entries between two sides (tests/ring_traffic.h) ---- */

#define N_ENTRIES 1000000u
#define SMALL_CAP 64u

static void traffic_check(int rc, const char *err, const traffic_stats_t *st, const char *how) {
    cr_assert_eq(rc, 0, "%s: %s", how, err);
    cr_log_info("%s: %u entries over %u-entry rings; the producer found the ring full %llu "
                "times and woke %llu (space) + %llu (completions) times; the consumer waited "
                "%llu times", how, N_ENTRIES, SMALL_CAP, (unsigned long long)st->req_full,
                (unsigned long long)st->req_sleeps, (unsigned long long)st->cpl_sleeps,
                (unsigned long long)st->cons_sleeps);
    cr_assert_eq(st->cons_bad, 0, "%s", st->cons_err);
    /* a small ring fills up and empties out, so both wait paths ran */
    cr_assert_gt(st->req_full, 0, "the request ring never filled up");
    cr_assert_gt(st->req_sleeps + st->cpl_sleeps + st->cons_sleeps, 0,
                 "no side ever slept on a doorbell");
}

Test(ring, two_processes_1e6_entries, .timeout = 60) {
    char err[256] = "";
    traffic_stats_t st;
    int rc = traffic_fork(N_ENTRIES, SMALL_CAP, test_seed(), &st, err, sizeof err);
    traffic_check(rc, err, &st, "two processes");
}

/* The same traffic between two threads, so that ThreadSanitizer (which
 * cannot see into another process) can check the ring's synchronization;
 * see tests/integration/ring_stress.c for the TSan run. */
Test(ring, two_threads_1e6_entries, .timeout = 60) {
    char err[256] = "";
    traffic_stats_t st;
    int rc = traffic_threads(N_ENTRIES, SMALL_CAP, test_seed(), &st, err, sizeof err);
    traffic_check(rc, err, &st, "two threads");
}

/* ---- an untrusted peer ---- */

/* A ring placed so that its last entry ends at a PROT_NONE guard page:
 * any read or write past the mapping faults. */
typedef struct {
    char *map;     /* whole mapping, incl. the guard page */
    size_t len;    /* bytes of the whole mapping */
    void *ring;    /* ring start */
    size_t bytes;  /* ring bytes (exactly up to the guard page) */
} guarded_t;

static void guarded_new(guarded_t *g, uint32_t cap, uint32_t esz) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    g->bytes = ring_bytes(cap, esz);
    size_t body = (g->bytes + pg - 1) / pg * pg;
    g->len = body + pg;
    g->map = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(g->map, MAP_FAILED);
    cr_assert_eq(mprotect(g->map + body, pg, PROT_NONE), 0);
    g->ring = g->map + body - g->bytes;
    cr_assert_eq((uintptr_t)g->ring % 64, 0);
    cr_assert_eq(ring_init(g->ring, g->bytes, cap, esz, NULL, 0), 0);
}

Test(ring, attach_rejects_corrupt_headers) {
    guarded_t g;
    guarded_new(&g, 64, 32);
    ring_hdr_t *h = g.ring;
    ring_t r;
    char err[RING_ERR_LEN];
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 32, err, sizeof err), 0, "%s", err);

    h->magic ^= 0x100;
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "magic"), "%s", err);
    h->magic ^= 0x100;

    h->capacity = 48;
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "power of two"), "%s", err);
    h->capacity = 128; /* a power of two, but 128 x 32 bytes overrun the mapping */
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "mapping"), "%s", err);
    h->capacity = 1u << 31;
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    h->capacity = 64;

    h->entry_size = 40; /* 64 x 40 > mapping */
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    h->entry_size = 12;
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    h->entry_size = 24; /* fits, but not what this protocol uses */
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 32, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "expected 32"), "%s", err);
    h->entry_size = 32;

    h->version = 99;
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "version"), "%s", err);
    h->version = RING_VERSION;
    h->entries_off = 128;
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    h->entries_off = RING_HDR_BYTES;

    atomic_store(&h->head, 1000);
    atomic_store(&h->tail, 1000 + 65); /* tail far ahead of head */
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "exceeds capacity"), "%s", err);
    atomic_store(&h->tail, 999); /* tail behind head */
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), -EBADMSG);
    atomic_store(&h->tail, 1000 + 64); /* exactly full is fine */
    cr_assert_eq(ring_attach(&r, g.ring, g.bytes, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ring_count(&r), 64);

    cr_assert_eq(ring_attach(&r, g.ring, 100, 0, err, sizeof err), -EINVAL, "mapping too small");
    munmap(g.map, g.len);
}

Test(ring, pop_and_push_reject_counters_corrupted_after_attach) {
    guarded_t g;
    guarded_new(&g, 16, 16);
    ring_hdr_t *h = g.ring;
    ring_t cons, prod;
    char err[RING_ERR_LEN];
    cr_assert_eq(ring_attach(&cons, g.ring, g.bytes, 16, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ring_attach(&prod, g.ring, g.bytes, 16, err, sizeof err), 0, "%s", err);
    uint64_t e[2] = { 1, 2 }, o[2];
    cr_assert_eq(ring_push(&prod, e), 0);
    cr_assert_eq(ring_push(&prod, e), 0);
    cr_assert_eq(ring_pop(&cons, o), 0); /* the consumer has now seen tail = 2 */
    /* the producer writes tail far ahead */
    atomic_store(&h->tail, 1u << 30);
    cr_assert_eq(ring_pop(&cons, o), 0, "the entry already seen is still fine");
    cr_assert_eq(ring_pop(&cons, o), -EBADMSG);
    cr_assert(strstr(cons.err, "exceeds capacity"), "%s", cons.err);
    cr_assert_eq(ring_pop_batch(&cons, o, 1), -EBADMSG);
    cr_assert_eq(ring_count(&cons), 16, "count is clamped");
    /* the consumer writes head past our tail */
    atomic_store(&h->head, 1u << 20); /* our tail is 2 */
    for (int i = 0; i < 20; i++) {
        int rc = ring_push(&prod, e);
        if (rc == -EBADMSG) break;
        cr_assert_eq(rc, 0, "push %d", i);
        cr_assert_lt(i, 16, "producer never noticed head > tail");
    }
    cr_assert_eq(ring_push(&prod, e), -EBADMSG);
    cr_assert(strstr(prod.err, "exceeds capacity"), "%s", prod.err);
    munmap(g.map, g.len);
}

/* Random garbage in the header: attach, pop and push must never crash or
 * touch memory outside the mapping (a guard page follows it). */
Test(ring, random_header_garbage_never_escapes_the_mapping) {
    guarded_t g;
    guarded_new(&g, 32, 24);
    uint64_t s = test_seed();
    uint8_t entry[RING_MAX_ENTRY];
    int attached = 0, popped = 0, pushed = 0;
    for (int it = 0; it < 20000; it++) {
        ring_init(g.ring, g.bytes, 32, 24, NULL, 0);
        ring_hdr_t *h = g.ring;
        /* mutate a few fields with values that are often near-valid */
        uint64_t v = rng_next(&s);
        uint32_t small = (uint32_t)(v >> 32) % 70;
        switch (v % 7) {
        case 0: h->capacity = small; break;
        case 1: h->entry_size = small * 4; break;
        case 2: atomic_store(&h->tail, (uint32_t)(v >> 20)); break;
        case 3: atomic_store(&h->head, (uint32_t)(v >> 20) % 80); atomic_store(&h->tail, small); break;
        case 4: ((uint8_t *)h)[(v >> 8) % RING_HDR_BYTES] ^= (uint8_t)(1u << ((v >> 16) % 8)); break;
        case 5: h->capacity = 1u << ((v >> 8) % 32); h->entry_size = 8u << ((v >> 16) % 14); break;
        default: break;
        }
        ring_t r;
        if (ring_attach(&r, g.ring, g.bytes, 0, NULL, 0) != 0) continue;
        attached++;
        cr_assert_leq((size_t)r.capacity * r.entry_size + RING_HDR_BYTES, g.bytes);
        /* corrupt counters after attach too */
        if (v & (1ull << 60)) atomic_store(&h->tail, (uint32_t)rng_next(&s));
        if (v & (1ull << 61)) atomic_store(&h->head, (uint32_t)rng_next(&s));
        for (int k = 0; k < 3; k++) {
            if (ring_pop(&r, entry) == 0) popped++;
            if (ring_push(&r, entry) == 0) pushed++;
        }
        ring_pop_batch(&r, entry, RING_MAX_ENTRY / r.entry_size < 100 ? RING_MAX_ENTRY / r.entry_size : 100);
    }
    cr_log_info("garbage headers: %d attached, %d pops, %d pushes went through", attached, popped, pushed);
    cr_assert_gt(attached, 100);
    munmap(g.map, g.len);
}

/* ---- the adaptive spin (see ring.h) ---- */

typedef struct {
    ring_t *r;
    atomic_int go;      /* consumer: 1 = about to wait for entry number seq */
    int rounds;
    long gap_us;
} spin_peer_t;

/* Push one entry gap_us after each go (busy: it is the peer copying). */
static void *spin_producer(void *arg) {
    spin_peer_t *p = arg;
    for (int i = 0; i < p->rounds; i++) {
        int64_t t0 = clock_now_ns();
        while (atomic_load(&p->go) != 1) {
            if (clock_now_ns() - t0 > 10ll * 1000 * 1000 * 1000) return NULL; /* bounded: the test fails on its own */
            sched_yield();
        }
        atomic_store(&p->go, 0);
        int64_t until = clock_now_ns() + p->gap_us * 1000; /* a sleep would overshoot by its timer slack */
        while (clock_now_ns() < until) {}
        uint64_t v = (uint64_t)i;
        while (ring_push(p->r, &v) == -EAGAIN) sched_yield();
    }
    return NULL;
}

/* The budget is learnt from how long entries took to come: none when they
 * take longer than RING_SPIN_MAX_NS, enough to cover the gaps that are
 * shorter (a peer copying a megabyte between requests), whether the waits
 * that saw those gaps spun or slept. */
/* A ring of 16 8-byte entries with a producer and a consumer handle in
 * this process; doorbells: with a data and a space eventfd set on both. */
typedef struct {
    void *mem;
    ring_t prod, cons;
    int dfd, sfd;
} ring_pair_t;

static void pair_open(ring_pair_t *p, bool doorbells) {
    enum { CAP = 16, ESZ = 8 };
    size_t bytes = ring_bytes(CAP, ESZ);
    p->mem = amem(bytes);
    cr_assert_eq(ring_init(p->mem, bytes, CAP, ESZ, NULL, 0), 0);
    cr_assert_eq(ring_attach(&p->prod, p->mem, bytes, ESZ, NULL, 0), 0);
    cr_assert_eq(ring_attach(&p->cons, p->mem, bytes, ESZ, NULL, 0), 0);
    p->dfd = p->sfd = -1;
    if (!doorbells) return;
    char err[RING_ERR_LEN];
    cr_assert_eq(ring_doorbell_create(&p->dfd, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ring_doorbell_create(&p->sfd, err, sizeof err), 0, "%s", err);
    ring_set_doorbells(&p->prod, p->dfd, p->sfd);
    ring_set_doorbells(&p->cons, p->dfd, p->sfd);
}

static void pair_close(ring_pair_t *p) {
    if (p->dfd >= 0) close(p->dfd);
    if (p->sfd >= 0) close(p->sfd);
    free(p->mem);
}

Test(ring, spin_budget_follows_the_gaps, .timeout = 60) {
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) cr_skip_test("one online CPU: rings never spin");
    ring_pair_t rp;
    pair_open(&rp, true);
    uint64_t v;

    /* an idle peer: every wait runs out (5 ms) -> no budget */
    for (unsigned i = 0; i < RING_SPIN_HIST; i++) cr_assert_eq(ring_wait_data(&rp.cons, 5), -ETIMEDOUT);
    cr_assert_eq(rp.cons.spin_ns, 0, "after %u waits of 5 ms the budget is %u ns", RING_SPIN_HIST, rp.cons.spin_ns);

    /* gaps of 30-50 us, from another thread: the budget covers every
     * recorded gap within RING_SPIN_MAX_NS (a gap the scheduler stretched
     * past it is left out; a quarter must be short) */
    uint64_t seed = test_seed();
    spin_peer_t p = { .r = &rp.prod, .rounds = 24, .gap_us = 30 + (long)(seed % 21) };
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, spin_producer, &p), 0);
    for (int i = 0; i < p.rounds; i++) {
        atomic_store(&p.go, 1);
        cr_assert_eq(ring_pop_wait(&rp.cons, &v, 10000), 0, "entry %d never came", i);
        cr_assert_eq(v, (uint64_t)i);
    }
    pthread_join(t, NULL);
    unsigned shorts = 0, longest = 0;
    for (unsigned i = 0; i < RING_SPIN_HIST; i++)
        if (rp.cons.gap_ns[i] <= RING_SPIN_MAX_NS) {
            shorts++;
            if (rp.cons.gap_ns[i] > longest) longest = rp.cons.gap_ns[i];
        }
    cr_log_info("gap %ld us: %u of the last %u gaps within %u ns, longest %u ns, budget %u ns", p.gap_us, shorts,
                RING_SPIN_HIST, RING_SPIN_MAX_NS, longest, rp.cons.spin_ns);
    cr_assert_geq(4 * shorts, RING_SPIN_HIST, "%u of %u gaps of %ld us were recorded within %u ns", shorts,
                  RING_SPIN_HIST, p.gap_us, RING_SPIN_MAX_NS);
    cr_assert_geq(rp.cons.spin_ns, longest, "budget %u ns does not cover a %u ns gap", rp.cons.spin_ns, longest);
    cr_assert_geq(longest, (unsigned)p.gap_us * 1000, "a gap shorter than the producer's wait");
    cr_assert_leq(rp.cons.spin_ns, RING_SPIN_MAX_NS);

    /* entries already there: gaps of about nothing, a small budget */
    for (unsigned i = 0; i < RING_SPIN_HIST; i++) {
        v = i;
        cr_assert_eq(ring_push(&rp.prod, &v), 0);
        cr_assert_eq(ring_wait_data(&rp.cons, 1000), 0);
        cr_assert_eq(ring_pop(&rp.cons, &v), 0);
    }
    cr_assert_gt(rp.cons.spin_ns, 0);
    cr_assert_lt(rp.cons.spin_ns, RING_SPIN_MAX_NS / 2, "budget %u ns for entries that were already there", rp.cons.spin_ns);
    pair_close(&rp);
}

/* ring_wait_data_at: a push wakes its sleep at once, an entry after the
 * time it was due is caught by the poll, and with nothing coming it polls
 * until it was told to and learns how late its timed sleep woke; where the
 * peer last ran on this CPU it returns at once. The consumer (this thread)
 * and the producer are pinned to different CPUs so that the same-CPU rule
 * does not fire by chance. */
static void pin_to(pthread_t t, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    cr_assert_eq(pthread_setaffinity_np(t, sizeof set, &set), 0, "pinning to CPU %d", cpu);
}

Test(ring, wait_data_at_sleeps_until_due_and_wakes_on_push, .timeout = 60) {
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) cr_skip_test("one online CPU: rings never spin");
    cpu_set_t mine;
    cr_assert_eq(sched_getaffinity(0, sizeof mine, &mine), 0);
    int cpus[2], nc = 0;
    for (int c = 0; c < CPU_SETSIZE && nc < 2; c++)
        if (CPU_ISSET(c, &mine)) cpus[nc++] = c;
    if (nc < 2) cr_skip_test("this test may run on one CPU only");
    pin_to(pthread_self(), cpus[0]);
    uint64_t seed = test_seed(), v;
    const int64_t ms = 1000000;
    ring_pair_t rp;
    pair_open(&rp, false);
    cr_assert_eq(ring_wait_data_at(&rp.cons, clock_now_ns(), clock_now_ns()), -EINVAL, "no doorbell set");
    pair_close(&rp);
    pair_open(&rp, true);
    void *mem = rp.mem;

    /* an entry already there: at once */
    v = 41;
    cr_assert_eq(ring_push(&rp.prod, &v), 0);
    int64_t t0 = clock_now_ns();
    cr_assert_eq(ring_wait_data_at(&rp.cons, t0 + 2000 * ms, t0 + 3000 * ms), 1);
    cr_assert_lt(clock_now_ns() - t0, 1000 * ms);
    cr_assert_eq(ring_pop(&rp.cons, &v), 0);
    cr_assert_eq(v, 41);

    /* nothing comes: it polls until `until` and learns its timed sleep's lateness */
    atomic_store(&((ring_hdr_t *)mem)->prod_cpu, 0);
    cr_assert_eq(rp.cons.late_ns, 0);
    t0 = clock_now_ns();
    int64_t at = t0 + 3 * ms + (int64_t)(seed % 3) * ms, until = at + 2 * ms;
    cr_assert_eq(ring_wait_data_at(&rp.cons, at, until), 0);
    int64_t took = clock_now_ns() - t0;
    cr_assert_geq(took, until - t0, "returned %lld ns early", (long long)(until - t0 - took));
    cr_assert_gt(rp.cons.late_ns, 0, "the timed sleep ran out and nothing was learnt");
    cr_assert_leq(rp.cons.late_ns, RING_AT_LATE_MAX);
    cr_assert_eq(atomic_load(&((ring_hdr_t *)mem)->cons_waiting), 0, "flag cleared after the sleep");

    /* a push long before the entry was due wakes the sleep: the producer
     * pushes after 5-9 ms, the entry was due in 2 s */
    spin_peer_t p = { .r = &rp.prod, .rounds = 2, .gap_us = 5000 + (long)(seed % 4000) };
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, spin_producer, &p), 0);
    pin_to(t, cpus[1]);
    t0 = clock_now_ns();
    atomic_store(&p.go, 1);
    cr_assert_eq(ring_wait_data_at(&rp.cons, t0 + 2000 * ms, t0 + 2001 * ms), 1);
    took = clock_now_ns() - t0;
    cr_assert_lt(took, 1000 * ms, "a push after %ld us was seen after %lld ms: it did not wake the sleep", p.gap_us,
                 (long long)(took / ms));
    cr_assert_geq(took, p.gap_us * 1000 - ms);
    cr_assert_eq(ring_pop(&rp.cons, &v), 0);
    cr_assert_eq(v, 0);

    /* an entry later than due is caught while polling */
    t0 = clock_now_ns();
    atomic_store(&p.go, 1);
    cr_assert_eq(ring_wait_data_at(&rp.cons, t0 + ms, t0 + 3000 * ms), 1, "the entry %ld us after go was missed",
                 p.gap_us);
    cr_assert_eq(ring_pop(&rp.cons, &v), 0);
    cr_assert_eq(v, 1);
    pthread_join(t, NULL);

    /* the producer last ran on this CPU: no waiting at all */
    atomic_store(&((ring_hdr_t *)mem)->prod_cpu, (uint32_t)cpus[0] + 1);
    t0 = clock_now_ns();
    cr_assert_eq(ring_wait_data_at(&rp.cons, t0 + 1000 * ms, t0 + 2000 * ms), 0);
    cr_assert_lt(clock_now_ns() - t0, 500 * ms);
    pair_close(&rp);
}
