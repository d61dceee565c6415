/* ckpt.c: the checkpoint format; see ckpt.h. The manifest writer, the
 * readers of its fields and files, and the rebuilding of full tensors from
 * the parts of any layout. Relies on safetensors.h for the shard files and
 * jansson for JSON; knows nothing of how a run holds its state
 * (workers/ckpt/sharded.c builds on this). */
#include "workers/ckpt/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "workers/data/data.h"

static const char *const SUFFIX[3] = { "", ".exp_avg", ".exp_avg_sq" };

/* ---- files ---- */

int ckpt_file_crc32(const char *path, uint32_t *crc, uint64_t *size) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char buf[1 << 16];
    uint32_t c = 0xFFFFFFFFu;
    uint64_t total = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < n; i++) c = table[(c ^ buf[i]) & 0xFF] ^ (c >> 8);
        total += n;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return -1;
    *crc = c ^ 0xFFFFFFFFu;
    *size = total;
    return 0;
}

static int mkdir_p(const char *path, char *err, size_t errlen) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) goto fail;
        *p = '/';
    }
    if (mkdir(tmp, 0755) && errno != EEXIST) goto fail;
    return 0;
fail:
    snprintf(err, errlen, "%s: cannot create directory: %s", tmp, strerror(errno));
    return -1;
}

