/* test_groups.c: rank layouts for many (world, S, T, C) checked against a
 * membership predicate written directly from the layout rule (TP innermost,
 * then context parallel, then shard, then replica; the replica group spans
 * replicas and CP ranks); every rank in exactly one group of each kind;
 * S = 0 through a chooser and through the plan model; errors that name the
 * numbers that do not divide. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/parallel/groups.h"

/* Whether ranks a and b share a group of kind k in layout (S, T, C):
 * same (replica, shard, cp) for TP; same (replica, shard, tp) for CP; same
 * (replica, cp, tp) for shard; same (shard, tp) for replica. */
static int same_group(group_kind_t k, int S, int T, int C, int a, int b) {
    int ta = a % T, tb = b % T;
    int ca = (a / T) % C, cb = (b / T) % C;
    int sa = (a / (T * C)) % S, sb = (b / (T * C)) % S;
    int ra = a / (S * T * C), rb = b / (S * T * C);
    switch (k) {
    case GROUP_TP: return ra == rb && sa == sb && ca == cb;
    case GROUP_CP: return ra == rb && sa == sb && ta == tb;
    case GROUP_SHARD: return ra == rb && ca == cb && ta == tb;
    default: return sa == sb && ta == tb;
    }
}

static void check_layout_cp(int world, int S, int T, int C) {
    char err[GROUPS_ERR_LEN];
    int R = world / (S * T * C);
    groups_t *all = calloc((size_t)world, sizeof *all);
    cr_assert_not_null(all);
    for (int r = 0; r < world; r++) {
        cr_assert_eq(groups_build_cp(&all[r], world, r, S, T, C, NULL, NULL, err, sizeof err), 0,
                     "(world %d, S %d, T %d, C %d) rank %d: %s", world, S, T, C, r, err);
        groups_t *g = &all[r];
        cr_assert_eq(g->R, R);
        cr_assert_eq(g->C, C);
        cr_assert_eq(groups_rank_of_cp(S, T, C, g->replica, g->shard, g->cp, g->tp), r);
        if (C == 1) cr_assert_eq(groups_rank_of(S, T, g->replica, g->shard, g->tp), r);
        int want_n[GROUP_NKINDS] = { [GROUP_TP] = T, [GROUP_SHARD] = S, [GROUP_REPLICA] = R * C, [GROUP_CP] = C };
        for (int k = 0; k < GROUP_NKINDS; k++) {
            group_t *gr = &g->group[k];
            cr_assert_eq(gr->n, want_n[k], "(%d,%d,%d) rank %d %s n %d", world, S, T, r,
                         group_kind_name(k), gr->n);
            cr_assert_eq(gr->ranks[gr->index], r, "rank %d not at its index in its %s group", r,
                         group_kind_name(k));
            /* the group is exactly the set of ranks the predicate accepts, ascending */
            int pos = 0;
            for (int j = 0; j < world; j++) {
                if (!same_group(k, S, T, C, r, j)) continue;
                cr_assert_lt(pos, gr->n);
                cr_assert_eq(gr->ranks[pos], j, "(%d,%d,%d) rank %d %s group[%d] = %d, want %d",
                             world, S, T, r, group_kind_name(k), pos, gr->ranks[pos], j);
                pos++;
            }
            cr_assert_eq(pos, gr->n);
            cr_assert(gr->id >= 0 && gr->id < world / gr->n);
        }
    }
    /* every rank in exactly one group of each kind: groups with the same id
     * are identical, different ids are disjoint, and the ids cover all groups */
    for (int k = 0; k < GROUP_NKINDS; k++) {
        int ngroups = world / all[0].group[k].n;
        int *seen = calloc((size_t)world, sizeof(int));
        int *ids = calloc((size_t)ngroups, sizeof(int));
        for (int r = 0; r < world; r++) {
            group_t *gr = &all[r].group[k];
            ids[gr->id]++;
            for (int i = 0; i < gr->n; i++) {
                group_t *other = &all[gr->ranks[i]].group[k];
                cr_assert_eq(other->id, gr->id, "ranks %d and %d share a %s group but have ids %d, %d",
                             r, gr->ranks[i], group_kind_name(k), gr->id, other->id);
                cr_assert_eq(memcmp(other->ranks, gr->ranks, sizeof(int) * (size_t)gr->n), 0);
            }
            seen[r]++;
        }
        for (int i = 0; i < ngroups; i++)
            cr_assert_eq(ids[i], all[0].group[k].n, "%s group %d has %d members", group_kind_name(k), i, ids[i]);
        for (int r = 0; r < world; r++) cr_assert_eq(seen[r], 1);
        free(seen);
        free(ids);
    }
    for (int r = 0; r < world; r++) groups_free(&all[r]);
    free(all);
}

