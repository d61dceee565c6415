/* rpc_service.h: the gRPC service ballast.offload.v1.Offload on top of the
 * rpc layer (common/rpc.h), the store and the session manager.
 *
 * Each handler validates every field of its request (names, sizes, enum
 * values, quota, session) and answers INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
 * NOT_FOUND, FAILED_PRECONDITION, UNAUTHENTICATED, UNAVAILABLE or DATA_LOSS
 * with a message that names what was wrong; nothing a client sends can stop
 * the service from serving others. */
#ifndef BALLAST_RPC_SERVICE_H
#define BALLAST_RPC_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc.h"
#include "services/offload/session.h"
#include "services/offload/store.h"

#define OFFLOAD_SVC "/ballast.offload.v1.Offload/"

typedef struct {
    store_t *store;
    sess_mgr_t *sessions;
    rpc_server_t *server;        /* for the call counter; may be NULL */
    const char *fd_socket;       /* handed to shared-memory clients */
    uint64_t max_msg_bytes;      /* the server's message limit, bytes */
    double start_s;              /* CLOCK_MONOTONIC at start, seconds */
    volatile int *drain_flag;    /* set to 1 by the Drain RPC (may be NULL): the service then exits */
    bool has_token;              /* --token-file was given */
} offload_svc_t;

/* Register the Offload methods on server s; svc must outlive it. */
int offload_svc_register(rpc_server_t *s, offload_svc_t *svc, char *err, size_t errlen);

/* How many methods and their table (for tests). */
const rpc_method_t *offload_svc_methods(offload_svc_t *svc, size_t *n);

#endif
