/*
 * tokenizer.c - Hugging Face tokenizer.json (+ tokenizer_config.json)
 * loaded into a tokenizer_t (tokenizer.h): added tokens, normalizers,
 * pre-tokenizers (split regexes through PCRE2 with UTF, UCP and JIT), the
 * BPE model (tokenizer_bpe.c) and the decoders. JSON through jansson, the
 * Unicode normalization forms (NFC of Qwen2, NFD, NFKC, NFKD) through ICU,
 * opened at run time (dlopen) when a tokenizer asks for one: ICU's data
 * library is 31 MiB, and no other program part needs it (the programs that
 * hold this file, ballast-worker included, load on machines without it,
 * such as the GPU machine of tests/gpu/run.sh).
 *
 * Encoding follows the Hugging Face pipeline: the input is cut at added
 * tokens (leftmost, longest first; lstrip/rstrip eat neighbouring
 * whitespace); each remaining section is normalized, pre-tokenized into
 * words, and each word is merged by rank. Text is bytes: invalid UTF-8 is
 * never rejected (PCRE2_MATCH_INVALID_UTF lets the regexes skip it; a
 * byte-level tokenizer encodes every byte, a SentencePiece one falls back
 * to <0xNN> tokens), and decoding returns bytes, so byte fallback of
 * invalid UTF-8 round-trips (Hugging Face would substitute U+FFFD); a
 * Unicode normalizer normalizes each run of valid UTF-8 and passes invalid
 * bytes through unchanged.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>
#include <pcre2.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "workers/data/tokenizer.h"
#include "workers/data/tokenizer_bpe.h"

#define TOK_MAX_STEPS 8          /* normalizers / pre-tokenizers / decoders per Sequence */
#define TOK_CACHE_MAX_WORD 256   /* longer words are not cached (bytes) */
#define TOK_CACHE_ENTRIES 65536  /* per thread */

/* The GPT-2 split regex that ByteLevel's use_regex applies. */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- types ---- */

typedef enum { NORM_PREPEND, NORM_REPLACE, NORM_UNICODE } norm_kind_t;
typedef struct {
    norm_kind_t kind;
    char *a; size_t alen;  /* Prepend: the prefix; Replace: the pattern */
    char *b; size_t blen;  /* Replace: the content */
    const UNormalizer2 *un;  /* Unicode: ICU's NFC, NFD, NFKC or NFKD instance (owned by ICU) */
} norm_t;

typedef enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE, PRE_DIGITS } pre_kind_t;
typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } split_t;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_t;
typedef struct {
    pre_kind_t kind;
    int re;                 /* Split, ByteLevel with use_regex: index into tokenizer.re[] (-1: none) */
    split_t behavior;       /* Split */
    bool invert;            /* Split: the matches are the words, the gaps the delimiters... inverted */
    bool add_prefix_space;  /* ByteLevel */
    char rep[8]; size_t rep_len;  /* Metaspace: the replacement character (UTF-8) */
    prepend_t prepend;      /* Metaspace */
    bool split;             /* Metaspace: split before each replacement character */
    bool individual;        /* Digits: each digit its own word */
} pre_t;

typedef enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE } dec_kind_t;
typedef struct {
    dec_kind_t kind;
    char *a; size_t alen;   /* Replace: pattern; Strip: content; Metaspace: replacement */
    char *b; size_t blen;   /* Replace: content */
    int start, stop;        /* Strip */
    prepend_t prepend;      /* Metaspace */
} dec_t;

typedef struct {
    char *content; size_t len;
    uint32_t id;
    bool special, lstrip, rstrip, single_word;
} added_t;

/* Per-thread scratch: regex match data, BPE buffers, the word cache. */
typedef struct tok_tls {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    bpe_scratch_t bpe;
    bpe_cache_t cache;
    uint32_t *syms; size_t syms_cap;
    char *norm; size_t norm_cap;            /* normalized section */
    UChar *u16[2]; size_t u16_cap[2];       /* a Unicode normalizer's UTF-16 input and output (code units) */
    char *pre[TOK_MAX_STEPS]; size_t pre_cap[TOK_MAX_STEPS];  /* rewritten words per step */
    char *mapped; size_t mapped_cap;        /* byte-level spelling of a word */
    struct tok_tls *next_tls, *prev_tls;    /* tokenizer's list of all thread states */
    struct tokenizer *owner;
} tok_tls_t;

struct tokenizer {
    char kind[32];
    uint32_t vocab_size;            /* largest id + 1 */
    char **tok; uint32_t *tok_len;  /* (vocab_size) token strings, NULL where unassigned */
    bool *special;                  /* (vocab_size) special added tokens */
    strmap_t vocab;                 /* model vocabulary and added tokens: string -> id */
    bpe_merges_t merges;
    bool ignore_merges, byte_fallback, fuse_unk;
    int64_t unk_id;
    uint32_t fallback_id[256];      /* <0xNN> ids (byte_fallback) */
    bool byte_level;                /* a ByteLevel pre-tokenizer maps bytes to characters */
    uint32_t byte_id[256];          /* byte-level: id of the one-character token of each byte */
    char byte_chr[256][3]; uint8_t byte_chr_len[256]; /* byte -> its character (UTF-8) */
    int16_t chr_byte[324];          /* code point -> byte, -1 when none */
    int64_t ascii_id[128];          /* SentencePiece: id of each ASCII character, -1 when none */
    added_t *added; size_t n_added;
    char **retired; size_t n_retired; /* vocabulary strings an added token's replaced: the vocab map still points at them */
    uint32_t *added_by_byte[256]; size_t n_added_by_byte[256]; /* candidates by first byte, longest first */
    norm_t norm[TOK_MAX_STEPS]; int n_norm;
    pre_t pre[TOK_MAX_STEPS]; int n_pre;
    dec_t dec[TOK_MAX_STEPS]; int n_dec;
    pcre2_code *re[TOK_MAX_STEPS]; int n_re;
    int64_t bos_id, eos_id;
    bool adds_bos, adds_eos;
    pthread_key_t key;
    pthread_mutex_t tls_lock;
    tok_tls_t *tls_list;
};

/* ---- errors ---- */

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 character at p (n bytes available), 0 when the
 * bytes there are not one (a lone continuation byte, an overlong form, a
 * surrogate, past U+10FFFF or truncated). */
static size_t utf8_len(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    if (c < 0xc2) return 0;
    if (c < 0xe0) return n >= 2 && (p[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c < 0xf0) {
        if (n < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80) return 0;
        if (c == 0xe0 && p[1] < 0xa0) return 0;
        if (c == 0xed && p[1] >= 0xa0) return 0;
        return 3;
    }
    if (c < 0xf5) {
        if (n < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80) return 0;
        if (c == 0xf0 && p[1] < 0x90) return 0;
        if (c == 0xf4 && p[1] >= 0x90) return 0;
        return 4;
    }
    return 0;
}

static uint32_t utf8_cp(const unsigned char *p, size_t l) {
    switch (l) {
    case 1: return p[0];
    case 2: return (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f);
    case 3: return (uint32_t)(p[0] & 0x0f) << 12 | (uint32_t)(p[1] & 0x3f) << 6 | (p[2] & 0x3f);
    default: return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3f) << 12 | (uint32_t)(p[2] & 0x3f) << 6 | (p[3] & 0x3f);
    }
}

static size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xc0 | cp >> 6); out[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12); out[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18); out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Unicode White_Space (what Rust's char::is_whitespace and Hugging Face's
 * lstrip/rstrip use). */
static bool is_space_cp(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Length of the whitespace character at p, 0 when none. */
static size_t space_at(const char *p, size_t n) {
    size_t l = utf8_len((const unsigned char *)p, n);
    return l && is_space_cp(utf8_cp((const unsigned char *)p, l)) ? l : 0;
}

/* Length of the whitespace character that ends p[0..n), 0 when none. */
static size_t space_before(const char *p, size_t n) {
    for (size_t l = 1; l <= 4 && l <= n; l++) {
        const unsigned char *q = (const unsigned char *)p + n - l;
        if (l < 4 && (*q & 0xc0) == 0x80) continue;
        return utf8_len(q, l) == l && is_space_cp(utf8_cp(q, l)) ? l : 0;
    }
    return 0;
}

/* ---- growable buffers ---- */

static int reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    char *p = realloc(*buf, nc);
    if (!p) return -1;
    *buf = p; *cap = nc;
    return 0;
}

