/* status.h: the one status vocabulary of the offload path: what ballastd's
 * store and sessions return, what a ring completion carries, what the client
 * library returns to workers, and its one mapping to gRPC status codes.
 *
 * It lives in proto/ because it is a wire-level vocabulary: the ring
 * (proto/offload_ring.h) carries these values, and the values 0..16 are
 * gRPC's own numbers (grpc/status.h), so a ring error and an RPC error read
 * the same. proto/ is below every other layer, so common/, services/ and
 * workers/ may all include it. A plain C header with no dependencies: no
 * gRPC header is needed to use it (tests/unit/test_status.c checks that the
 * numbers equal gRPC's).
 *
 * Two kinds of values:
 *   - wire values (0..16): exactly gRPC's codes. Only these travel: in a
 *     ring completion (rp_cpl_t.status), in the attach reply, as a gRPC
 *     status. A status read off the wire goes through status_from_grpc(),
 *     which turns anything outside 0..16 into STATUS_UNKNOWN.
 *   - refinements (STATUS_QUOTA_EXCEEDED and after): finer reasons ballastd
 *     keeps apart internally (counters, ring detail codes, log lines). Each
 *     travels as its coarser wire value (status_wire()); the ring's detail
 *     field (rp_detail_t) says which one it was.
 * Nothing persistent stores a status (the manifest holds none), so these
 * numbers only have to agree between one ballastd and its clients, and the
 * wire values never change because gRPC's never do. */
#ifndef BALLAST_PROTO_STATUS_H
#define BALLAST_PROTO_STATUS_H

#include <stdint.h>

typedef enum {
    /* ---- wire values: gRPC's numbers ---- */
    STATUS_OK                  = 0,
    STATUS_CANCELLED           = 1,
    STATUS_UNKNOWN             = 2,  /* also: a value received that is not a status */
    STATUS_INVALID_ARGUMENT    = 3,  /* bad argument: length, kind, region, name, flags... */
    STATUS_DEADLINE_EXCEEDED   = 4,  /* client: no answer within the timeout */
    STATUS_NOT_FOUND           = 5,  /* no such key / session (or its commit was never acknowledged) */
    STATUS_ALREADY_EXISTS      = 6,  /* put of a key that exists (store: unless STORE_F_REPLACE) */
    STATUS_PERMISSION_DENIED   = 7,  /* attach nonce does not match the session */
    STATUS_RESOURCE_EXHAUSTED  = 8,  /* out of memory, sessions, quota (see the refinements) */
    STATUS_FAILED_PRECONDITION = 9,  /* wrong state for the call (see the refinements) */
    STATUS_ABORTED             = 10,
    STATUS_OUT_OF_RANGE        = 11,
    STATUS_UNIMPLEMENTED       = 12, /* e.g. an RPC an older ballastd does not serve */
    STATUS_INTERNAL            = 13, /* a broken invariant or transport (see STATUS_IO_ERROR) */
    STATUS_UNAVAILABLE         = 14, /* service unreachable, draining or closed */
    STATUS_DATA_LOSS           = 15, /* crc32c mismatch on read-back; no bytes are returned */
    STATUS_UNAUTHENTICATED     = 16, /* token missing or wrong */
    STATUS_WIRE_COUNT_         = 17, /* wire values are 0 .. STATUS_WIRE_COUNT_-1 */

    /* ---- refinements: internal to ballastd, travel as the value named ---- */
    STATUS_QUOTA_EXCEEDED      = 32, /* RESOURCE_EXHAUSTED: the session's quota would be exceeded */
    STATUS_NO_SPACE,                 /* RESOURCE_EXHAUSTED: pool full and nothing evictable, NVMe
                                        tier full, or out of memory */
    STATUS_BUSY,                     /* FAILED_PRECONDITION: commit of a blob not ALLOCATED, replace
                                        of a pinned blob, put of a key another session is writing */
    STATUS_IO_ERROR,                 /* INTERNAL: the NVMe tier failed */
    STATUS_NO_SESSION,               /* FAILED_PRECONDITION: the store knows no such session id */
    STATUS_NOT_HELD,                 /* FAILED_PRECONDITION: get_done / unpin / commit by a session
                                        that does not hold the blob */
    STATUS_JOB_QUOTA_EXCEEDED,       /* RESOURCE_EXHAUSTED: the job's quota (--job-quota) would be
                                        exceeded */
    STATUS_END_                      /* one past the last value */
} status_t;

/* The wire value st travels as: st itself for 0..16, the coarser gRPC value
 * for a refinement (listed above), STATUS_UNKNOWN for anything that is not
 * a status_t. This table is the one mapping to gRPC codes. */
static inline status_t status_wire(status_t st) {
    switch (st) {
    case STATUS_QUOTA_EXCEEDED: return STATUS_RESOURCE_EXHAUSTED;
    case STATUS_NO_SPACE:       return STATUS_RESOURCE_EXHAUSTED;
    case STATUS_BUSY:           return STATUS_FAILED_PRECONDITION;
    case STATUS_IO_ERROR:       return STATUS_INTERNAL;
    case STATUS_NO_SESSION:     return STATUS_FAILED_PRECONDITION;
    case STATUS_NOT_HELD:       return STATUS_FAILED_PRECONDITION;
    case STATUS_JOB_QUOTA_EXCEEDED: return STATUS_RESOURCE_EXHAUSTED;
    default:
        return (unsigned)st < STATUS_WIRE_COUNT_ ? st : STATUS_UNKNOWN;
    }
}

