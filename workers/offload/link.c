/* link.c: a worker rank's ballastd session for the memory savers, with
 * byte and wait accounting; see link.h. Relies on the client library
 * (client.h) for the session, common/clock.h for timing waits and the
 * backend's asynchronous copies (backend.h, be_xfer_*). Every blocking
 * wait of the savers ends in waited(), the one place the exposed-wait
 * counter and metric grow. */
#include "workers/offload/link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "errbuf.h"

/* ---- helpers ---- */

/* A failed call's message: "<what>: <client library message>". Returns -1. */
static int fail(char *err, size_t errlen, const char *what) {
    return errbuf_set(err, errlen, "%s: %s", what, oc_last_error());
}

/* The host blocked for the savers from t0 (clock_now_s) until now: exposed
 * wait, in the counter and the metric. */
static void waited(offload_link_t *l, double t0) {
    double w = clock_now_s() - t0;
    l->wait_s += w;
    if (l->m_wait) metric_add(l->m_wait, w);
}

/* ---- the session ---- */

bool offload_link_in_place(const backend_t *be) { return be->host_memory && be->act_bytes == 4; }

/* The metrics are optional: a registry conflict costs the series, not the run. */
void offload_link_metrics(offload_link_t *l, metrics_registry_t *r) {
    /* the same families and labels as workers/train/progress.c registers; the
     * registry adds rank="N" to every series itself */
    static const char *const L_DIR[] = { "direction" };
    char e[METRICS_ERR_LEN];
    metric_family_t *bytes = metrics_register(r, METRIC_COUNTER, "ballast_offload_bytes_total",
                                              "Bytes copied between this rank and ballastd, by direction "
                                              "(to_service, from_service)", L_DIR, 1, NULL, 0, e, sizeof e);
    metric_family_t *wait = metrics_register(r, METRIC_COUNTER, "ballast_offload_wait_seconds_total",
                                             "Seconds this rank waited on copies to or from ballastd that compute "
                                             "did not hide", NULL, 0, NULL, 0, e, sizeof e);
    l->m_to = metrics_series(bytes, (const char *[]){ "to_service" });
    l->m_from = metrics_series(bytes, (const char *[]){ "from_service" });
    l->m_wait = metrics_series(wait, NULL);
}

int offload_link_open(offload_link_t *l, const char *socket, const char *remote, const char *job,
                      const char *token_file, int rank, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    if (!job_name_ok(job))
        return errbuf_set(err, errlen, "--offload-job '%s': use 1..63 characters of [A-Za-z0-9._-]", job);
    l->rank = (uint32_t)rank;
    l->addr = remote ? remote : socket;
    l->job = job;
    char name[64];
    snprintf(name, sizeof name, "ballast-worker rank %d", rank);
    oc_options_t o = { .addr = l->addr, .job = job, .rank = (uint32_t)rank, .client_name = name,
                       .token_file = token_file && *token_file ? token_file : NULL };
    status_t st = oc_open(&o, &l->c);
    if (st != STATUS_OK) {
        l->c = NULL;
        return errbuf_set(err, errlen, "offload needs ballastd (--%s %s): %s%s", remote ? "offload-remote" : "offload-socket",
                          l->addr, oc_last_error(),
                          st == STATUS_UNAUTHENTICATED ? " (the worker reads it from --offload-token-file FILE)" : "");
    }
    offload_link_metrics(l, metrics_default());
    return 0;
}

void offload_link_close(offload_link_t *l) {
    if (!l || !l->c) return;
    oc_close(l->c, false);
    l->c = NULL;
}

bool offload_link_is_shared(const offload_link_t *l) { return oc_is_shared(l->c); }

uint64_t offload_link_max_blob(const offload_link_t *l) { return oc_max_blob(l->c); }

const char *offload_link_addr(const offload_link_t *l) { return oc_addr(l->c); }

const oc_segment_t *offload_link_segments(const offload_link_t *l, uint32_t *n) { return oc_segments(l->c, n); }

void offload_link_on_segment(offload_link_t *l, oc_segment_hook_t fn, void *arg) { oc_set_segment_hook(l->c, fn, arg); }

/* ---- accounting ---- */

void offload_link_count(offload_link_t *l, uint64_t to, uint64_t from) {
    l->to_service += to;
    l->from_service += from;
    if (to && l->m_to) metric_add_u64(l->m_to, to);
    if (from && l->m_from) metric_add_u64(l->m_from, from);
}

/* ---- waiting ---- */

int offload_link_poll(offload_link_t *l, oc_handle_t *h, oc_buf_t *b, const char *what, char *err, size_t errlen) {
    if (!*h) return 1;
    status_t st = oc_wait(l->c, *h, b, 0);
    if (st == STATUS_DEADLINE_EXCEEDED) return 0;
    *h = 0;
    return st == STATUS_OK ? 1 : fail(err, errlen, what);
}