static void check_layout(int world, int S, int T) { check_layout_cp(world, S, T, 1); }

Test(groups, context_parallel_layouts_up_to_32_ranks) {
    int n = 0;
    for (int world = 2; world <= 32; world++)
        for (int T = 1; T <= world; T++)
            for (int C = 2; C <= world / T; C++) {
                if (world % (T * C)) continue;
                for (int S = 1; S <= world / (T * C); S++) {
                    if ((world / (T * C)) % S) continue;
                    check_layout_cp(world, S, T, C);
                    n++;
                }
            }
    cr_assert_gt(n, 100, "only %d layouts checked", n);
    /* (R 2, S 1, T 2, C 2): rank 5 = (replica 1, cp 0, tp 1); its replica group
     * holds the (replica, cp) pairs of tp 1: ranks 1, 3, 5, 7 */
    groups_t g;
    char err[GROUPS_ERR_LEN];
    cr_assert_eq(groups_build_cp(&g, 8, 5, 1, 2, 2, NULL, NULL, err, sizeof err), 0, "%s", err);
    int want_rep[] = { 1, 3, 5, 7 }, want_cp[] = { 5, 7 };
    cr_assert_eq(g.group[GROUP_REPLICA].n, 4);
    cr_assert_eq(g.group[GROUP_REPLICA].index, 2);
    cr_assert_eq(memcmp(g.group[GROUP_REPLICA].ranks, want_rep, sizeof want_rep), 0);
    cr_assert_eq(memcmp(g.group[GROUP_CP].ranks, want_cp, sizeof want_cp), 0);
    groups_free(&g);
    /* C that does not divide world / T is named with the choices */
    cr_assert_eq(groups_build_cp(&g, 8, 0, 1, 2, 3, NULL, NULL, err, sizeof err), -1);
    cr_assert(strstr(err, "not divisible by --context-parallel-degree 3") && strstr(err, "choices: 1, 2, 4"), "%s", err);
    cr_assert_eq(groups_build_cp(&g, 8, 0, 1, 1, 0, NULL, NULL, err, sizeof err), -1);
    cr_assert(strstr(err, "--context-parallel-degree 0 is invalid"), "%s", err);
}

Test(groups, every_layout_up_to_64_ranks) {
    int n = 0;
    for (int world = 1; world <= 64; world++)
        for (int T = 1; T <= world; T++) {
            if (world % T) continue;
            for (int S = 1; S <= world / T; S++) {
                if ((world / T) % S) continue;
                check_layout(world, S, T);
                n++;
            }
        }
    cr_assert_gt(n, 500, "only %d layouts checked", n);
}

Test(groups, worked_example_matches_the_docs) {
    /* world 8, S 2, T 2, R 2: rank 5 = (replica 1, shard 0, tp 1) */
    groups_t g;
    char err[GROUPS_ERR_LEN];
    cr_assert_eq(groups_build(&g, 8, 5, 2, 2, NULL, NULL, err, sizeof err), 0, "%s", err);
    cr_expect_eq(g.replica, 1);
    cr_expect_eq(g.shard, 0);
    cr_expect_eq(g.tp, 1);
    int tp[] = { 4, 5 }, shard[] = { 5, 7 }, rep[] = { 1, 5 };
    cr_expect_arr_eq(g.group[GROUP_TP].ranks, tp, sizeof tp);
    cr_expect_arr_eq(g.group[GROUP_SHARD].ranks, shard, sizeof shard);
    cr_expect_arr_eq(g.group[GROUP_REPLICA].ranks, rep, sizeof rep);
    char name[32];
    group_name(&g.group[GROUP_SHARD], name, sizeof name);
    cr_expect_str_eq(name, "shard.3");
    groups_free(&g);
}

