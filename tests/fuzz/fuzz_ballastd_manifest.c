/* fuzz_ballastd_manifest.c: ballastd's log of persistent blobs
 * (services/offload/manifest.c). The input is a whole "manifest" file;
 * manifest_open replays it (cutting what it does not accept) and every
 * replayed record must be a known type with a NUL-terminated job name;
 * manifest_decode is run on every 160-byte record of the input as well.
 * BALLAST_FUZZ_WRITE_SEED=DIR writes a log made by the real writer (job,
 * put, delete and release records) to DIR/valid.log. */
#include <assert.h>

#include "services/offload/manifest.h"
#include "tests/fuzz/fuzz_util.h"

static void on_rec(void *arg, const manifest_rec_t *rec) {
    assert(rec->type >= MREC_JOB && rec->type <= MREC_RELEASE);
    assert(memchr(rec->job, 0, sizeof rec->job));
    ++*(uint64_t *)arg;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *seed = getenv("BALLAST_FUZZ_WRITE_SEED");
    if (!seed) return 0;
    char err[512], cmd[2048];
    const char *d = fuzz_dir("bmseed");
    manifest_t *m;
    if (manifest_open(&m, d, 1 << 30, NULL, NULL, NULL, err, sizeof err)) { fprintf(stderr, "%s\n", err); exit(1); }
    manifest_rec_t r = { .type = MREC_JOB, .job_id = 1 };
    snprintf(r.job, sizeof r.job, "job-a");
    manifest_append(m, &r, false);
    for (uint64_t i = 0; i < 3; i++) {
        r = (manifest_rec_t){ .type = MREC_PUT, .job_id = 1, .rank = 0, .kind = 2, .index = i, .step = 7,
                              .length = 4096, .nvme_off = i * 4096, .crc = 0x1234567u + (uint32_t)i, .flags = 1 };
        snprintf(r.job, sizeof r.job, "job-a");
        manifest_append(m, &r, false);
    }
    r = (manifest_rec_t){ .type = MREC_DEL, .job_id = 1, .kind = 2, .index = 1, .step = 7 };
    manifest_append(m, &r, false);
    r = (manifest_rec_t){ .type = MREC_RELEASE, .job_id = 1 };
    manifest_append(m, &r, true);
    manifest_close(m);
    snprintf(cmd, sizeof cmd, "cp '%s/manifest' '%s/valid.log'", d, seed);
    exit(system(cmd) == 0 ? 0 : 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *d = fuzz_dir("bmanifest");
    char p[512], err[512];
    snprintf(p, sizeof p, "%s/manifest", d);
    if (fuzz_write_file(p, data, size)) return 0;
    for (size_t off = MANIFEST_HDR_SIZE; off + MANIFEST_REC_SIZE <= size; off += MANIFEST_REC_SIZE) {
        manifest_rec_t rec;
        if (manifest_decode(data + off, &rec)) assert(rec.type >= MREC_JOB && rec.type <= MREC_RELEASE);
    }
    manifest_t *m = NULL;
    manifest_open_info_t info;
    uint64_t n = 0;
    err[0] = 0;
    if (manifest_open(&m, d, 1 << 30, on_rec, &n, &info, err, sizeof err) == 0) {
        assert(n == info.records);
        manifest_close(m);
    } else {
        assert(err[0]);
    }
    return 0;
}
