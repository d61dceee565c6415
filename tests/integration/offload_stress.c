/* offload_stress.c: load generator and checker for ballastd, used by
 * tests/integration/ballastd_stress.sh and ballastd_faults.sh.
 *
 *   offload_stress stress --addr A --clients N --total-bytes B [--remote] ...
 *       fork N client processes; together they put B bytes of blobs with
 *       random put/get/prefetch/free (and pin/unpin in shared mode), every
 *       byte of every get checked against a pattern derived from the blob's
 *       seed, then read back and free everything still live.
 *   offload_stress badring --addr A      bad ring entries, each must fail
 *       with its own status while a good op in between still works
 *   offload_stress quota --addr A        over quota -> RESOURCE_EXHAUSTED
 *       for that session only
 *   offload_stress persist-writer --addr A --log F --count N
 *       put persistent blobs one by one, appending "index len seed" to F
 *       (fsynced) only after each put was acknowledged; the test kills
 *       ballastd while this runs
 *   offload_stress persist-check --addr A --log F
 *       after a restart: every logged (acknowledged) blob must come back
 *       byte-exact; the first unlogged index must be NOT_FOUND or exact
 *   offload_stress hold --addr A --bytes B   put B bytes, print "held",
 *       then sleep forever (killed with -9 by the test)
 *   offload_stress lat --addr A --iters N    ring and RPC latency (bench)
 *   offload_stress badrpc --addr A [--quota Q] [--token T]   malformed RPCs,
 *       each with its status, and the service keeps serving
 *   offload_stress health --addr host:port   grpc.health.v1 Check == SERVING
 *   offload_stress drain --addr A [--token T]  the Drain RPC
 *
 * Exit status 0 when every check passed; messages go to stderr. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "clock.h"
#include "offload.pb-c.h"
#include "rpc.h"
#include "proto/offload_ring.h"
#include "workers/offload/client.h"

/* ---- options ---- */

static const char *g_addr = "unix:/tmp/ballastd.sock";
static const char *g_job = "stress";
static const char *g_log = NULL;
static int g_clients = 4;
static uint64_t g_total = 64ull << 20;
static uint64_t g_max_blob = 4ull << 20;
static uint64_t g_live_cap = 160ull << 20;
static uint64_t g_bytes = 32ull << 20;
static uint64_t g_seed = 12345;
static bool g_remote = false;
static int g_count = 100;
static int g_iters = 2000;
static uint64_t g_quota = 0;

/* ---- patterns ---- */

static uint64_t mix(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Fill buf with the pattern of seed (never all zeros: xorshift state != 0). */
static void fill(void *buf, uint64_t len, uint64_t seed) {
    uint64_t s = mix(seed) | 1;
    uint8_t *p = buf;
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        memcpy(p + i, &s, 8);
    }
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    for (; i < len; i++) p[i] = (uint8_t)(s >> (8 * (i & 7)));
}

/* Offset of the first byte that differs from the pattern, or -1. */
static int64_t check(const void *buf, uint64_t len, uint64_t seed) {
    uint64_t s = mix(seed) | 1;
    const uint8_t *p = buf;
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        if (memcmp(p + i, &s, 8) != 0) {
            for (int j = 0; j < 8; j++) if (p[i + j] != (uint8_t)(s >> (8 * j))) return (int64_t)(i + j);
        }
    }
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    for (; i < len; i++) if (p[i] != (uint8_t)(s >> (8 * (i & 7)))) return (int64_t)i;
    return -1;
}

static uint64_t rng_state;
static uint64_t rnd(void) { rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull; return mix(rng_state); }

/* ---- session ---- */

static oc_client_t *open_client(uint32_t rank, uint64_t quota) {
    oc_options_t o = { 0 };
    o.addr = g_addr;
    o.job = g_job;
    o.rank = rank;
    o.quota_bytes = quota;
    o.flags = g_remote ? OC_REMOTE : 0;
    o.timeout_s = 60;
    o.client_name = "offload_stress";
    oc_client_t *c = NULL;
    if (oc_open(&o, &c)) { fprintf(stderr, "open (rank %u): %s\n", rank, oc_last_error()); return NULL; }
    return c;
}

/* Put len bytes of pattern seed under k, writing straight into the region. */
static status_t put_pattern(oc_client_t *c, const oc_key_t *k, uint64_t len, uint64_t seed, bool persistent) {
    oc_buf_t b;
    status_t st = oc_put_alloc(c, k, len, persistent, &b);
    if (st) return st;
    fill(b.ptr, len, seed);
    return oc_put_commit(c, k, &b);
}

/* Get k and compare with the pattern; 0 ok, 1 mismatch, or -status. */
static int get_check(oc_client_t *c, const oc_key_t *k, uint64_t len, uint64_t seed) {
    oc_buf_t b;
    status_t st = oc_get(c, k, &b);
    if (st) return -(int)st;
    int bad = 0;
    if (b.len != len) {
        fprintf(stderr, "key index %" PRIu64 ": length %" PRIu64 ", expected %" PRIu64 "\n", k->index, b.len, len);
        bad = 1;
    } else {
        int64_t off = check(b.ptr, len, seed);
        if (off >= 0) {
            fprintf(stderr, "key index %" PRIu64 ": byte %" PRId64 " of %" PRIu64 " differs\n", k->index, off, len);
            bad = 1;
        }
    }
    st = oc_get_done(c, k, &b);
    if (st && !bad) { fprintf(stderr, "get_done: %s\n", oc_last_error()); bad = 1; }
    return bad;
}

