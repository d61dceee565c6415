/* fsdp_ckpt.c: sharded checkpoints of a hybrid-sharded run; see fsdp.h.
 *
 * The directory has the layout and manifest keys of workers/ckpt.h (so
 * ckpt_find_latest, ckpt_read_meta and `ballast ckpt info` read it), with
 * S shard files instead of one. Shard file i holds chunk i of every unit
 * (identical on every replica, so only replica 0 writes): each tensor part
 * as 1-D NAME, NAME.exp_avg and NAME.exp_avg_sq; the manifest gives each
 * part's flat element range [start, end) of the full tensor. Loading needs
 * the same S (and T = 1); the number of replicas may differ. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "workers/data.h"
#include "workers/fsdp.h"
#include "workers/safetensors.h"

#define FSDP_SHARD_FMT "shard-%05d-of-%05d.safetensors"

/* A collective "everyone agrees": sums the ranks' failure flags; a rank
 * that failed keeps its own message, the others get one naming the count. */
static int agree(fsdp_t *f, int failed, const char *what, char *err, size_t errlen) {
    double n;
    char e[COMM_ERR_LEN];
    if (fsdp_sum_all(f, failed ? 1 : 0, &n, e, sizeof e)) {
        if (!failed) snprintf(err, errlen, "%s: %s", what, e);
        return -EIO;
    }
    if (n > 0 && !failed) snprintf(err, errlen, "%s failed on %d rank(s); see their messages", what, (int)n);
    return n > 0 ? -EIO : 0;
}

static json_t *shard_json(const fsdp_t *f, int sidx, uint32_t crc, uint64_t bytes) {
    const model_t *m = f->m;
    model_tensor_t *segs = calloc((size_t)m->n_tensors, sizeof *segs);
    size_t *start = calloc((size_t)m->n_tensors, sizeof *start);
    if (!segs || !start) { free(segs); free(start); return NULL; }
    int n = fsdp_segments(f, sidx, segs, start);
    json_t *tensors = json_array();
    for (int i = 0; i < n; i++) {
        const model_tensor_t *t = &segs[i];
        json_t *shape = t->ndim == 2 ? json_pack("[II]", (json_int_t)t->shape[0], (json_int_t)t->shape[1])
                                     : json_pack("[I]", (json_int_t)t->shape[0]);
        json_array_append_new(tensors, json_pack("{s:s, s:o, s:[I,I], s:b}", "name", t->name, "shape", shape, "range",
                                                 (json_int_t)start[i], (json_int_t)(start[i] + t->numel), "decay",
                                                 t->decay));
    }
    free(segs);
    free(start);
    char file[64];
    snprintf(file, sizeof file, FSDP_SHARD_FMT, sidx, f->S);
    /* T = 1: the writer of shard index i in replica 0 is global rank i */
    return json_pack("{s:s, s:i, s:I, s:I, s:[s,s,s], s:o}", "file", file, "rank", sidx, "bytes", (json_int_t)bytes,
                     "crc32", (json_int_t)crc, "contents", "weights NAME (fp32, 1-D part)",
                     "exp_avg NAME.exp_avg", "exp_avg_sq NAME.exp_avg_sq", "tensors", tensors);
}

