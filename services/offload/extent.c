/* extent.c: segregated-fit extent allocator with out-of-band bookkeeping
 * (see extent.h). Sizes are kept in granules internally. */
#include "extent.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define SL_BITS   4
#define SL_COUNT  (1u << SL_BITS)   /* sub-classes per power of two */
#define FL_COUNT  61                /* first-level classes: enough for 2^64 granules */

typedef struct node {
    uint64_t off;            /* start, granules */
    uint64_t len;            /* length, granules */
    uint32_t span;           /* span index */
    bool free;
    struct node *aprev;      /* address neighbours in the same span */
    struct node *anext;
    struct node *lprev;      /* free: class list; used: unused */
    struct node *lnext;      /* free: class list; used: hash chain */
} node_t;

struct ext_alloc {
    uint64_t gshift;                 /* log2(granule) */
    uint64_t fl_map;                 /* bit fl set when some class (fl, *) is non-empty */
    uint32_t sl_map[FL_COUNT];       /* bit sl set when class (fl, sl) is non-empty */
    node_t *cls[FL_COUNT][SL_COUNT]; /* free lists */
    node_t **hash;                   /* used extents by offset */
    uint64_t nhash;                  /* buckets, power of two */
    uint64_t nused, nfree;           /* extents */
    uint64_t used, total;            /* granules */
    uint32_t nspans;
    uint64_t *span_base, *span_len;  /* granules */
};

/* ---- size classes ---- */

static int ilog2(uint64_t x) { return 63 - __builtin_clzll(x); }

/* The class that holds extents of n granules. */
static void class_of(uint64_t n, int *fl, int *sl) {
    if (n < SL_COUNT) { *fl = 0; *sl = (int)n; return; }
    int f = ilog2(n);
    *sl = (int)((n >> (f - SL_BITS)) ^ SL_COUNT);
    *fl = f - SL_BITS + 1;
}

/* The smallest class whose every extent holds n granules; false if none. */
static bool class_for_request(uint64_t n, int *fl, int *sl) {
    if (n >= SL_COUNT) {
        int f = ilog2(n);
        uint64_t round = (1ull << (f - SL_BITS)) - 1;
        if (n + round < n) return false;
        n += round;
    }
    class_of(n, fl, sl);
    return *fl < FL_COUNT;
}

static void list_insert(ext_alloc_t *a, node_t *n) {
    int fl, sl;
    class_of(n->len, &fl, &sl);
    n->lprev = NULL;
    n->lnext = a->cls[fl][sl];
    if (n->lnext) n->lnext->lprev = n;
    a->cls[fl][sl] = n;
    a->fl_map |= 1ull << fl;
    a->sl_map[fl] |= 1u << sl;
    n->free = true;
    a->nfree++;
}

static void list_remove(ext_alloc_t *a, node_t *n) {
    int fl, sl;
    class_of(n->len, &fl, &sl);
    if (n->lprev) n->lprev->lnext = n->lnext;
    else a->cls[fl][sl] = n->lnext;
    if (n->lnext) n->lnext->lprev = n->lprev;
    if (!a->cls[fl][sl]) {
        a->sl_map[fl] &= ~(1u << sl);
        if (!a->sl_map[fl]) a->fl_map &= ~(1ull << fl);
    }
    n->lprev = n->lnext = NULL;
    n->free = false;
    a->nfree--;
}

/* A free extent of at least n granules, or NULL. */
static node_t *find_fit(ext_alloc_t *a, uint64_t n) {
    int fl, sl;
    if (class_for_request(n, &fl, &sl)) {
        uint32_t sm = a->sl_map[fl] & (~0u << sl);
        if (!sm) {
            uint64_t fm = (fl + 1 < 64) ? (a->fl_map & (~0ull << (fl + 1))) : 0;
            if (fm) {
                fl = __builtin_ctzll(fm);
                sm = a->sl_map[fl];
            }
        }
        if (sm) return a->cls[fl][__builtin_ctz(sm)];
    }
    /* No class is guaranteed to fit; an extent in n's own class may still. */
    class_of(n, &fl, &sl);
    if (fl >= FL_COUNT) return NULL;
    for (node_t *c = a->cls[fl][sl]; c; c = c->lnext)
        if (c->len >= n) return c;
    return NULL;
}

/* ---- used-extent hash ---- */

static uint64_t hslot(const ext_alloc_t *a, uint64_t off) {
    return (off * 0x9E3779B97F4A7C15ull) >> 17 & (a->nhash - 1);
}

static int hash_grow(ext_alloc_t *a) {
    uint64_t nn = a->nhash ? a->nhash * 2 : 1024;
    node_t **h = calloc(nn, sizeof *h);
    if (!h) return -ENOMEM;
    node_t **old = a->hash;
    uint64_t on = a->nhash;
    a->hash = h;
    a->nhash = nn;
    for (uint64_t i = 0; i < on; i++) {
        for (node_t *n = old[i], *next; n; n = next) {
            next = n->lnext;
            uint64_t s = hslot(a, n->off);
            n->lnext = h[s];
            h[s] = n;
        }
    }
    free(old);
    return 0;
}

