/* opt.c: AdamW state in ballastd, streamed unit by unit, with a step
 * record for resuming; see opt.h. Relies on fsdp.h for the chunk layout
 * and the collectives, link.h for everything that reaches ballastd
 * (requests and every wait: the link counts the exposed ones), the
 * backend's asynchronous copies (backend.h, be_xfer_*) for the staged
 * path. Only a backend whose memory is host memory (the fp32 CPU backend)
 * runs AdamW on moments that lie in the pool (in place); every other
 * backend, the CPU's staged test double too, streams each unit's whole blob [ m | v | master ]
 * through two staging sets in backend memory (double buffering, see
 * step_staged), and on a backend whose working copy is separate (bf16 on
 * CUDA) the fp32 master chunks live in ballastd only. */
#include "workers/offload/opt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "log.h"

#define OO_MAGIC "BLSTOPT1"

/* The step record: "step s is complete on this rank" (persistent blob). */
typedef struct {
    char magic[8];         /* OO_MAGIC */
    uint64_t step;         /* the last finished step; its blobs are version `step` */
    uint64_t layout;       /* hash of the chunk layout (units, chunk sizes, S, world) */
    uint64_t shard_total;  /* floats of the rank's chunks */
    int32_t S, sidx;       /* shard degree and index of the writer */
    int32_t world;         /* ranks of the job */
    int32_t n_units;
} oo_record_t;

/* One staging set in backend memory: a unit's blob while AdamW updates it.
 * in and out are copies not yet waited (every handle gets one be_xfer_wait,
 * in retire_stage or abort_step). */
typedef struct {
    float *buf;            /* (3 * maxc) backend memory: [ m | v | master ] of unit `unit`'s chunk */
    int unit;              /* the unit in it, -1 = free */
    be_xfer_t *in;         /* blob (old[unit]) -> buf, or NULL */
    be_xfer_t *out;        /* buf -> new blob (nw[unit]), or NULL */
} oo_stage_t;

struct opt_offload {
    fsdp_t *f;
    offload_link_t *link;
    opt_offload_mode_t mode;
    bool durable;          /* persistent blobs and step records (--optimizer-offload-durable) */
    int world;
    uint64_t layout;       /* oo_record_t.layout of this run */
    int64_t version;       /* newest version fully written (its commits may still run), -1 = none */
    int64_t pending;       /* version whose commits are not collected yet (collect_version), -1 = none */
    int64_t recorded;      /* durable: newest version acknowledged with its step record written, -1 = none */
    int64_t freed_below;   /* versions below this are freed (or never existed) */
    oc_handle_t *get_h;    /* (n_units) reads in flight */
    oc_handle_t *put_h;    /* (n_units) commits in flight (of version `version`, or the one being written) */
    oc_buf_t *old, *nw;    /* (n_units) regions of the version read and the one written */
    oc_key_t *nkey;        /* (n_units) keys of the version written */
    bool *old_held;        /* (n_units) old[u] is a read region not yet released (offload_link_get_done) */
    bool *nw_held;         /* (n_units) nw[u] is reserved and not yet committed */
    bool in_place;         /* the CPU backend (fp32): AdamW runs on the moments in the pool */
    bool master_away;      /* f->master freed: the fp32 master chunks live in the blobs only */
    size_t maxc;           /* floats of the largest unit chunk */
    oo_stage_t stage[2];   /* staging sets, when !in_place: unit u uses stage[u % 2] */
};


/* ---- keys and layout ---- */

static oc_key_t state_key(const opt_offload_t *o, int u, int64_t version) {
    return (oc_key_t){ .rank = o->link->rank, .kind = OC_KIND_OPTIMIZER_STATE, .index = (uint64_t)u,
                       .step = (uint64_t)version };
}

static oc_key_t record_key(const opt_offload_t *o, int slot) {
    return (oc_key_t){ .rank = o->link->rank, .kind = OC_KIND_OTHER, .index = (uint64_t)slot, .step = 0 };
}

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

static uint64_t layout_hash(const fsdp_t *f, int world) {
    uint64_t h = mix(0, (uint64_t)f->S);
    h = mix(h, (uint64_t)world);
    h = mix(h, (uint64_t)f->n_units);
    for (int u = 0; u < f->n_units; u++) h = mix(h, f->numel[u]);
    return h;
}

static size_t blob_bytes(const fsdp_t *f, int u) { return 3 * f->chunk[u] * sizeof(float); }

size_t opt_offload_bytes(const opt_offload_t *o) { return o->f->shard_total * 3 * sizeof(float); }

size_t opt_offload_staging_bytes(const opt_offload_t *o) {
    return o->in_place ? 0 : 2 * 3 * o->maxc * sizeof(float);
}

bool opt_offload_master_away(const opt_offload_t *o) { return o->master_away; }

