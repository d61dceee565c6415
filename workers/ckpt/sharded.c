/* fsdp_ckpt.c: sharded checkpoints of a hybrid-sharded, tensor-parallel
 * run; see fsdp.h and docs/parallel.md.
 *
 * The directory has the layout and manifest keys of workers/ckpt/ckpt.h (so
 * ckpt_find_latest, ckpt_read_meta and `ballast ckpt info` read it), with
 * S * T shard files instead of one. File shard * T + tp holds chunk `shard`
 * of every unit of TP rank tp's local parameters (identical on every
 * replica, so only replica 0 writes): each tensor part as 1-D NAME,
 * NAME.exp_avg and NAME.exp_avg_sq. The manifest gives each part's TP split
 * (dimension, rank, size, local shape) and its flat element range
 * [start, end) inside the TP-local tensor, which is enough to rebuild the
 * full tensors: loading into the same (S, T) reads one file per rank,
 * another layout rebuilds the full state and re-cuts it.
 *
 * The state (f->master, f->opt.m, f->opt.v) is backend memory (a GPU's, or
 * the CPU's): it is only touched through the backend's copies. Saving
 * streams each tensor part through two pinned host buffers of at most
 * CKPT_PIECE_FLOATS floats (the copy of piece k + 1 runs while piece k is
 * written), so the host memory a save needs does not grow with the model;
 * loading the same layout reads each part a piece at a time the same way.
 * Loading another layout rebuilds the full tensors on the host first
 * (3 x the model's fp32 parameters). Every collective here moves backend
 * memory too (NCCL, or shm behind host staging). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "workers/data/data.h"
#include "workers/parallel/fsdp.h"
#include "workers/ckpt/safetensors.h"

#define FSDP_SHARD_FMT "shard-%05d-of-%05d.safetensors"
#define CKPT_PIECE_FLOATS ((size_t)4 << 20) /* floats per host buffer (16 MiB) */

static const char *const SUFFIX[3] = { "", ".exp_avg", ".exp_avg_sq" };
static const char *const WHAT[3] = { "fp32 master weights", "AdamW exp_avg", "AdamW exp_avg_sq" };

/* Host buffers for copies to and from backend memory: pinned when the
 * backend has host_alloc. */
static void *hbuf_alloc(const backend_t *be, size_t bytes) {
    return be->host_alloc ? be->host_alloc(bytes) : calloc(1, bytes);
}
static void hbuf_free(const backend_t *be, void *p) {
    if (!p) return;
    if (be->host_alloc) be->host_free(p);
    else free(p);
}

/* The rank's three state arrays in file order (weights, exp_avg,
 * exp_avg_sq), all of which must be in backend memory now: 0, or -1 with a
 * message naming the missing one. */
static int state_arrays(fsdp_t *f, float *a[3], char *err, size_t errlen) {
    a[0] = f->master;
    a[1] = f->opt.m;
    a[2] = f->opt.v;
    for (int s = 0; s < 3; s++)
        if (!a[s] && f->shard_total)
            return errbuf_set(err, errlen, "the rank's %s are not in memory (an optimizer offload keeps them in "
                              "ballastd and must bring them back for checkpoints)", WHAT[s]), -1;
    return 0;
}

/* Walks the pieces of a shard file's data in file order: array s (of 3),
 * segment i, elements [off, off + n) with n <= CKPT_PIECE_FLOATS. */
typedef struct { int s, i; size_t off, n; } piece_t;

/* Advance *p to the next piece (start with s = i = off = n = 0 and
 * first = true). false when there is none. */
static bool next_piece(const fsdp_t *f, piece_t *p, bool first) {
    if (!first) p->off += p->n;
    for (; p->s < 3; p->s++, p->i = 0, p->off = 0)
        for (; p->i < f->n_segs; p->i++, p->off = 0)
            if (p->off < f->segs[p->i].numel) {
                size_t left = f->segs[p->i].numel - p->off;
                p->n = left < CKPT_PIECE_FLOATS ? left : CKPT_PIECE_FLOATS;
                return true;
            }
    return false;
}

/* Floats of the largest piece (at least 1). */
static size_t piece_floats(const fsdp_t *f) {
    size_t mx = 1;
    for (int i = 0; i < f->n_segs; i++) if (f->segs[i].numel > mx) mx = f->segs[i].numel;
    return mx < CKPT_PIECE_FLOATS ? mx : CKPT_PIECE_FLOATS;
}

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