/* ---- stress ---- */

typedef struct { oc_key_t k; uint64_t len, seed; bool pinned; } live_t;

static int stress_client(int id) {
    rng_state = g_seed * 1000003u + (uint64_t)id;
    oc_client_t *c = open_client((uint32_t)id, 0);
    if (!c) return 1;
    uint64_t budget = g_total / (uint64_t)g_clients, pushed = 0, verified = 0;
    uint64_t max_blob = g_max_blob;
    if (oc_max_blob(c) && max_blob > oc_max_blob(c)) max_blob = oc_max_blob(c);
    size_t cap = 4096, n = 0;
    live_t *live = calloc(cap, sizeof *live);
    uint64_t live_bytes = 0, next_index = 0;
    uint64_t nput = 0, nget = 0, npref = 0, nfree = 0, npin = 0;
    int fails = 0;
    double t0 = clock_now_s();
    while (pushed < budget && fails == 0) {
        uint64_t r = rnd() % 100;
        if (n == 0 || (r < 40 && live_bytes < g_live_cap)) {
            uint64_t len = 1 + rnd() % max_blob;
            if (rnd() % 4 == 0) len = 4096 * (1 + rnd() % 16); /* exact page multiples too */
            if (pushed + len > budget) len = budget - pushed;
            if (len == 0) break;
            oc_key_t k = { (uint32_t)id, 1 + (uint32_t)(rnd() % 4), next_index++, rnd() % 1000 };
            uint64_t seed = rnd();
            status_t st = put_pattern(c, &k, len, seed, false);
            if (st) { fprintf(stderr, "client %d: put: %s\n", id, oc_last_error()); fails++; break; }
            if (n == cap) { cap *= 2; live = realloc(live, cap * sizeof *live); }
            live[n++] = (live_t){ k, len, seed, false };
            live_bytes += len;
            pushed += len;
            nput++;
        } else if (r < 70) {
            live_t *l = &live[rnd() % n];
            int rc = get_check(c, &l->k, l->len, l->seed);
            if (rc) { fprintf(stderr, "client %d: get: %s\n", id, rc < 0 ? oc_last_error() : "mismatch"); fails++; }
            nget++;
            verified += l->len;
        } else if (r < 80) {
            /* async prefetch of a few, then one async get checked through its handle */
            oc_handle_t hs[4];
            int m = 0;
            for (int j = 0; j < 4 && j < (int)n; j++) {
                if (oc_prefetch_async(c, &live[rnd() % n].k, &hs[m])) { fprintf(stderr, "prefetch: %s\n", oc_last_error()); fails++; break; }
                m++;
            }
            for (int j = 0; j < m; j++)
                if (oc_wait(c, hs[j], NULL, 60)) { fprintf(stderr, "client %d: prefetch wait: %s\n", id, oc_last_error()); fails++; }
            live_t *l = &live[rnd() % n];
            oc_handle_t h;
            oc_buf_t b;
            if (oc_get_async(c, &l->k, &h) || oc_wait(c, h, &b, 60)) {
                fprintf(stderr, "client %d: async get: %s\n", id, oc_last_error());
                fails++;
            } else {
                if (b.len != l->len || check(b.ptr, b.len, l->seed) >= 0) { fprintf(stderr, "client %d: async get mismatch\n", id); fails++; }
                if (oc_get_done(c, &l->k, &b)) { fprintf(stderr, "get_done: %s\n", oc_last_error()); fails++; }
                verified += l->len;
            }
            npref += (uint64_t)m;
        } else if (r < 95) {
            size_t i = rnd() % n;
            if (live[i].pinned && oc_unpin(c, &live[i].k)) { fprintf(stderr, "unpin: %s\n", oc_last_error()); fails++; }
            if (oc_free(c, &live[i].k)) { fprintf(stderr, "client %d: free: %s\n", id, oc_last_error()); fails++; }
            /* a freed key must be gone */
            oc_buf_t b;
            status_t st = oc_get(c, &live[i].k, &b);
            if (st != STATUS_NOT_FOUND) {
                fprintf(stderr, "client %d: get after free gave %s, expected NOT_FOUND\n", id, status_name(st));
                if (st == STATUS_OK) oc_get_done(c, &live[i].k, &b);
                fails++;
            }
            live_bytes -= live[i].len;
            live[i] = live[--n];
            nfree++;
        } else if (!g_remote) {
            live_t *l = &live[rnd() % n];
            if (!l->pinned && l->len < (1u << 20)) {
                if (oc_pin(c, &l->k)) { fprintf(stderr, "pin: %s\n", oc_last_error()); fails++; }
                else { l->pinned = true; npin++; }
            } else if (l->pinned) {
                if (oc_unpin(c, &l->k)) { fprintf(stderr, "unpin: %s\n", oc_last_error()); fails++; }
                l->pinned = false;
            }
        }
    }
    /* everything still live must come back exact; then free it */
    for (size_t i = 0; i < n && fails == 0; i++) {
        int rc = get_check(c, &live[i].k, live[i].len, live[i].seed);
        if (rc) { fprintf(stderr, "client %d: final get: %s\n", id, rc < 0 ? oc_last_error() : "mismatch"); fails++; }
        verified += live[i].len;
        if (live[i].pinned) oc_unpin(c, &live[i].k);
        if (oc_free(c, &live[i].k)) { fprintf(stderr, "client %d: final free: %s\n", id, oc_last_error()); fails++; }
    }
    double dt = clock_now_s() - t0;
    printf("client %d: %s mode, put %" PRIu64 " blobs (%.1f MiB), %" PRIu64 " gets, %" PRIu64 " prefetches, %" PRIu64
           " frees, %" PRIu64 " pins, verified %.1f MiB, %.1fs, %s\n", id, oc_is_shared(c) ? "shm" : "remote", nput,
           pushed / 1048576.0, nget, npref, nfree, npin, verified / 1048576.0, dt, fails ? "FAILED" : "ok");
    fflush(stdout);
    oc_close(c, false);
    free(live);
    return fails ? 1 : 0;
}

