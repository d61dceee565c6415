/* offload_ring.h: the per-session ring protocol between a worker and ballastd.
 *
 * A session's ring memfd holds two rings of common/ring.h, each with
 * RING_PROTO_ENTRY_BYTES-byte entries: the request ring (worker -> service)
 * at offset 0 and the completion ring (service -> worker) at
 * ring_proto_comp_offset(capacity). Four eventfds travel with it (see
 * RP_FD_*). The worker produces requests and consumes completions; the
 * service does the opposite and answers every request with exactly one
 * completion carrying the same req_id, in request order.
 *
 * Keys inside a ring are relative to the session's job: the service fills
 * in the job id, so a session can only name blobs of its own job. Regions are
 * (segment id, offset, length) inside the job's segments the worker mapped;
 * the service accepts a region only when it lies inside a segment of the
 * session's job and inside the region this session holds for that key
 * (allocated by its PUT_ALLOC, or pinned by its GET); another session's
 * region, one this session no longer holds, or any offset in another job's
 * segment, is refused with RP_D_BAD_REGION.
 *
 * Segments: each job has its own pool segments, created on demand. Attach
 * hands over the job's segments that exist then; a completion may later name
 * a segment id the worker has not mapped (the job grew): the worker then
 * asks for that one segment on the fd socket (rp_segment_req_t) and maps it
 * before it touches the region. Segment ids are never reused.
 *
 * Status codes are the wire values of proto/status.h, gRPC's numbers, so
 * that ring and RPC errors read the same. Both structs are plain
 * little-endian data with no pointers; the service validates every field of
 * every request, the client every status it reads. */
#ifndef BALLAST_RING_PROTO_H
#define BALLAST_RING_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "proto/status.h"

/* 3: a side waiting on a ring may sleep on its flag word (a futex, flag
 * value 2) instead of the eventfd (flag 1); the waker wakes it either way.
 * 2: per-job segments named by completions. */
#define RING_PROTO_VERSION      3u
#define RING_PROTO_ENTRY_BYTES  64u
#define RING_PROTO_MAX_CAPACITY 4096u

/* Ops carried in rp_req_t.op. 0 is never valid. */
typedef enum {
    RP_OP_PUT_ALLOC  = 1, /* reserve length bytes for key; completion gives the region */
    RP_OP_PUT_COMMIT = 2, /* the worker wrote the region: checksum (+ persist) and publish */
    RP_OP_GET        = 3, /* make key resident, pin it for this session, return the region */
    RP_OP_GET_DONE   = 4, /* the worker finished reading what GET returned: unpin */
    RP_OP_PREFETCH   = 5, /* hint: bring key back from the spill tier soon; no pin */
    RP_OP_FREE       = 6, /* drop key (and any region this session holds for it) */
    RP_OP_PIN        = 7, /* keep key in RAM (no eviction) until UNPIN */
    RP_OP_UNPIN      = 8,
    RP_OP_NOP        = 9, /* answered at once: lease renewal and latency probes */
    RP_OP_MAX_       = 10
} rp_op_t;

/* rp_req_t.flags */
#define RP_FLAG_PERSISTENT 0x1u /* PUT_ALLOC: the blob survives sessions and restarts */
#define RP_FLAGS_KNOWN     RP_FLAG_PERSISTENT

/* rp_cpl_t.blob_flags */
#define RP_CPL_PERSISTENT  RP_FLAG_PERSISTENT /* GET: the blob is persistent */
#define RP_CPL_CRC_KNOWN   0x2u /* PUT_COMMIT / GET: crc32c holds the blob's checksum; clear
                                   when it is not computed yet (crc32c is then 0): a
                                   non-persistent blob gets it when first written to NVMe */

/* Completion status (rp_cpl_t.status, rp_attach_reply_t.status): a wire
 * value of status_t (proto/status.h), i.e. a gRPC status code number. The
 * service writes status_wire() of what happened; a reader takes the field
 * through status_from_grpc(), which turns anything else into
 * STATUS_UNKNOWN. The detail code says more. */

