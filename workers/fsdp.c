/* fsdp.c: hybrid sharding of the model's flat units over a shard group and
 * gradient averaging across a replica group; see fsdp.h. Relies on model.h
 * for the per-block pieces, optim.h for AdamW and comm.h for the
 * collectives. */
#include "workers/fsdp.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "log.h"
#include "workers/tp.h"
#include "workers/act_offload.h"

/* Offset in the TP-local model layout (model_tp_t) of element i of unit u. */
static size_t unit_to_model(const fsdp_t *f, int u, size_t i) {
    const model_tp_t *tp = &f->m->tp;
    if (u < f->n_units - 1) return tp->blocks_off + (size_t)u * tp->block_numel + i;
    if (i < f->rest_norm) return tp->embed_off + i;
    if (i < f->rest_lm || f->m->cfg.tie_embeddings) return tp->norm_off + (i - f->rest_norm);
    return tp->lm_head_off + (i - f->rest_lm);
}

/* Unit and offset inside it of a tensor of the TP-local table. */
static int tensor_unit(const fsdp_t *f, const model_tensor_t *t, size_t *off) {
    const model_tp_t *tp = &f->m->tp;
    if (t->block >= 0) {
        *off = t->offset - (tp->blocks_off + (size_t)t->block * tp->block_numel);
        return t->block;
    }
    if (t->offset == tp->embed_off) *off = 0;
    else if (t->offset == tp->norm_off) *off = f->rest_norm;
    else *off = f->rest_lm;
    return f->n_units - 1;
}

int fsdp_segments(const fsdp_t *f, int sidx, model_tensor_t *segs, size_t *start) {
    const model_t *m = f->m;
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor_t *t = &m->tp.tensors[i];
        size_t off;
        int u = tensor_unit(f, t, &off);
        size_t lo = (size_t)sidx * f->chunk[u], hi = lo + f->chunk[u];
        size_t a = off > lo ? off : lo, b = off + t->numel < hi ? off + t->numel : hi;
        if (a >= b) continue;
        segs[n] = *t;
        segs[n].offset = f->shard_off[u] + (a - lo);
        segs[n].numel = b - a;
        if (start) start[n] = a - off;
        n++;
    }
    return n;
}

static int wait_req(comm_req_t **r, char *err, size_t errlen) {
    if (!*r) return 0;
    int rc = comm_wait(*r, err, errlen);
    *r = NULL;
    return rc;
}

void fsdp_destroy(fsdp_t *f) {
    char e[COMM_ERR_LEN];
    for (int i = 0; i < 2; i++) {
        wait_req(&f->rs_req[i], e, sizeof e);
        free(f->gbuf[i]);
        free(f->bgrad[i]);
        free(f->rs_out[i]);
    }
    free(f->numel);
    free(f->chunk);
    free(f->shard_off);
    free(f->master);
    free(f->grad);
    free(f->rest_full);
    free(f->rest_grad);
    free(f->segs);
    if (f->opt.be) optim_destroy(&f->opt);
    memset(f, 0, sizeof *f);
}

/* dst (shard_total) = this rank's chunks of full (model layout: its TP
 * slice, then its chunk of each unit; padding zero). */
static void set_chunks(fsdp_t *f, const float *full, float *dst) {
    const model_t *m = f->m;
    float *local = NULL;
    const float *src = full;
    if (f->T > 1) {
        local = malloc(m->tp.n_params * sizeof(float));
        CHECK_ALLOC(local);
        model_tp_slice(m, full, local);
        src = local;
    }
    memset(dst, 0, f->shard_total * sizeof(float));
    for (int u = 0; u < f->n_units; u++) {
        size_t lo = (size_t)f->sidx * f->chunk[u];
        for (size_t j = 0; j < f->chunk[u] && lo + j < f->numel[u]; j++)
            dst[f->shard_off[u] + j] = src[unit_to_model(f, u, lo + j)];
    }
    free(local);
}

void fsdp_set_full_state(fsdp_t *f, const float *params, const float *exp_avg, const float *exp_avg_sq, int64_t step) {
    set_chunks(f, params, f->master);
    set_chunks(f, exp_avg, f->opt.m);
    set_chunks(f, exp_avg_sq, f->opt.v);
    f->opt.step = step;
}

