/* rpc.h: a small unary RPC layer over the gRPC C core API (grpc/grpc.h)
 * carrying protobuf-c messages.
 *
 * Server: a method table (path -> handler + request/response descriptors),
 * N threads running handlers and one waiting on the completion queue, a catch-all answering
 * UNIMPLEMENTED for unknown paths, a maximum message size, the standard
 * grpc.health.v1.Health/Check, and a clean stop. Client: a reusable,
 * thread-safe channel; one blocking call per rpc_call with a deadline and an
 * optional wait-for-ready. Addresses are "unix:/path" or "host:port".
 * Unix listeners are accepted here, not by gRPC: the socket file gets mode
 * 0660 (and a group), each connection's SO_PEERCRED is checked against an
 * allowed set and handed to the handler (rpc_ctx_t.peer_uid). TCP uses
 * TLS (gRPC's SSL credentials) when the server or client options name
 * certificates, plaintext otherwise. Every request is checked for strings
 * with an embedded NUL (INVALID_ARGUMENT) before its handler runs.
 *
 * Return values: functions returning int give 0 on success and -1 on error
 * with a message in the caller's err buffer, except rpc_call / rpc_call_raw,
 * which return a gRPC status code (grpc_status_code, 0 = OK).
 * See docs/rpc.md for the conventions and how to add a service. */
#ifndef BALLAST_RPC_H
#define BALLAST_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "shm.h"

#define RPC_ERR_LEN 256                     /* bytes of rpc_ctx_t.err */
#define RPC_DEFAULT_MAX_MSG (4u << 20)      /* bytes; default message size limit */
#define RPC_DEFAULT_THREADS 2               /* server threads when opts.threads = 0 */

typedef struct rpc_server rpc_server_t;
typedef struct rpc_client rpc_client_t;
typedef struct rpc_ctx_priv rpc_ctx_priv_t;

/* ---- server ---- */

/* What a handler sees for one call. Valid only during the handler. */
typedef struct {
    const char *method;        /* full path, e.g. "/ballast.offload.v1.Offload/OpenSession" */
    const char *peer;          /* e.g. "unix:/run/x.sock" or "ipv4:127.0.0.1:4711" */
    void *user;                /* the method's rpc_method_t.user */
    int thread;                /* index of the server thread running the handler, 0..N (0: the one
                                  waiting on the completion queue) */
    bool peer_local;           /* the call came over a Unix listener; peer_* are its SO_PEERCRED */
    uint32_t peer_uid, peer_gid;
    int32_t peer_pid;
    bool peer_tls;             /* the call came over a TLS listener */
    char err[RPC_ERR_LEN];     /* status message sent with a non-OK status */
    rpc_ctx_priv_t *priv;      /* internal */
} rpc_ctx_t;

/* A handler fills *resp (already allocated and message_init()ed from the
 * method's response descriptor) from *req (unpacked, read-only, freed by the
 * server afterwards). It returns a gRPC status code; on anything but
 * GRPC_STATUS_OK it writes a message into ctx->err (rpc_ctx_errf) and the
 * response is not sent. Heap memory the handler hangs off *resp (strings,
 * repeated fields, sub-messages) is released after packing when registered
 * with rpc_ctx_defer_free or allocated with rpc_ctx_alloc; the server never
 * calls protobuf_c_message_free_unpacked on *resp.
 *
 * Threads: one server thread waits on the completion queue; a handler runs
 * on one of the N others (handed over through a queue, so the waiting
 * thread goes straight back to the completion queue), or on the waiting
 * thread itself when its method is marked quick or N is 1 (then that one
 * thread is all there is). Handlers of several calls run concurrently and should not block
 * for long: a blocked handler holds its thread. */
typedef grpc_status_code (*rpc_handler_fn)(rpc_ctx_t *ctx, const ProtobufCMessage *req,
                                           ProtobufCMessage *resp);

typedef struct {
    const char *path;                               /* "/package.Service/Method" */
    const ProtobufCMessageDescriptor *req_desc;     /* e.g. &ballast__test__v1__echo_request__descriptor */
    const ProtobufCMessageDescriptor *resp_desc;
    rpc_handler_fn handler;
    void *user;                                     /* handed to the handler as ctx->user */
    bool quick;                                     /* the handler takes microseconds and never blocks:
                                                       run it on the thread that received the call, with
                                                       no handover (a wakeup of another thread per call) */
} rpc_method_t;

typedef struct {
    int threads;               /* handlers that may run at once; with more than 1, one more thread
                                  waits on the completion queue and runs only quick methods' handlers;
                                  0 = RPC_DEFAULT_THREADS */
    size_t max_msg_bytes;      /* largest request/response accepted, bytes; 0 = RPC_DEFAULT_MAX_MSG */
    const shm_uidset_t *unix_peers; /* peers allowed on Unix listeners; NULL = our uid and root */
    bool unix_group_set;       /* chown Unix socket files to unix_gid */
    gid_t unix_gid;
    const char *tls_cert;      /* PEM files for TCP listeners; NULL = plaintext */
    const char *tls_key;
    const char *tls_ca;        /* PEM of CAs whose client certificates are required; NULL = none asked */
} rpc_server_opts_t;

/* Health states, same numbers as grpc.health.v1.HealthCheckResponse.ServingStatus. */
typedef enum {
    RPC_HEALTH_SERVING = 1,
    RPC_HEALTH_NOT_SERVING = 2,
} rpc_health_t;

/* Create a server (not yet listening). opts may be NULL for defaults.
 * Takes a grpc_init reference, dropped by rpc_server_free. NULL on error. */
