/* optim.c: AdamW, clipping and the learning-rate schedule; see optim.h. */
#include "workers/model/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

int optim_create(optim_t *o, const optim_config_t *cfg, const backend_t *be, size_t n, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->be = be;
    o->n = n;
    if (cfg->state_elsewhere) return 0;
    o->m = be->alloc(n * sizeof(float));
    o->v = be->alloc(n * sizeof(float));
    if (!o->m || !o->v) {
        snprintf(err, errlen, "out of memory allocating AdamW state (2 x %zu floats)", n);
        optim_destroy(o);
        return -1;
    }
    return 0;
}

void optim_destroy(optim_t *o) {
    if (o->be) {
        if (o->m) o->be->free(o->m);
        if (o->v) o->be->free(o->v);
    }
    memset(o, 0, sizeof *o);
}

static const char *const schedule_names[] = { "constant", "cosine", "linear", "wsd" };

const char *optim_schedule_name(lr_schedule_t s) {
    return (unsigned)s < 4 ? schedule_names[s] : "constant";
}

int optim_schedule_parse(const char *name) {
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, schedule_names[i])) return i;
    return -1;
}

double optim_lr(const optim_config_t *c, int64_t k) {
    if (k < c->warmup_steps) return c->lr * (double)(k + 1) / (double)c->warmup_steps;
    if (c->schedule == LR_CONSTANT) return c->lr;
    int64_t span = c->total_steps - c->warmup_steps;
    if (c->schedule == LR_WSD) {
        int64_t dd = llround(c->decay_fraction * (double)c->total_steps);
        if (dd > span) dd = span;
        if (dd < 0) dd = 0;
        int64_t k0 = c->total_steps - dd;
        if (k < k0) return c->lr;
        double q = (double)(k - k0) / (double)(dd > 1 ? dd : 1);
        if (q > 1) q = 1;
        return c->min_lr + (c->lr - c->min_lr) * (1.0 - q);
    }
    double p = (double)(k - c->warmup_steps) / (double)(span > 1 ? span : 1);
    if (p > 1) p = 1;
    if (c->schedule == LR_LINEAR) return c->min_lr + (c->lr - c->min_lr) * (1.0 - p);
    return c->min_lr + (c->lr - c->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}

double optim_grad_norm(const backend_t *be, const float *grads, size_t n) {
    return sqrt(be->sumsq(grads, n));
}

float optim_clip_coef(double norm, double max_norm) {
    if (max_norm <= 0) return 1.f;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? (float)c : 1.f;
}

void optim_step(optim_t *o, float *params, act_t *params_act, const float *grads, const model_tensor_t *t, int nt,
                double lr, float grad_scale) {
    const optim_config_t *c = &o->cfg;
    o->step++;
    /* bias corrections in double, as torch computes them in Python floats */
    double bc1 = 1.0 - pow(c->beta1, (double)o->step);
    double bc2 = 1.0 - pow(c->beta2, (double)o->step);
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    if (o->be->adamw_spans && nt > 0) {
        /* every tensor in a few launches (multi-tensor) */
        be_span_t *sp = malloc((size_t)nt * sizeof *sp);
        CHECK_ALLOC(sp);
        for (int i = 0; i < nt; i++) sp[i] = (be_span_t){ t[i].offset, t[i].numel, t[i].decay };
        o->be->adamw_spans(params, grads, o->m, o->v, params_act, sp, nt, (float)lr, (float)c->beta1, (float)c->beta2,
                           (float)c->eps, (float)c->weight_decay, step_size, bc2_sqrt, grad_scale);
        free(sp);
        return;
    }
    for (int i = 0; i < nt; i++) {
        size_t off = t[i].offset;
        o->be->adamw(params + off, grads + off, o->m + off, o->v + off, t[i].numel, (float)lr, (float)c->beta1,
                     (float)c->beta2, (float)c->eps, t[i].decay ? (float)c->weight_decay : 0.f, step_size,
                     bc2_sqrt, grad_scale, params_act ? be_act_at(o->be, params_act, off) : NULL);
    }
}
