/* store.c: keys and barriers of the rendezvous service; see store.h.
 * A chained hash table of keys and a list of barriers under one mutex; a
 * condition variable wakes blocked Wait/Barrier calls on every change. */
#include "services/rendezvous/store.h"
#include "clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBUCKETS 4096
#define MAX_WORLD (1u << 20)

typedef struct entry {
    char *key;
    void *val;
    size_t len;              /* bytes */
    uint64_t version;        /* writes so far */
    struct entry *next;
} entry_t;

typedef struct barrier {
    char *name;
    uint32_t world;          /* ranks of the open round */
    uint64_t completed;      /* rounds completed; the open round is completed + 1 */
    bool *arrived;           /* world entries, for the open round */
    uint32_t n_arrived;
    double first_s;          /* monotonic time of the open round's first arrival */
    uint32_t timeout_ms;     /* of that first arrival */
    bool failed;             /* the open round timed out (sticky) */
    uint64_t acked_round;    /* the latest completed round ranks are being told about */
    uint32_t acked;          /* ranks told that acked_round is done */
    uint32_t fail_told;      /* calls answered with the failure of the open round */
    char msg[512];           /* why */
    struct barrier *next;
} barrier_t;

struct rdzv_store {
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* CLOCK_MONOTONIC */
    entry_t *bucket[NBUCKETS];
    size_t nkeys, max_keys, max_value;
    size_t bytes, max_bytes;  /* held in keys, values and barriers (with their headers) / limit */
    uint32_t max_world;       /* largest barrier */
    barrier_t *barriers;
    int blocked, max_blocked;
    bool shutdown;
    uint64_t barriers_done, barriers_failed;
};

/* ---- helpers ---- */

static uint32_t hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

int rdzv_key_check(const char *key, const char *what, char *err, size_t errlen) {
    size_t n = key ? strlen(key) : 0;
    if (n == 0 || n > 256) {
        snprintf(err, errlen, "%s must be 1..256 bytes (got %zu)", what, n);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)key[i] < 0x21 || (unsigned char)key[i] > 0x7e) {
            snprintf(err, errlen, "%s \"%.64s\" holds a byte 0x%02x at %zu: use printable ASCII "
                     "without spaces", what, key, (unsigned char)key[i], i);
            return -EINVAL;
        }
    return 0;
}

/* Block on the condition variable for up to max_s seconds when the budget
 * allows. Returns false when it may not block (caller answers "not yet"). */
static bool block(rdzv_store_t *s, double max_s) {
    if (max_s <= 0 || s->blocked >= s->max_blocked || s->shutdown) return false;
    struct timespec ts = clock_after(max_s);
    s->blocked++;
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    s->blocked--;
    return true;
}

rdzv_store_t *rdzv_store_new(size_t max_keys, size_t max_value, int max_blocked) {
    rdzv_store_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    clock_cond_init(&s->cv);
    s->max_keys = max_keys;
    s->max_value = max_value;
    s->max_blocked = max_blocked;
    s->max_bytes = SIZE_MAX;
    s->max_world = MAX_WORLD;
    return s;
}

void rdzv_store_limits(rdzv_store_t *s, uint32_t max_world, size_t max_bytes) {
    pthread_mutex_lock(&s->mu);
    if (max_world) s->max_world = max_world < MAX_WORLD ? max_world : MAX_WORLD;
    if (max_bytes) s->max_bytes = max_bytes;
    pthread_mutex_unlock(&s->mu);
}

/* Whether grow more bytes fit under max_bytes (mu held); else err says so. */
static bool fits(rdzv_store_t *s, size_t grow, const char *what, const char *name, char *err, size_t errlen) {
    if (grow <= s->max_bytes && s->bytes <= s->max_bytes - grow) return true;
    snprintf(err, errlen, "%s %.64s needs %zu bytes, but the store holds %zu of its %zu-byte limit: "
             "start the server with a larger --max-bytes, or use fewer or smaller keys and barriers",
             what, name, grow, s->bytes, s->max_bytes);
    return false;
}