static json_t *shape_json(const model_tensor_t *t) {
    return t->ndim == 2 ? json_pack("[II]", (json_int_t)t->shape[0], (json_int_t)t->shape[1])
                        : json_pack("[I]", (json_int_t)t->shape[0]);
}

/* The manifest entry of file sidx * T + tidx: the parts of chunk sidx of
 * TP rank tidx (every TP rank has the same local shapes, so any rank can
 * describe any file). */
static json_t *shard_json(const fsdp_t *f, int sidx, int tidx, uint32_t crc, uint64_t bytes) {
    const model_t *m = f->m;
    model_tensor_t *segs = calloc((size_t)m->n_tensors, sizeof *segs);
    size_t *start = calloc((size_t)m->n_tensors, sizeof *start);
    if (!segs || !start) { free(segs); free(start); return NULL; }
    int n = fsdp_segments(f, sidx, segs, start);
    json_t *tensors = json_array();
    for (int i = 0; i < n; i++) {
        const model_tensor_t *t = &segs[i], *full = model_find(m, t->name);
        json_array_append_new(tensors, json_pack("{s:s, s:o, s:i, s:i, s:i, s:o, s:[I,I], s:b}", "name", t->name,
                                                 "shape", shape_json(full), "tp_dim", t->tp_dim, "tp_rank", tidx,
                                                 "tp_size", f->T, "local_shape", shape_json(t), "range",
                                                 (json_int_t)start[i], (json_int_t)(start[i] + t->numel), "decay",
                                                 t->decay));
    }
    free(segs);
    free(start);
    char file[64];
    snprintf(file, sizeof file, FSDP_SHARD_FMT, sidx * f->T + tidx, f->S * f->T);
    /* the writer of (shard sidx, TP rank tidx) in replica 0 is global rank sidx * T + tidx */
    return json_pack("{s:s, s:i, s:i, s:i, s:I, s:I, s:[s,s,s], s:o}", "file", file, "rank", sidx * f->T + tidx,
                     "shard", sidx, "tp_rank", tidx, "bytes", (json_int_t)bytes, "crc32", (json_int_t)crc,
                     "contents", "weights NAME (fp32, 1-D part)", "exp_avg NAME.exp_avg",
                     "exp_avg_sq NAME.exp_avg_sq", "tensors", tensors);
}