bool opt_offload_durable(const opt_offload_t *o) { return o->durable; }

/* End copy *x (then NULL) through the link, which counts a blocking wait. */
static void xfer_wait(opt_offload_t *o, be_xfer_t **x) { offload_link_xfer_wait(o->link, o->f->be, x); }

/* ---- life cycle ---- */

opt_offload_t *opt_offload_create(fsdp_t *f, offload_link_t *link, opt_offload_mode_t mode, bool durable, int world,
                                  char *err, size_t errlen) {
    if (mode != OPT_OFFLOAD_HOST && mode != OPT_OFFLOAD_NVME) {
        errbuf_set(err, errlen, "opt_offload_create: mode must be host or nvme");
        return NULL;
    }
    if (mode == OPT_OFFLOAD_HOST && !offload_link_is_shared(link))
        log_warn("--optimizer-offload host: pinning needs shared-memory mode; over --offload-remote the state may spill");
    for (int u = 0; u < f->n_units; u++) {
        if (blob_bytes(f, u) > offload_link_max_blob(link)) {
            errbuf_set(err, errlen, "--optimizer-offload: unit %d needs blobs of %zu bytes but ballastd at %s takes at most "
                       "%llu (raise its --pool-bytes, or shard more with --hybrid-shard-degree)", u, blob_bytes(f, u),
                       offload_link_addr(link), (unsigned long long)offload_link_max_blob(link));
            return NULL;
        }
    }
    opt_offload_t *o = calloc(1, sizeof *o);
    size_t n = (size_t)f->n_units;
    if (!o || !(o->get_h = calloc(n, sizeof *o->get_h)) || !(o->put_h = calloc(n, sizeof *o->put_h)) ||
        !(o->old = calloc(n, sizeof *o->old)) || !(o->nw = calloc(n, sizeof *o->nw)) ||
        !(o->nkey = calloc(n, sizeof *o->nkey)) || !(o->old_held = calloc(n, sizeof *o->old_held)) ||
        !(o->nw_held = calloc(n, sizeof *o->nw_held))) {
        opt_offload_destroy(o);
        errbuf_set(err, errlen, "out of memory");
        return NULL;
    }
    o->f = f;
    o->link = link;
    o->mode = mode;
    o->durable = durable;
    o->world = world;
    o->layout = layout_hash(f, world);
    o->version = -1;
    o->pending = -1;
    o->recorded = -1;
    o->in_place = offload_link_in_place(f->be);
    for (int u = 0; u < f->n_units; u++) if (f->chunk[u] > o->maxc) o->maxc = f->chunk[u];
    for (int i = 0; i < 2; i++) o->stage[i].unit = -1;
    if (!o->in_place && o->maxc) {
        for (int i = 0; i < 2; i++) {
            if (!(o->stage[i].buf = f->be->alloc(3 * o->maxc * sizeof(float)))) {
                opt_offload_destroy(o);
                errbuf_set(err, errlen, "--optimizer-offload: out of %s memory for the two staging sets of one unit's "
                           "moments and master (2 x %zu bytes)", f->be->name, 3 * o->maxc * sizeof(float));
                return NULL;
            }
        }
    }
    return o;
}

void opt_offload_destroy(opt_offload_t *o) {
    if (!o) return;
    for (int i = 0; i < 2; i++) if (o->stage[i].buf) o->f->be->free(o->stage[i].buf);
    free(o->get_h);
    free(o->put_h);
    free(o->old);
    free(o->nw);
    free(o->nkey);
    free(o->old_held);
    free(o->nw_held);
    free(o);
}

/* ---- versions ---- */

void opt_offload_drop_moments(opt_offload_t *o);

/* host pins the current version in the pool (shared-memory mode only). */
static bool pinning(const opt_offload_t *o) { return o->mode == OPT_OFFLOAD_HOST && offload_link_is_shared(o->link); }

static int free_version(opt_offload_t *o, int64_t v, char *err, size_t errlen) {
    if (v < 0) return 0;
    for (int u = 0; u < o->f->n_units; u++) {
        oc_key_t k = state_key(o, u, v);
        if (pinning(o)) offload_link_unpin(o->link, &k); /* may hold none */
        if (offload_link_free(o->link, &k, err, errlen)) return -1;
    }
    return 0;
}

/* Read record slot i; 1 when a valid record of this layout is there, 0 when
 * absent, -1 on an error (a record of another layout is one). */
