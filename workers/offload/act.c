/* act.c: block inputs through ballastd during a micro-step; see act.h.
 * Relies on link.h for everything that reaches ballastd (requests, polls
 * and waits), model.h for the block-input buffers (model_block_input and
 * the functions beside it) and backend.h's asynchronous copies (xfer ops)
 * for every move between backend memory and the pool: a to_host copy into
 * a put region, a from_host copy out of a get region into one of S
 * staging buffers. Only the fp32 CPU backend reads a fetched input in
 * place.
 *
 * Nothing here waits for a copy where it is queued. The host waits
 * (offload_link_xfer_wait) only where it must use the copy's host side:
 * before a put is committed (its region must hold the bytes) and before a
 * get region is handed back (the copy must have read it). Both are lazy:
 * each call first polls (be_xfer_done, offload_link_poll) and finishes
 * what is done; a forced wait happens only when backward requests an
 * input whose copy out has not finished, and at backward end. The device
 * side is ordered with be_xfer_order, no host wait:
 *   - the to_host copy of input j reads ring slot j % K, which block
 *     j + K - 1's forward overwrites (with xs[j + K]): produced(j + K - 1)
 *     orders the compute queued after it behind that copy;
 *   - the from_host copy of input l fills staging buffer l % S, which
 *     block l reads (recompute and backward): fetch(l) orders it.
 * A from_host copy is queued only after the compute that read the buffer
 * last (block l + S's backward: released before), so the xfer contract
 * (a copy runs after every op queued before it) keeps reuse safe.
 *
 * The host blocks only in the link's waits (offload_link_wait,
 * offload_link_xfer_wait), which count the time as exposed offload wait. */
#include "workers/offload/act.h"

#include <stdlib.h>
#include <string.h>

#include "errbuf.h"

/* Where block input l stands in the current micro-step. The order
 * matters: request() skips inputs at AO_GETTING or later. */
typedef enum {
    AO_NONE = 0,    /* resident, or not produced yet */
    AO_COPYING,     /* to_host copy xh into the put region buf queued; not committed */
    AO_PUT,         /* committed asynchronously: put_h in flight */
    AO_STORED,      /* in ballastd */
    AO_GETTING,     /* get_h (and maybe pf_h) in flight */
    AO_HELD,        /* its region buf is pinned; staged: from_host copy xh queued once loaded */
    AO_USED,        /* staged: its block's backward is queued; region held until xh is done */
    AO_FREEING,     /* free_h in flight */
} ao_state_t;

struct act_offload {
    model_t *m;
    const backend_t *be;
    offload_link_t *link;
    int L, K, H;               /* layers, ring slots, horizon */
    int n_off;                 /* inputs offloaded per micro-step: L + 1 - K (they are 0 .. n_off - 1) */
    size_t bytes;              /* one block input: (N / TP degree) * D * act_bytes */
    act_t **slot;              /* (K) the ring: the model's first K block-input buffers */
    uint64_t micro;            /* micro-steps started by this process (the key's step) */
    ao_state_t *st;            /* (L) per block input */
    oc_handle_t *put_h, *get_h, *pf_h, *free_h; /* (L) async handles, 0 = none */
    oc_buf_t *buf;             /* (L) put region (AO_COPYING) or held get region (AO_HELD, AO_USED) */
    be_xfer_t **xh;            /* (L) copy in flight: to_host (AO_COPYING) or from_host (AO_HELD, AO_USED) */
    bool *loaded;              /* (L) staged: the from_host copy of the input is queued */
    bool in_place;             /* the CPU backend (fp32): a fetched input is read in the pool itself */
    int S;                     /* staging buffers: min(H + 1, n_off) when !in_place, else 0 */
    act_t **stage;             /* (S) backend memory, bytes each; input t uses stage[t % S] */
    int *owner;                /* (S) input whose copy fills or whose block reads the buffer, -1 = free */
    int open;                  /* copy handles queued and not yet waited for (0 at backward end) */
    fsdp_act_hooks_t hooks;    /* this saver as fsdp's block-input hooks */
};

static bool offloaded(const act_offload_t *a, int l) { return l >= 0 && l < a->n_off; }

static oc_key_t key_of(const act_offload_t *a, int l) {
    return (oc_key_t){ .rank = a->link->rank, .kind = OC_KIND_ACTIVATION, .index = (uint64_t)l, .step = a->micro };
}

