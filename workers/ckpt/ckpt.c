/* ckpt.c: checkpoint directories (manifest + safetensors shards) and
 * Hugging Face model directories; see ckpt.h. Relies on safetensors.h for
 * the file format and jansson for JSON. */
#include "workers/ckpt/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workers/data/data.h"
#include "workers/parallel/fsdp.h"
#include "workers/ckpt/safetensors.h"

#define SHARD_FMT "shard-%05d-of-%05d.safetensors"

/* ---- helpers ---- */

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

/* ---- save ---- */

/* Add every tensor of the table (weights, then moments) to a writer. */
static int add_tensors(st_writer_t *w, const model_t *m, const float *host, const char *suffix) {
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        char name[MODEL_NAME_LEN + 16];
        snprintf(name, sizeof name, "%s%s", t->name, suffix);
        if (st_writer_add_f32(w, name, ST_F32, t->shape, t->ndim, host + t->offset)) return -1;
    }
    return 0;
}

static json_t *manifest_json(const ckpt_meta_t *meta, const model_t *m, const char *shard, uint32_t crc,
                             uint64_t bytes) {
    const optim_config_t *oc = &meta->ocfg;
    json_t *tensors = json_array();
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        json_t *shape = t->ndim == 2 ? json_pack("[II]", (json_int_t)t->shape[0], (json_int_t)t->shape[1])
                                     : json_pack("[I]", (json_int_t)t->shape[0]);
        json_array_append_new(tensors, json_pack("{s:s, s:o, s:[I,I], s:b}", "name", t->name, "shape", shape,
                                                 "range", (json_int_t)0, (json_int_t)t->numel, "decay", t->decay));
    }
    json_t *shards = json_pack("[{s:s, s:i, s:I, s:I, s:[s,s,s], s:o}]", "file", shard, "rank", 0,
                               "bytes", (json_int_t)bytes, "crc32", (json_int_t)crc,
                               "contents", "weights NAME (fp32)", "exp_avg NAME.exp_avg", "exp_avg_sq NAME.exp_avg_sq",
                               "tensors", tensors);
    return json_pack("{s:s, s:i, s:I, s:s, s:{s:i, s:i, s:i}, s:{s:s, s:s, s:I, s:i, s:i, s:i, s:i, s:I},"
                     " s:{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:I, s:I, s:I},"
                     " s:{s:I, s:I}, s:o}",
                     "format", "ballast-checkpoint", "version", 1, "step", (json_int_t)meta->step,
                     "config", "config.json",
                     "layout", "world", 1, "shard_degree", 1, "tensor_parallel_degree", 1,
                     "data", "path", meta->data, "order", order_name(meta->data_order),
                     "seed", (json_int_t)meta->data_seed, "micro_batch", meta->B, "seq_len", meta->T,
                     "grad_accum", meta->accum, "dp", meta->dp, "next_step", (json_int_t)meta->step,
                     "optimizer", "type", "adamw", "lr", oc->lr, "min_lr", oc->min_lr, "beta1", oc->beta1,
                     "beta2", oc->beta2, "eps", oc->eps, "weight_decay", oc->weight_decay, "grad_clip", oc->grad_clip,
                     "schedule", oc->schedule == LR_COSINE ? "cosine" : "constant",
                     "warmup_steps", (json_int_t)oc->warmup_steps, "total_steps", (json_int_t)oc->total_steps,
                     "step", (json_int_t)meta->step,
                     "rng", "init_seed", (json_int_t)meta->init_seed, "data_seed", (json_int_t)meta->data_seed,
                     "shards", shards);
}

