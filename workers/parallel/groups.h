/* groups.h: the process groups of a hybrid-sharded, tensor-parallel,
 * context-parallel job.
 *
 * world = R (replicas) x S (hybrid shard degree) x T (tensor-parallel
 * degree) x C (context-parallel degree). Ranks are laid out TP innermost
 * (NVLink neighbours: its collectives sit on every matmul), then context
 * parallel (the ring passes a block of K/V per step, next in volume), then
 * shard, then replica:
 *
 *     rank = ((replica * S + shard) * C + cp) * T + tp
 *
 * Every rank belongs to exactly one group of each kind:
 *   TP group       the T ranks with the same (replica, shard, cp)
 *   CP group       the C ranks with the same (replica, shard, tp): ring
 *                  attention passes K/V blocks around it
 *   shard group    the S ranks with the same (replica, cp, tp): FSDP gathers
 *                  and reduce-scatters run here
 *   replica group  the R x C ranks with the same (shard, tp), in (replica,
 *                  cp) order: they hold the same parameter chunks, so the
 *                  gradient all-reduce across replicas runs here and also
 *                  adds the context-parallel ranks' parts (each saw its
 *                  own tokens of the same sequences)
 *
 * S = 0 means "the largest S that fits": a caller-supplied chooser (usually
 * groups_plan_chooser over workers/plan/plan.h) picks it; with no chooser, or
 * when it has no memory figure, S = world / T (full sharding).
 * See docs/comm.md for a worked example. */
#ifndef BALLAST_GROUPS_H
#define BALLAST_GROUPS_H

#include <stddef.h>

#include "workers/model/config.h"
#include "workers/plan/plan.h"

#define GROUPS_ERR_LEN 256

typedef enum { GROUP_TP = 0, GROUP_SHARD, GROUP_REPLICA, GROUP_CP, GROUP_NKINDS } group_kind_t;

typedef struct {
    group_kind_t kind;
    int id;          /* which group of this kind, 0..(world / n - 1) */
    int n;           /* ranks in the group */
    int index;       /* this rank's position in ranks[], 0..n-1 */
    int *ranks;      /* global ranks, ascending, n entries (owned by groups_t) */
} group_t;

typedef struct {
    int world;       /* processes in the job */
    int rank;        /* this process, 0..world-1 */
    int R, S, T;     /* replicas, hybrid shard degree, tensor-parallel degree */
    int C;           /* context-parallel degree */
    int replica;     /* this rank's coordinates: 0..R-1 */
    int shard;       /* 0..S-1 */
    int tp;          /* 0..T-1 */
    int cp;          /* 0..C-1 */
    group_t group[GROUP_NKINDS]; /* indexed by group_kind_t */
} groups_t;

/* Chooser for S = 0: returns S > 0, 0 when it has no memory figure (the
 * caller then falls back to world / T), or -1 with a message in err. */
typedef int (*groups_chooser_fn)(void *user, int world, int T, char *err, size_t errlen);

/* Resolve S and check (world, S, T): T >= 1, S >= 0 (0: chooser or
 * world / T), T divides world, S divides world / T. Returns S > 0, or -1
 * with a message naming the numbers that do not divide and the valid
 * choices. chooser may be NULL. */
int groups_resolve(int world, int S, int T, groups_chooser_fn chooser, void *user,
                   char *err, size_t errlen);

/* Build this rank's groups for (world, S, T) with S already resolved
 * (S > 0) or 0 (resolved here through chooser). Returns 0, or -1 with a
 * message. Free with groups_free. */
int groups_build(groups_t *g, int world, int rank, int S, int T, groups_chooser_fn chooser,
                 void *user, char *err, size_t errlen);
void groups_free(groups_t *g);

/* groups_resolve and groups_build with a context-parallel degree C >= 1:
 * world / (T x C) takes the place of world / T (the plain calls are C = 1). */
int groups_resolve_cp(int world, int S, int T, int C, groups_chooser_fn chooser, void *user,
                      char *err, size_t errlen);
int groups_build_cp(groups_t *g, int world, int rank, int S, int T, int C, groups_chooser_fn chooser,
                    void *user, char *err, size_t errlen);

/* The global rank at coordinates (replica, shard, tp) of a layout (C = 1),
 * and at (replica, shard, cp, tp) of one with C. */
int groups_rank_of(int S, int T, int replica, int shard, int tp);
int groups_rank_of_cp(int S, int T, int C, int replica, int shard, int cp, int tp);

/* "tp", "shard", "replica", "cp". */
const char *group_kind_name(group_kind_t k);

/* A stable name for one group, unique within the job, e.g. "shard.3": used
 * as the rendezvous key prefix of its communicator. */
void group_name(const group_t *gr, char *buf, size_t len);

/* ---- S = 0 through the performance model ---- */

typedef struct {
    const llama_config_t *cfg;   /* the model */
    plan_cluster_t cluster;      /* nodes, GPUs per node, GPU type, batch */
    plan_params_t params;        /* usually plan_default_params() */
} groups_plan_t;

/* A groups_chooser_fn over plan_choose_shard_degree: user is a
 * groups_plan_t *. Returns 0 (no figure) when user, its model or its GPU is
 * NULL, e.g. on the CPU backend. */
int groups_plan_chooser(void *user, int world, int T, char *err, size_t errlen);

#endif