int fsdp_create(fsdp_t *f, model_t *m, const float *full, comm_t *shard, comm_t *replica,
                const optim_config_t *ocfg, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    if (m->be->act_bytes != (int)sizeof(float))
        return errbuf_set(err, errlen, "hybrid sharding runs on the CPU backend only in this build (--backend cpu)"), -EINVAL;
    f->m = m;
    f->be = m->be;
    f->shard = shard;
    f->replica = replica;
    f->S = comm_size(shard);
    f->sidx = comm_index(shard);
    f->tp = m->tp.comm;
    f->T = m->tp.size;
    f->tidx = m->tp.rank;
    int L = m->cfg.n_layers;
    f->n_units = L + 1;
    size_t VD = (size_t)m->tp.V * m->cfg.dim, D = (size_t)m->cfg.dim;
    f->rest_norm = VD;
    f->rest_lm = VD + D;
    f->numel = calloc((size_t)f->n_units, sizeof *f->numel);
    f->chunk = calloc((size_t)f->n_units, sizeof *f->chunk);
    f->shard_off = calloc((size_t)f->n_units, sizeof *f->shard_off);
    f->segs = calloc((size_t)m->n_tensors, sizeof *f->segs);
    if (!f->numel || !f->chunk || !f->shard_off || !f->segs) goto nomem;
    size_t maxc = 0;
    for (int u = 0; u < f->n_units; u++) {
        f->numel[u] = u < L ? m->tp.block_numel : VD + D + (m->cfg.tie_embeddings ? 0 : VD);
        f->chunk[u] = (f->numel[u] + (size_t)f->S - 1) / (size_t)f->S;
        f->shard_off[u] = f->shard_total;
        f->shard_total += f->chunk[u];
        if (u < L && f->chunk[u] > maxc) maxc = f->chunk[u];
    }
    size_t S = (size_t)f->S;
    f->master = calloc(f->shard_total, sizeof(float));
    f->grad = calloc(f->shard_total, sizeof(float));
    f->rest_full = calloc(S * f->chunk[L], sizeof(float));
    f->rest_grad = calloc(S * f->chunk[L], sizeof(float));
    if (!f->master || !f->grad || !f->rest_full || !f->rest_grad) goto nomem;
    for (int i = 0; i < 2; i++) {
        f->gbuf[i] = calloc(S * maxc, sizeof(float));
        f->bgrad[i] = calloc(S * maxc, sizeof(float));
        f->rs_out[i] = calloc(maxc ? maxc : 1, sizeof(float));
        if (!f->gbuf[i] || !f->bgrad[i] || !f->rs_out[i]) goto nomem;
    }
    f->n_segs = fsdp_segments(f, f->sidx, f->segs, NULL);
    set_chunks(f, full, f->master);
    model_drop_params(m);
    if (optim_create(&f->opt, ocfg, f->be, f->shard_total, err, errlen)) {
        fsdp_destroy(f);
        return -ENOMEM;
    }
    return 0;
nomem:
    fsdp_destroy(f);
    return errbuf_set(err, errlen, "out of memory allocating the sharded model state"), -ENOMEM;
}

static int gather_unit(fsdp_t *f, int u, float *dst, comm_req_t **req, char *err, size_t errlen) {
    return comm_all_gather(f->shard, f->master + f->shard_off[u], dst, f->chunk[u], COMM_F32, req, err, errlen);
}

/* Wait for reduce-scatter slot i and add its result into the unit's chunk. */
static int drain_rs(fsdp_t *f, int i, char *err, size_t errlen) {
    if (!f->rs_req[i]) return 0;
    int rc = wait_req(&f->rs_req[i], err, errlen);
    if (rc) return rc;
    int u = f->rs_unit[i];
    float *g = f->grad + f->shard_off[u];
    for (size_t j = 0; j < f->chunk[u]; j++) g[j] += f->rs_out[i][j];
    return 0;
}

int fsdp_begin_step(fsdp_t *f, char *err, size_t errlen) {
    memset(f->grad, 0, f->shard_total * sizeof(float));
    memset(f->rest_grad, 0, (size_t)f->S * f->chunk[f->n_units - 1] * sizeof(float));
    comm_req_t *r = NULL;
    int rc = gather_unit(f, f->n_units - 1, f->rest_full, &r, err, errlen);
    return rc ? rc : wait_req(&r, err, errlen);
}

/* The model's first TP collective failure as this call's error. */
static int tp_failed(fsdp_t *f, char *err, size_t errlen) {
    errbuf_set(err, errlen, "%s", f->m->tp.err);
    return f->m->tp.rc;
}

