/* svc_allocator.h: ballastd's own heap as the Stats RPC reports it
 * (StatsResponse.allocator, proto/offload.proto): jemalloc's figures from
 * common/jemalloc_stats.h, for `ballast status`. */
#ifndef BALLAST_SVC_ALLOCATOR_H
#define BALLAST_SVC_ALLOCATOR_H

#include "offload.pb-c.h"
#include "rpc.h"

/* The allocator message for this call, in ctx's memory (freed with the
 * call); NULL only when out of memory (the field is then left out). Reads
 * jemalloc's statistics fresh; safe from any handler thread. */
Ballast__Offload__V1__AllocatorStats *svc_allocator_stats(rpc_ctx_t *ctx);

#endif