int offload_link_wait(offload_link_t *l, oc_handle_t *h, oc_buf_t *b, const char *what, char *err, size_t errlen) {
    if (!*h) return 0;
    /* a completion already there is taken without counting */
    int r = offload_link_poll(l, h, b, what, err, errlen);
    if (r) return r < 0 ? -1 : 0;
    double t0 = clock_now_s();
    status_t st = oc_wait(l->c, *h, b, -1);
    waited(l, t0);
    *h = 0;
    return st == STATUS_OK ? 0 : fail(err, errlen, what);
}

void offload_link_xfer_wait(offload_link_t *l, const backend_t *be, be_xfer_t **x) {
    if (!*x) return;
    if (be_xfer_done(be, *x)) {
        be_xfer_wait(be, *x);   /* ends the handle; nothing to wait for */
    } else {
        double t0 = clock_now_s();
        be_xfer_wait(be, *x);
        waited(l, t0);
    }
    *x = NULL;
}

/* ---- blobs ---- */

int offload_link_put_alloc(offload_link_t *l, const oc_key_t *k, uint64_t len, bool persistent, oc_buf_t *b,
                           char *err, size_t errlen) {
    status_t st = oc_put_alloc(l->c, k, len, persistent, b);
    if (st == STATUS_ALREADY_EXISTS) {
        /* left by an earlier run of this job (or a step that never finished) */
        if (oc_free(l->c, k) != STATUS_OK) return fail(err, errlen, "freeing a stale blob");
        st = oc_put_alloc(l->c, k, len, persistent, b);
    }
    return st == STATUS_OK ? 0 : fail(err, errlen, "reserving a blob in ballastd");
}

int offload_link_put_commit_async(offload_link_t *l, const oc_key_t *k, oc_buf_t *b, oc_handle_t *h,
                                  const char *what, char *err, size_t errlen) {
    return oc_put_commit_async(l->c, k, b, h) == STATUS_OK ? 0 : fail(err, errlen, what);
}

void offload_link_put_abort(offload_link_t *l, const oc_key_t *k, oc_buf_t *b) { oc_put_abort(l->c, k, b); }

int offload_link_put(offload_link_t *l, const oc_key_t *k, const void *data, uint64_t len, bool persistent,
                     char *err, size_t errlen) {
    oc_buf_t b;
    if (offload_link_put_alloc(l, k, len, persistent, &b, err, errlen)) return -1;
    memcpy(b.ptr, data, len);
    double t0 = clock_now_s();
    status_t st = oc_put_commit(l->c, k, &b);
    if (st == STATUS_ALREADY_EXISTS && oc_free(l->c, k) == STATUS_OK) /* remote mode: the put happens at commit */
        st = oc_put_copy(l->c, k, data, len, persistent);
    waited(l, t0);
    if (st != STATUS_OK) return fail(err, errlen, "storing a blob in ballastd");
    offload_link_count(l, len, 0);
    return 0;
}

int offload_link_get_async(offload_link_t *l, const oc_key_t *k, oc_handle_t *h, const char *what, char *err,
                           size_t errlen) {
    return oc_get_async(l->c, k, h) == STATUS_OK ? 0 : fail(err, errlen, what);
}

int offload_link_get(offload_link_t *l, const oc_key_t *k, oc_buf_t *b, const char *what, char *err, size_t errlen) {
    return oc_get(l->c, k, b) == STATUS_OK ? 0 : fail(err, errlen, what);
}

int offload_link_get_done(offload_link_t *l, const oc_key_t *k, oc_buf_t *b, const char *what, char *err,
                          size_t errlen) {
    return oc_get_done(l->c, k, b) == STATUS_OK ? 0 : fail(err, errlen, what);
}

int offload_link_get_copy(offload_link_t *l, const oc_key_t *k, void *dst, uint64_t cap, uint64_t *len,
                          const char *what, char *err, size_t errlen) {
    status_t st = oc_get_copy(l->c, k, dst, cap, len);
    if (st == STATUS_NOT_FOUND) return 0;
    return st == STATUS_OK ? 1 : fail(err, errlen, what);
}

int offload_link_prefetch_async(offload_link_t *l, const oc_key_t *k, oc_handle_t *h, const char *what, char *err,
                                size_t errlen) {
    return oc_prefetch_async(l->c, k, h) == STATUS_OK ? 0 : fail(err, errlen, what);
}

int offload_link_free(offload_link_t *l, const oc_key_t *k, char *err, size_t errlen) {
    status_t st = oc_free(l->c, k);
    return st == STATUS_OK || st == STATUS_NOT_FOUND ? 0 : fail(err, errlen, "freeing a blob in ballastd");
}

int offload_link_free_async(offload_link_t *l, const oc_key_t *k, oc_handle_t *h, const char *what, char *err,
                            size_t errlen) {
    return oc_free_async(l->c, k, h) == STATUS_OK ? 0 : fail(err, errlen, what);
}

int offload_link_pin(offload_link_t *l, const oc_key_t *k, const char *what, char *err, size_t errlen) {
    return oc_pin(l->c, k) == STATUS_OK ? 0 : fail(err, errlen, what);
}

void offload_link_unpin(offload_link_t *l, const oc_key_t *k) { oc_unpin(l->c, k); }
