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

int groups_rank_of_cp(int S, int T, int C, int replica, int shard, int cp, int tp) {
    return ((replica * S + shard) * C + cp) * T + tp;
}

int groups_rank_of(int S, int T, int replica, int shard, int tp) {
    return groups_rank_of_cp(S, T, 1, replica, shard, 0, tp);
}

const char *group_kind_name(group_kind_t k) {
    switch (k) {
    case GROUP_TP: return "tp";
    case GROUP_SHARD: return "shard";
    case GROUP_REPLICA: return "replica";
    case GROUP_CP: return "cp";
    default: return "?";
    }
}

void group_name(const group_t *gr, char *buf, size_t len) {
    snprintf(buf, len, "%s.%d", group_kind_name(gr->kind), gr->id);
}

/* ---- resolution ---- */

int groups_resolve(int world, int S, int T, groups_chooser_fn chooser, void *user,
                   char *err, size_t errlen) {
    return groups_resolve_cp(world, S, T, 1, chooser, user, err, errlen);
}

int groups_resolve_cp(int world, int S, int T, int C, groups_chooser_fn chooser, void *user,
                      char *err, size_t errlen) {
    char d[160];
    if (C < 1) {
        snprintf(err, errlen, "--context-parallel-degree %d is invalid: use 1 or more (1 = no context parallelism)", C);
        return -1;
    }
    if (C > 1) {
        /* world and T themselves first: the plain checks name their problem */
        if (world < 1 || T < 1 || world % T != 0) return groups_resolve_cp(world, S, T, 1, chooser, user, err, errlen);
        if ((world / T) % C != 0) {
            divisors(world / T, d, sizeof d);
            snprintf(err, errlen, "world / T = %d / %d = %d is not divisible by --context-parallel-degree %d: "
                     "C must divide world / T (choices: %s)", world, T, world / T, C, d);
            return -1;
        }
        /* S and R divide what is left after T and C: resolve as a world of world / C */
        return groups_resolve_cp(world / C, S, T, 1, chooser, user, err, errlen);
    }
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
    return groups_build_cp(g, world, rank, S, T, 1, chooser, user, err, errlen);
}

int groups_build_cp(groups_t *g, int world, int rank, int S, int T, int C, groups_chooser_fn chooser,
                    void *user, char *err, size_t errlen) {
    memset(g, 0, sizeof *g);
    S = groups_resolve_cp(world, S, T, C, chooser, user, err, errlen);
    if (S < 0) return -1;
    if (rank < 0 || rank >= world) {
        snprintf(err, errlen, "rank %d is outside the world of %d processes (ranks 0..%d)",
                 rank, world, world - 1);
        return -1;
    }
    int R = world / (S * T * C);
    g->world = world;
    g->rank = rank;
    g->R = R, g->S = S, g->T = T, g->C = C;
    g->tp = rank % T;
    g->cp = (rank / T) % C;
    g->shard = (rank / (T * C)) % S;
    g->replica = rank / (S * T * C);
    /* TP groups are numbered by (replica, shard, cp), CP groups by
     * (replica, shard, tp), shard groups by (replica, cp, tp), replica
     * groups by (shard, tp); with C = 1 the numbers are those of (R, S, T). */
    int rc = 0;
    rc |= group_fill(&g->group[GROUP_TP], GROUP_TP, (g->replica * S + g->shard) * C + g->cp, T, g->tp,
                     groups_rank_of_cp(S, T, C, g->replica, g->shard, g->cp, 0), 1);
    rc |= group_fill(&g->group[GROUP_CP], GROUP_CP, (g->replica * S + g->shard) * T + g->tp, C, g->cp,
                     groups_rank_of_cp(S, T, C, g->replica, g->shard, 0, g->tp), T);
    rc |= group_fill(&g->group[GROUP_SHARD], GROUP_SHARD, (g->replica * C + g->cp) * T + g->tp, S, g->shard,
                     groups_rank_of_cp(S, T, C, g->replica, 0, g->cp, g->tp), T * C);
    /* the replica group holds the (replica, cp) pairs of a (shard, tp):
     * not one stride when C > 1, so its ranks are written out */
    rc |= group_fill(&g->group[GROUP_REPLICA], GROUP_REPLICA, g->shard * T + g->tp, R * C, g->replica * C + g->cp,
                     0, 0);
    if (!rc)
        for (int i = 0; i < R * C; i++)
            g->group[GROUP_REPLICA].ranks[i] = groups_rank_of_cp(S, T, C, i / C, g->shard, i % C, g->tp);
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