static void hash_put(ext_alloc_t *a, node_t *n) {
    uint64_t s = hslot(a, n->off);
    n->lnext = a->hash[s];
    a->hash[s] = n;
    a->nused++;
}

static node_t *hash_take(ext_alloc_t *a, uint64_t off, bool remove) {
    if (!a->nhash) return NULL;
    node_t **pp = &a->hash[hslot(a, off)];
    for (; *pp; pp = &(*pp)->lnext) {
        if ((*pp)->off == off) {
            node_t *n = *pp;
            if (remove) { *pp = n->lnext; n->lnext = NULL; a->nused--; }
            return n;
        }
    }
    return NULL;
}

/* ---- public ---- */

ext_alloc_t *ext_new(uint64_t granule) {
    if (granule == 0 || (granule & (granule - 1))) return NULL;
    ext_alloc_t *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->gshift = (uint64_t)ilog2(granule);
    if (hash_grow(a)) { free(a); return NULL; }
    return a;
}

void ext_destroy(ext_alloc_t *a) {
    if (!a) return;
    /* Every node is either on a class list or in the hash. */
    for (int fl = 0; fl < FL_COUNT; fl++)
        for (int sl = 0; sl < (int)SL_COUNT; sl++)
            for (node_t *n = a->cls[fl][sl], *next; n; n = next) { next = n->lnext; free(n); }
    for (uint64_t i = 0; i < a->nhash; i++)
        for (node_t *n = a->hash[i], *next; n; n = next) { next = n->lnext; free(n); }
    free(a->hash);
    free(a->span_base);
    free(a->span_len);
    free(a);
}

int ext_add_span(ext_alloc_t *a, uint64_t base, uint64_t len) {
    uint64_t g = 1ull << a->gshift;
    if (len == 0 || (base & (g - 1)) || (len & (g - 1)) || base + len < base) return -EINVAL;
    base >>= a->gshift;
    len >>= a->gshift;
    for (uint32_t i = 0; i < a->nspans; i++)
        if (base < a->span_base[i] + a->span_len[i] && a->span_base[i] < base + len) return -EINVAL;
    uint64_t *nb = realloc(a->span_base, (a->nspans + 1) * sizeof *nb);
    if (!nb) return -ENOMEM;
    a->span_base = nb;
    uint64_t *nl = realloc(a->span_len, (a->nspans + 1) * sizeof *nl);
    if (!nl) return -ENOMEM;
    a->span_len = nl;
    node_t *n = calloc(1, sizeof *n);
    if (!n) return -ENOMEM;
    n->off = base;
    n->len = len;
    n->span = a->nspans;
    a->span_base[a->nspans] = base;
    a->span_len[a->nspans] = len;
    list_insert(a, n);
    a->total += len;
    return (int)a->nspans++;
}

/* Cut [n->off + head, + len) out of the free extent n, leaving the rest free.
 * Returns the used node, or NULL when out of memory (nothing changed). */
static node_t *carve(ext_alloc_t *a, node_t *n, uint64_t head, uint64_t len) {
    uint64_t tail = n->len - head - len;
    node_t *hn = NULL, *tn = NULL;
    if (head && !(hn = calloc(1, sizeof *hn))) return NULL;
    if (tail && !(tn = calloc(1, sizeof *tn))) { free(hn); return NULL; }
    if (a->nused + 1 > a->nhash * 2 && hash_grow(a)) { free(hn); free(tn); return NULL; }
    list_remove(a, n);
    if (hn) {
        *hn = (node_t){ .off = n->off, .len = head, .span = n->span, .aprev = n->aprev, .anext = n };
        if (n->aprev) n->aprev->anext = hn;
        n->aprev = hn;
        list_insert(a, hn);
    }
    if (tn) {
        *tn = (node_t){ .off = n->off + head + len, .len = tail, .span = n->span,
                        .aprev = n, .anext = n->anext };
        if (n->anext) n->anext->aprev = tn;
        n->anext = tn;
        list_insert(a, tn);
    }
    n->off += head;
    n->len = len;
    hash_put(a, n);
    a->used += len;
    return n;
}

int ext_alloc(ext_alloc_t *a, uint64_t len, uint64_t *off) {
    if (len == 0) return -EINVAL;
    uint64_t g = 1ull << a->gshift;
    if (len + g - 1 < len) return -ENOMEM;
    uint64_t n = (len + g - 1) >> a->gshift;
    node_t *f = find_fit(a, n);
    if (!f) return -ENOMEM;
    node_t *u = carve(a, f, 0, n);
    if (!u) return -ENOMEM;
    *off = u->off << a->gshift;
    return 0;
}

