/* topology.c: rank / world / rendezvous resolution, see topology.h.
 *
 * Three steps: collect every value that a flag or variable gives directly
 * (validated as it is read), derive the missing ones from
 *     world = nnodes x local_world      rank = node_rank x local_world + local_rank
 * and fall back to single-process defaults, then check that the relations and
 * ranges hold. Each value carries its origin so that every message names the
 * flags and variables it came from. */
#include "topology.h"
#include "errbuf.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- values with origins ---- */

typedef struct {
    bool set;
    int64_t v;
    char origin[96]; /* "RANK", "--rank", a formula, or "default" */
} tval_t;

static const char *field_names[TOPO_NFIELDS] = {
    "rank", "local_rank", "world_size", "local_world_size", "node_rank", "nnodes",
    "master_addr", "master_port",
};

static const char *field_flags[TOPO_NFIELDS] = {
    "--rank", "--local-rank", "--world-size", "--local-world-size", "--node-rank", "--nnodes",
    "--master-addr", "--master-port",
};

/* Environment variables per field, highest precedence first. */
static const char *field_env[TOPO_NFIELDS][3] = {
    [TOPO_RANK] = { "RANK" },
    [TOPO_LOCAL_RANK] = { "LOCAL_RANK" },
    [TOPO_WORLD_SIZE] = { "WORLD_SIZE" },
    [TOPO_LOCAL_WORLD_SIZE] = { "LOCAL_WORLD_SIZE", "PET_NPROC_PER_NODE" },
    [TOPO_NODE_RANK] = { "PET_NODE_RANK", "JOB_COMPLETION_INDEX" },
    [TOPO_NNODES] = { "PET_NNODES" },
    [TOPO_MASTER_ADDR] = { "MASTER_ADDR", "PET_MASTER_ADDR" },
    [TOPO_MASTER_PORT] = { "MASTER_PORT", "PET_MASTER_PORT" },
};

/* Sizes are at least 1; ranks at least 0. */
static bool is_size(topo_field_t f) {
    return f == TOPO_WORLD_SIZE || f == TOPO_LOCAL_WORLD_SIZE || f == TOPO_NNODES;
}

const char *topo_field_name(topo_field_t f) {
    return (unsigned)f < TOPO_NFIELDS ? field_names[f] : "?";
}

void topo_flags_init(topo_flags_t *f) {
    f->rank = f->local_rank = f->world_size = f->local_world_size = TOPO_UNSET;
    f->node_rank = f->nnodes = f->master_port = TOPO_UNSET;
    f->master_addr = NULL;
}

/* A simple origin (one flag or variable) reads "NAME=V"; a derived or default
 * one reads "<field> V (ORIGIN)". */
static const char *show(const tval_t *t, topo_field_t f, char *buf, size_t len) {
    if (strchr(t->origin, ' ') || strcmp(t->origin, "default") == 0)
        snprintf(buf, len, "%s %lld (%s)", field_names[f], (long long)t->v, t->origin);
    else
        snprintf(buf, len, "%s=%lld", t->origin, (long long)t->v);
    return buf;
}

/* ---- parsing and validation of one value ---- */

/* Parse a non-negative decimal integer given by `who` (a variable or flag
 * name). Sizes must be >= 1, ports 1..65535. */
