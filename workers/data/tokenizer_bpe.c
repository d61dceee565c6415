/*
 * tokenizer_bpe.c - vocabulary map, merge table, merge loop and word cache
 * of the BPE tokenizers (tokenizer_bpe.h). No knowledge of tokenizer.json.
 */
#include <stdlib.h>
#include <string.h>

#include "workers/data/tokenizer_bpe.h"

/* ---- hashing ---- */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* 64-bit hash of n bytes; never 0 (0 marks an empty cache slot). */
uint64_t bpe_hash(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = mix64(h ^ w) * 0x9fb21c651e98df25ULL;
        b += 8; n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)b[i] << (8 * i);
    h = mix64(h ^ w ^ 0x5555);
    return h ? h : 1;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- string map ---- */

int strmap_init(strmap_t *m, size_t expected) {
    size_t cap = pow2_at_least(expected * 2 + 1);
    m->e = calloc(cap, sizeof *m->e);
    m->mask = cap - 1;
    m->n = 0;
    return m->e ? 0 : -1;
}

static int strmap_grow(strmap_t *m) {
    size_t cap = (m->mask + 1) * 2;
    strmap_ent_t *e = calloc(cap, sizeof *e);
    if (!e) return -1;
    for (size_t i = 0; i <= m->mask; i++) {
        if (!m->e[i].s) continue;
        size_t j = m->e[i].hash & (cap - 1);
        while (e[j].s) j = (j + 1) & (cap - 1);
        e[j] = m->e[i];
    }
    free(m->e);
    m->e = e;
    m->mask = cap - 1;
    return 0;
}

int strmap_put(strmap_t *m, const char *s, size_t len, uint32_t val) {
    if ((m->n + 1) * 2 > m->mask + 1 && strmap_grow(m) != 0) return -1;
    uint64_t h = bpe_hash(s, len);
    size_t j = h & m->mask;
    while (m->e[j].s) {
        if (m->e[j].hash == h && m->e[j].len == len && memcmp(m->e[j].s, s, len) == 0) {
            m->e[j].val = val;
            return 0;
        }
        j = (j + 1) & m->mask;
    }
    m->e[j] = (strmap_ent_t){ s, (uint32_t)len, val, h };
    m->n++;
    return 0;
}

int64_t strmap_get(const strmap_t *m, const char *s, size_t len) {
    uint64_t h = bpe_hash(s, len);
    size_t j = h & m->mask;
    while (m->e[j].s) {
        if (m->e[j].hash == h && m->e[j].len == len && memcmp(m->e[j].s, s, len) == 0) return m->e[j].val;
        j = (j + 1) & m->mask;
    }
    return -1;
}

void strmap_free(strmap_t *m) {
    free(m->e);
    m->e = NULL;
    m->n = 0;
}

/* ---- merge table ---- */

int bpe_merges_init(bpe_merges_t *m, size_t expected) {
    size_t cap = pow2_at_least(expected * 2 + 1);
    m->key = calloc(cap, sizeof *m->key);
    m->rank = malloc(cap * sizeof *m->rank);
    m->out = malloc(cap * sizeof *m->out);
    m->mask = cap - 1;
    m->n = 0;
    return m->key && m->rank && m->out ? 0 : -1;
}

static int merges_grow(bpe_merges_t *m) {
    bpe_merges_t g;
    if (bpe_merges_init(&g, (m->mask + 1)) != 0) { bpe_merges_free(&g); return -1; }
    for (size_t i = 0; i <= m->mask; i++) {
        if (!m->key[i]) continue;
        size_t j = mix64(m->key[i]) & g.mask;
        while (g.key[j]) j = (j + 1) & g.mask;
        g.key[j] = m->key[i]; g.rank[j] = m->rank[i]; g.out[j] = m->out[i];
    }
    g.n = m->n;
    bpe_merges_free(m);
    *m = g;
    return 0;
}

int bpe_merges_put(bpe_merges_t *m, uint32_t left, uint32_t right, uint32_t rank, uint32_t out) {
    if ((m->n + 1) * 2 > m->mask + 1 && merges_grow(m) != 0) return -1;
    uint64_t k = ((uint64_t)left << 32 | right) + 1;
    size_t j = mix64(k) & m->mask;
    while (m->key[j]) {
        if (m->key[j] == k) return 1;
        j = (j + 1) & m->mask;
    }
    m->key[j] = k; m->rank[j] = rank; m->out[j] = out;
    m->n++;
    return 0;
}

bool bpe_merges_get(const bpe_merges_t *m, uint32_t left, uint32_t right, uint32_t *rank, uint32_t *out) {
    uint64_t k = ((uint64_t)left << 32 | right) + 1;
    size_t j = mix64(k) & m->mask;
    while (m->key[j]) {
        if (m->key[j] == k) { *rank = m->rank[j]; *out = m->out[j]; return true; }
        j = (j + 1) & m->mask;
    }
    return false;
}

void bpe_merges_free(bpe_merges_t *m) {
    free(m->key); free(m->rank); free(m->out);
    m->key = NULL; m->rank = m->out = NULL;
}

/* ---- the merge loop ---- */

