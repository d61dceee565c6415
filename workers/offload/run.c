/* run.c: a rank's memory savers from the worker flags; see run.h. Reaches
 * ballastd only through the link (link.h). */
#include "workers/offload/run.h"

#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "log.h"
#include "options.h"

/* Register one pool segment of the job with the backend when it pins host
 * memory (a GPU); called by the client for every segment it maps, the
 * first ones at open and later ones as ballastd adds them. A failure warns
 * once and those copies stay pageable. */
static void register_segment(void *arg, const oc_segment_t *seg) {
    offload_run_t *r = arg;
    if (r->nregs == r->cap_regs) {
        uint32_t nc = r->cap_regs ? r->cap_regs * 2 : 8;
        struct be_pinned **nr = realloc(r->regs, nc * sizeof *nr);
        if (!nr) return;
        r->regs = nr;
        r->cap_regs = nc;
    }
    be_range_t range = { seg->base, (size_t)seg->bytes };
    char e[512];
    struct be_pinned *p = r->be->host_register(&range, 1, e, sizeof e); /* it logs the outcome */
    if (p) r->regs[r->nregs++] = p;
    else if (!r->reg_warned) {
        r->reg_warned = true;
        log_warn("rank %d: registering a ballastd pool segment with the %s backend failed (%s); device<->pool "
                 "copies stay pageable", r->rank, r->be->name, e);
    }
}

static void register_pool(offload_run_t *r, const backend_t *be, int rank) {
    if (!be->host_register || !offload_link_is_shared(&r->link)) return;
    r->be = be;
    r->rank = rank;
    offload_link_on_segment(&r->link, register_segment, r);
}

bool offload_run_opt_durable(const offload_opts_t *o) {
    if (!o->opt_offload) return false;
    return o->opt_durable == 1 || (o->opt_durable == 0 && o->opt_offload == OPT_OFFLOAD_NVME);
}

int offload_run_check(const offload_opts_t *o, char *err, size_t errlen) {
    if (o->resume_from_service && !o->opt_offload)
        return errbuf_set(err, errlen, "--resume-from-service needs --optimizer-offload host|nvme (the state it resumes "
                          "from lives in ballastd only then)");
    if (o->resume_from_service && !offload_run_opt_durable(o))
        return errbuf_set(err, errlen, "--resume-from-service needs durable optimizer state: --optimizer-offload %s keeps "
                          "it in memory only (%s); give --optimizer-offload-durable yes to the run to be resumed and to "
                          "the resume, or resume from a checkpoint with --ckpt-dir and --resume", o->opt_offload == OPT_OFFLOAD_NVME ? "nvme" : "host",
                          o->opt_durable == 2 ? "--optimizer-offload-durable no" : "durability is off by default for host");
    if (o->resume_from_service && o->resume)
        return errbuf_set(err, errlen, "--resume and --resume-from-service both given: pick one (a checkpoint file, or "
                          "the state ballastd holds)");
    if (o->skip_nonfinite && o->opt_offload)
        return errbuf_set(err, errlen, "--skip-nonfinite with --optimizer-offload: the state in ballastd is versioned by "
                          "step and a skipped step has no version yet; drop one of the two");
    if ((o->act_offload || o->opt_offload) && !o->remote && (!o->socket || !*o->socket))
        return errbuf_set(err, errlen, "offload needs ballastd: give --offload-socket PATH or --offload-remote HOST:PORT");
    return 0;
}

int offload_run_open(offload_run_t *r, const offload_opts_t *o, fsdp_t *f, int rank, int world, int64_t *start,
                     char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    if (!o->act_offload && !o->opt_offload) return 0;
    if (offload_run_check(o, err, errlen)) return -1;
    if (offload_link_open(&r->link, o->socket, o->remote, o->job, o->token_file, rank, err, errlen)) return -1;
    r->on = true;
    register_pool(r, f->be, rank);
    if (!offload_link_in_place(f->be))
        log_info("rank %d: offload copies staged through backend memory (%s backend)", rank, f->be->name);
    if (o->act_offload) {
        if (!(r->ao = act_offload_create(f->m, &r->link, (int)o->act_horizon, err, errlen))) return -1;
        f->ao = act_offload_hooks(r->ao);
    }
    if (o->opt_offload) {
        if (!(r->oo = opt_offload_create(f, &r->link, (opt_offload_mode_t)o->opt_offload,
                                          offload_run_opt_durable(o), world, err, errlen))) return -1;
        if (opt_offload_start(r->oo, o->resume_from_service, start, err, errlen)) return -1;
    }
    return 0;
}