int fsdp_micro_step(fsdp_t *f, const int32_t *tokens, const int32_t *targets, float loss_scale,
                    double *loss_sum, char *err, size_t errlen) {
    model_t *m = f->m;
    int L = m->cfg.n_layers, rc = 0;
    const float *embed = f->rest_full, *norm = f->rest_full + f->rest_norm,
                *lm = m->cfg.tie_embeddings ? f->rest_full : f->rest_full + f->rest_lm;
    float *dembed = f->rest_grad, *dnorm = f->rest_grad + f->rest_norm,
          *dlm = m->cfg.tie_embeddings ? f->rest_grad : f->rest_grad + f->rest_lm;
    comm_req_t *g = NULL;

    /* forward: block l in gbuf[l % 2], block l+1's gather in flight */
    /* activation offload: xs[] on its ring; each input sent as it appears */
    if (f->ao && act_offload_forward_begin(f->ao, err, errlen)) return -EIO;
    model_embed_forward(m, embed, tokens, targets);
    if (L > 0 && (rc = gather_unit(f, 0, f->gbuf[0], &g, err, errlen))) return rc;
    for (int l = 0; l < L; l++) {
        if ((rc = wait_req(&g, err, errlen))) return rc;
        if (l + 1 < L && (rc = gather_unit(f, l + 1, f->gbuf[(l + 1) % 2], &g, err, errlen))) return rc;
        if (f->ao && act_offload_produced(f->ao, l, err, errlen)) { rc = -EIO; goto fail; }
        model_block_forward(m, f->gbuf[l % 2], m->xs[l], m->xs[l + 1], &m->acts[m->act_ckpt ? 0 : l]);
    }
    *loss_sum = model_head_forward(m, norm, lm);
    if (m->tp.rc) { rc = tp_failed(f, err, errlen); goto fail; }

    /* backward: block L-1 is still gathered; block l-1's gather starts
     * before block l computes (its buffer held block l+1, now done) */
    model_head_backward(m, norm, lm, dnorm, dlm, loss_scale);
    for (int l = L - 1; l >= 0; l--) {
        if ((rc = wait_req(&g, err, errlen))) goto fail;
        if (l - 1 >= 0 && (rc = gather_unit(f, l - 1, f->gbuf[(l - 1) % 2], &g, err, errlen))) goto fail;
        float *bp = f->gbuf[l % 2];
        block_acts_t *a = &m->acts[m->act_ckpt ? 0 : l];
        /* activation offload: xs[l] back from ballastd, l - H requested */
        if (f->ao && act_offload_fetch(f->ao, l, err, errlen)) { rc = -EIO; goto fail; }
        if (m->act_ckpt) model_block_forward(m, bp, m->xs[l], m->xs[l + 1], a);
        int i = l % 2;
        if ((rc = drain_rs(f, i, err, errlen))) goto fail;
        memset(f->bgrad[i], 0, (size_t)f->S * f->chunk[l] * sizeof(float));
        model_block_backward(m, bp, f->bgrad[i], m->xs[l], a, m->dx);
        /* norm gradients cover this rank's rows only: sum them over the TP group */
        if (f->T > 1)
            tp_all_reduce(&m->tp, f->bgrad[i] + m->tp.blk_off[BLK_ATTN_NORM], 2 * (size_t)m->cfg.dim);
        if (m->tp.rc) { rc = tp_failed(f, err, errlen); goto fail; }
        if (f->ao && act_offload_release(f->ao, l, err, errlen)) { rc = -EIO; goto fail; }
        f->rs_unit[i] = l;
        if ((rc = comm_reduce_scatter(f->shard, f->bgrad[i], f->rs_out[i], f->chunk[l], COMM_F32, COMM_SUM,
                                      &f->rs_req[i], err, errlen)))
            goto fail;
    }
    for (int i = 0; i < 2; i++) if ((rc = drain_rs(f, i, err, errlen))) goto fail;
    if (f->ao && act_offload_backward_end(f->ao, err, errlen)) { rc = -EIO; goto fail; }
    model_embed_backward(m, dembed);
    if (m->tp.rc) { rc = tp_failed(f, err, errlen); goto fail; }
    return 0;
fail: {
        char e[COMM_ERR_LEN];
        if (f->ao) act_offload_backward_end(f->ao, e, sizeof e);
        wait_req(&g, e, sizeof e);
        for (int i = 0; i < 2; i++) wait_req(&f->rs_req[i], e, sizeof e);
        return rc;
    }
}

int fsdp_end_step(fsdp_t *f, char *err, size_t errlen) {
    int u = f->n_units - 1, rc;
    comm_req_t *r = NULL;
    if (f->T > 1) {
        /* the final norm's gradient covers this rank's rows only */
        tp_all_reduce(&f->m->tp, f->rest_grad + f->rest_norm, (size_t)f->m->cfg.dim);
        if (f->m->tp.rc) return tp_failed(f, err, errlen);
    }
    if ((rc = comm_reduce_scatter(f->shard, f->rest_grad, f->grad + f->shard_off[u],
                                  f->chunk[u], COMM_F32, COMM_SUM, &r, err, errlen)))
        return rc;
    if ((rc = wait_req(&r, err, errlen))) return rc;
    if (comm_size(f->replica) > 1) {
        if ((rc = comm_all_reduce(f->replica, f->grad, f->grad, f->shard_total, COMM_F32, COMM_SUM, &r, err, errlen)))
            return rc;
        if ((rc = wait_req(&r, err, errlen))) return rc;
    }
    return 0;
}

