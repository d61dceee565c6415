/* optim.h: AdamW with torch.optim.AdamW's semantics, global-norm gradient
 * clipping as torch.nn.utils.clip_grad_norm_, and the learning-rate
 * schedule.
 *
 * The optimizer state (first and second moments) mirrors the model's flat
 * parameter layout; the update walks the model's tensor table so that weight
 * decay applies to 2-D tensors only. */
#ifndef BALLAST_OPTIM_H
#define BALLAST_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/backend/backend.h"
#include "workers/model/model.h"

typedef enum { LR_CONSTANT = 0, LR_COSINE = 1, LR_LINEAR = 2, LR_WSD = 3 } lr_schedule_t;

/* The schedule's name ("constant", "cosine", "linear", "wsd"), and back
 * (-1 when unknown). */
const char *optim_schedule_name(lr_schedule_t s);
int optim_schedule_parse(const char *name);

typedef struct {
    double lr;             /* peak learning rate */
    double min_lr;         /* floor of the cosine, linear and wsd schedules */
    double decay_fraction; /* wsd: the last fraction of the steps that decays (0..1] */
    double beta1, beta2;   /* AdamW moment decay rates */
    double eps;            /* added to sqrt of the bias-corrected second moment */
    double weight_decay;   /* decoupled, on 2-D tensors */
    double grad_clip;      /* max global L2 norm; 0 = off */
    int64_t warmup_steps;  /* linear warmup length in steps */
    int64_t total_steps;   /* schedule length (the run's --steps) */
    lr_schedule_t schedule;
    bool state_elsewhere;  /* the moments live elsewhere (optimizer offload starting fresh):
                              optim_create leaves m and v NULL, and fsdp_create keeps no
                              separate fp32 master on the backend (workers/parallel/fsdp.h) */
} optim_config_t;

typedef struct {
    optim_config_t cfg;
    const backend_t *be;
    size_t n;              /* floats in each moment buffer */
    float *m, *v;          /* backend memory (n): exp_avg, exp_avg_sq */
    int64_t step;          /* updates done so far */
} optim_t;

/* Allocate zeroed moments for n parameters. Returns 0 or -1 with a message. */
int optim_create(optim_t *o, const optim_config_t *cfg, const backend_t *be, size_t n, char *err, size_t errlen);
void optim_destroy(optim_t *o);

/* Learning rate of 0-based update k (see docs/training.md), with
 * p = min(1, (k - W) / max(1, S - W)):
 *   k < W:      lr * (k + 1) / W
 *   constant:   lr
 *   cosine:     min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
 *   linear:     min_lr + (lr - min_lr) * (1 - p)
 *   wsd:        with Dd = min(S - W, round(decay_fraction * S)) decay steps
 *               starting at K = S - Dd: lr for k < K, then
 *               min_lr + (lr - min_lr) * (1 - min(1, (k - K) / max(1, Dd))) */
double optim_lr(const optim_config_t *cfg, int64_t k);

/* Global L2 norm of the gradients (n floats), accumulated in double. */
double optim_grad_norm(const backend_t *be, const float *grads, size_t n);

/* clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0. */
float optim_clip_coef(double norm, double max_norm);

/* One AdamW update of every tensor in the table with learning rate lr;
 * gradients are multiplied by grad_scale first (the clip factor). params is
 * the fp32 master (model.master); params_act, when not NULL, is the working
 * copy in act storage (model.params when it is a separate bf16 buffer),
 * refreshed in the same pass. Advances o->step. */
void optim_step(optim_t *o, float *params, act_t *params_act, const float *grads, const model_tensor_t *tensors,
                int n_tensors, double lr, float grad_scale);

#endif
