/* test_data.c: token shards (v1/v2 round trips, corrupt files), the
 * sequential and shuffled batch formulas, and the synthetic corpus's
 * entropy against the empirical conditional entropy of a sample. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workers/data/data.h"
#include "tests/unit/helpers.h"

/* ---- helpers ---- */

static uint64_t rng_state;
static uint64_t rnd(void) { return th_xorshift64s(&rng_state); }

static char tmpdir[64];
static void mk_tmpdir(void) { th_tmpdir(tmpdir, sizeof tmpdir, NULL, "test-data"); }
static void rm_tmpdir(void) { cr_assert_eq(th_tmpdir_remove(tmpdir), 0); }
TestSuite(data, .init = mk_tmpdir, .fini = rm_tmpdir);

static void path_in(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", tmpdir, name); }

/* Write a shard byte by byte with arbitrary header fields and payload. */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count, const void *payload, size_t plen) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    int32_t hdr[256] = { 0 };
    hdr[0] = magic; hdr[1] = version; hdr[2] = count;
    cr_assert_eq(fwrite(hdr, 4, 256, f), 256);
    if (plen) cr_assert_eq(fwrite(payload, 1, plen, f), plen);
    fclose(f);
}

/* Files are read whole with th_read_file, to check bytes independently of
 * data_open. */

/* ---- round trips ---- */

static void roundtrip(bool force_u32, uint32_t max_id, int expect_version) {
    rng_state = 0x1234567ULL + max_id + force_u32;
    int64_t n = 1000 + (int64_t)(rnd() % 5000);
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    for (int64_t i = 0; i < n; i++) tok[i] = (uint32_t)(rnd() % ((uint64_t)max_id + 1));
    tok[n / 2] = max_id;
    char p[256], err[512];
    path_in(p, sizeof p, "rt.bin");
    cr_assert_eq(data_write_shard(p, tok, n, force_u32, err, sizeof err), 0, "%s", err);
    size_t len;
    uint8_t *b = th_read_file(p, &len);
    size_t tsz = expect_version == 1 ? 2 : 4;
    cr_assert_eq(len, 1024 + (size_t)n * tsz);
    int32_t h[3];
    memcpy(h, b, 12);
    cr_assert_eq(h[0], 20240520);
    cr_assert_eq(h[1], expect_version);
    cr_assert_eq(h[2], n);
    for (int k = 3; k < 256; k++) cr_assert_eq(((int32_t *)b)[k], 0);
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = 0;
        for (size_t j = 0; j < tsz; j++) v |= (uint32_t)b[1024 + i * tsz + j] << (8 * j);
        cr_assert_eq(v, tok[i], "byte-level token %lld", (long long)i);
    }
    free(b);
    data_t *d;
    cr_assert_eq(data_open(p, (int)max_id + 1, &d, err, sizeof err), 0, "%s", err);
    cr_assert_eq(data_num_tokens(d), n);
    cr_assert_eq(data_shard_version(d, 0), expect_version);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(data_token(d, i), tok[i]);
    data_close(d);
    free(tok);
}

Test(data, roundtrip_v1_u16) { roundtrip(false, 50000, 1); }
Test(data, roundtrip_v1_full_u16_range) { roundtrip(false, 65535, 1); }
Test(data, roundtrip_v2_forced) { roundtrip(true, 1000, 2); }
Test(data, roundtrip_v2_large_ids) { roundtrip(false, 200000, 2); }

/* ---- sequential ---- */

/* Several shards of mixed versions opened by a glob; the stream is their
 * concatenation in sorted name order. Returns the concatenation. */
static uint32_t *make_glob(int n_shards, int64_t *total, char *pattern, size_t plen) {
    char p[256], err[512], name[32];
    uint32_t *all = NULL;
    *total = 0;
    /* Written in reverse name order to check that the glob is sorted. */
    int64_t lens[16];
    uint32_t *parts[16];
    for (int s = 0; s < n_shards; s++) {
        lens[s] = 50 + (int64_t)(rnd() % 300);
        parts[s] = malloc((size_t)lens[s] * sizeof(uint32_t));
        for (int64_t i = 0; i < lens[s]; i++) parts[s][i] = (uint32_t)(rnd() % 1000);
    }
    for (int s = n_shards - 1; s >= 0; s--) {
        snprintf(name, sizeof name, "shard_%03d.bin", s);
        path_in(p, sizeof p, name);
        cr_assert_eq(data_write_shard(p, parts[s], lens[s], s % 2 == 1, err, sizeof err), 0, "%s", err);
    }
    for (int s = 0; s < n_shards; s++) {
        all = realloc(all, (size_t)(*total + lens[s]) * sizeof *all);
        memcpy(all + *total, parts[s], (size_t)lens[s] * sizeof *all);
        *total += lens[s];
        free(parts[s]);
    }
    snprintf(pattern, plen, "%s/shard_*.bin", tmpdir);
    return all;
}

