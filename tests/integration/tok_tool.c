/*
 * tok_tool.c - drives workers/data/tokenizer.h for the tokenizer tests and
 * the benchmark.
 *
 *   tok_tool info TOKENIZER
 *   tok_tool ids TOKENIZER TEXT             ids of TEXT, one line
 *   tok_tool encode TOKENIZER DOCS OUT [REF]
 *       DOCS: documents, each a little-endian uint32 byte length then the
 *       bytes; OUT: per document a uint32 count then the uint32 ids. Prints
 *       one line: docs, bytes, tokens, seconds, how many documents do not
 *       survive decode(encode(x)) == x byte for byte (each listed on stderr
 *       with the first differing offset) and, given REF (ids in OUT's
 *       format, from the reference encoder), how many documents' ids differ
 *       from REF's (each listed with the input position and both id
 *       sequences around the first difference). DOCS.names (DOCS with
 *       .names for .docs), when present, names the documents.
 *   tok_tool decode TOKENIZER IDS OUT
 *       IDS in encode's OUT format; OUT: the decoded documents in DOCS's
 *       format (special tokens kept).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workers/data/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    *len = (size_t)n;
    return b;
}

int main(int argc, char **argv) {
    char err[1024];
    if (argc < 3) { fprintf(stderr, "usage: tok_tool info|ids|encode|decode TOKENIZER ...\n"); return 2; }
    tokenizer_t *t = tokenizer_load(argv[2], err, sizeof err);
    if (!t) { fprintf(stderr, "tok_tool: %s\n", err); return 1; }
    int rc = 0;
    if (strcmp(argv[1], "info") == 0) {
        printf("kind=%s vocab=%u bos=%lld eos=%lld adds_bos=%d adds_eos=%d\n", tokenizer_kind(t), tokenizer_vocab_size(t),
               (long long)tokenizer_bos_id(t), (long long)tokenizer_eos_id(t), tokenizer_adds_bos(t), tokenizer_adds_eos(t));
    } else if (strcmp(argv[1], "ids") == 0 && argc == 4) {
        uint32_t *ids = NULL;
        size_t n = 0, cap = 0;
        if (tokenizer_encode(t, argv[3], strlen(argv[3]), &ids, &n, &cap, err, sizeof err) != 0) {
            fprintf(stderr, "tok_tool: %s\n", err); rc = 1;
        } else {
            for (size_t i = 0; i < n; i++) printf("%s%u", i ? " " : "", ids[i]);
            printf("\n");
            char *d; size_t dl;
            if (tokenizer_decode(t, ids, n, false, &d, &dl, err, sizeof err) == 0) { printf("%s\n", d); free(d); }
        }
        free(ids);
    } else if (strcmp(argv[1], "decode") == 0 && argc == 5) {
        size_t len;
        char *in = slurp(argv[3], &len);
        FILE *out = fopen(argv[4], "wb");
        if (!in || !out) { fprintf(stderr, "tok_tool: cannot read %s or write %s\n", argv[3], argv[4]); return 1; }
        for (size_t off = 0; off + 4 <= len;) {
            uint32_t n;
            memcpy(&n, in + off, 4);
            off += 4;
            if ((size_t)n > (len - off) / 4) { fprintf(stderr, "tok_tool: %s is truncated\n", argv[3]); rc = 1; break; }
            uint32_t *ids = malloc(4 * (size_t)n + 4);
            memcpy(ids, in + off, 4 * (size_t)n);
            off += 4 * (size_t)n;
            char *d; size_t dl;
            if (tokenizer_decode(t, ids, n, false, &d, &dl, err, sizeof err) != 0) {
                fprintf(stderr, "tok_tool: decode: %s\n", err); free(ids); rc = 1; break;
            }
            uint32_t d32 = (uint32_t)dl;
            fwrite(&d32, 4, 1, out);
            fwrite(d, 1, dl, out);
            free(d); free(ids);
        }
        fclose(out);
        free(in);
    } else if (strcmp(argv[1], "encode") == 0 && (argc == 5 || argc == 6)) {
        size_t len, rlen = 0, roff = 0, ndiff = 0;
        char *docs = slurp(argv[3], &len), *ref = argc == 6 ? slurp(argv[5], &rlen) : NULL;
        if (argc == 6 && !ref) { fprintf(stderr, "tok_tool: cannot read %s\n", argv[5]); return 1; }
        char names_path[4096], *names = NULL, *name_at = NULL;
        snprintf(names_path, sizeof names_path, "%.*s.names", (int)(strlen(argv[3]) > 5 ? strlen(argv[3]) - 5 : 0), argv[3]);
        size_t names_len;
        names = slurp(names_path, &names_len);
        name_at = names;
        FILE *out = fopen(argv[4], "wb");
        if (!docs || !out) { fprintf(stderr, "tok_tool: cannot read %s or write %s\n", argv[3], argv[4]); return 1; }
        uint32_t *ids = NULL;
        size_t cap = 0, ndoc = 0, bytes = 0, tokens = 0, bad = 0;
        double enc_s = 0;
        for (size_t off = 0; off + 4 <= len;) {
            uint32_t dl;
            memcpy(&dl, docs + off, 4);
            off += 4;
            if (dl > len - off) { fprintf(stderr, "tok_tool: %s: document %zu is truncated\n", argv[3], ndoc); rc = 1; break; }
            size_t n = 0;
            double t0 = now();
            if (tokenizer_encode(t, docs + off, dl, &ids, &n, &cap, err, sizeof err) != 0) {
                fprintf(stderr, "tok_tool: document %zu: %s\n", ndoc, err); rc = 1; break;
            }
            enc_s += now() - t0;
            uint32_t n32 = (uint32_t)n;
            fwrite(&n32, 4, 1, out);
            fwrite(ids, 4, n, out);
            char *d; size_t dlen;
            if (tokenizer_decode(t, ids, n, false, &d, &dlen, err, sizeof err) != 0) {
                fprintf(stderr, "tok_tool: document %zu: decode: %s\n", ndoc, err); rc = 1; break;
            }
            if (dlen != dl || memcmp(d, docs + off, dl) != 0) {
                size_t k = 0;
                while (k < dl && k < dlen && d[k] == docs[off + k]) k++;
                fprintf(stderr, "roundtrip: document %zu (%u bytes) differs from its decoding (%zu bytes) at byte %zu\n",
                        ndoc, dl, dlen, k);
                bad++;
            }
            free(d);
            char name[512] = "";
            if (name_at) {
                char *nl = strchr(name_at, '\n');
                snprintf(name, sizeof name, "%.*s", (int)(nl ? nl - name_at : (long)strlen(name_at)), name_at);
                name_at = nl ? nl + 1 : NULL;
            }
            if (ref) {
                uint32_t rn = 0;
                if (roff + 4 <= rlen) memcpy(&rn, ref + roff, 4);
                if (roff + 4 + 4 * (size_t)rn > rlen) { fprintf(stderr, "tok_tool: %s is short\n", argv[5]); rc = 1; break; }
                const uint32_t *r = (const uint32_t *)(ref + roff + 4);
                roff += 4 + 4 * (size_t)rn;
                size_t k = 0;
                while (k < n && k < rn && ids[k] == r[k]) k++;
                if (k < n || k < rn) {
                    if (++ndiff <= 10) {
                        char *pd; size_t pl = 0;
                        if (tokenizer_decode(t, ids, k, false, &pd, &pl, err, sizeof err) == 0) free(pd);
                        fprintf(stderr, "mismatch: document %zu (%s): ids differ from index %zu on (%zu vs %u ids), input byte %zu:\n"
                                "  text there: \"", ndoc, name, k, n, rn, pl);
                        for (size_t q = pl; q < dl && q < pl + 40; q++) {
                            unsigned char c = (unsigned char)docs[off + q];
                            if (c >= 32 && c < 127 && c != '"' && c != '\\') fputc(c, stderr); else fprintf(stderr, "\\x%02x", c);
                        }
                        fprintf(stderr, "\"\n  ours:      ");
                        for (size_t q = k > 3 ? k - 3 : 0; q < n && q < k + 8; q++) fprintf(stderr, "%s%u", q == k ? "[" : " ", ids[q]);
                        fprintf(stderr, "\n  reference: ");
                        for (size_t q = k > 3 ? k - 3 : 0; q < rn && q < k + 8; q++) fprintf(stderr, "%s%u", q == k ? "[" : " ", r[q]);
                        fprintf(stderr, "\n");
                    }
                }
            }
            ndoc++; bytes += dl; tokens += n; off += dl;
        }
        fclose(out);
        printf("docs=%zu bytes=%zu tokens=%zu encode_seconds=%.3f tokens_per_s=%.0f roundtrip_differs=%zu", ndoc, bytes,
               tokens, enc_s, enc_s > 0 ? tokens / enc_s : 0.0, bad);
        if (ref) printf(" ids_differ=%zu", ndiff);
        printf("\n");
        free(ids); free(docs); free(ref); free(names);
    } else { fprintf(stderr, "usage: tok_tool info|ids|encode|decode TOKENIZER ...\n"); rc = 2; }
    tokenizer_free(t);
    return rc;
}