static void rm_rf(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

static const char *order_name(int o) { return o == DATA_SEQUENTIAL ? "sequential" : "shuffled"; }

int ckpt_mkdirs(const char *path, char *err, size_t errlen) { return mkdir_p(path, err, errlen); }
void ckpt_remove_tree(const char *path) { rm_rf(path); }

/* ---- the manifest: the one writer ---- */

static json_t *shape_json(int ndim, const int64_t *shape) {
    return ndim == 2 ? json_pack("[II]", (json_int_t)shape[0], (json_int_t)shape[1]) : json_pack("[I]", (json_int_t)shape[0]);
}

static json_t *part_json(const ckpt_part_t *p) {
    const model_tensor_t *t = p->full;
    return json_pack("{s:s, s:o, s:i, s:i, s:i, s:o, s:[I,I], s:b}", "name", t->name, "shape",
                     shape_json(t->ndim, t->shape), "tp_dim", t->tp_dim, "tp_rank", p->tp_rank, "tp_size", p->tp_size,
                     "local_shape", shape_json(t->ndim, p->local_shape), "range", (json_int_t)p->start,
                     (json_int_t)p->end, "decay", t->decay);
}

static json_t *shard_json(const ckpt_shard_t *sh, int S, int T) {
    json_t *tensors = json_array();
    for (int i = 0; i < sh->n_parts; i++) json_array_append_new(tensors, part_json(&sh->parts[i]));
    char file[64];
    snprintf(file, sizeof file, CKPT_SHARD_FMT, sh->shard * T + sh->tp_rank, S * T);
    return json_pack("{s:s, s:i, s:i, s:i, s:I, s:I, s:[s,s,s], s:o}", "file", file, "rank", sh->rank,
                     "shard", sh->shard, "tp_rank", sh->tp_rank, "bytes", (json_int_t)sh->bytes, "crc32",
                     (json_int_t)sh->crc32, "contents", "weights NAME (fp32, 1-D part)", "exp_avg NAME.exp_avg",
                     "exp_avg_sq NAME.exp_avg_sq", "tensors", tensors);
}

int ckpt_write_manifest(const char *dir, const ckpt_meta_t *meta, int world, int S, int T,
                        const ckpt_shard_t *shards, int n_shards, char *err, size_t errlen) {
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (llama_config_save_json(&meta->cfg, path, "float32", err, errlen)) return -1;
    json_t *js = json_array();
    for (int i = 0; i < n_shards; i++) json_array_append_new(js, shard_json(&shards[i], S, T));
    const optim_config_t *oc = &meta->ocfg;
    json_t *man = json_pack("{s:s, s:i, s:I, s:s, s:{s:i, s:i, s:i}, s:{s:s, s:s, s:I, s:i, s:i, s:i, s:i, s:I},"
                            " s:{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:I, s:I, s:I},"
                            " s:{s:I, s:I}, s:o}",
                            "format", "ballast-checkpoint", "version", CKPT_VERSION, "step", (json_int_t)meta->step,
                            "config", "config.json",
                            "layout", "world", world, "shard_degree", S, "tensor_parallel_degree", T,
                            "data", "path", meta->data, "order", order_name(meta->data_order),
                            "seed", (json_int_t)meta->data_seed, "micro_batch", meta->B, "seq_len", meta->T,
                            "grad_accum", meta->accum, "dp", meta->dp, "next_step", (json_int_t)meta->step,
                            "optimizer", "type", "adamw", "lr", oc->lr, "min_lr", oc->min_lr, "beta1", oc->beta1,
                            "beta2", oc->beta2, "eps", oc->eps, "weight_decay", oc->weight_decay,
                            "grad_clip", oc->grad_clip, "schedule", optim_schedule_name(oc->schedule),
                            "warmup_steps", (json_int_t)oc->warmup_steps, "total_steps", (json_int_t)oc->total_steps,
                            "step", (json_int_t)meta->step,
                            "rng", "init_seed", (json_int_t)meta->init_seed, "data_seed", (json_int_t)meta->data_seed,
                            "shards", js);
    if (man && meta->tokenizer[0]) json_object_set_new(man, "tokenizer", json_string(meta->tokenizer));
    if (man && oc->schedule == LR_WSD)
        json_object_set_new(json_object_get(man, "optimizer"), "decay_fraction", json_real(oc->decay_fraction));
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    int rc = man ? json_dump_file(man, path, JSON_INDENT(2)) : -1;
    json_decref(man);
    if (rc) return errbuf_set(err, errlen, "%s: cannot write the manifest", path);
    return 0;
}

/* ---- reading ---- */

/* The parsed manifest of step directory path (its file name into man), or
 * NULL with a message. */
static json_t *load_manifest(const char *path, char *man, size_t manlen, char *err, size_t errlen) {
    snprintf(man, manlen, "%s/manifest.json", path);
    json_error_t je;
    json_t *root = json_load_file(man, JSON_REJECT_DUPLICATES, &je);
    if (!root) errbuf_set(err, errlen, "%s: not a readable JSON manifest (%s)", man, je.text);
    return root;
}

/* Whether file (a path under step directory dir) resolves, symlinks
 * followed, to a place inside dir: 0, or -1 with a message. */
static int inside_dir(const char *dir, const char *file, char *err, size_t errlen) {
    char rd[PATH_MAX], rf[PATH_MAX];
    if (!realpath(dir, rd)) return errbuf_set(err, errlen, "%s: cannot resolve: %s", dir, strerror(errno));
    if (!realpath(file, rf)) return errbuf_set(err, errlen, "%s: cannot read: %s", file, strerror(errno));
    size_t n = strlen(rd);
    if (strncmp(rf, rd, n) || rf[n] != '/')
        return errbuf_set(err, errlen, "%s: resolves to %s, outside the checkpoint directory %s: a checkpoint's "
                          "files must lie inside it", file, rf, rd);
    return 0;
}

/* The checks of a manifest's header, alone: format, version, and the step
 * against the optimizer's step, the data position and the directory name
 * (step-NNNNNNNN). man is the manifest's file name for messages. 0, or -1
 * with a message. */
static int check_header(const char *path, const char *man, json_t *root, char *err, size_t errlen) {
    if (!json_is_object(root)) return errbuf_set(err, errlen, "%s: not a JSON object", man);
    json_t *fmt = json_object_get(root, "format"), *ver = json_object_get(root, "version");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "ballast-checkpoint"))
        return errbuf_set(err, errlen, "%s: not a ballast checkpoint manifest (format is not \"ballast-checkpoint\")",
                          man);
    if (!json_is_integer(ver) || json_integer_value(ver) != CKPT_VERSION)
        return errbuf_set(err, errlen, "%s: manifest version %s; this ballast reads version %d (a newer ballast "
                          "wrote it, or the manifest is damaged)", man, json_is_integer(ver) ? "other than 1" : "missing",
                          CKPT_VERSION);
    json_t *st = json_object_get(root, "step");
    if (!json_is_integer(st) || json_integer_value(st) < 0)
        return errbuf_set(err, errlen, "%s: \"step\" must be a non-negative integer", man);
    json_int_t step = json_integer_value(st);
    struct { const char *obj, *key; } also[] = { { "optimizer", "step" }, { "data", "next_step" } };
    for (size_t i = 0; i < sizeof also / sizeof also[0]; i++) {
        json_t *o = json_object_get(root, also[i].obj), *v = json_is_object(o) ? json_object_get(o, also[i].key) : NULL;
        if (!v) continue;
        if (!json_is_integer(v) || json_integer_value(v) != step)
            return errbuf_set(err, errlen, "%s: step %lld, but %s.%s says %s: the manifest contradicts itself (damaged "
                              "or edited); restore it or resume from another step", man, (long long)step, also[i].obj,
                              also[i].key, json_is_integer(v) ? "another step" : "no integer");
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    long long dstep;
    char tail;
    if (!*base) base = path; /* "dir/" */
    if (sscanf(base, "step-%lld%c", &dstep, &tail) == 1 && dstep != (long long)step)
        return errbuf_set(err, errlen, "%s: step %lld, but the directory is %s: the manifest belongs to another step",
                          man, (long long)step, base);
    json_t *cfg = json_object_get(root, "config");
    if (cfg && (!json_is_string(cfg) || strcmp(json_string_value(cfg), "config.json")))
        return errbuf_set(err, errlen, "%s: \"config\" must be \"config.json\" (the file beside the manifest)", man);
    return 0;
}

