/*
 * data.h - token shards (llm.c format, v1 uint16 / v2 uint32) and the
 * batch loader used by the training loop, plus the synthetic corpus.
 *
 * A data_t is one or more shards opened read-only with mmap and treated as
 * one token stream (shards concatenated in sorted glob order). Batches are a
 * pure function of (order, seed, step, micro, accum, rank, dp, B, T): there
 * is no cursor, so a resumed run reads exactly the batches an uninterrupted
 * run would. The exact formulas are in docs/data.md.
 */
#ifndef BALLAST_DATA_H
#define BALLAST_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DATA_MAGIC 20240520          /* header[0] */
#define DATA_HEADER_INTS 256         /* header size in int32 */
#define DATA_HEADER_BYTES (DATA_HEADER_INTS * 4)

typedef struct data data_t;                 /* one or more shards, read-only mmap */
typedef enum { DATA_SEQUENTIAL = 0, DATA_SHUFFLED = 1 } data_order_t;

/* Open a file or a glob of llm.c-format shards (v1 uint16, v2 uint32).
 * Validates every header (magic 20240520, version, token count vs file
 * size) and every token id < vocab (vocab <= 0 skips that check).
 * Errors name the file and the problem. */
int data_open(const char *file_or_glob, int vocab, data_t **out, char *err, size_t errlen);
int64_t data_num_tokens(const data_t *d);
/* Token at global stream position i (0 <= i < data_num_tokens). */
uint32_t data_token(const data_t *d, int64_t i);
/* Number of shards and the i-th shard's path / version / token count. */
int data_num_shards(const data_t *d);
const char *data_shard_path(const data_t *d, int i);
int data_shard_version(const data_t *d, int i);
int64_t data_shard_tokens(const data_t *d, int i);
/* Fill inputs[B*T] and targets[B*T] (targets = inputs shifted by one) for
 * optimizer step `step`, micro-step `micro` of `accum`, data-parallel rank
 * `rank` of `dp`. A pure function of its arguments (no hidden cursor), so
 * resume is exact. SEQUENTIAL: row start token ((step*accum+micro)*dp+rank)*B*T
 * + b*T, wrapping at the end. SHUFFLED: the same sample index mapped
 * through a seeded permutation of the T+1-token windows, reshuffled per epoch. */
int data_batch(const data_t *d, data_order_t order, uint64_t seed,
               int64_t step, int micro, int accum, int rank, int dp,
               int B, int T, int32_t *inputs, int32_t *targets,
               char *err, size_t errlen);
void data_close(data_t *d);
/* Parse "sequential" / "shuffled"; returns 0 or -1. */
int data_order_parse(const char *s, data_order_t *out);
/* The shuffled permutation: window index for sample idx given n_windows
 * (exposed for tests). epoch = idx / n_windows; bijection on [0, n_windows)
 * keyed by (seed, epoch). */
int64_t data_shuffle_window(uint64_t seed, int64_t idx, int64_t n_windows);
/* Write a shard: version 1 (uint16) when max token < 65536 unless force_u32. */
int data_write_shard(const char *path, const uint32_t *tokens, int64_t n, bool force_u32, char *err, size_t errlen);
/* The synthetic corpus generator; returns its exact per-token entropy in nats. */
int data_synth(const char *path, int64_t n_tokens, int vocab, uint64_t seed, double *entropy_nats, char *err, size_t errlen);
/* Same, with an explicit branching factor K (successors per state). */
#define DATA_SYNTH_DEFAULT_BRANCHING 4
int data_synth_k(const char *path, int64_t n_tokens, int vocab, uint64_t seed, int branching,
                 double *entropy_nats, char *err, size_t errlen);
/* The chain's exact entropy rate and the entropy of its stationary
 * (unigram) distribution, both in nats, without writing a corpus. */
int data_synth_entropy(int vocab, uint64_t seed, int branching, double *entropy_nats,
                       double *stationary_entropy_nats, char *err, size_t errlen);

#endif
