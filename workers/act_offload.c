/* act_offload.c: block inputs through ballastd during a micro-step; see
 * act_offload.h. Relies on offload_link.h for the session and model.h for
 * the xs[] buffers. Every copy between backend memory and the pool goes
 * through the backend (to_host into a put region, from_host out of a get
 * region); only the fp32 CPU backend reads a fetched input in place, other
 * backends copy it into one staging buffer in backend memory. */
#include "workers/act_offload.h"

#include <stdlib.h>
#include <string.h>

#include "errbuf.h"

/* Where block input l stands in the current micro-step. */
typedef enum {
    AO_NONE = 0,    /* resident, or not produced yet */
    AO_PUT,         /* committed asynchronously: put_h in flight */
    AO_STORED,      /* in ballastd */
    AO_GETTING,     /* get_h (and maybe pf_h) in flight */
    AO_HELD,        /* its region is pinned and read in place */
    AO_FREEING,     /* free_h in flight */
} ao_state_t;

struct act_offload {
    model_t *m;
    offload_link_t *link;
    int L, K, H;               /* layers, ring slots, horizon */
    size_t bytes;              /* one block input: (N / TP degree) * D * act_bytes */
    act_t **slot;              /* (K) the ring: the model's first K xs buffers */
    uint64_t micro;            /* micro-steps started by this process (the key's step) */
    ao_state_t *st;            /* (L) per block input */
    oc_handle_t *put_h, *get_h, *pf_h, *free_h; /* (L) async handles, 0 = none */
    oc_buf_t *buf;             /* (L) held regions */
    bool in_place;             /* the CPU backend (fp32): a fetched input is read in the pool itself */
    act_t *stage;              /* (bytes) backend memory a fetched input is copied into, when !in_place */
};


static bool offloaded(const act_offload_t *a, int l) { return l >= 0 && l < a->L + 1 - a->K; }

static oc_key_t key_of(const act_offload_t *a, int l) {
    return (oc_key_t){ .rank = a->link->rank, .kind = OC_KIND_ACTIVATION, .index = (uint64_t)l, .step = a->micro };
}

act_offload_t *act_offload_create(model_t *m, offload_link_t *link, int horizon, char *err, size_t errlen) {
    if (horizon < 0) { errbuf_set(err, errlen, "--activation-loading-horizon %d: must be >= 0", horizon); return NULL; }
    act_offload_t *a = calloc(1, sizeof *a);
    if (!a) { errbuf_set(err, errlen, "out of memory"); return NULL; }
    a->m = m;
    a->link = link;
    a->L = m->cfg.n_layers;
    a->H = horizon;
    a->K = horizon + 2 < a->L + 1 ? horizon + 2 : a->L + 1;
    a->bytes = (size_t)m->tp.N * m->cfg.dim * (size_t)m->be->act_bytes; /* this rank's rows (N / TP degree) */
    a->in_place = offload_link_in_place(m->be);
    int L = a->L > 0 ? a->L : 1;
    a->slot = calloc((size_t)a->K, sizeof *a->slot);
    a->st = calloc((size_t)L, sizeof *a->st);
    a->put_h = calloc((size_t)L, sizeof *a->put_h);
    a->get_h = calloc((size_t)L, sizeof *a->get_h);
    a->pf_h = calloc((size_t)L, sizeof *a->pf_h);
    a->free_h = calloc((size_t)L, sizeof *a->free_h);
    a->buf = calloc((size_t)L, sizeof *a->buf);
    if (!a->slot || !a->st || !a->put_h || !a->get_h || !a->pf_h || !a->free_h || !a->buf) {
        act_offload_destroy(a);
        errbuf_set(err, errlen, "out of memory");
        return NULL;
    }
    /* keep the first K buffers as the ring; the others are what memory saves */
    for (int l = 0; l <= a->L; l++) {
        if (l < a->K) a->slot[l] = m->xs[l];
        else if (m->xs[l]) m->be->free(m->xs[l]);
        m->xs[l] = l < a->K ? a->slot[l] : NULL;
    }
    /* after the ring is set up, so that destroy leaves m consistent */
    if (!a->in_place && a->L + 1 > a->K && !(a->stage = m->be->alloc(a->bytes))) {
        act_offload_destroy(a);
        errbuf_set(err, errlen, "out of %s memory for the staging buffer of a block input (%zu bytes)", m->be->name,
                   a->bytes);
        return NULL;
    }
    return a;
}

