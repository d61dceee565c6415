/* link.h: one worker rank's connection to ballastd for the memory savers
 * (workers/offload/act.h, workers/offload/opt.h), and their only way to it.
 *
 * It wraps the client library (workers/offload/client.h) wholly: the savers
 * never call oc_* themselves. It opens the session from the worker's flags,
 * passes on the requests the savers make (each failure as "<what>: <the
 * client library's message>", what naming the saver's purpose), counts the
 * bytes moved each way, and owns waiting: every time the host blocks for a
 * saver, on a request to the service or on a backend copy
 * (workers/backend/backend.h, be_xfer_*), it blocks in one of the wait
 * functions below, which add the time blocked to the exposed-wait counter
 * (wait_s) and the metric. The metrics, in the process's registry
 * (common/metrics.h):
 *   ballast_offload_bytes_total{rank, direction="to_service"|"from_service"}
 *   ballast_offload_wait_seconds_total{rank}
 *
 * What counts as exposed wait: the time the host blocked for work the
 * savers started asynchronously (a request's handle, a backend copy) and in
 * the synchronous commit of offload_link_put. A poll, or a wait that finds
 * the work done, adds nothing; starting a request and the synchronous
 * control requests (reserve, release, free, pin, a get at a checkpoint or
 * a resume) are not waits for overlapped work and are not counted.
 *
 * Functions return 0 or -1 with a message in err (err may be NULL: no
 * message) that names the service address and, for an unreachable service,
 * how to start ballastd. Handles (oc_handle_t, 0 = none) are cleared when
 * they complete, successfully or not. */
#ifndef BALLAST_OFFLOAD_LINK_H
#define BALLAST_OFFLOAD_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics.h"
#include "workers/backend/backend.h"
#include "workers/offload/client.h"

typedef struct {
    oc_client_t *c;            /* the session; only link.c touches it */
    uint32_t rank;             /* this worker's global rank (the key's rank) */
    const char *addr;          /* what was opened, for messages */
    const char *job;           /* the session's job name */
    uint64_t to_service;       /* bytes written into blobs, since open */
    uint64_t from_service;     /* bytes read from blobs, since open */
    double wait_s;             /* seconds the host blocked for the savers (exposed waits), since open */
    metric_t *m_to, *m_from;   /* ballast_offload_bytes_total series, or NULL */
    metric_t *m_wait;          /* ballast_offload_wait_seconds_total series, or NULL */
} offload_link_t;

/* ---- the session ---- */

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

/* Shared-memory mode (regions lie in the mapped pool); false in remote mode. */
bool offload_link_is_shared(const offload_link_t *l);
/* The largest blob the service takes, bytes. */
uint64_t offload_link_max_blob(const offload_link_t *l);
/* The service's address as the client library names it, for messages. */
const char *offload_link_addr(const offload_link_t *l);
/* The pool segments the session has mapped (shared-memory mode; *n = 0 and
 * NULL in remote mode), valid until close: for pinning them with the
 * backend (host_register). */
const oc_segment_t *offload_link_segments(const offload_link_t *l, uint32_t *n);
/* Call fn for every segment of the job the session maps: those mapped now
 * at once, later ones (ballastd adds segments as the job grows) when they
 * are mapped (oc_set_segment_hook). */
void offload_link_on_segment(offload_link_t *l, oc_segment_hook_t fn, void *arg);

/* Whether the savers may compute on pool memory in place (read a block
 * input there, run AdamW on moments there): only on a backend whose memory
 * is host memory in fp32 (backend_t.host_memory: the CPU backend).
 * Elsewhere they copy through a staging buffer in backend memory. */
bool offload_link_in_place(const backend_t *be);

/* ---- accounting ---- */

/* Account bytes moved to and from the service. */
void offload_link_count(offload_link_t *l, uint64_t to_service, uint64_t from_service);

/* ---- waiting: where exposed waits are counted ---- */

/* Block until request *h completes (b, may be NULL, gets a get's region);
 * the time blocked counts as exposed wait, nothing when it had completed.
 * *h = 0 afterwards; nothing to do when it is 0. 0, or -1 with a message
 * naming what was waited for (what). */