static int read_record(opt_offload_t *o, int slot, oo_record_t *r, char *err, size_t errlen) {
    oc_key_t k = record_key(o, slot);
    uint64_t len = 0;
    int got = offload_link_get_copy(o->link, &k, r, sizeof *r, &len, "reading the step record", err, errlen);
    if (got <= 0) return got;
    offload_link_count(o->link, 0, len);
    if (len != sizeof *r || memcmp(r->magic, OO_MAGIC, 8))
        return errbuf_set(err, errlen, "rank %u: the step record in ballastd (job blobs of another program or version) "
                          "is not readable; start without --resume-from-service, or pick another --offload-job",
                          o->link->rank);
    if (r->layout != o->layout || r->shard_total != o->f->shard_total || r->S != o->f->S || r->world != o->world)
        return errbuf_set(err, errlen, "rank %u: the state in ballastd was written by a run with %d ranks and "
                          "--hybrid-shard-degree %d (or another model); resume with the same model, world size and "
                          "layout, or start fresh without --resume-from-service", o->link->rank, r->world, r->S);
    return 1;
}

/* Durable only (a no-op otherwise): the record "step s is complete on this
 * rank", in slot s % 2, written synchronously (one small persistent put:
 * acknowledged once on NVMe). */
static int write_record(opt_offload_t *o, int64_t s, char *err, size_t errlen) {
    if (!o->durable) return 0;
    oo_record_t r = { .step = (uint64_t)s, .layout = o->layout, .shard_total = o->f->shard_total, .S = o->f->S,
                      .sidx = o->f->sidx, .world = o->world, .n_units = o->f->n_units };
    memcpy(r.magic, OO_MAGIC, 8);
    oc_key_t k = record_key(o, (int)(s % 2));
    /* the slot holds step s - 2's record, no longer needed: step s - 1's is in the other */
    if (offload_link_free(o->link, &k, err, errlen)) return -1;
    if (offload_link_put(o->link, &k, &r, sizeof r, true, err, errlen)) return -1;
    o->recorded = s;
    return 0;
}

/* host: pin every unit of version v (nothing otherwise). */
static int pin_version(opt_offload_t *o, int64_t v, char *err, size_t errlen) {
    if (!pinning(o)) return 0;
    for (int u = 0; u < o->f->n_units; u++) {
        oc_key_t k = state_key(o, u, v);
        if (offload_link_pin(o->link, &k, "pinning optimizer state in ballastd", err, errlen)) return -1;
    }
    return 0;
}

/* Wait for every commit of the version being written; host: pin it. */
static int finish_version(opt_offload_t *o, int64_t v, char *err, size_t errlen) {
    int rc = 0;
    for (int u = 0; u < o->f->n_units; u++)
        if (offload_link_wait(o->link, &o->put_h[u], NULL, "storing optimizer state in ballastd", err, errlen)) rc = -1;
    if (rc) return rc;
    return pin_version(o, v, err, errlen);
}

/* Not durable: unit u's blob of version v is acknowledged, so its blob of
 * version v - 1 goes at once (host: the new one pinned first). At most one
 * version plus the units in flight stay in ballastd. */
static int unit_replaced(opt_offload_t *o, int64_t v, int u, char *err, size_t errlen) {
    oc_key_t kn = state_key(o, u, v), ko = state_key(o, u, v - 1);
    if (pinning(o)) {
        if (offload_link_pin(o->link, &kn, "pinning optimizer state in ballastd", err, errlen)) return -1;
        offload_link_unpin(o->link, &ko);   /* may hold none */
    }
    return offload_link_free(o->link, &ko, err, errlen);
}

/* Not durable: take the commits of version v that are already acknowledged
 * (offload_link_poll never blocks) and free what they replace. */
static int reap_commits(opt_offload_t *o, int64_t v, char *err, size_t errlen) {
    for (int u = 0; u < o->f->n_units; u++) {
        if (!o->put_h[u]) continue;
        int r = offload_link_poll(o->link, &o->put_h[u], NULL, "storing optimizer state in ballastd", err, errlen);
        if (r < 0) return -1;
        if (r > 0 && unit_replaced(o, v, u, err, errlen)) return -1;
    }
    return 0;
}

/* The lazy end of the version written last (o->pending), at the latest
 * before it is read back (the next step, a checkpoint) or at shutdown:
 * wait for its commits still in flight (they ran behind the forward and
 * backward since; the host's wait counts as exposed offload wait). Durable:
 * they are on NVMe then; pin the version (host) and write its step record.
 * Not durable: free what each commit replaced. `when` says where, for the
 * debug log. Nothing to do when nothing is pending. */
static int collect_version(opt_offload_t *o, const char *when, char *err, size_t errlen) {
    int64_t v = o->pending;
    if (v < 0) return 0;
    if (o->durable) {
        if (finish_version(o, v, err, errlen) || write_record(o, v, err, errlen)) return -1;
    } else {
        for (int u = 0; u < o->f->n_units; u++) {
            if (!o->put_h[u]) continue;
            if (offload_link_wait(o->link, &o->put_h[u], NULL, "storing optimizer state in ballastd", err, errlen) ||
                unit_replaced(o, v, u, err, errlen))
                return -1;
        }
    }
    o->pending = -1;
    log_debug("rank %u: optimizer state of step %lld acknowledged by ballastd%s %s", o->link->rank, (long long)v,
              o->durable ? " (on NVMe), step record written" : ", the previous version freed", when);
    return 0;
}