static json_t *manifest_json(const fsdp_t *f, const ckpt_meta_t *meta, int world, json_t *shards) {
    const optim_config_t *oc = &meta->ocfg;
    return json_pack("{s:s, s:i, s:I, s:s, s:{s:i, s:i, s:i}, s:{s:s, s:s, s:I, s:i, s:i, s:i, s:i, s:I},"
                     " s:{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:I, s:I, s:I},"
                     " s:{s:I, s:I}, s:o}",
                     "format", "ballast-checkpoint", "version", 1, "step", (json_int_t)meta->step,
                     "config", "config.json",
                     "layout", "world", world, "shard_degree", f->S, "tensor_parallel_degree", f->T,
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

/* This rank's shard file: its parts of every tensor and their moments,
 * copied from backend memory a piece at a time through two host buffers
 * (the copy of the next piece is in flight while one is written). */
static int write_shard(fsdp_t *f, const char *path, int64_t step, char *err, size_t errlen) {
    const backend_t *be = f->be;
    float *src[3];
    if (state_arrays(f, src, err, errlen)) return -1;
    st_writer_t *w = st_writer_new();
    if (!w) return errbuf_set(err, errlen, "out of memory writing %s", path);
    int rc = 0;
    for (int s = 0; s < 3 && !rc; s++) {
        for (int i = 0; i < f->n_segs && !rc; i++) {
            const model_tensor_t *t = &f->segs[i];
            char name[MODEL_NAME_LEN + 16];
            snprintf(name, sizeof name, "%s%s", t->name, SUFFIX[s]);
            int64_t n = (int64_t)t->numel;
            if (st_writer_declare(w, name, ST_F32, &n, 1)) rc = errbuf_set(err, errlen, "out of memory writing %s", path);
        }
    }
    char buf[32];
    st_writer_set_metadata(w, "format", "ballast-checkpoint-shard");
    snprintf(buf, sizeof buf, "%lld", (long long)step);
    st_writer_set_metadata(w, "step", buf);
    snprintf(buf, sizeof buf, "%d", f->sidx);
    st_writer_set_metadata(w, "shard", buf);
    snprintf(buf, sizeof buf, "%d", f->tidx);
    st_writer_set_metadata(w, "tp_rank", buf);
    size_t pf = piece_floats(f);
    float *hb[2] = { hbuf_alloc(be, pf * sizeof(float)), hbuf_alloc(be, pf * sizeof(float)) };
    if (!rc && (!hb[0] || !hb[1])) rc = errbuf_set(err, errlen, "out of host memory for 2 x %zu bytes writing %s",
                                                   pf * sizeof(float), path);
    if (!rc) rc = st_writer_begin(w, path, err, errlen);
    be_xfer_t *x[2] = { NULL, NULL };
    size_t pn[2] = { 0, 0 };
    piece_t p = { 0 };
    bool have = !rc && next_piece(f, &p, true);
    if (have) {
        x[0] = be_xfer_to_host(be, hb[0], src[p.s] + f->segs[p.i].offset + p.off, p.n * sizeof(float));
        pn[0] = p.n;
    }
    for (int k = 0; have; k ^= 1) {
        be_xfer_wait(be, x[k]); /* piece in hb[k] complete */
        x[k] = NULL;
        have = next_piece(f, &p, false);
        if (have) {
            x[k ^ 1] = be_xfer_to_host(be, hb[k ^ 1], src[p.s] + f->segs[p.i].offset + p.off, p.n * sizeof(float));
            pn[k ^ 1] = p.n;
        }
        if (!rc && st_writer_append_f32(w, hb[k], pn[k], err, errlen)) rc = -1;
        if (rc && have) { be_xfer_wait(be, x[k ^ 1]); x[k ^ 1] = NULL; break; }
    }
    if (!rc) rc = st_writer_finish(w, err, errlen);
    st_writer_free(w); /* removes a half-written file */
    hbuf_free(be, hb[0]);
    hbuf_free(be, hb[1]);
    return rc ? -1 : 0;
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

    bool writer = f->ridx == 0; /* replica 0 (a group of one rank may have no communicator) */
    double info[2] = { 0, 0 };   /* crc32, bytes: exact in a double */
    if (writer) {
        snprintf(path, sizeof path, "%s/" FSDP_SHARD_FMT, tmp, f->sidx * f->T + f->tidx, f->S * f->T);
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

    /* rank 0 (shard 0, TP rank 0 of replica 0) collects the S * T files'
     * crc32 and size: over the TP group, then the shard group; entry
     * sidx * T + tidx belongs to file sidx * T + tidx */
    int nf = f->S * f->T;
    double *tpi = calloc(2 * (size_t)f->T, sizeof *tpi), *all = calloc(2 * (size_t)nf, sizeof *all);
    if (!tpi || !all) { free(tpi); free(all); return errbuf_set(err, errlen, "out of memory"), -ENOMEM; }
    int rc = 0;
    memcpy(tpi, info, sizeof info);
    /* (the doubles travel as fp32 word pairs, copied bit for bit) */
    if (f->T > 1) rc = fsdp_all_gather_host(f->be, f->tp, info, 4, tpi, err, errlen);
    if (!rc) rc = fsdp_all_gather_host(f->be, f->shard, tpi, 4 * (size_t)f->T, all, err, errlen);
    free(tpi);
    failed = rc != 0;
    if (!failed && rank == 0) {
        json_t *shards = json_array();
        for (int i = 0; i < nf; i++)
            json_array_append_new(shards, shard_json(f, i / f->T, i % f->T, (uint32_t)all[2 * i],
                                                     (uint64_t)all[2 * i + 1]));
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

/* The file of one manifest shard entry, checked against its size and
 * crc32: its path into sp. 0, or -1 with a message. */
static int open_shard(const char *path, const char *man, json_t *sh, int i, char *sp, size_t splen, st_t **st,
                      char *err, size_t errlen) {
    json_t *file = json_is_object(sh) ? json_object_get(sh, "file") : NULL;
    if (!file || !json_is_string(file) || strchr(json_string_value(file), '/'))
        return errbuf_set(err, errlen, "%s: shard %d has no plain file name", man, i), -1;
    snprintf(sp, splen, "%s/%s", path, json_string_value(file));
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
    return st_open(sp, st, err, errlen) ? -1 : 0;
}

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

/* One part of a manifest: validate it against the model's full tensor and
 * scatter the file's elements (weights and moments) into the full arrays. */
static int read_part(st_t *st, const char *sp, const char *man, json_t *pj, const model_t *m, float *dst[3],
                     uint8_t *covered, char *err, size_t errlen) {
    const char *name = json_string_value(json_object_get(pj, "name"));
    const model_tensor_t *full = name ? model_find(m, name) : NULL;
    if (!full)
        return errbuf_set(err, errlen, "%s: part %s is not a tensor of this model (another config?)", man,
                          name ? name : "(no name)"), -1;
    int64_t shape[2], lshape[2];
    if (json_shape(json_object_get(pj, "shape"), shape) || shape[0] != full->shape[0] || shape[1] != full->shape[1])
        return errbuf_set(err, errlen, "%s: %s has another shape than the model's (%lld x %lld): another config?", man,
                          name, (long long)full->shape[0], (long long)full->shape[1]), -1;
    /* a one-process checkpoint lists whole tensors: no TP fields */
    json_t *jt = json_object_get(pj, "tp_size");
    int tsz = jt ? (int)json_integer_value(jt) : 1, trk = (int)json_integer_value(json_object_get(pj, "tp_rank"));
    int tdim = jt ? (int)json_integer_value(json_object_get(pj, "tp_dim")) : full->tp_dim;
    if (!jt) memcpy(lshape, shape, sizeof lshape);
    else if (json_shape(json_object_get(pj, "local_shape"), lshape)) lshape[0] = -1;
    int64_t want0 = shape[0], want1 = shape[1];
    if (tsz > 1 && tdim == 0) want0 = full->block < 0 ? (shape[0] + tsz - 1) / tsz : shape[0] / tsz;
    if (tsz > 1 && tdim == 1) want1 = shape[1] / tsz;
    if (tsz < 1 || trk < 0 || trk >= tsz || tdim != full->tp_dim || lshape[0] != want0 || lshape[1] != want1)
        return errbuf_set(err, errlen, "%s: %s: tensor-parallel split (dim %d, rank %d of %d, local shape %lld x %lld) "
                          "does not fit the tensor", man, name, tdim, trk, tsz, (long long)lshape[0],
                          (long long)lshape[1]), -1;
    json_t *rg = json_object_get(pj, "range");
    json_int_t a = json_integer_value(json_array_get(rg, 0)), b = json_integer_value(json_array_get(rg, 1));
    if (!json_is_array(rg) || json_array_size(rg) != 2 || a < 0 || b <= a || b > lshape[0] * lshape[1])
        return errbuf_set(err, errlen, "%s: %s: range is not inside the %lld elements of the part", man, name,
                          (long long)(lshape[0] * lshape[1])), -1;
    size_t n = (size_t)(b - a);
    float *buf = malloc(n * sizeof(float));
    if (!buf) return errbuf_set(err, errlen, "out of memory reading %s", sp), -1;
    const char *suffix[3] = { "", ".exp_avg", ".exp_avg_sq" };
    int rc = 0;
    for (int s = 0; s < 3 && !rc; s++) {
        if (!dst[s]) continue;
        char nm[MODEL_NAME_LEN + 16];
        snprintf(nm, sizeof nm, "%s%s", name, suffix[s]);
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

int fsdp_ckpt_read_full(const char *path, const model_t *m, float *params, float *exp_avg, float *exp_avg_sq,
                        int64_t *step, char *err, size_t errlen) {
    char man[4400], sp[4600];
    snprintf(man, sizeof man, "%s/manifest.json", path);
    json_error_t je;
    json_t *root = json_load_file(man, 0, &je);
    if (!root) return errbuf_set(err, errlen, "%s: not a readable JSON manifest (%s)", man, je.text), -1;
    int rc = -1;
    uint8_t *covered = calloc(m->n_params, 1);
    json_t *shards = json_object_get(root, "shards");
    if (!covered) { errbuf_set(err, errlen, "out of memory"); goto out; }
    if (!json_is_array(shards) || !json_array_size(shards)) { errbuf_set(err, errlen, "%s: no shards", man); goto out; }
    float *dst[3] = { params, exp_avg, exp_avg_sq };
    for (size_t i = 0; i < json_array_size(shards); i++) {
        json_t *sh = json_array_get(shards, i), *parts = json_object_get(sh, "tensors");
        st_t *st = NULL;
        if (open_shard(path, man, sh, (int)i, sp, sizeof sp, &st, err, errlen)) goto out;
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

/* The same layout: this rank's file st (path sp) into its state in
 * backend memory, a piece at a time through two host buffers (the copy of
 * one piece runs while the next is read). 0, or -1 with a message. */
static int read_own_shard(fsdp_t *f, st_t *st, const char *sp, char *err, size_t errlen) {
    const backend_t *be = f->be;
    float *dst[3];
    if (state_arrays(f, dst, err, errlen)) return -1;
    /* every tensor first: a wrong file changes nothing */
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < f->n_segs; i++) {
            char name[MODEL_NAME_LEN + 16];
            snprintf(name, sizeof name, "%s%s", f->segs[i].name, SUFFIX[s]);
            const st_info_t *info = st_find(st, name);
            if (!info) return errbuf_set(err, errlen, "%s: tensor %s is missing", sp, name), -1;
            if (info->ndim != 1 || info->shape[0] != (int64_t)f->segs[i].numel)
                return errbuf_set(err, errlen, "%s: tensor %s is not 1-D with %zu elements as this layout's part",
                                  sp, name, f->segs[i].numel), -1;
        }
    }
    size_t pf = piece_floats(f);
    float *hb[2] = { hbuf_alloc(be, pf * sizeof(float)), hbuf_alloc(be, pf * sizeof(float)) };
    be_xfer_t *x[2] = { NULL, NULL };
    int rc = 0;
    if (!hb[0] || !hb[1]) rc = errbuf_set(err, errlen, "out of host memory for 2 x %zu bytes reading %s",
                                          pf * sizeof(float), sp);
    piece_t p = { 0 };
    for (int k = 0, first = 1; !rc && next_piece(f, &p, first); k ^= 1, first = 0) {
        be_xfer_wait(be, x[k]); /* hb[k]'s previous copy is done: it may be refilled */
        x[k] = NULL;
        char name[MODEL_NAME_LEN + 16];
        snprintf(name, sizeof name, "%s%s", f->segs[p.i].name, SUFFIX[p.s]);
        if (st_read_f32_range(st, name, (int64_t)p.off, (int64_t)p.n, hb[k], err, errlen)) { rc = -1; break; }
        x[k] = be_xfer_from_host(be, dst[p.s] + f->segs[p.i].offset + p.off, hb[k], p.n * sizeof(float));
    }
    be_xfer_wait(be, x[0]);
    be_xfer_wait(be, x[1]);
    hbuf_free(be, hb[0]);
    hbuf_free(be, hb[1]);
    return rc;
}

/* Another layout: rebuild the full state, keep this rank's part. */
static int load_resharded(fsdp_t *f, const char *path, char *err, size_t errlen) {
    float *dst[3];
    if (state_arrays(f, dst, err, errlen)) return -EINVAL;
    size_t n = f->m->n_params;
    float *p = malloc(n * sizeof(float)), *mo = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    int64_t step = 0;
    int rc = -ENOMEM;
    if (!p || !mo || !v) errbuf_set(err, errlen, "out of memory resharding %s", path);
    else if (fsdp_ckpt_read_full(path, f->m, p, mo, v, &step, err, errlen)) rc = -EINVAL;
    else {
        fsdp_set_full_state(f, p, mo, v, step);
        rc = 0;
    }
    free(p);
    free(mo);
    free(v);
    return rc;
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
    if (!json_is_object(layout) || !json_is_array(shards) || S < 1 || T < 1) {
        errbuf_set(err, errlen, "%s: no layout or shards", p);
        goto out;
    }
    if (S != f->S || T != f->T) {
        json_decref(root);
        return load_resharded(f, path, err, errlen);
    }
    if ((int)json_array_size(shards) != S * T) {
        errbuf_set(err, errlen, "%s: layout (S %d, T %d) needs %d shard files, the manifest lists %d", p, S, T, S * T,
                   (int)json_array_size(shards));
        goto out;
    }
    /* the same layout: this rank's own file */
    int idx = f->sidx * f->T + f->tidx;
    if (open_shard(path, p, json_array_get(shards, (size_t)idx), idx, sp, sizeof sp, &st, err, errlen)) goto out;
    if (read_own_shard(f, st, sp, err, errlen)) goto out;
    f->opt.step = (int64_t)json_integer_value(json_object_get(root, "step"));
    fsdp_state_changed(f); /* the working copy follows the loaded master */
    rc = 0;
out:
    if (st) st_close(st);
    json_decref(root);
    return rc;
}
