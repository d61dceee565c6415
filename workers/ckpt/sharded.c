/* sharded.c: a run's training state saved into and loaded from
 * checkpoints; see sharded.h and docs/parallel.md. Relies on ckpt.h for the
 * format (the manifest, the shard files, reading full tensors).
 *
 * The directory holds S * T shard files (one for one process). File
 * shard * T + tp holds chunk `shard` of every unit of TP rank tp's local
 * parameters (identical on every replica, so only replica 0 writes): each
 * tensor part as 1-D NAME,
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
#include "workers/ckpt/sharded.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "errbuf.h"
#include "workers/ckpt/safetensors.h"

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

/* The manifest's description of file sidx * T + tidx: the parts of chunk
 * sidx of TP rank tidx (every TP rank has the same local shapes, so any
 * rank can describe any file) into parts (m->n_tensors entries). */
static void shard_desc(const fsdp_t *f, int sidx, int tidx, model_tensor_t *segs, size_t *start, ckpt_part_t *parts,
                       ckpt_shard_t *sh) {
    const model_t *m = f->m;
    int n = fsdp_segments(f, sidx, segs, start);
    for (int i = 0; i < n; i++)
        parts[i] = (ckpt_part_t){ .full = model_find(m, segs[i].name), .local_shape = { segs[i].shape[0], segs[i].shape[1] },
                                  .tp_rank = tidx, .tp_size = f->T, .start = start[i], .end = start[i] + segs[i].numel };
    /* the writer of (shard sidx, TP rank tidx) in replica 0 (CP rank 0) is global rank sidx * C * T + tidx */
    *sh = (ckpt_shard_t){ .shard = sidx, .tp_rank = tidx, .rank = sidx * f->C * f->T + tidx, .parts = parts, .n_parts = n };
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

int ckpt_save(fsdp_t *f, const char *dir, const ckpt_meta_t *meta, int rank, int world, char *err,
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

    bool writer = f->ridx == 0;
    double info[2] = { 0, 0 };   /* crc32, bytes: exact in a double */
    if (writer) {
        snprintf(path, sizeof path, "%s/" CKPT_SHARD_FMT, tmp, f->sidx * f->T + f->tidx, f->S * f->T);
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
        int nt = f->m->n_tensors;
        ckpt_shard_t *shards = calloc((size_t)nf, sizeof *shards);
        ckpt_part_t *parts = calloc((size_t)nf * (size_t)nt, sizeof *parts);
        model_tensor_t *segs = calloc((size_t)nt, sizeof *segs);
        size_t *start = calloc((size_t)nt, sizeof *start);
        if (!shards || !parts || !segs || !start) {
            failed = errbuf_set(err, errlen, "out of memory writing the manifest") != 0;
        } else {
            for (int i = 0; i < nf; i++) {
                shard_desc(f, i / f->T, i % f->T, segs, start, parts + (size_t)i * nt, &shards[i]);
                shards[i].crc32 = (uint32_t)all[2 * i];
                shards[i].bytes = (uint64_t)all[2 * i + 1];
            }
            failed = ckpt_write_manifest(tmp, meta, world, f->S, f->T, shards, nf, err, errlen) != 0;
        }
        free(shards);
        free(parts);
        free(segs);
        free(start);
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
    else if (ckpt_read_full(path, f->m, p, mo, v, &step, err, errlen)) rc = -EINVAL;
    else {
        fsdp_set_full_state(f, p, mo, v, step);
        rc = 0;
    }
    free(p);
    free(mo);
    free(v);
    return rc;
}

int ckpt_load(fsdp_t *f, const char *path, char *err, size_t errlen) {
    ckpt_layout_t lay;
    if (ckpt_read_layout(path, &lay, err, errlen)) return -EINVAL;
    if (lay.S != f->S || lay.T != f->T || lay.whole_tensors) return load_resharded(f, path, err, errlen);
    /* the same layout: this rank's own file, once the whole manifest passed
     * the checks another layout's load makes */
    if (ckpt_verify(path, f->m, err, errlen)) return -EINVAL;
    char sp[4600];
    st_t *st = NULL;
    int idx = f->sidx * f->T + f->tidx, rc = -EINVAL;
    if (ckpt_open_shard(path, idx, &st, sp, sizeof sp, err, errlen)) return -EINVAL;
    if (!read_own_shard(f, st, sp, err, errlen)) {
        f->opt.step = lay.step;
        fsdp_state_changed(f); /* the working copy follows the loaded master */
        rc = 0;
    }
    st_close(st);
    return rc;
}

/* ---- a shared checkpoint directory ---- */

#define CKPT_SHARED_WAIT_S 5   /* how long a rank looks for rank 0's marker */

int ckpt_check_shared(fsdp_t *f, const char *dir, int rank, const char *where, char *err, size_t errlen) {
    char e[512], marker[4200];
    int bad = 0;
    uint32_t token = 0;
    if (rank == 0) {
        /* a token no earlier run left: time, pid and address bits */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        token = (uint32_t)(ts.tv_nsec ^ (ts.tv_sec << 20) ^ ((uint64_t)getpid() << 8) ^ (uintptr_t)&ts) & 0x7fffffffu;
        if (!token) token = 1;
        if (ckpt_mkdirs(dir, e, sizeof e)) {
            bad = 2;
            snprintf(err, errlen, "--ckpt-dir %s: rank 0 cannot create it: %s", dir, e);
        } else {
            snprintf(marker, sizeof marker, "%s/.shared-check-%08x", dir, token);
            FILE *mf = fopen(marker, "w");
            if (!mf || fprintf(mf, "ballast: rank 0 checks that every rank sees this directory\n") < 0 ||
                fflush(mf) || fsync(fileno(mf))) {
                bad = 2;
                snprintf(err, errlen, "--ckpt-dir %s: rank 0 cannot write %s: %s", dir, marker, strerror(errno));
            }
            if (mf) fclose(mf);
        }
    }
    double sum;
    /* rank 0's token to everyone (exact in a double), then who fails */
    if (fsdp_sum_all(f, rank == 0 ? (bad ? -1.0 : (double)token) : 0.0, &sum, e, sizeof e))
        return errbuf_set(err, errlen, "checking --ckpt-dir: %s", e), -EIO;
    if (sum < 0) {
        if (rank == 0) return -EACCES;
        snprintf(err, errlen, "--ckpt-dir %s: rank 0 could not write it (see its message)", dir);
        return -EXDEV;
    }
    token = (uint32_t)sum;
    snprintf(marker, sizeof marker, "%s/.shared-check-%08x", dir, token);
    if (rank != 0) {
        struct stat st;
        bool seen = false;
        for (int i = 0; i < CKPT_SHARED_WAIT_S * 10 && !seen; i++) {
            seen = stat(marker, &st) == 0;
            if (!seen) usleep(100000);
        }
        if (!seen) bad = 1;
    }
    double nbad;
    if (fsdp_sum_all(f, bad, &nbad, e, sizeof e)) return errbuf_set(err, errlen, "checking --ckpt-dir: %s", e), -EIO;
    if (rank == 0) unlink(marker);
    if (bad)
        return errbuf_set(err, errlen, "%s--ckpt-dir %s is not the directory rank 0 writes: rank 0's marker %s is not "
                          "there after %d s. Every rank writes its own shard into one checkpoint directory, so "
                          "--ckpt-dir must be shared by all nodes: mount the same ReadWriteMany volume (Kubernetes) "
                          "or shared file system (NFS, EFS, Lustre, ...) at that path on every node", where, dir,
                          marker, CKPT_SHARED_WAIT_S), -ENOENT;
    if (nbad > 0)
        return errbuf_set(err, errlen, "--ckpt-dir %s is not shared: %.0f rank%s do not see rank 0's marker in it (their "
                          "messages name them); mount one shared directory (a ReadWriteMany volume) at --ckpt-dir on "
                          "every node", dir, nbad, nbad == 1 ? "" : "s"), -EXDEV;
    return 0;
}
