/*
 * tokenizer_bpe.h - the pieces of BPE that do not depend on how a
 * tokenizer.json is laid out: a string -> id map (the vocabulary), the merge
 * table ((left id, right id) -> rank and merged id), the merge loop over one
 * word (a rank-ordered priority queue over a linked list of symbols, as
 * Hugging Face tokenizers does), and a word cache. tokenizer.c builds them
 * from tokenizer.json and owns the per-thread scratch.
 */
#ifndef BALLAST_TOKENIZER_BPE_H
#define BALLAST_TOKENIZER_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

uint64_t bpe_hash(const void *p, size_t n);

/* ---- string -> uint32 map (open addressing; keys are not copied) ---- */
typedef struct {
    const char *s;  /* NULL: empty slot */
    uint32_t len;   /* bytes */
    uint32_t val;
    uint64_t hash;
} strmap_ent_t;
typedef struct {
    strmap_ent_t *e;
    size_t mask;    /* capacity - 1 (a power of two) */
    size_t n;       /* entries */
} strmap_t;

/* 0, or -1 when out of memory. */
int strmap_init(strmap_t *m, size_t expected);
/* Inserts or overwrites; s must outlive the map. 0, or -1 when out of memory. */
int strmap_put(strmap_t *m, const char *s, size_t len, uint32_t val);
/* The value, or -1 when absent. */
int64_t strmap_get(const strmap_t *m, const char *s, size_t len);
void strmap_free(strmap_t *m);

/* ---- merge table ---- */
typedef struct {
    uint64_t *key;  /* (left << 32 | right) + 1; 0: empty slot */
    uint32_t *rank; /* position in the merges list */
    uint32_t *out;  /* id of the merged token */
    size_t mask;
    size_t n;
} bpe_merges_t;

int bpe_merges_init(bpe_merges_t *m, size_t expected);
/* 0; 1 when the pair is already present (the first rank is kept); -1 out of memory. */
int bpe_merges_put(bpe_merges_t *m, uint32_t left, uint32_t right, uint32_t rank, uint32_t out);
bool bpe_merges_get(const bpe_merges_t *m, uint32_t left, uint32_t right, uint32_t *rank, uint32_t *out);
void bpe_merges_free(bpe_merges_t *m);

/* ---- the merge loop ---- */
typedef struct {
    uint32_t rank, pos, out;
} bpe_cand_t;
typedef struct {
    int32_t *prev, *next;  /* (n) linked list over symbol slots; -1 ends */
    bpe_cand_t *heap;      /* candidate merges, min-heap on (rank, pos) */
    size_t cap, heap_cap;
} bpe_scratch_t;

/* Merges syms[0..n) in place, lowest rank first (ties: leftmost), until no
 * adjacent pair has a merge; returns the new symbol count, or (size_t)-1
 * when out of memory. */
size_t bpe_merge_word(const bpe_merges_t *m, uint32_t *syms, size_t n, bpe_scratch_t *s);
void bpe_scratch_free(bpe_scratch_t *s);

/* ---- word cache: bytes -> ids, cleared whole when full ---- */
typedef struct {
    uint64_t *hash;        /* (slots) 0: empty */
    uint32_t *koff, *klen; /* key bytes in keys[] */
    uint32_t *voff, *vlen; /* ids in vals[] */
    size_t mask, n, max_n;
    char *keys; size_t keys_len, keys_cap;
    uint32_t *vals; size_t vals_len, vals_cap;
} bpe_cache_t;

int bpe_cache_init(bpe_cache_t *c, size_t max_entries);
/* The cached ids of word (count in *n), or NULL. Valid until the next put. */
const uint32_t *bpe_cache_get(const bpe_cache_t *c, const char *w, size_t wlen, uint64_t h, size_t *n);
/* Best effort: a failed allocation only leaves the word uncached. */
void bpe_cache_put(bpe_cache_t *c, const char *w, size_t wlen, uint64_t h, const uint32_t *ids, size_t n);
void bpe_cache_free(bpe_cache_t *c);

#endif
