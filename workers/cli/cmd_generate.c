/* cmd_generate.c: `ballast generate --from CKPT_OR_HF_DIR --prompt TEXT`:
 * continue a prompt with KV-cached decoding (workers/model/generate.h) on
 * the fp32 CPU backend or, with --backend cuda, the bf16 CUDA backend,
 * greedy or sampled (temperature, top-k, top-p, a seed), printing each
 * token as it comes: the growing list of new ids is
 * decoded and the bytes past what is already printed go out, up to the
 * last complete UTF-8 character. --prompt-ids takes token ids instead of
 * text (no tokenizer needed); without a tokenizer the output is ids. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "options.h"
#include "workers/backend/backend.h"
#include "workers/cli/cli.h"
#include "workers/cli/weights.h"
#include "workers/data/tokenizer.h"
#include "workers/model/generate.h"
#include "workers/model/model.h"

static const char USAGE[] =
    "usage: ballast generate --from CKPT_OR_HF_DIR (--prompt TEXT [--tokenizer PATH] | --prompt-ids ID,ID,...)\n"
    "       [--max-new-tokens N] [--temperature X] [--top-k K] [--top-p P] [--seed S] [--ignore-eos] [--ids]\n"
    "       [--backend cpu|cuda] [--device N] [--threads N]";

/* "1,2, 3" or "1 2 3" into ids; 0 or -1 with a message. */
static int parse_ids(const char *s, int V, int32_t **ids, size_t *n, char *err, size_t errlen) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return snprintf(err, errlen, "out of memory"), -1;
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v >= V) {
            snprintf(err, errlen, "--prompt-ids: '%.20s' is not a token id in 0..%d (give comma-separated ids)", p, V - 1);
            return -1;
        }
        if (*n == cap) {
            int32_t *nw = realloc(*ids, 2 * cap * sizeof *nw);
            if (!nw) return snprintf(err, errlen, "out of memory"), -1;
            *ids = nw;
            cap *= 2;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    if (*n == 0) return snprintf(err, errlen, "--prompt-ids: no ids given"), -1;
    return 0;
}

/* Length of the prefix of b[0..n) that ends on a whole UTF-8 character (a
 * lead byte whose continuation bytes have not all come yet is held back). */