/* ---- S = 0 ---- */

static int choose_fixed(void *user, int world, int T, char *err, size_t errlen) {
    (void)world, (void)T;
    int v = *(int *)user;
    if (v < 0) snprintf(err, errlen, "nothing fits");
    return v;
}

Test(groups, shard_degree_zero) {
    char err[GROUPS_ERR_LEN];
    /* no chooser, or no memory figure: full sharding */
    cr_expect_eq(groups_resolve(16, 0, 2, NULL, NULL, err, sizeof err), 8);
    int zero = 0, four = 4, three = 3, fail = -1;
    cr_expect_eq(groups_resolve(16, 0, 2, choose_fixed, &zero, err, sizeof err), 8);
    cr_expect_eq(groups_resolve(16, 0, 2, choose_fixed, &four, err, sizeof err), 4);
    cr_expect_eq(groups_resolve(16, 0, 2, choose_fixed, &three, err, sizeof err), -1);
    cr_expect(strstr(err, "S = 3") && strstr(err, "8"), "%s", err);
    cr_expect_eq(groups_resolve(16, 0, 2, choose_fixed, &fail, err, sizeof err), -1);
    cr_expect(strstr(err, "nothing fits"), "%s", err);
    /* the CPU backend has no memory figure */
    groups_plan_t none = { 0 };
    cr_expect_eq(groups_resolve(12, 0, 3, groups_plan_chooser, &none, err, sizeof err), 4);
}

Test(groups, shard_degree_zero_through_the_plan) {
    char err[512];
    groups_plan_t p = { .cfg = llama_preset("llama2-7b"), .cluster = plan_published_cluster(16),
                        .params = plan_default_params() };
    int want = plan_choose_shard_degree(p.cfg, &p.cluster, 1, &p.params, err, sizeof err);
    cr_assert_gt(want, 0, "%s", err);
    cr_expect_eq(groups_resolve(128, 0, 1, groups_plan_chooser, &p, err, sizeof err), want, "%s", err);
    /* a cluster that does not match the job's world is refused */
    cr_expect_eq(groups_resolve(64, 0, 1, groups_plan_chooser, &p, err, sizeof err), -1);
    cr_expect(strstr(err, "16 x 8") && strstr(err, "64 ranks"), "%s", err);
}

/* ---- errors name what does not divide ---- */

Test(groups, impossible_combinations_name_the_numbers) {
    char err[GROUPS_ERR_LEN];
    cr_expect_eq(groups_resolve(6, 1, 4, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "world size 6") && strstr(err, "--tensor-parallel-degree 4") &&
              strstr(err, "1, 2, 3, 6"), "%s", err);
    cr_expect_eq(groups_resolve(12, 4, 2, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "12 / 2 = 6") && strstr(err, "--hybrid-shard-degree 4") &&
              strstr(err, "1, 2, 3, 6"), "%s", err);
    cr_expect_eq(groups_resolve(8, 1, 0, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "--tensor-parallel-degree 0"), "%s", err);
    cr_expect_eq(groups_resolve(8, -2, 1, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "--hybrid-shard-degree -2"), "%s", err);
    cr_expect_eq(groups_resolve(0, 1, 1, NULL, NULL, err, sizeof err), -1);
    groups_t g;
    cr_expect_eq(groups_build(&g, 8, 8, 2, 2, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "rank 8") && strstr(err, "0..7"), "%s", err);
    cr_expect_eq(groups_build(&g, 10, 0, 3, 1, NULL, NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "10 / 1 = 10") && strstr(err, "3"), "%s", err);
}