static json_t *manifest_json(const fsdp_t *f, const ckpt_meta_t *meta, int world, json_t *shards) {
    const optim_config_t *oc = &meta->ocfg;
    return json_pack("{s:s, s:i, s:I, s:s, s:{s:i, s:i, s:i}, s:{s:s, s:s, s:I, s:i, s:i, s:i, s:i, s:I},"
                     " s:{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:I, s:I, s:I},"
                     " s:{s:I, s:I}, s:o}",
                     "format", "ballast-checkpoint", "version", 1, "step", (json_int_t)meta->step,
                     "config", "config.json",
                     "layout", "world", world, "shard_degree", f->S, "tensor_parallel_degree", 1,
                     "data", "path", meta->data, "order", meta->data_order == DATA_SEQUENTIAL ? "sequential" : "shuffled",
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

/* This rank's shard file: its parts of every tensor and their moments. */
static int write_shard(fsdp_t *f, const char *path, int64_t step, char *err, size_t errlen) {
    st_writer_t *w = st_writer_new();
    if (!w) return errbuf_set(err, errlen, "out of memory writing %s", path);
    const float *src[3] = { f->master, f->opt.m, f->opt.v };
    const char *suffix[3] = { "", ".exp_avg", ".exp_avg_sq" };
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < f->n_segs; i++) {
            const model_tensor_t *t = &f->segs[i];
            char name[MODEL_NAME_LEN + 16];
            snprintf(name, sizeof name, "%s%s", t->name, suffix[s]);
            int64_t n = (int64_t)t->numel;
            if (st_writer_add_f32(w, name, ST_F32, &n, 1, src[s] + t->offset)) {
                st_writer_free(w);
                return errbuf_set(err, errlen, "out of memory writing %s", path);
            }
        }
    }
    char buf[32];
    st_writer_set_metadata(w, "format", "ballast-checkpoint-shard");
    snprintf(buf, sizeof buf, "%lld", (long long)step);
    st_writer_set_metadata(w, "step", buf);
    snprintf(buf, sizeof buf, "%d", f->sidx);
    st_writer_set_metadata(w, "shard", buf);
    int rc = st_writer_save(w, path, err, errlen);
    st_writer_free(w);
    return rc;
}

