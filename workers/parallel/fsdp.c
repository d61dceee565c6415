/* fsdp.c: hybrid sharding of the model's flat units over a shard group and
 * gradient averaging across a replica group; see fsdp.h. Relies on model.h
 * for the per-block pieces, optim.h for AdamW and comm.h for the
 * collectives. A group of one rank has no communicator (NULL) or one of
 * size 1: its collectives are identities, run here as local copies or
 * skipped (group_n). */
#include "workers/parallel/fsdp.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "log.h"
#include "workers/model/tp.h"

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

/* ---- groups that may be one rank ---- */

/* Ranks of group c: 1 without a communicator (a group of one rank). */
static int group_n(const comm_t *c) { return c ? comm_size(c) : 1; }
static int group_index(const comm_t *c) { return c ? comm_index(c) : 0; }

static size_t dtype_bytes(comm_dtype_t dt) { return dt == COMM_BF16 ? 2 : 4; }

/* comm_all_gather, and over one rank the identity: a copy in backend
 * memory when send and recv differ (*req NULL then). */
static int all_gather(const backend_t *be, comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                      comm_req_t **req, char *err, size_t errlen) {
    if (group_n(c) > 1) return comm_all_gather(c, send, recv, count, dt, req, err, errlen);
    *req = NULL;
    if (send != recv && count) be->copy(recv, send, count * dtype_bytes(dt));
    return 0;
}

/* be->free of a buffer that may be NULL */
static void bfree(const backend_t *be, void *p) {
    if (be && p) be->free(p);
}

void fsdp_destroy(fsdp_t *f) {
    char e[COMM_ERR_LEN];
    const backend_t *be = f->be;
    comm_hold_release(&f->held, e, sizeof e);
    if (f->m) tp_release(&f->m->tp, e, sizeof e); /* before the communicators go (dist_destroy) */
    for (int i = 0; i < 2; i++) {
        wait_req(&f->rs_req[i], e, sizeof e);
        bfree(be, f->gbuf[i]);
        bfree(be, f->bgrad[i]);
        bfree(be, f->rs_out[i]);
    }
    if (f->direct) f->rest_full = NULL, f->rest_grad = NULL; /* views of wact and grad */
    for (int i = 0; i < 2; i++) {
        bfree(be, f->rs16_in[i]);
        bfree(be, f->rs16_out[i]);
    }
    bfree(be, f->g16);
    free(f->init_host);
    free(f->numel);
    free(f->chunk);
    free(f->shard_off);
    if (f->wact != (act_t *)f->master) bfree(be, f->wact);
    bfree(be, f->master);
    bfree(be, f->grad);
    bfree(be, f->rest_full);
    bfree(be, f->rest_grad);
    free(f->segs);
    if (f->opt.be) optim_destroy(&f->opt);
    memset(f, 0, sizeof *f);
}

/* This rank's chunks of full (host, model layout: its TP slice, then its
 * chunk of each unit; padding zero) in host memory (shard_total floats,
 * malloc'ed). */
static float *chunks_host(const fsdp_t *f, const float *full) {
    const model_t *m = f->m;
    float *local = NULL;
    const float *src = full;
    if (f->T > 1) {
        local = malloc(m->tp.n_params * sizeof(float));
        CHECK_ALLOC(local);
        model_tp_slice(m, full, local);
        src = local;
    }
    float *host = calloc(f->shard_total ? f->shard_total : 1, sizeof(float));
    CHECK_ALLOC(host);
    for (int u = 0; u < f->n_units; u++) {
        size_t lo = (size_t)f->sidx * f->chunk[u];
        for (size_t j = 0; j < f->chunk[u] && lo + j < f->numel[u]; j++)
            host[f->shard_off[u] + j] = src[unit_to_model(f, u, lo + j)];
    }
    free(local);
    return host;
}

/* dst (shard_total, backend memory) = this rank's chunks of full. With
 * T > 1 they are built on the host (the TP slice cut first) and copied over
 * once; with T = 1 each chunk is at most three runs of full (a block, or
 * embed | final norm | lm_head), copied straight in, so no host copy of the
 * state is made (at S = 1 it would be the whole model's). */
