/*
 * cmd_data.c - `ballast data synth | pack | info | tokenize`: write the
 * synthetic corpus, wrap raw tokens into a shard, describe shards; tokenize
 * (text to shards) is in cmd_data_tokenize.c. Each subcommand
 * has its own option table (common/options.h); `ballast data --help`
 * prints all of them. Formats and the generator are in docs/data.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>

#include "log.h"
#include "options.h"
#include "workers/cli/cli.h"
#include "workers/data/data.h"

#define MAX_INFO_FILES 1024

/* ---- synth ---- */

static const char *synth_out;
static int64_t synth_tokens, synth_vocab, synth_seed, synth_branching;
static const opt_t SYNTH_OPTS[] = {
    { "out", OPT_STRING, NULL, 0, 0, NULL, "shard to write (FILE.json gets the entropy)", &synth_out },
    { "tokens", OPT_INT, "2000000", 1, 2147483647.0, NULL, "number of tokens to generate", &synth_tokens },
    { "vocab", OPT_INT, "256", 3, 16777216, NULL, "vocabulary size V (token ids 0..V-1)", &synth_vocab },
    { "seed", OPT_INT, "1", 0, 0, NULL, "generator seed (the chain and the sample)", &synth_seed },
    { "branching", OPT_INT, "4", 2, 16777216, NULL, "successors per token K (2..V); entropy grows with K", &synth_branching },
};
#define N_SYNTH (sizeof SYNTH_OPTS / sizeof SYNTH_OPTS[0])
static const char SYNTH_USAGE[] = "usage: ballast data synth --out FILE [--tokens N] [--vocab V] [--seed S] [--branching K]";

/* ---- pack ---- */

static const char *pack_in, *pack_out;
static int pack_dtype;
static int64_t pack_vocab;
static const opt_t PACK_OPTS[] = {
    { "in", OPT_STRING, NULL, 0, 0, NULL, "raw little-endian token file", &pack_in },
    { "dtype", OPT_ENUM, "u16", 0, 0, "u16|u32", "token width of --in (u16 -> shard v1, u32 -> shard v2)", &pack_dtype },
    { "out", OPT_STRING, NULL, 0, 0, NULL, "shard to write", &pack_out },
    { "vocab", OPT_INT, "0", 0, 2147483647.0, NULL, "reject token ids >= V (0 = no check)", &pack_vocab },
};
#define N_PACK (sizeof PACK_OPTS / sizeof PACK_OPTS[0])
static const char PACK_USAGE[] = "usage: ballast data pack --in RAW --dtype u16|u32 --out FILE [--vocab V]";

/* ---- info ---- */

static bool info_json;
static int64_t info_vocab;
static const opt_t INFO_OPTS[] = {
    { "vocab", OPT_INT, "0", 0, 2147483647.0, NULL, "also check every token id < V (0 = no check)", &info_vocab },
    { "json", OPT_BOOL, "false", 0, 0, NULL, "one JSON object per shard instead of text", &info_json },
};
#define N_INFO (sizeof INFO_OPTS / sizeof INFO_OPTS[0])
static const char INFO_USAGE[] = "usage: ballast data info [--json] [--vocab V] FILE|GLOB...";

static const char DATA_USAGE[] =
    "usage: ballast data synth|pack|info|tokenize [options]\n"
    "  synth  write a synthetic corpus with a known entropy floor\n"
    "  pack   wrap raw little-endian tokens into an llm.c-format shard\n"
    "  info   describe shards: version, tokens, id range, unigram entropy\n"
    "  tokenize  encode text or JSONL files into shards with a Hugging Face tokenizer";

static int parse_or_exit(const opt_t *opts, size_t n, int argc, char **argv, const char **pos, int max_pos,
                         int *npos, const char *usage, int *exit_code) {
    char err[OPT_ERR_LEN];
    int r = opt_parse(opts, n, argc, argv, pos, max_pos, npos, usage, err, sizeof err);
    if (r == 1) { *exit_code = 0; return 1; }
    if (r < 0) {
        fprintf(stderr, "ballast data: %s\n%s\n", err, usage);
        *exit_code = 2;
        return 1;
    }
    return 0;
}