int opt_offload_finish(opt_offload_t *o, char *err, size_t errlen) {
    return collect_version(o, "at shutdown", err, errlen);
}

/* With a separate working copy (bf16 on CUDA) the fp32 master chunks
 * leave backend memory: every blob holds them, the step stages them. On
 * the CPU backend the master is the working copy and stays. */
static void send_master_away(opt_offload_t *o) {
    fsdp_t *f = o->f;
    if (!f->master || f->wact == (act_t *)f->master) return;
    f->be->free(f->master);
    f->master = NULL;
    o->master_away = true;
}

/* The first version: the moments in f->opt (a checkpoint's), or zeros when
 * fsdp kept none (ocfg.state_elsewhere), and the master from the backend,
 * or from the host copy of the initial chunks (f->init_host) when fsdp
 * kept one; as version f->opt.step. */
static int store_initial(opt_offload_t *o, char *err, size_t errlen) {
    fsdp_t *f = o->f;
    int64_t v0 = f->opt.step;
    for (int u = 0; u < f->n_units; u++) {
        oc_key_t k = state_key(o, u, v0);
        oc_buf_t b;
        size_t c = f->chunk[u], off = f->shard_off[u];
        if (offload_link_put_alloc(o->link, &k, blob_bytes(f, u), o->durable, &b, err, errlen)) return -1;
        if (f->opt.m) {
            f->be->to_host(b.ptr, f->opt.m + off, c * sizeof(float));
            f->be->to_host((float *)b.ptr + c, f->opt.v + off, c * sizeof(float));
        } else {
            memset(b.ptr, 0, 2 * c * sizeof(float));   /* fresh AdamW moments */
        }
        if (f->init_host) memcpy((float *)b.ptr + 2 * c, f->init_host + off, c * sizeof(float));
        else f->be->to_host((float *)b.ptr + 2 * c, f->master + off, c * sizeof(float));
        if (offload_link_put_commit_async(o->link, &k, &b, &o->put_h[u], "storing optimizer state in ballastd", err,
                                          errlen))
            return -1;
        offload_link_count(o->link, blob_bytes(f, u), 0);
    }
    if (finish_version(o, v0, err, errlen) || write_record(o, v0, err, errlen)) return -1;
    o->version = v0;
    o->freed_below = v0;
    send_master_away(o);
    opt_offload_drop_moments(o);   /* they live in ballastd from now on */
    fsdp_drop_init(f);
    return 0;
}

/* ---- start / resume ---- */