int ckpt_save(const char *dir, const ckpt_meta_t *meta, const model_t *m, const optim_t *o, char *err, size_t errlen) {
    char final[4096], tmp[4200], path[4400];
    snprintf(final, sizeof final, "%s/step-%08lld", dir, (long long)meta->step);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    if (mkdir_p(dir, err, errlen)) return -1;
    rm_rf(tmp);
    if (mkdir_p(tmp, err, errlen)) return -1;

    size_t n = m->n_params;
    float *host = malloc(n * sizeof(float));
    if (!host) { snprintf(err, errlen, "out of memory staging a checkpoint"); return -1; }
    st_writer_t *w = st_writer_new();
    int rc = -1;
    if (!w) { snprintf(err, errlen, "out of memory staging a checkpoint"); goto out; }
    /* the writer copies, so one staging buffer serves the three states */
    model_get_params(m, host);
    if (add_tensors(w, m, host, "")) goto nomem;
    o->be->to_host(host, o->m, n * sizeof(float));
    if (add_tensors(w, m, host, ".exp_avg")) goto nomem;
    o->be->to_host(host, o->v, n * sizeof(float));
    if (add_tensors(w, m, host, ".exp_avg_sq")) goto nomem;
    char stepbuf[32];
    snprintf(stepbuf, sizeof stepbuf, "%lld", (long long)meta->step);
    st_writer_set_metadata(w, "format", "ballast-checkpoint-shard");
    st_writer_set_metadata(w, "step", stepbuf);
    st_writer_set_metadata(w, "rank", "0");
    char shard[64];
    snprintf(shard, sizeof shard, SHARD_FMT, 0, 1);
    snprintf(path, sizeof path, "%s/%s", tmp, shard);
    if (st_writer_save(w, path, err, errlen)) goto out;

    uint32_t crc;
    uint64_t bytes;
    if (ckpt_file_crc32(path, &crc, &bytes)) { snprintf(err, errlen, "%s: cannot read back: %s", path, strerror(errno)); goto out; }
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if (llama_config_save_json(&meta->cfg, path, err, errlen)) goto out;
    json_t *man = manifest_json(meta, m, shard, crc, bytes);
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    int jr = man ? json_dump_file(man, path, JSON_INDENT(2)) : -1;
    json_decref(man);
    if (jr) { snprintf(err, errlen, "%s: cannot write manifest", path); goto out; }
    rm_rf(final);
    if (rename(tmp, final)) { snprintf(err, errlen, "%s: cannot rename to %s: %s", tmp, final, strerror(errno)); goto out; }
    rc = 0;
    goto out;
nomem:
    snprintf(err, errlen, "out of memory staging a checkpoint");
out:
    if (w) st_writer_free(w);
    free(host);
    return rc;
}

/* ---- find and read ---- */

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
    json_t *root = json_load_file(p, 0, &je);
    if (!root) { snprintf(err, errlen, "%s: not a readable JSON manifest (%s)", p, je.text); return -1; }
    int rc = -1;
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
    meta->ocfg.schedule = sch && json_is_string(sch) && !strcmp(json_string_value(sch), "cosine") ? LR_COSINE : LR_CONSTANT;
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

/* Read weights (and moments when host_m/host_v are given) from a step
 * directory into host buffers in m's layout, checking the shard's size and
 * crc32 against the manifest first. */
static int ckpt_read_host(const char *path, const model_t *m, float *host_p, float *host_m, float *host_v,
                          int64_t *step, char *err, size_t errlen) {
    char p[4400];
    snprintf(p, sizeof p, "%s/manifest.json", path);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    if (!root) { snprintf(err, errlen, "%s: not a readable JSON manifest (%s)", p, je.text); return -1; }
    int rc = -1;
    st_t *st = NULL;
    json_t *shards = json_object_get(root, "shards");
    json_t *sh0 = json_is_array(shards) ? json_array_get(shards, 0) : NULL;
    json_t *file = sh0 ? json_object_get(sh0, "file") : NULL;
    if (!file || !json_is_string(file) || json_array_size(shards) != 1 || strchr(json_string_value(file), '/')) {
        snprintf(err, errlen, "%s: expected exactly one shard with a plain file name (this build reads 1-rank checkpoints)", p);
        goto out;
    }
    if (step) *step = (int64_t)json_integer_value(json_object_get(root, "step"));
    char sp[4600];
    snprintf(sp, sizeof sp, "%s/%s", path, json_string_value(file));
    uint32_t crc;
    uint64_t bytes;
    if (ckpt_file_crc32(sp, &crc, &bytes)) { snprintf(err, errlen, "%s: cannot read: %s", sp, strerror(errno)); goto out; }
    json_int_t want_bytes = json_integer_value(json_object_get(sh0, "bytes"));
    json_int_t want_crc = json_integer_value(json_object_get(sh0, "crc32"));
    if ((json_int_t)bytes != want_bytes || (json_int_t)crc != want_crc) {
        snprintf(err, errlen, "%s: size %llu / crc32 %08x, manifest says %lld / %08llx: the shard is damaged or from another checkpoint",
                 sp, (unsigned long long)bytes, crc, (long long)want_bytes, (unsigned long long)want_crc);
        goto out;
    }
    if (st_open(sp, &st, err, errlen)) goto out;
    const char *suffix[3] = { "", ".exp_avg", ".exp_avg_sq" };
    float *dst[3] = { host_p, host_m, host_v };
    for (int s = 0; s < 3; s++) {
        if (!dst[s]) continue;
        for (int i = 0; i < m->n_tensors; i++) {
            const model_tensor_t *t = &m->tensors[i];
            char name[MODEL_NAME_LEN + 16];
            snprintf(name, sizeof name, "%s%s", t->name, suffix[s]);
            if (!st_find(st, name)) { snprintf(err, errlen, "%s: tensor %s is missing", sp, name); goto out; }
            if (st_read_f32(st, name, t->shape, t->ndim, dst[s] + t->offset, err, errlen)) goto out;
        }
    }
    rc = 0;
out:
    if (st) st_close(st);
    json_decref(root);
    return rc;
}

