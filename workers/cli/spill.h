/* spill.h: the size of the spill tier the launcher's ballastd gets, from
 * what one node's ranks of this run may write there (docs/offload.md,
 * "Durability"): the optimizer state of every local rank (exp_avg,
 * exp_avg_sq and the fp32 master: 12 bytes per float of the rank's shard,
 * one version, or two when durable: every version is written through while
 * the last one stays), the offloaded activation blobs (one block input per
 * layer and micro-step, spilled when the pool is full) and the step
 * records; plus headroom for the extent allocator. */
#ifndef BALLAST_CLI_SPILL_H
#define BALLAST_CLI_SPILL_H

#include <stdbool.h>
#include <stdint.h>

#include "workers/model/config.h"

typedef struct {
    const llama_config_t *cfg;
    int local_ranks;        /* ranks on this node: they share its ballastd */
    int S, T, C;            /* hybrid shard, tensor-parallel, context-parallel degrees (S resolved, >= 1) */
    int micro_batch;        /* B rows per micro-step */
    int seq_len;            /* tokens per row */
    int act_bytes;          /* bytes of one activation element: 4 (cpu), 2 (cuda, bf16) */
    bool act_offload;       /* --activation-offload */
    bool opt_offload;       /* --optimizer-offload host|nvme */
    bool durable;           /* optimizer state durable: two versions on the spill tier */
} spill_run_t;

typedef struct {            /* bytes, for the whole node */
    uint64_t shard_floats;  /* floats of one rank's optimizer shard (sum over units of ceil(numel / S)) */
    uint64_t opt;           /* optimizer state: local ranks x versions x 12 x shard_floats */
    uint64_t act;           /* activation blobs: local ranks x (L + 1) x B x seq/C x D x act_bytes */
    uint64_t records;       /* step records and small blobs */
    uint64_t largest_blob;  /* the largest single blob (a unit's 12 x chunk, or one block input) */
    uint64_t need;          /* opt + act + records */
    uint64_t file_bytes;    /* one spill file: a blob never spans two */
    uint64_t spill_bytes;   /* the capacity: need + a quarter + one file, rounded up to whole files */
} spill_plan_t;

#define SPILL_HEADROOM_DIV 4          /* need / 4 more: freed versions leave holes between live ones */
#define SPILL_MIN_BYTES (4ull << 20)  /* never below this (ballastd takes 1M) */

/* Fill p for run r. Pure arithmetic; never fails. */
void spill_plan(const spill_run_t *r, spill_plan_t *p);

#endif
