/* svc_metrics.h: ballastd's Prometheus metrics (docs/observability.md).
 *
 * The names, types and help texts of the service's metrics live here, in
 * one place. ballastd does not touch them on its hot paths: at every scrape
 * a collector asks the service for a sample of its running figures (the
 * store and session manager already keep them) and mirrors it, gauges as
 * they are and totals as counters that never go down. */
#ifndef BALLAST_SVC_METRICS_H
#define BALLAST_SVC_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

/* The service's figures at one moment. Totals count since ballastd started. */
typedef struct {
    uint64_t pool_used_bytes;     /* pinned pool bytes holding blobs */
    uint64_t pool_capacity_bytes; /* pool size */
    uint64_t pool_segment_bytes;  /* pool bytes in segments assigned to jobs */
    uint64_t pool_huge_bytes;     /* of those, bytes on 2 MiB pages (reserved or transparent) */
    uint64_t spill_used_bytes;    /* NVMe tier space in use */
    uint64_t blobs;               /* blobs in the index */
    uint64_t sessions;            /* open client sessions */
    uint64_t put_bytes;           /* total bytes of committed puts (into the service, "to_host") */
    uint64_t get_bytes;           /* total bytes of blobs handed back by gets ("to_device") */
    uint64_t spill_write_bytes;   /* total bytes written to NVMe */
    uint64_t spill_read_bytes;    /* total bytes read back from NVMe */
    uint64_t evictions;           /* total blobs dropped from the pool to make room */
    uint64_t ahead_writes;        /* total blobs written to NVMe ahead of need, kept in the pool */
    uint64_t crc_errors;          /* total read-backs whose crc32c did not match */
    uint64_t quota_refusals;      /* total requests refused for quota (RESOURCE_EXHAUSTED) */
} svc_metrics_sample_t;

/* Fills *out; called on the metrics server's thread, so it must be safe
 * against the service's own threads (store_stats() and sess_counters() are). */
typedef void (*svc_metrics_read_fn)(void *arg, svc_metrics_sample_t *out);

typedef struct svc_metrics svc_metrics_t;

/* Register the service's families in r (metrics_default() for ballastd) and
 * refresh them from read(arg) before every render. Returns the handle, or
 * NULL with err. svc_metrics_free() unhooks the collector (waiting for a
 * scrape in progress), so arg may be freed after it. */
svc_metrics_t *svc_metrics_init(metrics_registry_t *r, svc_metrics_read_fn read, void *arg, char *err,
                                size_t errlen);
void svc_metrics_free(svc_metrics_t *m);

#endif
