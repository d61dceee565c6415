/* hooks.h: the worker's test hooks, files the tests compare against
 * references: --dump-grads (step 1's logits, loss and gradients; the
 * PyTorch cross-check reads it), --dump-params (the master parameters
 * after the last step) and --dump-batches (each micro-batch's tokens).
 * Tensors go under their Hugging Face names (workers/model/model.h), fp32
 * safetensors. Each returns 0 or -1 with a message. */
#ifndef BALLAST_TRAIN_HOOKS_H
#define BALLAST_TRAIN_HOOKS_H

#include <stddef.h>
#include <stdint.h>

#include "workers/model/model.h"

/* Full parameters (model layout, n_params floats) as path. */
int train_dump_params(const char *path, const model_t *m, const float *full, char *err, size_t errlen);

/* "logits" (B*T, vocab: the first micro-batch's), "loss" (the step's, one
 * element) and every parameter gradient (full, model layout) as path. */
int train_dump_grads(const char *path, const model_t *m, const float *logits, double loss, const float *grads,
                     char *err, size_t errlen);

/* Append n input tokens of rank `rank` to dir/tokens-rank-NNNNN.bin. */
int train_dump_batch(const char *dir, int rank, const int32_t *inputs, size_t n, char *err, size_t errlen);

#endif
