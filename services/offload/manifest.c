/* manifest.c: the append-only, checksummed log of persistent blobs (see
 * manifest.h). All integers are little-endian on disk. */
#include "manifest.h"
#include "errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "log.h"

static const unsigned char HDR_MAGIC[8] = { 'B', 'A', 'L', 'L', 'M', 'A', 'N', 'I' };
#define REC_MAGIC 0x52534C42u /* bytes "BLSR" */

struct manifest {
    int fd;
    int dirfd;
    char path[4200];
    char tmp[4200];
    uint64_t end;        /* file offset where the next record goes */
    uint64_t seq;        /* last seq written or replayed */
    uint64_t nrec;       /* records in the file */
    uint64_t file_bytes; /* from the header */
};

/* ---- encoding ---- */

static void put32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get32(const unsigned char *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get64(const unsigned char *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

void manifest_encode(const manifest_rec_t *r, unsigned char *b) {
    memset(b, 0, MANIFEST_REC_SIZE);
    put32(b + 0, REC_MAGIC);
    b[4] = r->type;
    put64(b + 8, r->seq);
    put64(b + 16, r->job_id);
    put32(b + 24, r->rank);
    put32(b + 28, r->kind);
    put64(b + 32, r->index);
    put64(b + 40, r->step);
    put64(b + 48, r->length);
    put64(b + 56, r->nvme_off);
    put32(b + 64, r->crc);
    put32(b + 68, r->flags);
    size_t n = strnlen(r->job, MANIFEST_NAME_MAX - 1);
    memcpy(b + 72, r->job, n);
    put32(b + 156, crc32c(0, b, 156));
}

bool manifest_decode(const unsigned char *b, manifest_rec_t *r) {
    if (get32(b) != REC_MAGIC) return false;
    if (get32(b + 156) != crc32c(0, b, 156)) return false;
    if (b[4] < MREC_JOB || b[4] > MREC_RELEASE) return false;
    if (b[72 + MANIFEST_NAME_MAX - 1] != 0) return false;
    memset(r, 0, sizeof *r);
    r->type = b[4];
    r->seq = get64(b + 8);
    r->job_id = get64(b + 16);
    r->rank = get32(b + 24);
    r->kind = get32(b + 28);
    r->index = get64(b + 32);
    r->step = get64(b + 40);
    r->length = get64(b + 48);
    r->nvme_off = get64(b + 56);
    r->crc = get32(b + 64);
    r->flags = get32(b + 68);
    memcpy(r->job, b + 72, MANIFEST_NAME_MAX);
    return true;
}

static void encode_header(unsigned char *h, uint64_t file_bytes) {
    memset(h, 0, MANIFEST_HDR_SIZE);
    memcpy(h, HDR_MAGIC, 8);
    put32(h + 8, MANIFEST_VERSION);
    put32(h + 12, MANIFEST_REC_SIZE);
    put64(h + 16, file_bytes);
    put64(h + 24, (uint64_t)time(NULL));
    put32(h + 60, crc32c(0, h, 60));
}

/* ---- damage ---- */

/* Offset of the first record in buf[from, got) that decodes and continues
 * the sequence past seq; 0 when there is none. */
static size_t next_good(const unsigned char *buf, size_t from, size_t got, uint64_t seq) {
    for (size_t p = from; p + MANIFEST_REC_SIZE <= got; p += MANIFEST_REC_SIZE) {
        manifest_rec_t r;
        if (manifest_decode(buf + p, &r) && r.seq > seq) return p;
    }
    return 0;
}

static const char *type_word(unsigned t) {
    switch (t) {
    case MREC_JOB: return "JOB";
    case MREC_PUT: return "PUT";
    case MREC_DEL: return "DEL";
    case MREC_RELEASE: return "RELEASE";
    default: return "unknown";
    }
}

/* Log the damaged records buf[from, to): where they are, which sequence
 * numbers they held, and for each what its fields read as (unverified: one
 * of them is wrong, but usually the key still says which blob was lost). */
static void report_damage(const char *path, const unsigned char *buf, size_t from, size_t to,
                          uint64_t last, uint64_t next_seq) {
    log_warn("manifest %s: %zu damaged record(s) at offset %zu..%zu (sequence numbers %llu..%llu "
             "missing; records after them are good and were replayed). A blob such a record put "
             "is reported missing (NOT_FOUND), never returned wrong; a blob it freed may be served "
             "again unless a later record reused its space",
             path, (to - from) / MANIFEST_REC_SIZE, from, to, (unsigned long long)last + 1,
             (unsigned long long)next_seq - 1);
    for (size_t p = from; p < to; p += MANIFEST_REC_SIZE) {
        const unsigned char *b = buf + p;
        char job[MANIFEST_NAME_MAX];
        size_t n = 0;
        for (; n < MANIFEST_NAME_MAX - 1 && b[72 + n]; n++)
            job[n] = b[72 + n] >= 0x20 && b[72 + n] < 0x7f ? (char)b[72 + n] : '?';
        job[n] = 0;
        log_warn("manifest %s: damaged record at offset %zu read as (unverified) %s job %s (id %llu) "
                 "rank %u kind %u index %llu step %llu length %llu",
                 path, p, type_word(b[4]), job, (unsigned long long)get64(b + 16), get32(b + 24),
                 get32(b + 28), (unsigned long long)get64(b + 32), (unsigned long long)get64(b + 40),
                 (unsigned long long)get64(b + 48));
    }
}

/* ---- file helpers ---- */

static int write_all(int fd, const void *buf, size_t len, off_t off) {
    const char *p = buf;
    while (len) {
        ssize_t w = pwrite(fd, p, len, off);
        if (w < 0) { if (errno == EINTR) continue; return -errno; }
        if (w == 0) return -EIO;
        p += w;
        len -= (size_t)w;
        off += w;
    }
    return 0;
}

/* Write header + recs to the temp file, fsync, rename over the log, fsync
 * the directory, and make fd the new log. */
static int rewrite(manifest_t *m, uint64_t file_bytes, manifest_rec_t *recs, size_t n,
                   char *err, size_t errlen) {
    int fd = open(m->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) { int e = errno; errbuf_set(err, errlen, "creating %s: %s", m->tmp, strerror(e)); return -e; }
    size_t bytes = MANIFEST_HDR_SIZE + n * MANIFEST_REC_SIZE;
    unsigned char *buf = malloc(bytes);
    if (!buf) { close(fd); errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    encode_header(buf, file_bytes);
    uint64_t seq = m->seq;
    for (size_t i = 0; i < n; i++) {
        recs[i].seq = ++seq;
        manifest_encode(&recs[i], buf + MANIFEST_HDR_SIZE + i * MANIFEST_REC_SIZE);
    }
    int rc = write_all(fd, buf, bytes, 0);
    free(buf);
    if (rc == 0 && fsync(fd) != 0) rc = -errno;
    if (rc == 0 && rename(m->tmp, m->path) != 0) rc = -errno;
    if (rc == 0 && fsync(m->dirfd) != 0) rc = -errno;
    if (rc) {
        errbuf_set(err, errlen, "writing manifest %s: %s (is the spill filesystem full or read-only?)",
               m->path, strerror(-rc));
        close(fd);
        unlink(m->tmp);
        return rc;
    }
    if (m->fd >= 0) close(m->fd);
    m->fd = fd;
    m->end = bytes;
    m->seq = seq;
    m->nrec = n;
    m->file_bytes = file_bytes;
    return 0;
}

/* ---- public ---- */

int manifest_open(manifest_t **out, const char *dir, uint64_t spill_file_bytes,
                  manifest_replay_fn fn, void *arg, manifest_open_info_t *info,
                  char *err, size_t errlen) {
    *out = NULL;
    manifest_open_info_t dummy;
    if (!info) info = &dummy;
    memset(info, 0, sizeof *info);
    manifest_t *m = calloc(1, sizeof *m);
    if (!m) { errbuf_set(err, errlen, "out of memory"); return -ENOMEM; }
    m->fd = -1;
    snprintf(m->path, sizeof m->path, "%s/manifest", dir);
    snprintf(m->tmp, sizeof m->tmp, "%s/manifest.tmp", dir);
    m->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (m->dirfd < 0) {
        int e = errno;
        errbuf_set(err, errlen, "opening spill directory %s: %s", dir, strerror(e));
        free(m);
        return -e;
    }
    unlink(m->tmp); /* a compaction that crashed before its rename */

    int fd = open(m->path, O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) {
        int e = errno;
        errbuf_set(err, errlen, "opening %s: %s", m->path, strerror(e));
        manifest_close(m);
        return -e;
    }
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errbuf_set(err, errlen, "stat %s: %s", m->path, strerror(e));
        manifest_close(m);
        return -e;
    }
    if (fd >= 0 && st.st_size < MANIFEST_HDR_SIZE) {
        /* Created but its header never made it: no record can have been
         * acknowledged, so start afresh. */
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        int rc = rewrite(m, spill_file_bytes, NULL, 0, err, errlen);
        if (rc) { manifest_close(m); return rc; }
        info->created = true;
        info->file_bytes = spill_file_bytes;
        *out = m;
        return 0;
    }
    m->fd = fd;
    size_t size = (size_t)st.st_size;
    unsigned char *buf = malloc(size);
    if (!buf) { errbuf_set(err, errlen, "out of memory reading %s", m->path); manifest_close(m); return -ENOMEM; }
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, buf + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got < MANIFEST_HDR_SIZE || memcmp(buf, HDR_MAGIC, 8) != 0 ||
        get32(buf + 60) != crc32c(0, buf, 60)) {
        /* The header holds the spill file size every extent is found by:
         * guessing it could hand out a live blob's extent, so refuse. */
        errbuf_set(err, errlen, "%s is not a ballast manifest (bad magic or header checksum in bytes "
               "0-63: a foreign file or a damaged header); move the spill directory aside or point "
               "--spill-dir at an empty directory", m->path);
        free(buf);
        manifest_close(m);
        return -EPROTO;
    }
    if (get32(buf + 8) != MANIFEST_VERSION || get32(buf + 12) != MANIFEST_REC_SIZE) {
        errbuf_set(err, errlen, "%s has manifest version %u (record size %u); this ballastd reads "
               "version %d: use the ballastd that wrote it or an empty --spill-dir",
               m->path, get32(buf + 8), get32(buf + 12), MANIFEST_VERSION);
        free(buf);
        manifest_close(m);
        return -EPROTO;
    }
    m->file_bytes = get64(buf + 16);
    info->file_bytes = m->file_bytes;
    size_t pos = MANIFEST_HDR_SIZE;
    while (pos + MANIFEST_REC_SIZE <= got) {
        manifest_rec_t r;
        if (manifest_decode(buf + pos, &r) && r.seq > m->seq) {
            m->seq = r.seq;
            m->nrec++;
            if (fn) fn(arg, &r);
            pos += MANIFEST_REC_SIZE;
            continue;
        }
        /* A bad record. With a good one after it, it is damage in the middle
         * of the log (the records after it were appended, and possibly
         * acknowledged, later): skip it and report it. Without, it is a torn
         * tail. */
        size_t next = next_good(buf, pos + MANIFEST_REC_SIZE, got, m->seq);
        if (!next) break;
        uint64_t nbad = (next - pos) / MANIFEST_REC_SIZE;
        manifest_rec_t after;
        manifest_decode(buf + next, &after);
        report_damage(m->path, buf, pos, next, m->seq, after.seq);
        if (!info->damaged_records) info->first_damaged_off = pos;
        info->damaged_records += nbad;
        pos = next;
    }
    free(buf);
    info->records = m->nrec;
    info->torn_bytes = size - pos;
    m->end = pos;
    if (pos < size) {
        log_warn("manifest %s: cutting %zu bytes at offset %zu, after record %llu (a torn tail from "
                 "a crash during an append: no record after it reads back valid); the puts they "
                 "described were never acknowledged",
                 m->path, size - pos, pos, (unsigned long long)m->seq);
        if (ftruncate(fd, (off_t)pos) != 0 || fdatasync(fd) != 0) {
            int e = errno;
            errbuf_set(err, errlen, "truncating the torn tail of %s: %s", m->path, strerror(e));
            manifest_close(m);
            return -e;
        }
    }
    *out = m;
    return 0;
}

void manifest_close(manifest_t *m) {
    if (!m) return;
    if (m->fd >= 0) close(m->fd);
    if (m->dirfd >= 0) close(m->dirfd);
    free(m);
}

int manifest_append(manifest_t *m, manifest_rec_t *rec, bool sync) {
    unsigned char b[MANIFEST_REC_SIZE];
    rec->seq = m->seq + 1;
    manifest_encode(rec, b);
    int rc = write_all(m->fd, b, sizeof b, (off_t)m->end);
    if (rc == 0 && sync && fdatasync(m->fd) != 0) rc = -errno;
    if (rc) return rc;
    m->seq = rec->seq;
    m->end += MANIFEST_REC_SIZE;
    m->nrec++;
    return 0;
}

int manifest_sync(manifest_t *m) { return fdatasync(m->fd) != 0 ? -errno : 0; }

int manifest_compact(manifest_t *m, manifest_rec_t *live, size_t n, char *err, size_t errlen) {
    return rewrite(m, m->file_bytes, live, n, err, errlen);
}

uint64_t manifest_records(const manifest_t *m) { return m->nrec; }
uint64_t manifest_last_seq(const manifest_t *m) { return m->seq; }