int opt_offload_start(opt_offload_t *o, bool resume, int64_t *start, char *err, size_t errlen) {
    fsdp_t *f = o->f;
    oo_record_t r[2];
    int have[2];
    char e[1024];
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        have[i] = read_record(o, i, &r[i], e, sizeof e);
        if (have[i] < 0) { bad = 1; have[i] = 0; }
    }
    if (!resume) {
        /* a fresh run of this job: drop what an earlier one left */
        int rc = 0;
        for (int i = 0; i < 2 && !rc; i++) {
            if (!have[i]) continue;
            /* record r: versions r - 1 and r complete, r + 1 written lazily (complete or partial) */
            for (int64_t v = (int64_t)r[i].step - 1; v <= (int64_t)r[i].step + 1 && !rc; v++)
                rc = free_version(o, v, err, errlen);
        }
        for (int i = 0; i < 2 && !rc; i++) {
            oc_key_t k = record_key(o, i);
            rc = offload_link_free(o->link, &k, err, errlen);
        }
        if (!rc) rc = store_initial(o, err, errlen);
        return rc;
    }
    if (!o->durable)
        return errbuf_set(err, errlen, "--resume-from-service needs durable optimizer state: give "
                          "--optimizer-offload-durable yes (to the run to be resumed as well)");
    /* the last step complete on this rank, then on every rank */
    int64_t best = -1;
    for (int i = 0; i < 2; i++) if (have[i] && (int64_t)r[i].step > best) best = (int64_t)r[i].step;
    double sum_bad, sum_best, sum_none;
    char ce[COMM_ERR_LEN];
    if (fsdp_sum_all(f, bad, &sum_bad, ce, sizeof ce) || fsdp_sum_all(f, (double)best, &sum_best, ce, sizeof ce) ||
        fsdp_sum_all(f, best < 0 ? 1 : 0, &sum_none, ce, sizeof ce))
        return errbuf_set(err, errlen, "%s", ce);
    if (bad) return errbuf_set(err, errlen, "%s", e);
    if (sum_bad > 0) return errbuf_set(err, errlen, "resuming from ballastd failed on another rank (see its message)");
    if (sum_none > 0)
        return errbuf_set(err, errlen, "--resume-from-service: ballastd at %s holds no optimizer state of job '%s' for %s "
                          "(was the run started with --optimizer-offload and the same --offload-job, and does ballastd "
                          "keep the same --spill-dir?)", offload_link_addr(o->link), o->link->job,
                          best < 0 ? "this rank" : "another rank");
    int64_t c = (int64_t)floor(sum_best / o->world);
    double ok = best == c || best == c + 1, sum_ok;
    if (fsdp_sum_all(f, ok, &sum_ok, ce, sizeof ce)) return errbuf_set(err, errlen, "%s", ce);
    if (sum_ok < o->world)
        return errbuf_set(err, errlen, "--resume-from-service: the ranks' last complete steps in ballastd disagree by more "
                          "than one (this rank: %lld, mean %.2f); the state is not consistent, start fresh",
                          (long long)best, sum_best / o->world);
    /* load the master chunk of version c; the moments stay in ballastd
     * (fsdp may have kept no master: one for the load, freed after it) */
    fsdp_drop_init(f);
    if (!f->master && !(f->master = f->be->alloc(f->shard_total * sizeof(float))))
        return errbuf_set(err, errlen, "out of %s memory for the master weights being resumed (%zu bytes)", f->be->name,
                          f->shard_total * sizeof(float));
    for (int u = 0; u < f->n_units; u++) {
        oc_key_t k = state_key(o, u, c);
        oc_buf_t b;
        if (offload_link_get(o->link, &k, &b, "reading optimizer state of the resumed step", err, errlen)) return -1;
        if (b.len != blob_bytes(f, u)) {
            offload_link_get_done(o->link, &k, &b, "releasing optimizer state", NULL, 0);
            return errbuf_set(err, errlen, "optimizer state of unit %d in ballastd has %llu bytes, expected %zu", u,
                              (unsigned long long)b.len, blob_bytes(f, u));
        }
        f->be->from_host(f->master + f->shard_off[u], (float *)b.ptr + 2 * f->chunk[u], f->chunk[u] * sizeof(float));
        offload_link_count(o->link, 0, f->chunk[u] * sizeof(float));
        if (offload_link_get_done(o->link, &k, &b, "releasing optimizer state", err, errlen)) return -1;
    }
    /* versions other than c and c - 1 (partial or stale), and a record of
     * step c + 1 that the other ranks never matched, go */
    if (free_version(o, c + 1, err, errlen) || free_version(o, c + 2, err, errlen) ||
        free_version(o, c - 2, err, errlen))
        return -1;
    for (int i = 0; i < 2; i++) {
        if (have[i] && (int64_t)r[i].step > c) {
            oc_key_t k = record_key(o, i);
            if (offload_link_free(o->link, &k, err, errlen)) return -1;
        }
    }
    if (pin_version(o, c, err, errlen)) return -1;
    if (f->wact != (act_t *)f->master) fsdp_state_changed(f); /* the working copy follows the loaded master */
    o->version = c;
    o->recorded = c;   /* this rank's record of c is in its slot (a newer one was freed above) */
    o->freed_below = c - 1 > 0 ? c - 1 : 0;
    f->opt.step = c;
    *start = c;
    send_master_away(o);
    opt_offload_drop_moments(o);
    return 0;
}

/* ---- the step ---- */

/* AdamW on unit u's segments: gradient local; moments m, v and master p
 * unit-relative (chunk[u] floats each: the pool and f->master on the CPU
 * in place, a staging set otherwise). Same arithmetic as optim_step; the
 * working copy in f->wact receives the result wherever it is not p itself
 * (bf16 on CUDA; f->master == wact when the CPU backend stages). */
static void adamw_unit(fsdp_t *f, int u, float *m, float *v, float *p, float lr, float step_size, float bc2_sqrt,
                       float grad_scale) {
    const optim_config_t *c = &f->opt.cfg;
    size_t lo = f->shard_off[u], hi = lo + f->chunk[u];
    for (int i = 0; i < f->n_segs; i++) {
        const model_tensor_t *t = &f->segs[i];
        if (t->offset < lo || t->offset >= hi) continue;
        size_t off = t->offset, r = off - lo;
        act_t *pa = be_act_at(f->be, f->wact, off);
        f->be->adamw(p + r, f->grad + off, m + r, v + r, t->numel, lr, (float)c->beta1, (float)c->beta2,
                     (float)c->eps, t->decay ? (float)c->weight_decay : 0.f, step_size, bc2_sqrt, grad_scale,
                     (void *)(p + r) != (void *)pa ? pa : NULL);
    }
}