static int parse_count(const char *who, const char *s, topo_field_t f, int64_t *out, char *err, size_t errlen) {
    if (!*s) {
        errbuf_set(err, errlen, "%s is set but empty: unset it or give a number", who);
        return -1;
    }
    if (f == TOPO_NNODES && strchr(s, ':')) {
        errbuf_set(err, errlen, "%s=%s is an elastic range (min:max); elastic jobs are not supported: "
             "give a fixed node count, e.g. %s=%s", who, s, who, strrchr(s, ':') + 1);
        return -1;
    }
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    if (!*p) goto nonnum;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) goto nonnum;
    if (*s == '-') {
        errbuf_set(err, errlen, "%s=%s is negative: %s must be %s", who, s, field_names[f],
             is_size(f) ? "at least 1" : f == TOPO_MASTER_PORT ? "in 1..65535" : "0 or more");
        return -1;
    }
    errno = 0;
    long long v = strtoll(p, NULL, 10);
    if (errno == ERANGE || v > INT_MAX) {
        errbuf_set(err, errlen, "%s=%s is too large (at most %d)", who, s, f == TOPO_MASTER_PORT ? 65535 : INT_MAX);
        return -1;
    }
    if (f == TOPO_MASTER_PORT && (v < 1 || v > 65535)) {
        errbuf_set(err, errlen, "%s=%s is outside the port range 1..65535", who, s);
        return -1;
    }
    if (is_size(f) && v < 1) {
        errbuf_set(err, errlen, "%s=%s: %s must be at least 1", who, s, field_names[f]);
        return -1;
    }
    *out = v;
    return 0;
nonnum:
    if (f == TOPO_LOCAL_WORLD_SIZE && (!strcmp(s, "auto") || !strcmp(s, "gpu") || !strcmp(s, "cpu")))
        errbuf_set(err, errlen, "%s=%s: give the number of processes per node as a number (e.g. %s=8)", who, s, who);
    else
        errbuf_set(err, errlen, "%s=%s is not a whole number: %s takes a decimal integer", who, s, field_names[f]);
    return -1;
}

static int check_addr(const char *who, const char *s, char *err, size_t errlen) {
    size_t n = strlen(s);
    if (n == 0) {
        errbuf_set(err, errlen, "%s is set but empty: give a host name or IP address", who);
        return -1;
    }
    if (n >= TOPO_ADDR_MAX) {
        errbuf_set(err, errlen, "%s is %zu characters long; a host name is at most %d", who, n, TOPO_ADDR_MAX - 1);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && !strchr(".-_:[]%", c)) {
            errbuf_set(err, errlen, "%s=\"%s\" is not a host name or IP address (character '%c' at %zu); "
                 "give only the host, without scheme or port", who, s, isprint(c) ? c : '?', i);
            return -1;
        }
    }
    return 0;
}

/* ---- collection: flags, then the environment ---- */

static int flag_int(const topo_flags_t *fl, topo_field_t f) {
    switch (f) {
    case TOPO_RANK: return fl->rank;
    case TOPO_LOCAL_RANK: return fl->local_rank;
    case TOPO_WORLD_SIZE: return fl->world_size;
    case TOPO_LOCAL_WORLD_SIZE: return fl->local_world_size;
    case TOPO_NODE_RANK: return fl->node_rank;
    case TOPO_NNODES: return fl->nnodes;
    case TOPO_MASTER_PORT: return fl->master_port;
    default: return TOPO_UNSET;
    }
}

/* Fill val[f] for an integer field from its flag or its variables. Every
 * variable present is validated even when a higher source wins; two
 * variables that disagree are an error unless a flag settles the value. */
static int collect_int(const topo_flags_t *fl, topo_field_t f, tval_t *val, char *err, size_t errlen) {
    int fv = fl ? flag_int(fl, f) : TOPO_UNSET;
    if (fv != TOPO_UNSET) {
        char num[24];
        snprintf(num, sizeof num, "%d", fv);
        if (parse_count(field_flags[f], num, f, &val->v, err, errlen)) return -1;
        val->set = true;
        snprintf(val->origin, sizeof val->origin, "%s", field_flags[f]);
    }
    bool flagged = val->set;
    for (int i = 0; i < 3 && field_env[f][i]; i++) {
        const char *name = field_env[f][i], *s = getenv(name);
        if (!s) continue;
        int64_t v;
        if (parse_count(name, s, f, &v, err, errlen)) return -1;
        if (!val->set) {
            val->set = true;
            val->v = v;
            snprintf(val->origin, sizeof val->origin, "%s", name);
        } else if (!flagged && v != val->v && f != TOPO_MASTER_PORT) {
            errbuf_set(err, errlen, "%s=%lld disagrees with %s=%s: both give the %s; unset the stale one "
                 "or pass %s", val->origin, (long long)val->v, name, s, field_names[f], field_flags[f]);
            return -1;
        }
    }
    return 0;
}

