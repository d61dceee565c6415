/* dist.c: a rank's entry into its job; see dist.h. Relies on groups.c for
 * the layout, services/rendezvous for the store and comm.c for the
 * communicators. */
#include "workers/parallel/dist.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define DIST_DEFAULT_RDZV_TIMEOUT_S 300.0

static void teardown(dist_t *d) {
    for (int k = 0; k < GROUP_NKINDS; k++) {
        comm_destroy(d->comm[k]);
        d->comm[k] = NULL;
    }
    rdzv_client_close(d->rdzv);
    d->rdzv = NULL;
    rdzv_server_stop(d->server);
    d->server = NULL;
    groups_free(&d->groups);
}

int dist_init(dist_t *d, const dist_opts_t *o, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    char e[COMM_ERR_LEN];
    if (groups_build(&d->groups, o->world, o->rank, o->S, o->T, o->chooser, o->chooser_user, err, errlen))
        return -EINVAL;
    d->kind = COMM_AUTO;
    if (o->world == 1) return 0; /* every group is this rank alone: nothing to reach */
    int kind = comm_select(o->comm, o->on_gpu, err, errlen);
    if (kind < 0) {
        groups_free(&d->groups);
        return -EINVAL;
    }
    d->kind = (comm_kind_t)kind;
    if (!o->rdzv_addr || !o->rdzv_addr[0]) {
        groups_free(&d->groups);
        snprintf(err, errlen, "no rendezvous address: set --master-addr/--master-port (or MASTER_ADDR, "
                 "MASTER_PORT) or give unix:/path");
        return -EINVAL;
    }
    d->rdzv_timeout_s = o->rdzv_timeout_s > 0 ? o->rdzv_timeout_s : DIST_DEFAULT_RDZV_TIMEOUT_S;
    const char *job = o->job_id ? o->job_id : "";
    int rc = 0;
    if (o->rank == 0 && o->rdzv_serve) {
        /* Like torchrun's store, rank 0 listens on every interface at the
         * rendezvous port: its own host name may not resolve to itself. */
        char any[64];
        const char *listen = o->rdzv_listen;
        const char *colon = strrchr(o->rdzv_addr, ':');
        if (!listen && strncmp(o->rdzv_addr, "unix:", 5) != 0 && colon && colon[1]) {
            snprintf(any, sizeof any, "0.0.0.0:%s", colon + 1);
            listen = any;
        }
        rdzv_server_opts_t so = { .listen = listen ? listen : o->rdzv_addr,
                                  .job_id = job, .world = o->world };
        if (!(d->server = rdzv_server_start(&so, NULL, e, sizeof e))) {
            snprintf(err, errlen, "rank 0 cannot serve the rendezvous store: %s", e);
            rc = -EADDRNOTAVAIL;
            goto fail;
        }
    }
    if (!(d->rdzv = rdzv_client_open(o->rdzv_addr, job, o->world, e, sizeof e))) {
        snprintf(err, errlen, "%s", e);
        rc = -EINVAL;
        goto fail;
    }
    /* every rank must be there before anyone sets up a communicator */
    rc = rdzv_barrier(d->rdzv, "dist/join", o->rank, o->world, d->rdzv_timeout_s, e, sizeof e);
    if (rc) {
        snprintf(err, errlen, "rank %d joining the job (--rdzv-timeout %.1f s): %s", o->rank,
                 d->rdzv_timeout_s, e);
        goto fail;
    }
    /* same order on every rank (TP, shard, replica): no cyclic waits */
    for (int k = 0; k < GROUP_NKINDS; k++) {
        const group_t *g = &d->groups.group[k];
        if (g->n == 1) continue; /* a group of one rank: its collectives are identities */
        char name[32];
        group_name(g, name, sizeof name);
        comm_config_t cfg;
        comm_config_init(&cfg);
        cfg.kind = d->kind;
        cfg.name = name;
        cfg.n = g->n;
        cfg.index = g->index;
        cfg.ranks = g->ranks;
        cfg.rdzv = d->rdzv;
        cfg.timeout_s = o->comm_timeout_s;
        cfg.slot_bytes = o->slot_bytes;
        cfg.device = o->device;
        cfg.compute_stream = o->compute_stream;
        if ((rc = comm_init(&d->comm[k], &cfg, e, sizeof e))) {
            snprintf(err, errlen, "rank %d: %s group: %s", o->rank, group_kind_name((group_kind_t)k), e);
            goto fail;
        }
    }
    return 0;
fail:
    teardown(d);
    return rc ? rc : -EIO;
}

const char *dist_comm_name(const dist_t *d) {
    for (int k = 0; k < GROUP_NKINDS; k++)
        if (d->comm[k]) return comm_backend(d->comm[k]);
    return "none";
}

void dist_abort(dist_t *d) { teardown(d); }

int dist_destroy(dist_t *d, char *err, size_t errlen) {
    int rc = 0;
    for (int k = 0; k < GROUP_NKINDS; k++) {
        comm_destroy(d->comm[k]);
        d->comm[k] = NULL;
    }
    if (d->rdzv) {
        char e[RDZV_ERR_LEN];
        rc = rdzv_barrier(d->rdzv, "dist/leave", d->groups.rank, d->groups.world, d->rdzv_timeout_s, e, sizeof e);
        if (rc) snprintf(err, errlen, "rank %d leaving the job: %s", d->groups.rank, e);
    }
    teardown(d);
    return rc;
}
