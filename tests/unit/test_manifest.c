/* test_manifest.c: the persistent-blob log: random records round-trip
 * through close and reopen, a torn or damaged tail is ignored and cut off,
 * compaction keeps exactly the live records, foreign files are refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "services/offload/manifest.h"
#include "tests/unit/helpers.h"

static uint64_t rng_state;
static uint64_t rnd(void) { return th_xorshift64(&rng_state); }

static char dir[256];

static void make_dir(void) { th_tmpdir(dir, sizeof dir, NULL, "test-manifest"); }

/* Idempotent; also runs after a failed test (suite .fini). */
static void remove_dir(void) { th_tmpdir_remove(dir); }

TestSuite(manifest, .fini = remove_dir);


static void random_rec(manifest_rec_t *r) {
    memset(r, 0, sizeof *r);
    r->type = (uint8_t)(MREC_JOB + rnd() % 4);
    r->job_id = rnd();
    r->rank = (uint32_t)rnd();
    r->kind = (uint32_t)(1 + rnd() % 4);
    r->index = rnd();
    r->step = rnd();
    r->length = rnd() >> 20;
    r->nvme_off = (rnd() >> 20) & ~4095ull;
    r->crc = (uint32_t)rnd();
    r->flags = (uint32_t)(rnd() & 1);
    static const char cs[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
    int n = 1 + (int)(rnd() % 63);
    for (int i = 0; i < n; i++) r->job[i] = cs[rnd() % (sizeof cs - 1)];
}

static bool rec_eq(const manifest_rec_t *a, const manifest_rec_t *b) {
    return a->type == b->type && a->seq == b->seq && a->job_id == b->job_id && a->rank == b->rank &&
           a->kind == b->kind && a->index == b->index && a->step == b->step && a->length == b->length &&
           a->nvme_off == b->nvme_off && a->crc == b->crc && a->flags == b->flags &&
           strcmp(a->job, b->job) == 0;
}

typedef struct { manifest_rec_t *v; size_t n, cap; } seen_t;

static void collect(void *arg, const manifest_rec_t *r) {
    seen_t *s = arg;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = *r;
}

static off_t file_size(const char *p) {
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    return st.st_size;
}

Test(manifest, random_records_round_trip) {
    rng_state = 0x1234567890abcdefull;
    make_dir();
    char err[256];
    manifest_t *m;
    manifest_open_info_t info;
    cr_assert_eq(manifest_open(&m, dir, 1ull << 30, NULL, NULL, &info, err, sizeof err), 0, "%s", err);
    cr_assert(info.created);
    enum { N = 500 };
    manifest_rec_t *w = calloc(N, sizeof *w);
    for (int i = 0; i < N; i++) {
        random_rec(&w[i]);
        cr_assert_eq(manifest_append(m, &w[i], i % 50 == 0), 0);
        cr_assert_eq(w[i].seq, (uint64_t)i + 1);
    }
    manifest_close(m);
    seen_t seen = { 0 };
    cr_assert_eq(manifest_open(&m, dir, 4096, collect, &seen, &info, err, sizeof err), 0, "%s", err);
    cr_assert(!info.created);
    cr_assert_eq(info.file_bytes, 1ull << 30, "header lost the spill file size");
    cr_assert_eq(info.records, N);
    cr_assert_eq(info.torn_bytes, 0);
    cr_assert_eq(seen.n, N);
    for (int i = 0; i < N; i++) cr_assert(rec_eq(&w[i], &seen.v[i]), "record %d differs after reopen", i);
    /* Appends continue the sequence. */
    manifest_rec_t r;
    random_rec(&r);
    cr_assert_eq(manifest_append(m, &r, true), 0);
    cr_assert_eq(r.seq, N + 1);
    manifest_close(m);
    free(seen.v);
    free(w);
    remove_dir();
}

Test(manifest, torn_tail_is_ignored_and_cut) {
    rng_state = 0xabcdef12345ull;
    make_dir();
    char err[256], path[300];
    snprintf(path, sizeof path, "%s/manifest", dir);
    manifest_t *m;
    manifest_rec_t w[40];
    cr_assert_eq(manifest_open(&m, dir, 1 << 20, NULL, NULL, NULL, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 40; i++) { random_rec(&w[i]); cr_assert_eq(manifest_append(m, &w[i], false), 0); }
    manifest_close(m);
    off_t full = file_size(path);
    cr_assert_eq(full, MANIFEST_HDR_SIZE + 40 * MANIFEST_REC_SIZE);

    /* A crash in the middle of writing record 40: only part of it is there. */
    off_t cut = full - 1 - (off_t)(rnd() % (MANIFEST_REC_SIZE - 1));
    cr_assert_eq(truncate(path, cut), 0);
    seen_t seen = { 0 };
    manifest_open_info_t info;
    cr_assert_eq(manifest_open(&m, dir, 1 << 20, collect, &seen, &info, err, sizeof err), 0, "%s", err);
    cr_assert_eq(seen.n, 39);
    cr_assert_eq(info.torn_bytes, (uint64_t)(cut - (full - MANIFEST_REC_SIZE)));
    for (int i = 0; i < 39; i++) cr_assert(rec_eq(&w[i], &seen.v[i]));
    cr_assert_eq(file_size(path), full - MANIFEST_REC_SIZE, "torn tail not cut off");
    /* New records go after the last good one and survive the next open. */
    manifest_rec_t r;
    random_rec(&r);
    cr_assert_eq(manifest_append(m, &r, true), 0);
    manifest_close(m);
    seen.n = 0;
    cr_assert_eq(manifest_open(&m, dir, 1 << 20, collect, &seen, &info, err, sizeof err), 0, "%s", err);
    cr_assert_eq(seen.n, 40);
    cr_assert(rec_eq(&r, &seen.v[39]));
    manifest_close(m);

    /* A whole record of garbage (a block the disk wrote without its data):
     * ignored too. */
    int fd = open(path, O_WRONLY | O_APPEND);
    unsigned char junk[MANIFEST_REC_SIZE];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)rnd();
    cr_assert_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    seen.n = 0;
    cr_assert_eq(manifest_open(&m, dir, 1 << 20, collect, &seen, &info, err, sizeof err), 0, "%s", err);
    cr_assert_eq(seen.n, 40);
    cr_assert_eq(info.torn_bytes, MANIFEST_REC_SIZE);
    manifest_close(m);
    free(seen.v);
    remove_dir();
}

Test(manifest, every_single_byte_flip_is_detected) {
    rng_state = 0x99887766ull;
    for (int t = 0; t < 20; t++) {
        manifest_rec_t r, d;
        random_rec(&r);
        r.seq = rnd();
        unsigned char b[MANIFEST_REC_SIZE];
        manifest_encode(&r, b);
        cr_assert(manifest_decode(b, &d));
        cr_assert(rec_eq(&r, &d));
        for (int i = 0; i < MANIFEST_REC_SIZE; i++) {
            unsigned char save = b[i];
            b[i] ^= (unsigned char)(1u << (rnd() % 8));
            cr_assert(!manifest_decode(b, &d), "flip at byte %d not detected", i);
            b[i] = save;
        }
    }
}

Test(manifest, compaction_keeps_exactly_the_live_records) {
    rng_state = 0x31415926ull;
    make_dir();
    char err[256];
    manifest_t *m;
    cr_assert_eq(manifest_open(&m, dir, 1 << 20, NULL, NULL, NULL, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 100; i++) { manifest_rec_t r; random_rec(&r); manifest_append(m, &r, false); }
    manifest_rec_t live[7];
    for (int i = 0; i < 7; i++) random_rec(&live[i]);
    cr_assert_eq(manifest_compact(m, live, 7, err, sizeof err), 0, "%s", err);
    cr_assert_eq(manifest_records(m), 7);
    manifest_rec_t more;
    random_rec(&more);
    cr_assert_eq(manifest_append(m, &more, true), 0);
    cr_assert_gt(more.seq, live[6].seq);
    manifest_close(m);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s/manifest.tmp", dir);
    cr_assert_neq(access(tmp, F_OK), 0, "temp file left behind");
    seen_t seen = { 0 };
    cr_assert_eq(manifest_open(&m, dir, 1 << 20, collect, &seen, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(seen.n, 8);
    for (int i = 0; i < 7; i++) cr_assert(rec_eq(&live[i], &seen.v[i]));
    cr_assert(rec_eq(&more, &seen.v[7]));
    manifest_close(m);
    free(seen.v);
    remove_dir();
}

Test(manifest, foreign_or_damaged_header_is_refused) {
    make_dir();
    char err[256], path[300];
    snprintf(path, sizeof path, "%s/manifest", dir);
    th_write_str(path, "this is somebody else's file, and it is longer than one header block....\n");
    manifest_t *m;
    cr_assert_eq(manifest_open(&m, dir, 1 << 20, NULL, NULL, NULL, err, sizeof err), -EPROTO);
    cr_assert(strstr(err, "not a ballast manifest") != NULL, "%s", err);
    /* A header shorter than 64 bytes (crash while creating): start afresh. */
    cr_assert_eq(truncate(path, 10), 0);
    manifest_open_info_t info;
    cr_assert_eq(manifest_open(&m, dir, 1 << 20, NULL, NULL, &info, err, sizeof err), 0, "%s", err);
    cr_assert(info.created);
    manifest_close(m);
    remove_dir();
}
