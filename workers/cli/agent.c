/* agent.c: the launchers of a multi-node job watching each other through
 * the rendezvous store; see agent.h for the keys. Relies on
 * services/rendezvous for the store (node 0 serves it in-process) and on
 * common/clock for the heartbeat times. */
#include "workers/cli/agent.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "services/rendezvous/rdzv.h"

#define AGENT_JOB "ballast-launch"
#define AGENT_RPC_S 2.0          /* one store call's bound while watching */
#define AGENT_SETTLE_S 1.0       /* a failure waits this long for a cause published elsewhere */

typedef struct {
    char hb[64];                 /* last heartbeat value seen */
    double changed;              /* when it last changed (clock_now_s) */
    int fresh;                   /* changes seen since agent_fail began */
    char host[128];              /* its host name, "" until known */
} peer_t;

struct agent {
    agent_cfg_t c;
    rdzv_server_t *server;       /* node 0 only */
    rdzv_client_t *cli;
    int attempt;                 /* the current attempt, -1 before the first */
    unsigned long beats;
    double last_beat;            /* clock_now_s of the last heartbeat written */
    double last_look;            /* ... and of the last look at the peers' */
    double store_ok;             /* the last time a store call succeeded */
    double lost_s;
    bool store_lost;             /* cut off from node 0's store: no restart possible */
    peer_t *peer;                /* [nnodes] */
    char addr[300];
    char host[128];
};

double agent_lost_s(double t) {
    double s = t / 2;
    return s < 2 ? 2 : s > 30 ? 30 : s;
}

void agent_node_name(agent_t *a, int node, char *out, size_t len) {
    const char *h = node == a->c.node_rank ? a->host : a->peer[node].host;
    if (h[0]) snprintf(out, len, "node %d (host %s)", node, h);
    else snprintf(out, len, "node %d", node);
}

agent_t *agent_open(const agent_cfg_t *c, char *err, size_t errlen) {
    agent_t *a = calloc(1, sizeof *a);
    CHECK_ALLOC(a);
    a->c = *c;
    a->attempt = -1;
    a->lost_s = agent_lost_s(c->rdzv_timeout_s);
    a->peer = calloc((size_t)c->nnodes, sizeof *a->peer);
    CHECK_ALLOC(a->peer);
    if (gethostname(a->host, sizeof a->host - 1)) snprintf(a->host, sizeof a->host, "?");
    snprintf(a->addr, sizeof a->addr, "%s:%d", c->master_addr, c->master_port);
    char e[RDZV_ERR_LEN];
    if (c->node_rank == 0) {
        char listen[32];
        snprintf(listen, sizeof listen, "0.0.0.0:%d", c->master_port);
        rdzv_server_opts_t so = { .listen = listen, .job_id = AGENT_JOB, .world = c->nnodes };
        if (!(a->server = rdzv_server_start(&so, NULL, e, sizeof e))) {
            snprintf(err, errlen, "node 0 cannot serve the launchers' store on port %d: %s (pick another "
                     "--master-port; the workers' store takes the port after it)", c->master_port, e);
            agent_close(a);
            return NULL;
        }
    }
    if (!(a->cli = rdzv_client_open(a->addr, AGENT_JOB, c->nnodes, e, sizeof e))) {
        snprintf(err, errlen, "%s", e);
        agent_close(a);
        return NULL;
    }
    a->store_ok = clock_now_s();
    return a;
}

void agent_close(agent_t *a) {
    if (!a) return;
    if (a->server && a->cli) {
        /* let every node hear "done" before the store goes */
        double t0 = clock_now_s();
        for (int q = 1; q < a->c.nnodes && clock_now_s() - t0 < a->lost_s; q++) {
            char key[32];
            snprintf(key, sizeof key, "bye/%d", q);
            void *v = NULL;
            size_t n;
            char e[RDZV_ERR_LEN];
            while (rdzv_get(a->cli, key, &v, &n, AGENT_RPC_S, e, sizeof e) == -ENOENT && clock_now_s() - t0 < a->lost_s)
                usleep(100000);
            free(v);
        }
    }
    rdzv_client_close(a->cli);
    rdzv_server_stop(a->server);
    free(a->peer);
    free(a);
}

/* Get key as a string into out; 1 found, 0 missing, -1 store unreachable. */
static int get_str(agent_t *a, const char *key, char *out, size_t len) {
    void *v = NULL;
    size_t n = 0;
    char e[RDZV_ERR_LEN];
    int rc = rdzv_get(a->cli, key, &v, &n, AGENT_RPC_S, e, sizeof e);
    if (rc == -ENOENT) { a->store_ok = clock_now_s(); return 0; }
    if (rc) return -1;
    a->store_ok = clock_now_s();
    if (n >= len) n = len - 1;
    memcpy(out, v ? v : "", n);
    out[n] = 0;
    free(v);
    return 1;
}