/* Drop whatever of a failed step is still in flight: every copy handle
 * gets its wait, reads are released, reserved blobs aborted. */
static void abort_step(opt_offload_t *o, int64_t s) {
    offload_link_t *l = o->link;
    for (int i = 0; i < 2; i++) {
        xfer_wait(o, &o->stage[i].in);
        xfer_wait(o, &o->stage[i].out);
        o->stage[i] = (oo_stage_t){ .buf = o->stage[i].buf, .unit = -1 };
    }
    for (int u = 0; u < o->f->n_units; u++) {
        oc_key_t ko = state_key(o, u, s - 1), kn = state_key(o, u, s);
        if (o->get_h[u] && offload_link_wait(l, &o->get_h[u], &o->old[u], "reading optimizer state", NULL, 0) == 0)
            offload_link_get_done(l, &ko, &o->old[u], "releasing optimizer state", NULL, 0);
        if (o->old_held[u]) {
            offload_link_get_done(l, &ko, &o->old[u], "releasing optimizer state", NULL, 0);
            o->old_held[u] = false;
        }
        if (o->nw_held[u]) {
            offload_link_put_abort(l, &kn, &o->nw[u]);
            o->nw_held[u] = false;
        }
        offload_link_wait(l, &o->put_h[u], NULL, "storing optimizer state in ballastd", NULL, 0);
    }
}

/* Unit u of step s arrives: wait for its read of version s - 1 (old[u]),
 * start unit u + 1's (the next unit comes while this one updates) and
 * reserve its blob of version s (nw[u]). */
static int receive_unit(opt_offload_t *o, int64_t s, int u, char *err, size_t errlen) {
    fsdp_t *f = o->f;
    if (offload_link_wait(o->link, &o->get_h[u], &o->old[u], "reading optimizer state from ballastd", err, errlen))
        return -1;
    o->old_held[u] = true;
    if (o->old[u].len != blob_bytes(f, u))
        return errbuf_set(err, errlen, "optimizer state of unit %d in ballastd has %llu bytes, expected %zu", u,
                          (unsigned long long)o->old[u].len, blob_bytes(f, u));
    if (u + 1 < f->n_units) {
        oc_key_t kx = state_key(o, u + 1, s - 1);
        if (offload_link_get_async(o->link, &kx, &o->get_h[u + 1], "reading optimizer state", err, errlen)) return -1;
    }
    oc_key_t kn = state_key(o, u, s);
    if (offload_link_put_alloc(o->link, &kn, blob_bytes(f, u), o->durable, &o->nw[u], err, errlen)) return -1;
    o->nw_held[u] = true;
    return 0;
}

/* Unit u is done with: release its read region, commit its new blob. */
static int release_unit(opt_offload_t *o, int64_t s, int u, char *err, size_t errlen) {
    oc_key_t ko = state_key(o, u, s - 1), kn = state_key(o, u, s);
    o->old_held[u] = false;
    if (offload_link_get_done(o->link, &ko, &o->old[u], "releasing optimizer state", err, errlen)) return -1;
    o->nw_held[u] = false;
    if (offload_link_put_commit_async(o->link, &kn, &o->nw[u], &o->put_h[u], "storing optimizer state in ballastd", err,
                                      errlen))
        return -1;
    offload_link_count(o->link, blob_bytes(o->f, u), 0);
    /* not durable: old blobs go as soon as their replacements are acknowledged */
    return o->durable ? 0 : reap_commits(o, s, err, errlen);
}

/* The CPU backend in place: the moments are copied from the old blob into
 * the new one and updated there, the master in f->master (the working
 * copy) and copied after them. */
static int step_in_place(opt_offload_t *o, int64_t s, float lr, float step_size, float bc2_sqrt, float grad_scale,
                         char *err, size_t errlen) {
    fsdp_t *f = o->f;
    for (int u = 0; u < f->n_units; u++) {
        size_t ch = f->chunk[u];
        if (receive_unit(o, s, u, err, errlen)) return -1;
        float *m = o->nw[u].ptr, *v = m + ch;
        memcpy(m, o->old[u].ptr, 2 * ch * sizeof(float));
        adamw_unit(f, u, m, v, f->master + f->shard_off[u], lr, step_size, bc2_sqrt, grad_scale);
        offload_link_count(o->link, 0, 2 * ch * sizeof(float));
        memcpy(v + ch, f->master + f->shard_off[u], ch * sizeof(float));
        if (release_unit(o, s, u, err, errlen)) return -1;
    }
    return 0;
}

/* Queue unit u's blob into staging set st (free). */
static void stage_in(opt_offload_t *o, oo_stage_t *st, int u) {
    st->unit = u;
    st->in = be_xfer_from_host(o->f->be, st->buf, o->old[u].ptr, blob_bytes(o->f, u));
    offload_link_count(o->link, 0, blob_bytes(o->f, u));
}

