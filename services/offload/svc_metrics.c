/* svc_metrics.c: ballastd's metric families and the collector that mirrors
 * a svc_metrics_sample_t into them at scrape time (svc_metrics.h). */
#include "services/offload/svc_metrics.h"

#include <stdio.h>
#include <stdlib.h>

struct svc_metrics {
    metrics_registry_t *reg;
    svc_metrics_read_fn read;
    void *arg;
    metric_t *pool_used, *pool_capacity, *pool_segments, *pool_huge, *spill_used, *blobs, *sessions; /* gauges */
    metric_family_t *offload;    /* ballast_offload_bytes_total{direction} */
    metric_t *to_host, *to_device, *spill_write, *spill_read, *evictions, *ahead, *crc_errors, *quota; /* counters */
};

static void collect(void *p) {
    svc_metrics_t *m = p;
    svc_metrics_sample_t s = { 0 };
    m->read(m->arg, &s);
    metric_set(m->pool_used, (double)s.pool_used_bytes);
    metric_set(m->pool_capacity, (double)s.pool_capacity_bytes);
    metric_set(m->pool_segments, (double)s.pool_segment_bytes);
    metric_set(m->pool_huge, (double)s.pool_huge_bytes);
    metric_set(m->spill_used, (double)s.spill_used_bytes);
    metric_set(m->blobs, (double)s.blobs);
    metric_set(m->sessions, (double)s.sessions);
    metric_set_total(m->to_host, s.put_bytes);
    metric_set_total(m->to_device, s.get_bytes);
    metric_set_total(m->spill_write, s.spill_write_bytes);
    metric_set_total(m->spill_read, s.spill_read_bytes);
    metric_set_total(m->evictions, s.evictions);
    metric_set_total(m->ahead, s.ahead_writes);
    metric_set_total(m->crc_errors, s.crc_errors);
    metric_set_total(m->quota, s.quota_refusals);
}

svc_metrics_t *svc_metrics_init(metrics_registry_t *r, svc_metrics_read_fn read, void *arg, char *err,
                                size_t errlen) {
    if (!r || !read) { snprintf(err, errlen, "svc_metrics_init: no registry or no read function"); return NULL; }
    svc_metrics_t *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, errlen, "out of memory"); return NULL; }
    m->reg = r;
    m->read = read;
    m->arg = arg;
#define GAUGE(f, name, help) if (!(m->f = metrics_gauge(r, name, help, err, errlen))) goto fail
#define COUNTER(f, name, help) if (!(m->f = metrics_counter(r, name, help, err, errlen))) goto fail
    GAUGE(pool_used, "ballast_pool_used_bytes", "Pinned host pool bytes holding blobs");
    GAUGE(pool_capacity, "ballast_pool_capacity_bytes", "Size of the pinned host pool");
    GAUGE(pool_segments, "ballast_pool_segment_bytes", "Bytes of the pool in segments assigned to jobs");
    GAUGE(pool_huge, "ballast_pool_huge_page_bytes",
          "Bytes of the pool's segments on 2 MiB pages, reserved (--huge-pages 2M) or transparent (thp)");
    GAUGE(spill_used, "ballast_spill_used_bytes", "NVMe spill tier space in use");
    GAUGE(blobs, "ballast_blobs", "Blobs held (in the pool, on NVMe or both)");
    GAUGE(sessions, "ballast_sessions", "Open client sessions");
    COUNTER(spill_write, "ballast_spill_bytes_total", "Bytes written from the pool to the NVMe tier");
    COUNTER(spill_read, "ballast_spill_read_bytes_total", "Bytes read back from the NVMe tier");
    COUNTER(evictions, "ballast_evictions_total", "Blobs dropped from the pool to make room (a copy stays on NVMe)");
    COUNTER(ahead, "ballast_spill_ahead_writes_total",
            "Blobs written to NVMe ahead of need while the pool was short of space (they stay in the pool until room is needed)");
    COUNTER(crc_errors, "ballast_crc_errors_total", "Read-backs whose crc32c did not match (reported to the client as lost)");
    COUNTER(quota, "ballast_quota_refusals_total", "Requests refused because a session was over its quota");
#undef GAUGE
#undef COUNTER
    metric_family_t *off = m->offload = metrics_register(r, METRIC_COUNTER, "ballast_offload_bytes_total",
                                            "Bytes of blobs clients put into (to_host) and got back from (to_device) ballastd",
                                            (const char *[]){ "direction" }, 1, NULL, 0, err, errlen);
    if (!off) goto fail;
    /* Both series exist from the start (at 0), so a rate() over them works
     * from the first scrape. */
    m->to_host = metrics_series(off, (const char *[]){ "to_host" });
    m->to_device = metrics_series(off, (const char *[]){ "to_device" });
    if (!m->to_host || !m->to_device) {
        snprintf(err, errlen, "out of memory creating the ballast_offload_bytes_total series");
        goto fail;
    }
    if (metrics_add_collector(r, collect, m) != 0) {
        snprintf(err, errlen, "too many collectors on this metrics registry");
        goto fail;
    }
    return m;
fail:
    free(m);
    return NULL;
}

void svc_metrics_free(svc_metrics_t *m) {
    if (!m) return;
    metrics_remove_collector(m->reg, collect, m);
    free(m);
}
