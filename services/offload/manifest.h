/* manifest.h: the crash-safe record of persistent blobs.
 *
 * An append-only log in "<spill dir>/manifest": a 64-byte header, then
 * fixed 160-byte records, each carrying its own CRC-32C. A record is
 * appended (and fdatasynced) only after the blob's bytes are durable in the
 * spill file, so a record that reads back valid always describes durable
 * data. At open the log is replayed in order. A record that is short, fails
 * its checksum or does not continue the sequence is either a torn tail (no
 * good record after it: a crash in the middle of an append), which is cut
 * off, or damage in the middle (good records follow), which is skipped,
 * counted and logged with its offset while the records after it are
 * replayed: the blobs they describe were acknowledged and must not be lost. When the log holds many dead records
 * it is compacted: the live ones are written to "manifest.tmp", fsynced,
 * renamed over "manifest", and the directory fsynced, so a crash leaves
 * either the old or the new log, never a mix. Byte layout: see
 * docs/ballastd-storage.md.
 *
 * Not thread-safe: the store serialises calls. */
#ifndef BALLAST_MANIFEST_H
#define BALLAST_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MANIFEST_HDR_SIZE  64
#define MANIFEST_REC_SIZE  160
#define MANIFEST_VERSION   1
#define MANIFEST_NAME_MAX  64    /* job name field, bytes, NUL-padded */

typedef enum {
    MREC_JOB = 1,     /* job name <-> job id */
    MREC_PUT = 2,     /* a persistent blob is durable at (nvme_off, length) */
    MREC_DEL = 3,     /* the blob with this key is gone */
    MREC_RELEASE = 4, /* every blob of job_id is gone */
} mrec_type_t;

typedef struct {
    uint8_t type;          /* mrec_type_t */
    uint64_t seq;          /* record number, assigned by manifest_append (increasing) */
    uint64_t job_id;       /* key: job */
    uint32_t rank;         /* key: rank */
    uint32_t kind;         /* key: kind */
    uint64_t index;        /* key: index */
    uint64_t step;         /* key: step */
    uint64_t length;       /* PUT: blob length, bytes */
    uint64_t nvme_off;     /* PUT: offset in the NVMe tier, bytes */
    uint32_t crc;          /* PUT: CRC-32C of the blob's bytes */
    uint32_t flags;        /* PUT: store flags (STORE_F_PERSISTENT) */
    char job[MANIFEST_NAME_MAX]; /* JOB, PUT: job name, NUL-terminated */
} manifest_rec_t;

typedef struct {
    uint64_t records;      /* valid records replayed */
    uint64_t torn_bytes;   /* bytes cut off the end (0 after a clean shutdown) */
    uint64_t damaged_records; /* bad records skipped in the middle (good ones follow them) */
    uint64_t first_damaged_off; /* file offset of the first of them, bytes */
    uint64_t file_bytes;   /* spill file size the log was made for, bytes */
    bool created;          /* no log existed: a new one was written */
} manifest_open_info_t;

typedef struct manifest manifest_t;

typedef void (*manifest_replay_fn)(void *arg, const manifest_rec_t *rec);

/* Open "<dir>/manifest", creating it (header with spill_file_bytes, written
 * through a temp file and renamed, directory fsynced) when absent. Existing
 * logs are replayed through fn (may be NULL) record by record, a torn tail
 * is cut off, damaged records followed by good ones are skipped and logged,
 * and info (may be NULL) says what was found; info->file_bytes
 * is the spill file size recorded in the header, which the caller must use.
 * Errors (-errno and a message): unreadable file, a header that is not a
 * ballast manifest or of another version (-EPROTO: the directory belongs to
 * something else or a newer ballastd). */
int manifest_open(manifest_t **out, const char *dir, uint64_t spill_file_bytes,
                  manifest_replay_fn fn, void *arg, manifest_open_info_t *info,
                  char *err, size_t errlen);

void manifest_close(manifest_t *m);

/* Append rec (its seq is assigned and written back), then fdatasync when
 * sync. The record is durable when this returns 0 with sync. -errno on
 * failure (the log is unchanged as far as replay is concerned). */
int manifest_append(manifest_t *m, manifest_rec_t *rec, bool sync);

/* fdatasync the log. */
int manifest_sync(manifest_t *m);

/* Rewrite the log with exactly live[0..n) (crash-safe, see above). */
int manifest_compact(manifest_t *m, manifest_rec_t *live, size_t n, char *err, size_t errlen);

/* Sequence number of the last record written or replayed (0: none). */
uint64_t manifest_last_seq(const manifest_t *m);

/* Records appended since open or the last compaction, plus those replayed. */
uint64_t manifest_records(const manifest_t *m);

/* Encode rec into MANIFEST_REC_SIZE bytes / decode and verify them (false
 * when the magic, type or checksum is wrong). For tests and tools. */
void manifest_encode(const manifest_rec_t *rec, unsigned char *buf);
bool manifest_decode(const unsigned char *buf, manifest_rec_t *rec);

#endif