static void set_chunks(fsdp_t *f, const float *full, float *dst) {
    if (f->T > 1) {
        float *host = chunks_host(f, full);
        f->be->from_host(dst, host, f->shard_total * sizeof(float));
        free(host);
        return;
    }
    const model_tp_t *tp = &f->m->tp;
    int L = f->n_units - 1;
    for (int u = 0; u < f->n_units; u++) {
        size_t lo = (size_t)f->sidx * f->chunk[u], hi = lo + f->chunk[u] < f->numel[u] ? lo + f->chunk[u] : f->numel[u];
        /* the unit's runs: elements [rs, re) of the unit are at ro.. in full */
        size_t rs[3] = { 0, f->rest_norm, f->rest_lm }, re[3] = { f->rest_norm, f->rest_lm, f->numel[u] },
               ro[3] = { tp->embed_off, tp->norm_off, tp->lm_head_off };
        if (u < L) rs[0] = 0, re[0] = f->numel[u], ro[0] = tp->blocks_off + (size_t)u * tp->block_numel, re[1] = re[2] = 0;
        for (int k = 0; k < 3; k++) {
            size_t a = lo > rs[k] ? lo : rs[k], b = hi < re[k] ? hi : re[k];
            if (a < b) f->be->from_host(dst + f->shard_off[u] + (a - lo), full + ro[k] + (a - rs[k]), (b - a) * sizeof(float));
        }
    }
}

/* The working copy (act storage) from host chunks without a backend fp32
 * master: unit by unit through one fp32 buffer of the largest chunk, the
 * same rounding as refresh_wact. 0 or -ENOMEM. */
static int wact_from_host(fsdp_t *f, const float *host) {
    size_t maxc = 0;
    for (int u = 0; u < f->n_units; u++) if (f->chunk[u] > maxc) maxc = f->chunk[u];
    float *tmp = f->be->alloc((maxc ? maxc : 1) * sizeof(float));
    if (!tmp) return -ENOMEM;
    for (int u = 0; u < f->n_units; u++) {
        f->be->from_host(tmp, host + f->shard_off[u], f->chunk[u] * sizeof(float));
        f->be->to_act(be_act_at(f->be, f->wact, f->shard_off[u]), tmp, f->chunk[u]);
    }
    f->be->free(tmp);
    return 0;
}

void fsdp_drop_init(fsdp_t *f) {
    free(f->init_host);
    f->init_host = NULL;
}

/* The working copy of the chunks in act storage after the master changed
 * (nothing to do when act storage is the fp32 master itself). */
static void refresh_wact(fsdp_t *f) {
    /* no master (optimizer offload keeps it in ballastd): the working copy is current */
    if (f->master && f->wact != (act_t *)f->master) f->be->to_act(f->wact, f->master, f->shard_total);
}

void fsdp_set_full_state(fsdp_t *f, const float *params, const float *exp_avg, const float *exp_avg_sq, int64_t step) {
    set_chunks(f, params, f->master);
    set_chunks(f, exp_avg, f->opt.m);
    set_chunks(f, exp_avg_sq, f->opt.v);
    refresh_wact(f);
    f->opt.step = step;
}

void fsdp_state_changed(fsdp_t *f) { refresh_wact(f); }