void act_offload_destroy(act_offload_t *a) {
    if (!a) return;
    if (a->slot && a->st && a->put_h && a->get_h && a->pf_h && a->free_h && a->buf) {
        char e[256];
        act_offload_backward_end(a, e, sizeof e);
        for (int l = 0; l <= a->L; l++) a->m->xs[l] = l < a->K ? a->slot[l] : NULL;
    }
    if (a->stage) a->m->be->free(a->stage);
    free(a->slot);
    free(a->st);
    free(a->put_h);
    free(a->get_h);
    free(a->pf_h);
    free(a->free_h);
    free(a->buf);
    free(a);
}

int act_offload_resident(const act_offload_t *a) { return a->K; }
int act_offload_offloaded(const act_offload_t *a) { return a->L + 1 - a->K; }

/* ---- forward ---- */

int act_offload_forward_begin(act_offload_t *a, char *err, size_t errlen) {
    (void)err, (void)errlen;
    a->micro++;
    for (int l = 0; l <= a->L; l++) a->m->xs[l] = a->slot[l % a->K];
    for (int l = 0; l < a->L; l++) a->st[l] = AO_NONE;
    return 0;
}

static int wait_put(act_offload_t *a, int l, char *err, size_t errlen) {
    if (l < 0 || a->st[l] != AO_PUT) return 0;
    oc_handle_t h = a->put_h[l];
    a->put_h[l] = 0;
    a->st[l] = AO_STORED;
    return offload_link_wait(a->link, h, NULL, "sending a block input to ballastd", err, errlen);
}

int act_offload_produced(act_offload_t *a, int l, char *err, size_t errlen) {
    /* the previous input's commit ran during the block that made this one */
    if (wait_put(a, l - 1, err, errlen)) return -1;
    if (!offloaded(a, l)) return 0;
    oc_key_t k = key_of(a, l);
    oc_buf_t b;
    if (offload_link_put_alloc(a->link, &k, a->bytes, false, &b, err, errlen)) return -1;
    a->m->be->to_host(b.ptr, a->slot[l % a->K], a->bytes);
    if (oc_put_commit_async(a->link->c, &k, &b, &a->put_h[l]) != OC_OK)
        return offload_link_fail(err, errlen, "sending a block input to ballastd");
    offload_link_count(a->link, a->bytes, 0);
    a->st[l] = AO_PUT;
    return 0;
}

/* ---- backward ---- */

/* Ask for input t (get), and for t - 1 a prefetch from NVMe. */
static int request(act_offload_t *a, int t, char *err, size_t errlen) {
    if (!offloaded(a, t) || a->st[t] >= AO_GETTING) return 0;
    if (wait_put(a, t, err, errlen)) return -1;
    oc_key_t k = key_of(a, t);
    if (a->pf_h[t]) {
        oc_handle_t h = a->pf_h[t];
        a->pf_h[t] = 0;
        if (offload_link_wait(a->link, h, NULL, "prefetching a block input", err, errlen)) return -1;
    }
    if (oc_get_async(a->link->c, &k, &a->get_h[t]) != OC_OK)
        return offload_link_fail(err, errlen, "fetching a block input from ballastd");
    a->st[t] = AO_GETTING;
    if (offloaded(a, t - 1) && a->st[t - 1] == AO_STORED && !a->pf_h[t - 1]) {
        oc_key_t kp = key_of(a, t - 1);
        if (oc_prefetch_async(a->link->c, &kp, &a->pf_h[t - 1]) != OC_OK)
            return offload_link_fail(err, errlen, "prefetching a block input");
    }
    return 0;
}

