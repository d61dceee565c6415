/* tp.c: tensor-parallel collectives (row gathers and reduce-scatters for
 * sequence parallelism) and the vocab-parallel embedding and cross-entropy;
 * see tp.h. Relies on comm.h for the collectives. */
#include "workers/tp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- collectives ---- */

static void tp_wait(model_tp_t *tp, int rc, comm_req_t *r, char *e, size_t elen) {
    if (!rc) rc = comm_wait(r, e, elen);
    if (rc && !tp->rc) {
        tp->rc = rc;
        snprintf(tp->err, sizeof tp->err, "tensor-parallel group: %s", e);
    }
}

void tp_gather_rows(model_tp_t *tp, act_t *full, const act_t *loc, size_t width) {
    if (tp->rc) return;
    char e[COMM_ERR_LEN] = "";
    comm_req_t *r = NULL;
    int rc = comm_all_gather(tp->comm, loc, full, (size_t)tp->N * width, COMM_F32, &r, e, sizeof e);
    tp_wait(tp, rc, r, e, sizeof e);
}

void tp_scatter_rows(model_tp_t *tp, act_t *loc, const act_t *full, size_t width) {
    if (tp->rc) return;
    char e[COMM_ERR_LEN] = "";
    comm_req_t *r = NULL;
    int rc = comm_reduce_scatter(tp->comm, full, loc, (size_t)tp->N * width, COMM_F32, COMM_SUM, &r, e, sizeof e);
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
    int64_t lo = (int64_t)tp->rank * tp->V;
    for (int i = 0; i < N; i++) {
        int64_t j = tokens[i] - lo;
        float *o = out + (size_t)i * D;
        if (j >= 0 && j < tp->V) memcpy(o, wte + (size_t)j * D, (size_t)D * sizeof(float));
        else memset(o, 0, (size_t)D * sizeof(float));
    }
}

void tp_embedding_bwd(model_tp_t *tp, float *dwte, const act_t *dout, const int32_t *tokens, int N, int D) {
    int64_t lo = (int64_t)tp->rank * tp->V;
    /* token order, as the backend's embedding backward sums */
    for (int i = 0; i < N; i++) {
        int64_t j = tokens[i] - lo;
        if (j < 0 || j >= tp->V) continue;
        float *g = dwte + (size_t)j * D;
        const float *d = dout + (size_t)i * D;
        for (int k = 0; k < D; k++) g[k] += d[k];
    }
}

/* ---- vocab-parallel cross-entropy ---- */

/* Columns of this rank's slice that are real vocabulary entries. */
static int valid_cols(const model_tp_t *tp, int V) {
    int64_t v = (int64_t)V - (int64_t)tp->rank * tp->V;
    return v < 0 ? 0 : v > tp->V ? tp->V : (int)v;
}

void tp_xent_fwd(model_tp_t *tp, float *losses, const act_t *logits, const int32_t *targets, int N, int V) {
    int Vt = tp->V, nv = valid_cols(tp, V), T = tp->size;
    int64_t lo = (int64_t)tp->rank * Vt;
    float *mx = malloc((size_t)N * sizeof *mx), *all = calloc((size_t)N * T, sizeof *all),
          *st = malloc(2 * (size_t)N * sizeof *st);
    if (!mx || !all || !st) {
        if (!tp->rc) { tp->rc = -12; snprintf(tp->err, sizeof tp->err, "cross-entropy: out of memory"); }
        goto out;
    }
    /* the row max over the whole vocabulary */
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * Vt;
        float m = -INFINITY;
        for (int j = 0; j < nv; j++) if (l[j] > m) m = l[j];
        mx[i] = m;
    }
    if (!tp->rc) {
        char e[COMM_ERR_LEN] = "";
        comm_req_t *r = NULL;
        int rc = comm_all_gather(tp->comm, mx, all, (size_t)N, COMM_F32, &r, e, sizeof e);
        tp_wait(tp, rc, r, e, sizeof e);
    }
    for (int i = 0; i < N; i++) {
        float m = -INFINITY;
        for (int t = 0; t < T; t++) if (all[(size_t)t * N + i] > m) m = all[(size_t)t * N + i];
        mx[i] = m;
    }
    /* local sum of exp and the target's logit (0 when another rank has it) */
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * Vt;
        double s = 0;
        for (int j = 0; j < nv; j++) s += exp((double)(l[j] - mx[i]));
        int64_t y = targets[i] - lo;
        st[i] = (float)s;
        st[N + i] = y >= 0 && y < nv ? l[y] : 0.f;
    }
    tp_all_reduce(tp, st, 2 * (size_t)N);
    for (int i = 0; i < N; i++) {
        tp->lse[i] = (float)(log((double)st[i]) + mx[i]);
        losses[i] = (float)(log((double)st[i]) + mx[i] - st[N + i]);
    }
out:
    free(mx);
    free(all);
    free(st);
}

void tp_xent_bwd(model_tp_t *tp, act_t *dl, const act_t *logits, const int32_t *targets, float scale, int N,
                 int V) {
    int Vt = tp->V, nv = valid_cols(tp, V);
    int64_t lo = (int64_t)tp->rank * Vt;
    for (int i = 0; i < N; i++) {
        const float *l = logits + (size_t)i * Vt;
        float *d = dl + (size_t)i * Vt;
        float lse = tp->lse[i];
        int64_t y = targets[i] - lo;
        for (int j = 0; j < nv; j++) {
            float p = expf(l[j] - lse);
            d[j] = (p - (j == y ? 1.f : 0.f)) * scale;
        }
        for (int j = nv; j < Vt; j++) d[j] = 0.f;
    }
}