int fsdp_create(fsdp_t *f, model_t *m, const float *full, comm_t *shard, comm_t *replica,
                const optim_config_t *ocfg, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    f->m = m;
    f->be = m->be;
    f->shard = shard;
    f->replica = replica;
    f->S = group_n(shard);
    f->sidx = group_index(shard);
    f->R = group_n(replica);
    f->ridx = group_index(replica);
    f->direct = f->S == 1;
    f->tp = m->tp.comm;
    f->T = m->tp.size;
    f->C = 1;
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
    size_t S = (size_t)f->S, ab = (size_t)f->be->act_bytes;
    const backend_t *be = f->be;
    /* backend memory, zeroed (the padding stays zero); with the optimizer
     * state elsewhere and a separate working copy, no fp32 master */
    bool no_master = ocfg->state_elsewhere && ab != sizeof(float);
    f->master = no_master ? NULL : be->alloc(f->shard_total * sizeof(float));
    f->wact = ab == sizeof(float) ? (act_t *)f->master : be->alloc(f->shard_total * ab);
    f->grad = be->alloc(f->shard_total * sizeof(float));
    if ((!no_master && !f->master) || !f->wact || !f->grad) goto nomem;
    if (f->direct) {
        /* S = 1: a unit's chunk is the unit; the blocks and the rest are
         * read from the working copy and their gradients summed in the
         * chunks, with no gathered copy or reduce-scatter buffer */
        f->rest_full = be_act_at(be, f->wact, f->shard_off[L]);
        f->rest_grad = f->grad + f->shard_off[L];
    } else {
        f->rest_full = be->alloc(S * f->chunk[L] * ab);
        f->rest_grad = be->alloc(S * f->chunk[L] * sizeof(float));
        if (!f->rest_full || !f->rest_grad) goto nomem;
        for (int i = 0; i < 2; i++) {
            f->gbuf[i] = be->alloc(S * maxc * ab);
            f->bgrad[i] = be->alloc(S * maxc * sizeof(float));
            f->rs_out[i] = be->alloc((maxc ? maxc : 1) * sizeof(float));
            if (!f->gbuf[i] || !f->bgrad[i] || !f->rs_out[i]) goto nomem;
        }
    }
    f->n_segs = fsdp_segments(f, f->sidx, f->segs, NULL);
    if (ocfg->state_elsewhere) {
        /* the chunks stay in host memory for the first stored version */
        f->init_host = chunks_host(f, full);
        if (f->master) be->from_host(f->master, f->init_host, f->shard_total * sizeof(float));
        if (no_master && wact_from_host(f, f->init_host)) goto nomem;
        refresh_wact(f);
    } else {
        set_chunks(f, full, f->master);
        refresh_wact(f);
    }
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

int fsdp_set_grad_reduce(fsdp_t *f, comm_dtype_t dt, char *err, size_t errlen) {
    f->grad_dt = dt;
    if (dt != COMM_BF16) return 0;
    if (!f->be->to_bf16 || !f->be->acc_bf16 || !f->be->from_bf16)
        return errbuf_set(err, errlen, "--grad-reduce-dtype bf16: the %s backend has no bf16 gradient ops", f->be->name),
               -EINVAL;
    const backend_t *be = f->be;
    int L = f->n_units - 1;
    size_t maxc = 0, S = (size_t)f->S;
    for (int u = 0; u < L; u++) if (f->chunk[u] > maxc) maxc = f->chunk[u];
    size_t rest = (S + 1) * f->chunk[L], g = f->shard_total > rest ? f->shard_total : rest;
    for (int i = 0; i < 2 && S > 1; i++) {
        if (!f->rs16_in[i]) f->rs16_in[i] = be->alloc((S * maxc > 0 ? S * maxc : 1) * 2);
        if (!f->rs16_out[i]) f->rs16_out[i] = be->alloc((maxc ? maxc : 1) * 2);
        if (!f->rs16_in[i] || !f->rs16_out[i]) goto nomem;
    }
    if (!f->g16 && !(f->g16 = be->alloc(g * 2))) goto nomem;
    return 0;
nomem:
    return errbuf_set(err, errlen, "--grad-reduce-dtype bf16: out of %s memory for the bf16 gradient buffers", be->name),
           -ENOMEM;
}

/* Whether the shard group's gradient reductions go in bf16. */
static bool shard_bf16(const fsdp_t *f) { return f->grad_dt == COMM_BF16 && f->S > 1; }

/* The element type of act storage on the wire: the working copy travels
 * in it (bf16 on CUDA, fp32 on the CPU). */
static comm_dtype_t act_dtype(const fsdp_t *f) { return f->be->act_bytes == 2 ? COMM_BF16 : COMM_F32; }

/* Start gathering unit u's working copy (act storage) into dst (S chunks). */
static int gather_unit(fsdp_t *f, int u, act_t *dst, comm_req_t **req, char *err, size_t errlen) {
    return all_gather(f->be, f->shard, be_act_at(f->be, f->wact, f->shard_off[u]), dst, f->chunk[u], act_dtype(f), req,
                      err, errlen);
}

/* Block l's gathered parameters: buffer l % 2, or (S = 1) its chunk of the
 * working copy itself. */
static const act_t *block_params(const fsdp_t *f, int l) {
    return f->direct ? be_act_at(f->be, f->wact, f->shard_off[l]) : f->gbuf[l % 2];
}

/* Start the gather of block l into its buffer (nothing at S = 1). */
static int fetch_block(fsdp_t *f, int l, comm_req_t **req, char *err, size_t errlen) {
    return f->direct ? 0 : gather_unit(f, l, f->gbuf[l % 2], req, err, errlen);
}

/* The compute stream waits for collective *r (the host only on shm); the
 * handle is collected later (comm_use). */
static int use_req(fsdp_t *f, comm_req_t **r, char *err, size_t errlen) {
    return comm_use(&f->held, r, be_stream(f->be), err, errlen);
}

/* Add reduce-scatter slot i's result into the unit's chunk, after it. */
static int drain_rs(fsdp_t *f, int i, char *err, size_t errlen) {
    if (!f->rs_req[i]) return 0;
    int rc = use_req(f, &f->rs_req[i], err, errlen);
    if (rc) return rc;
    int u = f->rs_unit[i];
    if (shard_bf16(f)) f->be->acc_bf16(f->grad + f->shard_off[u], f->rs16_out[i], f->chunk[u]);
    else f->be->acc(f->grad + f->shard_off[u], f->rs_out[i], f->chunk[u]);
    return 0;
}

int fsdp_begin_step(fsdp_t *f, char *err, size_t errlen) {
    f->be->memset0(f->grad, f->shard_total * sizeof(float));
    if (f->direct) return 0; /* the rest unit is read and summed in place */
    f->be->memset0(f->rest_grad, (size_t)f->S * f->chunk[f->n_units - 1] * sizeof(float));
    comm_req_t *r = NULL;
    int rc = gather_unit(f, f->n_units - 1, f->rest_full, &r, err, errlen);
    return rc ? rc : use_req(f, &r, err, errlen);
}

/* The model's first TP collective failure as this call's error. */
static int tp_failed(fsdp_t *f, char *err, size_t errlen) {
    errbuf_set(err, errlen, "%s", f->m->tp.err);
    return f->m->tp.rc;
}

int fsdp_micro_step(fsdp_t *f, const int32_t *tokens, const int32_t *targets, float loss_scale,
                    double *loss_sum, char *err, size_t errlen) {
    model_t *m = f->m;
    const backend_t *be = f->be;
    int L = m->cfg.n_layers, rc = 0;
    const act_t *embed = f->rest_full, *norm = be_act_at(be, f->rest_full, f->rest_norm),
                *lm = m->cfg.tie_embeddings ? f->rest_full : be_act_at(be, f->rest_full, f->rest_lm);
    float *dembed = f->rest_grad, *dnorm = f->rest_grad + f->rest_norm,
          *dlm = m->cfg.tie_embeddings ? f->rest_grad : f->rest_grad + f->rest_lm;
    comm_req_t *g = NULL;

    /* forward: block l in gbuf[l % 2], block l+1's gather in flight (S = 1:
     * each block straight from the working copy) */
    /* activation offload: xs[] on its ring; each input sent as it appears */
    if (f->ao && f->ao->forward_begin(f->ao->ctx, err, errlen)) return -EIO;
    model_embed_forward(m, embed, tokens, targets);
    if (L > 0 && (rc = fetch_block(f, 0, &g, err, errlen))) return rc;
    for (int l = 0; l < L; l++) {
        if ((rc = use_req(f, &g, err, errlen))) goto fail;
        if (l + 1 < L && (rc = fetch_block(f, l + 1, &g, err, errlen))) return rc;
        if (f->ao && f->ao->produced(f->ao->ctx, l, err, errlen)) { rc = -EIO; goto fail; }
        if (be->op_scope) be->op_scope(l); /* per-block FP8 scaling state in the shared buffers */
        model_block_forward(m, block_params(f, l), model_block_input(m, l), model_block_input(m, l + 1), model_block_acts(m, l));
    }
    if (be->op_scope) be->op_scope(-1);
    *loss_sum = model_head_forward(m, norm, lm);
    if (m->tp.rc) { rc = tp_failed(f, err, errlen); goto fail; }
    if (f->logits_host) {
        /* test hook: the logits before the backward overwrites them */
        be->act_to_host(f->logits_host, m->logits, (size_t)m->B * m->T * (size_t)m->tp.V);
        f->logits_host = NULL;
    }

    /* backward: block L-1 is still gathered; block l-1's gather starts
     * before block l computes (its buffer held block l+1, now done) */
    model_head_backward(m, norm, lm, dnorm, dlm, loss_scale);
    for (int l = L - 1; l >= 0; l--) {
        if ((rc = use_req(f, &g, err, errlen))) goto fail;
        if (l - 1 >= 0 && (rc = fetch_block(f, l - 1, &g, err, errlen))) goto fail;
        const act_t *bp = block_params(f, l);
        /* activation offload: xs[l] back from ballastd, l - H requested */
        if (f->ao && f->ao->fetch(f->ao->ctx, l, err, errlen)) { rc = -EIO; goto fail; }
        if (be->op_scope) be->op_scope(l);
        model_block_recompute(m, l, bp, model_block_input(m, l), model_block_input(m, l + 1));
        block_acts_t *a = model_block_acts(m, l);
        if (f->direct) {
            /* S = 1: the block's gradient accumulates in its chunk over the
             * step; the TP sum of its norms waits for fsdp_end_step */
            model_block_backward(m, bp, f->grad + f->shard_off[l], model_block_input(m, l), a, m->dx);
            if (m->tp.rc) { rc = tp_failed(f, err, errlen); goto fail; }
            if (f->ao && f->ao->release(f->ao->ctx, l, err, errlen)) { rc = -EIO; goto fail; }
            continue;
        }
        int i = l % 2;
        if ((rc = drain_rs(f, i, err, errlen))) goto fail;
        be->memset0(f->bgrad[i], (size_t)f->S * f->chunk[l] * sizeof(float));
        model_block_backward(m, bp, f->bgrad[i], model_block_input(m, l), a, m->dx);
        /* norm gradients cover this rank's rows only: sum them over the TP group */
        if (f->T > 1)
            tp_all_reduce(&m->tp, f->bgrad[i] + m->tp.blk_off[BLK_ATTN_NORM], 2 * (size_t)m->cfg.dim);
        if (m->tp.rc) { rc = tp_failed(f, err, errlen); goto fail; }
        if (f->ao && f->ao->release(f->ao->ctx, l, err, errlen)) { rc = -EIO; goto fail; }
        f->rs_unit[i] = l;
        if (shard_bf16(f)) {
            be->to_bf16(f->rs16_in[i], f->bgrad[i], (size_t)f->S * f->chunk[l]);
            rc = comm_reduce_scatter(f->shard, f->rs16_in[i], f->rs16_out[i], f->chunk[l], COMM_BF16, COMM_SUM,
                                     &f->rs_req[i], err, errlen);
        } else {
            rc = comm_reduce_scatter(f->shard, f->bgrad[i], f->rs_out[i], f->chunk[l], COMM_F32, COMM_SUM,
                                     &f->rs_req[i], err, errlen);
        }
        if (rc) goto fail;
    }
    for (int i = 0; i < 2; i++) if ((rc = drain_rs(f, i, err, errlen))) goto fail;
    if (be->op_scope) be->op_scope(-1);
    if (f->ao && f->ao->backward_end(f->ao->ctx, err, errlen)) { rc = -EIO; goto fail; }
    model_embed_backward(m, dembed);
    if (m->tp.rc) { rc = tp_failed(f, err, errlen); goto fail; }
    /* collect the handles while the GPU works through the queue */
    if ((rc = comm_hold_release(&f->held, err, errlen))) goto fail;
    if ((rc = tp_release(&m->tp, err, errlen))) goto fail;
    return 0;
fail: {
        char e[COMM_ERR_LEN];
        if (f->ao) f->ao->backward_end(f->ao->ctx, e, sizeof e);
        wait_req(&g, e, sizeof e);
        for (int i = 0; i < 2; i++) wait_req(&f->rs_req[i], e, sizeof e);
        comm_hold_release(&f->held, e, sizeof e);
        tp_release(&m->tp, e, sizeof e);
        if (be->op_scope) be->op_scope(-1);
        return rc;
    }
}

int fsdp_forward_loss(fsdp_t *f, const int32_t *tokens, const int32_t *targets, double *loss_sum, char *err,
                      size_t errlen) {
    model_t *m = f->m;
    const backend_t *be = f->be;
    int L = m->cfg.n_layers, rc = 0;
    const act_t *embed = f->rest_full, *norm = be_act_at(be, f->rest_full, f->rest_norm),
                *lm = m->cfg.tie_embeddings ? f->rest_full : be_act_at(be, f->rest_full, f->rest_lm);
    comm_req_t *g = NULL;
    if (f->ao) return errbuf_set(err, errlen, "a forward-only pass does not run with activation offload"), -EINVAL;
    model_embed_forward(m, embed, tokens, targets);
    if (L > 0 && (rc = fetch_block(f, 0, &g, err, errlen))) return rc;
    for (int l = 0; l < L; l++) {
        if ((rc = use_req(f, &g, err, errlen))) goto fail;
        if (l + 1 < L && (rc = fetch_block(f, l + 1, &g, err, errlen))) goto fail;
        if (be->op_scope) be->op_scope(l);
        model_block_forward(m, block_params(f, l), model_block_input(m, l), model_block_input(m, l + 1),
                            model_block_acts(m, l));
    }
    if (be->op_scope) be->op_scope(-1);
    *loss_sum = model_head_forward(m, norm, lm);
    if (m->tp.rc) { rc = tp_failed(f, err, errlen); goto fail; }
    if ((rc = comm_hold_release(&f->held, err, errlen))) goto fail;
    if ((rc = tp_release(&m->tp, err, errlen))) goto fail;
    return 0;
fail: {
        char e[COMM_ERR_LEN];
        wait_req(&g, e, sizeof e);
        comm_hold_release(&f->held, e, sizeof e);
        tp_release(&m->tp, e, sizeof e);
        if (be->op_scope) be->op_scope(-1);
        return rc;
    }
}

int fsdp_end_step(fsdp_t *f, char *err, size_t errlen) {
    int u = f->n_units - 1, rc;
    comm_req_t *r = NULL;
    if (f->T > 1) {
        /* the final norm's gradient covers this rank's rows only; at S = 1
         * the blocks' norms too (summed over the step in their chunks) */
        model_tp_t *tp = &f->m->tp;
        tp_all_reduce(tp, f->rest_grad + f->rest_norm, (size_t)f->m->cfg.dim);
        for (int l = 0; f->direct && l < u; l++)
            tp_all_reduce(tp, f->grad + f->shard_off[l] + tp->blk_off[BLK_ATTN_NORM], 2 * (size_t)f->m->cfg.dim);
        if (tp->rc || tp_release(tp, err, errlen)) return tp_failed(f, err, errlen);
    }
    const backend_t *be = f->be;
    if (f->direct) {
        /* the rest unit's gradient is already its chunk */
    } else if (shard_bf16(f)) {
        /* g16 = [ S chunks in | one chunk out ] */
        size_t in = (size_t)f->S * f->chunk[u];
        char *out16 = (char *)f->g16 + in * 2;
        be->to_bf16(f->g16, f->rest_grad, in);
        if ((rc = comm_reduce_scatter(f->shard, f->g16, out16, f->chunk[u], COMM_BF16, COMM_SUM, &r, err, errlen)))
            return rc;
        if ((rc = wait_req(&r, err, errlen))) return rc;
        be->from_bf16(f->grad + f->shard_off[u], out16, f->chunk[u]);
    } else {
        if ((rc = comm_reduce_scatter(f->shard, f->rest_grad, f->grad + f->shard_off[u], f->chunk[u], COMM_F32,
                                      COMM_SUM, &r, err, errlen)))
            return rc;
        if ((rc = wait_req(&r, err, errlen))) return rc;
    }
    if (f->R > 1) {
        if (f->grad_dt == COMM_BF16) {
            be->to_bf16(f->g16, f->grad, f->shard_total);
            if ((rc = comm_all_reduce(f->replica, f->g16, f->g16, f->shard_total, COMM_BF16, COMM_SUM, &r, err,
                                      errlen)))
                return rc;
            if ((rc = wait_req(&r, err, errlen))) return rc;
            be->from_bf16(f->grad, f->g16, f->shard_total);
        } else {
            if ((rc = comm_all_reduce(f->replica, f->grad, f->grad, f->shard_total, COMM_F32, COMM_SUM, &r, err,
                                      errlen)))
                return rc;
            if ((rc = wait_req(&r, err, errlen))) return rc;
        }
    }
    return 0;
}

int fsdp_all_gather_host(const backend_t *be, comm_t *c, const void *in, size_t n, void *out, char *err,
                         size_t errlen) {
    if (group_n(c) == 1) {
        memmove(out, in, n * sizeof(float));
        return 0;
    }
    size_t in_b = n * sizeof(float), out_b = (size_t)comm_size(c) * in_b;
    char *buf = be->alloc(in_b + out_b);
    if (!buf) return errbuf_set(err, errlen, "out of memory"), -ENOMEM;
    be->from_host(buf, in, in_b);
    comm_req_t *r = NULL;
    int rc = comm_all_gather(c, buf, buf + in_b, n, COMM_F32, &r, err, errlen);
    if (!rc) rc = wait_req(&r, err, errlen);
    if (!rc) be->to_host(out, buf + in_b, out_b);
    be->free(buf);
    return rc;
}

/* All-gather n doubles per rank (as fp32 word pairs, copied bit for bit). */
static int gather_doubles(const backend_t *be, comm_t *c, const double *x, size_t n, double *out, char *err,
                          size_t errlen) {
    return fsdp_all_gather_host(be, c, x, 2 * n, out, err, errlen);
}

/* Sum of x over the ranks of the TP and shard groups (and the replica group
 * when all_ranks), added in global-rank order, rank = (replica * S + shard) * T + tp,
 * so every rank gets the same bits. */
static int sum_groups(fsdp_t *f, double x, bool all_ranks, double *out, char *err, size_t errlen) {
    int T = f->T, S = f->S, R = all_ranks ? f->R : 1, rc = 0;
    double *tv = calloc((size_t)T, sizeof *tv), *sv = calloc((size_t)S * T, sizeof *sv),
           *all = calloc((size_t)R * S * T, sizeof *all);
    if (!tv || !sv || !all) { rc = -ENOMEM; errbuf_set(err, errlen, "out of memory"); goto out; }
    tv[0] = x;
    if (T > 1 && (rc = gather_doubles(f->be, f->tp, &x, 1, tv, err, errlen))) goto out;
    if ((rc = gather_doubles(f->be, f->shard, tv, (size_t)T, sv, err, errlen))) goto out;
    if (R > 1) {
        if ((rc = gather_doubles(f->be, f->replica, sv, (size_t)S * T, all, err, errlen))) goto out;
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
    /* a separate working copy (bf16 on CUDA) is refreshed in the same pass */
    optim_step(&f->opt, f->master, f->wact != (act_t *)f->master ? f->wact : NULL, f->grad, f->segs, f->n_segs, lr,
               grad_scale);
}

/* The full tensors (model layout, n_params floats) of the chunk arrays src
 * (master or grad: shard_total floats in backend memory) of every rank:
 * each unit gathered over the shard group, the TP slices over the TP
 * group. Collective over both. */
static int gather_full(fsdp_t *f, const float *src, float *full, char *err, size_t errlen) {
    const model_t *m = f->m;
    const backend_t *be = f->be;
    size_t nl = m->tp.n_params, maxc = 0;
    for (int u = 0; u < f->n_units; u++) if (f->chunk[u] > maxc) maxc = f->chunk[u];
    /* host: this rank's TP-local parameters and one gathered unit; backend:
     * the unit's S chunks (the collectives take backend memory; at S = 1
     * the chunk itself is the unit) */
    float *local = f->T > 1 ? calloc(nl, sizeof(float)) : full, *all = NULL, *dall = NULL;
    float *host = malloc((size_t)f->S * maxc * sizeof(float)),
          *dbuf = f->S > 1 ? be->alloc((size_t)f->S * maxc * sizeof(float)) : NULL;
    int rc = 0;
    if (!local || !host || (f->S > 1 && !dbuf)) { rc = -ENOMEM; errbuf_set(err, errlen, "out of memory"); goto out; }
    for (int u = 0; u < f->n_units && !rc; u++) {
        const float *unit = src + f->shard_off[u];
        if (f->S > 1) {
            comm_req_t *r = NULL;
            rc = comm_all_gather(f->shard, unit, dbuf, f->chunk[u], COMM_F32, &r, err, errlen);
            if (!rc) rc = wait_req(&r, err, errlen);
            if (rc) break;
            unit = dbuf;
        }
        be->to_host(host, unit, (size_t)f->S * f->chunk[u] * sizeof(float));
        for (size_t i = 0; i < f->numel[u]; i++) local[unit_to_model(f, u, i)] = host[i];
    }
    if (!rc && f->T > 1) {
        /* every TP rank's local parameters, each written back into the full layout */
        all = malloc((size_t)f->T * nl * sizeof(float));
        dall = be->alloc((size_t)(f->T + 1) * nl * sizeof(float));
        comm_req_t *r = NULL;
        if (!all || !dall) { rc = -ENOMEM; errbuf_set(err, errlen, "out of memory"); goto out; }
        be->from_host(dall, local, nl * sizeof(float));
        if (!(rc = comm_all_gather(f->tp, dall, dall + nl, nl, COMM_F32, &r, err, errlen)))
            rc = wait_req(&r, err, errlen);
        if (!rc) be->to_host(all, dall + nl, (size_t)f->T * nl * sizeof(float));
        for (int t = 0; !rc && t < f->T; t++) model_tp_unslice(m, t, all + (size_t)t * nl, full);
    }
out:
    if (local != full) free(local);
    free(all);
    free(host);
    if (dbuf) be->free(dbuf);
    if (dall) be->free(dall);
    return rc;
}

int fsdp_gather_params(fsdp_t *f, float *full, char *err, size_t errlen) {
    if (!f->master)
        return errbuf_set(err, errlen, "the fp32 master chunks are in ballastd (optimizer offload): bring them back "
                          "first (offload_run_before_ckpt)"), -EINVAL;
    /* the fp32 master chunks, not the working copy */
    return gather_full(f, f->master, full, err, errlen);
}

int fsdp_gather_grads(fsdp_t *f, float *full, char *err, size_t errlen) {
    return gather_full(f, f->grad, full, err, errlen);
}

size_t fsdp_state_bytes(const fsdp_t *f) {
    /* what is resident: optimizer offload frees the moments, and the master where the working copy is separate */
    size_t per = sizeof(float) * (1 + (f->master != NULL) + (f->opt.m != NULL) + (f->opt.v != NULL));
    if (f->master != (float *)f->wact) per += (size_t)f->be->act_bytes;
    return f->shard_total * per;
}
