/* dist.c: a rank's entry into its job; see dist.h. Relies on groups.c for
 * the layout, services/rendezvous for the store and comm.c for the
 * communicators. */
#include "workers/parallel/dist.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

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

/* The backend of group g: with per_group (--comm auto on the CPU) shm when
 * every member published this rank's node id, gloo otherwise; with --comm
 * shm, members on another node are an error naming them and the fix. Logs
 * the choice. 0 or -errno with a message. */
static int group_backend(dist_t *d, const group_t *g, const dist_opts_t *o, const char *name, bool per_group,
                         comm_kind_t *kind, char *err, size_t errlen) {
    char e[RDZV_ERR_LEN], key[64], mine[256] = "", first_other[256] = "";
    int other = -1, nodes = 1;
    for (int pass = 0; pass < 2; pass++) /* this rank's id first, then the others against it */
        for (int i = 0; i < g->n; i++) {
            if ((pass == 0) != (i == g->index)) continue;
            void *v = NULL;
            size_t len = 0;
            snprintf(key, sizeof key, "dist/node/%d", g->ranks[i]);
            int rc = rdzv_get(d->rdzv, key, &v, &len, d->rdzv_timeout_s, e, sizeof e);
            if (rc) {
                snprintf(err, errlen, "%s group: the node id of rank %d: %s", name, g->ranks[i], e);
                return rc;
            }
            char id[256];
            size_t l = len < sizeof id - 1 ? len : sizeof id - 1;
            memcpy(id, v, l);
            id[l] = 0;
            free(v);
            if (pass == 0) snprintf(mine, sizeof mine, "%s", id);
            else if (strcmp(id, mine) && other < 0) {
                other = g->ranks[i];
                snprintf(first_other, sizeof first_other, "%s", id);
                nodes = 2;
            } else if (strcmp(id, mine) && strcmp(id, first_other)) {
                nodes = 3; /* three or more: enough for messages */
            }
        }
    if (per_group) {
        *kind = other < 0 ? COMM_SHM : COMM_GLOO;
        if (other < 0)
            log_info("rank %d: %s group (%d ranks): shm, every member on this node", o->rank, name, g->n);
        else
            log_info("rank %d: %s group (%d ranks): gloo, members on %s nodes (rank %d on another)", o->rank, name,
                     g->n, nodes == 2 ? "2" : "3 or more", other);
        return 0;
    }
    if (*kind == COMM_SHM && other >= 0) {
        snprintf(err, errlen, "%s group: --comm shm, but rank %d runs on another node or does not share "
                 "--comm-dir %s with this rank (node id here \"%s\", there \"%s\"): shared-memory collectives "
                 "need one kernel and one socket directory; mount the same --comm-dir into every container of "
                 "the node, or use --comm auto (gloo between nodes) or --comm gloo", name, other,
                 o->comm_dir ? o->comm_dir : "/tmp", mine, first_other);
        return -EXDEV;
    }
    return 0;
}

int dist_init(dist_t *d, const dist_opts_t *o, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    char e[COMM_ERR_LEN];
    if (groups_build_cp(&d->groups, o->world, o->rank, o->S, o->T, o->C > 0 ? o->C : 1, o->chooser, o->chooser_user, err, errlen))
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
    /* host collectives: where each rank runs, for the choice per group */
    bool host_comm = d->kind == COMM_SHM || d->kind == COMM_GLOO;
    if (host_comm) {
        char node[256], key[64];
        if ((rc = comm_node_id(o->comm_dir, node, sizeof node, e, sizeof e))) {
            snprintf(err, errlen, "rank %d: %s", o->rank, e);
            goto fail;
        }
        snprintf(key, sizeof key, "dist/node/%d", o->rank);
        if ((rc = rdzv_set(d->rdzv, key, node, strlen(node), true, d->rdzv_timeout_s, e, sizeof e))) {
            snprintf(err, errlen, "rank %d publishing its node id: %s", o->rank, e);
            goto fail;
        }
    }
    /* every rank must be there before anyone sets up a communicator */
    rc = rdzv_barrier(d->rdzv, "dist/join", o->rank, o->world, d->rdzv_timeout_s, e, sizeof e);
    if (rc) {
        snprintf(err, errlen, "rank %d joining the job (--rdzv-timeout %.1f s): %s", o->rank,
                 d->rdzv_timeout_s, e);
        goto fail;
    }
    bool per_group = host_comm && o->comm == COMM_AUTO;
    if (per_group) d->kind = COMM_AUTO;
    if (host_comm) {
        /* every rank decides its groups' backends, then all meet again, so
         * that a rank refusing its layout (--comm shm across nodes) cannot
         * take rank 0's store away before the others have decided too:
         * every rank then names the problem itself */
        int bad = 0;
        char why[COMM_ERR_LEN] = "";
        for (int k = 0; k < GROUP_NKINDS; k++) {
            const group_t *g = &d->groups.group[k];
            d->group_kind[k] = d->kind;
            if (g->n == 1) continue;
            char name[32];
            group_name(g, name, sizeof name);
            int r = group_backend(d, g, o, name, per_group, &d->group_kind[k], why, sizeof why);
            if (r && !bad) {
                bad = r;
                snprintf(err, errlen, "%s", why);
            }
        }
        rc = rdzv_barrier(d->rdzv, "dist/nodes", o->rank, o->world, d->rdzv_timeout_s, e, sizeof e);
        if (bad) {
            rc = bad;
            goto fail;
        }
        if (rc) {
            snprintf(err, errlen, "rank %d comparing nodes (--rdzv-timeout %.1f s): %s", o->rank,
                     d->rdzv_timeout_s, e);
            goto fail;
        }
    }
    /* same order on every rank (TP, shard, replica): no cyclic waits */
    for (int k = 0; k < GROUP_NKINDS; k++) {
        const group_t *g = &d->groups.group[k];
        if (g->n == 1) continue; /* a group of one rank: its collectives are identities */
        char name[32];
        group_name(g, name, sizeof name);
        comm_config_t cfg;
        comm_config_init(&cfg);
        if (!host_comm) d->group_kind[k] = d->kind;
        cfg.kind = d->group_kind[k];
        cfg.name = name;
        cfg.n = g->n;
        cfg.index = g->index;
        cfg.ranks = g->ranks;
        cfg.rdzv = d->rdzv;
        cfg.timeout_s = o->comm_timeout_s;
        cfg.setup_timeout_s = d->rdzv_timeout_s;
        cfg.sock_dir = o->comm_dir;
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
    dist_t *m = (dist_t *)d; /* the name is built once, in the struct */
    m->comm_names[0] = 0;
    size_t off = 0;
    for (int k = 0; k < GROUP_NKINDS; k++) {
        if (!d->comm[k]) continue;
        const char *b = comm_backend(d->comm[k]);
        if (strstr(m->comm_names, b)) continue;
        off += (size_t)snprintf(m->comm_names + off, sizeof m->comm_names - off, "%s%s", off ? "+" : "", b);
        if (off >= sizeof m->comm_names) break;
    }
    return m->comm_names[0] ? m->comm_names : "none";
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