static size_t utf8_complete(const unsigned char *b, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = b[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        size_t need = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

/* The tokenizer to use: --tokenizer, else the one the checkpoint records,
 * else the model directory's own tokenizer.json; NULL when none. */
static const char *pick_tokenizer(const char *flag, const cli_weights_t *w, char *buf, size_t len) {
    if (flag) return flag;
    if (w->is_ckpt && w->meta.tokenizer[0]) return w->meta.tokenizer;
    snprintf(buf, len, "%s/tokenizer.json", w->path);
    return !w->is_ckpt && access(buf, R_OK) == 0 ? w->path : NULL;
}

int cmd_generate(int argc, char **argv) {
    const char *from = NULL, *tok_path = NULL, *prompt = NULL, *prompt_ids = NULL;
    int64_t max_new = 0, top_k = 0, seed = 0, threads = 0, device = 0;
    int backend = 0;
    double temperature = 0, top_p = 1;
    bool ignore_eos = false, print_ids = false;
    const opt_t opts[] = {
        { "from", OPT_STRING, NULL, 0, 0, NULL, "checkpoint step directory, --ckpt-dir (newest step) or Hugging Face model directory", &from },
        { "tokenizer", OPT_STRING, NULL, 0, 0, NULL, "tokenizer.json or its directory (default: the one the checkpoint records, or the model directory's)", &tok_path },
        { "prompt", OPT_STRING, NULL, 0, 0, NULL, "text to continue (encoded with the tokenizer, BOS first when it adds one)", &prompt },
        { "prompt-ids", OPT_STRING, NULL, 0, 0, NULL, "token ids to continue instead of --prompt, comma-separated (no tokenizer needed)", &prompt_ids },
        { "max-new-tokens", OPT_INT, "64", 1, 1 << 24, NULL, "tokens to generate at most", &max_new },
        { "temperature", OPT_DOUBLE, "0", 0, 100, NULL, "sampling temperature; 0 = greedy (the most likely token)", &temperature },
        { "top-k", OPT_INT, "0", 0, 1 << 30, NULL, "sample among the K most likely tokens (0: all)", &top_k },
        { "top-p", OPT_DOUBLE, "1", 0, 1, NULL, "then among the most likely tokens whose probability reaches P (1: all)", &top_p },
        { "seed", OPT_INT, "1", 0, 9.2e18, NULL, "seed of the sampler (the same seed gives the same text)", &seed },
        { "ignore-eos", OPT_BOOL, "false", 0, 0, NULL, "go on past the end-of-sequence token", &ignore_eos },
        { "ids", OPT_BOOL, "false", 0, 0, NULL, "print the new token ids (space-separated) instead of text", &print_ids },
        { "threads", OPT_INT, "0", 0, 4096, NULL, "compute threads of the CPU backend (0: all cores)", &threads },
        { "backend", OPT_ENUM, "cpu", 0, 0, "cpu|cuda", "compute backend: cpu (fp32) or cuda (bf16 on GPU --device)", &backend },
        { "device", OPT_INT, "0", 0, 1024, NULL, "GPU index for --backend cuda", &device },
    };
    char err[4096];
    const char *pos[1];
    int npos = 0;
    int rc = opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, pos, 0, &npos, USAGE, err, sizeof err);
    if (rc) { if (rc < 0) fprintf(stderr, "ballast generate: %s\n", err); return rc < 0 ? 2 : 0; }
    if (!from || (!prompt == !prompt_ids)) {
        fprintf(stderr, "ballast generate: --from and one of --prompt TEXT or --prompt-ids IDS are required\n%s\n", USAGE);
        return 2;
    }
    if (top_p <= 0) { fprintf(stderr, "ballast generate: --top-p must be in (0, 1]\n"); return 2; }
    cli_weights_t w;
    if (cli_weights_load(from, &w, err, sizeof err)) { fprintf(stderr, "ballast generate: %s\n", err); return 1; }
    const llama_config_t *c = &w.cfg;
    int status = 1;
    tokenizer_t *tk = NULL;
    int32_t *ids = NULL;
    uint32_t *uids = NULL;
    float *logits = NULL;
    size_t n = 0, ucap = 0;
    model_t m;
    bool have_model = false;
    gen_t g;
    memset(&g, 0, sizeof g);
    char tbuf[4400];
    const char *tp = pick_tokenizer(tok_path, &w, tbuf, sizeof tbuf);
    if (tp && (prompt || !print_ids)) {
        tk = tokenizer_load(tp, err, sizeof err);
        if (!tk) { fprintf(stderr, "ballast generate: %s\n", err); goto out; }
        if (tokenizer_vocab_size(tk) > (uint32_t)c->vocab) {
            fprintf(stderr, "ballast generate: the tokenizer %s has %u tokens, more than the model's vocab_size %d: "
                            "not the model's tokenizer?\n", tp, tokenizer_vocab_size(tk), c->vocab);
            goto out;
        }
    }
    if (prompt) {
        if (!tk) {
            fprintf(stderr, "ballast generate: --prompt needs a tokenizer: give --tokenizer PATH (tokenizer.json or "
                            "its directory), or token ids with --prompt-ids\n");
            status = 2;
            goto out;
        }
        size_t un = 0;
        if (tokenizer_adds_bos(tk) && tokenizer_bos_id(tk) >= 0) {
            uids = malloc(sizeof *uids);
            if (!uids) goto oom;
            ucap = 1;
            uids[un++] = (uint32_t)tokenizer_bos_id(tk);
        }
        if (tokenizer_encode(tk, prompt, strlen(prompt), &uids, &un, &ucap, err, sizeof err)) {
            fprintf(stderr, "ballast generate: %s\n", err);
            goto out;
        }
        if (un == 0) { fprintf(stderr, "ballast generate: the prompt encodes to no tokens\n"); status = 2; goto out; }
        ids = malloc(un * sizeof *ids);
        if (!ids) goto oom;
        for (size_t i = 0; i < un; i++) ids[i] = (int32_t)uids[i];
        n = un;
        free(uids);
        uids = NULL;
        ucap = 0;
    } else if (parse_ids(prompt_ids, c->vocab, &ids, &n, err, sizeof err)) {
        fprintf(stderr, "ballast generate: %s\n", err);
        status = 2;
        goto out;
    }
    if ((int64_t)n >= c->max_seq) {
        fprintf(stderr, "ballast generate: the prompt has %zu tokens; the model holds %d positions\n", n, c->max_seq);
        status = 2;
        goto out;
    }
    int64_t cap = (int64_t)n + max_new;
    if (cap > c->max_seq) cap = c->max_seq;
    backend_spec_t spec = { .kind = backend == 1 ? BACKEND_CUDA : BACKEND_CPU, .threads = (int)threads,
                            .device = (int)device };
    const backend_t *be = backend_open(&spec, err, sizeof err);
    if (!be) { fprintf(stderr, "ballast generate: %s\n", err); goto out; }
    if (model_create(&m, c, be, 1, 1, false, err, sizeof err)) { fprintf(stderr, "ballast generate: %s\n", err); goto out; }
    have_model = true;
    model_set_params(&m, w.host);
    cli_weights_free(&w);
    if (gen_create(&g, &m, (int)cap, (int)n, err, sizeof err)) { fprintf(stderr, "ballast generate: %s\n", err); goto out; }
    logits = malloc((size_t)c->vocab * sizeof *logits);
    if (!logits) goto oom;
    int64_t eos = tk && !ignore_eos ? tokenizer_eos_id(tk) : -1;
    gen_sampling_t smp = { .temperature = temperature, .top_k = (int)top_k, .top_p = top_p };
    uint64_t rng = (uint64_t)seed;
    size_t printed = 0, un = 0;
    if (gen_feed(&g, ids, (int)n, logits, err, sizeof err)) { fprintf(stderr, "ballast generate: %s\n", err); goto out; }
    for (int64_t i = 0; i < max_new; i++) {
        int32_t next = gen_sample(logits, c->vocab, &smp, &rng);
        if (next == eos) break;
        if (un == ucap) {
            ucap = ucap ? 2 * ucap : 64;
            uint32_t *nu = realloc(uids, ucap * sizeof *nu);
            if (!nu) goto oom;
            uids = nu;
        }
        uids[un++] = (uint32_t)next;
        if (print_ids || !tk) {
            printf("%s%d", un > 1 ? " " : "", (int)next);
        } else {
            char *text = NULL;
            size_t tl = 0;
            if (tokenizer_decode(tk, uids, un, true, &text, &tl, err, sizeof err)) {
                fprintf(stderr, "\nballast generate: %s\n", err);
                goto out;
            }
            size_t done = utf8_complete((const unsigned char *)text, tl);
            if (done > printed) fwrite(text + printed, 1, done - printed, stdout);
            if (done > printed) printed = done;
            free(text);
        }
        fflush(stdout);
        if (g.pos >= g.cap) break;
        if (gen_feed(&g, &next, 1, logits, err, sizeof err)) { fprintf(stderr, "\nballast generate: %s\n", err); goto out; }
    }
    if (tk && !print_ids && un) {
        /* what an unfinished character held back */
        char *text = NULL;
        size_t tl = 0;
        if (!tokenizer_decode(tk, uids, un, true, &text, &tl, err, sizeof err) && tl > printed)
            fwrite(text + printed, 1, tl - printed, stdout);
        free(text);
    }
    printf("\n");
    status = 0;
    goto out;
oom:
    fprintf(stderr, "ballast generate: out of memory\n");
out:
    gen_destroy(&g);
    if (have_model) model_destroy(&m);
    if (tk) tokenizer_free(tk);
    free(ids);
    free(uids);
    free(logits);
    cli_weights_free(&w);
    return status;
}