/* The grpc_status_code (its number) for st: status_wire(st). */
static inline int status_to_grpc(status_t st) { return (int)status_wire(st); }

/* Back from a gRPC code, or from a status read off the wire (ring
 * completion, attach reply): the same value for 0..16, STATUS_UNKNOWN for
 * anything else. status_from_grpc(status_to_grpc(st)) is st for a wire
 * value and status_wire(st) for a refinement. */
static inline status_t status_from_grpc(int64_t code) {
    return code >= 0 && code < STATUS_WIRE_COUNT_ ? (status_t)code : STATUS_UNKNOWN;
}

/* The name of st for messages and logs: gRPC's constant name for a wire
 * value ("NOT_FOUND", "RESOURCE_EXHAUSTED"), and for a refinement its own
 * ("QUOTA_EXCEEDED", "NO_SPACE", ...); "UNKNOWN_STATUS" for anything else.
 * Static string. */
static inline const char *status_name(status_t st) {
    switch (st) {
    case STATUS_OK:                  return "OK";
    case STATUS_CANCELLED:           return "CANCELLED";
    case STATUS_UNKNOWN:             return "UNKNOWN";
    case STATUS_INVALID_ARGUMENT:    return "INVALID_ARGUMENT";
    case STATUS_DEADLINE_EXCEEDED:   return "DEADLINE_EXCEEDED";
    case STATUS_NOT_FOUND:           return "NOT_FOUND";
    case STATUS_ALREADY_EXISTS:      return "ALREADY_EXISTS";
    case STATUS_PERMISSION_DENIED:   return "PERMISSION_DENIED";
    case STATUS_RESOURCE_EXHAUSTED:  return "RESOURCE_EXHAUSTED";
    case STATUS_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case STATUS_ABORTED:             return "ABORTED";
    case STATUS_OUT_OF_RANGE:        return "OUT_OF_RANGE";
    case STATUS_UNIMPLEMENTED:       return "UNIMPLEMENTED";
    case STATUS_INTERNAL:            return "INTERNAL";
    case STATUS_UNAVAILABLE:         return "UNAVAILABLE";
    case STATUS_DATA_LOSS:           return "DATA_LOSS";
    case STATUS_UNAUTHENTICATED:     return "UNAUTHENTICATED";
    case STATUS_QUOTA_EXCEEDED:      return "QUOTA_EXCEEDED";
    case STATUS_NO_SPACE:            return "NO_SPACE";
    case STATUS_BUSY:                return "BUSY";
    case STATUS_IO_ERROR:            return "IO_ERROR";
    case STATUS_NO_SESSION:          return "NO_SESSION";
    case STATUS_NOT_HELD:            return "NOT_HELD";
    case STATUS_JOB_QUOTA_EXCEEDED:  return "JOB_QUOTA_EXCEEDED";
    default:                         return "UNKNOWN_STATUS";
    }
}

/* The short lower-case word ballastd has always put into its own error
 * messages ("put of key (...): not_found: ..."): status_name() in lower
 * case, except "exists" and "invalid" for ALREADY_EXISTS and
 * INVALID_ARGUMENT. Kept so that those messages read as before; new
 * messages use status_name(). Static string. */
static inline const char *status_word(status_t st) {
    switch (st) {
    case STATUS_OK:                  return "ok";
    case STATUS_CANCELLED:           return "cancelled";
    case STATUS_UNKNOWN:             return "unknown";
    case STATUS_INVALID_ARGUMENT:    return "invalid";
    case STATUS_DEADLINE_EXCEEDED:   return "deadline_exceeded";
    case STATUS_NOT_FOUND:           return "not_found";
    case STATUS_ALREADY_EXISTS:      return "exists";
    case STATUS_PERMISSION_DENIED:   return "permission_denied";
    case STATUS_RESOURCE_EXHAUSTED:  return "resource_exhausted";
    case STATUS_FAILED_PRECONDITION: return "failed_precondition";
    case STATUS_ABORTED:             return "aborted";
    case STATUS_OUT_OF_RANGE:        return "out_of_range";
    case STATUS_UNIMPLEMENTED:       return "unimplemented";
    case STATUS_INTERNAL:            return "internal";
    case STATUS_UNAVAILABLE:         return "unavailable";
    case STATUS_DATA_LOSS:           return "data_loss";
    case STATUS_UNAUTHENTICATED:     return "unauthenticated";
    case STATUS_QUOTA_EXCEEDED:      return "quota_exceeded";
    case STATUS_NO_SPACE:            return "no_space";
    case STATUS_BUSY:                return "busy";
    case STATUS_IO_ERROR:            return "io_error";
    case STATUS_NO_SESSION:          return "no_session";
    case STATUS_NOT_HELD:            return "not_held";
    case STATUS_JOB_QUOTA_EXCEEDED:  return "job_quota_exceeded";
    default:                         return "unknown_status";
    }
}

#endif