static bool same_config(const llama_config_t *a, const llama_config_t *b) {
    return a->dim == b->dim && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim && a->ffn_dim == b->ffn_dim &&
           a->vocab == b->vocab && a->tie_embeddings == b->tie_embeddings;
}

/* Number of shard files the manifest of step directory path lists; 0 when
 * it cannot be read (the reader that follows says why). */
static size_t ckpt_shard_count(const char *path) {
    char p[4400];
    snprintf(p, sizeof p, "%s/manifest.json", path);
    json_t *root = json_load_file(p, 0, NULL);
    json_t *shards = root ? json_object_get(root, "shards") : NULL;
    size_t n = json_is_array(shards) ? json_array_size(shards) : 0;
    json_decref(root);
    return n;
}

int ckpt_load(const char *path, model_t *m, optim_t *o, char *err, size_t errlen) {
    ckpt_meta_t meta;
    if (ckpt_read_meta(path, &meta, err, errlen)) return -1;
    if (!same_config(&meta.cfg, &m->cfg)) {
        snprintf(err, errlen, "%s: the checkpoint's model (dim %d, %d layers, vocab %d) differs from --model (dim %d, %d layers, vocab %d)",
                 path, meta.cfg.dim, meta.cfg.n_layers, meta.cfg.vocab, m->cfg.dim, m->cfg.n_layers, m->cfg.vocab);
        return -1;
    }
    size_t n = m->n_params;
    float *hp = malloc(n * sizeof(float)), *hm = malloc(n * sizeof(float)), *hv = malloc(n * sizeof(float));
    int rc = -1;
    int64_t step = 0;
    if (!hp || !hm || !hv) { snprintf(err, errlen, "out of memory loading %s", path); goto out; }
    /* a checkpoint of several shards (a sharded or tensor-parallel run) goes
     * through the resharding reader, which rebuilds the full tensors */
    if (ckpt_shard_count(path) > 1 ? fsdp_ckpt_read_full(path, m, hp, hm, hv, &step, err, errlen)
                                   : ckpt_read_host(path, m, hp, hm, hv, &step, err, errlen))
        goto out;
    model_set_params(m, hp);
    o->be->from_host(o->m, hm, n * sizeof(float));
    o->be->from_host(o->v, hv, n * sizeof(float));
    o->step = step;
    rc = 0;
out:
    free(hp); free(hm); free(hv);
    return rc;
}

/* ---- Hugging Face directories ---- */

int ckpt_load_hf(const char *dir, model_t *m, char *err, size_t errlen) {
    float *host = malloc(m->n_params * sizeof(float));
    if (!host) return snprintf(err, errlen, "out of memory loading %s", dir), -1;
    int rc = ckpt_read_hf_host(dir, m, host, err, errlen);
    if (!rc) model_set_params(m, host);
    free(host);
    return rc;
}

int ckpt_read_hf_host(const char *dir, const model_t *m, float *host, char *err, size_t errlen) {
    st_t *st = NULL;
    if (st_open(dir, &st, err, errlen)) return -1;
    int rc = -1;
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        if (!st_find(st, t->name)) {
            snprintf(err, errlen, "%s: tensor %s is missing (is this a Llama checkpoint of the same shape?)", dir, t->name);
            goto out;
        }
        if (st_read_f32(st, t->name, t->shape, t->ndim, host + t->offset, err, errlen)) goto out;
    }
    rc = 0;
out:
    st_close(st);
    return rc;
}

int ckpt_write_hf(const char *out_dir, const model_t *m, const float *host, int dtype, char *err, size_t errlen) {
    if (mkdir_p(out_dir, err, errlen)) return -1;
    char p[4400];
    snprintf(p, sizeof p, "%s/config.json", out_dir);
    if (llama_config_save_json(&m->cfg, p, err, errlen)) return -1;
    st_writer_t *w = st_writer_new();
    if (!w) { snprintf(err, errlen, "out of memory"); return -1; }
    int rc = -1;
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        if (st_writer_add_f32(w, t->name, (st_dtype_t)dtype, t->shape, t->ndim, host + t->offset)) {
            snprintf(err, errlen, "out of memory adding %s", t->name);
            goto out;
        }
    }
    st_writer_set_metadata(w, "format", "pt");
    snprintf(p, sizeof p, "%s/model.safetensors", out_dir);
    rc = st_writer_save(w, p, err, errlen);
out:
    st_writer_free(w);
    return rc;
}

/* Exported for `ballast ckpt export`: weights of a step directory into host
 * memory in m's layout (m from model_layout). */
int ckpt_read_weights(const char *path, const model_t *m, float *host, char *err, size_t errlen) {
    /* any layout: one file, or the parts of a sharded / tensor-parallel run */
    return fsdp_ckpt_read_full(path, m, host, NULL, NULL, NULL, err, errlen);
}

int ckpt_mkdirs(const char *path, char *err, size_t errlen) { return mkdir_p(path, err, errlen); }
void ckpt_remove_tree(const char *path) { rm_rf(path); }
