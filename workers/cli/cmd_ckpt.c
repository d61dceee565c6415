/* cmd_ckpt.c: `ballast ckpt export` (checkpoint -> Hugging Face directory)
 * and `ballast ckpt info` (what a checkpoint holds, with its shards
 * verified). CKPT is a step directory or a --ckpt-dir (its newest step). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "log.h"
#include "options.h"
#include "workers/ckpt/ckpt.h"
#include "workers/ckpt/hf.h"
#include "workers/cli/cli.h"
#include "workers/model/model.h"
#include "workers/ckpt/safetensors.h"
#include "workers/data/tokenizer.h"

/* A step directory has a manifest; otherwise take the newest step inside. */
static int resolve_ckpt(const char *in, char *out, size_t len) {
    char man[4400], err[512];
    snprintf(man, sizeof man, "%s/manifest.json", in);
    FILE *f = fopen(man, "r");
    if (f) { fclose(f); snprintf(out, len, "%s", in); return 0; }
    int r = ckpt_find_latest(in, out, len, err, sizeof err);
    if (r < 0) { fprintf(stderr, "ballast ckpt: %s\n", err); return -1; }
    if (r == 0) { fprintf(stderr, "ballast ckpt: %s: no manifest.json and no step-NNNNNNNN checkpoint inside\n", in); return -1; }
    return 0;
}

/* Copy the file src to dst (0, or -1 with a message). */
static int copy_file(const char *src, const char *dst, char *err, size_t errlen) {
    FILE *in = fopen(src, "rb");
    if (!in) return errbuf_set(err, errlen, "%s: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) { fclose(in); return errbuf_set(err, errlen, "%s: %s", dst, strerror(errno)); }
    char buf[1 << 16];
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) { rc = -1; break; }
    if (ferror(in)) rc = -1;
    if (fclose(out) != 0) rc = -1;
    fclose(in);
    if (rc) errbuf_set(err, errlen, "copying %s to %s failed: %s", src, dst, strerror(errno));
    return rc;
}

/* The tokenizer files beside the weights: tok is a tokenizer.json or the
 * directory holding it; tokenizer.json and, where they are beside it,
 * tokenizer_config.json, special_tokens_map.json and generation_config.json
 * are copied. The tokenizer must load (so a broken one is refused here, not
 * by the reader of the export), and its BOS / EOS ids go into config.json. */
