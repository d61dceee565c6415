/* groups.c: rank layout and process groups for (R, S, T); see groups.h.
 * Pure arithmetic plus one optional call into the plan model for S = 0. */
#include "workers/parallel/groups.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

/* "1, 2, 4, 8": the divisors of n, for messages. */
static void divisors(int n, char *buf, size_t len) {
    size_t off = 0;
    buf[0] = 0;
    for (int d = 1; d <= n && off + 16 < len; d++)
        if (n % d == 0) off += (size_t)snprintf(buf + off, len - off, "%s%d", off ? ", " : "", d);
}

int groups_rank_of(int S, int T, int replica, int shard, int tp) {
    return (replica * S + shard) * T + tp;
}

const char *group_kind_name(group_kind_t k) {
    switch (k) {
    case GROUP_TP: return "tp";
    case GROUP_SHARD: return "shard";
    case GROUP_REPLICA: return "replica";
    default: return "?";
    }
}

void group_name(const group_t *gr, char *buf, size_t len) {
    snprintf(buf, len, "%s.%d", group_kind_name(gr->kind), gr->id);
}

/* ---- resolution ---- */

int groups_resolve(int world, int S, int T, groups_chooser_fn chooser, void *user,
                   char *err, size_t errlen) {
    char d[160];
    if (world < 1) {
        snprintf(err, errlen, "world size %d is invalid: need at least 1 process", world);
        return -1;
    }
    if (T < 1) {
        snprintf(err, errlen, "--tensor-parallel-degree %d is invalid: use 1 or more (1 = no tensor parallelism)", T);
        return -1;
    }
    if (S < 0) {
        snprintf(err, errlen, "--hybrid-shard-degree %d is invalid: use 0 (largest that fits) or a positive divisor of world / T", S);
        return -1;
    }
    if (world % T != 0) {
        divisors(world, d, sizeof d);
        snprintf(err, errlen, "world size %d is not divisible by --tensor-parallel-degree %d: "
                 "T must divide the world size (choices: %s)", world, T, d);
        return -1;
    }
    int st = world / T;
    if (S == 0) {
        int s = 0;
        if (chooser) {
            char cerr[GROUPS_ERR_LEN] = "";
            s = chooser(user, world, T, cerr, sizeof cerr);
            if (s < 0) {
                snprintf(err, errlen, "--hybrid-shard-degree 0 (largest that fits): %s", cerr);
                return -1;
            }
        }
        if (s == 0) return st;
        S = s;
        if (st % S != 0) {
            divisors(st, d, sizeof d);
            snprintf(err, errlen, "--hybrid-shard-degree 0 chose S = %d, which does not divide "
                     "world / T = %d / %d = %d: give --hybrid-shard-degree explicitly (choices: %s)",
                     S, world, T, st, d);
            return -1;
        }
        return S;
    }
    if (st % S != 0) {
        divisors(st, d, sizeof d);
        snprintf(err, errlen, "world / T = %d / %d = %d is not divisible by --hybrid-shard-degree %d: "
                 "S must divide %d (choices: %s, or 0 for the largest that fits)",
                 world, T, st, S, st, d);
        return -1;
    }
    return S;
}

/* ---- building ---- */

static int group_fill(group_t *gr, group_kind_t kind, int id, int n, int index, int first, int stride) {
    gr->kind = kind;
    gr->id = id;
    gr->n = n;
    gr->index = index;
    gr->ranks = malloc(sizeof(int) * (size_t)n);
    if (!gr->ranks) return -1;
    for (int i = 0; i < n; i++) gr->ranks[i] = first + i * stride;
    return 0;
}

int groups_build(groups_t *g, int world, int rank, int S, int T, groups_chooser_fn chooser,
                 void *user, char *err, size_t errlen) {
    memset(g, 0, sizeof *g);
    S = groups_resolve(world, S, T, chooser, user, err, errlen);
    if (S < 0) return -1;
    if (rank < 0 || rank >= world) {
        snprintf(err, errlen, "rank %d is outside the world of %d processes (ranks 0..%d)",
                 rank, world, world - 1);
        return -1;
    }
    int R = world / (S * T);
    g->world = world;
    g->rank = rank;
    g->R = R, g->S = S, g->T = T;
    g->tp = rank % T;
    g->shard = (rank / T) % S;
    g->replica = rank / (S * T);
    /* TP groups are numbered by (replica, shard), shard groups by
     * (replica, tp), replica groups by (shard, tp). */
    int rc = 0;
    rc |= group_fill(&g->group[GROUP_TP], GROUP_TP, g->replica * S + g->shard, T, g->tp,
                     groups_rank_of(S, T, g->replica, g->shard, 0), 1);
    rc |= group_fill(&g->group[GROUP_SHARD], GROUP_SHARD, g->replica * T + g->tp, S, g->shard,
                     groups_rank_of(S, T, g->replica, 0, g->tp), T);
    rc |= group_fill(&g->group[GROUP_REPLICA], GROUP_REPLICA, g->shard * T + g->tp, R, g->replica,
                     groups_rank_of(S, T, 0, g->shard, g->tp), S * T);
    if (rc) {
        groups_free(g);
        snprintf(err, errlen, "out of memory building the groups of rank %d", rank);
        return -1;
    }
    return 0;
}

void groups_free(groups_t *g) {
    for (int k = 0; k < GROUP_NKINDS; k++) {
        free(g->group[k].ranks);
        g->group[k].ranks = NULL;
    }
}

/* ---- S = 0 through the plan model ---- */

int groups_plan_chooser(void *user, int world, int T, char *err, size_t errlen) {
    const groups_plan_t *p = user;
    if (!p || !p->cfg || !p->cluster.gpu) return 0;
    plan_cluster_t c = p->cluster;
    if (c.nodes * c.gpus_per_node != world) {
        snprintf(err, errlen, "the plan's cluster has %d x %d GPUs but the job has %d ranks",
                 c.nodes, c.gpus_per_node, world);
        return -1;
    }
    return plan_choose_shard_degree(p->cfg, &c, T, &p->params, err, errlen);
}