static int cmd_stress(void) {
    pid_t pids[64];
    if (g_clients < 1 || g_clients > 64) { fprintf(stderr, "--clients must be 1..64\n"); return 2; }
    for (int i = 0; i < g_clients; i++) {
        pid_t p = fork();
        if (p < 0) { perror("fork"); return 1; }
        if (p == 0) _exit(stress_client(i));
        pids[i] = p;
    }
    int bad = 0;
    for (int i = 0; i < g_clients; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "client %d failed (status %d)\n", i, st); bad++; }
    }
    printf("stress: %d clients, %d failed\n", g_clients, bad);
    return bad ? 1 : 0;
}

/* ---- bad ring entries ---- */

static int expect_raw(oc_client_t *c, const char *what, rp_req_t *q, uint32_t want_status, uint32_t want_detail) {
    rp_cpl_t p;
    memset(&p, 0, sizeof p);
    status_t st = oc_raw_call(c, q, &p, 10);
    if ((uint32_t)st != want_status || p.status != want_status || (want_detail && p.detail != want_detail)) {
        fprintf(stderr, "badring %s: got status %u detail %u (%s), want %u detail %u\n", what, p.status, p.detail,
                rp_detail_text(p.detail), want_status, want_detail);
        return 1;
    }
    printf("ok: %s -> %s (%s)\n", what, status_name((status_t)p.status), rp_detail_text(p.detail));
    return 0;
}

static rp_req_t *req_reset(rp_req_t *q, uint32_t op) {
    memset(q, 0, sizeof *q);
    q->op = op;
    q->kind = OC_KIND_ACTIVATION;
    q->index = 1;
    q->step = 1;
    return q;
}

