/* backend_staged.c: the CPU backend with deferred copies and no host
 * access; see backend_staged.h. */
#include "tests/lib/backend_staged.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the queue of copies not yet run ---- */

struct be_xfer {
    uint64_t seq;              /* position in queue order */
    bool done;
};

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    struct be_xfer *h;
} staged_copy_t;

static staged_copy_t *g_q;     /* (g_qn) copies queued, oldest first */
static size_t g_qn, g_qcap;
static uint64_t g_qseq;

static struct be_xfer *staged_xfer(void *dst, const void *src, size_t bytes) {
    struct be_xfer *h = calloc(1, sizeof *h);
    if (h && g_qn == g_qcap) {
        size_t cap = g_qcap ? 2 * g_qcap : 64;
        staged_copy_t *q = realloc(g_q, cap * sizeof *q);
        if (!q) free(h), h = NULL;
        else g_q = q, g_qcap = cap;
    }
    if (!h) {
        fprintf(stderr, "backend staged: out of memory queueing a copy\n");
        abort();
    }
    h->seq = ++g_qseq;
    g_q[g_qn++] = (staged_copy_t){ dst, src, bytes, h };
    return h;
}

/* Run the queued copies up to and including h's. */
static void run_to(const struct be_xfer *h) {
    size_t k = 0;
    while (k < g_qn && g_q[k].h->seq <= h->seq) {
        memcpy(g_q[k].dst, g_q[k].src, g_q[k].bytes);
        g_q[k].h->done = true;
        k++;
    }
    memmove(g_q, g_q + k, (g_qn - k) * sizeof *g_q);
    g_qn -= k;
}

static void staged_order(struct be_xfer *h) { if (h && !h->done) run_to(h); }
static void staged_wait(struct be_xfer *h) {
    if (!h) return;
    if (!h->done) run_to(h);
    free(h);
}
static bool staged_done(struct be_xfer *h) { return !h || h->done; }
static size_t staged_pending(void) { return g_qn; }

/* ---- table ---- */

static backend_t g_staged;

const backend_t *backend_staged(int threads) {
    if (!g_staged.name) {
        g_staged = *backend_cpu(threads);
        g_staged.name = "cpu-staged";
        g_staged.host_memory = false;
        g_staged.xfer_to_host = staged_xfer;
        g_staged.xfer_from_host = staged_xfer;
        g_staged.xfer_order = staged_order;
        g_staged.xfer_wait = staged_wait;
        g_staged.xfer_done = staged_done;
        g_staged.xfer_pending = staged_pending;
    }
    return &g_staged;
}