/* Staging set st's unit is finished on the host side: its copies waited
 * (the host blocks only as long as they still run; counted as exposed
 * wait), then the old region released and the new blob committed; st is
 * free again. Nothing to do for a free set. */
static int retire_stage(opt_offload_t *o, int64_t s, oo_stage_t *st, char *err, size_t errlen) {
    if (st->unit < 0) return 0;
    int u = st->unit;
    xfer_wait(o, &st->in);    /* done long ago (AdamW was ordered after it); ends the handle */
    xfer_wait(o, &st->out);   /* the new blob is written, st may be overwritten */
    st->unit = -1;
    return release_unit(o, s, u, err, errlen);
}

/* Every other backend (and the CPU's staged test double):
 * unit u's blob [ m | v | master ] goes through staging set stage[u % 2]
 * in backend memory, double buffered, with the host blocking on no copy
 * the device has not had a whole unit's time to do:
 *
 *   unit u: order(in u); AdamW on the set (master and moments there, the
 *           working copy in f->wact); out u = set -> nw[u] (queued after
 *           AdamW); then the other set, which held unit u - 1, is
 *           retired: wait out u - 1 (and in u - 1), release old[u - 1],
 *           commit nw[u - 1]; then unit u + 1 arrives from ballastd
 *           (receive_unit: its read waited, u + 2's started, its new blob
 *           reserved) and in u + 1 = old[u + 1] -> that set.
 *   end:    retire unit n - 2, then n - 1.
 *
 * At most two units' read and new regions are held in ballastd's pool
 * (and one read in flight), against one unit's in place: retiring u - 1
 * before u + 1 arrives keeps it so.
 *
 * Why the wait on out u - 1 before in u + 1 into the same set: a copy is
 * queued after the compute queued so far, so in u + 1 cannot overwrite the
 * set before AdamW of u - 1 read it, but it runs on the host-to-device
 * copy stream while out u - 1 runs on the device-to-host one, which
 * nothing orders it after. Two sets and this wait (whose copy has had
 * AdamW u's time and in u's time to run) rather than three sets: the
 * copies, not AdamW, bound the step, and both copy streams stay busy. */
static int step_staged(opt_offload_t *o, int64_t s, float lr, float step_size, float bc2_sqrt, float grad_scale,
                       char *err, size_t errlen) {
    fsdp_t *f = o->f;
    const backend_t *be = f->be;
    int n = f->n_units;
    if (receive_unit(o, s, 0, err, errlen)) return -1;
    stage_in(o, &o->stage[0], 0);
    for (int u = 0; u < n; u++) {
        oo_stage_t *st = &o->stage[u % 2], *nx = &o->stage[(u + 1) % 2];
        size_t ch = f->chunk[u];
        be_xfer_order(be, st->in);   /* AdamW reads the blob's moments and master */
        adamw_unit(f, u, st->buf, st->buf + ch, st->buf + 2 * ch, lr, step_size, bc2_sqrt, grad_scale);
        st->out = be_xfer_to_host(be, o->nw[u].ptr, st->buf, blob_bytes(f, u));
        if (u + 1 < n) {
            if (retire_stage(o, s, nx, err, errlen) || receive_unit(o, s, u + 1, err, errlen)) return -1;
            stage_in(o, nx, u + 1);
        }
    }
    if (n >= 2 && retire_stage(o, s, &o->stage[n % 2], err, errlen)) return -1;
    return retire_stage(o, s, &o->stage[(n - 1) % 2], err, errlen);
}

