/* hooks.c: the worker's test hooks; see hooks.h. Relies on safetensors.h
 * for the files. */
#include "workers/train/hooks.h"

#include <stdbool.h>
#include <stdio.h>

#include "errbuf.h"
#include "workers/ckpt/safetensors.h"

/* Add every tensor of the table from full (model layout). */
static int add_tensors(st_writer_t *w, const model_t *m, const float *full) {
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tensors[i];
        if (st_writer_add_f32(w, t->name, ST_F32, t->shape, t->ndim, full + t->offset)) return -1;
    }
    return 0;
}

int train_dump_params(const char *path, const model_t *m, const float *full, char *err, size_t errlen) {
    st_writer_t *w = st_writer_new();
    if (!w || add_tensors(w, m, full)) {
        if (w) st_writer_free(w);
        return errbuf_set(err, errlen, "out of memory writing %s", path);
    }
    int rc = st_writer_save(w, path, err, errlen);
    st_writer_free(w);
    return rc;
}

int train_dump_grads(const char *path, const model_t *m, const float *logits, double loss, const float *grads,
                     char *err, size_t errlen) {
    st_writer_t *w = st_writer_new();
    int64_t lshape[2] = { (int64_t)m->B * m->T, m->cfg.vocab }, one = 1;
    float lf = (float)loss;
    if (!w || st_writer_add_f32(w, "logits", ST_F32, lshape, 2, logits) ||
        st_writer_add_f32(w, "loss", ST_F32, &one, 1, &lf) || add_tensors(w, m, grads)) {
        if (w) st_writer_free(w);
        return errbuf_set(err, errlen, "out of memory writing %s", path);
    }
    int rc = st_writer_save(w, path, err, errlen);
    st_writer_free(w);
    return rc;
}

int train_dump_batch(const char *dir, int rank, const int32_t *inputs, size_t n, char *err, size_t errlen) {
    char path[4200];
    if (snprintf(path, sizeof path, "%s/tokens-rank-%05d.bin", dir, rank) >= (int)sizeof path)
        return errbuf_set(err, errlen, "--dump-batches: directory name too long");
    FILE *fp = fopen(path, "ab");
    bool ok = fp && fwrite(inputs, sizeof *inputs, n, fp) == n;
    if (fp && fclose(fp)) ok = false;
    if (!ok) return errbuf_set(err, errlen, "--dump-batches: cannot append to %s", path);
    return 0;
}
