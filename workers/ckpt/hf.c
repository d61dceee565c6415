/* hf.c: Hugging Face model directories; see hf.h. Relies on
 * safetensors.h for the files (which follows a model.safetensors.index.json
 * over several files) and ckpt.h for making the directory. */
#include "workers/ckpt/hf.h"

#include <stdio.h>

#include "workers/ckpt/ckpt.h"
#include "workers/ckpt/safetensors.h"

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
