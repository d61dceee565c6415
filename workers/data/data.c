/*
 * data.c - llm.c-format token shards, the batch loader and the synthetic
 * Markov corpus. See data.h for the API and docs/data.md for the byte
 * layout, the sequential/shuffled formulas and the generator.
 *
 * Shards are mmap'ed read-only and concatenated (sorted glob order) into one
 * stream of data_num_tokens() tokens. Nothing here keeps a cursor: every
 * batch is recomputed from its coordinates, which is what makes resume and
 * data parallelism exact.
 */
#include "workers/data/data.h"
#include "errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *path;            /* as matched by glob */
    const uint8_t *map;    /* whole file, read-only; NULL when size == 0 */
    size_t size;           /* file size, bytes */
    int version;           /* 1 = uint16 tokens, 2 = uint32 tokens */
    int64_t n_tokens;      /* header[2] */
    int64_t first;         /* global index of this shard's token 0 */
} shard_t;

struct data {
    shard_t *shards;       /* (n_shards) */
    int n_shards;
    int64_t n_tokens;      /* sum over shards */
};


static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint32_t shard_tok(const shard_t *s, int64_t i) {
    const uint8_t *p = s->map + DATA_HEADER_BYTES;
    if (s->version == 1) return (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
    return rd32(p + 4 * i);
}

/* ---- opening ---- */

/* Map one shard and validate its header and, if vocab > 0, every token. */
static int shard_open(shard_t *s, const char *path, int vocab, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->path = strdup(path);
    if (!s->path) return errbuf_set(err, errlen, "%s: out of memory", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errbuf_set(err, errlen, "%s: cannot open token shard: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) { int e = errno; close(fd); return errbuf_set(err, errlen, "%s: stat: %s", path, strerror(e)); }
    if (!S_ISREG(st.st_mode)) { close(fd); return errbuf_set(err, errlen, "%s: not a regular file; pass a shard file or a glob of them", path); }
    s->size = (size_t)st.st_size;
    if (s->size < DATA_HEADER_BYTES) {
        close(fd);
        return errbuf_set(err, errlen, "%s: file is %zu bytes, shorter than the %d-byte shard header; "
                    "the file is truncated or not a token shard (write one with `ballast data pack`)",
                    path, s->size, DATA_HEADER_BYTES);
    }
    void *m = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return errbuf_set(err, errlen, "%s: mmap: %s", path, strerror(e));
    s->map = m;
    int32_t magic = (int32_t)rd32(s->map), version = (int32_t)rd32(s->map + 4), count = (int32_t)rd32(s->map + 8);
    if (magic != DATA_MAGIC)
        return errbuf_set(err, errlen, "%s: wrong magic %d in header[0] (expected %d): not an llm.c token shard; "
                    "wrap raw tokens with `ballast data pack`", path, magic, DATA_MAGIC);
    if (version != 1 && version != 2)
        return errbuf_set(err, errlen, "%s: unknown shard version %d in header[1] (expected 1 = uint16 tokens or "
                    "2 = uint32 tokens); rewrite it with `ballast data pack`", path, version);
    s->version = version;
    if (count <= 0)
        return errbuf_set(err, errlen, "%s: header[2] says %d tokens; a shard needs at least one token "
                    "(remove the file or regenerate it)", path, count);
    s->n_tokens = count;
    size_t tsz = version == 1 ? 2 : 4;
    size_t want = DATA_HEADER_BYTES + (size_t)count * tsz;
    if (s->size < want)
        return errbuf_set(err, errlen, "%s: truncated: header says %d tokens (%zu bytes of %s) but only %zu bytes "
                    "follow the header; re-copy or regenerate the shard", path, count, (size_t)count * tsz,
                    version == 1 ? "uint16" : "uint32", s->size - DATA_HEADER_BYTES);
    if (s->size > want)
        return errbuf_set(err, errlen, "%s: %zu trailing bytes after the %d tokens the header announces "
                    "(file %zu bytes, expected %zu); the token count in header[2] is wrong or the file was "
                    "appended to; regenerate the shard", path, s->size - want, count, s->size, want);
    if (vocab > 0) {
        for (int64_t i = 0; i < s->n_tokens; i++) {
            uint32_t t = shard_tok(s, i);
            if (t >= (uint32_t)vocab)
                return errbuf_set(err, errlen, "%s: token %lld has id %u >= vocab size %d; the shard was made "
                            "for a larger vocabulary (use a model with vocab > %u or re-tokenize)",
                            path, (long long)i, t, vocab, t);
        }
    } else if (version == 2) {
        for (int64_t i = 0; i < s->n_tokens; i++) {
            uint32_t t = shard_tok(s, i);
            if (t > INT32_MAX)
                return errbuf_set(err, errlen, "%s: token %lld has id %u, beyond the int32 range token ids "
                            "must fit; re-tokenize", path, (long long)i, t);
        }
    }
    return 0;
}

static bool has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

int data_open(const char *file_or_glob, int vocab, data_t **out, char *err, size_t errlen) {
    *out = NULL;
    if (!file_or_glob || !*file_or_glob)
        return errbuf_set(err, errlen, "no token data given: pass --data FILE or a quoted glob like 'dir/*.bin'");
    glob_t g;
    memset(&g, 0, sizeof g);
    int gr = glob(file_or_glob, GLOB_ERR, NULL, &g);
    if (gr == GLOB_NOMATCH && has_glob_chars(file_or_glob) && access(file_or_glob, F_OK) == 0) {
        /* A file whose name merely contains glob characters. */
        gr = glob(file_or_glob, GLOB_ERR | GLOB_NOCHECK, NULL, &g);
    }
    if (gr == GLOB_NOMATCH || (gr == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        if (has_glob_chars(file_or_glob))
            return errbuf_set(err, errlen, "%s: no file matches this glob; check the path and quote the glob "
                        "so the shell does not expand it", file_or_glob);
        return errbuf_set(err, errlen, "%s: cannot open token shard: %s; check the path given as --data "
                          "(`ballast data synth --out FILE` makes a test corpus)", file_or_glob, strerror(ENOENT));
    }
    if (gr != 0) {
        globfree(&g);
        if (gr == GLOB_ABORTED) {
            /* the directories before the first glob character: a missing one is the usual cause */
            char dir[4096];
            snprintf(dir, sizeof dir, "%s", file_or_glob);
            char *wild = strpbrk(dir, "*?[");
            if (wild) *wild = 0;
            char *sl = strrchr(dir, '/');
            if (sl) *(sl == dir ? sl + 1 : sl) = 0;
            else snprintf(dir, sizeof dir, ".");
            struct stat st;
            if (stat(dir, &st) != 0)
                return errbuf_set(err, errlen, "%s: the directory %s does not exist (%s); check the path given as "
                                  "--data", file_or_glob, dir, strerror(errno));
            if (!S_ISDIR(st.st_mode))
                return errbuf_set(err, errlen, "%s: %s is not a directory; check the path given as --data",
                                  file_or_glob, dir);
            return errbuf_set(err, errlen, "%s: cannot read the directory %s (%s); check its permissions",
                              file_or_glob, dir, access(dir, R_OK | X_OK) ? strerror(errno) : "read error");
        }
        return errbuf_set(err, errlen, "%s: glob failed (%s)", file_or_glob,
                    gr == GLOB_NOSPACE ? "out of memory" : "read error");
    }
    data_t *d = calloc(1, sizeof *d);
    if (d) d->shards = calloc(g.gl_pathc, sizeof *d->shards);
    if (!d || !d->shards) { free(d); globfree(&g); return errbuf_set(err, errlen, "out of memory opening %s", file_or_glob); }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        d->n_shards++;
        if (shard_open(&d->shards[i], g.gl_pathv[i], vocab, err, errlen) != 0) {
            data_close(d);
            globfree(&g);
            return -1;
        }
        d->shards[i].first = d->n_tokens;
        d->n_tokens += d->shards[i].n_tokens;
    }
    globfree(&g);
    *out = d;
    return 0;
}

void data_close(data_t *d) {
    if (!d) return;
    for (int i = 0; i < d->n_shards; i++) {
        if (d->shards[i].map) munmap((void *)d->shards[i].map, d->shards[i].size);
        free(d->shards[i].path);
    }
    free(d->shards);
    free(d);
}

int64_t data_num_tokens(const data_t *d) { return d->n_tokens; }
int data_num_shards(const data_t *d) { return d->n_shards; }
const char *data_shard_path(const data_t *d, int i) { return i >= 0 && i < d->n_shards ? d->shards[i].path : NULL; }
int data_shard_version(const data_t *d, int i) { return i >= 0 && i < d->n_shards ? d->shards[i].version : 0; }
int64_t data_shard_tokens(const data_t *d, int i) { return i >= 0 && i < d->n_shards ? d->shards[i].n_tokens : 0; }

/* Index of the shard holding global token i (binary search on .first). */
static int shard_of(const data_t *d, int64_t i) {
    int lo = 0, hi = d->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->shards[mid].first <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
}

uint32_t data_token(const data_t *d, int64_t i) {
    const shard_t *s = &d->shards[shard_of(d, i)];
    return shard_tok(s, i - s->first);
}

/* Copy n tokens starting at global position pos (wrapping at the end). */
static void copy_tokens(const data_t *d, int64_t pos, int64_t n, int32_t *dst) {
    pos %= d->n_tokens;
    int si = shard_of(d, pos);
    int64_t off = pos - d->shards[si].first;
    for (int64_t k = 0; k < n; k++) {
        const shard_t *s = &d->shards[si];
        dst[k] = (int32_t)shard_tok(s, off);
        if (++off == s->n_tokens) {
            off = 0;
            si = (si + 1) % d->n_shards;
        }
    }
}

/* ---- the shuffled order ---- */

static inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A bijection on [0, n): a 4-round balanced Feistel network on the smallest
 * even number of bits 2h with 2^(2h) >= n, keyed by (seed, epoch), iterated
 * ("cycle walking") until the value lands in [0, n). Each step is a
 * bijection on [0, 2^(2h)), so the restriction to [0, n) is one too. */
static int64_t feistel_perm(uint64_t key, int64_t x, int64_t n) {
    int bits = 0;
    while (bits < 62 && ((int64_t)1 << bits) < n) bits++;
    int h = (bits + 1) / 2;
    if (h == 0) h = 1;
    uint64_t mask = ((uint64_t)1 << h) - 1;
    uint64_t v = (uint64_t)x;
    do {
        uint64_t l = v >> h, r = v & mask;
        for (int round = 0; round < 4; round++) {
            uint64_t f = splitmix64_mix(key ^ splitmix64_mix(r + ((uint64_t)round << 56))) & mask;
            uint64_t nl = r, nr = l ^ f;
            l = nl; r = nr;
        }
        v = l << h | r;
    } while (v >= (uint64_t)n);
    return (int64_t)v;
}

int64_t data_shuffle_window(uint64_t seed, int64_t idx, int64_t n_windows) {
    int64_t epoch = idx / n_windows, j = idx % n_windows;
    uint64_t key = splitmix64_mix(seed ^ splitmix64_mix((uint64_t)epoch + 0x9e3779b97f4a7c15ULL));
    return feistel_perm(key, j, n_windows);
}

int data_order_parse(const char *s, data_order_t *out) {
    if (s && strcmp(s, "sequential") == 0) { *out = DATA_SEQUENTIAL; return 0; }
    if (s && strcmp(s, "shuffled") == 0) { *out = DATA_SHUFFLED; return 0; }
    return -1;
}

/* ---- batches ---- */

int data_batch(const data_t *d, data_order_t order, uint64_t seed,
               int64_t step, int micro, int accum, int rank, int dp,
               int B, int T, int32_t *inputs, int32_t *targets,
               char *err, size_t errlen) {
    if (B <= 0 || T <= 0 || accum <= 0 || dp <= 0 || step < 0 || micro < 0 || micro >= accum || rank < 0 || rank >= dp)
        return errbuf_set(err, errlen, "data_batch: bad coordinates (step %lld, micro %d of %d, rank %d of %d, B %d, T %d)",
                    (long long)step, micro, accum, rank, dp, B, T);
    if (d->n_tokens < (int64_t)T + 1)
        return errbuf_set(err, errlen, "%s: the data has %lld tokens, fewer than seq-len + 1 = %d; use a larger "
                    "corpus or a shorter --seq-len", d->shards[0].path, (long long)d->n_tokens, T + 1);
    int32_t *row = malloc(((size_t)T + 1) * sizeof *row);
    if (!row) return errbuf_set(err, errlen, "data_batch: out of memory");
    int64_t n_windows = (d->n_tokens - 1) / T;
    int64_t first = ((step * accum + micro) * dp + rank) * (int64_t)B;  /* sample index of row 0 */
    for (int b = 0; b < B; b++) {
        int64_t idx = first + b, start;
        if (order == DATA_SEQUENTIAL)
            start = (int64_t)(((unsigned __int128)idx * (unsigned)T) % (unsigned __int128)d->n_tokens);
        else
            start = data_shuffle_window(seed, idx, n_windows) * T;
        copy_tokens(d, start, T + 1, row);
        memcpy(inputs + (size_t)b * T, row, (size_t)T * sizeof *row);
        memcpy(targets + (size_t)b * T, row + 1, (size_t)T * sizeof *row);
    }
    free(row);
    return 0;
}

/* ---- writing ---- */

/* Write buf to path atomically: path.tmp, fsync, rename. */
static int write_atomic(const char *path, const void *hdr, size_t hlen, const void *body, size_t blen,
                        char *err, size_t errlen) {
    size_t plen = strlen(path) + 8;
    char *tmp = malloc(plen);
    if (!tmp) return errbuf_set(err, errlen, "%s: out of memory", path);
    snprintf(tmp, plen, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { int e = errno; free(tmp); return errbuf_set(err, errlen, "%s: cannot create: %s", path, strerror(e)); }
    const void *parts[2] = { hdr, body };
    size_t lens[2] = { hlen, blen };
    for (int p = 0; p < 2; p++) {
        const uint8_t *q = parts[p];
        size_t left = lens[p];
        while (left > 0) {
            ssize_t w = write(fd, q, left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                int e = errno;
                close(fd); unlink(tmp); free(tmp);
                return errbuf_set(err, errlen, "%s: write failed: %s (disk full?)", path, strerror(e));
            }
            q += w; left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp); free(tmp);
        return errbuf_set(err, errlen, "%s: fsync/close failed: %s", path, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp); free(tmp);
        return errbuf_set(err, errlen, "%s: rename from %s.tmp failed: %s", path, path, strerror(e));
    }
    free(tmp);
    return 0;
}

int data_write_shard(const char *path, const uint32_t *tokens, int64_t n, bool force_u32, char *err, size_t errlen) {
    if (n <= 0) return errbuf_set(err, errlen, "%s: refusing to write a shard with %lld tokens (need at least one)", path, (long long)n);
    if (n > INT32_MAX)
        return errbuf_set(err, errlen, "%s: %lld tokens do not fit one shard (header[2] is int32, max %d); "
                    "split the data into several shards", path, (long long)n, INT32_MAX);
    uint32_t mx = 0;
    for (int64_t i = 0; i < n; i++) if (tokens[i] > mx) mx = tokens[i];
    if (mx > INT32_MAX) return errbuf_set(err, errlen, "%s: token id %u does not fit int32", path, mx);
    int version = (!force_u32 && mx < 65536) ? 1 : 2;
    size_t tsz = version == 1 ? 2 : 4;
    uint8_t hdr[DATA_HEADER_BYTES];
    memset(hdr, 0, sizeof hdr);
    uint32_t h3[3] = { DATA_MAGIC, (uint32_t)version, (uint32_t)n };
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++) hdr[4 * k + j] = (uint8_t)(h3[k] >> (8 * j));
    uint8_t *body = malloc((size_t)n * tsz);
    if (!body) return errbuf_set(err, errlen, "%s: out of memory for %lld tokens", path, (long long)n);
    for (int64_t i = 0; i < n; i++)
        for (size_t j = 0; j < tsz; j++) body[(size_t)i * tsz + j] = (uint8_t)(tokens[i] >> (8 * j));
    int rc = write_atomic(path, hdr, sizeof hdr, body, (size_t)n * tsz, err, errlen);
    free(body);
    return rc;
}

/* ---- synthetic corpus ---- */

/* The generator's random stream: splitmix64 (state += golden gamma, then
 * mix). Uniforms are the top 53 bits scaled to [0, 1). */
typedef struct { uint64_t s; } sm64_t;
static inline uint64_t sm64_next(sm64_t *r) { r->s += 0x9e3779b97f4a7c15ULL; return splitmix64_mix(r->s); }
static inline double sm64_unif(sm64_t *r) { return (double)(sm64_next(r) >> 11) * 0x1.0p-53; }

/* Build the chain: succ[s*K + j] and prob[s*K + j] (see docs/data.md).
 * Successor 0 of s is (s+1) mod V, successor 1 is (s+2) mod V (together
 * they make the chain irreducible and aperiodic), successors 2..K-1 are
 * drawn uniformly among the states not yet chosen for s. Probabilities are
 * Dirichlet(1,...,1): normalized -log(1 - u) draws. */
static void synth_chain(int V, int K, uint64_t seed, int32_t *succ, double *prob) {
    sm64_t r = { seed };
    for (int s = 0; s < V; s++) {
        int32_t *sc = succ + (size_t)s * K;
        sc[0] = (s + 1) % V;
        sc[1] = (s + 2) % V;
        for (int j = 2; j < K; j++) {
            for (;;) {
                int32_t c = (int32_t)(sm64_next(&r) % (uint64_t)V);
                bool dup = false;
                for (int q = 0; q < j; q++) if (sc[q] == c) dup = true;
                if (!dup) { sc[j] = c; break; }
            }
        }
        double *p = prob + (size_t)s * K, sum = 0;
        for (int j = 0; j < K; j++) { p[j] = -log(1.0 - sm64_unif(&r)); sum += p[j]; }
        for (int j = 0; j < K; j++) p[j] /= sum;
    }
}

/* Stationary distribution by power iteration of the lazy chain (I + P)/2,
 * which has the same stationary law and converges for any irreducible chain. */
static void synth_stationary(int V, int K, const int32_t *succ, const double *prob, double *pi) {
    double *nx = malloc((size_t)V * sizeof *nx);
    for (int s = 0; s < V; s++) pi[s] = 1.0 / V;
    for (int it = 0; it < 1000000; it++) {
        for (int s = 0; s < V; s++) nx[s] = 0.5 * pi[s];
        for (int s = 0; s < V; s++)
            for (int j = 0; j < K; j++) nx[succ[(size_t)s * K + j]] += 0.5 * pi[s] * prob[(size_t)s * K + j];
        double diff = 0, sum = 0;
        for (int s = 0; s < V; s++) { diff += fabs(nx[s] - pi[s]); sum += nx[s]; }
        for (int s = 0; s < V; s++) pi[s] = nx[s] / sum;
        if (diff < 1e-15) break;
    }
    free(nx);
}

/* The chain of (V, K, seed) with its stationary law and entropies. */
typedef struct {
    int V, K;
    int32_t *succ;         /* (V, K) successor ids */
    double *prob;          /* (V, K) transition probabilities */
    double *pi;            /* (V) stationary distribution */
    double h;              /* entropy rate, nats/token */
    double h0;             /* entropy of pi, nats */
} chain_t;

static void chain_free(chain_t *c) { free(c->succ); free(c->prob); free(c->pi); }

static int chain_build(chain_t *c, int vocab, uint64_t seed, int branching, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (vocab < 3 || vocab > (1 << 24))
        return errbuf_set(err, errlen, "synthetic vocab %d out of range [3, %d]", vocab, 1 << 24);
    if (branching < 2 || branching > vocab)
        return errbuf_set(err, errlen, "branching %d out of range [2, vocab = %d]", branching, vocab);
    int V = c->V = vocab, K = c->K = branching;
    c->succ = malloc((size_t)V * K * sizeof *c->succ);
    c->prob = malloc((size_t)V * K * sizeof *c->prob);
    c->pi = malloc((size_t)V * sizeof *c->pi);
    if (!c->succ || !c->prob || !c->pi) { chain_free(c); return errbuf_set(err, errlen, "out of memory"); }
    synth_chain(V, K, seed, c->succ, c->prob);
    synth_stationary(V, K, c->succ, c->prob, c->pi);
    for (int x = 0; x < V; x++) {
        double hx = 0;
        for (int j = 0; j < K; j++) { double p = c->prob[(size_t)x * K + j]; if (p > 0) hx -= p * log(p); }
        c->h += c->pi[x] * hx;
        if (c->pi[x] > 0) c->h0 -= c->pi[x] * log(c->pi[x]);
    }
    return 0;
}

int data_synth_entropy(int vocab, uint64_t seed, int branching, double *entropy_nats,
                       double *stationary_entropy_nats, char *err, size_t errlen) {
    chain_t c;
    if (chain_build(&c, vocab, seed, branching, err, errlen) != 0) return -1;
    if (entropy_nats) *entropy_nats = c.h;
    if (stationary_entropy_nats) *stationary_entropy_nats = c.h0;
    chain_free(&c);
    return 0;
}

int data_synth_k(const char *path, int64_t n_tokens, int vocab, uint64_t seed, int branching,
                 double *entropy_nats, char *err, size_t errlen) {
    if (n_tokens <= 0 || n_tokens > INT32_MAX)
        return errbuf_set(err, errlen, "synthetic corpus size %lld out of range [1, %d] tokens", (long long)n_tokens, INT32_MAX);
    chain_t ch;
    if (chain_build(&ch, vocab, seed, branching, err, errlen) != 0) return -1;
    int V = ch.V, K = ch.K;
    uint32_t *tok = malloc((size_t)n_tokens * sizeof *tok);
    if (!tok) {
        chain_free(&ch);
        return errbuf_set(err, errlen, "out of memory generating %lld tokens", (long long)n_tokens);
    }
    /* x0 ~ pi, then x_{t+1} ~ P(.|x_t), each by inverse CDF on one uniform
     * (the last successor takes the remainder), from a second stream seeded
     * with mix(seed ^ 0x5eed5eed5eed5eed). */
    sm64_t r = { splitmix64_mix(seed ^ 0x5eed5eed5eed5eedULL) };
    double u = sm64_unif(&r), c = 0;
    int x = V - 1;
    for (int s = 0; s < V; s++) { c += ch.pi[s]; if (u < c) { x = s; break; } }
    for (int64_t t = 0; t < n_tokens; t++) {
        tok[t] = (uint32_t)x;
        u = sm64_unif(&r);
        c = 0;
        int nx = ch.succ[(size_t)x * K + K - 1];
        for (int j = 0; j < K - 1; j++) {
            c += ch.prob[(size_t)x * K + j];
            if (u < c) { nx = ch.succ[(size_t)x * K + j]; break; }
        }
        x = nx;
    }
    int rc = data_write_shard(path, tok, n_tokens, false, err, errlen);
    if (rc == 0 && entropy_nats) *entropy_nats = ch.h;
    chain_free(&ch);
    free(tok);
    return rc;
}

int data_synth(const char *path, int64_t n_tokens, int vocab, uint64_t seed, double *entropy_nats, char *err, size_t errlen) {
    return data_synth_k(path, n_tokens, vocab, seed, DATA_SYNTH_DEFAULT_BRANCHING, entropy_nats, err, errlen);
}
