/* agent.h: how the launchers of one job (one `ballast train` per node)
 * watch each other and agree on restarts, through a rendezvous store
 * (services/rendezvous) that node 0's launcher serves on --master-port.
 *
 * Keys (job id "ballast-launch", world = nodes):
 *   host/R         node R's host name, set at every attempt
 *   hb/R           node R's heartbeat, "PID:COUNT", rewritten every second
 *   attempt        the attempt the job runs now (0 = the first start)
 *   fail/A         why attempt A failed (the first failure wins)
 *   stop           set when a launcher was stopped by a signal: no restart
 *   done/A/R       node R's workers of attempt A all finished
 *   bye/R          node R saw the whole job done (node 0 stops the store after)
 *   barrier attempt/A   every node joins attempt A before its workers start
 * A node whose heartbeat stops advancing for agent_lost_s(rdzv timeout) is
 * lost; a launcher that cannot reach the store as long is cut off from
 * node 0. See docs/training.md, "Several nodes". */
#ifndef BALLAST_CLI_AGENT_H
#define BALLAST_CLI_AGENT_H

#include <stdbool.h>
#include <stddef.h>

#define AGENT_ERR_LEN 1024
#define AGENT_HEARTBEAT_S 1.0   /* seconds between heartbeats */

typedef struct agent agent_t;

typedef struct {
    int nnodes;                 /* launchers in the job, >= 2 */
    int node_rank;              /* this launcher's node, 0..nnodes-1 */
    const char *master_addr;    /* node 0's host */
    int master_port;            /* the launchers' store; the workers' is master_port + 1 */
    double rdzv_timeout_s;      /* bounds every wait */
} agent_cfg_t;

/* Seconds without a heartbeat after which a node counts as lost: half the
 * rendezvous timeout, within [2, 30], so a loss is named within it. */
double agent_lost_s(double rdzv_timeout_s);

/* Node 0 starts serving the store (on every interface, at master_port);
 * every node opens a client. NULL with a message on error. */
agent_t *agent_open(const agent_cfg_t *c, char *err, size_t errlen);

/* Stop: node 0 waits (bounded) for every node's bye/R, then stops serving. */
void agent_close(agent_t *a);

/* Agree on the next attempt. The first call of a launcher reads the job's
 * attempt from the store (a launcher that joins a running job, as a
 * restarted pod does, marks that attempt failed and joins the next one);
 * later calls take the attempt after the one that failed. Then waits in
 * barrier attempt/A for every node, up to the rendezvous timeout. 0 with
 * *attempt, or -1 with a message naming the nodes that did not come. */
int agent_begin(agent_t *a, int *attempt, char *err, size_t errlen);

/* Call about every 100 ms while workers run: beats (every second) and
 * looks at the others. 0 = all well; 1 = the job failed elsewhere or a
 * node is lost, with the reason in why. */
int agent_poll(agent_t *a, char *why, size_t len);

/* This node's failure: waits (bounded by the lost-node time) until it is
 * clear whether another node failed first or is lost (then that is the
 * cause) or every other node is alive (then msg is), publishes the cause
 * as fail/A (the first writer wins) and copies it to cause. */
void agent_fail(agent_t *a, const char *msg, char *cause, size_t len);

/* This node was stopped by a signal: the job does not restart. */
void agent_stop(agent_t *a, const char *msg);

/* Whether the job must not restart (a launcher was stopped by a signal). */
bool agent_stopped(agent_t *a);

/* This node's workers all finished: wait until every node's have (0), or
 * until the attempt failed elsewhere (1, reason in why). */
int agent_finish(agent_t *a, char *why, size_t len);

/* "node R (host H)" for messages. */
void agent_node_name(agent_t *a, int node, char *out, size_t len);

#endif