static int cmd_badring(void) {
    rng_state = g_seed;
    oc_client_t *c = open_client(0, 0), *other = open_client(1, 0);
    if (!c || !other) return 1;
    if (!oc_is_shared(c)) { fprintf(stderr, "badring needs shared-memory mode\n"); return 2; }
    int bad = 0;
    oc_key_t good = { 0, OC_KIND_ACTIVATION, 1, 1 };
    uint64_t seed = rnd();
    if (put_pattern(c, &good, 100000, seed, false)) { fprintf(stderr, "put: %s\n", oc_last_error()); return 1; }
    oc_key_t ok2 = { 1, OC_KIND_PARAM, 7, 3 };
    uint64_t seed2 = rnd();
    if (put_pattern(other, &ok2, 50000, seed2, false)) { fprintf(stderr, "put other: %s\n", oc_last_error()); return 1; }
    /* a region of this session to misuse */
    oc_buf_t pend;
    oc_key_t pk = { 0, OC_KIND_OTHER, 99, 0 };
    if (oc_put_alloc(c, &pk, 8192, false, &pend)) { fprintf(stderr, "alloc: %s\n", oc_last_error()); return 1; }
    /* other's pending region: this session must not be able to commit or touch it */
    oc_buf_t opend;
    oc_key_t opk = { 1, OC_KIND_OTHER, 55, 0 };
    if (oc_put_alloc(other, &opk, 8192, false, &opend)) { fprintf(stderr, "alloc other: %s\n", oc_last_error()); return 1; }

    rp_req_t q;
#define Q(op_) (void)req_reset(&q, (op_))
    bad += expect_raw(c, "op 0", req_reset(&q, 0), STATUS_INVALID_ARGUMENT, RP_D_BAD_OP);
    bad += expect_raw(c, "op 77", req_reset(&q, 77), STATUS_INVALID_ARGUMENT, RP_D_BAD_OP);
    Q(RP_OP_GET); q.kind = 9;
    bad += expect_raw(c, "kind 9", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_KIND);
    Q(RP_OP_GET); q.kind = 0;
    bad += expect_raw(c, "kind 0", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_KIND);
    Q(RP_OP_GET); q.flags = 0x80;
    bad += expect_raw(c, "unknown flag", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_FLAGS);
    Q(RP_OP_GET); q.reserved = 5;
    bad += expect_raw(c, "reserved bytes", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_PAD);
    Q(RP_OP_PUT_ALLOC); q.index = 1000; q.length = 0;
    bad += expect_raw(c, "put length 0", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_LENGTH);
    Q(RP_OP_PUT_ALLOC); q.index = 1000; q.length = 1ull << 62;
    bad += expect_raw(c, "put length 2^62", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_LENGTH);
    Q(RP_OP_PUT_ALLOC); q.length = 4096;
    bad += expect_raw(c, "put of an existing key", &q, STATUS_ALREADY_EXISTS, RP_D_EXISTS);
    /* commit with a region outside the pool / not held / of another session */
    Q(RP_OP_PUT_COMMIT); q.kind = OC_KIND_OTHER; q.index = 99; q.step = 0; q.seg = 999; q.offset = pend._off; q.length = 8192;
    bad += expect_raw(c, "commit: segment 999", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_REGION);
    Q(RP_OP_PUT_COMMIT); q.kind = OC_KIND_OTHER; q.index = 99; q.step = 0; q.seg = pend._seg; q.offset = ~0ull - 100; q.length = 8192;
    bad += expect_raw(c, "commit: offset wraps", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_REGION);
    Q(RP_OP_PUT_COMMIT); q.kind = OC_KIND_OTHER; q.index = 99; q.step = 0; q.seg = pend._seg; q.offset = pend._off + 4096; q.length = 1 << 20;
    bad += expect_raw(c, "commit: length past the region", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_REGION);
    Q(RP_OP_PUT_COMMIT); q.rank = 1; q.kind = OC_KIND_OTHER; q.index = 55; q.step = 0; q.seg = opend._seg; q.offset = opend._off; q.length = 8192;
    bad += expect_raw(c, "commit: another session's region", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_REGION);
    Q(RP_OP_GET_DONE); q.seg = pend._seg; q.offset = pend._off; q.length = 8192;
    bad += expect_raw(c, "get_done without a get", &q, STATUS_INVALID_ARGUMENT, RP_D_BAD_REGION);
    Q(RP_OP_GET); q.index = 424242;
    bad += expect_raw(c, "get of a missing key", &q, STATUS_NOT_FOUND, RP_D_NO_KEY);
    Q(RP_OP_FREE); q.index = 424242;
    bad += expect_raw(c, "free of a missing key", &q, STATUS_NOT_FOUND, RP_D_NO_KEY);
    Q(RP_OP_UNPIN);
    bad += expect_raw(c, "unpin without pin", &q, STATUS_FAILED_PRECONDITION, 0);
    /* a burst of garbage entries: each answered, none kills the session */
    for (int i = 0; i < 200; i++) {
        uint8_t raw[64];
        for (int j = 0; j < 64; j += 8) { uint64_t v = rnd(); memcpy(raw + j, &v, 8); }
        rp_req_t *g = (rp_req_t *)raw;
        if (g->op > 0 && g->op < RP_OP_MAX_ && g->op != RP_OP_NOP) g->op += 100; /* keep it invalid */
        if (g->op == RP_OP_NOP) g->op = 0;
        rp_cpl_t p;
        status_t st = oc_raw_call(c, raw, &p, 10);
        if (st != STATUS_INVALID_ARGUMENT) { fprintf(stderr, "garbage entry %d: status %d\n", i, st); bad++; break; }
    }
    printf("ok: 200 random garbage entries each failed with INVALID_ARGUMENT\n");
    /* the session and the other session still work, data intact */
    if (get_check(c, &good, 100000, seed)) { fprintf(stderr, "session broken after bad entries: %s\n", oc_last_error()); bad++; }
    else printf("ok: the same session still serves its blob byte-exact\n");
    if (get_check(other, &ok2, 50000, seed2)) { fprintf(stderr, "other session affected: %s\n", oc_last_error()); bad++; }
    else printf("ok: another session is untouched\n");
    /* the pending put still commits normally */
    fill(pend.ptr, 8192, 77);
    if (oc_put_commit(c, &pk, &pend) || get_check(c, &pk, 8192, 77)) { fprintf(stderr, "pending put: %s\n", oc_last_error()); bad++; }
    fill(opend.ptr, 8192, 78);
    if (oc_put_commit(other, &opk, &opend) || get_check(other, &opk, 8192, 78)) { fprintf(stderr, "other pending put: %s\n", oc_last_error()); bad++; }
    oc_close(c, false);
    oc_close(other, false);
    return bad ? 1 : 0;
}

/* ---- quota ---- */