static int set_str(agent_t *a, const char *key, const char *val, bool overwrite, double timeout_s) {
    char e[RDZV_ERR_LEN];
    int rc = rdzv_set(a->cli, key, val, strlen(val), overwrite, timeout_s, e, sizeof e);
    if (rc == 0 || rc == -EEXIST) a->store_ok = clock_now_s();
    return rc;
}

static void beat(agent_t *a) {
    double now = clock_now_s();
    if (now - a->last_beat < AGENT_HEARTBEAT_S) return;
    a->last_beat = now;
    char key[32], val[64];
    snprintf(key, sizeof key, "hb/%d", a->c.node_rank);
    snprintf(val, sizeof val, "%d:%lu", (int)getpid(), ++a->beats);
    set_str(a, key, val, true, AGENT_RPC_S);
}

/* Read every peer's heartbeat. The first node found lost (>= 0), -1 when
 * none; *all_fresh: every peer's heartbeat changed twice since the counts
 * were reset (once is no proof of life: it may be the last beat before
 * the node died, read late). */
static int look_at_peers(agent_t *a, bool *all_fresh) {
    double now = clock_now_s();
    int lost = -1;
    if (all_fresh) *all_fresh = true;
    for (int q = 0; q < a->c.nnodes; q++) {
        if (q == a->c.node_rank) continue;
        peer_t *p = &a->peer[q];
        char key[32], v[64];
        snprintf(key, sizeof key, "hb/%d", q);
        int rc = get_str(a, key, v, sizeof v);
        if (rc > 0 && strcmp(v, p->hb)) {
            snprintf(p->hb, sizeof p->hb, "%s", v);
            p->changed = now;
            p->fresh++;
        }
        if (all_fresh && p->fresh < 2) *all_fresh = false;
        if (lost < 0 && now - p->changed > a->lost_s) lost = q;
    }
    return lost;
}

/* The reason attempt A failed, when one is published: 1 (in why), else 0. */
static int failed_elsewhere(agent_t *a, char *why, size_t len) {
    char key[32];
    snprintf(key, sizeof key, "fail/%d", a->attempt);
    if (get_str(a, key, why, len) > 0) return 1;
    char s[8];
    if (get_str(a, "stop", s, sizeof s) > 0) {
        snprintf(why, len, "a launcher was stopped by a signal");
        return 1;
    }
    return 0;
}

/* Publish cause as fail/A unless another is there; the winner in out. */
static void publish(agent_t *a, const char *cause, char *out, size_t len) {
    char key[32];
    snprintf(key, sizeof key, "fail/%d", a->attempt);
    int rc = set_str(a, key, cause, false, AGENT_RPC_S);
    if (rc == -EEXIST && get_str(a, key, out, len) > 0) return;
    snprintf(out, len, "%s", cause);
}

static void lost_reason(agent_t *a, int q, char *why, size_t len) {
    char nm[200];
    agent_node_name(a, q, nm, sizeof nm);
    snprintf(why, len, "%s lost: its launcher's heartbeat stopped %.1f s ago (a node is lost after %.1f s, half "
             "--rdzv-timeout); its processes died or its network is cut", nm, clock_now_s() - a->peer[q].changed,
             a->lost_s);
}

/* Whether this node is cut off from the store for longer than lost_s. */
static int cut_off(agent_t *a, char *why, size_t len) {
    if (clock_now_s() - a->store_ok <= a->lost_s) return 0;
    a->store_lost = true;
    snprintf(why, len, "node 0 lost: the launchers' store at %s has not answered for %.1f s (node 0's launcher "
             "died, or the network to it is cut)", a->addr, clock_now_s() - a->store_ok);
    return 1;
}