static inline bool cand_less(bpe_cand_t a, bpe_cand_t b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static int heap_push(bpe_scratch_t *s, size_t *hn, bpe_cand_t c) {
    if (*hn == s->heap_cap) {
        size_t nc = s->heap_cap ? s->heap_cap * 2 : 64;
        bpe_cand_t *h = realloc(s->heap, nc * sizeof *h);
        if (!h) return -1;
        s->heap = h; s->heap_cap = nc;
    }
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(c, s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = c;
    return 0;
}

static bpe_cand_t heap_pop(bpe_scratch_t *s, size_t *hn) {
    bpe_cand_t top = s->heap[0], last = s->heap[--*hn];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        bpe_cand_t mv = last;
        if (l < n && cand_less(s->heap[l], mv)) { m = l; mv = s->heap[l]; }
        if (r < n && cand_less(s->heap[r], mv)) { m = r; }
        if (m == i) break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n) s->heap[i] = last;
    return top;
}

size_t bpe_merge_word(const bpe_merges_t *m, uint32_t *syms, size_t n, bpe_scratch_t *s) {
    if (n < 2) return n;
    if (n > s->cap) {
        int32_t *p = realloc(s->prev, n * sizeof *p), *q = p ? realloc(s->next, n * sizeof *q) : NULL;
        if (p) s->prev = p;
        if (!q) return (size_t)-1;
        s->next = q;
        s->cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        bpe_cand_t c = { 0, (uint32_t)i, 0 };
        if (bpe_merges_get(m, syms[i], syms[i + 1], &c.rank, &c.out) && heap_push(s, &hn, c) != 0) return (size_t)-1;
    }
    /* A slot whose prev is -2 has been merged into its left neighbour. */
    while (hn) {
        bpe_cand_t c = heap_pop(s, &hn);
        int32_t l = (int32_t)c.pos;
        if (s->prev[l] == -2 || s->next[l] < 0) continue;
        int32_t r = s->next[l];
        uint32_t rank, out;
        if (!bpe_merges_get(m, syms[l], syms[r], &rank, &out) || rank != c.rank || out != c.out) continue;
        syms[l] = out;
        s->next[l] = s->next[r];
        if (s->next[r] >= 0) s->prev[s->next[r]] = l;
        s->prev[r] = -2;
        if (s->prev[l] >= 0) {
            bpe_cand_t d = { 0, (uint32_t)s->prev[l], 0 };
            if (bpe_merges_get(m, syms[s->prev[l]], syms[l], &d.rank, &d.out) && heap_push(s, &hn, d) != 0)
                return (size_t)-1;
        }
        if (s->next[l] >= 0) {
            bpe_cand_t d = { 0, (uint32_t)l, 0 };
            if (bpe_merges_get(m, syms[l], syms[s->next[l]], &d.rank, &d.out) && heap_push(s, &hn, d) != 0)
                return (size_t)-1;
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = s->next[i]) syms[k++] = syms[i];
    return k;
}

void bpe_scratch_free(bpe_scratch_t *s) {
    free(s->prev); free(s->next); free(s->heap);
    memset(s, 0, sizeof *s);
}

/* ---- word cache ---- */

int bpe_cache_init(bpe_cache_t *c, size_t max_entries) {
    memset(c, 0, sizeof *c);
    size_t cap = pow2_at_least(max_entries * 2);
    c->hash = calloc(cap, sizeof *c->hash);
    c->koff = malloc(cap * sizeof *c->koff);
    c->klen = malloc(cap * sizeof *c->klen);
    c->voff = malloc(cap * sizeof *c->voff);
    c->vlen = malloc(cap * sizeof *c->vlen);
    c->mask = cap - 1;
    c->max_n = max_entries;
    if (!c->hash || !c->koff || !c->klen || !c->voff || !c->vlen) { bpe_cache_free(c); return -1; }
    return 0;
}

const uint32_t *bpe_cache_get(const bpe_cache_t *c, const char *w, size_t wlen, uint64_t h, size_t *n) {
    if (!c->hash) return NULL;
    size_t j = h & c->mask;
    while (c->hash[j]) {
        if (c->hash[j] == h && c->klen[j] == wlen && memcmp(c->keys + c->koff[j], w, wlen) == 0) {
            *n = c->vlen[j];
            return c->vals + c->voff[j];
        }
        j = (j + 1) & c->mask;
    }
    return NULL;
}

void bpe_cache_put(bpe_cache_t *c, const char *w, size_t wlen, uint64_t h, const uint32_t *ids, size_t n) {
    if (!c->hash) return;
    if (c->n >= c->max_n) {  /* full: start over (cheap, and keeps memory bounded) */
        memset(c->hash, 0, (c->mask + 1) * sizeof *c->hash);
        c->n = 0; c->keys_len = 0; c->vals_len = 0;
    }
    if (c->keys_len + wlen > c->keys_cap) {
        size_t nc = (c->keys_cap + wlen) * 2;
        char *k = realloc(c->keys, nc);
        if (!k) return;
        c->keys = k; c->keys_cap = nc;
    }
    if (c->vals_len + n > c->vals_cap) {
        size_t nc = (c->vals_cap + n) * 2;
        uint32_t *v = realloc(c->vals, nc * sizeof *v);
        if (!v) return;
        c->vals = v; c->vals_cap = nc;
    }
    size_t j = h & c->mask;
    while (c->hash[j]) j = (j + 1) & c->mask;
    memcpy(c->keys + c->keys_len, w, wlen);
    memcpy(c->vals + c->vals_len, ids, n * sizeof *ids);
    c->hash[j] = h;
    c->koff[j] = (uint32_t)c->keys_len; c->klen[j] = (uint32_t)wlen;
    c->voff[j] = (uint32_t)c->vals_len; c->vlen[j] = (uint32_t)n;
    c->keys_len += wlen; c->vals_len += n;
    c->n++;
}

void bpe_cache_free(bpe_cache_t *c) {
    free(c->hash); free(c->koff); free(c->klen); free(c->voff); free(c->vlen);
    free(c->keys); free(c->vals);
    memset(c, 0, sizeof *c);
}
