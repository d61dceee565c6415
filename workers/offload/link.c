/* offload_link.c: a worker rank's ballastd session with byte and wait
 * accounting; see offload_link.h. */
#include "workers/offload/link.h"
#include "clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errbuf.h"
#include "workers/backend/backend.h"

bool offload_link_in_place(const backend_t *be) { return be->host_memory && be->act_bytes == 4; }

int offload_link_fail(char *err, size_t errlen, const char *what) {
    return errbuf_set(err, errlen, "%s: %s", what, oc_last_error());
}

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

void offload_link_count(offload_link_t *l, uint64_t to, uint64_t from) {
    l->to_service += to;
    l->from_service += from;
    if (to && l->m_to) metric_add_u64(l->m_to, to);
    if (from && l->m_from) metric_add_u64(l->m_from, from);
}

int offload_link_wait(offload_link_t *l, oc_handle_t h, oc_buf_t *b, const char *what, char *err, size_t errlen) {
    double t = clock_now_s();
    status_t st = oc_wait(l->c, h, b, -1);
    double w = clock_now_s() - t;
    l->wait_s += w;
    if (l->m_wait) metric_add(l->m_wait, w);
    return st == STATUS_OK ? 0 : offload_link_fail(err, errlen, what);
}

int offload_link_put_alloc(offload_link_t *l, const oc_key_t *k, uint64_t len, bool persistent, oc_buf_t *b,
                           char *err, size_t errlen) {
    status_t st = oc_put_alloc(l->c, k, len, persistent, b);
    if (st == STATUS_ALREADY_EXISTS) {
        /* left by an earlier run of this job (or a step that never finished) */
        if (oc_free(l->c, k) != STATUS_OK) return offload_link_fail(err, errlen, "freeing a stale blob");
        st = oc_put_alloc(l->c, k, len, persistent, b);
    }
    return st == STATUS_OK ? 0 : offload_link_fail(err, errlen, "reserving a blob in ballastd");
}

int offload_link_put(offload_link_t *l, const oc_key_t *k, const void *data, uint64_t len, bool persistent,
                     char *err, size_t errlen) {
    oc_buf_t b;
    if (offload_link_put_alloc(l, k, len, persistent, &b, err, errlen)) return -1;
    memcpy(b.ptr, data, len);
    double t = clock_now_s();
    status_t st = oc_put_commit(l->c, k, &b);
    if (st == STATUS_ALREADY_EXISTS && oc_free(l->c, k) == STATUS_OK) /* remote mode: the put happens at commit */
        st = oc_put_copy(l->c, k, data, len, persistent);
    double w = clock_now_s() - t;
    l->wait_s += w;
    if (l->m_wait) metric_add(l->m_wait, w);
    if (st != STATUS_OK) return offload_link_fail(err, errlen, "storing a blob in ballastd");
    offload_link_count(l, len, 0);
    return 0;
}

int offload_link_free(offload_link_t *l, const oc_key_t *k, char *err, size_t errlen) {
    status_t st = oc_free(l->c, k);
    return st == STATUS_OK || st == STATUS_NOT_FOUND ? 0 : offload_link_fail(err, errlen, "freeing a blob in ballastd");
}