void rdzv_store_shutdown(rdzv_store_t *s) {
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void rdzv_store_free(rdzv_store_t *s) {
    if (!s) return;
    for (int i = 0; i < NBUCKETS; i++)
        for (entry_t *e = s->bucket[i], *nx; e; e = nx) {
            nx = e->next;
            free(e->key);
            free(e->val);
            free(e);
        }
    for (barrier_t *b = s->barriers, *nx; b; b = nx) {
        nx = b->next;
        free(b->name);
        free(b->arrived);
        free(b);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* Whether every rank of each barrier's latest completed round has been
 * told so, and every rank that arrived in a failed round has been told of
 * the failure. */
static bool all_told(rdzv_store_t *s) {
    for (barrier_t *b = s->barriers; b; b = b->next) {
        if (b->failed) {
            if (b->fail_told < b->n_arrived) return false; /* arrivals not yet told it failed */
        } else if (b->completed > 0 && (b->acked_round != b->completed || b->acked < b->world)) {
            return false;
        }
    }
    return true;
}

bool rdzv_store_quiesce(rdzv_store_t *s, int max_ms) {
    double end = clock_now_s() + max_ms / 1000.0;
    pthread_mutex_lock(&s->mu);
    bool ok;
    while (!(ok = all_told(s)) && clock_now_s() < end) {
        struct timespec ts;
        ts = clock_after(0.02);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void rdzv_store_stats(rdzv_store_t *s, rdzv_store_stats_t *out) {
    pthread_mutex_lock(&s->mu);
    out->keys = s->nkeys;
    out->barriers_done = s->barriers_done;
    out->barriers_failed = s->barriers_failed;
    pthread_mutex_unlock(&s->mu);
}

/* ---- keys ---- */

static entry_t *find(rdzv_store_t *s, const char *key) {
    for (entry_t *e = s->bucket[hash(key) % NBUCKETS]; e; e = e->next)
        if (!strcmp(e->key, key)) return e;
    return NULL;
}

int rdzv_store_set(rdzv_store_t *s, const char *key, const void *val, size_t len, bool overwrite,
                   uint64_t *version, char *err, size_t errlen) {
    int rc = rdzv_key_check(key, "key", err, errlen);
    if (rc) return rc;
    if (len > s->max_value) {
        snprintf(err, errlen, "value of key %s is %zu bytes, over the limit of %zu: start the server "
                 "with a larger --max-value", key, len, s->max_value);
        return -EMSGSIZE;
    }
    void *copy = malloc(len ? len : 1);
    if (!copy) {
        snprintf(err, errlen, "out of memory storing key %s (%zu bytes)", key, len);
        return -ENOMEM;
    }
    if (len) memcpy(copy, val, len);
    pthread_mutex_lock(&s->mu);
    entry_t *e = find(s, key);
    if (e && !overwrite) {
        pthread_mutex_unlock(&s->mu);
        free(copy);
        snprintf(err, errlen, "key %s already exists (version %llu): set overwrite to replace it",
                 key, (unsigned long long)e->version);
        return -EEXIST;
    }
    size_t grow = e ? (len > e->len ? len - e->len : 0) : sizeof *e + strlen(key) + 1 + len;
    if (!fits(s, grow, "key", key, err, errlen)) {
        pthread_mutex_unlock(&s->mu);
        free(copy);
        return -ENOSPC;
    }
    if (!e) {
        if (s->nkeys >= s->max_keys) {
            pthread_mutex_unlock(&s->mu);
            free(copy);
            snprintf(err, errlen, "the store holds %zu keys, its limit: start the server with a larger "
                     "--max-keys", s->nkeys);
            return -ENOSPC;
        }
        e = calloc(1, sizeof *e);
        char *k = strdup(key);
        if (!e || !k) {
            pthread_mutex_unlock(&s->mu);
            free(e), free(k), free(copy);
            snprintf(err, errlen, "out of memory storing key %s", key);
            return -ENOMEM;
        }
        e->key = k;
        uint32_t h = hash(key) % NBUCKETS;
        e->next = s->bucket[h];
        s->bucket[h] = e;
        s->nkeys++;
        s->bytes += sizeof *e + strlen(key) + 1;
    }
    s->bytes = s->bytes - e->len + len;
    free(e->val);
    e->val = copy;
    e->len = len;
    e->version++;
    if (version) *version = e->version;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int rdzv_store_get(rdzv_store_t *s, const char *key, int max_ms, void **val, size_t *len,
                   uint64_t *version, char *err, size_t errlen) {
    *val = NULL;
    *len = 0;
    int rc = rdzv_key_check(key, "key", err, errlen);
    if (rc) return rc;
    double end = clock_now_s() + max_ms / 1000.0;
    pthread_mutex_lock(&s->mu);
    entry_t *e;
    while (!(e = find(s, key))) {
        if (s->shutdown) {
            pthread_mutex_unlock(&s->mu);
            snprintf(err, errlen, "the rendezvous server is shutting down");
            return -ESHUTDOWN;
        }
        if (!block(s, end - clock_now_s())) {
            pthread_mutex_unlock(&s->mu);
            snprintf(err, errlen, "key %s not set yet", key);
            return -ENOENT;
        }
    }
    void *copy = malloc(e->len ? e->len : 1);
    if (!copy) {
        pthread_mutex_unlock(&s->mu);
        snprintf(err, errlen, "out of memory reading key %s", key);
        return -ENOMEM;
    }
    memcpy(copy, e->val, e->len);
    *val = copy;
    *len = e->len;
    if (version) *version = e->version;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ---- barriers ---- */

static barrier_t *barrier_find(rdzv_store_t *s, const char *name) {
    for (barrier_t *b = s->barriers; b; b = b->next)
        if (!strcmp(b->name, name)) return b;
    return NULL;
}

static barrier_t *barrier_get(rdzv_store_t *s, const char *name) {
    for (barrier_t *b = s->barriers; b; b = b->next)
        if (!strcmp(b->name, name)) return b;
    barrier_t *b = calloc(1, sizeof *b);
    if (!b || !(b->name = strdup(name))) {
        free(b);
        return NULL;
    }
    b->next = s->barriers;
    s->barriers = b;
    return b;
}

/* "3, 5, 7" (the first 32, then "and N more") */
static void format_missing(const barrier_t *b, char *buf, size_t len) {
    size_t off = 0;
    int shown = 0;
    uint32_t total = b->world - b->n_arrived;
    buf[0] = 0;
    for (uint32_t r = 0; r < b->world && off + 24 < len; r++) {
        if (b->arrived[r]) continue;
        if (shown == 32) {
            snprintf(buf + off, len - off, " and %u more", total - 32);
            return;
        }
        off += (size_t)snprintf(buf + off, len - off, "%s%u", shown ? ", " : "", r);
        shown++;
    }
}

static void fill_missing(const barrier_t *b, rdzv_barrier_state_t *out) {
    free(out->missing);
    out->missing = NULL;
    out->n_missing = 0;
    if (b->n_arrived >= b->world) return;
    out->missing = malloc(sizeof(uint32_t) * (b->world - b->n_arrived));
    if (!out->missing) return;
    for (uint32_t r = 0; r < b->world; r++)
        if (!b->arrived[r]) out->missing[out->n_missing++] = r;
}

/* Fail the open round if its deadline has passed. */
static bool check_deadline(rdzv_store_t *s, barrier_t *b, double t) {
    if (b->failed) return true;
    if (b->n_arrived == 0 || t - b->first_s < b->timeout_ms / 1000.0) return false;
    char list[400];
    format_missing(b, list, sizeof list);
    snprintf(b->msg, sizeof b->msg, "barrier %s (round %llu, world %u): rank%s %s did not arrive within "
             "%.1f s of the first arrival: check that %s running and reached this barrier",
             b->name, (unsigned long long)b->completed + 1, b->world,
             b->world - b->n_arrived > 1 ? "s" : "", list, b->timeout_ms / 1000.0,
             b->world - b->n_arrived > 1 ? "they are" : "it is");
    b->failed = true;
    s->barriers_failed++;
    pthread_cond_broadcast(&s->cv);
    return true;
}

int rdzv_store_barrier(rdzv_store_t *s, const char *name, uint32_t rank, uint32_t world,
                       uint32_t timeout_ms, uint64_t round, int max_ms, rdzv_barrier_state_t *out,
                       char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int rc = rdzv_key_check(name, "barrier name", err, errlen);
    if (rc) return rc;
    if (world == 0 || rank >= world) {
        snprintf(err, errlen, "barrier %s: rank %u / world %u out of range: need 0 <= rank < world",
                 name, rank, world);
        return -EINVAL;
    }
    double end = clock_now_s() + max_ms / 1000.0;
    pthread_mutex_lock(&s->mu);
    if (world > s->max_world) {
        uint32_t mw = s->max_world;
        pthread_mutex_unlock(&s->mu);
        snprintf(err, errlen, "barrier %s: world %u is over the limit of %u ranks (a reply naming the "
                 "missing ranks must fit the server's message limit; a larger --max-value raises it)",
                 name, world, mw);
        return -EMSGSIZE;
    }
    barrier_t *b = barrier_find(s, name);
    if (!b) {
        if (!fits(s, sizeof *b + strlen(name) + 1 + world, "barrier", name, err, errlen)) {
            pthread_mutex_unlock(&s->mu);
            return -ENOSPC;
        }
        b = barrier_get(s, name);
        if (!b) {
            pthread_mutex_unlock(&s->mu);
            snprintf(err, errlen, "out of memory for barrier %s", name);
            return -ENOMEM;
        }
        s->bytes += sizeof *b + strlen(name) + 1;
    }
    if (round == 0) { /* arrive */
        if (b->failed) goto failed;
        if (b->n_arrived == 0) {
            if (b->world != world) {
                if (world > b->world && !fits(s, world - b->world, "barrier", name, err, errlen)) {
                    pthread_mutex_unlock(&s->mu);
                    return -ENOSPC;
                }
                bool *a = calloc(world, sizeof(bool));
                if (!a) {
                    pthread_mutex_unlock(&s->mu);
                    snprintf(err, errlen, "out of memory for barrier %s of world %u", name, world);
                    return -ENOMEM;
                }
                free(b->arrived);
                b->arrived = a;
                s->bytes = s->bytes - b->world + world;
                b->world = world;
            }
            b->first_s = clock_now_s();
            b->timeout_ms = timeout_ms;
        } else if (b->world != world) {
            pthread_mutex_unlock(&s->mu);
            snprintf(err, errlen, "barrier %s: rank %u says world %u but the ranks already waiting say %u: "
                     "every rank must pass the same world size", name, rank, world, b->world);
            return -EINVAL;
        }
        if (b->arrived[rank]) {
            pthread_mutex_unlock(&s->mu);
            snprintf(err, errlen, "barrier %s: rank %u arrived twice in round %llu: two processes with "
                     "the same rank?", name, rank, (unsigned long long)b->completed + 1);
            return -EEXIST;
        }
        b->arrived[rank] = true;
        b->n_arrived++;
        round = b->completed + 1;
        if (b->n_arrived == b->world) {
            b->completed++;
            b->n_arrived = 0;
            memset(b->arrived, 0, sizeof(bool) * b->world);
            s->barriers_done++;
            pthread_cond_broadcast(&s->cv);
        }
    }
    for (;;) {
        out->round = round;
        out->generation = b->completed;
        if (b->completed >= round) {
            out->done = true;
            if (round == b->completed) {
                if (b->acked_round != round) b->acked_round = round, b->acked = 0;
                b->acked++;
                pthread_cond_broadcast(&s->cv);
            }
            break;
        }
        if (round > b->completed + 1) {
            pthread_mutex_unlock(&s->mu);
            snprintf(err, errlen, "barrier %s: round %llu has not started (completed: %llu)", name,
                     (unsigned long long)round, (unsigned long long)b->completed);
            return -EINVAL;
        }
        if (check_deadline(s, b, clock_now_s())) goto failed;
        if (s->shutdown) {
            pthread_mutex_unlock(&s->mu);
            snprintf(err, errlen, "the rendezvous server is shutting down");
            return -ESHUTDOWN;
        }
        double left = end - clock_now_s();
        double to_deadline = b->first_s + b->timeout_ms / 1000.0 - clock_now_s() + 0.001;
        if (!block(s, left < to_deadline ? left : to_deadline)) {
            fill_missing(b, out);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
failed:
    snprintf(err, errlen, "%s", b->msg);
    b->fail_told++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return -ETIMEDOUT;
}