static int do_synth(int argc, char **argv) {
    const char *pos[1];
    int npos = 0, code;
    if (parse_or_exit(SYNTH_OPTS, N_SYNTH, argc, argv, pos, 0, &npos, SYNTH_USAGE, &code)) return code;
    if (!synth_out || !*synth_out) {
        fprintf(stderr, "ballast data synth: --out FILE is required\n%s\n", SYNTH_USAGE);
        return 2;
    }
    if (synth_branching > synth_vocab) {
        fprintf(stderr, "ballast data synth: --branching %lld exceeds --vocab %lld; use K <= V\n",
                (long long)synth_branching, (long long)synth_vocab);
        return 2;
    }
    char err[1024];
    double h = 0, h0 = 0;
    if (data_synth_entropy((int)synth_vocab, (uint64_t)synth_seed, (int)synth_branching, &h, &h0, err, sizeof err) != 0 ||
        data_synth_k(synth_out, synth_tokens, (int)synth_vocab, (uint64_t)synth_seed, (int)synth_branching, &h, err,
                     sizeof err) != 0) {
        fprintf(stderr, "ballast data synth: %s\n", err);
        return 1;
    }
    char side[4096];
    snprintf(side, sizeof side, "%s.json", synth_out);
    FILE *f = fopen(side, "w");
    if (!f) {
        fprintf(stderr, "ballast data synth: cannot write %s: %s\n", side, strerror(errno));
        return 1;
    }
    fprintf(f, "{\"generator\": \"markov1\", \"tokens\": %lld, \"vocab\": %lld, \"branching\": %lld, \"seed\": %lld, "
               "\"entropy_nats\": %.17g, \"entropy_bits\": %.17g, \"unigram_entropy_nats\": %.17g}\n",
            (long long)synth_tokens, (long long)synth_vocab, (long long)synth_branching, (long long)synth_seed, h,
            h / log(2.0), h0);
    if (fclose(f) != 0) {
        fprintf(stderr, "ballast data synth: writing %s failed: %s\n", side, strerror(errno));
        return 1;
    }
    printf("wrote %s: %lld tokens, vocab %lld, branching %lld, seed %lld\n", synth_out, (long long)synth_tokens,
           (long long)synth_vocab, (long long)synth_branching, (long long)synth_seed);
    printf("entropy: %.6f nats/token (%.6f bits/token); unigram entropy %.6f nats; floor in %s\n", h, h / log(2.0), h0,
           side);
    return 0;
}

static int do_pack(int argc, char **argv) {
    const char *pos[1];
    int npos = 0, code;
    if (parse_or_exit(PACK_OPTS, N_PACK, argc, argv, pos, 0, &npos, PACK_USAGE, &code)) return code;
    if (!pack_in || !*pack_in || !pack_out || !*pack_out) {
        fprintf(stderr, "ballast data pack: --in RAW and --out FILE are required\n%s\n", PACK_USAGE);
        return 2;
    }
    size_t tsz = pack_dtype == 0 ? 2 : 4;
    int fd = open(pack_in, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "ballast data pack: cannot open %s: %s\n", pack_in, strerror(errno));
        if (fd >= 0) close(fd);
        return 1;
    }
    size_t size = (size_t)sb.st_size;
    if (size == 0 || size % tsz != 0) {
        close(fd);
        fprintf(stderr, "ballast data pack: %s: size %zu bytes is %s a multiple of the %zu-byte %s token; "
                "check --dtype or the file\n", pack_in, size, size == 0 ? "zero, not" : "not", tsz,
                pack_dtype == 0 ? "u16" : "u32");
        return 1;
    }
    int64_t n = (int64_t)(size / tsz);
    uint8_t *raw = malloc(size);
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    if (!raw || !tok) { close(fd); free(raw); free(tok); fprintf(stderr, "ballast data pack: out of memory\n"); return 1; }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, raw + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != size) {
        free(raw); free(tok);
        fprintf(stderr, "ballast data pack: %s: short read (%zu of %zu bytes)\n", pack_in, got, size);
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *p = raw + (size_t)i * tsz;
        tok[i] = tsz == 2 ? (uint32_t)(p[0] | p[1] << 8)
                          : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if ((pack_vocab > 0 && tok[i] >= (uint64_t)pack_vocab) || tok[i] > INT32_MAX) {
            if (tok[i] > INT32_MAX)
                fprintf(stderr, "ballast data pack: %s: token %lld has id %u, beyond the int32 range of token ids; "
                        "check --dtype or re-tokenize\n", pack_in, (long long)i, tok[i]);
            else
                fprintf(stderr, "ballast data pack: %s: token %lld has id %u >= --vocab %lld; check --dtype/--vocab "
                        "or re-tokenize\n", pack_in, (long long)i, tok[i], (long long)pack_vocab);
            free(raw); free(tok);
            return 1;
        }
    }
    free(raw);
    char err[1024];
    int rc = data_write_shard(pack_out, tok, n, pack_dtype == 1, err, sizeof err);
    free(tok);
    if (rc != 0) { fprintf(stderr, "ballast data pack: %s\n", err); return 1; }
    printf("wrote %s: %lld tokens, version %d\n", pack_out, (long long)n, pack_dtype == 1 ? 2 : 1);
    return 0;
}