Test(data, sequential_formula_across_shards) {
    rng_state = 0xfeedULL;
    int64_t n;
    char pat[256], err[512];
    uint32_t *all = make_glob(5, &n, pat, sizeof pat);
    data_t *d;
    cr_assert_eq(data_open(pat, 1000, &d, err, sizeof err), 0, "%s", err);
    cr_assert_eq(data_num_shards(d), 5);
    cr_assert_eq(data_num_tokens(d), n);
    cr_assert_eq(data_shard_version(d, 0), 1);
    cr_assert_eq(data_shard_version(d, 1), 2);
    for (int trial = 0; trial < 200; trial++) {
        int B = 1 + (int)(rnd() % 4), T = 1 + (int)(rnd() % 40), A = 1 + (int)(rnd() % 3), D = 1 + (int)(rnd() % 4);
        int micro = (int)(rnd() % (uint64_t)A), rank = (int)(rnd() % (uint64_t)D);
        int64_t step = (int64_t)(rnd() % 500);
        int32_t in[4 * 40], tg[4 * 40];
        cr_assert_eq(data_batch(d, DATA_SEQUENTIAL, rnd(), step, micro, A, rank, D, B, T, in, tg, err, sizeof err), 0, "%s", err);
        for (int b = 0; b < B; b++) {
            int64_t start = ((((step * A + micro) * D + rank) * B) + b) * T;
            for (int t = 0; t < T; t++) {
                cr_assert_eq((uint32_t)in[b * T + t], all[(start + t) % n], "trial %d b %d t %d", trial, b, t);
                cr_assert_eq((uint32_t)tg[b * T + t], all[(start + t + 1) % n]);
            }
        }
    }
    data_close(d);
    free(all);
}

/* ---- shuffled ---- */

/* A v2 shard whose token i is i, so a row's first input names its start. */
static data_t *identity_data(int64_t n) {
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    for (int64_t i = 0; i < n; i++) tok[i] = (uint32_t)i;
    char p[256], err[512];
    path_in(p, sizeof p, "ident.bin");
    cr_assert_eq(data_write_shard(p, tok, n, true, err, sizeof err), 0, "%s", err);
    free(tok);
    data_t *d;
    cr_assert_eq(data_open(p, 0, &d, err, sizeof err), 0, "%s", err);
    return d;
}