static int cmd_quota(void) {
    rng_state = g_seed;
    uint64_t q = g_quota ? g_quota : (1ull << 20);
    oc_client_t *small = open_client(0, q), *big = open_client(1, 0);
    if (!small || !big) return 1;
    int bad = 0;
    oc_key_t k1 = { 0, OC_KIND_ACTIVATION, 1, 0 }, k2 = { 0, OC_KIND_ACTIVATION, 2, 0 };
    if (put_pattern(small, &k1, q / 2, 5, false)) { fprintf(stderr, "first put within quota: %s\n", oc_last_error()); bad++; }
    status_t st = put_pattern(small, &k2, q, 6, false);
    if (st != STATUS_RESOURCE_EXHAUSTED) { fprintf(stderr, "over-quota put gave %s, want RESOURCE_EXHAUSTED\n", status_name(st)); bad++; }
    else printf("ok: over quota -> RESOURCE_EXHAUSTED: %s\n", oc_last_error());
    /* the other session is not limited by it */
    oc_key_t k3 = { 1, OC_KIND_ACTIVATION, 3, 0 };
    if (put_pattern(big, &k3, 2 * q, 7, false) || get_check(big, &k3, 2 * q, 7)) { fprintf(stderr, "other session: %s\n", oc_last_error()); bad++; }
    else printf("ok: another session puts %llu bytes meanwhile\n", (unsigned long long)(2 * q));
    /* after a free the quota is available again */
    if (oc_free(small, &k1) || put_pattern(small, &k2, q - 4096, 8, false) || get_check(small, &k2, q - 4096, 8)) {
        fprintf(stderr, "put after free: %s\n", oc_last_error()); bad++;
    } else printf("ok: quota returns after a free\n");
    oc_close(small, false);
    oc_close(big, false);
    return bad ? 1 : 0;
}

/* ---- persistence across kill -9 ---- */

static int cmd_persist_writer(void) {
    if (!g_log) { fprintf(stderr, "--log is required\n"); return 2; }
    int fd = open(g_log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) { perror(g_log); return 1; }
    oc_client_t *c = open_client(0, 0);
    if (!c) return 1;
    rng_state = g_seed;
    for (int i = 0; i < g_count; i++) {
        oc_key_t k = { 0, OC_KIND_OPTIMIZER_STATE, (uint64_t)i, 7 };
        uint64_t len = 1 + rnd() % (512 << 10), seed = rnd();
        char line[128];
        /* announce first (so the checker knows the next index), ack after */
        int n = snprintf(line, sizeof line, "try %d %" PRIu64 " %" PRIu64 "\n", i, len, seed);
        if (write(fd, line, (size_t)n) != n || fdatasync(fd)) { perror("log"); return 1; }
        status_t st = put_pattern(c, &k, len, seed, true);
        if (st) { fprintf(stderr, "persistent put %d: %s\n", i, oc_last_error()); return 1; }
        n = snprintf(line, sizeof line, "ack %d %" PRIu64 " %" PRIu64 "\n", i, len, seed);
        if (write(fd, line, (size_t)n) != n || fdatasync(fd)) { perror("log"); return 1; }
    }
    oc_close(c, true);
    return 0;
}

static int cmd_persist_check(void) {
    if (!g_log) { fprintf(stderr, "--log is required\n"); return 2; }
    FILE *f = fopen(g_log, "r");
    if (!f) { perror(g_log); return 1; }
    oc_client_t *c = open_client(0, 0);
    if (!c) return 1;
    char what[8];
    int i;
    uint64_t len, seed;
    int acked = 0, bad = 0, unacked_missing = 0, unacked_exact = 0;
    int last_try = -1;
    uint64_t try_len = 0, try_seed = 0;
    while (fscanf(f, "%7s %d %" SCNu64 " %" SCNu64, what, &i, &len, &seed) == 4) {
        if (strcmp(what, "try") == 0) { last_try = i; try_len = len; try_seed = seed; continue; }
        last_try = -1;
        oc_key_t k = { 0, OC_KIND_OPTIMIZER_STATE, (uint64_t)i, 7 };
        int rc = get_check(c, &k, len, seed);
        if (rc) { fprintf(stderr, "acknowledged blob %d: %s\n", i, rc < 0 ? oc_last_error() : "corrupt"); bad++; }
        else acked++;
    }
    fclose(f);
    if (last_try >= 0) {
        /* the put in flight at the kill: missing, or (if its ack was on the way) exact; never corrupt */
        oc_key_t k = { 0, OC_KIND_OPTIMIZER_STATE, (uint64_t)last_try, 7 };
        int rc = get_check(c, &k, try_len, try_seed);
        if (rc == -(int)STATUS_NOT_FOUND) unacked_missing++;
        else if (rc == 0) unacked_exact++;
        else { fprintf(stderr, "unacknowledged blob %d came back wrong (%d): %s\n", last_try, rc, oc_last_error()); bad++; }
        /* and the next index was never written */
        oc_key_t k2 = { 0, OC_KIND_OPTIMIZER_STATE, (uint64_t)last_try + 1, 7 };
        oc_buf_t b;
        status_t st = oc_get(c, &k2, &b);
        if (st != STATUS_NOT_FOUND) { fprintf(stderr, "never-written blob %d: %s\n", last_try + 1, status_name(st)); bad++; }
    }
    printf("persist-check: %d acknowledged blobs byte-exact, %d failed; in-flight blob: %d missing, %d exact\n",
           acked, bad, unacked_missing, unacked_exact);
    oc_close(c, true);
    return bad || acked == 0 ? 1 : 0;
}