/* All-gather one double (as two fp32 words, copied bit for bit) in a group. */
static int gather_doubles(comm_t *c, const double *x, size_t n, double *out, char *err, size_t errlen) {
    comm_req_t *r = NULL;
    int rc = comm_all_gather(c, x, out, 2 * n, COMM_F32, &r, err, errlen);
    return rc ? rc : wait_req(&r, err, errlen);
}

/* Sum of x over the ranks of the TP and shard groups (and the replica group
 * when all_ranks), added in global-rank order, rank = (replica * S + shard) * T + tp,
 * so every rank gets the same bits. */
static int sum_groups(fsdp_t *f, double x, bool all_ranks, double *out, char *err, size_t errlen) {
    int T = f->T, S = f->S, R = all_ranks ? comm_size(f->replica) : 1, rc = 0;
    double *tv = calloc((size_t)T, sizeof *tv), *sv = calloc((size_t)S * T, sizeof *sv),
           *all = calloc((size_t)R * S * T, sizeof *all);
    if (!tv || !sv || !all) { rc = -ENOMEM; errbuf_set(err, errlen, "out of memory"); goto out; }
    tv[0] = x;
    if (T > 1 && (rc = gather_doubles(f->tp, &x, 1, tv, err, errlen))) goto out;
    if ((rc = gather_doubles(f->shard, tv, (size_t)T, sv, err, errlen))) goto out;
    if (R > 1) {
        if ((rc = gather_doubles(f->replica, sv, (size_t)S * T, all, err, errlen))) goto out;
    } else {
        memcpy(all, sv, (size_t)S * T * sizeof *all);
    }
    double s = 0;
    for (int i = 0; i < R * S * T; i++) s += all[i];
    *out = s;
out:
    free(tv);
    free(sv);
    free(all);
    return rc;
}

/* This rank's sum of squares of its gradient chunks, counting each
 * parameter once per job: replicated tensors (the norms) only on TP rank 0. */
static double local_sumsq(const fsdp_t *f) {
    if (f->T == 1) return f->be->sumsq(f->grad, f->shard_total);
    double s = 0;
    for (int i = 0; i < f->n_segs; i++)
        if (f->segs[i].tp_dim >= 0 || f->tidx == 0) s += f->be->sumsq(f->grad + f->segs[i].offset, f->segs[i].numel);
    return s;
}

int fsdp_grad_norm(fsdp_t *f, double *norm, char *err, size_t errlen) {
    /* replicas hold the same chunks: add over the TP and shard groups */
    double ss = local_sumsq(f);
    int rc = sum_groups(f, ss, false, &ss, err, errlen);
    *norm = sqrt(ss);
    return rc;
}

int fsdp_sum_all(fsdp_t *f, double x, double *out, char *err, size_t errlen) {
    return sum_groups(f, x, true, out, err, errlen);
}

void fsdp_optim_step(fsdp_t *f, double lr, float grad_scale) {
    optim_step(&f->opt, f->master, NULL, f->grad, f->segs, f->n_segs, lr, grad_scale);
}

int fsdp_gather_params(fsdp_t *f, float *full, char *err, size_t errlen) {
    const model_t *m = f->m;
    size_t nl = m->tp.n_params;
    float *local = f->T > 1 ? calloc(nl, sizeof(float)) : full, *all = NULL;
    int rc = 0;
    if (!local) return errbuf_set(err, errlen, "out of memory"), -ENOMEM;
    for (int u = 0; u < f->n_units && !rc; u++) {
        float *buf = calloc((size_t)f->S * f->chunk[u], sizeof(float));
        if (!buf) { rc = -ENOMEM; errbuf_set(err, errlen, "out of memory"); break; }
        comm_req_t *r = NULL;
        rc = gather_unit(f, u, buf, &r, err, errlen);
        if (!rc) rc = wait_req(&r, err, errlen);
        if (!rc) for (size_t i = 0; i < f->numel[u]; i++) local[unit_to_model(f, u, i)] = buf[i];
        free(buf);
    }
    if (!rc && f->T > 1) {
        /* every TP rank's local parameters, each written back into the full layout */
        all = malloc((size_t)f->T * nl * sizeof(float));
        comm_req_t *r = NULL;
        if (!all) { rc = -ENOMEM; errbuf_set(err, errlen, "out of memory"); }
        else if (!(rc = comm_all_gather(f->tp, local, all, nl, COMM_F32, &r, err, errlen)))
            rc = wait_req(&r, err, errlen);
        for (int t = 0; !rc && t < f->T; t++) model_tp_unslice(m, t, all + (size_t)t * nl, full);
    }
    if (local != full) free(local);
    free(all);
    return rc;
}

size_t fsdp_state_bytes(const fsdp_t *f) { return f->shard_total * 4 * sizeof(float); }