/* Why a request failed, more precisely than the status (rp_cpl_t.detail). */
typedef enum {
    RP_D_NONE = 0,
    RP_D_BAD_OP,          /* op unknown */
    RP_D_BAD_FLAGS,       /* flags has unknown bits or flags on an op that takes none */
    RP_D_BAD_KIND,        /* key kind not in 1..4 */
    RP_D_BAD_LENGTH,      /* length 0 or over the largest blob */
    RP_D_BAD_REGION,      /* segment/offset/length is not the region this session holds */
    RP_D_OVER_QUOTA,      /* the session's quota would be exceeded */
    RP_D_POOL_FULL,       /* nothing evictable left in the pool */
    RP_D_EXISTS,          /* PUT_ALLOC of a key that exists */
    RP_D_NO_KEY,          /* key unknown (or not yet committed) */
    RP_D_NOT_HELD,        /* the session holds no region for key (COMMIT/GET_DONE) */
    RP_D_CRC,             /* crc32c mismatch on read-back */
    RP_D_IO,              /* spill tier I/O error */
    RP_D_DRAINING,        /* the service is draining */
    RP_D_BAD_PAD,         /* reserved bytes not zero */
    RP_D_JOB_QUOTA,       /* the job's quota (--job-quota) would be exceeded */
    RP_D_MAX_
} rp_detail_t;

/* A request, worker -> service. 64 bytes. */
typedef struct {
    uint32_t op;          /* rp_op_t */
    uint32_t flags;       /* RP_FLAG_* (PUT_ALLOC only) */
    uint64_t req_id;      /* chosen by the worker, echoed in the completion */
    uint32_t rank;        /* key.rank */
    uint32_t kind;        /* key.kind: 1..4 (Kind in offload.proto) */
    uint64_t index;       /* key.index */
    uint64_t step;        /* key.step */
    uint32_t seg;         /* PUT_COMMIT / GET_DONE: region segment */
    uint32_t reserved;    /* must be 0 */
    uint64_t offset;      /* PUT_COMMIT / GET_DONE: region offset in the segment, bytes */
    uint64_t length;      /* PUT_ALLOC: blob bytes; PUT_COMMIT / GET_DONE: region length */
} rp_req_t;

/* A completion, service -> worker. 64 bytes. */
typedef struct {
    uint64_t req_id;      /* from the request */
    uint32_t op;          /* from the request */
    uint32_t status;      /* status_t, a wire value (see above) */
    uint32_t detail;      /* rp_detail_t */
    uint32_t seg;         /* PUT_ALLOC / GET: region segment */
    uint64_t offset;      /* PUT_ALLOC / GET: region offset in the segment, bytes */
    uint64_t length;      /* PUT_ALLOC / GET: region length (= blob length), bytes */
    uint32_t crc32c;      /* PUT_COMMIT / GET: the blob's checksum when RP_CPL_CRC_KNOWN */
    uint32_t blob_flags;  /* RP_CPL_*: GET: PERSISTENT; PUT_COMMIT / GET: CRC_KNOWN */
    uint64_t used_bytes;  /* the session's usage after this op, bytes */
    uint8_t  pad[8];
} rp_cpl_t;

_Static_assert(sizeof(rp_req_t) == RING_PROTO_ENTRY_BYTES, "rp_req_t must be 64 bytes");
_Static_assert(sizeof(rp_cpl_t) == RING_PROTO_ENTRY_BYTES, "rp_cpl_t must be 64 bytes");

/* The fds sent after the ring memfd, in this order, on the fd socket. */
enum {
    RP_FD_RING = 0,       /* memfd holding both rings */
    RP_FD_REQ_DATA,       /* eventfd: worker rings it after pushing requests */
    RP_FD_REQ_SPACE,      /* eventfd: service rings it after freeing request slots */
    RP_FD_CPL_DATA,       /* eventfd: service rings it after pushing completions */
    RP_FD_CPL_SPACE,      /* eventfd: worker rings it after freeing completion slots */
    RP_FD_COUNT
};

