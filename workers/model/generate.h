/* generate.h: KV-cached decoding of a Llama model, and token sampling.
 *
 * A gen_t holds, for every block, the keys and values (after RoPE) of the
 * tokens seen so far, so each new token costs one row through the model:
 * its query attends to the cache. Feeding n tokens at once (the prompt) runs
 * them as n rows, row i attending to cache positions 0..pos+i. The ops are
 * the backend's (matmul, RMSNorm, RoPE at a start position, SwiGLU, and
 * attention_decode over the cache), so any backend runs it: the CPU's fp32
 * gives model_forward's numbers up to float rounding, the CUDA backend's
 * bf16 its own (cache and activations in bf16, fp32 accumulation). */
#ifndef BALLAST_GENERATE_H
#define BALLAST_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/model/model.h"

typedef struct {
    model_t *m;        /* parameters (full layout, m->params), tp.size 1 */
    int cap;           /* P: positions the cache holds */
    int pos;           /* tokens in the cache */
    int rows;          /* largest n one gen_feed takes */
    act_t *kc, *vc;    /* (L, P, Hkv*Dh) each, backend memory */
    act_t *x, *xn, *q, *k, *v, *ao, *tmp, *gate, *up, *h; /* (rows, D|H*Dh|Hkv*Dh|F) scratch */
    act_t *logits;     /* (V) the last row's */
    float *rstd;       /* (rows) */
    int32_t *tok;      /* (rows) backend copy of the tokens */
} gen_t;

/* A decoder over model m (whose parameters are set) for up to cap
 * positions and up to rows tokens per gen_feed. 0, or -1 with a message
 * (a backend without attention_decode, cap over max_position_embeddings,
 * out of memory). */
int gen_create(gen_t *g, model_t *m, int cap, int rows, char *err, size_t errlen);
void gen_destroy(gen_t *g);

/* Run n tokens (0 < n <= rows, each < V) at positions pos..pos+n-1, append
 * their keys and values to the cache, and write the logits of the last one
 * to logits_host (V floats). 0, or -1 with a message when the cache is
 * full. */
int gen_feed(gen_t *g, const int32_t *tokens, int n, float *logits_host, char *err, size_t errlen);

/* How the next token is drawn from the logits. */
typedef struct {
    double temperature;  /* 0: greedy (the first largest logit) */
    int top_k;           /* keep the k largest logits (0: all) */
    double top_p;        /* then the smallest set whose probability reaches p (1: all) */
} gen_sampling_t;

/* The next token: greedy when temperature is 0, else softmax(logits / T)
 * over the top-k, then the top-p nucleus (always at least the largest),
 * renormalised, drawn with one uniform from *rng (a 64-bit state advanced
 * by splitmix64). Ties rank the lower id first, so top_k 1 is greedy. */
int32_t gen_sample(const float *logits, int V, const gen_sampling_t *s, uint64_t *rng);

#endif