int offload_link_wait(offload_link_t *l, oc_handle_t *h, oc_buf_t *b, const char *what, char *err, size_t errlen);
/* Take request *h's completion if it has arrived, never blocking (counts
 * nothing): 1 done (*h = 0, b filled for a get), 0 still in flight, -1
 * failed (*h = 0, message naming what). 1 when *h is 0. */
int offload_link_poll(offload_link_t *l, oc_handle_t *h, oc_buf_t *b, const char *what, char *err, size_t errlen);
/* End backend copy *x (be_xfer_wait; *x = NULL after): the host blocks as
 * long as the copy still runs, which counts as exposed wait; a copy found
 * done (be_xfer_done) adds nothing. NULL-safe (*x NULL: nothing). */
void offload_link_xfer_wait(offload_link_t *l, const backend_t *be, be_xfer_t **x);

/* ---- blobs ---- */

/* Reserve len bytes under k (persistent or not), b->ptr where to write,
 * replacing a blob left under the same key by an earlier run. 0 or -1. */
int offload_link_put_alloc(offload_link_t *l, const oc_key_t *k, uint64_t len, bool persistent, oc_buf_t *b,
                           char *err, size_t errlen);
/* Publish what was written into b (from put_alloc for k) asynchronously:
 * *h completes when ballastd acknowledged it (offload_link_wait/poll). The
 * caller counts the bytes. 0 or -1 (what: the message's subject). */
int offload_link_put_commit_async(offload_link_t *l, const oc_key_t *k, oc_buf_t *b, oc_handle_t *h,
                                  const char *what, char *err, size_t errlen);
/* Give up a reservation from put_alloc (a cleanup: errors are dropped). */
void offload_link_put_abort(offload_link_t *l, const oc_key_t *k, oc_buf_t *b);
/* Store len bytes under k (persistent or not), replacing a blob left under
 * the same key by an earlier run; counted as sent, the commit's time as
 * exposed wait. 0 or -1. */
int offload_link_put(offload_link_t *l, const oc_key_t *k, const void *data, uint64_t len, bool persistent,
                     char *err, size_t errlen);

/* Request k's bytes asynchronously: *h completes with the region (wait/poll
 * with b). 0 or -1. */
int offload_link_get_async(offload_link_t *l, const oc_key_t *k, oc_handle_t *h, const char *what, char *err,
                           size_t errlen);
/* k's bytes now, b->ptr/len the region (pinned until get_done). 0 or -1. */
int offload_link_get(offload_link_t *l, const oc_key_t *k, oc_buf_t *b, const char *what, char *err, size_t errlen);
/* Hand back a region from get (or a completed get_async). 0 or -1. */
int offload_link_get_done(offload_link_t *l, const oc_key_t *k, oc_buf_t *b, const char *what, char *err,
                          size_t errlen);
/* Copy k's blob into dst (cap bytes), *len its length: 1 copied, 0 no
 * such blob, -1 another failure (a blob larger than cap is one). The
 * caller counts the bytes. */
int offload_link_get_copy(offload_link_t *l, const oc_key_t *k, void *dst, uint64_t cap, uint64_t *len,
                          const char *what, char *err, size_t errlen);
/* Ask ballastd to bring k back from its spill tier into the pool; *h
 * completes when it is there. 0 or -1. */
int offload_link_prefetch_async(offload_link_t *l, const oc_key_t *k, oc_handle_t *h, const char *what, char *err,
                                size_t errlen);

/* Free k; a missing key is not an error. 0 or -1. */
int offload_link_free(offload_link_t *l, const oc_key_t *k, char *err, size_t errlen);
/* Free k asynchronously: *h completes when it is gone. 0 or -1. */
int offload_link_free_async(offload_link_t *l, const oc_key_t *k, oc_handle_t *h, const char *what, char *err,
                            size_t errlen);

/* Keep k in ballastd's RAM (not evicted to its spill tier) until
 * unpinned. 0 or -1. */
int offload_link_pin(offload_link_t *l, const oc_key_t *k, const char *what, char *err, size_t errlen);
/* Drop this session's pin of k, if it holds one (nothing to report). */
void offload_link_unpin(offload_link_t *l, const oc_key_t *k);

#endif
