/* topology.h: where this process sits in the job. Rank, local rank, world
 * size, local world size, node rank, node count and the rendezvous address,
 * resolved from, in order of precedence:
 *
 *   1. explicit values (command-line flags), passed in a topo_flags_t;
 *   2. torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
 *      MASTER_ADDR, MASTER_PORT;
 *   3. Kubeflow PyTorchJob's PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE,
 *      PET_MASTER_ADDR, PET_MASTER_PORT
 *      (rank = node rank x nproc + local rank, world = nnodes x nproc);
 *   4. JOB_COMPLETION_INDEX (Kubernetes Indexed Job) as the node rank;
 *   5. defaults: one process, rank 0 of 1, 127.0.0.1:29500.
 *
 * A flag overrides the environment. Two environment sources that give the
 * same quantity different values, or values that contradict each other
 * (RANK vs PET_NODE_RANK x PET_NPROC_PER_NODE + LOCAL_RANK), are an error
 * naming every variable involved. See docs/common.md. */
#ifndef BALLAST_TOPOLOGY_H
#define BALLAST_TOPOLOGY_H

#include <stddef.h>
#include <stdio.h>

#define TOPO_UNSET (-1)       /* marker for an int flag that was not given */
#define TOPO_ERR_LEN 512
#define TOPO_ADDR_MAX 256
#define TOPO_DEFAULT_ADDR "127.0.0.1"
#define TOPO_DEFAULT_PORT 29500

typedef enum {
    TOPO_RANK = 0,
    TOPO_LOCAL_RANK,
    TOPO_WORLD_SIZE,
    TOPO_LOCAL_WORLD_SIZE,
    TOPO_NODE_RANK,
    TOPO_NNODES,
    TOPO_MASTER_ADDR,
    TOPO_MASTER_PORT,
    TOPO_NFIELDS
} topo_field_t;

/* Explicit values; TOPO_UNSET (ints) or NULL (addr) when not given. */
typedef struct {
    int rank;             /* --rank */
    int local_rank;       /* --local-rank */
    int world_size;       /* --world-size */
    int local_world_size; /* --local-world-size (processes per node) */
    int node_rank;        /* --node-rank */
    int nnodes;           /* --nnodes */
    const char *master_addr; /* --master-addr: host name or IP */
    int master_port;      /* --master-port: 1..65535 */
} topo_flags_t;

typedef struct {
    int rank;             /* global rank, 0..world_size-1 */
    int local_rank;       /* rank within the node, 0..local_world_size-1 */
    int world_size;       /* processes in the job */
    int local_world_size; /* processes per node */
    int node_rank;        /* 0..nnodes-1 */
    int nnodes;           /* nodes in the job; world_size = nnodes x local_world_size */
    char master_addr[TOPO_ADDR_MAX]; /* rendezvous host */
    int master_port;      /* rendezvous port */
    /* Where each value came from, indexed by topo_field_t: a variable name
     * ("RANK"), a flag ("--rank"), a formula of those
     * ("PET_NODE_RANK x PET_NPROC_PER_NODE + LOCAL_RANK") or "default". */
    char origin[TOPO_NFIELDS][96];
} topo_t;

/* Mark every flag unset. */
void topo_flags_init(topo_flags_t *f);

/* Resolve the topology from flags (may be NULL) and the environment.
 * Returns 0 and fills out, or -1 with a message in err that names each
 * variable or flag involved, its value and what to do. */
int topo_resolve(const topo_flags_t *flags, topo_t *out, char *err, size_t errlen);

/* Print one line per value with where it came from, e.g.
 * "  rank               5   RANK". */
void topo_describe(const topo_t *t, FILE *out);

/* "rank", "local_rank", ... */
const char *topo_field_name(topo_field_t f);

#endif