/* End copy *x through the link (which counts a blocking wait); *x = NULL. */
static void xfer_finish(act_offload_t *a, be_xfer_t **x) {
    if (!*x) return;
    a->open--;
    offload_link_xfer_wait(a->link, a->be, x);
}

/* Point block input l at buf (the model's accessor). */
static void set_input(act_offload_t *a, int l, act_t *buf) { model_set_block_input(a->m, l, buf); }

/* Every block input back on its ring slot. */
static void on_ring(act_offload_t *a) {
    for (int l = 0; l <= a->L; l++) set_input(a, l, a->slot[l % a->K]);
}

act_offload_t *act_offload_create(model_t *m, offload_link_t *link, int horizon, char *err, size_t errlen) {
    if (horizon < 0) { errbuf_set(err, errlen, "--activation-loading-horizon %d: must be >= 0", horizon); return NULL; }
    act_offload_t *a = calloc(1, sizeof *a);
    if (!a) { errbuf_set(err, errlen, "out of memory"); return NULL; }
    a->m = m;
    a->be = m->be;
    a->link = link;
    a->L = m->cfg.n_layers;
    a->H = horizon;
    a->K = horizon + 2 < a->L + 1 ? horizon + 2 : a->L + 1;
    a->n_off = a->L + 1 - a->K;
    a->bytes = (size_t)m->tp.N * m->cfg.dim * (size_t)m->be->act_bytes; /* this rank's rows (N / TP degree) */
    a->in_place = offload_link_in_place(m->be);
    a->S = a->in_place ? 0 : (horizon + 1 < a->n_off ? horizon + 1 : a->n_off);
    int L = a->L > 0 ? a->L : 1, S = a->S > 0 ? a->S : 1;
    a->slot = calloc((size_t)a->K, sizeof *a->slot);
    a->st = calloc((size_t)L, sizeof *a->st);
    a->put_h = calloc((size_t)L, sizeof *a->put_h);
    a->get_h = calloc((size_t)L, sizeof *a->get_h);
    a->pf_h = calloc((size_t)L, sizeof *a->pf_h);
    a->free_h = calloc((size_t)L, sizeof *a->free_h);
    a->buf = calloc((size_t)L, sizeof *a->buf);
    a->xh = calloc((size_t)L, sizeof *a->xh);
    a->loaded = calloc((size_t)L, sizeof *a->loaded);
    a->stage = calloc((size_t)S, sizeof *a->stage);
    a->owner = calloc((size_t)S, sizeof *a->owner);
    if (!a->slot || !a->st || !a->put_h || !a->get_h || !a->pf_h || !a->free_h || !a->buf || !a->xh || !a->loaded ||
        !a->stage || !a->owner) {
        act_offload_destroy(a);
        errbuf_set(err, errlen, "out of memory");
        return NULL;
    }
    for (int s = 0; s < S; s++) a->owner[s] = -1;
    /* keep the first K buffers as the ring; the others are what memory saves */
    model_drop_block_inputs(m, a->K);
    for (int l = 0; l < a->K; l++) a->slot[l] = model_block_input(m, l);
    /* after the ring is set up, so that destroy leaves m consistent */
    for (int s = 0; s < a->S; s++)
        if (!(a->stage[s] = m->be->alloc(a->bytes))) {
            int S_want = a->S;
            act_offload_destroy(a);
            errbuf_set(err, errlen, "out of %s memory for the %d staging buffers of block inputs (%zu bytes each; "
                       "a smaller --activation-loading-horizon needs fewer)", m->be->name, S_want, a->bytes);
            return NULL;
        }
    return a;
}

void act_offload_destroy(act_offload_t *a) {
    if (!a) return;
    if (a->slot && a->st && a->put_h && a->get_h && a->pf_h && a->free_h && a->buf && a->xh && a->loaded &&
        a->stage && a->owner) {
        char e[256];
        act_offload_backward_end(a, e, sizeof e);
        model_reset_block_inputs(a->m);   /* the ring's slots, the dropped ones absent */
    }
    if (a->stage)
        for (int s = 0; s < a->S; s++)
            if (a->stage[s]) a->be->free(a->stage[s]);
    free(a->slot);
    free(a->st);
    free(a->put_h);
    free(a->get_h);
    free(a->pf_h);
    free(a->free_h);
    free(a->buf);
    free(a->xh);
    free(a->loaded);
    free(a->stage);
    free(a->owner);
    free(a);
}

