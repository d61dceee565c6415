/* tp.c: tensor-parallel collectives (row gathers and reduce-scatters for
 * sequence parallelism) and the vocab-parallel embedding and cross-entropy;
 * see tp.h. Relies on comm.h for the collectives and on the backend's
 * vocab-parallel ops (backend.h) for the per-row work, so the same code
 * runs on the CPU and on a GPU: every buffer here is backend memory, and
 * act_t buffers travel in act storage (fp32 on the CPU, bf16 on CUDA). */
#include "workers/model/tp.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- collectives ---- */

/* The compute stream waits for r (the host only on shm); the handle is
 * collected a few collectives later or by tp_release. */
static void tp_wait(model_tp_t *tp, int rc, comm_req_t *r, char *e, size_t elen) {
    if (!rc) rc = comm_use(&tp->held, &r, tp->be->stream ? tp->be->stream() : NULL, e, elen);
    else if (r) {
        char e2[COMM_ERR_LEN];
        comm_wait(r, e2, sizeof e2);
    }
    if (rc && !tp->rc) {
        tp->rc = rc;
        snprintf(tp->err, sizeof tp->err, "tensor-parallel group: %s", e);
    }
}

/* The element type of act storage on the wire. */
static comm_dtype_t act_dtype(const model_tp_t *tp) { return tp->be->act_bytes == 2 ? COMM_BF16 : COMM_F32; }

void tp_gather_rows(model_tp_t *tp, act_t *full, const act_t *loc, size_t width) {
    if (tp->rc) return;
    char e[COMM_ERR_LEN] = "";
    comm_req_t *r = NULL;
    int rc = comm_all_gather(tp->comm, loc, full, (size_t)tp->N * width, act_dtype(tp), &r, e, sizeof e);
    tp_wait(tp, rc, r, e, sizeof e);
}

void tp_scatter_rows(model_tp_t *tp, act_t *loc, const act_t *full, size_t width) {
    if (tp->rc) return;
    char e[COMM_ERR_LEN] = "";
    comm_req_t *r = NULL;
    int rc = comm_reduce_scatter(tp->comm, full, loc, (size_t)tp->N * width, act_dtype(tp), COMM_SUM, &r, e,
                                 sizeof e);
    tp_wait(tp, rc, r, e, sizeof e);
}

void tp_all_reduce(model_tp_t *tp, float *x, size_t n) {
    if (tp->rc) return;
    char e[COMM_ERR_LEN] = "";
    comm_req_t *r = NULL;
    int rc = comm_all_reduce(tp->comm, x, x, n, COMM_F32, COMM_SUM, &r, e, sizeof e);
    tp_wait(tp, rc, r, e, sizeof e);
}

/* ---- vocab-parallel embedding ---- */

void tp_embedding_fwd(model_tp_t *tp, act_t *out, const int32_t *tokens, const act_t *wte, int N, int D) {
    tp->be->vp_embedding_fwd(out, tokens, wte, N, D, (int64_t)tp->rank * tp->V, tp->V);
}

void tp_embedding_bwd(model_tp_t *tp, float *dwte, const act_t *dout, const int32_t *tokens, int N, int D) {
    tp->be->vp_embedding_bwd(dwte, dout, tokens, N, D, (int64_t)tp->rank * tp->V, tp->V);
}

/* ---- vocab-parallel cross-entropy ---- */

/* Columns of this rank's slice that are real vocabulary entries. */
static int valid_cols(const model_tp_t *tp, int V) {
    int64_t v = (int64_t)V - (int64_t)tp->rank * tp->V;
    return v < 0 ? 0 : v > tp->V ? tp->V : (int)v;
}

void tp_xent_fwd(model_tp_t *tp, float *losses, const act_t *logits, const int32_t *targets, int N, int V) {
    const backend_t *be = tp->be;
    int Vt = tp->V, nv = valid_cols(tp, V), T = tp->size;
    int64_t lo = (int64_t)tp->rank * Vt;
    /* the model's scratch (no allocation: on a GPU freeing would wait for
     * the whole device): mx (N) | all (T*N) | st (2N) */
    float *buf = tp->xbuf;
    float *mx = buf, *all = buf + N, *st = all + (size_t)T * N;
    /* the row max over the whole vocabulary: local maxima, gathered */
    be->vp_xent_max(mx, logits, N, Vt, nv);
    if (!tp->rc) {
        char e[COMM_ERR_LEN] = "";
        comm_req_t *r = NULL;
        int rc = comm_all_gather(tp->comm, mx, all, (size_t)N, COMM_F32, &r, e, sizeof e);
        tp_wait(tp, rc, r, e, sizeof e);
    }
    /* local sum of exp and the target's logit (0 when another rank has it) */
    be->vp_xent_stats(st, mx, all, T, logits, targets, N, Vt, nv, lo);
    tp_all_reduce(tp, st, 2 * (size_t)N);
    be->vp_xent_finish(losses, tp->lse, st, mx, N);
}

int tp_release(model_tp_t *tp, char *err, size_t errlen) {
    char e[COMM_ERR_LEN] = "";
    int rc = comm_hold_release(&tp->held, e, sizeof e);
    if (rc) {
        if (!tp->rc) {
            tp->rc = rc;
            snprintf(tp->err, sizeof tp->err, "tensor-parallel group: %s", e);
        }
        snprintf(err, errlen, "tensor-parallel group: %s", e);
    }
    return rc;
}

void tp_xent_bwd(model_tp_t *tp, act_t *dl, const act_t *logits, const int32_t *targets, float scale, int N,
                 int V) {
    int Vt = tp->V;
    tp->be->vp_xent_bwd(dl, logits, tp->lse, targets, scale, N, Vt, valid_cols(tp, V), (int64_t)tp->rank * Vt);
}