static int push_ids(uint32_t **ids, size_t *n, size_t *cap, const uint32_t *v, size_t k) {
    if (*n + k > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *n + k) nc *= 2;
        uint32_t *p = realloc(*ids, nc * sizeof *p);
        if (!p) return -1;
        *ids = p; *cap = nc;
    }
    memcpy(*ids + *n, v, k * sizeof *v);
    *n += k;
    return 0;
}

/* ---- per-thread state ---- */

static void tls_free(tok_tls_t *s) {
    if (!s) return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit);
    bpe_scratch_free(&s->bpe);
    bpe_cache_free(&s->cache);
    free(s->syms); free(s->norm); free(s->mapped);
    free(s->u16[0]); free(s->u16[1]);
    for (int i = 0; i < TOK_MAX_STEPS; i++) free(s->pre[i]);
    free(s);
}

static void tls_unlink(tok_tls_t *s) {
    tokenizer_t *t = s->owner;
    if (s->prev_tls) s->prev_tls->next_tls = s->next_tls;
    else t->tls_list = s->next_tls;
    if (s->next_tls) s->next_tls->prev_tls = s->prev_tls;
}

/* pthread key destructor: a thread that encoded exits. */
static void tls_destroy(void *p) {
    tok_tls_t *s = p;
    tokenizer_t *t = s->owner;
    pthread_mutex_lock(&t->tls_lock);
    tls_unlink(s);
    pthread_mutex_unlock(&t->tls_lock);
    tls_free(s);
}

static tok_tls_t *tls_get(const tokenizer_t *tc) {
    tokenizer_t *t = (tokenizer_t *)tc;  /* only the key and the list of states change */
    tok_tls_t *s = pthread_getspecific(t->key);
    if (s) return s;
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->owner = t;
    s->md = pcre2_match_data_create(4, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    s->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!s->md || !s->mctx || !s->jit || bpe_cache_init(&s->cache, TOK_CACHE_ENTRIES) != 0) { tls_free(s); return NULL; }
    pcre2_jit_stack_assign(s->mctx, NULL, s->jit);
    pthread_mutex_lock(&t->tls_lock);
    s->next_tls = t->tls_list;
    if (t->tls_list) t->tls_list->prev_tls = s;
    t->tls_list = s;
    pthread_mutex_unlock(&t->tls_lock);
    if (pthread_setspecific(t->key, s) != 0) {
        pthread_mutex_lock(&t->tls_lock);
        tls_unlink(s);
        pthread_mutex_unlock(&t->tls_lock);
        tls_free(s);
        return NULL;
    }
    return s;
}

/* ---- the model: BPE over one word ---- */

typedef struct {
    uint32_t **ids; size_t *n, *cap;
    char *err; size_t errlen;
} out_t;

static int grow_syms(tok_tls_t *s, size_t n) {
    if (n <= s->syms_cap) return 0;
    size_t nc = s->syms_cap ? s->syms_cap : 256;
    while (nc < n) nc *= 2;
    uint32_t *p = realloc(s->syms, nc * sizeof *p);
    if (!p) return -1;
    s->syms = p; s->syms_cap = nc;
    return 0;
}

static int oom(out_t *o) {
    seterr(o->err, o->errlen, "out of memory while encoding");
    return -1;
}

/* Appends the ids of one pre-tokenized word. */
static int model_word(const tokenizer_t *t, tok_tls_t *s, const char *w, size_t wl, out_t *o) {
    if (wl == 0) return 0;
    uint64_t h = 0;
    if (wl <= TOK_CACHE_MAX_WORD) {
        size_t cn;
        h = bpe_hash(w, wl);
        const uint32_t *c = bpe_cache_get(&s->cache, w, wl, h, &cn);
        if (c) return push_ids(o->ids, o->n, o->cap, c, cn) == 0 ? 0 : oom(o);
    }
    if (grow_syms(s, wl) != 0) return oom(o);
    uint32_t *sy = s->syms;
    size_t n = 0;
    const unsigned char *u = (const unsigned char *)w;
    if (t->byte_level) {
        if (t->ignore_merges) {
            if (reserve(&s->mapped, &s->mapped_cap, 2 * wl) != 0) return oom(o);
            size_t m = 0;
            for (size_t i = 0; i < wl; i++) {
                memcpy(s->mapped + m, t->byte_chr[u[i]], t->byte_chr_len[u[i]]);
                m += t->byte_chr_len[u[i]];
            }
            int64_t id = strmap_get(&t->vocab, s->mapped, m);
            if (id >= 0) sy[n++] = (uint32_t)id;
        }
        if (n == 0)
            for (size_t i = 0; i < wl; i++) sy[n++] = t->byte_id[u[i]];
    } else {
        if (t->ignore_merges) {
            int64_t id = strmap_get(&t->vocab, w, wl);
            if (id >= 0) sy[n++] = (uint32_t)id;
        }
        bool last_unk = false, whole = n > 0;
        for (size_t i = 0; !whole && i < wl;) {
            size_t l = utf8_len(u + i, wl - i);
            int64_t id = -1;
            if (l == 1 && u[i] < 128) id = t->ascii_id[u[i]];
            else if (l) id = strmap_get(&t->vocab, w + i, l);
            size_t step = l ? l : 1;
            if (id >= 0) { sy[n++] = (uint32_t)id; last_unk = false; }
            else {
                bool all = t->byte_fallback;
                for (size_t k = 0; all && k < step; k++) all = t->fallback_id[u[i + k]] != UINT32_MAX;
                if (all) {
                    for (size_t k = 0; k < step; k++) sy[n++] = t->fallback_id[u[i + k]];
                    last_unk = false;
                } else if (t->unk_id >= 0) {
                    if (!(t->fuse_unk && last_unk)) sy[n++] = (uint32_t)t->unk_id;
                    last_unk = true;
                } else {
                    seterr(o->err, o->errlen, "cannot encode the bytes at offset %zu of a word: they are not in the "
                           "vocabulary and the tokenizer has neither byte_fallback nor an unk_token", i);
                    return -1;
                }
            }
            i += step;
        }
    }
    size_t k = bpe_merge_word(&t->merges, sy, n, &s->bpe);
    if (k == (size_t)-1) return oom(o);
    if (push_ids(o->ids, o->n, o->cap, sy, k) != 0) return oom(o);
    if (h) bpe_cache_put(&s->cache, w, wl, h, sy, k);
    return 0;
}

/* ---- pre-tokenizers ---- */

static int pre_apply(const tokenizer_t *t, tok_tls_t *s, int d, const char *w, size_t wl, bool at_start, out_t *o);

typedef struct {
    const tokenizer_t *t; tok_tls_t *s; int d; out_t *o;
    const char *w;
    split_t behavior;
    bool have; size_t ps, pe; bool pmatch;  /* the pending span */
    bool any;                              /* a piece was emitted already */
} splitter_t;

static int sp_emit(splitter_t *p, size_t a, size_t b) {
    if (b <= a) return 0;
    bool first = !p->any && a == 0;
    p->any = true;
    return pre_apply(p->t, p->s, p->d + 1, p->w + a, b - a, first, p->o);
}

/* One span of the word: a match of the delimiter pattern or a gap. */
static int sp_span(splitter_t *p, size_t a, size_t b, bool match) {
    if (b <= a) return 0;
    switch (p->behavior) {
    case SPLIT_ISOLATED: return sp_emit(p, a, b);
    case SPLIT_REMOVED: return match ? 0 : sp_emit(p, a, b);
    case SPLIT_MERGED_PREV:
        if (!match) {
            if (p->have && sp_emit(p, p->ps, p->pe) != 0) return -1;
            p->have = true; p->ps = a; p->pe = b;
            return 0;
        }
        if (p->have) { p->have = false; return sp_emit(p, p->ps, b); }
        return sp_emit(p, a, b);
    case SPLIT_MERGED_NEXT:
        if (match) {
            if (p->have && sp_emit(p, p->ps, p->pe) != 0) return -1;
            p->have = true; p->ps = a; p->pe = b;
            return 0;
        }
        if (p->have) { p->have = false; return sp_emit(p, p->ps, b); }
        return sp_emit(p, a, b);
    case SPLIT_CONTIGUOUS:
        if (match) {
            if (p->have && p->pe == a) { p->pe = b; return 0; }
            if (p->have && sp_emit(p, p->ps, p->pe) != 0) return -1;
            p->have = true; p->ps = a; p->pe = b;
            return 0;
        }
        if (p->have) { p->have = false; if (sp_emit(p, p->ps, p->pe) != 0) return -1; }
        return sp_emit(p, a, b);
    }
    return 0;
}