/* ---- a client that dies holding memory ---- */

static int cmd_hold(void) {
    oc_client_t *c = open_client(0, 0);
    if (!c) return 1;
    uint64_t left = g_bytes, i = 0;
    while (left) {
        uint64_t len = left > (4u << 20) ? (4u << 20) : left;
        oc_key_t k = { 0, OC_KIND_ACTIVATION, i++, 0 };
        if (put_pattern(c, &k, len, i, false)) { fprintf(stderr, "hold: %s\n", oc_last_error()); return 1; }
        left -= len;
    }
    printf("held %" PRIu64 "\n", g_bytes);
    fflush(stdout);
    for (;;) pause();
}

/* ---- latency ---- */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmd_lat(void) {
    oc_client_t *c = open_client(0, 0);
    if (!c) return 1;
    double *t = calloc((size_t)g_iters, sizeof *t);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 50; i++) { if (pass ? oc_heartbeat(c) : oc_nop(c)) { fprintf(stderr, "%s\n", oc_last_error()); return 1; } }
        for (int i = 0; i < g_iters; i++) {
            double t0 = clock_now_s();
            status_t st = pass ? oc_heartbeat(c) : oc_nop(c);
            t[i] = (clock_now_s() - t0) * 1e6;
            if (st) { fprintf(stderr, "%s\n", oc_last_error()); return 1; }
        }
        qsort(t, (size_t)g_iters, sizeof *t, cmp_d);
        printf("%s p50_us %.1f p99_us %.1f\n", pass ? "rpc" : "ring", t[g_iters / 2], t[(int)(g_iters * 0.99)]);
    }
    free(t);
    oc_close(c, false);
    return 0;
}

/* ---- bad RPCs ---- */

static rpc_client_t *g_rpc;
static const char *g_token = "";

static int expect_rpc(const char *what, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *rd, grpc_status_code want, const char *needle) {
    ProtobufCMessage *resp = NULL;
    char msg[1024];
    char path[128];
    snprintf(path, sizeof path, "/ballast.offload.v1.Offload/%s", method);
    grpc_status_code st = rpc_call(g_rpc, path, req, rd, &resp, 10000, false, msg, sizeof msg);
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    if (st != want || (needle && !strstr(msg, needle))) {
        fprintf(stderr, "badrpc %s: got %s (%s), want %s with '%s'\n", what, rpc_status_name(st), msg,
                rpc_status_name(want), needle ? needle : "");
        return 1;
    }
    printf("ok: %s -> %s: %s\n", what, rpc_status_name(st), msg);
    return 0;
}

#define PB(x) ((const ProtobufCMessage *)(x))
#define D(name) &ballast__offload__v1__##name##__descriptor