int act_offload_resident(const act_offload_t *a) { return a->K; }
int act_offload_offloaded(const act_offload_t *a) { return a->n_off; }
int act_offload_staging(const act_offload_t *a) { return a->S; }

/* ---- forward ---- */

int act_offload_forward_begin(act_offload_t *a, char *err, size_t errlen) {
    (void)err, (void)errlen;
    a->micro++;
    on_ring(a);
    for (int l = 0; l < a->L; l++) a->st[l] = AO_NONE;
    return 0;
}

/* Input l's copy out is done, or must be now: wait for it (no time when it
 * is done) and commit the put. */
static int commit_put(act_offload_t *a, int l, char *err, size_t errlen) {
    xfer_finish(a, &a->xh[l]);
    oc_key_t k = key_of(a, l);
    a->st[l] = AO_NONE; /* on failure the session's close frees the reservation */
    if (offload_link_put_commit_async(a->link, &k, &a->buf[l], &a->put_h[l], "sending a block input to ballastd", err,
                                      errlen))
        return -1;
    memset(&a->buf[l], 0, sizeof a->buf[l]);
    a->st[l] = AO_PUT;
    return 0;
}

/* Wait for input l's commit (blocking, counted as exposed wait). */
static int wait_put(act_offload_t *a, int l, char *err, size_t errlen) {
    if (l < 0 || a->st[l] != AO_PUT) return 0;
    a->st[l] = AO_STORED;
    return offload_link_wait(a->link, &a->put_h[l], NULL, "sending a block input to ballastd", err, errlen);
}

/* Commit every put whose copy out is done; take the commits that completed. */
static int poll_forward(act_offload_t *a, char *err, size_t errlen) {
    for (int l = 0; l < a->n_off; l++) {
        if (a->st[l] == AO_COPYING && be_xfer_done(a->be, a->xh[l]) && commit_put(a, l, err, errlen)) return -1;
        if (a->st[l] == AO_PUT) {
            int r = offload_link_poll(a->link, &a->put_h[l], NULL, "sending a block input to ballastd", err, errlen);
            if (r < 0) { a->st[l] = AO_STORED; return -1; }
            if (r > 0) a->st[l] = AO_STORED;
        }
    }
    return 0;
}

int act_offload_produced(act_offload_t *a, int l, char *err, size_t errlen) {
    if (poll_forward(a, err, errlen)) return -1;
    /* block l's forward (queued after this call) writes xs[l + 1] into
     * slot (l + 1) % K, input j's: it runs after j's copy out */
    int j = l + 1 - a->K;
    if (offloaded(a, j) && a->st[j] == AO_COPYING) be_xfer_order(a->be, a->xh[j]);
    if (!offloaded(a, l)) return 0;
    oc_key_t k = key_of(a, l);
    if (offload_link_put_alloc(a->link, &k, a->bytes, false, &a->buf[l], err, errlen)) return -1;
    a->xh[l] = be_xfer_to_host(a->be, a->buf[l].ptr, a->slot[l % a->K], a->bytes);
    a->open += a->xh[l] != NULL;
    a->st[l] = AO_COPYING;
    offload_link_count(a->link, a->bytes, 0);
    /* a copy that ran at once (CPU backend) is committed at once */
    if (!a->xh[l] && commit_put(a, l, err, errlen)) return -1;
    return 0;
}

/* ---- backward ---- */

/* Input t's get completed with its region in buf[t]. */
static int got(act_offload_t *a, int t, char *err, size_t errlen) {
    a->st[t] = AO_HELD;
    if (a->buf[t].len != a->bytes)
        return errbuf_set(err, errlen, "ballastd returned %llu bytes for block input %d, expected %zu",
                          (unsigned long long)a->buf[t].len, t, a->bytes);
    offload_link_count(a->link, 0, a->bytes);
    return 0;
}

/* Staged: queue input t's copy into its staging buffer if the buffer is
 * free (its last reader's backward is queued). Returns whether queued. */
static bool load(act_offload_t *a, int t) {
    int s = t % a->S;
    if (a->owner[s] >= 0) return false;
    a->owner[s] = t;
    a->xh[t] = be_xfer_from_host(a->be, a->stage[s], a->buf[t].ptr, a->bytes);
    a->open += a->xh[t] != NULL;
    a->loaded[t] = true;
    return true;
}