/* Splits w by the regex re (or the literal lit) and passes every piece to step d + 1. */
static int split_word(const tokenizer_t *t, tok_tls_t *s, int d, const char *w, size_t wl, int re, const char *lit,
                      size_t litlen, split_t behavior, bool invert, bool at_start, out_t *o) {
    splitter_t p = { t, s, d, o, w, behavior, false, 0, 0, false, !at_start };
    size_t off = 0, prev = 0;
    while (off < wl) {
        size_t ms, me;
        if (lit) {
            const char *f = memmem(w + off, wl - off, lit, litlen);
            if (!f) break;
            ms = (size_t)(f - w); me = ms + litlen;
        } else {
            int rc = pcre2_jit_match(t->re[re], (PCRE2_SPTR)w, wl, off, 0, s->md, s->mctx);
            if (rc == PCRE2_ERROR_JIT_BADOPTION)
                rc = pcre2_match(t->re[re], (PCRE2_SPTR)w, wl, off, 0, s->md, s->mctx);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                seterr(o->err, o->errlen, "split regex failed at byte %zu of a %zu-byte section: %s", off, wl, (char *)msg);
                return -1;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
            ms = ov[0]; me = ov[1];
        }
        if (me == ms) {  /* an empty match delimits nothing: step over one character */
            size_t l = utf8_len((const unsigned char *)w + ms, wl - ms);
            off = ms + (l ? l : 1);
            continue;
        }
        if (sp_span(&p, prev, ms, invert) != 0 || sp_span(&p, ms, me, !invert) != 0) return -1;
        prev = off = me;
    }
    if (sp_span(&p, prev, wl, invert) != 0) return -1;
    if (p.have && sp_emit(&p, p.ps, p.pe) != 0) return -1;
    return 0;
}

/* Step d of the pre-tokenizer on word w; past the last step, the model. */
static int pre_apply(const tokenizer_t *t, tok_tls_t *s, int d, const char *w, size_t wl, bool at_start, out_t *o) {
    if (wl == 0) return 0;
    if (d >= t->n_pre) return model_word(t, s, w, wl, o);
    const pre_t *p = &t->pre[d];
    switch (p->kind) {
    case PRE_SPLIT:
        return split_word(t, s, d, w, wl, p->re, NULL, 0, p->behavior, p->invert, at_start, o);
    case PRE_BYTELEVEL:
        if (p->add_prefix_space && w[0] != ' ') {
            if (reserve(&s->pre[d], &s->pre_cap[d], wl + 1) != 0) return oom(o);
            s->pre[d][0] = ' ';
            memcpy(s->pre[d] + 1, w, wl);
            w = s->pre[d]; wl++;
        }
        if (p->re >= 0) return split_word(t, s, d, w, wl, p->re, NULL, 0, SPLIT_ISOLATED, false, at_start, o);
        return pre_apply(t, s, d + 1, w, wl, at_start, o);
    case PRE_METASPACE: {
        size_t spaces = 0;
        for (size_t i = 0; i < wl; i++) spaces += w[i] == ' ';
        if (reserve(&s->pre[d], &s->pre_cap[d], wl + spaces * p->rep_len + p->rep_len) != 0) return oom(o);
        char *b = s->pre[d];
        size_t m = 0;
        bool starts = wl >= p->rep_len && memcmp(w, p->rep, p->rep_len) == 0;
        if (w[0] == ' ') starts = true;
        if (!starts && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && at_start))) {
            memcpy(b, p->rep, p->rep_len); m = p->rep_len;
        }
        for (size_t i = 0; i < wl; i++) {
            if (w[i] == ' ') { memcpy(b + m, p->rep, p->rep_len); m += p->rep_len; }
            else b[m++] = w[i];
        }
        if (p->split) return split_word(t, s, d, b, m, -1, p->rep, p->rep_len, SPLIT_MERGED_NEXT, false, at_start, o);
        return pre_apply(t, s, d + 1, b, m, at_start, o);
    }
    case PRE_DIGITS:
        break;
    }
    return pre_apply(t, s, d + 1, w, wl, at_start, o);
}

/* ---- ICU, opened at run time ---- */

/* ICU renames its C functions by major version (unorm2_normalize is
 * unorm2_normalize_72 for ICU 72, through the headers' macros), so the
 * names looked up are the macros' expansions, and the library is the
 * soname of the headers this was compiled against. */
#define ICU_XSTR(x) #x
#define ICU_NAME(x) ICU_XSTR(x)
#define ICU_SONAME "libicuuc.so." ICU_NAME(U_ICU_VERSION_MAJOR_NUM)

static struct {
    pthread_once_t once;
    const char *why; /* NULL once loaded */
    const UNormalizer2 *(*nfc)(UErrorCode *), *(*nfd)(UErrorCode *), *(*nfkc)(UErrorCode *), *(*nfkd)(UErrorCode *);
    int32_t (*normalize)(const UNormalizer2 *, const UChar *, int32_t, UChar *, int32_t, UErrorCode *);
    UChar *(*from_utf8)(UChar *, int32_t, int32_t *, const char *, int32_t, UErrorCode *);
    char *(*to_utf8)(char *, int32_t, int32_t *, const UChar *, int32_t, UErrorCode *);
    const char *(*error_name)(UErrorCode);
} g_icu = { .once = PTHREAD_ONCE_INIT, .why = "not loaded" };

static void icu_load(void) {
    static char why[256];
    void *h = dlopen(ICU_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why, "%s does not load (%s): install Debian's libicu%d", ICU_SONAME, dlerror(),
                 U_ICU_VERSION_MAJOR_NUM);
        g_icu.why = why;
        return;
    }
#define ICU_SYM(field, fn)                                                                                          \
    do {                                                                                                            \
        *(void **)&g_icu.field = dlsym(h, ICU_NAME(fn));                                                             \
        if (!g_icu.field) {                                                                                         \
            snprintf(why, sizeof why, "%s lacks %s: install Debian's libicu%d", ICU_SONAME, ICU_NAME(fn),          \
                     U_ICU_VERSION_MAJOR_NUM);                                                                      \
            g_icu.why = why;                                                                                        \
            return;                                                                                                 \
        }                                                                                                           \
    } while (0)
    ICU_SYM(nfc, unorm2_getNFCInstance);
    ICU_SYM(nfd, unorm2_getNFDInstance);
    ICU_SYM(nfkc, unorm2_getNFKCInstance);
    ICU_SYM(nfkd, unorm2_getNFKDInstance);
    ICU_SYM(normalize, unorm2_normalize);
    ICU_SYM(from_utf8, u_strFromUTF8);
    ICU_SYM(to_utf8, u_strToUTF8);
    ICU_SYM(error_name, u_errorName);
#undef ICU_SYM
    g_icu.why = NULL; /* the handle stays open for the process */
}

/* NULL when ICU is there, else why not (with the fix). */
static const char *icu_open(void) {
    pthread_once(&g_icu.once, icu_load);
    return g_icu.why;
}

/* ---- normalizers ---- */

static int reserve_u16(tok_tls_t *s, int i, size_t need) {
    if (need <= s->u16_cap[i]) return 0;
    size_t nc = s->u16_cap[i] ? s->u16_cap[i] : 256;
    while (nc < need) nc *= 2;
    UChar *p = realloc(s->u16[i], nc * sizeof *p);
    if (!p) return -1;
    s->u16[i] = p; s->u16_cap[i] = nc;
    return 0;
}

/* Appends the normal form (un) of the valid UTF-8 run w[0..wl) to
 * (*buf)[*m..], through UTF-16 (ICU's C API normalizes UTF-16). */