rpc_server_t *rpc_server_new(const rpc_server_opts_t *opts, char *err, size_t errlen);

/* Add methods (before rpc_server_start). The path string is copied; the
 * descriptors must outlive the server. Duplicate or malformed paths
 * (must look like "/pkg.Service/Method") are errors. */
int rpc_server_add_method(rpc_server_t *s, const rpc_method_t *m, char *err, size_t errlen);
int rpc_server_add_methods(rpc_server_t *s, const rpc_method_t *m, size_t n,
                           char *err, size_t errlen);

/* Listen on addr (before rpc_server_start): "unix:/path" (a stale socket
 * file is replaced; mode 0660, peers checked against opts.unix_peers) or
 * "host:port" (TLS when opts.tls_cert is set); port 0 picks a free port. Several
 * addresses per server are fine. *bound_port (may be NULL) receives the
 * TCP port actually bound, 0 for a Unix socket. */
int rpc_server_listen(rpc_server_t *s, const char *addr, int *bound_port, char *err, size_t errlen);

/* Start the threads. At least one listener is required. */
int rpc_server_start(rpc_server_t *s, char *err, size_t errlen);

/* Set what Health/Check reports for service ("" = the whole server, which
 * starts SERVING). Services never set answer NOT_FOUND. Any time, any thread. */
void rpc_server_set_health(rpc_server_t *s, const char *service, rpc_health_t st);

/* Stop: refuse new calls, wait up to grace_ms for calls in flight, cancel
 * the rest, drain every completion queue and join the threads. Idempotent;
 * must not be called from a handler. */
void rpc_server_stop(rpc_server_t *s, int grace_ms);

/* Stop (grace 0) if still running, free everything, drop the grpc_init
 * reference. NULL is fine. */
void rpc_server_free(rpc_server_t *s);

/* Number of calls answered so far (all statuses), for stats and tests. */
uint64_t rpc_server_calls(const rpc_server_t *s);

/* ---- inside a handler ---- */

/* Free p (with free()) after the response has been packed. Returns p.
 * On allocation failure of the bookkeeping, p is freed at once and NULL is
 * returned; the handler should then fail with RESOURCE_EXHAUSTED. */
void *rpc_ctx_defer_free(rpc_ctx_t *ctx, void *p);

/* calloc(1, n) freed after packing; NULL when out of memory. */
void *rpc_ctx_alloc(rpc_ctx_t *ctx, size_t n);

/* Format ctx->err; returns code so handlers can write
 * `return rpc_ctx_errf(ctx, GRPC_STATUS_NOT_FOUND, "no blob %s", key);` */
grpc_status_code rpc_ctx_errf(rpc_ctx_t *ctx, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Milliseconds left before the caller's deadline; INT64_MAX when none. */
int64_t rpc_ctx_time_left_ms(const rpc_ctx_t *ctx);

/* ---- client ---- */

typedef struct {
    size_t max_msg_bytes;      /* largest response accepted, bytes; 0 = 64 MiB */
    const char *tls_ca;        /* PEM file of the CA that signed the server's certificate:
                                  TLS to a TCP address; NULL = plaintext */
    const char *tls_cert;      /* client certificate and key (PEM files) when the server asks */
    const char *tls_key;
} rpc_client_opts_t;

/* Whether the client talks TLS or over a Unix socket (a token may travel). */
bool rpc_client_private(const rpc_client_t *c);

/* Open a channel to addr ("unix:/path" or "host:port"). Connecting is lazy:
 * this succeeds even when nothing listens yet. opts may be NULL. Takes a
 * grpc_init reference, dropped by rpc_client_close. NULL on error. */
rpc_client_t *rpc_client_open(const char *addr, const rpc_client_opts_t *opts,
                              char *err, size_t errlen);
void rpc_client_close(rpc_client_t *c);
const char *rpc_client_addr(const rpc_client_t *c);

/* One unary call; blocks until the answer, the deadline or a failure.
 * Thread-safe: any number of threads may share one client.
 *   method         "/pkg.Service/Method"
 *   req            the request message (packed here; not modified)
 *   resp_desc      descriptor of the expected response
 *   resp           out: on GRPC_STATUS_OK the unpacked response, which the
 *                  caller frees with protobuf_c_message_free_unpacked(*resp, NULL);
 *                  NULL otherwise
 *   deadline_ms    time allowed for the whole call; <= 0 means no deadline
 *   wait_for_ready false: fail fast with UNAVAILABLE when the server cannot
 *                  be reached; true: wait (up to the deadline) for it
 *   msg            out (may be NULL): "" on OK, else a message naming the
 *                  address, the method, the status and the server's text
 * Returns the gRPC status code. A response that does not unpack is
 * GRPC_STATUS_INTERNAL. */
grpc_status_code rpc_call(rpc_client_t *c, const char *method, const ProtobufCMessage *req,
                          const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                          int64_t deadline_ms, bool wait_for_ready, char *msg, size_t msglen);

/* Same with raw bytes: sends req[0..req_len) as the message and returns the
 * response bytes in *resp (malloc'ed, caller frees; set only on OK; may be
 * non-NULL with *resp_len 0). For tests and tools. */
grpc_status_code rpc_call_raw(rpc_client_t *c, const char *method, const void *req,
                              size_t req_len, void **resp, size_t *resp_len, int64_t deadline_ms,
                              bool wait_for_ready, char *msg, size_t msglen);

/* "OK", "CANCELLED", ..., "UNAUTHENTICATED"; "UNKNOWN_STATUS" otherwise. */
const char *rpc_status_name(grpc_status_code code);

#endif