int ckpt_find_latest(const char *dir, char *path, size_t len, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "%s: cannot read checkpoint directory: %s", dir, strerror(errno));
        return -1;
    }
    long long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "step-%lld%c", &s, &tail) != 1) continue;
        char man[4400];
        snprintf(man, sizeof man, "%s/%s/manifest.json", dir, e->d_name);
        if (access(man, R_OK) == 0 && s > best) best = s;
    }
    closedir(d);
    if (best < 0) return 0;
    snprintf(path, len, "%s/step-%08lld", dir, best);
    return 1;
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

int ckpt_prune(const char *dir, int keep, int *removed, char *err, size_t errlen) {
    *removed = 0;
    if (keep <= 0) return 0;
    DIR *d = opendir(dir);
    if (!d) return errbuf_set(err, errlen, "%s: cannot read checkpoint directory: %s", dir, strerror(errno));
    long long *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char tail;
        /* complete ones only: step-N.tmp (being written) never matches */
        if (sscanf(e->d_name, "step-%lld%c", &s, &tail) != 1) continue;
        char man[4400];
        snprintf(man, sizeof man, "%s/%s/manifest.json", dir, e->d_name);
        if (access(man, R_OK) != 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long long *ns = realloc(steps, cap * sizeof *ns);
            if (!ns) { free(steps); closedir(d); return errbuf_set(err, errlen, "out of memory"); }
            steps = ns;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (n > (size_t)keep) {
        qsort(steps, n, sizeof *steps, cmp_ll);
        for (size_t i = 0; i + (size_t)keep < n; i++) {
            char p[4400];
            snprintf(p, sizeof p, "%s/step-%08lld", dir, steps[i]);
            /* the manifest goes first, so a half-deleted directory is no longer complete */
            char man[4500];
            snprintf(man, sizeof man, "%s/manifest.json", p);
            unlink(man);
            rm_rf(p);
            (*removed)++;
        }
    }
    free(steps);
    return 0;
}

static int jget_num(json_t *o, const char *k, double *out) {
    json_t *v = json_object_get(o, k);
    if (!v || !json_is_number(v)) return -1;
    *out = json_number_value(v);
    return 0;
}

int ckpt_read_meta(const char *path, ckpt_meta_t *meta, char *err, size_t errlen) {
    memset(meta, 0, sizeof *meta);
    char p[4400];
    snprintf(p, sizeof p, "%s/config.json", path);
    if (llama_config_load_json(p, &meta->cfg, err, errlen)) return -1;
    snprintf(p, sizeof p, "%s/manifest.json", path);
    json_error_t je;
    json_t *root = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    if (!root) { snprintf(err, errlen, "%s: not a readable JSON manifest (%s)", p, je.text); return -1; }
    int rc = -1;
    if (check_header(path, p, root, err, errlen)) goto out;
    json_t *fmt = json_object_get(root, "format");
    json_t *data = json_object_get(root, "data"), *opt = json_object_get(root, "optimizer"),
           *rng = json_object_get(root, "rng");
    if (!fmt || !json_is_string(fmt) || strcmp(json_string_value(fmt), "ballast-checkpoint") ||
        !json_is_object(data) || !json_is_object(opt) || !json_is_object(rng)) {
        snprintf(err, errlen, "%s: not a ballast checkpoint manifest (format/data/optimizer/rng missing)", p);
        goto out;
    }
    double v[16];
    if (jget_num(root, "step", &v[0]) || jget_num(data, "seed", &v[1]) || jget_num(data, "micro_batch", &v[2]) ||
        jget_num(data, "seq_len", &v[3]) || jget_num(data, "grad_accum", &v[4]) || jget_num(data, "dp", &v[5]) ||
        jget_num(opt, "lr", &v[6]) || jget_num(opt, "min_lr", &v[7]) || jget_num(opt, "beta1", &v[8]) ||
        jget_num(opt, "beta2", &v[9]) || jget_num(opt, "eps", &v[10]) || jget_num(opt, "weight_decay", &v[11]) ||
        jget_num(opt, "grad_clip", &v[12]) || jget_num(opt, "warmup_steps", &v[13]) ||
        jget_num(opt, "total_steps", &v[14]) || jget_num(rng, "init_seed", &v[15])) {
        snprintf(err, errlen, "%s: a required number is missing (step, data.*, optimizer.*, rng.init_seed)", p);
        goto out;
    }
    meta->step = (int64_t)v[0];
    meta->data_seed = (uint64_t)json_integer_value(json_object_get(data, "seed"));
    meta->B = (int)v[2]; meta->T = (int)v[3]; meta->accum = (int)v[4]; meta->dp = (int)v[5];
    meta->ocfg.lr = v[6]; meta->ocfg.min_lr = v[7]; meta->ocfg.beta1 = v[8]; meta->ocfg.beta2 = v[9];
    meta->ocfg.eps = v[10]; meta->ocfg.weight_decay = v[11]; meta->ocfg.grad_clip = v[12];
    meta->ocfg.warmup_steps = (int64_t)v[13]; meta->ocfg.total_steps = (int64_t)v[14];
    meta->init_seed = (uint64_t)json_integer_value(json_object_get(rng, "init_seed"));
    json_t *sch = json_object_get(opt, "schedule");
    int si = sch && json_is_string(sch) ? optim_schedule_parse(json_string_value(sch)) : -1;
    meta->ocfg.schedule = si < 0 ? LR_CONSTANT : (lr_schedule_t)si;
    json_t *tk = json_object_get(root, "tokenizer");
    if (tk && json_is_string(tk)) snprintf(meta->tokenizer, sizeof meta->tokenizer, "%s", json_string_value(tk));
    json_t *df = json_object_get(opt, "decay_fraction");
    meta->ocfg.decay_fraction = df && json_is_number(df) ? json_number_value(df) : 0;
    json_t *ord = json_object_get(data, "order");
    meta->data_order = ord && json_is_string(ord) && !strcmp(json_string_value(ord), "sequential") ? DATA_SEQUENTIAL
                                                                                                   : DATA_SHUFFLED;
    json_t *dp = json_object_get(data, "path");
    snprintf(meta->data, sizeof meta->data, "%s", dp && json_is_string(dp) ? json_string_value(dp) : "");
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int ckpt_read_layout(const char *path, ckpt_layout_t *lay, char *err, size_t errlen) {
    memset(lay, 0, sizeof *lay);
    char man[4400];
    json_t *root = load_manifest(path, man, sizeof man, err, errlen);
    if (!root) return -1;
    json_t *layout = json_object_get(root, "layout"), *shards = json_object_get(root, "shards");
    lay->step = (int64_t)json_integer_value(json_object_get(root, "step"));
    lay->world = (int)json_integer_value(json_object_get(layout, "world"));
    lay->S = (int)json_integer_value(json_object_get(layout, "shard_degree"));
    lay->T = (int)json_integer_value(json_object_get(layout, "tensor_parallel_degree"));
    lay->n_shards = json_is_array(shards) ? (int)json_array_size(shards) : 0;
    int rc = 0;
    if (!json_is_object(layout) || lay->S < 1 || lay->T < 1 || lay->n_shards < 1) {
        rc = errbuf_set(err, errlen, "%s: no layout or shards", man);
    } else if (lay->n_shards != lay->S * lay->T) {
        rc = errbuf_set(err, errlen, "%s: layout (S %d, T %d) needs %d shard files, the manifest lists %d", man,
                        lay->S, lay->T, lay->S * lay->T, lay->n_shards);
    }
    /* the one-process form: whole tensors, no TP split fields */
    for (int i = 0; !rc && i < lay->n_shards; i++) {
        json_t *parts = json_object_get(json_array_get(shards, (size_t)i), "tensors");
        for (size_t k = 0; k < json_array_size(parts); k++)
            if (!json_object_get(json_array_get(parts, k), "tp_size")) lay->whole_tensors = true;
    }
    json_decref(root);
    return rc;
}

/* The file of one manifest shard entry, checked against its size and
 * crc32: its path into sp. 0, or -1 with a message. */
static int open_shard(const char *path, const char *man, json_int_t step, json_t *sh, int i, char *sp, size_t splen,
                      st_t **st, char *err, size_t errlen) {
    json_t *file = json_is_object(sh) ? json_object_get(sh, "file") : NULL;
    if (!file || !json_is_string(file) || strchr(json_string_value(file), '/'))
        return errbuf_set(err, errlen, "%s: shard %d has no plain file name", man, i), -1;
    snprintf(sp, splen, "%s/%s", path, json_string_value(file));
    if (inside_dir(path, sp, err, errlen)) return -1;
    uint32_t crc;
    uint64_t bytes;
    if (ckpt_file_crc32(sp, &crc, &bytes))
        return errbuf_set(err, errlen, "%s: cannot read: %s", sp, strerror(errno)), -1;
    json_int_t want_bytes = json_integer_value(json_object_get(sh, "bytes"));
    json_int_t want_crc = json_integer_value(json_object_get(sh, "crc32"));
    if ((json_int_t)bytes != want_bytes || (json_int_t)crc != want_crc)
        return errbuf_set(err, errlen, "%s: size %llu / crc32 %08x, manifest says %lld / %08llx: the shard is damaged "
                          "or from another checkpoint", sp, (unsigned long long)bytes, crc, (long long)want_bytes,
                          (unsigned long long)want_crc), -1;
    if (st_open(sp, st, err, errlen)) return -1;
    /* the file's own record of what it is: its step, and (in the sharded
     * form) its chunk and TP rank, as the manifest's entry says */
    const char *what[3] = { "step", "shard", "tp_rank" };
    json_int_t want[3] = { step, json_integer_value(json_object_get(sh, "shard")),
                           json_integer_value(json_object_get(sh, "tp_rank")) };
    for (int k = 0; k < 3; k++) {
        const char *v = st_metadata(*st, what[k]);
        if (k > 0 && (!v || !json_object_get(sh, what[k]))) continue;
        char want_s[32];
        snprintf(want_s, sizeof want_s, "%lld", (long long)want[k]);
        if (!v || strcmp(v, want_s)) {
            errbuf_set(err, errlen, "%s: the file records %s %s, the manifest says %s: the shard is from another "
                       "checkpoint or the manifest is damaged", sp, what[k], v ? v : "(none)", want_s);
            st_close(*st);
            *st = NULL;
            return -1;
        }
    }
    return 0;
}

int ckpt_open_shard(const char *path, int i, st_t **st, char *sp, size_t splen, char *err, size_t errlen) {
    char man[4400];
    json_t *root = load_manifest(path, man, sizeof man, err, errlen);
    if (!root) return -1;
    json_t *shards = json_object_get(root, "shards");
    int rc = open_shard(path, man, json_integer_value(json_object_get(root, "step")),
                        json_is_array(shards) ? json_array_get(shards, (size_t)i) : NULL, i, sp, splen, st, err, errlen);
    json_decref(root);
    return rc;
}

/* ---- full tensors from the parts of any layout ---- */

/* A JSON array of 1 or 2 positive integers into shape[2] (shape[1] = 1 for 1-D). */
static int json_shape(json_t *a, int64_t shape[2]) {
    size_t n = json_is_array(a) ? json_array_size(a) : 0;
    if (n < 1 || n > 2) return -1;
    shape[1] = 1;
    for (size_t k = 0; k < n; k++) {
        json_t *v = json_array_get(a, k);
        if (!json_is_integer(v) || json_integer_value(v) <= 0) return -1;
        shape[k] = json_integer_value(v);
    }
    return 0;
}

/* One part of a manifest, checked against the model's full tensor: the
 * tensor, its TP-local shape, TP rank and element range [a, b) of the
 * TP-local tensor. 0, or -1 with a message naming the tensor. */
typedef struct {
    const model_tensor_t *full;
    int64_t lshape[2];
    int tp_rank, tp_size;
    int64_t a, b;
} part_info_t;

static int parse_part(const char *man, json_t *pj, const model_t *m, part_info_t *pi, char *err, size_t errlen) {
    const char *name = json_string_value(json_object_get(pj, "name"));
    const model_tensor_t *full = name ? model_find(m, name) : NULL;
    if (!full)
        return errbuf_set(err, errlen, "%s: part %s is not a tensor of this model (another config?)", man,
                          name ? name : "(no name)"), -1;
    int64_t shape[2], lshape[2];
    if (json_shape(json_object_get(pj, "shape"), shape) || shape[0] != full->shape[0] || shape[1] != full->shape[1])
        return errbuf_set(err, errlen, "%s: %s has another shape than the model's (%lld x %lld): another config?", man,
                          name, (long long)full->shape[0], (long long)full->shape[1]), -1;
    /* the one-process form lists whole tensors: no TP fields */
    json_t *jt = json_object_get(pj, "tp_size");
    if (jt && (!json_is_integer(jt) || !json_is_integer(json_object_get(pj, "tp_rank")) ||
               !json_is_integer(json_object_get(pj, "tp_dim"))))
        return errbuf_set(err, errlen, "%s: %s: tp_size, tp_rank and tp_dim must be integers", man, name), -1;
    json_int_t tsz = jt ? json_integer_value(jt) : 1, trk = json_integer_value(json_object_get(pj, "tp_rank"));
    json_int_t tdim = jt ? json_integer_value(json_object_get(pj, "tp_dim")) : full->tp_dim;
    if (!jt) memcpy(lshape, shape, sizeof lshape);
    else if (json_shape(json_object_get(pj, "local_shape"), lshape)) lshape[0] = -1;
    int64_t want0 = shape[0], want1 = shape[1];
    if (tsz > 1 && tdim == 0) want0 = full->block < 0 ? (shape[0] + tsz - 1) / tsz : shape[0] / tsz;
    if (tsz > 1 && tdim == 1) want1 = shape[1] / tsz;
    if (tsz < 1 || tsz > 1 << 16 || trk < 0 || trk >= tsz || tdim != full->tp_dim || lshape[0] != want0 ||
        lshape[1] != want1)
        return errbuf_set(err, errlen, "%s: %s: tensor-parallel split (dim %lld, rank %lld of %lld, local shape %lld x "
                          "%lld) does not fit the tensor", man, name, (long long)tdim, (long long)trk, (long long)tsz,
                          (long long)lshape[0], (long long)lshape[1]), -1;
    json_t *rg = json_object_get(pj, "range");
    json_t *ja = json_array_get(rg, 0), *jb = json_array_get(rg, 1);
    json_int_t a = json_integer_value(ja), b = json_integer_value(jb);
    if (!json_is_array(rg) || json_array_size(rg) != 2 || !json_is_integer(ja) || !json_is_integer(jb) || a < 0 ||
        b <= a || b > lshape[0] * lshape[1])
        return errbuf_set(err, errlen, "%s: %s: range is not inside the %lld elements of the part", man, name,
                          (long long)(lshape[0] * lshape[1])), -1;
    *pi = (part_info_t){ .full = full, .lshape = { lshape[0], lshape[1] }, .tp_rank = (int)trk, .tp_size = (int)tsz,
                         .a = a, .b = b };
    return 0;
}

/* One part of a manifest: validate it against the model's full tensor and
 * scatter the file's elements (weights and moments) into the full arrays. */
static int read_part(st_t *st, const char *sp, const char *man, json_t *pj, const model_t *m, float *dst[3],
                     uint8_t *covered, char *err, size_t errlen) {
    part_info_t pi;
    if (parse_part(man, pj, m, &pi, err, errlen)) return -1;
    const model_tensor_t *full = pi.full;
    const char *name = full->name;
    const int64_t *lshape = pi.lshape;
    int trk = pi.tp_rank;
    int64_t a = pi.a, b = pi.b;
    size_t n = (size_t)(b - a);
    float *buf = malloc(n * sizeof(float));
    if (!buf) return errbuf_set(err, errlen, "out of memory reading %s", sp), -1;
    int rc = 0;
    for (int s = 0; s < 3 && !rc; s++) {
        if (!dst[s]) continue;
        char nm[MODEL_NAME_LEN + 16];
        snprintf(nm, sizeof nm, "%s%s", name, SUFFIX[s]);
        const st_info_t *info = st_find(st, nm);
        int64_t cnt = 1;
        for (int k = 0; info && k < info->ndim; k++) cnt *= info->shape[k];
        if (!info || cnt != (int64_t)n) {
            errbuf_set(err, errlen, "%s: tensor %s is missing or has %lld elements, the manifest says %zu", sp, nm,
                       (long long)(info ? cnt : 0), n);
            rc = -1;
            break;
        }
        if (st_read_f32(st, nm, info->shape, info->ndim, buf, err, errlen)) { rc = -1; break; }
        for (size_t j = 0; j < n; j++) {
            int64_t k = model_tp_full_index(full, lshape, trk, (size_t)a + j);
            if (k < 0) continue;   /* vocab padding */
            dst[s][full->offset + (size_t)k] = buf[j];
            if (s == 0) covered[full->offset + (size_t)k] = 1;
        }
    }
    free(buf);
    return rc;
}

/* ---- checking a checkpoint before it is read ---- */

int ckpt_verify(const char *path, const model_t *m, char *err, size_t errlen) {
    char man[4400], fp[4600];
    json_t *root = load_manifest(path, man, sizeof man, err, errlen);
    if (!root) return -1;
    int rc = -1;
    int64_t *next = NULL;   /* (tensor, TP rank): the next element the parts in shard order must start at */
    int *last = NULL;       /* (tensor, TP rank): the shard that holds the range before it, -1 none */
    if (check_header(path, man, root, err, errlen)) goto out;
    if (inside_dir(path, man, err, errlen)) goto out;
    snprintf(fp, sizeof fp, "%s/config.json", path);
    if (inside_dir(path, fp, err, errlen)) goto out;
    json_t *layout = json_object_get(root, "layout"), *shards = json_object_get(root, "shards");
    json_t *jw = json_object_get(layout, "world"), *js = json_object_get(layout, "shard_degree"),
           *jt = json_object_get(layout, "tensor_parallel_degree");
    if (!json_is_integer(jw) || !json_is_integer(js) || !json_is_integer(jt) || json_integer_value(js) < 1 ||
        json_integer_value(jt) < 1 || json_integer_value(js) > 1 << 16 || json_integer_value(jt) > 1 << 16 ||
        json_integer_value(jw) < json_integer_value(js) * json_integer_value(jt) ||
        json_integer_value(jw) % (json_integer_value(js) * json_integer_value(jt))) {
        errbuf_set(err, errlen, "%s: layout needs integers world, shard_degree (S) and tensor_parallel_degree (T) "
                   "with world a multiple of S x T", man);
        goto out;
    }
    int S = (int)json_integer_value(js), T = (int)json_integer_value(jt), nf = S * T;
    if (!json_is_array(shards) || json_array_size(shards) != (size_t)nf) {
        errbuf_set(err, errlen, "%s: layout (S %d, T %d) needs %d shard files, the manifest lists %zu", man, S, T, nf,
                   json_is_array(shards) ? json_array_size(shards) : 0);
        goto out;
    }
    size_t nk = (size_t)m->n_tensors * (size_t)T;
    next = calloc(nk, sizeof *next);
    last = malloc(nk * sizeof *last);
    if (!next || !last) { errbuf_set(err, errlen, "out of memory"); goto out; }
    for (size_t k = 0; k < nk; k++) last[k] = -1;
    for (int i = 0; i < nf; i++) {
        json_t *sh = json_array_get(shards, (size_t)i), *parts = json_object_get(sh, "tensors");
        char want[64];
        snprintf(want, sizeof want, CKPT_SHARD_FMT, i, nf);
        json_t *file = json_object_get(sh, "file");
        if (!json_is_string(file) || strcmp(json_string_value(file), want)) {
            errbuf_set(err, errlen, "%s: shard %d must be the file %s of this directory (the manifest names %s)", man, i,
                       want, json_is_string(file) ? json_string_value(file) : "no file");
            goto out;
        }
        json_t *fs = json_object_get(sh, "shard"), *ft = json_object_get(sh, "tp_rank");
        if ((fs && (!json_is_integer(fs) || json_integer_value(fs) != i / T)) ||
            (ft && (!json_is_integer(ft) || json_integer_value(ft) != i % T))) {
            errbuf_set(err, errlen, "%s: shard %d (%s) must be chunk %d of TP rank %d, the manifest says otherwise", man,
                       i, want, i / T, i % T);
            goto out;
        }
        json_t *jb = json_object_get(sh, "bytes"), *jc = json_object_get(sh, "crc32");
        if (!json_is_integer(jb) || !json_is_integer(jc) || json_integer_value(jb) < 0 || json_integer_value(jc) < 0 ||
            json_integer_value(jc) > 0xFFFFFFFFll) {
            errbuf_set(err, errlen, "%s: shard %d needs integer bytes and crc32", man, i);
            goto out;
        }
        snprintf(fp, sizeof fp, "%s/%s", path, want);
        if (inside_dir(path, fp, err, errlen)) goto out;
        struct stat sb;
        if (stat(fp, &sb) || !S_ISREG(sb.st_mode) || (json_int_t)sb.st_size != json_integer_value(jb)) {
            errbuf_set(err, errlen, "%s: %s, the manifest says a file of %lld bytes: the shard is damaged or from "
                       "another checkpoint", fp, stat(fp, &sb) ? strerror(errno) : !S_ISREG(sb.st_mode) ?
                       "not a regular file" : "another size", (long long)json_integer_value(jb));
            goto out;
        }
        if (!json_is_array(parts) || !json_array_size(parts)) {
            errbuf_set(err, errlen, "%s: shard %d lists no tensors", man, i);
            goto out;
        }
        for (size_t k = 0; k < json_array_size(parts); k++) {
            part_info_t pi;
            if (parse_part(man, json_array_get(parts, k), m, &pi, err, errlen)) goto out;
            const char *nm = pi.full->name;
            bool whole = !json_object_get(json_array_get(parts, k), "tp_size");
            if ((whole && T != 1) || (!whole && (pi.tp_size != T || pi.tp_rank != i % T))) {
                errbuf_set(err, errlen, "%s: %s in shard %d: TP rank %d of %d, but the file belongs to TP rank %d of %d",
                           man, nm, i, pi.tp_rank, pi.tp_size, i % T, T);
                goto out;
            }
            size_t key = (size_t)(pi.full - m->tensors) * (size_t)T + (size_t)pi.tp_rank;
            if (last[key] == i) {
                errbuf_set(err, errlen, "%s: %s is listed twice in shard %d", man, nm, i);
                goto out;
            }
            if (pi.a > next[key]) {
                errbuf_set(err, errlen, "%s: %s (TP rank %d): shard %d holds [%lld, %lld), but no shard before it holds "
                           "[%lld, %lld): a gap, or ranges out of shard order (swapped ranges would permute the "
                           "weights)", man, nm, pi.tp_rank, i, (long long)pi.a, (long long)pi.b, (long long)next[key],
                           (long long)pi.a);
                goto out;
            }
            if (pi.a < next[key]) {
                errbuf_set(err, errlen, "%s: %s (TP rank %d): shard %d holds [%lld, %lld), but shard %d before it "
                           "already reaches %lld: overlapping ranges, or ranges out of shard order (swapped ranges would permute "
                           "the weights)",
                           man, nm, pi.tp_rank, i, (long long)pi.a, (long long)pi.b, last[key], (long long)next[key]);
                goto out;
            }
            next[key] = pi.b;
            last[key] = i;
        }
    }
    for (int t = 0; t < m->n_tensors; t++)
        for (int r = 0; r < T; r++) {
            const model_tensor_t *full = &m->tensors[t];
            size_t key = (size_t)t * (size_t)T + (size_t)r;
            /* every TP rank's local tensor has the same element count */
            int64_t l0 = full->shape[0], l1 = full->ndim == 2 ? full->shape[1] : 1;
            if (T > 1 && full->tp_dim == 0) l0 = full->block < 0 ? (l0 + T - 1) / T : l0 / T;
            if (T > 1 && full->tp_dim == 1) l1 /= T;
            if (next[key] != l0 * l1) {
                errbuf_set(err, errlen, "%s: %s (TP rank %d): elements [%lld, %lld) are in no shard: the checkpoint is "
                           "incomplete", man, full->name, r, (long long)next[key], (long long)(l0 * l1));
                goto out;
            }
        }
    rc = 0;
out:
    free(next);
    free(last);
    json_decref(root);
    return rc;
}

int ckpt_read_full(const char *path, const model_t *m, float *params, float *exp_avg, float *exp_avg_sq,
                   int64_t *step, char *err, size_t errlen) {
    char man[4400], sp[4600];
    if (ckpt_verify(path, m, err, errlen)) return -1;
    json_t *root = load_manifest(path, man, sizeof man, err, errlen);
    if (!root) return -1;
    int rc = -1;
    uint8_t *covered = calloc(m->n_params, 1);
    json_t *shards = json_object_get(root, "shards");
    if (!covered) { errbuf_set(err, errlen, "out of memory"); goto out; }
    if (!json_is_array(shards) || !json_array_size(shards)) { errbuf_set(err, errlen, "%s: no shards", man); goto out; }
    float *dst[3] = { params, exp_avg, exp_avg_sq };
    for (size_t i = 0; i < json_array_size(shards); i++) {
        json_t *sh = json_array_get(shards, i), *parts = json_object_get(sh, "tensors");
        st_t *st = NULL;
        if (open_shard(path, man, json_integer_value(json_object_get(root, "step")), sh, (int)i, sp, sizeof sp, &st,
                       err, errlen))
            goto out;
        int bad = !json_is_array(parts);
        if (bad) errbuf_set(err, errlen, "%s: shard %zu lists no tensors", man, i);
        for (size_t k = 0; !bad && k < json_array_size(parts); k++)
            bad = read_part(st, sp, man, json_array_get(parts, k), m, dst, covered, err, errlen) != 0;
        st_close(st);
        if (bad) goto out;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        for (size_t j = 0; j < t->numel; j++)
            if (!covered[t->offset + j]) {
                errbuf_set(err, errlen, "%s: element %zu of %s is in no shard: the checkpoint is incomplete", man, j,
                           t->name);
                goto out;
            }
    }
    if (step) *step = (int64_t)json_integer_value(json_object_get(root, "step"));
    rc = 0;
out:
    free(covered);
    json_decref(root);
    return rc;
}

int ckpt_read_weights(const char *path, const model_t *m, float *host, char *err, size_t errlen) {
    return ckpt_read_full(path, m, host, NULL, NULL, NULL, err, errlen);
}