int ext_reserve(ext_alloc_t *a, uint64_t off, uint64_t len) {
    uint64_t g = 1ull << a->gshift;
    if (len == 0 || (off & (g - 1)) || (len & (g - 1)) || off + len < off) return -EINVAL;
    off >>= a->gshift;
    len >>= a->gshift;
    uint32_t s;
    for (s = 0; s < a->nspans; s++)
        if (off >= a->span_base[s] && off + len <= a->span_base[s] + a->span_len[s]) break;
    if (s == a->nspans) return -EEXIST;
    /* Find the free extent containing off: walk the class lists (restart
     * path only, so a linear search is fine). */
    for (int fl = 0; fl < FL_COUNT; fl++) {
        if (!(a->fl_map & (1ull << fl))) continue;
        for (int sl = 0; sl < (int)SL_COUNT; sl++)
            for (node_t *n = a->cls[fl][sl]; n; n = n->lnext)
                if (n->span == s && off >= n->off && off + len <= n->off + n->len)
                    return carve(a, n, off - n->off, len) ? 0 : -ENOMEM;
    }
    return -EEXIST;
}

int ext_free(ext_alloc_t *a, uint64_t off, uint64_t *len) {
    uint64_t g = 1ull << a->gshift;
    if (off & (g - 1)) return -EINVAL;
    node_t *n = hash_take(a, off >> a->gshift, true);
    if (!n) return -EINVAL;
    if (len) *len = n->len << a->gshift;
    a->used -= n->len;
    node_t *p = n->aprev, *q = n->anext;
    if (p && p->free) {
        list_remove(a, p);
        p->len += n->len;
        p->anext = q;
        if (q) q->aprev = p;
        free(n);
        n = p;
    }
    if (q && q->free) {
        list_remove(a, q);
        n->len += q->len;
        n->anext = q->anext;
        if (q->anext) q->anext->aprev = n;
        free(q);
    }
    list_insert(a, n);
    return 0;
}

uint64_t ext_used_len(const ext_alloc_t *a, uint64_t off) {
    if (off & ((1ull << a->gshift) - 1)) return 0;
    node_t *n = hash_take((ext_alloc_t *)a, off >> a->gshift, false);
    return n ? n->len << a->gshift : 0;
}

void ext_stats(const ext_alloc_t *a, ext_stats_t *out) {
    memset(out, 0, sizeof *out);
    out->total = a->total << a->gshift;
    out->used = a->used << a->gshift;
    out->free = (a->total - a->used) << a->gshift;
    out->free_extents = a->nfree;
    out->used_extents = a->nused;
    if (a->fl_map) {
        int fl = ilog2(a->fl_map);
        int sl = ilog2(a->sl_map[fl]);
        uint64_t best = 0;
        for (node_t *n = a->cls[fl][sl]; n; n = n->lnext)
            if (n->len > best) best = n->len;
        out->largest_free = best << a->gshift;
    }
}

int ext_check(const ext_alloc_t *a) {
    uint64_t free_g = 0, used_g = 0, nfree = 0, nused = 0;
    /* Class lists agree with bitmaps and sizes. */
    for (int fl = 0; fl < FL_COUNT; fl++) {
        for (int sl = 0; sl < (int)SL_COUNT; sl++) {
            bool bit = (a->sl_map[fl] >> sl) & 1;
            if (bit != (a->cls[fl][sl] != NULL)) return -__LINE__;
            for (node_t *n = a->cls[fl][sl]; n; n = n->lnext) {
                int f, s;
                class_of(n->len, &f, &s);
                if (f != fl || s != sl || !n->free) return -__LINE__;
                if (n->lnext && n->lnext->lprev != n) return -__LINE__;
                free_g += n->len;
                nfree++;
            }
        }
        if (((a->fl_map >> fl) & 1) != (a->sl_map[fl] != 0)) return -__LINE__;
    }
    for (uint64_t i = 0; i < a->nhash; i++)
        for (node_t *n = a->hash[i]; n; n = n->lnext) {
            if (n->free || hslot(a, n->off) != i) return -__LINE__;
            used_g += n->len;
            nused++;
        }
    if (nfree != a->nfree || nused != a->nused) return -__LINE__;
    if (used_g != a->used || free_g + used_g != a->total) return -__LINE__;
    /* Address lists: from every free node walk to the span start, then
     * forward to its end, checking contiguity and no adjacent free pair.
     * Checking per span once: collect span heads via free+used nodes. */
    for (uint32_t s = 0; s < a->nspans; s++) {
        node_t *start = NULL;
        for (int fl = 0; fl < FL_COUNT && !start; fl++)
            for (int sl = 0; sl < (int)SL_COUNT && !start; sl++)
                for (node_t *n = a->cls[fl][sl]; n; n = n->lnext)
                    if (n->span == s) { start = n; break; }
        for (uint64_t i = 0; i < a->nhash && !start; i++)
            for (node_t *n = a->hash[i]; n; n = n->lnext)
                if (n->span == s) { start = n; break; }
        if (!start) return -__LINE__;
        while (start->aprev) start = start->aprev;
        if (start->off != a->span_base[s]) return -__LINE__;
        uint64_t pos = start->off;
        bool prev_free = false;
        for (node_t *n = start; n; n = n->anext) {
            if (n->off != pos || n->span != s || n->len == 0) return -__LINE__;
            if (n->free && prev_free) return -__LINE__;
            if (n->anext && n->anext->aprev != n) return -__LINE__;
            prev_free = n->free;
            pos += n->len;
        }
        if (pos != a->span_base[s] + a->span_len[s]) return -__LINE__;
    }
    return 0;
}