int agent_begin(agent_t *a, int *attempt, char *err, size_t errlen) {
    char v[64], e[RDZV_ERR_LEN];
    if (a->attempt < 0) {
        /* joining: the job's current attempt, if it already runs */
        int rc = -1;
        double t0 = clock_now_s();
        while ((rc = get_str(a, "attempt", v, sizeof v)) < 0 && clock_now_s() - t0 < a->c.rdzv_timeout_s)
            usleep(200000);
        if (rc < 0) {
            snprintf(err, errlen, "node %d: the launchers' store at %s did not answer within --rdzv-timeout %.1f s: "
                     "start node 0's launcher (--node-rank 0), check --master-addr/--master-port and the network",
                     a->c.node_rank, a->addr, a->c.rdzv_timeout_s);
            return -1;
        }
        if (rc == 0) {
            a->attempt = 0;
        } else {
            a->attempt = atoi(v);
            char why[AGENT_ERR_LEN], out[AGENT_ERR_LEN];
            snprintf(why, sizeof why, "node %d (host %s) rejoined: its launcher restarted", a->c.node_rank, a->host);
            publish(a, why, out, sizeof out);
            a->attempt++;
        }
    } else if (a->store_lost) {
        snprintf(err, errlen, "node %d: no restart without node 0 and its store at %s: start every node's "
                 "launcher again (the workers resume with --resume auto)", a->c.node_rank, a->addr);
        return -1;
    } else {
        a->attempt++;
    }
    char key[64];
    snprintf(key, sizeof key, "host/%d", a->c.node_rank);
    set_str(a, key, a->host, true, a->c.rdzv_timeout_s);
    snprintf(key, sizeof key, "attempt/%d", a->attempt);
    int rc = rdzv_barrier(a->cli, key, a->c.node_rank, a->c.nnodes, a->c.rdzv_timeout_s, e, sizeof e);
    if (rc) {
        snprintf(err, errlen, "node %d: not every node joined attempt %d within --rdzv-timeout %.1f s: %s (ranks "
                 "are nodes here: start a launcher with each missing --node-rank)", a->c.node_rank, a->attempt,
                 a->c.rdzv_timeout_s, e);
        return -1;
    }
    snprintf(v, sizeof v, "%d", a->attempt);
    set_str(a, "attempt", v, true, AGENT_RPC_S);
    double now = clock_now_s();
    for (int q = 0; q < a->c.nnodes; q++) {
        a->peer[q].changed = now; /* everyone was at the barrier just now */
        snprintf(key, sizeof key, "host/%d", q);
        if (q != a->c.node_rank) get_str(a, key, a->peer[q].host, sizeof a->peer[q].host);
    }
    a->store_ok = now;
    a->last_beat = 0;
    beat(a);
    *attempt = a->attempt;
    return 0;
}

int agent_poll(agent_t *a, char *why, size_t len) {
    beat(a);
    if (failed_elsewhere(a, why, len)) return 1;
    if (cut_off(a, why, len)) return 1;
    if (clock_now_s() - a->last_look < AGENT_HEARTBEAT_S) return 0; /* peers are read once per beat */
    a->last_look = clock_now_s();
    int lost = look_at_peers(a, NULL);
    if (lost < 0) return 0;
    char r[AGENT_ERR_LEN];
    lost_reason(a, lost, r, sizeof r);
    publish(a, r, why, len);
    return 1;
}

void agent_fail(agent_t *a, const char *msg, char *cause, size_t len) {
    double t0 = clock_now_s();
    for (int q = 0; q < a->c.nnodes; q++) a->peer[q].fresh = 0;
    for (;;) {
        beat(a);
        if (failed_elsewhere(a, cause, len)) return;
        if (cut_off(a, cause, len)) return;
        bool fresh;
        int lost = look_at_peers(a, &fresh);
        char r[AGENT_ERR_LEN];
        if (lost >= 0) {
            lost_reason(a, lost, r, sizeof r);
            publish(a, r, cause, len);
            return;
        }
        double waited = clock_now_s() - t0;
        if ((fresh && waited >= AGENT_SETTLE_S) || waited > a->lost_s + AGENT_SETTLE_S) break;
        usleep(100000);
    }
    publish(a, msg, cause, len);
}

void agent_stop(agent_t *a, const char *msg) {
    set_str(a, "stop", "1", true, AGENT_RPC_S);
    char out[AGENT_ERR_LEN];
    publish(a, msg, out, sizeof out);
}

bool agent_stopped(agent_t *a) {
    char s[8];
    return get_str(a, "stop", s, sizeof s) > 0;
}

int agent_finish(agent_t *a, char *why, size_t len) {
    char key[64], v[8];
    snprintf(key, sizeof key, "done/%d/%d", a->attempt, a->c.node_rank);
    set_str(a, key, "1", true, a->c.rdzv_timeout_s);
    for (;;) {
        int q = 0;
        for (; q < a->c.nnodes; q++) {
            snprintf(key, sizeof key, "done/%d/%d", a->attempt, q);
            if (get_str(a, key, v, sizeof v) <= 0) break;
        }
        if (q == a->c.nnodes) break;
        if (agent_poll(a, why, len)) return 1;
        usleep(100000);
    }
    snprintf(key, sizeof key, "bye/%d", a->c.node_rank);
    set_str(a, key, "1", true, AGENT_RPC_S);
    return 0;
}
