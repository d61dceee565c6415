/* hf.c: Hugging Face model directories; see hf.h. Relies on
 * safetensors.h for the files (which follows a model.safetensors.index.json
 * over several files) and ckpt.h for making the directory. */
#include "workers/ckpt/hf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "workers/ckpt/ckpt.h"
#include "workers/ckpt/safetensors.h"

/* Whether tensor info of the directory is one ballast can leave out: the
 * rotary inverse frequencies older conversions stored per layer, when they
 * are the ones rope_theta gives, and a tied model's lm_head when it equals
 * embed_tokens. 1 yes, 0 with a message naming it otherwise (another model
 * than the config describes), -1 with a message on a read error. */
static int extra_tensor_ok(st_t *st, const st_info_t *info, const model_t *m, const float *host, char *err,
                           size_t errlen) {
    const llama_config_t *c = &m->cfg;
    const char *nm = info->name, *tail = strstr(nm, ".self_attn.rotary_emb.inv_freq");
    int rc = 0;
    if (tail && !strncmp(nm, "model.layers.", 13) && !tail[30]) {
        int64_t n = c->head_dim / 2;
        float *f = malloc((size_t)n * sizeof *f);
        if (!f) return errbuf_set(err, errlen, "out of memory"), -1;
        if (st_read_f32(st, nm, &n, 1, f, err, errlen)) { free(f); return -1; }
        rc = 1;
        for (int64_t i = 0; i < n && rc; i++) {
            double want = 1.0 / pow((double)c->rope_theta, 2.0 * (double)i / c->head_dim);
            if (fabs(f[i] - want) > 1e-6 + 1e-3 * want) rc = 0;
        }
        free(f);
        if (!rc)
            errbuf_set(err, errlen, "tensor %s holds other rotary frequencies than rope_theta %g gives: the model "
                       "uses another position encoding than its config.json says", nm, c->rope_theta);
        return rc;
    }
    if (!strcmp(nm, "lm_head.weight") && c->tie_embeddings) {
        const model_tensor_t *e = model_find(m, "model.embed_tokens.weight");
        float *f = e ? malloc(e->numel * sizeof *f) : NULL;
        if (!f) return errbuf_set(err, errlen, "out of memory"), -1;
        if (st_read_f32(st, nm, e->shape, e->ndim, f, err, errlen)) { free(f); return -1; }
        rc = !memcmp(f, host + e->offset, e->numel * sizeof *f);
        free(f);
        if (!rc)
            errbuf_set(err, errlen, "tensor lm_head.weight differs from model.embed_tokens.weight, but config.json "
                       "ties them (tie_word_embeddings true): set it false or drop lm_head.weight");
        return rc;
    }
    errbuf_set(err, errlen, "tensor %s is not part of a Llama block as ballast builds it (a bias, or another "
               "architecture): ballast would drop it and train another model; use a checkpoint without it", nm);
    return 0;
}

int ckpt_read_hf_host(const char *dir, const model_t *m, float *host, char *err, size_t errlen) {
    st_t *st = NULL;
    if (st_open(dir, &st, err, errlen)) return -1;
    int rc = -1;
    char why[768];
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        if (!st_find(st, t->name)) {
            snprintf(err, errlen, "%s: tensor %s is missing (is this a Llama checkpoint of the same shape?)", dir, t->name);
            goto out;
        }
        if (st_read_f32(st, t->name, t->shape, t->ndim, host + t->offset, err, errlen)) goto out;
    }
    /* every tensor of the directory is one the model uses (or may leave out) */
    for (int i = 0; i < st_count(st); i++) {
        const st_info_t *info = st_info(st, i);
        if (model_find(m, info->name)) continue;
        int ok = extra_tensor_ok(st, info, m, host, why, sizeof why);
        if (ok <= 0) {
            const char *f = st_file_of(st, info->name);
            snprintf(err, errlen, "%s: %s", f ? f : dir, why);
            goto out;
        }
    }
    rc = 0;
out:
    st_close(st);
    return rc;
}

int ckpt_write_hf(const char *out_dir, const model_t *m, const float *host, int dtype, char *err, size_t errlen) {
    if (ckpt_mkdirs(out_dir, err, errlen)) return -1;
    char p[4400];
    snprintf(p, sizeof p, "%s/config.json", out_dir);
    if (llama_config_save_json(&m->cfg, p, dtype == ST_BF16 ? "bfloat16" : dtype == ST_F16 ? "float16" : "float32", err,
                               errlen))
        return -1;
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
