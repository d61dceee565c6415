/* comm_check.h: shared by the comm tests and the benchmark: seeded random
 * inputs per (iteration, rank), an independent serial reference for each
 * collective, and fork helpers that run one function per rank.
 *
 * The reference reduces in rank order 0..n-1 with fp32 accumulation and
 * rounds bf16 to nearest even once at the end, which is the order the
 * comm table promises; inputs span several orders of magnitude so that
 * any other order gives different bits. */
#ifndef BALLAST_TESTS_COMM_CHECK_H
#define BALLAST_TESTS_COMM_CHECK_H

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "workers/comm/comm.h"

static inline uint64_t cc_mix(uint64_t x) { /* splitmix64 */
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Reference bf16 <-> fp32, written independently of the backend: rounding
 * through double arithmetic on the discarded bits. */
static inline float cc_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t cc_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t hi = u >> 16, lo = u & 0xffffu;
    if (isnan(f)) return (uint16_t)(hi | 0x40);
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) hi++;
    return (uint16_t)hi;
}

/* Fill x[0..len) with values of random sign and magnitude 2^-8..2^8 from
 * seed; never zero. */
static inline void cc_fill(void *x, size_t len, comm_dtype_t dt, uint64_t seed) {
    for (size_t i = 0; i < len; i++) {
        uint64_t r = cc_mix(seed * 0x100000001B3ULL + i);
        double m = 1.0 + (double)(r >> 40) / (double)(1ull << 24);   /* 1..2 */
        int e = (int)((r >> 8) % 17) - 8;
        float v = (float)ldexp(m, e) * ((r & 1) ? -1.f : 1.f);
        if (dt == COMM_F32) ((float *)x)[i] = v;
        else ((uint16_t *)x)[i] = cc_f32_to_bf16(v);
    }
}

static inline float cc_get(const void *x, size_t i, comm_dtype_t dt) {
    return dt == COMM_F32 ? ((const float *)x)[i] : cc_bf16_to_f32(((const uint16_t *)x)[i]);
}

static inline void cc_put(void *x, size_t i, comm_dtype_t dt, float v) {
    if (dt == COMM_F32) ((float *)x)[i] = v;
    else ((uint16_t *)x)[i] = cc_f32_to_bf16(v);
}

/* ref[e] = op over i of inputs[i][off + e] in rank order. */
static inline void cc_reduce_ref(void *ref, void *const *inputs, int n, size_t off, size_t len,
                                 comm_dtype_t dt, comm_op_t op) {
    for (size_t e = 0; e < len; e++) {
        float acc = cc_get(inputs[0], off + e, dt);
        for (int i = 1; i < n; i++) acc = acc + cc_get(inputs[i], off + e, dt);
        if (op == COMM_AVG) acc = acc / (float)n;
        cc_put(ref, e, dt, acc);
    }
}

/* ---- fork helpers ---- */

typedef int (*cc_rank_fn)(int rank, int n, void *arg);

/* Run fn in n forked processes (rank 0..n-1), each with an alarm of
 * timeout_s. Returns the number of ranks that failed (exit != 0 or signal);
 * status[r] (may be NULL) gets each wait status. */
static inline int cc_run_ranks(int n, cc_rank_fn fn, void *arg, int timeout_s, int *status) {
    pid_t pids[64];
    fflush(stdout); /* or every child flushes the parent's pending output again */
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm((unsigned)timeout_s);
            int rc = fn(r, n, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc ? 1 : 0);
        }
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (status) status[r] = st;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    return failed;
}

/* Rank `rank` of an n-rank shm group on segment fd (from
 * comm_shm_segment_create), slot_bytes per slot, a 30 s peer timeout;
 * NULL with the message on stderr when it cannot attach. */
static inline comm_t *cc_open_shm(const char *name, int fd, int n, int rank, size_t slot_bytes) {
    comm_config_t cfg;
    comm_config_init(&cfg);
    cfg.kind = COMM_SHM;
    cfg.name = name;
    cfg.n = n;
    cfg.index = rank;
    cfg.shm_fd = fd;
    cfg.slot_bytes = slot_bytes;
    cfg.timeout_s = 30;
    char err[COMM_ERR_LEN];
    comm_t *c = NULL;
    if (comm_init(&c, &cfg, err, sizeof err)) fprintf(stderr, "rank %d: %s: %s\n", rank, name, err);
    return c;
}

/* Anonymous shared memory visible to all forked ranks. */
static inline void *cc_shared(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

#endif
