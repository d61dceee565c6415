/* ckpt.h: the training checkpoint format.
 *
 * A checkpoint is one directory per step, CKPT_DIR/step-00000100/, holding
 *   manifest.json                       step, layout (world, S, T), data
 *                                       position, optimizer hyperparameters,
 *                                       seeds, and the list of shard files
 *   config.json                         the model (Hugging Face LlamaConfig)
 *   shard-IIIII-of-NNNNN.safetensors    N = S * T files (one at S = T = 1):
 *                                       fp32 master weights ("NAME") and AdamW
 *                                       moments ("NAME.exp_avg", "NAME.exp_avg_sq")
 * Each shard entry of the manifest lists its tensor parts: the Hugging Face
 * name, the full shape, the tensor-parallel split (dimension, rank, size,
 * local shape) and the flat element range [start, end) of the TP-local
 * tensor the file holds, so a loader can reassemble the full tensors of any
 * (shard, tensor-parallel) layout. Directories are written under a
 * temporary name and renamed, so a directory with a manifest is complete.
 *
 * This file is the format: writing the manifest (ckpt_write_manifest, the
 * one writer), reading it back (meta, layout, shard files), finding the
 * newest step, and rebuilding full tensors from any layout
 * (ckpt_read_full). The training state's save and load on top of it are
 * workers/ckpt/sharded.h; Hugging Face directories workers/ckpt/hf.h.
 *
 * One-process runs before the single training loop wrote another form of
 * the same format (layout (1, 1, 1), one shard whose parts are whole
 * tensors stored with their full shape and no TP fields); every reader
 * here reads it too (ckpt_layout_t.whole_tensors tells it apart). */
#ifndef BALLAST_CKPT_H
#define BALLAST_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/ckpt/safetensors.h"
#include "workers/model/config.h"
#include "workers/model/model.h"
#include "workers/model/optim.h"

#define CKPT_SHARD_FMT "shard-%05d-of-%05d.safetensors" /* file index, file count */
#define CKPT_VERSION 1                                  /* the manifest version this build writes and reads */

typedef struct {
    int64_t step;               /* optimizer updates done */
    llama_config_t cfg;
    optim_config_t ocfg;
    char data[1024];            /* --data as given */
    int data_order;             /* data_order_t */
    uint64_t data_seed;
    uint64_t init_seed;
    int B, T, accum, dp;        /* micro-batch, seq-len, grad-accum, data-parallel ranks */
    char tokenizer[1024];       /* the run's --tokenizer (tokenizer.json or its directory), "" when none */
} ckpt_meta_t;

/* ---- writing ---- */

/* One tensor part of a shard file, as the manifest describes it. */
typedef struct {
    const model_tensor_t *full; /* the tensor in the model's full table: name, shape, decay, tp_dim */
    int64_t local_shape[2];     /* its TP-local shape (the full one at T = 1; [1] = 1 for 1-D) */
    int tp_rank, tp_size;       /* the TP rank holding it, of tp_size */
    size_t start, end;          /* flat element range [start, end) inside the TP-local tensor */
} ckpt_part_t;

/* One shard file. */
typedef struct {
    int shard, tp_rank;         /* chunk index and TP rank: file index shard * T + tp_rank */
    int rank;                   /* the global rank that wrote it */
    uint32_t crc32;             /* of the whole file */
    uint64_t bytes;
    const ckpt_part_t *parts;   /* n_parts, in file order */
    int n_parts;
} ckpt_shard_t;

/* Write dir/config.json and dir/manifest.json for a checkpoint of
 * meta->step in layout (world, S, T) whose S * T shard files (file index
 * shard * T + tp_rank, in that order) are described by shards. Returns 0,
 * or -1 with a message. */
int ckpt_write_manifest(const char *dir, const ckpt_meta_t *meta, int world, int S, int T,
                        const ckpt_shard_t *shards, int n_shards, char *err, size_t errlen);

/* Keep the newest keep complete checkpoints (step-N with a manifest) under
 * dir and delete the older ones (keep <= 0: none). Directories being written
 * (step-N.tmp) are never touched, so with keep >= 1 the newest complete one
 * always stays. *removed gets how many went. 0, or -1 when dir cannot be read. */
int ckpt_prune(const char *dir, int keep, int *removed, char *err, size_t errlen);

/* ---- reading ---- */

/* Find the newest complete checkpoint under dir. Returns 1 and its path,
 * 0 when there is none, -1 when dir cannot be read. */
int ckpt_find_latest(const char *dir, char *path, size_t len, char *err, size_t errlen);

/* Read a checkpoint's manifest and config (path is a step directory). */
int ckpt_read_meta(const char *path, ckpt_meta_t *meta, char *err, size_t errlen);

/* What the manifest says about the files. */
typedef struct {
    int64_t step;               /* optimizer updates done */
    int world, S, T;            /* the layout that wrote it */
    int n_shards;               /* shard files listed (S * T) */
    bool whole_tensors;         /* parts are whole tensors with full shapes and no TP fields (one-process
                                   checkpoints written before the single training loop) */
} ckpt_layout_t;

/* The layout of step directory path; 0, or -1 with a message. */
int ckpt_read_layout(const char *path, ckpt_layout_t *lay, char *err, size_t errlen);

/* Open shard file i (0-based, manifest order) of step directory path after
 * checking its size and crc32 against the manifest: *st (st_close it) and
 * its path in sp. 0, or -1 with a message naming a damaged file. */
int ckpt_open_shard(const char *path, int i, st_t **st, char *sp, size_t splen, char *err, size_t errlen);

/* Every check a checkpoint must pass before any of it is loaded, the
 * same for --resume (ckpt_load, ckpt_read_full) and `ballast ckpt info`:
 * the manifest's format and version (CKPT_VERSION), its step against the
 * optimizer's, the data position's, the directory name's and every shard
 * file's; the layout against the shard list; each shard's file name (the
 * one its index gives: no path, no "..") and size, and that every file
 * read (config.json, the manifest, the shards), symlinks resolved, lies
 * inside the step directory; each part against m's tensor (name, shape,
 * tensor-parallel split); and, for every tensor and TP rank, that the
 * parts' element ranges tile the TP-local tensor exactly in shard order
 * (no gap, no overlap, no swapped ranges). File contents (crc32) are
 * checked when a shard is opened. 0, or -1 with a message naming the file
 * and the tensor. */
int ckpt_verify(const char *path, const model_t *m, char *err, size_t errlen);

/* The full tensors of a checkpoint of any layout (both forms) in m's full
 * layout (m may come from model_layout): weights into params, the AdamW
 * moments into exp_avg / exp_avg_sq when not NULL, the optimizer step into
 * *step when not NULL. Every element must be covered by some part; every
 * file's size and crc32 are checked. Returns 0 or -1 with a message. */
int ckpt_read_full(const char *path, const model_t *m, float *params, float *exp_avg, float *exp_avg_sq,
                   int64_t *step, char *err, size_t errlen);

/* Weights only (ckpt_read_full without the moments): for export and
 * inspection. */
int ckpt_read_weights(const char *path, const model_t *m, float *host, char *err, size_t errlen);

/* ---- files ---- */

/* mkdir -p; 0 or -1 with a message. */
int ckpt_mkdirs(const char *path, char *err, size_t errlen);
/* rm -rf of a checkpoint's temporary directory (one level of files). */
void ckpt_remove_tree(const char *path);

/* IEEE crc32 of a file's bytes; -1 when unreadable. */
int ckpt_file_crc32(const char *path, uint32_t *crc, uint64_t *size);

#endif