/* Describe every shard of one file/glob argument. */
static int info_one(const char *arg) {
    data_t *d;
    char err[1024];
    if (data_open(arg, (int)info_vocab, &d, err, sizeof err) != 0) {
        fprintf(stderr, "ballast data info: %s\n", err);
        return 1;
    }
    for (int s = 0; s < data_num_shards(d); s++) {
        const char *path = data_shard_path(d, s);
        int64_t n = data_shard_tokens(d, s), first = 0;
        for (int q = 0; q < s; q++) first += data_shard_tokens(d, q);
        uint32_t mn = UINT32_MAX, mx = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t t = data_token(d, first + i);
            if (t < mn) mn = t;
            if (t > mx) mx = t;
        }
        uint64_t *cnt = calloc((size_t)mx + 1, sizeof *cnt);
        double h = NAN;
        if (cnt) {
            for (int64_t i = 0; i < n; i++) cnt[data_token(d, first + i)]++;
            h = 0;
            for (uint64_t t = 0; t <= mx; t++)
                if (cnt[t]) { double p = (double)cnt[t] / (double)n; h -= p * log(p); }
            free(cnt);
        }
        struct stat sb;
        long long fsize = stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
        int v = data_shard_version(d, s);
        if (info_json) {
            json_t *o = json_pack("{s:s, s:i, s:s, s:I, s:I, s:I, s:f, s:I}", "file", path, "version", v, "dtype",
                                  v == 1 ? "u16" : "u32", "tokens", (json_int_t)n, "min_id", (json_int_t)mn, "max_id",
                                  (json_int_t)mx, "unigram_entropy_nats", h, "file_bytes", (json_int_t)fsize);
            char *js = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
            printf("%s\n", js ? js : "{}");
            free(js);
            json_decref(o);
        }
        else
            printf("%s: version %d (%s tokens), %lld tokens, ids %u..%u, unigram entropy %.4f nats (%.4f bits), %lld bytes\n",
                   path, v, v == 1 ? "uint16" : "uint32", (long long)n, mn, mx, h, h / log(2.0), fsize);
    }
    data_close(d);
    return 0;
}

static int do_info(int argc, char **argv) {
    const char *pos[MAX_INFO_FILES];
    int npos = 0, code;
    if (parse_or_exit(INFO_OPTS, N_INFO, argc, argv, pos, MAX_INFO_FILES, &npos, INFO_USAGE, &code)) return code;
    if (npos == 0) {
        fprintf(stderr, "ballast data info: name at least one shard\n%s\n", INFO_USAGE);
        return 2;
    }
    int rc = 0;
    for (int i = 0; i < npos; i++) if (info_one(pos[i]) != 0) rc = 1;
    return rc;
}

int cmd_data(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        FILE *out = argc < 2 ? stderr : stdout;
        fprintf(out, "%s\n\n", DATA_USAGE);
        opt_print_help(SYNTH_OPTS, N_SYNTH, SYNTH_USAGE, out);
        fprintf(out, "\n");
        opt_print_help(PACK_OPTS, N_PACK, PACK_USAGE, out);
        fprintf(out, "\n");
        opt_print_help(INFO_OPTS, N_INFO, INFO_USAGE, out);
        fprintf(out, "\n");
        char *h[] = { "tokenize", "--help", NULL };
        if (argc >= 2) cmd_data_tokenize(2, h);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "synth") == 0) return do_synth(argc - 1, argv + 1);
    if (strcmp(argv[1], "pack") == 0) return do_pack(argc - 1, argv + 1);
    if (strcmp(argv[1], "info") == 0) return do_info(argc - 1, argv + 1);
    if (strcmp(argv[1], "tokenize") == 0) return cmd_data_tokenize(argc - 1, argv + 1);
    fprintf(stderr, "ballast data: unknown subcommand '%s' (use synth, pack, info or tokenize)\n%s\n", argv[1], DATA_USAGE);
    return 2;
}