/* The fd socket handshake. The worker sends rp_attach_t (no fds); the
 * service answers with rp_attach_reply_t and, when status is STATUS_OK, the
 * segment fds of the session's job only (nsegs of them, in chunks of at most
 * 16 per message: each chunk is an rp_fd_chunk_t naming the segment ids and
 * sizes of the fds it carries) and then the RP_FD_COUNT ring fds in one last
 * rp_fd_chunk_t (ring = 1, no ids).
 *
 * A later segment: the worker connects again and sends rp_segment_req_t
 * (session id, attach nonce, segment id); the service answers with an
 * rp_attach_reply_t (nsegs 1 or 0) and, on STATUS_OK, one rp_fd_chunk_t
 * carrying that segment's fd. It refuses (NOT_FOUND, naming no owner) a
 * segment that is not of the session's job, and any caller but the
 * session's attached owner uid. */
#define RP_ATTACH_MAGIC 0x48435441504c42ull /* "BLPATCH" */
typedef struct {
    uint64_t magic;       /* RP_ATTACH_MAGIC */
    uint64_t session_id;  /* from OpenSessionResponse */
    uint64_t nonce;       /* OpenSessionResponse.attach_nonce */
    uint32_t version;     /* RING_PROTO_VERSION */
    uint32_t reserved;
} rp_attach_t;

typedef struct {
    uint32_t status;      /* status_t, a wire value */
    uint32_t nsegs;       /* pool segments that follow */
    char msg[248];        /* why, when status != STATUS_OK */
} rp_attach_reply_t;

#define RP_SEGMENT_MAGIC 0x4d474553504c42ull /* "BLPSEGM" */
typedef struct {
    uint64_t magic;       /* RP_SEGMENT_MAGIC */
    uint64_t session_id;
    uint64_t nonce;       /* the session's attach nonce */
    uint32_t version;     /* RING_PROTO_VERSION */
    uint32_t seg;         /* the segment id a completion named */
} rp_segment_req_t;

_Static_assert(sizeof(rp_segment_req_t) == sizeof(rp_attach_t), "the two fd-socket requests share a size");

#define RP_CHUNK_FDS 16   /* = SHM_MAX_FDS */
typedef struct {
    uint32_t count;       /* fds in this chunk */
    uint32_t ring;        /* 1: this chunk carries the ring fds */
    uint32_t seg[RP_CHUNK_FDS];   /* segment chunks: the id of each fd */
    uint64_t bytes[RP_CHUNK_FDS]; /* segment chunks: the size of each */
} rp_fd_chunk_t;

/* Offset of the completion ring inside the ring memfd (page aligned). */
static inline uint64_t ring_proto_comp_offset(uint64_t req_ring_bytes) {
    return (req_ring_bytes + 4095u) & ~(uint64_t)4095u;
}

/* Short names for ops, statuses and details (static strings). */
static inline const char *rp_op_name(uint32_t op) {
    static const char *n[] = { "?", "PUT_ALLOC", "PUT_COMMIT", "GET", "GET_DONE",
                               "PREFETCH", "FREE", "PIN", "UNPIN", "NOP" };
    return op < RP_OP_MAX_ ? n[op] : "UNKNOWN_OP";
}

static inline const char *rp_detail_text(uint32_t d) {
    static const char *n[] = {
        "", "unknown op", "unknown flag bits (or flags on an op that takes none)",
        "key kind must be 1..4 (ACTIVATION, OPTIMIZER_STATE, PARAM, OTHER)",
        "length is 0 or larger than the largest blob",
        "region is not the one this session holds for the key",
        "session quota exceeded: free blobs, or open the session with a larger quota (up to ballastd's --session-quota)",
        "pool full and nothing can be evicted", "key already exists: free it first",
        "no such key (never committed, freed, or lost in a crash before its ack)",
        "this session holds no region for the key", "crc32c mismatch on read-back",
        "spill tier I/O error", "service is draining", "reserved bytes must be zero",
        "job quota exceeded: the job's blobs together would pass ballastd's --job-quota; free "
        "blobs of the job (persistent ones too) or raise --job-quota" };
    return d < RP_D_MAX_ ? n[d] : "unknown detail";
}

#endif
