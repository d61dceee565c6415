/* gap.h: when a ballastd session's client will send its next request.
 *
 * After answering a request, a session thread that finds its ring empty
 * would sleep, and the client's next request then pays a wakeup of the
 * thread's idle CPU (60-100 us in a virtual machine): a put+get of a
 * 16 MiB blob paid it twice, while the client copied. The thread therefore
 * learns, per class of answer, how long the client took to send its next
 * request, and waits for it in time (ring_wait_data_at: asleep until just
 * before the quickest of the last GAP_HIST gaps, polling until the slowest,
 * at most GAP_POLL_MAX_NS later). The classes are the ops, and a PUT_ALLOC
 * and a GET of GAP_COPY_MIN_KIB or more, whose gap is the client's copy of
 * the blob and is kept per KiB (a 16 MiB copy takes sixteen times a
 * 1 MiB one). A gap the ring's own spin covers (RING_SPIN_MAX_NS) or one
 * beyond GAP_DUE_MAX_NS is not waited for; after GAP_MISSES waits in a row
 * that nothing came to, a class goes without for GAP_OFF answers, so a
 * client without a rhythm costs a short poll now and then, not one per
 * request. Pure functions over gap_class_t, tested in test_gap. */
#ifndef BALLAST_GAP_H
#define BALLAST_GAP_H

#include <stdbool.h>
#include <stdint.h>

#include "ring.h"

#define GAP_HIST         8u
#define GAP_COPY_MIN_KIB 1024u
#define GAP_DUE_MAX_NS   20000000
#define GAP_POLL_MAX_NS  500000
#define GAP_MISSES       4u
#define GAP_OFF          64u

typedef struct {
    uint32_t n;              /* samples taken */
    uint32_t gap[GAP_HIST];  /* the last ones: ns, or ns per KiB */
    uint32_t misses;         /* waits in time in a row that nothing came to */
    uint32_t off;            /* answers of this class left without one, after GAP_MISSES misses */
} gap_class_t;

/* The next request came d_ns after an answer of this class whose unit is
 * scale (1, or the blob's KiB). Gaps beyond twice GAP_DUE_MAX_NS are not
 * kept (the client did something else). */
static inline void gap_record(gap_class_t *g, int64_t d_ns, uint64_t scale) {
    if (d_ns <= 0 || d_ns > 2 * (int64_t)GAP_DUE_MAX_NS || scale == 0) return;
    uint64_t per = (uint64_t)d_ns / scale;
    g->gap[g->n++ % GAP_HIST] = per > UINT32_MAX ? UINT32_MAX : (uint32_t)per;
}

/* The window in which the next request is due, as offsets from the
 * answer: [*from, *to]. false: not known (fewer than 4 samples), soon
 * enough for the ring's spin, too far off, or the class is off (which
 * uses up one of its GAP_OFF answers). */
static inline bool gap_window(gap_class_t *g, uint64_t scale, int64_t *from, int64_t *to) {
    if (g->n < 4) return false;
    if (g->off) { g->off--; return false; }
    uint32_t n = g->n < GAP_HIST ? g->n : GAP_HIST, lo = UINT32_MAX, hi = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (g->gap[i] < lo) lo = g->gap[i];
        if (g->gap[i] > hi) hi = g->gap[i];
    }
    int64_t a = (int64_t)lo * (int64_t)scale, b = (int64_t)hi * (int64_t)scale;
    if (a <= (int64_t)RING_SPIN_MAX_NS || a > GAP_DUE_MAX_NS) return false;
    if (b - a > GAP_POLL_MAX_NS) b = a + GAP_POLL_MAX_NS;
    *from = a;
    *to = b + RING_AT_MARGIN_NS;
    return true;
}

/* A wait in time caught the request (caught) or ran out. */
static inline void gap_waited(gap_class_t *g, bool caught) {
    if (caught) g->misses = 0;
    else if (++g->misses >= GAP_MISSES) { g->misses = 0; g->off = GAP_OFF; }
}

#endif
