/*
 * cmd_data_tokenize.c - `ballast data tokenize`: text or JSONL in, llm.c
 * token shards out, through a Hugging Face tokenizer (workers/data/
 * tokenizer.h).
 *
 * One document per text file or per JSONL line. The inputs are read in
 * windows of about 64 MiB; inside a window every thread encodes whole
 * documents (taken from a shared counter), and the main thread then writes
 * them in input order, so the output does not depend on the thread count. A
 * document goes to the validation split when the hash of its bytes falls
 * under --val-fraction (docs/data.md, "ballast data tokenize"), which no
 * thread count or input order changes either.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "log.h"
#include "options.h"
#include "workers/cli/cli.h"
#include "workers/data/data.h"
#include "workers/data/tokenizer.h"

#define WINDOW_BYTES (64u << 20)  /* input bytes encoded between two ordered writes */
#define MAX_THREADS 256

static const char *tk_tokenizer, *tk_out, *tk_field;
static double tk_val;
static int64_t tk_threads, tk_shard_tokens;
static int tk_bos, tk_eos;  /* 0 auto, 1 yes, 2 no */
static const opt_t TOK_OPTS[] = {
    { "tokenizer", OPT_STRING, NULL, 0, 0, NULL, "tokenizer.json or a directory holding it (and tokenizer_config.json)", &tk_tokenizer },
    { "out", OPT_STRING, NULL, 0, 0, NULL, "directory for train_NNNNNN.bin / val_NNNNNN.bin", &tk_out },
    { "jsonl-field", OPT_STRING, "text", 0, 0, NULL, "string field holding the document in .jsonl/.ndjson inputs", &tk_field },
    { "val-fraction", OPT_DOUBLE, "0", 0, 0.5, NULL, "share of documents (by content hash) for the validation split", &tk_val },
    { "threads", OPT_INT, "0", 0, MAX_THREADS, NULL, "encoding threads (0 = every online core)", &tk_threads },
    { "shard-tokens", OPT_INT, "100000000", 1024, 2147483647.0, NULL, "tokens per shard before a new one starts", &tk_shard_tokens },
    { "add-bos", OPT_ENUM, "auto", 0, 0, "auto|yes|no", "begin each document with BOS (auto: as the tokenizer config says)", &tk_bos },
    { "add-eos", OPT_ENUM, "auto", 0, 0, "auto|yes|no", "end each document with EOS (auto: as the tokenizer config says)", &tk_eos },
};
#define N_TOK (sizeof TOK_OPTS / sizeof TOK_OPTS[0])
static const char TOK_USAGE[] =
    "usage: ballast data tokenize --tokenizer PATH --out DIR [--jsonl-field text] [--val-fraction F] [--threads N] FILES...";

/* ---- inputs ---- */

typedef struct {
    const char *path;
    const char *map; size_t len;  /* the file, mapped read-only */
    bool jsonl;
} input_t;

typedef struct {
    int file;            /* index into inputs */
    size_t line;         /* JSONL: 1-based line number; 0 for a text file */
    const char *p; size_t n;  /* the raw bytes (a JSONL line without its newline) */
    uint32_t *ids; size_t nids, cap;
    char *err;           /* malloc'd message when the document failed */
    bool val;            /* in the validation split */
} doc_t;

static bool is_val(const char *p, size_t n);