static int cmd_badrpc(void) {
    char err[256];
    char addr[300];
    if (strncmp(g_addr, "unix:", 5) && g_addr[0] == '/') snprintf(addr, sizeof addr, "unix:%s", g_addr);
    else snprintf(addr, sizeof addr, "%s", g_addr);
    g_rpc = rpc_client_open(addr, NULL, err, sizeof err);
    if (!g_rpc) { fprintf(stderr, "%s\n", err); return 1; }
    int bad = 0;
    Ballast__Offload__V1__OpenSessionRequest o = BALLAST__OFFLOAD__V1__OPEN_SESSION_REQUEST__INIT;
    o.token = (char *)g_token;
    o.job = "bad/job";
    bad += expect_rpc("job name with '/'", "OpenSession", PB(&o), D(open_session_response), GRPC_STATUS_INVALID_ARGUMENT, "job name");
    o.job = "";
    bad += expect_rpc("empty job name", "OpenSession", PB(&o), D(open_session_response), GRPC_STATUS_INVALID_ARGUMENT, "job name");
    char longname[80];
    memset(longname, 'a', 64); longname[64] = 0;
    o.job = longname;
    bad += expect_rpc("64-char job name", "OpenSession", PB(&o), D(open_session_response), GRPC_STATUS_INVALID_ARGUMENT, "job name");
    o.job = "okjob";
    o.client_name = "bad\001name";
    bad += expect_rpc("control char in client name", "OpenSession", PB(&o), D(open_session_response), GRPC_STATUS_INVALID_ARGUMENT, "client name");
    o.client_name = "";
    if (g_quota) {
        o.quota_bytes = g_quota + 1;
        bad += expect_rpc("quota above --session-quota", "OpenSession", PB(&o), D(open_session_response), GRPC_STATUS_RESOURCE_EXHAUSTED, "quota");
        o.quota_bytes = 0;
    }
    o.token = "wrong-token";
    if (g_token[0]) bad += expect_rpc("wrong token", "OpenSession", PB(&o), D(open_session_response), GRPC_STATUS_UNAUTHENTICATED, "token");
    o.token = (char *)g_token;

    Ballast__Offload__V1__HeartbeatRequest hb = BALLAST__OFFLOAD__V1__HEARTBEAT_REQUEST__INIT;
    hb.session_id = 0x1234;
    bad += expect_rpc("heartbeat of an unknown session", "Heartbeat", PB(&hb), D(heartbeat_response), GRPC_STATUS_NOT_FOUND, "no session");
    Ballast__Offload__V1__CloseSessionRequest cl = BALLAST__OFFLOAD__V1__CLOSE_SESSION_REQUEST__INIT;
    cl.session_id = 99;
    bad += expect_rpc("close of an unknown session", "CloseSession", PB(&cl), D(close_session_response), GRPC_STATUS_NOT_FOUND, "no session");

    /* a real session for the data calls */
    Ballast__Offload__V1__OpenSessionResponse *os = NULL;
    char msg[512];
    if (rpc_call(g_rpc, "/ballast.offload.v1.Offload/OpenSession", PB(&o), D(open_session_response),
                 (ProtobufCMessage **)&os, 10000, false, msg, sizeof msg)) {
        fprintf(stderr, "OpenSession: %s\n", msg);
        return 1;
    }
    uint64_t sid = os->session_id;
    protobuf_c_message_free_unpacked((ProtobufCMessage *)os, NULL);
    Ballast__Offload__V1__Key key = BALLAST__OFFLOAD__V1__KEY__INIT;
    uint8_t data[1000];
    fill(data, sizeof data, 3);
    Ballast__Offload__V1__PutRequest put = BALLAST__OFFLOAD__V1__PUT_REQUEST__INIT;
    put.session_id = sid;
    put.data.data = data;
    put.data.len = sizeof data;
    bad += expect_rpc("put without a key", "Put", PB(&put), D(put_response), GRPC_STATUS_INVALID_ARGUMENT, "key is missing");
    put.key = &key;
    key.kind = 0;
    bad += expect_rpc("put with kind 0", "Put", PB(&put), D(put_response), GRPC_STATUS_INVALID_ARGUMENT, "kind");
    key.kind = (Ballast__Offload__V1__Kind)17;
    bad += expect_rpc("put with kind 17", "Put", PB(&put), D(put_response), GRPC_STATUS_INVALID_ARGUMENT, "kind");
    key.kind = BALLAST__OFFLOAD__V1__KIND__PARAM;
    put.data.len = 0;
    bad += expect_rpc("put of 0 bytes", "Put", PB(&put), D(put_response), GRPC_STATUS_INVALID_ARGUMENT, "length");
    put.data.len = sizeof data;
    put.session_id = sid ^ 1;
    bad += expect_rpc("put with a wrong session id", "Put", PB(&put), D(put_response), GRPC_STATUS_NOT_FOUND, "no session");
    put.session_id = sid;
    bad += expect_rpc("good put", "Put", PB(&put), D(put_response), GRPC_STATUS_OK, NULL);
    bad += expect_rpc("put of the same key again", "Put", PB(&put), D(put_response), GRPC_STATUS_ALREADY_EXISTS, "exists");
    Ballast__Offload__V1__GetRequest get = BALLAST__OFFLOAD__V1__GET_REQUEST__INIT;
    get.session_id = sid;
    Ballast__Offload__V1__Key missing = key;
    missing.index = 777;
    get.key = &missing;
    bad += expect_rpc("get of a missing key", "Get", PB(&get), D(get_response), GRPC_STATUS_NOT_FOUND, "not_found");
    Ballast__Offload__V1__ListKeysRequest lk = BALLAST__OFFLOAD__V1__LIST_KEYS_REQUEST__INIT;
    lk.job = "no spaces allowed";
    bad += expect_rpc("list with a bad job name", "ListKeys", PB(&lk), D(list_keys_response), GRPC_STATUS_INVALID_ARGUMENT, "job name");
    lk.job = "";
    lk.max_keys = 1000000;
    bad += expect_rpc("list with max_keys 1e6", "ListKeys", PB(&lk), D(list_keys_response), GRPC_STATUS_INVALID_ARGUMENT, "max_keys");
    Ballast__Offload__V1__ReleaseRequest rel = BALLAST__OFFLOAD__V1__RELEASE_REQUEST__INIT;
    rel.job = "..bad job";
    rel.token = (char *)g_token;
    bad += expect_rpc("release with a bad job name", "Release", PB(&rel), D(release_response), GRPC_STATUS_INVALID_ARGUMENT, "job name");
    /* bytes that are not a protobuf message */
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(0xff - i);
    void *rb = NULL;
    size_t rl = 0;
    grpc_status_code st = rpc_call_raw(g_rpc, "/ballast.offload.v1.Offload/OpenSession", junk, sizeof junk, &rb, &rl,
                                       10000, false, msg, sizeof msg);
    free(rb);
    if (st != GRPC_STATUS_INVALID_ARGUMENT) { fprintf(stderr, "junk bytes: %s %s\n", rpc_status_name(st), msg); bad++; }
    else printf("ok: undecodable request -> INVALID_ARGUMENT: %s\n", msg);
    /* the good blob is still there and the service still answers */
    get.key = &key;
    Ballast__Offload__V1__GetResponse *gr = NULL;
    st = rpc_call(g_rpc, "/ballast.offload.v1.Offload/Get", PB(&get), D(get_response), (ProtobufCMessage **)&gr,
                  10000, false, msg, sizeof msg);
    if (st || gr->data.len != sizeof data || memcmp(gr->data.data, data, sizeof data)) {
        fprintf(stderr, "good blob after bad calls: %s %s\n", rpc_status_name(st), msg);
        bad++;
    } else printf("ok: the good blob still reads back byte-exact\n");
    if (gr) protobuf_c_message_free_unpacked((ProtobufCMessage *)gr, NULL);
    cl.session_id = sid;
    bad += expect_rpc("close", "CloseSession", PB(&cl), D(close_session_response), GRPC_STATUS_OK, NULL);
    rpc_client_close(g_rpc);
    return bad ? 1 : 0;
}