/* Window of sample idx (B = 1, A = 1, D = 1 so step == idx); checks the row. */
static int64_t window_of(data_t *d, uint64_t seed, int64_t idx, int T, int64_t n_windows) {
    int32_t in[64], tg[64];
    char err[512];
    cr_assert_eq(data_batch(d, DATA_SHUFFLED, seed, idx, 0, 1, 0, 1, 1, T, in, tg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(in[0] % T, 0, "row start %d is not a multiple of T", in[0]);
    int64_t w = in[0] / T;
    cr_assert(w >= 0 && w < n_windows, "window %lld out of [0, %lld)", (long long)w, (long long)n_windows);
    for (int t = 0; t < T; t++) {
        cr_assert_eq(in[t], in[0] + t);
        cr_assert_eq(tg[t], in[0] + t + 1);
    }
    cr_assert_eq(w, data_shuffle_window(seed, idx, n_windows));
    return w;
}

Test(data, shuffled_is_a_permutation_per_epoch) {
    int T = 8;
    int64_t n = 8 * 97 + 1 + 5, n_windows = (n - 1) / T;   /* 97 windows, 5 spare tokens */
    cr_assert_eq(n_windows, 97);
    data_t *d = identity_data(n);
    uint64_t seed = 0xabcdef12345ULL;
    int64_t order[3][97];
    for (int e = 0; e < 3; e++) {
        int seen[97] = { 0 };
        for (int64_t j = 0; j < n_windows; j++) {
            int64_t w = window_of(d, seed, e * n_windows + j, T, n_windows);
            seen[w]++;
            order[e][j] = w;
        }
        for (int w = 0; w < 97; w++) cr_assert_eq(seen[w], 1, "epoch %d: window %d seen %d times", e, w, seen[w]);
    }
    /* Reshuffled per epoch and not the identity. */
    cr_assert(memcmp(order[0], order[1], sizeof order[0]) != 0);
    cr_assert(memcmp(order[1], order[2], sizeof order[0]) != 0);
    int fixed = 0;
    for (int j = 0; j < 97; j++) fixed += order[0][j] == j;
    cr_assert_lt(fixed, 10, "%d fixed points: not shuffled", fixed);
    /* Reproducible; different seed gives a different order. */
    for (int64_t j = 0; j < n_windows; j++) cr_assert_eq(window_of(d, seed, j, T, n_windows), order[0][j]);
    int same = 0;
    for (int64_t j = 0; j < n_windows; j++) same += window_of(d, seed + 1, j, T, n_windows) == order[0][j];
    cr_assert_lt(same, 10, "seed+1 agrees on %d of 97 windows", same);
    data_close(d);
}

Test(data, shuffled_permutation_many_sizes) {
    rng_state = 0x5151ULL;
    for (int trial = 0; trial < 40; trial++) {
        int64_t nw = 1 + (int64_t)(rnd() % 3000);
        uint64_t seed = rnd();
        char *seen = calloc((size_t)nw, 1);
        for (int64_t j = 0; j < nw; j++) {
            int64_t w = data_shuffle_window(seed, nw * 5 + j, nw);
            cr_assert(w >= 0 && w < nw);
            cr_assert_eq(seen[w], 0, "n_windows %lld: window %lld twice", (long long)nw, (long long)w);
            seen[w] = 1;
        }
        free(seen);
    }
}

Test(data, shuffled_ranks_disjoint_within_a_step) {
    int T = 4, B = 3, A = 2, D = 4;                   /* 24 samples per step */
    int64_t n = 4 * 200 + 1, n_windows = (n - 1) / T; /* 200 windows */
    data_t *d = identity_data(n);
    char err[512];
    for (int64_t step = 0; step < 8; step++) {
        if ((step * 24) / n_windows != (step * 24 + 23) / n_windows) continue;  /* crosses an epoch */
        int seen[200] = { 0 };
        for (int micro = 0; micro < A; micro++)
            for (int rank = 0; rank < D; rank++) {
                int32_t in[12], tg[12];
                cr_assert_eq(data_batch(d, DATA_SHUFFLED, 77, step, micro, A, rank, D, B, T, in, tg, err, sizeof err), 0);
                for (int b = 0; b < B; b++) {
                    int w = in[b * T] / T;
                    cr_assert_eq(seen[w], 0, "step %lld: window %d read twice", (long long)step, w);
                    seen[w] = 1;
                }
                /* And pure: the same call again gives the same rows. */
                int32_t in2[12], tg2[12];
                cr_assert_eq(data_batch(d, DATA_SHUFFLED, 77, step, micro, A, rank, D, B, T, in2, tg2, err, sizeof err), 0);
                cr_assert_arr_eq(in, in2, sizeof in);
                cr_assert_arr_eq(tg, tg2, sizeof tg);
            }
    }
    data_close(d);
}

Test(data, batch_rejects_too_short_data_and_bad_coordinates) {
    data_t *d = identity_data(10);
    int32_t in[64], tg[64];
    char err[512];
    cr_assert_neq(data_batch(d, DATA_SEQUENTIAL, 0, 0, 0, 1, 0, 1, 1, 10, in, tg, err, sizeof err), 0);
    cr_assert(strstr(err, "ident.bin") && strstr(err, "seq-len"), "%s", err);
    cr_assert_eq(data_batch(d, DATA_SHUFFLED, 0, 0, 0, 1, 0, 1, 1, 9, in, tg, err, sizeof err), 0, "%s", err);
    cr_assert_neq(data_batch(d, DATA_SHUFFLED, 0, 0, 2, 2, 0, 1, 1, 4, in, tg, err, sizeof err), 0);
    cr_assert_neq(data_batch(d, DATA_SHUFFLED, 0, 0, 0, 1, 3, 2, 1, 4, in, tg, err, sizeof err), 0);
    data_close(d);
}

/* ---- synthetic corpus ---- */

Test(data, synth_entropy_matches_empirical) {
    const int V = 64, K = 4;
    const int64_t n = 1000000;
    char p[256], err[512];
    path_in(p, sizeof p, "synth.bin");
    double h = -1;
    cr_assert_eq(data_synth_k(p, n, V, 42, K, &h, err, sizeof err), 0, "%s", err);
    data_t *d;
    cr_assert_eq(data_open(p, V, &d, err, sizeof err), 0, "%s", err);
    cr_assert_eq(data_num_tokens(d), n);
    /* Plug-in conditional entropy from bigram counts. */
    static uint64_t c[64][64];
    uint64_t row[64] = { 0 };
    memset(c, 0, sizeof c);
    for (int64_t i = 0; i + 1 < n; i++) c[data_token(d, i)][data_token(d, i + 1)]++;
    for (int s = 0; s < V; s++) {
        int succ = 0;
        for (int t = 0; t < V; t++) { row[s] += c[s][t]; succ += c[s][t] > 0; }
        cr_assert_leq(succ, K, "state %d has %d successors, more than K = %d", s, succ, K);
        cr_assert_gt(row[s], 0, "state %d never visited: chain not ergodic?", s);
    }
    double m = (double)(n - 1), hemp = 0, sq = 0;
    for (int s = 0; s < V; s++)
        for (int t = 0; t < V; t++)
            if (c[s][t]) {
                double l = -log((double)c[s][t] / (double)row[s]);
                hemp += (double)c[s][t] * l;
                sq += (double)c[s][t] * l * l;
            }
    hemp /= m;
    double var = sq / m - hemp * hemp;
    /* Tolerance: 6 standard errors of the mean log-loss plus the plug-in
     * estimator's known downward bias, (#cells - #states) / (2n). */
    double tol = 6 * sqrt(var / m) + (double)(V * (K - 1)) / (2 * m);
    cr_log_info("entropy %.6f nats, empirical %.6f, tolerance %.6f", h, hemp, tol);
    cr_assert(fabs(h - hemp) < tol, "computed %.6f vs empirical %.6f (tol %.6f)", h, hemp, tol);
    /* Learnable below the unigram entropy by a clear margin. */
    double h0 = 0;
    for (int s = 0; s < V; s++) { double q = (double)row[s] / m; h0 -= q * log(q); }
    cr_assert_lt(h, 0.5 * h0, "entropy rate %.3f not well below unigram %.3f", h, h0);
    data_close(d);
    /* Same seed -> same bytes; another seed -> different corpus and entropy. */
    char p2[256], p3[256];
    path_in(p2, sizeof p2, "synth2.bin");
    path_in(p3, sizeof p3, "synth3.bin");
    double h2, h3;
    cr_assert_eq(data_synth_k(p2, n, V, 42, K, &h2, err, sizeof err), 0);
    cr_assert_eq(data_synth_k(p3, n, V, 43, K, &h3, err, sizeof err), 0);
    size_t l1, l2, l3;
    uint8_t *b1 = th_read_file(p, &l1), *b2 = th_read_file(p2, &l2), *b3 = th_read_file(p3, &l3);
    cr_assert_eq(l1, l2);
    cr_assert(memcmp(b1, b2, l1) == 0);
    cr_assert(memcmp(b1, b3, l1) != 0);
    cr_assert_eq(h, h2);
    cr_assert_neq(h, h3);
    free(b1); free(b2); free(b3);
}

Test(data, synth_rejects_bad_parameters) {
    char p[256], err[512];
    double h;
    path_in(p, sizeof p, "bad.bin");
    cr_assert_neq(data_synth_k(p, 100, 2, 1, 2, &h, err, sizeof err), 0);
    cr_assert(strstr(err, "vocab"), "%s", err);
    cr_assert_neq(data_synth_k(p, 100, 10, 1, 11, &h, err, sizeof err), 0);
    cr_assert(strstr(err, "branching"), "%s", err);
    cr_assert_neq(data_synth_k(p, 0, 10, 1, 4, &h, err, sizeof err), 0);
    cr_assert_neq(access(p, F_OK), 0);
}

/* ---- corrupt shards ---- */

static void expect_open_fail(const char *name, int vocab, const char *needle) {
    char p[256], err[1024];
    path_in(p, sizeof p, name);
    data_t *d = NULL;
    cr_assert_neq(data_open(p, vocab, &d, err, sizeof err), 0, "%s opened but should not", name);
    cr_assert_null(d);
    cr_assert(strstr(err, p) != NULL, "message does not name the file: %s", err);
    cr_assert(strstr(err, needle) != NULL, "message lacks '%s': %s", needle, err);
}

Test(data, corrupt_shards_are_rejected_with_file_and_problem) {
    char p[256];
    uint16_t toks[100];
    rng_state = 99;
    for (int i = 0; i < 100; i++) toks[i] = (uint16_t)(1 + rnd() % 500);

    path_in(p, sizeof p, "short.bin");
    th_write_file(p, toks, 100);
    expect_open_fail("short.bin", 0, "shorter than");

    path_in(p, sizeof p, "magic.bin");
    write_raw(p, 20240521, 1, 100, toks, sizeof toks);
    expect_open_fail("magic.bin", 0, "magic");

    path_in(p, sizeof p, "version.bin");
    write_raw(p, 20240520, 3, 100, toks, sizeof toks);
    expect_open_fail("version.bin", 0, "version 3");

    path_in(p, sizeof p, "trunc.bin");
    write_raw(p, 20240520, 1, 100, toks, sizeof toks - 2);
    expect_open_fail("trunc.bin", 0, "truncated");

    path_in(p, sizeof p, "trunc2.bin");
    write_raw(p, 20240520, 2, 100, toks, sizeof toks);   /* v2 needs 400 bytes */
    expect_open_fail("trunc2.bin", 0, "truncated");

    path_in(p, sizeof p, "trail.bin");
    write_raw(p, 20240520, 1, 99, toks, sizeof toks);
    expect_open_fail("trail.bin", 0, "trailing");

    path_in(p, sizeof p, "empty.bin");
    write_raw(p, 20240520, 1, 0, NULL, 0);
    expect_open_fail("empty.bin", 0, "0 tokens");

    path_in(p, sizeof p, "negative.bin");
    write_raw(p, 20240520, 1, -5, NULL, 0);
    expect_open_fail("negative.bin", 0, "-5 tokens");

    uint16_t bad[100];
    memcpy(bad, toks, sizeof bad);
    bad[37] = 600;
    path_in(p, sizeof p, "vocab.bin");
    write_raw(p, 20240520, 1, 100, bad, sizeof bad);
    expect_open_fail("vocab.bin", 512, "token 37 has id 600 >= vocab size 512");
    char err[1024];
    data_t *d;
    cr_assert_eq(data_open(p, 601, &d, err, sizeof err), 0, "%s", err);   /* large enough vocab: fine */
    data_close(d);
    cr_assert_eq(data_open(p, 0, &d, err, sizeof err), 0, "%s", err);     /* vocab <= 0: no check */
    data_close(d);

    expect_open_fail("missing.bin", 0, "No such file");
    char pat[256];
    path_in(pat, sizeof pat, "nothing_*.bin");
    cr_assert_neq(data_open(pat, 0, &d, err, sizeof err), 0);
    cr_assert(strstr(err, pat) && strstr(err, "no file matches"), "%s", err);

    /* One bad shard in a glob fails the whole open, naming that shard. */
    char good[256];
    path_in(good, sizeof good, "g_1.bin");
    write_raw(good, 20240520, 1, 100, toks, sizeof toks);
    path_in(p, sizeof p, "g_2.bin");
    write_raw(p, 20240520, 1, 100, toks, sizeof toks - 1);
    path_in(pat, sizeof pat, "g_*.bin");
    cr_assert_neq(data_open(pat, 0, &d, err, sizeof err), 0);
    cr_assert(strstr(err, p) && strstr(err, "truncated"), "%s", err);
}

Test(data, literal_file_name_with_glob_characters) {
    char p[256], err[512];
    path_in(p, sizeof p, "odd[1].bin");
    uint32_t tok[5] = { 4, 3, 2, 1, 7 };
    cr_assert_eq(data_write_shard(p, tok, 5, false, err, sizeof err), 0, "%s", err);
    data_t *d;
    cr_assert_eq(data_open(p, 8, &d, err, sizeof err), 0, "%s", err);
    cr_assert_eq(data_num_tokens(d), 5);
    cr_assert_eq(data_token(d, 4), 7);
    data_close(d);
}
