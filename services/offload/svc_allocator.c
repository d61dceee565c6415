/* svc_allocator.c: StatsResponse.allocator from jemalloc's figures (see
 * svc_allocator.h). Everything it returns lives in ctx's memory. */
#include "services/offload/svc_allocator.h"

#include <stdio.h>
#include <string.h>

#include "jemalloc_stats.h"

Ballast__Offload__V1__AllocatorStats *svc_allocator_stats(rpc_ctx_t *ctx) {
    Ballast__Offload__V1__AllocatorStats *a = rpc_ctx_alloc(ctx, sizeof *a);
    char *name = rpc_ctx_alloc(ctx, 96), *why = rpc_ctx_alloc(ctx, JEMALLOC_STATS_ERR_LEN);
    if (!a || !name || !why) return NULL;
    ballast__offload__v1__allocator_stats__init(a);
    const char *v = jemalloc_stats_version();
    snprintf(name, 96, "%s%s", v ? "jemalloc " : "", v ? v : "");
    why[0] = 0;
    a->name = name;
    a->is_malloc = jemalloc_stats_is_malloc(why, JEMALLOC_STATS_ERR_LEN);
    jemalloc_stats_t s;
    char rerr[JEMALLOC_STATS_ERR_LEN];
    if (jemalloc_stats_read(&s, rerr, sizeof rerr) == 0) {
        a->allocated_bytes = s.allocated;
        a->active_bytes = s.active;
        a->resident_bytes = s.resident;
        a->mapped_bytes = s.mapped;
        a->retained_bytes = s.retained;
        a->metadata_bytes = s.metadata;
    } else if (!why[0]) {
        snprintf(why, JEMALLOC_STATS_ERR_LEN, "%s", rerr);
    }
    a->why_not = why;
    return a;
}