static int unicode_run(const UNormalizer2 *un, tok_tls_t *s, const char *w, size_t wl, char **buf, size_t *cap,
                       size_t *m) {
    UErrorCode e = U_ZERO_ERROR;
    int32_t n16 = 0;
    if (wl > INT32_MAX / 4 || reserve_u16(s, 0, wl + 1) != 0) return -1;
    g_icu.from_utf8(s->u16[0], (int32_t)s->u16_cap[0], &n16, w, (int32_t)wl, &e);
    if (U_FAILURE(e)) return -1;
    /* NFKC/NFKD can grow a character up to 18 times; retry on overflow */
    int32_t need = g_icu.normalize(un, s->u16[0], n16, s->u16[1], (int32_t)s->u16_cap[1], &e);
    if (e == U_BUFFER_OVERFLOW_ERROR) {
        e = U_ZERO_ERROR;
        if (reserve_u16(s, 1, (size_t)need + 1) != 0) return -1;
        need = g_icu.normalize(un, s->u16[0], n16, s->u16[1], (int32_t)s->u16_cap[1], &e);
    }
    if (U_FAILURE(e)) return -1;
    if (reserve(buf, cap, *m + 3 * (size_t)need + 1) != 0) return -1;
    int32_t n8 = 0;
    g_icu.to_utf8(*buf + *m, (int32_t)(*cap - *m), &n8, s->u16[1], need, &e);
    if (U_FAILURE(e)) return -1;
    *m += (size_t)n8;
    return 0;
}

/* The normal form un of w[0..wl) into *buf: each maximal run of valid
 * UTF-8 normalized, invalid bytes copied as they are. Returns the length
 * + 1, 0 when w is already in that form (nothing written), -1 when out of
 * memory. ASCII is in every form, so a leading run of it is copied, not
 * converted. */
static ssize_t unicode_normalize(const UNormalizer2 *un, tok_tls_t *s, const char *w, size_t wl, char **buf,
                                 size_t *cap) {
    const unsigned char *u = (const unsigned char *)w;
    size_t i = 0;
    while (i < wl && u[i] < 0x80) i++;
    if (i == wl) return 0;
    if (i) i--;  /* the last ASCII character may compose with the marks after it */
    size_t m = 0;
    if (reserve(buf, cap, wl + 1) != 0) return -1;
    memcpy(*buf, w, i);
    m = i;
    while (i < wl) {
        size_t a = i, l;
        while (i < wl && (l = utf8_len(u + i, wl - i))) i += l;
        if (i > a && unicode_run(un, s, w + a, i - a, buf, cap, &m) != 0) return -1;
        while (i < wl && !utf8_len(u + i, wl - i)) {
            if (reserve(buf, cap, m + 2) != 0) return -1;
            (*buf)[m++] = w[i++];
        }
    }
    return (ssize_t)m + 1;
}

/* Normalizes one section into s->norm (or returns the input untouched). */
static int normalize(const tokenizer_t *t, tok_tls_t *s, const char **text, size_t *len) {
    const char *w = *text;
    size_t wl = *len;
    for (int i = 0; i < t->n_norm; i++) {
        const norm_t *nm = &t->norm[i];
        char *dst;
        size_t m = 0;
        /* s->norm and s->mapped alternate as destination */
        char **buf = (w == s->norm) ? &s->mapped : &s->norm;
        size_t *cap = (w == s->norm) ? &s->mapped_cap : &s->norm_cap;
        if (nm->kind == NORM_UNICODE) {
            ssize_t r = unicode_normalize(nm->un, s, w, wl, buf, cap);
            if (r < 0) return -1;
            if (r == 0) continue;  /* all ASCII: already in that form */
            w = *buf; wl = (size_t)r - 1;
            continue;
        }
        if (nm->kind == NORM_PREPEND) {
            if (wl == 0) continue;
            if (reserve(buf, cap, wl + nm->alen) != 0) return -1;
            dst = *buf;
            memcpy(dst, nm->a, nm->alen);
            memcpy(dst + nm->alen, w, wl);
            m = wl + nm->alen;
        } else {
            size_t hits = 0;
            for (const char *f = w; (f = memmem(f, wl - (size_t)(f - w), nm->a, nm->alen)); f += nm->alen) hits++;
            if (hits == 0) continue;
            if (reserve(buf, cap, wl + hits * nm->blen) != 0) return -1;
            dst = *buf;
            const char *q = w;
            for (const char *f; (f = memmem(q, wl - (size_t)(q - w), nm->a, nm->alen)); q = f + nm->alen) {
                memcpy(dst + m, q, (size_t)(f - q)); m += (size_t)(f - q);
                memcpy(dst + m, nm->b, nm->blen); m += nm->blen;
            }
            memcpy(dst + m, q, wl - (size_t)(q - w)); m += wl - (size_t)(q - w);
        }
        w = dst; wl = m;
    }
    *text = w; *len = wl;
    return 0;
}

static int encode_section(const tokenizer_t *t, tok_tls_t *s, const char *text, size_t len, bool at_start, out_t *o) {
    if (len == 0) return 0;
    if (normalize(t, s, &text, &len) != 0) return oom(o);
    /* the model step may use s->mapped; a normalized section living there moves to s->norm */
    if (text == s->mapped) {
        if (reserve(&s->norm, &s->norm_cap, len) != 0) return oom(o);
        memcpy(s->norm, text, len);
        text = s->norm;
    }
    return pre_apply(t, s, 0, text, len, at_start, o);
}

/* The added token that starts at text[i], longest first, or NULL. */
static const added_t *added_at(const tokenizer_t *t, const char *text, size_t len, size_t i) {
    unsigned char c = (unsigned char)text[i];
    for (size_t k = 0; k < t->n_added_by_byte[c]; k++) {
        const added_t *a = &t->added[t->added_by_byte[c][k]];
        if (a->len > len - i || memcmp(text + i, a->content, a->len) != 0) continue;
        if (a->single_word) {
            unsigned char before = i ? (unsigned char)text[i - 1] : ' ', after = i + a->len < len ? (unsigned char)text[i + a->len] : ' ';
            bool wb = (before >= '0' && before <= '9') || ((before | 32) >= 'a' && (before | 32) <= 'z') || before == '_' || before >= 0x80;
            bool wa = (after >= '0' && after <= '9') || ((after | 32) >= 'a' && (after | 32) <= 'z') || after == '_' || after >= 0x80;
            if (wb || wa) continue;
        }
        return a;
    }
    return NULL;
}

int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, uint32_t **ids, size_t *n, size_t *cap,
                     char *err, size_t errlen) {
    out_t o = { ids, n, cap, err, errlen };
    tok_tls_t *s = tls_get(t);
    if (!s) { seterr(err, errlen, "out of memory (tokenizer thread state)"); return -1; }
    if (len && !text) { seterr(err, errlen, "tokenizer_encode: text is NULL"); return -1; }
    size_t seg = 0, i = 0;
    while (i < len) {
        const added_t *a = t->n_added_by_byte[(unsigned char)text[i]] ? added_at(t, text, len, i) : NULL;
        if (!a) { i++; continue; }
        size_t end = i, l;
        if (a->lstrip)
            while (end > seg && (l = space_before(text + seg, end - seg))) end -= l;
        if (encode_section(t, s, text + seg, end - seg, seg == 0, &o) != 0) return -1;
        if (push_ids(ids, n, cap, &a->id, 1) != 0) return oom(&o);
        i += a->len;
        if (a->rstrip)
            while (i < len && (l = space_at(text + i, len - i))) i += l;
        seg = i;
    }
    return encode_section(t, s, text + seg, len - seg, seg == 0, &o);
}

/* ---- decoding ---- */

typedef struct { char *p; size_t n; } dpiece_t;