static int export_tokenizer(const char *tok, const char *out, int vocab, char *err, size_t errlen) {
    tokenizer_t *t = tokenizer_load(tok, err, errlen);
    if (!t) return -1;
    int rc = -1;
    if (tokenizer_vocab_size(t) > (uint32_t)vocab) {
        snprintf(err, errlen, "--tokenizer %s has %u tokens, more than the model's vocab_size %d: not this model's "
                 "tokenizer?", tok, tokenizer_vocab_size(t), vocab);
        goto done;
    }
    char dir[4200];
    struct stat st;
    bool isdir = stat(tok, &st) == 0 && S_ISDIR(st.st_mode);
    if (isdir) snprintf(dir, sizeof dir, "%s", tok);
    else {
        snprintf(dir, sizeof dir, "%s", tok);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    static const char *const files[] = { "tokenizer_config.json", "special_tokens_map.json", "generation_config.json" };
    char src[4400], dst[4400];
    if (isdir) snprintf(src, sizeof src, "%s/tokenizer.json", dir);
    else snprintf(src, sizeof src, "%s", tok);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", out);
    if (copy_file(src, dst, err, errlen)) goto done;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", dir, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", out, files[i]);
        if (access(src, R_OK) == 0 && copy_file(src, dst, err, errlen)) goto done;
    }
    /* config.json names the tokenizer's special ids (null when it has none) */
    snprintf(dst, sizeof dst, "%s/config.json", out);
    json_error_t je;
    json_t *cfg = json_load_file(dst, 0, &je);
    if (!cfg) { errbuf_set(err, errlen, "%s: %s", dst, je.text); goto done; }
    int64_t bos = tokenizer_bos_id(t), eos = tokenizer_eos_id(t);
    json_object_set_new(cfg, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
    json_object_set_new(cfg, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
    if (json_dump_file(cfg, dst, JSON_INDENT(2) | JSON_SORT_KEYS)) errbuf_set(err, errlen, "%s: cannot write", dst);
    else rc = 0;
    json_decref(cfg);
done:
    tokenizer_free(t);
    return rc;
}

static int ckpt_export(int argc, char **argv) {
    const char *from = NULL, *out = NULL, *tok = NULL;
    int dtype = 0;
    const opt_t opts[] = {
        { "from", OPT_STRING, NULL, 0, 0, NULL, "checkpoint step directory, or a --ckpt-dir (newest step)", &from },
        { "out", OPT_STRING, NULL, 0, 0, NULL, "output Hugging Face directory (config.json + model.safetensors)", &out },
        { "dtype", OPT_ENUM, "f32", 0, 0, "f32|bf16", "stored dtype of the exported weights (config.json's torch_dtype says which)", &dtype },
        { "tokenizer", OPT_STRING, NULL, 0, 0, NULL, "tokenizer.json or its directory to write beside the weights (default: the one the run recorded with --tokenizer)", &tok },
    };
    char err[4096];
    const char *pos[1];
    int npos = 0;
    int rc = opt_parse(opts, 4, argc, argv, pos, 0, &npos,
                       "usage: ballast ckpt export --from CKPT --out DIR [--dtype f32|bf16] [--tokenizer PATH]", err,
                       sizeof err);
    if (rc) { if (rc < 0) fprintf(stderr, "ballast ckpt export: %s\n", err); return rc < 0 ? 2 : 0; }
    if (!from || !out) { fprintf(stderr, "ballast ckpt export: --from CKPT and --out DIR are required\n"); return 2; }
    char path[4200];
    if (resolve_ckpt(from, path, sizeof path)) return 1;
    ckpt_meta_t meta;
    if (ckpt_read_meta(path, &meta, err, sizeof err)) { fprintf(stderr, "ballast ckpt export: %s\n", err); return 1; }
    model_t m;
    if (model_layout(&m, &meta.cfg, err, sizeof err)) { fprintf(stderr, "ballast ckpt export: %s: %s\n", path, err); return 1; }
    float *host = malloc(m.n_params * sizeof(float));
    int status = 1;
    if (!host) { fprintf(stderr, "ballast ckpt export: out of memory\n"); goto done; }
    if (ckpt_read_weights(path, &m, host, err, sizeof err) ||
        ckpt_write_hf(out, &m, host, dtype == 1 ? ST_BF16 : ST_F32, err, sizeof err)) {
        fprintf(stderr, "ballast ckpt export: %s\n", err);
        goto done;
    }
    if (!tok && meta.tokenizer[0]) tok = meta.tokenizer;
    if (tok && export_tokenizer(tok, out, meta.cfg.vocab, err, sizeof err)) {
        fprintf(stderr, "ballast ckpt export: the tokenizer: %s\n", err);
        goto done;
    }
    printf("exported %s (step %lld, %zu parameters, %s) to %s/{config.json,model.safetensors%s}\n", path,
           (long long)meta.step, m.n_params, dtype == 1 ? "bfloat16" : "float32", out, tok ? ",tokenizer.json" : "");
    status = 0;
done:
    free(host);
    model_destroy(&m);
    return status;
}

static int ckpt_info(int argc, char **argv) {
    if (argc != 2 || !strcmp(argv[1], "--help")) {
        fprintf(argc == 2 ? stdout : stderr, "usage: ballast ckpt info CKPT\n");
        return argc == 2 ? 0 : 2;
    }
    char path[4200], err[1024];
    if (resolve_ckpt(argv[1], path, sizeof path)) return 1;
    ckpt_meta_t meta;
    if (ckpt_read_meta(path, &meta, err, sizeof err)) { fprintf(stderr, "ballast ckpt info: %s\n", err); return 1; }
    /* the checks --resume makes, then every file's crc32 below */
    model_t m;
    if (model_layout(&m, &meta.cfg, err, sizeof err)) { fprintf(stderr, "ballast ckpt info: %s: %s\n", path, err); return 1; }
    int bad_manifest = ckpt_verify(path, &m, err, sizeof err);
    model_destroy(&m);
    if (bad_manifest) { fprintf(stderr, "ballast ckpt info: %s\n", err); return 1; }
    const llama_config_t *c = &meta.cfg;
    const optim_config_t *oc = &meta.ocfg;
    printf("checkpoint  %s\n", path);
    printf("step        %lld\n", (long long)meta.step);
    printf("model       dim %d, %d layers, %d heads / %d kv (head_dim %d), ffn %d, vocab %d%s; %lld parameters\n",
           c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab,
           c->tie_embeddings ? ", tied" : "", (long long)llama_total_params(c));
    printf("data        %s (%s, seed %llu), micro-batch %d x seq-len %d x grad-accum %d\n", meta.data,
           meta.data_order ? "shuffled" : "sequential", (unsigned long long)meta.data_seed, meta.B, meta.T, meta.accum);
    printf("optimizer   AdamW lr %g (%s, warmup %lld, min %g, %lld steps), betas (%g, %g), eps %g, wd %g, clip %g\n",
           oc->lr, optim_schedule_name(oc->schedule), (long long)oc->warmup_steps, oc->min_lr,
           (long long)oc->total_steps, oc->beta1, oc->beta2, oc->eps, oc->weight_decay, oc->grad_clip);
    char man[4400];
    snprintf(man, sizeof man, "%s/manifest.json", path);
    json_error_t je;
    json_t *root = json_load_file(man, JSON_REJECT_DUPLICATES, &je);
    json_t *shards = root ? json_object_get(root, "shards") : NULL;
    int status = 0;
    for (size_t i = 0; shards && i < json_array_size(shards); i++) {
        json_t *sh = json_array_get(shards, i);
        const char *file = json_string_value(json_object_get(sh, "file"));
        if (!file) continue;
        char sp[4700];
        snprintf(sp, sizeof sp, "%s/%s", path, file);
        uint32_t crc = 0;
        uint64_t bytes = 0;
        int bad = ckpt_file_crc32(sp, &crc, &bytes) ||
                  (json_int_t)bytes != json_integer_value(json_object_get(sh, "bytes")) ||
                  (json_int_t)crc != json_integer_value(json_object_get(sh, "crc32"));
        printf("shard       %s: %llu bytes, crc32 %08x, %zu tensors x 3 states: %s\n", file,
               (unsigned long long)bytes, crc, json_array_size(json_object_get(sh, "tensors")),
               bad ? "DAMAGED (size or crc32 differs from the manifest)" : "ok");
        if (bad) status = 1;
    }
    json_decref(root);
    return status;
}

int cmd_ckpt(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: ballast ckpt export --from CKPT --out DIR [--dtype f32|bf16] [--tokenizer PATH]\n"
                "       ballast ckpt info CKPT\n"
                "CKPT is a step-NNNNNNNN directory or a --ckpt-dir (its newest step).\n\n"
                "export: a Hugging Face directory (config.json, model.safetensors, the tokenizer) from a checkpoint\n"
                "  --from CKPT            checkpoint step directory, or a --ckpt-dir (newest step) (required)\n"
                "  --out DIR              output Hugging Face directory (required)\n"
                "  --dtype f32|bf16       stored dtype of the exported weights (default: f32)\n"
                "  --tokenizer PATH       tokenizer.json or its directory to write beside the weights (default: the\n"
                "                         one the run recorded with --tokenizer)\n"
                "info: the manifest, the model and every shard file checked against its size and crc32\n"
                "`ballast ckpt export --help` prints export's options with their defaults.\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "export")) return ckpt_export(argc - 1, argv + 1);
    if (!strcmp(argv[1], "info")) return ckpt_info(argc - 1, argv + 1);
    fprintf(stderr, "ballast ckpt: unknown subcommand '%s' (export, info)\n", argv[1]);
    return 2;
}