/* Input t's region is no longer read: hand it back and free the blob. */
static int hand_back(act_offload_t *a, int t, char *err, size_t errlen) {
    oc_key_t k = key_of(a, t);
    a->st[t] = AO_STORED;
    if (offload_link_get_done(a->link, &k, &a->buf[t], "releasing a block input in ballastd", err, errlen) ||
        offload_link_free_async(a->link, &k, &a->free_h[t], "freeing a block input in ballastd", err, errlen))
        return -1;
    a->st[t] = AO_FREEING;
    return 0;
}

/* Staged: input t's block is done and its copy in is finished: hand its
 * region back and free the blob. */
static int unload(act_offload_t *a, int t, char *err, size_t errlen) {
    xfer_finish(a, &a->xh[t]);
    a->loaded[t] = false;
    return hand_back(a, t, err, errlen);
}

/* Take the gets that completed, queue the copies in that can go, hand back
 * the regions whose copy in is done. Never blocks. */
static int poll_backward(act_offload_t *a, char *err, size_t errlen) {
    for (int t = a->n_off - 1; t >= 0; t--) {
        if (a->st[t] == AO_GETTING) {
            int r = offload_link_poll(a->link, &a->get_h[t], &a->buf[t], "fetching a block input from ballastd", err,
                                      errlen);
            if (r < 0) { a->st[t] = AO_STORED; return -1; }
            if (r > 0 && got(a, t, err, errlen)) return -1;
        }
        if (a->st[t] == AO_HELD && !a->in_place && !a->loaded[t]) load(a, t);
        if (a->st[t] == AO_USED && be_xfer_done(a->be, a->xh[t]) && unload(a, t, err, errlen)) return -1;
    }
    return 0;
}

/* Ask for input t (get), and for t - 1 a prefetch from NVMe. */
static int request(act_offload_t *a, int t, char *err, size_t errlen) {
    if (!offloaded(a, t) || a->st[t] >= AO_GETTING) return 0;
    /* normally committed long ago; else the copy out is forced now */
    if (a->st[t] == AO_COPYING && commit_put(a, t, err, errlen)) return -1;
    if (wait_put(a, t, err, errlen)) return -1;
    oc_key_t k = key_of(a, t);
    if (offload_link_wait(a->link, &a->pf_h[t], NULL, "prefetching a block input", err, errlen)) return -1;
    if (offload_link_get_async(a->link, &k, &a->get_h[t], "fetching a block input from ballastd", err, errlen))
        return -1;
    a->st[t] = AO_GETTING;
    if (offloaded(a, t - 1) && a->st[t - 1] == AO_STORED && !a->pf_h[t - 1]) {
        oc_key_t kp = key_of(a, t - 1);
        if (offload_link_prefetch_async(a->link, &kp, &a->pf_h[t - 1], "prefetching a block input", err, errlen))
            return -1;
    }
    return 0;
}

int act_offload_fetch(act_offload_t *a, int l, char *err, size_t errlen) {
    /* everything from l down to l - H is on its way (at the first block
     * this issues H + 1 requests, later one per block) */
    for (int t = l; t >= l - a->H && t >= 0; t--)
        if (request(a, t, err, errlen)) return -1;
    set_input(a, l + 1, a->slot[(l + 1) % a->K]); /* scratch: block l + 1 is done */
    /* commits of copies that finished since the forward, then the gets */
    if (poll_forward(a, err, errlen) || poll_backward(a, err, errlen)) return -1;
    if (!offloaded(a, l)) {
        set_input(a, l, a->slot[l % a->K]);
        return 0;
    }
    if (a->st[l] == AO_GETTING) {
        if (offload_link_wait(a->link, &a->get_h[l], &a->buf[l], "fetching a block input from ballastd", err, errlen)) {
            a->st[l] = AO_STORED;
            return -1;
        }
        if (got(a, l, err, errlen)) return -1;
    }
    if (a->st[l] != AO_HELD)
        return errbuf_set(err, errlen, "block input %d is not held for its backward (state %d)", l, (int)a->st[l]);
    if (a->in_place) {
        set_input(a, l, (act_t *)a->buf[l].ptr);
        return 0;
    }
    if (!a->loaded[l] && !load(a, l))
        return errbuf_set(err, errlen, "staging buffer %d of block input %d is still in use by block input %d",
                          l % a->S, l, a->owner[l % a->S]);
    /* block l's recompute and backward read the staging buffer after the copy */
    be_xfer_order(a->be, a->xh[l]);
    set_input(a, l, a->stage[l % a->S]);
    return 0;
}