/* ---- drain ---- */

static int cmd_drain(void) {
    char err[256], msg[512];
    rpc_client_t *c = rpc_client_open(g_addr, NULL, err, sizeof err);
    if (!c) { fprintf(stderr, "%s\n", err); return 1; }
    Ballast__Offload__V1__DrainRequest req = BALLAST__OFFLOAD__V1__DRAIN_REQUEST__INIT;
    req.token = (char *)g_token;
    Ballast__Offload__V1__DrainResponse *r = NULL;
    grpc_status_code st = rpc_call(c, "/ballast.offload.v1.Offload/Drain", PB(&req), D(drain_response),
                                   (ProtobufCMessage **)&r, 30000, false, msg, sizeof msg);
    rpc_client_close(c);
    if (st) { fprintf(stderr, "drain: %s\n", msg); return 1; }
    printf("drained: %llu persistent blobs\n", (unsigned long long)r->persisted_blobs);
    protobuf_c_message_free_unpacked((ProtobufCMessage *)r, NULL);
    return 0;
}

/* ---- health ---- */

static int cmd_health(void) {
    char err[256], msg[512];
    rpc_client_t *c = rpc_client_open(g_addr, NULL, err, sizeof err);
    if (!c) { fprintf(stderr, "%s\n", err); return 1; }
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckResponse *r = NULL;
    grpc_status_code st = rpc_call(c, "/grpc.health.v1.Health/Check", PB(&req), &grpc__health__v1__health_check_response__descriptor,
                                   (ProtobufCMessage **)&r, 5000, false, msg, sizeof msg);
    rpc_client_close(c);
    if (st) { fprintf(stderr, "health: %s\n", msg); return 1; }
    int serving = r->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    printf("health: %s\n", serving ? "SERVING" : "NOT_SERVING");
    protobuf_c_message_free_unpacked((ProtobufCMessage *)r, NULL);
    return serving ? 0 : 1;
}

/* ---- main ---- */

static uint64_t parse_u64(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1048576;
    else if (*end == 'G' || *end == 'g') v *= 1073741824.0;
    return (uint64_t)v;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: offload_stress stress|badring|quota|persist-writer|persist-check|hold|lat [options]\n"); return 2; }
    const char *cmd = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--remote")) { g_remote = true; continue; }
        if (!v) { fprintf(stderr, "%s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--addr")) g_addr = v;
        else if (!strcmp(a, "--job")) g_job = v;
        else if (!strcmp(a, "--log")) g_log = v;
        else if (!strcmp(a, "--clients")) g_clients = atoi(v);
        else if (!strcmp(a, "--total-bytes")) g_total = parse_u64(v);
        else if (!strcmp(a, "--max-blob")) g_max_blob = parse_u64(v);
        else if (!strcmp(a, "--live-bytes")) g_live_cap = parse_u64(v);
        else if (!strcmp(a, "--bytes")) g_bytes = parse_u64(v);
        else if (!strcmp(a, "--quota")) g_quota = parse_u64(v);
        else if (!strcmp(a, "--seed")) g_seed = strtoull(v, NULL, 0);
        else if (!strcmp(a, "--count")) g_count = atoi(v);
        else if (!strcmp(a, "--iters")) g_iters = atoi(v);
        else if (!strcmp(a, "--token")) g_token = v;
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
    }
    signal(SIGPIPE, SIG_IGN);
    if (!strcmp(cmd, "stress")) return cmd_stress();
    if (!strcmp(cmd, "badring")) return cmd_badring();
    if (!strcmp(cmd, "quota")) return cmd_quota();
    if (!strcmp(cmd, "persist-writer")) return cmd_persist_writer();
    if (!strcmp(cmd, "persist-check")) return cmd_persist_check();
    if (!strcmp(cmd, "hold")) return cmd_hold();
    if (!strcmp(cmd, "lat")) return cmd_lat();
    if (!strcmp(cmd, "badrpc")) return cmd_badrpc();
    if (!strcmp(cmd, "health")) return cmd_health();
    if (!strcmp(cmd, "drain")) return cmd_drain();
    fprintf(stderr, "unknown command %s\n", cmd);
    return 2;
}