typedef struct {
    const tokenizer_t *tok;
    const input_t *in;
    doc_t *docs; size_t ndocs;
    atomic_size_t next;
    atomic_size_t done_bytes;
    atomic_size_t done_tokens;
} work_t;

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* The document's text: the bytes of a text file, the field of a JSONL line. */
static void encode_doc(const work_t *w, doc_t *d) {
    char err[1024];
    const char *text = d->p;
    size_t len = d->n;
    json_t *o = NULL;
    if (w->in[d->file].jsonl) {
        json_error_t je;
        o = json_loadb(d->p, d->n, 0, &je);
        const json_t *f = json_is_object(o) ? json_object_get(o, tk_field) : NULL;
        if (!o || !json_is_object(o)) {
            snprintf(err, sizeof err, "%s:%zu: %s%s; each line must be one JSON object", w->in[d->file].path, d->line,
                     o ? "not a JSON object" : "not valid JSON: ", o ? "" : je.text);
            d->err = strdup(err);
            json_decref(o);
            return;
        }
        if (!json_is_string(f)) {
            snprintf(err, sizeof err, "%s:%zu: %s field \"%s\"; name the document's field with --jsonl-field",
                     w->in[d->file].path, d->line, f ? "non-string" : "no", tk_field);
            d->err = strdup(err);
            json_decref(o);
            return;
        }
        text = json_string_value(f);
        len = json_string_length(f);
    }
    d->val = is_val(text, len);
    if (tokenizer_encode(w->tok, text, len, &d->ids, &d->nids, &d->cap, err, sizeof err) != 0) {
        char m[1200];
        snprintf(m, sizeof m, "%s%s%.0zu: %s", w->in[d->file].path, d->line ? ":" : "", d->line, err);
        d->err = strdup(m);
    }
    json_decref(o);
}

static void *worker(void *arg) {
    work_t *w = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&w->next, 1);
        if (i >= w->ndocs) break;
        encode_doc(w, &w->docs[i]);
        atomic_fetch_add(&w->done_bytes, w->docs[i].n + 1);
        atomic_fetch_add(&w->done_tokens, w->docs[i].nids);
    }
    return NULL;
}

/* ---- shards ---- */

typedef struct {
    const char *dir, *split;  /* "train" / "val" */
    int version;              /* 1: uint16, 2: uint32 */
    int index;                /* number of the shard being written */
    FILE *f;
    char path[4096];
    int64_t n;                /* tokens in the open shard */
    int64_t total;            /* tokens of this split */
    size_t docs;
} shard_out_t;

static int shard_close(shard_out_t *s) {
    if (!s->f) return 0;
    int32_t hdr[3] = { DATA_MAGIC, s->version, (int32_t)s->n };
    char final[4096];
    snprintf(final, sizeof final, "%.*s", (int)(strlen(s->path) - 4), s->path);  /* strip ".tmp" */
    if (fseek(s->f, 0, SEEK_SET) != 0 || fwrite(hdr, sizeof hdr, 1, s->f) != 1 || fflush(s->f) != 0 ||
        fsync(fileno(s->f)) != 0 || fclose(s->f) != 0 || rename(s->path, final) != 0) {
        fprintf(stderr, "ballast data tokenize: writing %s failed: %s\n", final, strerror(errno));
        s->f = NULL;
        return -1;
    }
    s->f = NULL;
    printf("wrote %s: %lld tokens, version %d\n", final, (long long)s->n, s->version);
    return 0;
}

static int shard_put(shard_out_t *s, const uint32_t *ids, size_t n) {
    while (n) {
        if (!s->f) {
            snprintf(s->path, sizeof s->path, "%s/%s_%06d.bin.tmp", s->dir, s->split, s->index++);
            s->f = fopen(s->path, "w+b");
            static const char zero[DATA_HEADER_BYTES];
            if (!s->f || fwrite(zero, sizeof zero, 1, s->f) != 1) {
                fprintf(stderr, "ballast data tokenize: cannot write %s: %s; check --out\n", s->path, strerror(errno));
                return -1;
            }
            s->n = 0;
        }
        size_t k = n;
        if ((int64_t)k > tk_shard_tokens - s->n) k = (size_t)(tk_shard_tokens - s->n);
        int rc = 0;
        if (s->version == 1) {
            uint16_t buf[4096];
            for (size_t i = 0; i < k && rc == 0; i += 4096) {
                size_t m = k - i < 4096 ? k - i : 4096;
                for (size_t j = 0; j < m; j++) buf[j] = (uint16_t)ids[i + j];
                rc = fwrite(buf, 2, m, s->f) == m ? 0 : -1;
            }
        } else {
            rc = fwrite(ids, 4, k, s->f) == k ? 0 : -1;
        }
        if (rc != 0) { fprintf(stderr, "ballast data tokenize: writing %s failed: %s\n", s->path, strerror(errno)); return -1; }
        s->n += (int64_t)k; s->total += (int64_t)k;
        ids += k; n -= k;
        if (s->n == tk_shard_tokens && shard_close(s) != 0) return -1;
    }
    return 0;
}