int opt_offload_step(opt_offload_t *o, int64_t s, double lr, float grad_scale, char *err, size_t errlen) {
    fsdp_t *f = o->f;
    if (o->version != s - 1)
        return errbuf_set(err, errlen, "optimizer offload: step %lld follows version %lld in ballastd", (long long)s,
                          (long long)o->version);
    /* version s - 1's commits ran behind this step's forward and backward;
     * they must be in before it is read back */
    char when[64];
    snprintf(when, sizeof when, "at the start of step %lld", (long long)s);
    if (collect_version(o, when, err, errlen)) return -1;
    if (o->durable) {
        /* version s - 2 may go once every rank's record of s - 1 is on NVMe
         * (a resume then starts at s - 1 or later): this rank's was written
         * just now, the others' before they reach this sum */
        if (o->world > 1) {
            double sum;
            char ce[COMM_ERR_LEN];
            if (fsdp_sum_all(f, (double)o->recorded, &sum, ce, sizeof ce)) return errbuf_set(err, errlen, "%s", ce);
            if (sum != (double)o->world * (double)(s - 1))
                return errbuf_set(err, errlen, "optimizer offload: at step %lld the ranks' step records in ballastd "
                                  "disagree (this rank: %lld, sum over %d ranks %.0f)", (long long)s,
                                  (long long)o->recorded, o->world, sum);
        } else if (o->recorded != s - 1) {
            return errbuf_set(err, errlen, "optimizer offload: step record %lld in ballastd before step %lld",
                              (long long)o->recorded, (long long)s);
        }
        for (int64_t v = o->freed_below; v <= s - 2; v++)
            if (free_version(o, v, err, errlen)) return -1;
    }
    /* (not durable: each unit's version s - 2 went when its s - 1 came) */
    if (s - 1 > o->freed_below) o->freed_below = s - 1;

    f->opt.step++;
    const optim_config_t *cf = &f->opt.cfg;
    double bc1 = 1.0 - pow(cf->beta1, (double)f->opt.step), bc2 = 1.0 - pow(cf->beta2, (double)f->opt.step);
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);

    oc_key_t k0 = state_key(o, 0, s - 1);
    if (offload_link_get_async(o->link, &k0, &o->get_h[0], "reading optimizer state", err, errlen)) return -1;
    int rc = o->in_place ? step_in_place(o, s, (float)lr, step_size, bc2_sqrt, grad_scale, err, errlen)
                         : step_staged(o, s, (float)lr, step_size, bc2_sqrt, grad_scale, err, errlen);
    if (rc) {
        abort_step(o, s);
        return -1;
    }
    /* every copy of the step ran and was waited (a backend that counts its
     * queued copies: a missing wait or order would leave one queued) */
    if (be_xfer_pending(f->be) != 0) {
        errbuf_set(err, errlen, "optimizer offload: %zu backend copies still queued at the end of step %lld (a copy "
                   "without its wait)", be_xfer_pending(f->be), (long long)s);
        abort_step(o, s);
        return -1;
    }
    /* the commits of version s run on behind the next forward and backward
     * (durable: to NVMe); collected at the start of step s + 1, before a
     * checkpoint, or at shutdown (collect_version) */
    o->version = s;
    o->pending = s;
    return o->durable ? 0 : reap_commits(o, s, err, errlen);
}

/* ---- checkpoints ---- */

int opt_offload_load_moments(opt_offload_t *o, char *err, size_t errlen) {
    fsdp_t *f = o->f;
    if (collect_version(o, "before reading it back for a checkpoint", err, errlen)) return -1;
    f->opt.m = f->be->alloc(f->shard_total * sizeof(float));
    f->opt.v = f->be->alloc(f->shard_total * sizeof(float));
    if (o->master_away) f->master = f->be->alloc(f->shard_total * sizeof(float));
    if (!f->opt.m || !f->opt.v || !f->master) {
        opt_offload_drop_moments(o);
        return errbuf_set(err, errlen, "out of %s memory reading the AdamW moments%s back from ballastd (%zu bytes)",
                          f->be->name, o->master_away ? " and master weights" : "",
                          (o->master_away ? 3 : 2) * f->shard_total * sizeof(float));
    }
    /* the master too when staged: it is away on a GPU; on the CPU reading
     * it over the working copy (the same bits) checks the blobs' copy */
    bool master = !o->in_place;
    for (int u = 0; u < f->n_units; u++) {
        oc_key_t k = state_key(o, u, o->version);
        oc_buf_t b;
        size_t ch = f->chunk[u], off = f->shard_off[u];
        if (offload_link_get(o->link, &k, &b, "reading optimizer state for a checkpoint", err, errlen)) {
            opt_offload_drop_moments(o);
            return -1;
        }
        if (b.len != blob_bytes(f, u)) {
            offload_link_get_done(o->link, &k, &b, "releasing optimizer state", NULL, 0);
            opt_offload_drop_moments(o);
            return errbuf_set(err, errlen, "optimizer state of unit %d in ballastd has %llu bytes, expected %zu", u,
                              (unsigned long long)b.len, blob_bytes(f, u));
        }
        f->be->from_host(f->opt.m + off, b.ptr, ch * sizeof(float));
        f->be->from_host(f->opt.v + off, (float *)b.ptr + ch, ch * sizeof(float));
        if (master) f->be->from_host(f->master + off, (float *)b.ptr + 2 * ch, ch * sizeof(float));
        offload_link_count(o->link, 0, (master ? 3 : 2) * ch * sizeof(float));
        offload_link_get_done(o->link, &k, &b, "releasing optimizer state", NULL, 0);
    }
    return 0;
}

void opt_offload_drop_moments(opt_offload_t *o) {
    fsdp_t *f = o->f;
    if (f->opt.m) f->be->free(f->opt.m);
    if (f->opt.v) f->be->free(f->opt.v);
    f->opt.m = f->opt.v = NULL;
    if (o->master_away && f->master) {
        f->be->free(f->master);
        f->master = NULL;
    }
}