void offload_run_describe(const offload_run_t *r, const fsdp_t *f, FILE *out) {
    if (!r->on) return;
    fprintf(out, "offload: ballastd at %s (job %s, %s mode)", r->link.addr, r->link.job,
            offload_link_is_shared(&r->link) ? "shared-memory" : "remote");
    if (r->ao) {
        char b[32];
        const model_t *m = f->m;
        uint64_t one = (uint64_t)m->B * m->T * m->cfg.dim * (uint64_t)m->be->act_bytes;
        format_size(one * (uint64_t)act_offload_offloaded(r->ao), b, sizeof b);
        fprintf(out, "; activations: %d of %d block inputs resident, %d offloaded per micro-step (%s less memory)",
                act_offload_resident(r->ao), m->cfg.n_layers + 1, act_offload_offloaded(r->ao), b);
    }
    if (r->oo) {
        char b[32], st[32];
        bool away = opt_offload_master_away(r->oo);
        format_size((away ? 3 : 2) * f->shard_total * sizeof(float), b, sizeof b);
        format_size(opt_offload_staging_bytes(r->oo), st, sizeof st);
        fprintf(out, "; optimizer: AdamW moments%s in ballastd (%s less memory per rank, %s), streamed per unit",
                away ? " and fp32 master" : "", b,
                opt_offload_durable(r->oo) ? "durable: persistent, written to NVMe behind the steps"
                                           : "not durable: memory only");
        if (opt_offload_staging_bytes(r->oo))
            fprintf(out, " through 2 staging sets in %s memory (%s)", f->be->name, st);
    }
    fprintf(out, "\n");
}

int offload_run_optim_step(offload_run_t *r, fsdp_t *f, int64_t s, double lr, float grad_scale, char *err,
                           size_t errlen) {
    if (r->oo) return opt_offload_step(r->oo, s, lr, grad_scale, err, errlen);
    fsdp_optim_step(f, lr, grad_scale);
    return 0;
}

size_t offload_run_staging_bytes(const offload_run_t *r) { return r->oo ? opt_offload_staging_bytes(r->oo) : 0; }

int offload_run_before_ckpt(offload_run_t *r, char *err, size_t errlen) {
    return r->oo ? opt_offload_load_moments(r->oo, err, errlen) : 0;
}

void offload_run_after_ckpt(offload_run_t *r) {
    if (r->oo) opt_offload_drop_moments(r->oo);
}

int offload_run_summary(offload_run_t *r, fsdp_t *f, int rank, FILE *out, char *err, size_t errlen) {
    double to, from, wait;
    if (fsdp_sum_all(f, (double)r->link.to_service, &to, err, errlen) ||
        fsdp_sum_all(f, (double)r->link.from_service, &from, err, errlen) ||
        fsdp_sum_all(f, r->link.wait_s, &wait, err, errlen))
        return -1;
    if (rank == 0 && r->on) {
        char a[32], b[32];
        format_size((uint64_t)to, a, sizeof a);
        format_size((uint64_t)from, b, sizeof b);
        fprintf(out, "offload: %s to ballastd, %s back (all ranks: %.0f and %.0f bytes); exposed waits %.3f s\n", a, b, to,
                from, wait);
        fflush(out);
    }
    return 0;
}

void offload_run_close(offload_run_t *r, fsdp_t *f) {
    if (r->oo) {
        /* the last step's commits (and, durable, its step record) */
        char e[1024];
        if (opt_offload_finish(r->oo, e, sizeof e))
            log_warn("rank %u: optimizer offload at shutdown: %s", r->link.rank, e);
    }
    if (r->ao) {
        act_offload_destroy(r->ao);
        if (f) f->ao = NULL;
    }
    opt_offload_destroy(r->oo);
    /* before the session unmaps the segments */
    if (r->on && r->be) offload_link_on_segment(&r->link, NULL, NULL);
    for (uint32_t i = 0; i < r->nregs; i++) r->be->host_unregister(r->regs[i]);
    free(r->regs);
    offload_link_close(&r->link);
    memset(r, 0, sizeof *r);
}
