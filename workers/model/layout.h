/* layout.h: the types that describe where a model's tensors lie, shared
 * by the model (model.h) and its tensor-parallel collectives (tp.h): the
 * order of a block's tensors, the tensor table, and a rank's
 * tensor-parallel layout. Types only. */
#ifndef BALLAST_MODEL_LAYOUT_H
#define BALLAST_MODEL_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/backend/backend.h"
#include "workers/comm/comm.h"

/* The tensors of one block, in their order inside the block buffer. */
typedef enum {
    BLK_WQ, BLK_WK, BLK_WV, BLK_WO, BLK_WGATE, BLK_WUP, BLK_WDOWN, BLK_ATTN_NORM, BLK_FFN_NORM,
    BLK_NT
} blk_tensor_t;

#define MODEL_NAME_LEN 96

typedef struct {
    char name[MODEL_NAME_LEN]; /* Hugging Face name, e.g. model.layers.3.mlp.up_proj.weight */
    int ndim;                  /* 1 or 2 */
    int64_t shape[2];          /* (out, in) or (D) */
    size_t offset;             /* floats from the start of params */
    size_t numel;
    int block;                 /* block index, -1 outside blocks */
    bool decay;                /* weight decay applies (2-D tensors) */
    int tp_dim;                /* split across TP ranks: -1 replicated, 0 rows (column-parallel, vocab), 1 columns (row-parallel) */
} model_tensor_t;

/* Tensor-parallel context: the TP group and this rank's local layout. */
typedef struct {
    int size;                  /* T: ranks of the TP group (1 = no tensor parallelism) */
    int rank;                  /* this rank's index in the group, 0..size-1 */
    comm_t *comm;              /* the TP group's communicator; NULL when size == 1 */
    const backend_t *be;       /* the model's backend (tp.c runs its ops) */
    int H, Hkv, F, V;          /* local query heads, kv heads, MLP rows, vocab rows (ceil(vocab / size)) */
    int N;                     /* token rows held between blocks: B*T / size */
    size_t n_params;           /* floats of the TP-local layout */
    size_t embed_off, blocks_off, norm_off, lm_head_off; /* floats, local layout (lm_head_off == embed_off when tied) */
    size_t block_numel;        /* floats per local block */
    size_t blk_off[BLK_NT];    /* offsets inside a local block */
    model_tensor_t *tensors;   /* n_tensors entries, as model_t.tensors but local shapes and offsets */
    act_t *rows;               /* (N/tp, D) scratch: local rows before a gather / after a reduce-scatter; NULL when size == 1 */
    float *lse;                /* (N) log-sum-exp of each row's logits over the whole vocabulary; NULL when size == 1 */
    float *xbuf;               /* (N * (size + 3)) cross-entropy scratch: row max, gathered maxima, sums; NULL when size == 1 */
    comm_hold_t held;          /* collectives the compute stream waits for, collected later (tp_release;
                                  fsdp releases them at the end of each micro-step and step, and
                                  before the communicators are destroyed) */
    int rc;                    /* first collective failure (negative errno), 0 when none */
    char err[COMM_ERR_LEN];    /* its message */
} model_tp_t;

#endif