/* Replaces every occurrence of pat in *pc by rep (pat non-empty). */
static int piece_replace(dpiece_t *pc, const char *pat, size_t pl, const char *rep, size_t rl) {
    size_t hits = 0;
    for (const char *f = pc->p; (f = memmem(f, pc->n - (size_t)(f - pc->p), pat, pl)); f += pl) hits++;
    if (!hits) return 0;
    char *b = malloc(pc->n + hits * rl + 1);
    if (!b) return -1;
    size_t m = 0;
    const char *q = pc->p;
    for (const char *f; (f = memmem(q, pc->n - (size_t)(q - pc->p), pat, pl)); q = f + pl) {
        memcpy(b + m, q, (size_t)(f - q)); m += (size_t)(f - q);
        memcpy(b + m, rep, rl); m += rl;
    }
    memcpy(b + m, q, pc->n - (size_t)(q - pc->p)); m += pc->n - (size_t)(q - pc->p);
    free(pc->p);
    pc->p = b; pc->n = m;
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static int run_decoder(const tokenizer_t *t, const dec_t *dc, dpiece_t *pc, size_t *np) {
    size_t n = *np;
    switch (dc->kind) {
    case DEC_BYTELEVEL:
        for (size_t i = 0; i < n; i++) {  /* shrinks or keeps length: in place */
            const unsigned char *u = (const unsigned char *)pc[i].p;
            size_t m = 0;
            for (size_t j = 0; j < pc[i].n;) {
                size_t l = utf8_len(u + j, pc[i].n - j);
                uint32_t cp = l ? utf8_cp(u + j, l) : 0x7fffffff;
                if (l && cp < sizeof t->chr_byte / sizeof t->chr_byte[0] && t->chr_byte[cp] >= 0) {
                    pc[i].p[m++] = (char)t->chr_byte[cp];
                    j += l;
                } else {
                    size_t k = l ? l : 1;
                    memmove(pc[i].p + m, pc[i].p + j, k);
                    m += k; j += k;
                }
            }
            pc[i].n = m;
        }
        return 0;
    case DEC_REPLACE:
        for (size_t i = 0; i < n; i++)
            if (piece_replace(&pc[i], dc->a, dc->alen, dc->b, dc->blen) != 0) return -1;
        return 0;
    case DEC_BYTEFALLBACK:
        for (size_t i = 0; i < n; i++) {
            const char *p = pc[i].p;
            if (pc[i].n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' && hexval(p[3]) >= 0 &&
                hexval(p[4]) >= 0) {
                pc[i].p[0] = (char)(hexval(p[3]) << 4 | hexval(p[4]));
                pc[i].n = 1;
            }
        }
        return 0;
    case DEC_FUSE: {
        if (n < 2) return 0;
        size_t tot = 0;
        for (size_t i = 0; i < n; i++) tot += pc[i].n;
        char *b = malloc(tot + 1);
        if (!b) return -1;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) { memcpy(b + m, pc[i].p, pc[i].n); m += pc[i].n; free(pc[i].p); }
        pc[0].p = b; pc[0].n = m;
        *np = 1;
        return 0;
    }
    case DEC_STRIP:
        for (size_t i = 0; i < n; i++) {
            size_t a = 0, e = pc[i].n;
            for (int k = 0; k < dc->start && e - a >= dc->alen && memcmp(pc[i].p + a, dc->a, dc->alen) == 0; k++) a += dc->alen;
            for (int k = 0; k < dc->stop && e - a >= dc->alen && memcmp(pc[i].p + e - dc->alen, dc->a, dc->alen) == 0; k++) e -= dc->alen;
            memmove(pc[i].p, pc[i].p + a, e - a);
            pc[i].n = e - a;
        }
        return 0;
    case DEC_METASPACE:
        for (size_t i = 0; i < n; i++) {
            if (piece_replace(&pc[i], dc->a, dc->alen, " ", 1) != 0) return -1;
            if (i == 0 && dc->prepend != PREPEND_NEVER && pc[i].n && pc[i].p[0] == ' ') {
                memmove(pc[i].p, pc[i].p + 1, pc[i].n - 1);
                pc[i].n--;
            }
        }
        return 0;
    }
    return 0;
}

int tokenizer_decode(const tokenizer_t *t, const uint32_t *ids, size_t n, bool skip_special, char **out,
                     size_t *out_len, char *err, size_t errlen) {
    *out = NULL; *out_len = 0;
    dpiece_t *pc = calloc(n ? n : 1, sizeof *pc);
    if (!pc) { seterr(err, errlen, "out of memory while decoding"); return -1; }
    size_t np = 0;
    int rc = -1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->vocab_size || !t->tok[ids[i]]) {
            seterr(err, errlen, "token %zu: id %u is %s (vocabulary size %u); the ids do not come from this tokenizer",
                   i, ids[i], ids[i] >= t->vocab_size ? "out of range" : "not assigned to any token", t->vocab_size);
            goto done;
        }
        if (skip_special && t->special[ids[i]]) continue;
        pc[np].n = t->tok_len[ids[i]];
        pc[np].p = malloc(pc[np].n + 1);
        if (!pc[np].p) { seterr(err, errlen, "out of memory while decoding"); goto done; }
        memcpy(pc[np].p, t->tok[ids[i]], pc[np].n);
        np++;
    }
    for (int d = 0; d < t->n_dec; d++)
        if (run_decoder(t, &t->dec[d], pc, &np) != 0) { seterr(err, errlen, "out of memory while decoding"); goto done; }
    size_t tot = 0;
    for (size_t i = 0; i < np; i++) tot += pc[i].n;
    char *b = malloc(tot + 1);
    if (!b) { seterr(err, errlen, "out of memory while decoding"); goto done; }
    size_t m = 0;
    for (size_t i = 0; i < np; i++) { memcpy(b + m, pc[i].p, pc[i].n); m += pc[i].n; }
    b[m] = 0;
    *out = b; *out_len = m;
    rc = 0;
done:
    for (size_t i = 0; i < np; i++) free(pc[i].p);
    free(pc);
    return rc;
}

/* ---- queries ---- */

uint32_t tokenizer_vocab_size(const tokenizer_t *t) { return t->vocab_size; }
int64_t tokenizer_bos_id(const tokenizer_t *t) { return t->bos_id; }
int64_t tokenizer_eos_id(const tokenizer_t *t) { return t->eos_id; }
bool tokenizer_adds_bos(const tokenizer_t *t) { return t->adds_bos && t->bos_id >= 0; }
bool tokenizer_adds_eos(const tokenizer_t *t) { return t->adds_eos && t->eos_id >= 0; }
const char *tokenizer_kind(const tokenizer_t *t) { return t->kind; }

int64_t tokenizer_token_id(const tokenizer_t *t, const char *token) {
    size_t l = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == l && memcmp(t->added[i].content, token, l) == 0) return t->added[i].id;
    return strmap_get(&t->vocab, token, l);
}

const char *tokenizer_id_token(const tokenizer_t *t, uint32_t id) {
    return id < t->vocab_size ? t->tok[id] : NULL;
}

bool tokenizer_is_special(const tokenizer_t *t, uint32_t id) {
    return id < t->vocab_size && t->special[id];
}

void tokenizer_free(tokenizer_t *t) {
    if (!t) return;
    pthread_mutex_lock(&t->tls_lock);
    for (tok_tls_t *s = t->tls_list, *nx; s; s = nx) { nx = s->next_tls; tls_free(s); }
    t->tls_list = NULL;
    pthread_mutex_unlock(&t->tls_lock);
    pthread_setspecific(t->key, NULL);
    pthread_key_delete(t->key);
    pthread_mutex_destroy(&t->tls_lock);
    if (t->tok) for (uint32_t i = 0; i < t->vocab_size; i++) free(t->tok[i]);
    free(t->tok); free(t->tok_len); free(t->special);
    strmap_free(&t->vocab);
    bpe_merges_free(&t->merges);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (size_t i = 0; i < t->n_retired; i++) free(t->retired[i]);
    free(t->retired);
    for (int i = 0; i < 256; i++) free(t->added_by_byte[i]);
    for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].a); free(t->norm[i].b); }
    for (int i = 0; i < t->n_dec; i++) { free(t->dec[i].a); free(t->dec[i].b); }
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    free(t);
}

/* ---- loading ---- */

typedef struct {
    tokenizer_t *t;
    const char *file;  /* tokenizer.json's path, for messages */
    char *err; size_t errlen;
} loader_t;

static int lerr(loader_t *L, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    seterr(L->err, L->errlen, "%s: %s", L->file, msg);
    return -1;
}