/* The split of a document: its text's 64-bit FNV-1a hash (for JSONL, the
 * field's UTF-8 string), finalized with
 * splitmix64's mixer, as a fraction of 2^64 (docs/data.md). */
static bool is_val(const char *p, size_t n) {
    if (tk_val <= 0) return false;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 0x100000001b3ULL; }
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return (double)(h >> 11) * 0x1.0p-53 < tk_val;
}

/* ---- progress ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void progress(bool tty, size_t done, size_t total, int64_t tokens, double t0, bool last) {
    static double last_t;
    double t = now_s(), el = t - t0;
    if (!last && t - last_t < (tty ? 0.1 : 5.0)) return;
    last_t = t;
    double frac = total ? (double)done / (double)total : 1.0, mbs = el > 0 ? done / el / 1e6 : 0, tps = el > 0 ? tokens / el : 0;
    double eta = frac > 0 && frac < 1 && !last ? el * (1 - frac) / frac : 0;  /* never "-0s" at the end */
    if (tty) {
        char bar[31];
        int k = (int)(frac * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < k ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r[%s] %5.1f%%  %.1f MB/s  %.2fM tokens/s  ETA %02d:%02d  ", bar, 100 * frac, mbs, tps / 1e6,
                (int)eta / 60, (int)eta % 60);
        if (last) fprintf(stderr, "\n");
    } else {
        fprintf(stderr, "tokenize: %.1f%% of %zu bytes, %lld tokens, %.1f MB/s, %.0f tokens/s, ETA %.0fs\n", 100 * frac,
                total, (long long)tokens, mbs, tps, eta);
    }
}

/* ---- the command ---- */