int act_offload_fetch(act_offload_t *a, int l, char *err, size_t errlen) {
    /* everything from l down to l - H is on its way (at the first block
     * this issues H + 1 requests, later one per block) */
    for (int t = l; t >= l - a->H && t >= 0; t--)
        if (request(a, t, err, errlen)) return -1;
    model_t *m = a->m;
    m->xs[l + 1] = a->slot[(l + 1) % a->K]; /* scratch: block l + 1 is done */
    if (!offloaded(a, l)) {
        m->xs[l] = a->slot[l % a->K];
        return 0;
    }
    oc_handle_t h = a->get_h[l];
    a->get_h[l] = 0;
    if (offload_link_wait(a->link, h, &a->buf[l], "fetching a block input from ballastd", err, errlen)) {
        a->st[l] = AO_STORED;
        return -1;
    }
    a->st[l] = AO_HELD;
    if (a->buf[l].len != a->bytes)
        return errbuf_set(err, errlen, "ballastd returned %llu bytes for block input %d, expected %zu",
                          (unsigned long long)a->buf[l].len, l, a->bytes);
    offload_link_count(a->link, 0, a->bytes);
    if (a->in_place) {
        m->xs[l] = (act_t *)a->buf[l].ptr;
    } else {
        /* fetch(l) and release(l) pair up before fetch(l - 1): one buffer */
        m->be->from_host(a->stage, a->buf[l].ptr, a->bytes);
        m->xs[l] = a->stage;
    }
    return 0;
}

int act_offload_release(act_offload_t *a, int l, char *err, size_t errlen) {
    if (!offloaded(a, l) || a->st[l] != AO_HELD) return 0;
    oc_key_t k = key_of(a, l);
    a->st[l] = AO_STORED;
    a->m->xs[l] = a->slot[l % a->K];
    if (oc_get_done(a->link->c, &k, &a->buf[l]) != OC_OK)
        return offload_link_fail(err, errlen, "releasing a block input in ballastd");
    if (oc_free_async(a->link->c, &k, &a->free_h[l]) != OC_OK)
        return offload_link_fail(err, errlen, "freeing a block input in ballastd");
    a->st[l] = AO_FREEING;
    return 0;
}

int act_offload_backward_end(act_offload_t *a, char *err, size_t errlen) {
    int rc = 0;
    char e[256];
    for (int l = 0; l < a->L; l++) {
        oc_key_t k = key_of(a, l);
        /* normally only frees are left; after an error anything can be */
        if (a->pf_h[l]) { oc_wait(a->link->c, a->pf_h[l], NULL, -1); a->pf_h[l] = 0; }
        if (a->st[l] == AO_PUT && wait_put(a, l, e, sizeof e) && !rc) rc = errbuf_set(err, errlen, "%s", e);
        if (a->st[l] == AO_GETTING) {
            oc_status_t st = oc_wait(a->link->c, a->get_h[l], &a->buf[l], -1);
            a->get_h[l] = 0;
            a->st[l] = st == OC_OK ? AO_HELD : AO_STORED;
        }
        if (a->st[l] == AO_HELD) {
            oc_get_done(a->link->c, &k, &a->buf[l]);
            a->st[l] = AO_STORED;
        }
        if (a->st[l] == AO_STORED) {
            oc_free(a->link->c, &k);
            a->st[l] = AO_NONE;
        }
        if (a->st[l] == AO_FREEING) {
            oc_handle_t h = a->free_h[l];
            a->free_h[l] = 0;
            a->st[l] = AO_NONE;
            if (offload_link_wait(a->link, h, NULL, "freeing a block input in ballastd", e, sizeof e) && !rc)
                rc = errbuf_set(err, errlen, "%s", e);
        }
    }
    for (int l = 0; l <= a->L; l++) a->m->xs[l] = a->slot[l % a->K];
    return rc;
}
