/* spill.c: the spill tier the launcher's ballastd gets (spill.h).
 *
 * The shard follows workers/parallel/fsdp.c: L block units and one rest
 * unit (embedding, final norm, untied output), each unit's tensor-parallel
 * slice cut into S chunks of ceil(numel / S) floats. Tensor parallelism
 * splits every matrix T ways (the vocabulary-parallel embedding and output
 * included) and keeps the RMSNorm weights whole. */
#include <string.h>

#include "workers/cli/spill.h"

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

void spill_plan(const spill_run_t *r, spill_plan_t *p) {
    memset(p, 0, sizeof *p);
    const llama_config_t *c = r->cfg;
    uint64_t S = r->S > 0 ? (uint64_t)r->S : 1, T = r->T > 0 ? (uint64_t)r->T : 1, C = r->C > 0 ? (uint64_t)r->C : 1;
    uint64_t P = r->local_ranks > 0 ? (uint64_t)r->local_ranks : 1, D = (uint64_t)c->dim, L = (uint64_t)c->n_layers;
    /* one rank's slice of each unit: matrices / T, norms whole */
    uint64_t block_norms = 2 * D, block = (uint64_t)llama_block_params(c);
    uint64_t block_tp = (block - block_norms) / T + block_norms;
    uint64_t rest_tp = ceil_div((uint64_t)llama_embedding_params(c), T) + D;
    uint64_t block_chunk = ceil_div(block_tp, S), rest_chunk = ceil_div(rest_tp, S);
    p->shard_floats = L * block_chunk + rest_chunk;
    uint64_t blob = 12 * (block_chunk > rest_chunk ? block_chunk : rest_chunk);
    if (r->opt_offload) {
        p->opt = P * (r->durable ? 2 : 1) * 12 * p->shard_floats;
        p->largest_blob = blob;
        p->records = P * (64u << 10);
    }
    if (r->act_offload) {
        uint64_t one = (uint64_t)r->micro_batch * ceil_div((uint64_t)r->seq_len, C) * D * (uint64_t)r->act_bytes;
        p->act = P * (L + 1) * one;
        if (one > p->largest_blob) p->largest_blob = one;
    }
    p->need = p->opt + p->act + p->records;
    /* a quarter of the state per file, at most 1G, at least the largest blob (1M granules) */
    uint64_t file = p->need / 4 < (1ull << 30) ? p->need / 4 : (1ull << 30);
    if (file < p->largest_blob) file = p->largest_blob;
    file = ceil_div(file < (1u << 20) ? (1u << 20) : file, 1u << 20) << 20;
    p->file_bytes = file;
    uint64_t want = p->need + p->need / SPILL_HEADROOM_DIV + file;
    if (want < SPILL_MIN_BYTES) want = SPILL_MIN_BYTES;
    p->spill_bytes = ceil_div(want, file) * file;
}
