/* ckpt.h: training checkpoints and Hugging Face model directories.
 *
 * A checkpoint is one directory per step, CKPT_DIR/step-00000100/, holding
 *   manifest.json                       step, layout, data position, optimizer
 *                                       hyperparameters, seeds, shard list
 *   config.json                         the model (Hugging Face LlamaConfig)
 *   shard-00000-of-00001.safetensors    fp32 master weights ("NAME") and AdamW
 *                                       moments ("NAME.exp_avg", "NAME.exp_avg_sq")
 * Each tensor is described in the manifest by its Hugging Face name, full
 * shape and the flat element range [start, end) this shard holds, so a
 * loader can reassemble any (shard, tensor-parallel) layout. Directories are
 * written under a temporary name and renamed, so a directory with a
 * manifest is complete. */
#ifndef BALLAST_CKPT_H
#define BALLAST_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/model/config.h"
#include "workers/model/model.h"
#include "workers/model/optim.h"

typedef struct {
    int64_t step;               /* optimizer updates done */
    llama_config_t cfg;
    optim_config_t ocfg;
    char data[1024];            /* --data as given */
    int data_order;             /* data_order_t */
    uint64_t data_seed;
    uint64_t init_seed;
    int B, T, accum, dp;        /* micro-batch, seq-len, grad-accum, data-parallel ranks */
} ckpt_meta_t;

/* Write DIR/step-%08lld/ for meta->step. Returns 0, or -1 with a message. */
int ckpt_save(const char *dir, const ckpt_meta_t *meta, const model_t *m, const optim_t *o, char *err, size_t errlen);

/* Find the newest complete checkpoint under dir. Returns 1 and its path,
 * 0 when there is none, -1 when dir cannot be read. */
int ckpt_find_latest(const char *dir, char *path, size_t len, char *err, size_t errlen);

/* Read a checkpoint's manifest and config (path is a step directory). */
int ckpt_read_meta(const char *path, ckpt_meta_t *meta, char *err, size_t errlen);

/* Load weights and AdamW moments (and o->step) from a step directory into a
 * model of the same config; every shard's size and crc32 are checked. */
int ckpt_load(const char *path, model_t *m, optim_t *o, char *err, size_t errlen);

/* Weights only, into host memory in m's layout (m may come from
 * model_layout): for export and inspection. */
int ckpt_read_weights(const char *path, const model_t *m, float *host, char *err, size_t errlen);

/* Load a Hugging Face Llama directory (config.json + model.safetensors or an
 * index with several files; F32, BF16 or F16) into m, whose config must
 * match. */
int ckpt_load_hf(const char *dir, model_t *m, char *err, size_t errlen);
/* The same into host memory (n_params floats, m's full layout; m needs
 * only its layout). */
int ckpt_read_hf_host(const char *dir, const model_t *m, float *host, char *err, size_t errlen);

/* Write a Hugging Face directory (config.json + model.safetensors, F32 or
 * BF16 as dtype says) from host weights in m's layout. */
int ckpt_write_hf(const char *out_dir, const model_t *m, const float *host_params, int dtype,
                  char *err, size_t errlen);

/* mkdir -p; 0 or -1 with a message. */
int ckpt_mkdirs(const char *path, char *err, size_t errlen);
/* rm -rf of a checkpoint's temporary directory. */
void ckpt_remove_tree(const char *path);

/* IEEE crc32 of a file's bytes; -1 when unreadable. */
int ckpt_file_crc32(const char *path, uint32_t *crc, uint64_t *size);

#endif