int fsdp_ckpt_save(fsdp_t *f, const char *dir, const ckpt_meta_t *meta, int rank, int world, char *err,
                   size_t errlen) {
    char final[4096], tmp[4200], path[4400];
    snprintf(final, sizeof final, "%s/step-%08lld", dir, (long long)meta->step);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    int failed = 0;
    if (rank == 0) {
        failed = ckpt_mkdirs(dir, err, errlen) != 0;
        if (!failed) {
            ckpt_remove_tree(tmp);
            failed = ckpt_mkdirs(tmp, err, errlen) != 0;
        }
    }
    if (agree(f, failed, "creating the checkpoint directory", err, errlen)) return -EIO;

    bool writer = comm_index(f->replica) == 0;
    double info[2] = { 0, 0 };   /* crc32, bytes: exact in a double */
    if (writer) {
        snprintf(path, sizeof path, "%s/" FSDP_SHARD_FMT, tmp, f->sidx, f->S);
        uint32_t crc;
        uint64_t bytes;
        failed = write_shard(f, path, meta->step, err, errlen) != 0;
        if (!failed && ckpt_file_crc32(path, &crc, &bytes)) {
            snprintf(err, errlen, "%s: cannot read back: %s", path, strerror(errno));
            failed = 1;
        }
        if (!failed) { info[0] = crc; info[1] = (double)bytes; }
    }
    if (agree(f, failed, "writing the shard files", err, errlen)) return -EIO;

    /* rank 0 (shard 0 of replica 0) collects the S files' crc32 and size */
    double *all = calloc(2 * (size_t)f->S, sizeof *all);
    if (!all) return errbuf_set(err, errlen, "out of memory"), -ENOMEM;
    comm_req_t *r = NULL;
    int rc = comm_all_gather(f->shard, info, all, 4, COMM_F32, &r, err, errlen);
    if (!rc) rc = comm_wait(r, err, errlen);
    failed = rc != 0;
    if (!failed && rank == 0) {
        json_t *shards = json_array();
        for (int i = 0; i < f->S; i++)
            json_array_append_new(shards, shard_json(f, i, (uint32_t)all[2 * i], (uint64_t)all[2 * i + 1]));
        json_t *man = manifest_json(f, meta, world, shards);
        snprintf(path, sizeof path, "%s/config.json", tmp);
        failed = llama_config_save_json(&meta->cfg, path, err, errlen) != 0;
        snprintf(path, sizeof path, "%s/manifest.json", tmp);
        if (!failed && (!man || json_dump_file(man, path, JSON_INDENT(2)))) {
            snprintf(err, errlen, "%s: cannot write the manifest", path);
            failed = 1;
        }
        json_decref(man);
        if (!failed) {
            ckpt_remove_tree(final);
            if (rename(tmp, final)) {
                snprintf(err, errlen, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
                failed = 1;
            }
        }
    }
    free(all);
    return agree(f, failed, "finishing the checkpoint", err, errlen);
}

int fsdp_ckpt_load(fsdp_t *f, const char *path, char *err, size_t errlen) {
    char p[4400], sp[4600];
    snprintf(p, sizeof p, "%s/manifest.json", path);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    if (!root) return errbuf_set(err, errlen, "%s: not a readable JSON manifest (%s)", p, je.text), -EINVAL;
    int rc = -EINVAL;
    st_t *st = NULL;
    json_t *layout = json_object_get(root, "layout"), *shards = json_object_get(root, "shards");
    int S = (int)json_integer_value(json_object_get(layout, "shard_degree"));
    int T = (int)json_integer_value(json_object_get(layout, "tensor_parallel_degree"));
    if (!json_is_object(layout) || !json_is_array(shards)) {
        errbuf_set(err, errlen, "%s: no layout or shards", p);
        goto out;
    }
    if (S != f->S || T != 1 || (int)json_array_size(shards) != S) {
        errbuf_set(err, errlen, "%s: written with hybrid shard degree %d and tensor-parallel degree %d (%d shard files); "
                   "this run has %d and 1, and loading into another layout is not implemented yet: resume with "
                   "--hybrid-shard-degree %d", p, S, T, (int)json_array_size(shards), f->S, S);
        goto out;
    }
    json_t *mine = json_array_get(shards, (size_t)f->sidx);
    json_t *file = mine ? json_object_get(mine, "file") : NULL;
    if (!file || !json_is_string(file) || strchr(json_string_value(file), '/')) {
        errbuf_set(err, errlen, "%s: shard %d has no plain file name", p, f->sidx);
        goto out;
    }
    snprintf(sp, sizeof sp, "%s/%s", path, json_string_value(file));
    uint32_t crc;
    uint64_t bytes;
    if (ckpt_file_crc32(sp, &crc, &bytes)) {
        errbuf_set(err, errlen, "%s: cannot read: %s", sp, strerror(errno));
        goto out;
    }
    json_int_t want_bytes = json_integer_value(json_object_get(mine, "bytes"));
    json_int_t want_crc = json_integer_value(json_object_get(mine, "crc32"));
    if ((json_int_t)bytes != want_bytes || (json_int_t)crc != want_crc) {
        errbuf_set(err, errlen, "%s: size %llu / crc32 %08x, manifest says %lld / %08llx: the shard is damaged or from "
                   "another checkpoint", sp, (unsigned long long)bytes, crc, (long long)want_bytes,
                   (unsigned long long)want_crc);
        goto out;
    }
    if (st_open(sp, &st, err, errlen)) goto out;
    float *dst[3] = { f->master, f->opt.m, f->opt.v };
    const char *suffix[3] = { "", ".exp_avg", ".exp_avg_sq" };
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < f->n_segs; i++) {
            const model_tensor_t *t = &f->segs[i];
            char name[MODEL_NAME_LEN + 16];
            snprintf(name, sizeof name, "%s%s", t->name, suffix[s]);
            int64_t n = (int64_t)t->numel;
            if (!st_find(st, name)) {
                errbuf_set(err, errlen, "%s: tensor %s is missing", sp, name);
                goto out;
            }
            if (st_read_f32(st, name, &n, 1, dst[s] + t->offset, err, errlen)) goto out;
        }
    }
    f->opt.step = (int64_t)json_integer_value(json_object_get(root, "step"));
    rc = 0;
out:
    if (st) st_close(st);
    json_decref(root);
    return rc;
}
