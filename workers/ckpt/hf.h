/* hf.h: Hugging Face Llama model directories (config.json with
 * model.safetensors, or an index over several files), read into and
 * written from host memory in a model's full layout (workers/model/model.h). */
#ifndef BALLAST_HF_H
#define BALLAST_HF_H

#include <stddef.h>

#include "workers/model/model.h"

/* Read a Hugging Face Llama directory (F32, BF16 or F16 tensors) into host
 * (n_params floats, m's full layout; m needs only its layout, and its
 * config must match the directory's). 0, or -1 with a message naming the
 * missing or misshapen tensor. */
int ckpt_read_hf_host(const char *dir, const model_t *m, float *host, char *err, size_t errlen);

/* Write a Hugging Face directory (config.json + model.safetensors, F32 or
 * BF16 as dtype, an st_dtype_t, says) from host weights in m's layout.
 * 0, or -1 with a message. */
int ckpt_write_hf(const char *out_dir, const model_t *m, const float *host_params, int dtype, char *err,
                  size_t errlen);

#endif