int act_offload_release(act_offload_t *a, int l, char *err, size_t errlen) {
    if (!offloaded(a, l) || a->st[l] != AO_HELD) return 0;
    set_input(a, l, a->slot[l % a->K]);
    if (a->in_place) return hand_back(a, l, err, errlen);
    /* block l's backward is queued: a copy queued from now on into its
     * staging buffer runs after it; the region waits for its copy */
    a->st[l] = AO_USED;
    a->owner[l % a->S] = -1;
    return poll_backward(a, err, errlen);
}

int act_offload_backward_end(act_offload_t *a, char *err, size_t errlen) {
    int rc = 0;
    char e[256];
    for (int l = 0; l < a->L; l++) {
        oc_key_t k = key_of(a, l);
        /* normally only frees (and regions whose copy in is not done) are
         * left; after an error anything can be */
        offload_link_wait(a->link, &a->pf_h[l], NULL, "prefetching a block input", NULL, 0);
        if (a->st[l] == AO_COPYING) {
            xfer_finish(a, &a->xh[l]);
            offload_link_put_abort(a->link, &k, &a->buf[l]);
            a->st[l] = AO_NONE;
        }
        if (a->st[l] == AO_PUT && wait_put(a, l, e, sizeof e) && !rc) rc = errbuf_set(err, errlen, "%s", e);
        if (a->st[l] == AO_GETTING)
            a->st[l] = offload_link_wait(a->link, &a->get_h[l], &a->buf[l], "fetching a block input from ballastd",
                                         NULL, 0) == 0 ? AO_HELD : AO_STORED;
        if (a->st[l] == AO_USED && unload(a, l, e, sizeof e) && !rc) rc = errbuf_set(err, errlen, "%s", e);
        if (a->st[l] == AO_HELD || a->st[l] == AO_USED) {
            xfer_finish(a, &a->xh[l]);
            a->loaded[l] = false;
            offload_link_get_done(a->link, &k, &a->buf[l], "releasing a block input in ballastd", NULL, 0);
            a->st[l] = AO_STORED;
        }
        if (a->st[l] == AO_STORED) {
            offload_link_free(a->link, &k, NULL, 0);
            a->st[l] = AO_NONE;
        }
        if (a->st[l] == AO_FREEING) {
            a->st[l] = AO_NONE;
            if (offload_link_wait(a->link, &a->free_h[l], NULL, "freeing a block input in ballastd", e, sizeof e) && !rc)
                rc = errbuf_set(err, errlen, "%s", e);
        }
    }
    for (int s = 0; s < a->S; s++) a->owner[s] = -1;
    on_ring(a);
    /* every copy of this micro-step has been waited for (each handle once);
     * on a backend that counts its queued copies, none may be left */
    if (a->open != 0 && !rc)
        rc = errbuf_set(err, errlen, "activation offload: %d copies never waited for at the end of a micro-step",
                        a->open);
    a->open = 0;
    if (be_xfer_pending(a->be) != 0 && !rc)
        rc = errbuf_set(err, errlen, "activation offload: %zu backend copies still pending at the end of a micro-step",
                        be_xfer_pending(a->be));
    return rc;
}

/* ---- as fsdp's hooks ---- */

static int hk_forward_begin(void *c, char *err, size_t errlen) { return act_offload_forward_begin(c, err, errlen); }
static int hk_produced(void *c, int l, char *err, size_t errlen) { return act_offload_produced(c, l, err, errlen); }
static int hk_fetch(void *c, int l, char *err, size_t errlen) { return act_offload_fetch(c, l, err, errlen); }
static int hk_release(void *c, int l, char *err, size_t errlen) { return act_offload_release(c, l, err, errlen); }
static int hk_backward_end(void *c, char *err, size_t errlen) { return act_offload_backward_end(c, err, errlen); }

const fsdp_act_hooks_t *act_offload_hooks(act_offload_t *a) {
    a->hooks = (fsdp_act_hooks_t){ .ctx = a, .forward_begin = hk_forward_begin, .produced = hk_produced,
                                   .fetch = hk_fetch, .release = hk_release, .backward_end = hk_backward_end };
    return &a->hooks;
}
