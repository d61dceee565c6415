/* offload_link.h: one worker rank's connection to ballastd for the memory
 * savers (workers/offload/act.h, workers/offload/opt.h).
 *
 * It wraps the client library (workers/offload/client.h) with what both
 * savers need: opening the session from the worker's flags, counting the
 * bytes moved each way and the time the rank waited for the service
 * (exposed waits), and exporting those as the worker metrics
 *   ballast_offload_bytes_total{rank, direction="to_service"|"from_service"}
 *   ballast_offload_wait_seconds_total{rank}
 * in the process's registry (common/metrics.h).
 *
 * Functions return 0 or -1 with a message in err that names the service
 * address and, for an unreachable service, how to start ballastd. */
#ifndef BALLAST_OFFLOAD_LINK_H
#define BALLAST_OFFLOAD_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"
#include "workers/offload/client.h"

typedef struct {
    oc_client_t *c;            /* the session */
    uint32_t rank;             /* this worker's global rank (the key's rank) */
    const char *addr;          /* what was opened, for messages */
    const char *job;           /* the session's job name */
    uint64_t to_service;       /* bytes written into blobs, since open */
    uint64_t from_service;     /* bytes read from blobs, since open */
    double wait_s;             /* seconds spent waiting on the service, since open */
    metric_t *m_to, *m_from;   /* ballast_offload_bytes_total series, or NULL */
    metric_t *m_wait;          /* ballast_offload_wait_seconds_total series, or NULL */
} offload_link_t;

/* Open a session for rank in job. remote ("host:port") wins over socket
 * ("unix:/path" or a path); token_file (NULL = none) holds the token a
 * ballastd started with --token-file asks for. Registers the metrics in
 * metrics_default(). */
int offload_link_open(offload_link_t *l, const char *socket, const char *remote, const char *job,
                      const char *token_file, int rank, char *err, size_t errlen);
/* Register (or find) the two metric families in r and take this rank's
 * series (open does it with metrics_default()). A family registered before
 * with the same labels (workers/train/progress.c has the bytes one) is shared. */
void offload_link_metrics(offload_link_t *l, metrics_registry_t *r);

/* Close the session (its non-persistent blobs are freed). NULL-safe. */
void offload_link_close(offload_link_t *l);

/* Account n bytes moved to or from the service. */
void offload_link_count(offload_link_t *l, uint64_t to_service, uint64_t from_service);

/* oc_wait(h) with the time it blocked counted as exposed wait; 0, or -1
 * with a message naming what was waited for (what). */
int offload_link_wait(offload_link_t *l, oc_handle_t h, oc_buf_t *b, const char *what, char *err, size_t errlen);

/* Store len bytes under k (persistent or not), replacing a blob left under
 * the same key by an earlier run; counted as sent. 0 or -1. */
int offload_link_put(offload_link_t *l, const oc_key_t *k, const void *data, uint64_t len, bool persistent,
                     char *err, size_t errlen);
/* oc_put_alloc with the same replacement of a stale blob. */
int offload_link_put_alloc(offload_link_t *l, const oc_key_t *k, uint64_t len, bool persistent, oc_buf_t *b,
                           char *err, size_t errlen);
/* Free k; a missing key is not an error. 0 or -1. */
int offload_link_free(offload_link_t *l, const oc_key_t *k, char *err, size_t errlen);

/* Format a failed call's message: "<what>: <client library message>". Returns -1. */
int offload_link_fail(char *err, size_t errlen, const char *what);

/* Whether the savers may compute on pool memory in place (read a block
 * input there, run AdamW on moments there): only on a backend whose memory
 * is host memory in fp32 (backend_t.host_memory: the CPU backend).
 * Elsewhere they copy through a staging buffer in backend memory. */
struct backend;
bool offload_link_in_place(const struct backend *be);

#endif