static const char *jstr(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jbool(const json_t *o, const char *k, bool dflt) {
    const json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

/* A {"String": s} or {"Regex": r} pattern; *is_regex tells which. */
static const char *jpattern(const json_t *o, bool *is_regex) {
    const json_t *p = json_object_get(o, "pattern");
    const char *s;
    if ((s = jstr(p, "String"))) { *is_regex = false; return s; }
    if ((s = jstr(p, "Regex"))) { *is_regex = true; return s; }
    return NULL;
}

static int compile_re(loader_t *L, const char *pat, size_t len, bool literal, int *idx) {
    tokenizer_t *t = L->t;
    if (t->n_re == TOK_MAX_STEPS) return lerr(L, "more than %d split patterns; not supported", TOK_MAX_STEPS);
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opt, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return lerr(L, "split regex /%s/ does not compile at offset %zu: %s", pat, (size_t)eo, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  /* without JIT, pcre2_match is used */
    t->re[t->n_re] = re;
    *idx = t->n_re++;
    return 0;
}

static int parse_normalizer(loader_t *L, const json_t *n) {
    tokenizer_t *t = L->t;
    if (json_is_null(n) || !n) return 0;
    const char *type = jstr(n, "type");
    if (!type) return lerr(L, "normalizer without a \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        const json_t *a = json_object_get(n, "normalizers");
        size_t i;
        json_t *v;
        if (!json_is_array(a)) return lerr(L, "normalizer Sequence without a \"normalizers\" array");
        json_array_foreach(a, i, v) if (parse_normalizer(L, v) != 0) return -1;
        return 0;
    }
    if (t->n_norm == TOK_MAX_STEPS) return lerr(L, "more than %d normalizers; not supported", TOK_MAX_STEPS);
    norm_t *nm = &t->norm[t->n_norm];
    if (strcmp(type, "Prepend") == 0) {
        const char *p = jstr(n, "prepend");
        if (!p) return lerr(L, "normalizer Prepend without a \"prepend\" string");
        nm->kind = NORM_PREPEND;
        nm->alen = strlen(p);
        nm->a = dupn(p, nm->alen);
    } else if (strcmp(type, "Replace") == 0) {
        bool rx = false;
        const char *p = jpattern(n, &rx), *c = jstr(n, "content");
        if (!p || !c) return lerr(L, "normalizer Replace needs a \"pattern\" and a \"content\"");
        if (rx) return lerr(L, "normalizer Replace with a Regex pattern is not supported (only String patterns)");
        if (!*p) return lerr(L, "normalizer Replace with an empty pattern");
        nm->kind = NORM_REPLACE;
        nm->alen = strlen(p); nm->a = dupn(p, nm->alen);
        nm->blen = strlen(c); nm->b = dupn(c, nm->blen);
    } else if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") || !strcmp(type, "NFKD")) {
        UErrorCode e = U_ZERO_ERROR;
        const char *why = icu_open();
        if (why) return lerr(L, "normalizer %s needs ICU: %s", type, why);
        nm->kind = NORM_UNICODE;
        nm->un = !strcmp(type, "NFC") ? g_icu.nfc(&e) : !strcmp(type, "NFD") ? g_icu.nfd(&e)
                 : !strcmp(type, "NFKC") ? g_icu.nfkc(&e) : g_icu.nfkd(&e);
        if (U_FAILURE(e) || !nm->un)
            return lerr(L, "normalizer %s: ICU has no %s data (%s); reinstall libicu%d", type, type,
                        g_icu.error_name(e), U_ICU_VERSION_MAJOR_NUM);
        t->n_norm++;
        return 0;
    } else {
        return lerr(L, "normalizer type \"%s\" is not supported (supported: Sequence, Prepend, Replace with a String "
                    "pattern, NFC, NFD, NFKC, NFKD); use a tokenizer without it", type);
    }
    t->n_norm++;
    return nm->a ? 0 : lerr(L, "out of memory");
}

static int parse_prepend(loader_t *L, const json_t *o, prepend_t *out) {
    const char *s = jstr(o, "prepend_scheme");
    if (!s) { *out = jbool(o, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER; return 0; }
    if (strcmp(s, "always") == 0) *out = PREPEND_ALWAYS;
    else if (strcmp(s, "first") == 0) *out = PREPEND_FIRST;
    else if (strcmp(s, "never") == 0) *out = PREPEND_NEVER;
    else return lerr(L, "Metaspace prepend_scheme \"%s\" is unknown (always, first or never)", s);
    return 0;
}

static int parse_pre(loader_t *L, const json_t *n) {
    tokenizer_t *t = L->t;
    if (json_is_null(n) || !n) return 0;
    const char *type = jstr(n, "type");
    if (!type) return lerr(L, "pre_tokenizer without a \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        const json_t *a = json_object_get(n, "pretokenizers");
        size_t i;
        json_t *v;
        if (!json_is_array(a)) return lerr(L, "pre_tokenizer Sequence without a \"pretokenizers\" array");
        json_array_foreach(a, i, v) if (parse_pre(L, v) != 0) return -1;
        return 0;
    }
    if (t->n_pre == TOK_MAX_STEPS) return lerr(L, "more than %d pre-tokenizers; not supported", TOK_MAX_STEPS);
    pre_t *p = &t->pre[t->n_pre];
    p->re = -1;
    if (strcmp(type, "Split") == 0) {
        bool rx = false;
        const char *pat = jpattern(n, &rx), *beh = jstr(n, "behavior");
        if (!pat || !*pat) return lerr(L, "pre_tokenizer Split without a non-empty String or Regex \"pattern\"");
        static const char *const names[] = { "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous" };
        int b = -1;
        for (int i = 0; beh && i < 5; i++) if (strcmp(beh, names[i]) == 0) b = i;
        if (b < 0) return lerr(L, "pre_tokenizer Split behavior \"%s\" is unknown (Removed, Isolated, MergedWithPrevious, "
                               "MergedWithNext, Contiguous)", beh ? beh : "(missing)");
        p->kind = PRE_SPLIT;
        p->behavior = (split_t)b;
        p->invert = jbool(n, "invert", false);
        if (compile_re(L, pat, strlen(pat), !rx, &p->re) != 0) return -1;
    } else if (strcmp(type, "ByteLevel") == 0) {
        p->kind = PRE_BYTELEVEL;
        p->add_prefix_space = jbool(n, "add_prefix_space", true);
        if (jbool(n, "use_regex", true) && compile_re(L, GPT2_REGEX, strlen(GPT2_REGEX), false, &p->re) != 0) return -1;
        t->byte_level = true;
    } else if (strcmp(type, "Metaspace") == 0) {
        const char *r = jstr(n, "replacement");
        if (!r || !*r || strlen(r) >= sizeof p->rep) return lerr(L, "pre_tokenizer Metaspace needs a one-character \"replacement\"");
        p->kind = PRE_METASPACE;
        p->rep_len = strlen(r);
        memcpy(p->rep, r, p->rep_len);
        p->split = jbool(n, "split", true);
        if (parse_prepend(L, n, &p->prepend) != 0) return -1;
    } else {
        return lerr(L, "pre_tokenizer type \"%s\" is not supported (supported: Sequence, Split, ByteLevel, Metaspace); "
                    "use a tokenizer without it", type);
    }
    t->n_pre++;
    return 0;
}

static int parse_decoder(loader_t *L, const json_t *n) {
    tokenizer_t *t = L->t;
    if (json_is_null(n) || !n) return 0;
    const char *type = jstr(n, "type");
    if (!type) return lerr(L, "decoder without a \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        const json_t *a = json_object_get(n, "decoders");
        size_t i;
        json_t *v;
        if (!json_is_array(a)) return lerr(L, "decoder Sequence without a \"decoders\" array");
        json_array_foreach(a, i, v) if (parse_decoder(L, v) != 0) return -1;
        return 0;
    }
    if (t->n_dec == TOK_MAX_STEPS) return lerr(L, "more than %d decoders; not supported", TOK_MAX_STEPS);
    dec_t *d = &t->dec[t->n_dec];
    if (strcmp(type, "ByteLevel") == 0) d->kind = DEC_BYTELEVEL;
    else if (strcmp(type, "ByteFallback") == 0) d->kind = DEC_BYTEFALLBACK;
    else if (strcmp(type, "Fuse") == 0) d->kind = DEC_FUSE;
    else if (strcmp(type, "Replace") == 0) {
        bool rx = false;
        const char *p = jpattern(n, &rx), *c = jstr(n, "content");
        if (!p || !*p || !c || rx) return lerr(L, "decoder Replace needs a non-empty String \"pattern\" and a \"content\"");
        d->kind = DEC_REPLACE;
        d->alen = strlen(p); d->a = dupn(p, d->alen);
        d->blen = strlen(c); d->b = dupn(c, d->blen);
        if (!d->a || !d->b) return lerr(L, "out of memory");
    } else if (strcmp(type, "Strip") == 0) {
        const char *c = jstr(n, "content");
        const json_t *a = json_object_get(n, "start"), *b = json_object_get(n, "stop");
        if (!c || !*c || !json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 || json_integer_value(b) < 0)
            return lerr(L, "decoder Strip needs a \"content\" character and non-negative \"start\" and \"stop\"");
        d->kind = DEC_STRIP;
        d->alen = strlen(c); d->a = dupn(c, d->alen);
        d->start = (int)json_integer_value(a); d->stop = (int)json_integer_value(b);
        if (!d->a) return lerr(L, "out of memory");
    } else if (strcmp(type, "Metaspace") == 0) {
        const char *r = jstr(n, "replacement");
        if (!r || !*r) return lerr(L, "decoder Metaspace needs a \"replacement\"");
        d->kind = DEC_METASPACE;
        d->alen = strlen(r); d->a = dupn(r, d->alen);
        if (!d->a || parse_prepend(L, n, &d->prepend) != 0) return -1;
    } else {
        return lerr(L, "decoder type \"%s\" is not supported (supported: Sequence, ByteLevel, Metaspace, Replace, "
                    "ByteFallback, Fuse, Strip); use a tokenizer without it", type);
    }
    t->n_dec++;
    return 0;
}

/* The id of a special token named in a template ("special_tokens": {name: {"ids": [id]}}). */
static int64_t template_id(const json_t *pp, const char *name) {
    const json_t *ids = json_object_get(json_object_get(json_object_get(pp, "special_tokens"), name), "ids");
    const json_t *v = json_array_get(ids, 0);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* BOS/EOS from a post-processor: a template's special tokens before and after $A. */
static int parse_post(loader_t *L, const json_t *pp, int64_t *bos, int64_t *eos) {
    if (!pp || json_is_null(pp)) return 0;
    const char *type = jstr(pp, "type");
    if (!type) return lerr(L, "post_processor without a \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(pp, "processors"), i, v) if (parse_post(L, v, bos, eos) != 0) return -1;
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) return 0;
    if (strcmp(type, "TemplateProcessing") == 0) {
        const json_t *single = json_object_get(pp, "single");
        size_t i;
        json_t *v;
        bool seen_a = false;
        if (!json_is_array(single)) return lerr(L, "post_processor TemplateProcessing without a \"single\" template");
        json_array_foreach(single, i, v) {
            if (json_object_get(v, "Sequence")) { seen_a = true; continue; }
            const char *id = jstr(json_object_get(v, "SpecialToken"), "id");
            if (!id) continue;
            int64_t x = template_id(pp, id);
            if (x < 0) return lerr(L, "post_processor template names special token \"%s\" without ids", id);
            if (!seen_a && *bos < 0) *bos = x;
            if (seen_a && *eos < 0) *eos = x;
        }
        return 0;
    }
    if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
        const json_t *c = json_array_get(json_object_get(pp, "cls"), 1), *s = json_array_get(json_object_get(pp, "sep"), 1);
        if (json_is_integer(c)) *bos = json_integer_value(c);
        if (json_is_integer(s)) *eos = json_integer_value(s);
        return 0;
    }
    return lerr(L, "post_processor type \"%s\" is not supported (supported: TemplateProcessing, ByteLevel, Sequence, "
                "RobertaProcessing, BertProcessing)", type);
}

/* bos_token/eos_token of tokenizer_config.json: a string or {"content": s}. */
static const char *config_token(const json_t *cfg, const char *k) {
    const json_t *v = json_object_get(cfg, k);
    if (json_is_string(v)) return json_string_value(v);
    return jstr(v, "content");
}

static int set_token(loader_t *L, uint32_t id, const char *s, size_t len) {
    tokenizer_t *t = L->t;
    if (id >= t->vocab_size) return lerr(L, "internal: id %u beyond the vocabulary", id);
    if (t->tok[id]) {
        /* an added token over a vocabulary entry: the vocab map's key is
         * this string, so it is kept (and kept alive when it differs) */
        if (t->tok_len[id] == len && memcmp(t->tok[id], s, len) == 0) return 0;
        char **r = realloc(t->retired, (t->n_retired + 1) * sizeof *r);
        if (!r) return lerr(L, "out of memory");
        t->retired = r;
        t->retired[t->n_retired++] = t->tok[id];
        t->tok[id] = NULL;
    }
    t->tok[id] = dupn(s, len);
    t->tok_len[id] = (uint32_t)len;
    return t->tok[id] ? 0 : lerr(L, "out of memory");
}

/* The GPT-2 byte <-> character map: printable Latin-1 bytes stand for
 * themselves, the others for U+0100 onwards in byte order. */
static void byte_level_map(tokenizer_t *t) {
    int n = 0;
    for (int i = 0; i < (int)(sizeof t->chr_byte / sizeof t->chr_byte[0]); i++) t->chr_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = keep ? (uint32_t)b : 256u + (uint32_t)n++;
        t->byte_chr_len[b] = (uint8_t)utf8_put(cp, t->byte_chr[b]);
        t->chr_byte[cp] = (int16_t)b;
    }
}

static int cmp_added_len(const void *a, const void *b, void *ctx) {
    const added_t *ad = ctx;
    size_t la = ad[*(const uint32_t *)a].len, lb = ad[*(const uint32_t *)b].len;
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static int load_model(loader_t *L, const json_t *model) {
    tokenizer_t *t = L->t;
    const char *type = jstr(model, "type");
    const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!type && json_is_array(merges)) type = "BPE";
    if (!type) return lerr(L, "model without a \"type\"");
    if (strcmp(type, "BPE") != 0)
        return lerr(L, "model type \"%s\" is not supported (only BPE: byte-level as in GPT-2/Llama 3/Qwen, or "
                    "SentencePiece-style as in Llama 2/Mistral)", type);
    if (!json_is_object(vocab) || !json_is_array(merges)) return lerr(L, "BPE model needs a \"vocab\" object and a \"merges\" array");
    const json_t *dr = json_object_get(model, "dropout");
    if (json_is_number(dr) && json_number_value(dr) > 0)
        return lerr(L, "BPE dropout %g is not supported (it makes encoding random); set it to null", json_number_value(dr));
    const char *cs = jstr(model, "continuing_subword_prefix"), *ew = jstr(model, "end_of_word_suffix");
    if ((cs && *cs) || (ew && *ew))
        return lerr(L, "BPE continuing_subword_prefix / end_of_word_suffix are not supported");
    t->ignore_merges = jbool(model, "ignore_merges", false);
    t->byte_fallback = jbool(model, "byte_fallback", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);
    return 0;
}

tokenizer_t *tokenizer_load(const char *path, char *err, size_t errlen) {
    if (!path || !*path) { seterr(err, errlen, "no tokenizer path given; name a tokenizer.json or its directory"); return NULL; }
    char file[4096], cfgfile[4096];
    struct stat sb;
    if (stat(path, &sb) != 0) {
        seterr(err, errlen, "%s: %s; name a tokenizer.json file or a directory holding one", path, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(sb.st_mode)) snprintf(file, sizeof file, "%s/tokenizer.json", path);
    else snprintf(file, sizeof file, "%s", path);
    snprintf(cfgfile, sizeof cfgfile, "%s", file);
    char *slash = strrchr(cfgfile, '/');
    if (slash) snprintf(slash + 1, sizeof cfgfile - (size_t)(slash + 1 - cfgfile), "tokenizer_config.json");
    else snprintf(cfgfile, sizeof cfgfile, "tokenizer_config.json");

    json_error_t je;
    json_t *root = json_load_file(file, JSON_ALLOW_NUL, &je);
    if (!root) {
        if (stat(file, &sb) != 0)
            seterr(err, errlen, "%s: %s; the directory needs a Hugging Face tokenizer.json", file, strerror(errno));
        else
            seterr(err, errlen, "%s: not valid JSON at line %d column %d: %s", file, je.line, je.column, je.text);
        return NULL;
    }
    json_t *cfg = NULL;
    if (stat(cfgfile, &sb) == 0) {
        cfg = json_load_file(cfgfile, JSON_DECODE_INT_AS_REAL, &je);  /* model_max_length can be 1e30 */
        if (!cfg || !json_is_object(cfg)) {
            seterr(err, errlen, "%s: not a JSON object (line %d: %s); fix or remove it", cfgfile, cfg ? 0 : je.line,
                   cfg ? "not an object" : je.text);
            json_decref(root); json_decref(cfg);
            return NULL;
        }
    }
    tokenizer_t *t = calloc(1, sizeof *t);
    if (!t) { json_decref(root); json_decref(cfg); seterr(err, errlen, "out of memory"); return NULL; }
    loader_t L = { t, file, err, errlen };
    t->unk_id = t->bos_id = t->eos_id = -1;
    pthread_mutex_init(&t->tls_lock, NULL);
    if (pthread_key_create(&t->key, tls_destroy) != 0) {
        pthread_mutex_destroy(&t->tls_lock);
        free(t); json_decref(root); json_decref(cfg);
        seterr(err, errlen, "pthread_key_create failed (too many tokenizers loaded at once?)");
        return NULL;
    }
    int rc = -1;
    const json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(root) || !json_is_object(model)) { lerr(&L, "no \"model\" object; is this a Hugging Face tokenizer.json?"); goto out; }
    if (load_model(&L, model) != 0) goto out;
    if (parse_normalizer(&L, json_object_get(root, "normalizer")) != 0) goto out;
    if (parse_pre(&L, json_object_get(root, "pre_tokenizer")) != 0) goto out;
    if (parse_decoder(&L, json_object_get(root, "decoder")) != 0) goto out;
    if (added && !json_is_array(added)) { lerr(&L, "\"added_tokens\" is not an array"); goto out; }

    /* vocabulary size: largest id + 1 over the model and the added tokens */
    int64_t maxid = -1;
    const char *k;
    json_t *v;
    size_t i;
    json_object_foreach((json_t *)vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX) {
            lerr(&L, "vocab entry \"%s\" has no valid id (a non-negative integer)", k); goto out;
        }
        if (json_integer_value(v) > maxid) maxid = json_integer_value(v);
    }
    json_array_foreach(added, i, v) {
        const json_t *id = json_object_get(v, "id");
        const char *c = jstr(v, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX || !c || !*c) {
            lerr(&L, "added_tokens[%zu] needs a non-empty \"content\" and a non-negative \"id\"", i); goto out;
        }
        if (json_integer_value(id) > maxid) maxid = json_integer_value(id);
    }
    if (maxid < 0) { lerr(&L, "empty vocabulary"); goto out; }
    t->vocab_size = (uint32_t)(maxid + 1);
    t->tok = calloc(t->vocab_size, sizeof *t->tok);
    t->tok_len = calloc(t->vocab_size, sizeof *t->tok_len);
    t->special = calloc(t->vocab_size, sizeof *t->special);
    if (!t->tok || !t->tok_len || !t->special || strmap_init(&t->vocab, json_object_size(vocab)) != 0) { lerr(&L, "out of memory"); goto out; }
    json_object_foreach((json_t *)vocab, k, v) {
        uint32_t id = (uint32_t)json_integer_value(v);
        if (t->tok[id]) { lerr(&L, "vocab id %u is given to both \"%s\" and \"%s\"", id, t->tok[id], k); goto out; }
        if (set_token(&L, id, k, strlen(k)) != 0) goto out;
        if (strmap_put(&t->vocab, t->tok[id], t->tok_len[id], id) != 0) { lerr(&L, "out of memory"); goto out; }
    }

    /* added tokens: their strings override the model's for decoding */
    t->added = calloc(json_array_size(added) + 1, sizeof *t->added);
    if (!t->added) { lerr(&L, "out of memory"); goto out; }
    json_array_foreach(added, i, v) {
        added_t *a = &t->added[t->n_added];
        const char *c = jstr(v, "content");
        a->len = strlen(c);
        a->content = dupn(c, a->len);
        a->id = (uint32_t)json_integer_value(json_object_get(v, "id"));
        a->special = jbool(v, "special", false);
        a->lstrip = jbool(v, "lstrip", false);
        a->rstrip = jbool(v, "rstrip", false);
        a->single_word = jbool(v, "single_word", false);
        if (!a->content) { lerr(&L, "out of memory"); goto out; }
        t->n_added++;
        if (set_token(&L, a->id, c, a->len) != 0) goto out;
        t->special[a->id] = a->special;
        unsigned char b0 = (unsigned char)c[0];
        uint32_t *nb = realloc(t->added_by_byte[b0], (t->n_added_by_byte[b0] + 1) * sizeof *nb);
        if (!nb) { lerr(&L, "out of memory"); goto out; }
        nb[t->n_added_by_byte[b0]++] = (uint32_t)(t->n_added - 1);
        t->added_by_byte[b0] = nb;
    }
    for (int b = 0; b < 256; b++)
        if (t->n_added_by_byte[b] > 1)
            qsort_r(t->added_by_byte[b], t->n_added_by_byte[b], sizeof(uint32_t), cmp_added_len, t->added);

    /* unk and byte fallback */
    const char *unk = jstr(model, "unk_token");
    if (unk) t->unk_id = strmap_get(&t->vocab, unk, strlen(unk));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        int64_t id = strmap_get(&t->vocab, name, 6);
        t->fallback_id[b] = id >= 0 ? (uint32_t)id : UINT32_MAX;
    }
    for (int c = 0; c < 128; c++) { char ch = (char)c; t->ascii_id[c] = strmap_get(&t->vocab, &ch, 1); }
    byte_level_map(t);
    if (t->byte_level)
        for (int b = 0; b < 256; b++) {
            int64_t id = strmap_get(&t->vocab, t->byte_chr[b], t->byte_chr_len[b]);
            if (id < 0) { lerr(&L, "byte-level vocabulary lacks the token for byte 0x%02X ('%s'); the file is not a byte-level BPE", b, t->byte_chr[b]); goto out; }
            t->byte_id[b] = (uint32_t)id;
        }

    /* merges: "left right" strings (before tokenizers 0.20) or [left, right] pairs */
    if (bpe_merges_init(&t->merges, json_array_size(merges)) != 0) { lerr(&L, "out of memory"); goto out; }
    char *cat = NULL;
    size_t catcap = 0;
    json_array_foreach(merges, i, v) {
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(v)) {
            a = json_string_value(v);
            const char *sp = strchr(a, ' ');
            if (!sp) { free(cat); lerr(&L, "merges[%zu] \"%s\" is not \"left right\"", i, a); goto out; }
            al = (size_t)(sp - a); b = sp + 1; bl = strlen(b);
        } else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
                   json_is_string(json_array_get(v, 1))) {
            a = json_string_value(json_array_get(v, 0)); al = strlen(a);
            b = json_string_value(json_array_get(v, 1)); bl = strlen(b);
        } else { free(cat); lerr(&L, "merges[%zu] is neither \"left right\" nor [left, right]", i); goto out; }
        if (reserve(&cat, &catcap, al + bl + 1) != 0) { free(cat); lerr(&L, "out of memory"); goto out; }
        memcpy(cat, a, al); memcpy(cat + al, b, bl);
        int64_t ia = strmap_get(&t->vocab, a, al), ib = strmap_get(&t->vocab, b, bl), io = strmap_get(&t->vocab, cat, al + bl);
        if (ia < 0 || ib < 0 || io < 0) {
            cat[al + bl] = 0;
            lerr(&L, "merges[%zu] (\"%.*s\" + \"%.*s\"): \"%s\" is not in the vocabulary; the file is inconsistent", i,
                 (int)al, a, (int)bl, b, ia < 0 ? "left" : ib < 0 ? "right" : cat);
            free(cat);
            goto out;
        }
        if (bpe_merges_put(&t->merges, (uint32_t)ia, (uint32_t)ib, (uint32_t)i, (uint32_t)io) < 0) { free(cat); lerr(&L, "out of memory"); goto out; }
    }
    free(cat);

    /* BOS/EOS: tokenizer_config.json first, then the post-processor's template */
    int64_t tb = -1, te = -1;
    if (parse_post(&L, json_object_get(root, "post_processor"), &tb, &te) != 0) goto out;
    const char *bs = config_token(cfg, "bos_token"), *es = config_token(cfg, "eos_token");
    t->bos_id = bs ? tokenizer_token_id(t, bs) : tb;
    t->eos_id = es ? tokenizer_token_id(t, es) : te;
    if (bs && t->bos_id < 0) { seterr(err, errlen, "%s: bos_token \"%s\" is not in the vocabulary of %s", cfgfile, bs, file); goto out; }
    if (es && t->eos_id < 0) { seterr(err, errlen, "%s: eos_token \"%s\" is not in the vocabulary of %s", cfgfile, es, file); goto out; }
    const json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
    t->adds_bos = json_is_boolean(ab) ? json_is_true(ab) : tb >= 0;
    t->adds_eos = json_is_boolean(ae) ? json_is_true(ae) : te >= 0;
    snprintf(t->kind, sizeof t->kind, "%s", t->byte_level ? "byte-level BPE" : t->byte_fallback ? "SentencePiece BPE" : "BPE");
    rc = 0;
out:
    json_decref(root);
    json_decref(cfg);
    if (rc != 0) { tokenizer_free(t); return NULL; }
    return t;
}