int cmd_data_tokenize(int argc, char **argv) {
    const char **pos = calloc((size_t)argc + 1, sizeof *pos);
    int npos = 0, rc = 1;
    char err[OPT_ERR_LEN + 512];
    if (!pos) return 1;
    int r = opt_parse(TOK_OPTS, N_TOK, argc, argv, pos, argc, &npos, TOK_USAGE, err, sizeof err);
    if (r != 0) {
        if (r < 0) fprintf(stderr, "ballast data: %s\n%s\n", err, TOK_USAGE);
        free(pos);
        return r == 1 ? 0 : 2;
    }
    if (!tk_tokenizer || !*tk_tokenizer || !tk_out || !*tk_out || npos == 0) {
        fprintf(stderr, "ballast data tokenize: --tokenizer PATH, --out DIR and at least one input file are required\n%s\n", TOK_USAGE);
        free(pos);
        return 2;
    }
    if (!tk_field || !*tk_field) { fprintf(stderr, "ballast data tokenize: --jsonl-field must name a field\n"); free(pos); return 2; }
    input_t *in = calloc((size_t)npos, sizeof *in);
    doc_t *docs = NULL;
    tokenizer_t *tok = NULL;
    shard_out_t tr = { 0 }, va = { 0 };
    size_t total = 0, cap_docs = 0;
    for (int i = 0; i < npos; i++) {  /* every input checked before any work */
        struct stat sb;
        int fd = open(pos[i], O_RDONLY);
        if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            fprintf(stderr, "ballast data tokenize: %s: %s; name readable text or JSONL files\n", pos[i],
                    fd < 0 ? strerror(errno) : "not a regular file");
            if (fd >= 0) close(fd);
            goto out;
        }
        in[i].path = pos[i];
        in[i].len = (size_t)sb.st_size;
        in[i].jsonl = ends_with(pos[i], ".jsonl") || ends_with(pos[i], ".ndjson");
        if (in[i].len) {
            in[i].map = mmap(NULL, in[i].len, PROT_READ, MAP_PRIVATE, fd, 0);
            if (in[i].map == MAP_FAILED) { in[i].map = NULL; fprintf(stderr, "ballast data tokenize: cannot map %s: %s\n", pos[i], strerror(errno)); close(fd); goto out; }
            madvise((void *)in[i].map, in[i].len, MADV_SEQUENTIAL);
        }
        close(fd);
        total += in[i].len;
    }
    tok = tokenizer_load(tk_tokenizer, err, sizeof err);
    if (!tok) { fprintf(stderr, "ballast data tokenize: %s\n", err); goto out; }
    if (mkdir(tk_out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "ballast data tokenize: cannot create --out %s: %s\n", tk_out, strerror(errno));
        goto out;
    }
    bool bos = tk_bos == 0 ? tokenizer_adds_bos(tok) : tk_bos == 1, eos = tk_eos == 0 ? tokenizer_adds_eos(tok) : tk_eos == 1;
    uint32_t bos_id = 0, eos_id = 0;
    if ((bos && tokenizer_bos_id(tok) < 0) || (eos && tokenizer_eos_id(tok) < 0)) {
        fprintf(stderr, "ballast data tokenize: %s: the tokenizer has no %s token; use --add-%s no\n", tk_tokenizer,
                bos && tokenizer_bos_id(tok) < 0 ? "BOS" : "EOS", bos && tokenizer_bos_id(tok) < 0 ? "bos" : "eos");
        goto out;
    }
    if (bos) bos_id = (uint32_t)tokenizer_bos_id(tok);
    if (eos) eos_id = (uint32_t)tokenizer_eos_id(tok);
    if (!bos && !eos)
        fprintf(stderr, "ballast data tokenize: warning: the tokenizer adds neither BOS nor EOS, so nothing separates "
                "documents in the shards; pass --add-eos yes (or --add-bos yes) to mark them\n");
    int version = tokenizer_vocab_size(tok) > 65536 ? 2 : 1;
    tr = (shard_out_t){ tk_out, "train", version, 0, NULL, "", 0, 0, 0 };
    va = (shard_out_t){ tk_out, "val", version, 0, NULL, "", 0, 0, 0 };
    int nthreads = tk_threads > 0 ? (int)tk_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    printf("tokenize: %d input file%s, %zu bytes, %s, vocabulary %u (shard version %d), BOS %s, EOS %s, %d thread%s, "
           "val fraction %g\n", npos, npos == 1 ? "" : "s", total, tokenizer_kind(tok), tokenizer_vocab_size(tok), version,
           bos ? "yes" : "no", eos ? "yes" : "no", nthreads, nthreads == 1 ? "" : "s", tk_val);
    fflush(stdout);

    bool tty = isatty(2);
    double t0 = now_s();
    size_t done_before = 0, empty = 0;
    int64_t tokens = 0;
    int f = 0;
    size_t off = 0, line = 0;
    while (f < npos) {
        /* gather one window of documents in input order */
        size_t nd = 0, wbytes = 0;
        while (f < npos && wbytes < WINDOW_BYTES) {
            if (nd == cap_docs) {
                size_t nc = cap_docs ? cap_docs * 2 : 1024;
                doc_t *p = realloc(docs, nc * sizeof *p);
                if (!p) { fprintf(stderr, "ballast data tokenize: out of memory\n"); goto out; }
                memset(p + cap_docs, 0, (nc - cap_docs) * sizeof *p);
                docs = p; cap_docs = nc;
            }
            doc_t *d = &docs[nd];
            d->file = f; d->err = NULL; d->nids = 0;
            if (!in[f].jsonl) {
                d->p = in[f].map; d->n = in[f].len; d->line = 0;
                f++; off = 0;
            } else {
                if (off >= in[f].len) { f++; off = 0; line = 0; continue; }
                const char *s = in[f].map + off, *nl = memchr(s, '\n', in[f].len - off);
                size_t l = nl ? (size_t)(nl - s) : in[f].len - off;
                off += l + 1; line++;
                size_t k = 0;
                while (k < l && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
                if (k == l) { wbytes += l + 1; continue; }  /* a blank line is no document */
                d->p = s; d->n = l; d->line = line;
            }
            wbytes += d->n + 1;
            nd++;
        }
        work_t w = { tok, in, docs, nd, 0, 0, 0 };
        pthread_t th[MAX_THREADS];
        int started = 0;
        for (int i = 1; i < nthreads && (size_t)i < nd; i++)
            if (pthread_create(&th[started], NULL, worker, &w) == 0) started++;
        for (;;) {  /* the main thread encodes too, and keeps the progress line fresh */
            size_t i = atomic_fetch_add(&w.next, 1);
            if (i >= nd) break;
            encode_doc(&w, &docs[i]);
            atomic_fetch_add(&w.done_bytes, docs[i].n + 1);
            atomic_fetch_add(&w.done_tokens, docs[i].nids);
            progress(tty, done_before + atomic_load(&w.done_bytes), total, tokens + (int64_t)atomic_load(&w.done_tokens),
                     t0, false);
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        /* write in input order */
        for (size_t i = 0; i < nd; i++) {
            doc_t *d = &docs[i];
            if (d->err) { fprintf(stderr, "ballast data tokenize: %s\n", d->err); goto out; }
            if (d->nids == 0) { empty++; continue; }
            shard_out_t *s = d->val ? &va : &tr;
            if ((bos && shard_put(s, &bos_id, 1) != 0) || shard_put(s, d->ids, d->nids) != 0 ||
                (eos && shard_put(s, &eos_id, 1) != 0))
                goto out;
            s->docs++;
            tokens += (int64_t)(d->nids + bos + eos);
        }
        done_before += wbytes;
        progress(tty, done_before, total, tokens, t0, false);
    }
    if (shard_close(&tr) != 0 || shard_close(&va) != 0) goto out;
    progress(tty, total, total, tokens, t0, true);
    double el = now_s() - t0;
    printf("tokenize: %zu documents (%zu train, %zu val; %zu empty, skipped), %lld tokens (%lld train, %lld val), "
           "%zu train and %d val shards in %s, %.1f s, %.0f tokens/s\n", tr.docs + va.docs + empty, tr.docs, va.docs,
           empty, (long long)tokens, (long long)tr.total, (long long)va.total, (size_t)tr.index, va.index, tk_out, el,
           el > 0 ? tokens / el : 0.0);
    if (tk_val > 0 && va.docs == 0)
        fprintf(stderr, "ballast data tokenize: warning: no document fell into the validation split; raise --val-fraction\n");
    if (tr.docs == 0) { fprintf(stderr, "ballast data tokenize: no document produced a token; check the inputs\n"); goto out; }
    rc = 0;
out:
    if (rc != 0) {  /* leave no partial shards behind */
        shard_out_t *ss[2] = { &tr, &va };
        for (int k = 0; k < 2; k++) {
            if (ss[k]->f) { fclose(ss[k]->f); unlink(ss[k]->path); ss[k]->f = NULL; }
            for (int i = 0; i < ss[k]->index; i++) {
                char p[4096];
                snprintf(p, sizeof p, "%s/%s_%06d.bin", ss[k]->dir, ss[k]->split, i);
                unlink(p);
            }
        }
    }
    for (size_t i = 0; i < cap_docs; i++) { free(docs[i].ids); free(docs[i].err); }
    free(docs);
    for (int i = 0; i < npos; i++) if (in && in[i].map) munmap((void *)in[i].map, in[i].len);
    free(in);
    tokenizer_free(tok);
    free(pos);
    return rc;
}