static int collect_addr(const topo_flags_t *fl, topo_t *out, char *err, size_t errlen) {
    const char *chosen = NULL, *origin = NULL;
    if (fl && fl->master_addr) {
        if (check_addr("--master-addr", fl->master_addr, err, errlen)) return -1;
        chosen = fl->master_addr;
        origin = "--master-addr";
    }
    for (int i = 0; i < 3 && field_env[TOPO_MASTER_ADDR][i]; i++) {
        const char *name = field_env[TOPO_MASTER_ADDR][i], *s = getenv(name);
        if (!s) continue;
        if (check_addr(name, s, err, errlen)) return -1;
        if (!chosen) { chosen = s; origin = name; }
    }
    snprintf(out->master_addr, sizeof out->master_addr, "%s", chosen ? chosen : TOPO_DEFAULT_ADDR);
    snprintf(out->origin[TOPO_MASTER_ADDR], sizeof out->origin[0], "%s", origin ? origin : "default");
    return 0;
}

/* ---- derivation ---- */

/* Set t to v with an origin formatted from fmt, or "default" when every
 * operand was a default (dflt). */
static void derive(tval_t *t, int64_t v, bool dflt, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void derive(tval_t *t, int64_t v, bool dflt, const char *fmt, ...) {
    t->set = true;
    t->v = v;
    if (dflt) {
        snprintf(t->origin, sizeof t->origin, "default");
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->origin, sizeof t->origin, fmt, ap);
    va_end(ap);
}

static void set_default(tval_t *t, int64_t v) { derive(t, v, true, "default"); }

/* Given by one flag or variable, not derived or defaulted. */
static bool is_direct(const tval_t *t) { return t->set && !strchr(t->origin, ' ') && strcmp(t->origin, "default"); }

static bool is_default(const tval_t *t) { return strcmp(t->origin, "default") == 0; }

/* How an operand reads inside a formula: its variable or flag, a
 * parenthesised formula, or its value when it is a default. */
static const char *nm(const tval_t *t, char *buf, size_t len) {
    if (is_default(t)) snprintf(buf, len, "%lld", (long long)t->v);
    else if (strchr(t->origin, ' ')) snprintf(buf, len, "(%s)", t->origin);
    else snprintf(buf, len, "%s", t->origin);
    return buf;
}
#define NM(t, i) nm((t), o[i], sizeof o[i])

/* The world size must split evenly over the nodes. Always returns -1. */
static int not_multiple(const tval_t *world, const tval_t *by, topo_field_t f, char *err, size_t errlen) {
    char a[160], b[160];
    errbuf_set(err, errlen, "%s is not a multiple of %s%s: every node must run the same number of processes",
         show(world, TOPO_WORLD_SIZE, a, sizeof a), show(by, f, b, sizeof b),
         f == TOPO_LOCAL_WORLD_SIZE ? " (processes per node)" : "");
    return -1;
}

/* Apply the two relations until nothing changes. -1 on a size that does not
 * divide or overflows. */
static int derive_all(tval_t *v, char *err, size_t errlen) {
    tval_t *rank = &v[TOPO_RANK], *local = &v[TOPO_LOCAL_RANK], *world = &v[TOPO_WORLD_SIZE];
    tval_t *lws = &v[TOPO_LOCAL_WORLD_SIZE], *node = &v[TOPO_NODE_RANK], *nn = &v[TOPO_NNODES];
    char a[160], b[160], o[3][100];
    for (bool changed = true; changed;) {
        changed = false;
        if (!world->set && nn->set && lws->set) {
            if (nn->v * lws->v > INT_MAX) {
                errbuf_set(err, errlen, "%s x %s overflows the world size", show(nn, TOPO_NNODES, a, sizeof a),
                     show(lws, TOPO_LOCAL_WORLD_SIZE, b, sizeof b));
                return -1;
            }
            derive(world, nn->v * lws->v, is_default(nn) && is_default(lws), "%s x %s", NM(nn, 0), NM(lws, 1));
            changed = true;
        }
        if (world->set && lws->set && !nn->set) {
            if (world->v % lws->v) return not_multiple(world, lws, TOPO_LOCAL_WORLD_SIZE, err, errlen);
            derive(nn, world->v / lws->v, is_default(world) && is_default(lws), "%s / %s", NM(world, 0), NM(lws, 1));
            changed = true;
        }
        if (world->set && nn->set && !lws->set) {
            if (world->v % nn->v) return not_multiple(world, nn, TOPO_NNODES, err, errlen);
            derive(lws, world->v / nn->v, is_default(world) && is_default(nn), "%s / %s", NM(world, 0), NM(nn, 1));
            changed = true;
        }
        if (!rank->set && node->set && lws->set && local->set) {
            derive(rank, node->v * lws->v + local->v, is_default(node) && is_default(lws) && is_default(local),
                   "%s x %s + %s", NM(node, 0), NM(lws, 1), NM(local, 2));
            changed = true;
        }
        if (rank->set && lws->set && !node->set) {
            derive(node, rank->v / lws->v, is_default(rank) && is_default(lws), "%s / %s", NM(rank, 0), NM(lws, 1));
            changed = true;
        }
        if (rank->set && lws->set && !local->set) {
            derive(local, rank->v % lws->v, is_default(rank) && is_default(lws), "%s mod %s", NM(rank, 0), NM(lws, 1));
            changed = true;
        }
        if (!local->set && lws->set && lws->v == 1) {
            derive(local, 0, is_default(lws), "one process per node (%s)", lws->origin);
            changed = true;
        }
    }
    return 0;
}

/* ---- resolution ---- */

int topo_resolve(const topo_flags_t *flags, topo_t *out, char *err, size_t errlen) {
    tval_t v[TOPO_NFIELDS];
    char a[160], b[160], c[160], d[160];
    memset(v, 0, sizeof v);
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = 0;

    for (int f = 0; f < TOPO_NFIELDS; f++) {
        if (f == TOPO_MASTER_ADDR) continue;
        if (collect_int(flags, (topo_field_t)f, &v[f], err, errlen)) return -1;
    }
    if (collect_addr(flags, out, err, errlen)) return -1;

    tval_t *rank = &v[TOPO_RANK], *local = &v[TOPO_LOCAL_RANK], *world = &v[TOPO_WORLD_SIZE];
    tval_t *lws = &v[TOPO_LOCAL_WORLD_SIZE], *node = &v[TOPO_NODE_RANK], *nn = &v[TOPO_NNODES];

    if (world->set && lws->set && world->v % lws->v) return not_multiple(world, lws, TOPO_LOCAL_WORLD_SIZE, err, errlen);
    if (derive_all(v, err, errlen)) return -1;

    /* Defaults: a single node, and a single process when nothing says more. */
    if (!world->set) {
        if (rank->set) {
            errbuf_set(err, errlen, "%s is set but the world size is not: set WORLD_SIZE (or PET_NNODES and "
                 "PET_NPROC_PER_NODE, or --world-size)", show(rank, TOPO_RANK, a, sizeof a));
            return -1;
        }
        if (!nn->set && !lws->set) {
            set_default(nn, 1);
            set_default(lws, 1);
            set_default(world, 1);
        } else if (!nn->set) {
            set_default(nn, 1);
            derive(world, lws->v, false, "%s on one node (default)", lws->origin);
        } else {
            set_default(lws, 1);
            derive(world, nn->v, false, "one process on each of %s nodes (default)", nn->origin);
        }
    } else if (!lws->set && !nn->set) {
        set_default(nn, 1);
        derive(lws, world->v, false, "%s on one node (default)", world->origin);
    }
    if (derive_all(v, err, errlen)) return -1;
    if (!rank->set) {
        if (!node->set && nn->v == 1) set_default(node, 0);
        if (derive_all(v, err, errlen)) return -1;
    }
    if (!rank->set) {
        if (world->v == 1) {
            set_default(rank, 0);
            if (derive_all(v, err, errlen)) return -1;
        } else {
            errbuf_set(err, errlen, "%s but this process's rank is unknown: set RANK (or LOCAL_RANK together with "
                 "PET_NODE_RANK or JOB_COMPLETION_INDEX, or --rank)", show(world, TOPO_WORLD_SIZE, a, sizeof a));
            return -1;
        }
    }

    /* Ranges: values given directly first, so the message names the value
     * the user set rather than one derived from it. */
    for (int pass = 0; pass < 2; pass++) {
        if ((pass || is_direct(node)) && node->v >= nn->v) {
            errbuf_set(err, errlen, "%s must be less than %s: set the node count (PET_NNODES in the environment, or `ballast train --nnodes N`)",
                 show(node, TOPO_NODE_RANK, a, sizeof a), show(nn, TOPO_NNODES, b, sizeof b));
            return -1;
        }
        if ((pass || is_direct(rank)) && rank->v >= world->v) {
            errbuf_set(err, errlen, "%s must be less than %s: ranks run from 0 to world size - 1",
                 show(rank, TOPO_RANK, a, sizeof a), show(world, TOPO_WORLD_SIZE, b, sizeof b));
            return -1;
        }
        if ((pass || is_direct(local)) && local->v >= lws->v) {
            errbuf_set(err, errlen, "%s must be less than %s: local ranks run from 0 to processes per node - 1",
                 show(local, TOPO_LOCAL_RANK, a, sizeof a), show(lws, TOPO_LOCAL_WORLD_SIZE, b, sizeof b));
            return -1;
        }
    }
    /* Relations between sources. */
    if (world->v != nn->v * lws->v) {
        errbuf_set(err, errlen, "%s disagrees with %s x %s = %lld: the sources describe different jobs; unset the "
             "stale ones", show(world, TOPO_WORLD_SIZE, a, sizeof a), show(nn, TOPO_NNODES, b, sizeof b),
             show(lws, TOPO_LOCAL_WORLD_SIZE, c, sizeof c), (long long)(nn->v * lws->v));
        return -1;
    }
    if (rank->v != node->v * lws->v + local->v) {
        errbuf_set(err, errlen, "%s disagrees with %s x %s + %s = %lld: the sources describe different processes; "
             "unset the stale ones or pass --rank%s", show(rank, TOPO_RANK, a, sizeof a),
             show(node, TOPO_NODE_RANK, b, sizeof b), show(lws, TOPO_LOCAL_WORLD_SIZE, c, sizeof c),
             show(local, TOPO_LOCAL_RANK, d, sizeof d), (long long)(node->v * lws->v + local->v),
             is_direct(lws) ? "" : " (and set LOCAL_WORLD_SIZE, the processes per node)");
        return -1;
    }

    tval_t *port = &v[TOPO_MASTER_PORT];
    if (!port->set) set_default(port, TOPO_DEFAULT_PORT);

    out->rank = (int)rank->v;
    out->local_rank = (int)local->v;
    out->world_size = (int)world->v;
    out->local_world_size = (int)lws->v;
    out->node_rank = (int)node->v;
    out->nnodes = (int)nn->v;
    out->master_port = (int)port->v;
    for (int f = 0; f < TOPO_NFIELDS; f++)
        if (f != TOPO_MASTER_ADDR) snprintf(out->origin[f], sizeof out->origin[f], "%s", v[f].origin);
    return 0;
}

void topo_describe(const topo_t *t, FILE *out) {
    int vals[TOPO_NFIELDS] = { t->rank, t->local_rank, t->world_size, t->local_world_size,
                               t->node_rank, t->nnodes, 0, t->master_port };
    for (int f = 0; f < TOPO_NFIELDS; f++) {
        if (f == TOPO_MASTER_ADDR)
            fprintf(out, "  %-18s %-16s %s\n", field_names[f], t->master_addr, t->origin[f]);
        else
            fprintf(out, "  %-18s %-16d %s\n", field_names[f], vals[f], t->origin[f]);
    }
}
