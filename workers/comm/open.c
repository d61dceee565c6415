/* open.c: choosing a backend and starting a communicator on it (comm.h:
 * comm_select, comm_init), and the exposed-wait total over every backend.
 * The one file of workers/comm/ that knows the backends' tables: they use
 * only comm.c (through impl.h), so the core and the backends never point
 * at each other. */
#include "workers/comm/impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- backend selection ---- */

int comm_select(comm_kind_t requested, bool on_gpu, char *err, size_t errlen) {
    char why[COMM_ERR_LEN] = "";
    switch (requested) {
    case COMM_SHM: return COMM_SHM;
    case COMM_GLOO: return COMM_GLOO;
    case COMM_AUTO:
        if (on_gpu && comm_nccl_available(why, sizeof why)) return COMM_NCCL;
        return COMM_SHM;
    case COMM_NCCL:
        if (!on_gpu) {
            snprintf(err, errlen, "--comm nccl needs the CUDA backend (GPU buffers): "
                     "use --comm shm (or gloo, auto) with the CPU backend");
            return -1;
        }
        if (!comm_nccl_available(why, sizeof why)) {
            snprintf(err, errlen, "--comm nccl: %s; use --comm shm for ranks of one node", why);
            return -1;
        }
        return COMM_NCCL;
    }
    snprintf(err, errlen, "unknown --comm value %d: use auto, shm, gloo or nccl", (int)requested);
    return -1;
}

/* ---- set-up ---- */

int comm_init(comm_t **out, const comm_config_t *cfg, char *err, size_t errlen) {
    *out = NULL;
    if (cfg->n < 1 || cfg->n > COMM_MAX_RANKS) {
        snprintf(err, errlen, "comm %s: group size %d out of range 1..%d", cfg->name ? cfg->name : "?",
                 cfg->n, COMM_MAX_RANKS);
        return -EINVAL;
    }
    if (cfg->index < 0 || cfg->index >= cfg->n) {
        snprintf(err, errlen, "comm %s: index %d outside the group of %d", cfg->name ? cfg->name : "?",
                 cfg->index, cfg->n);
        return -EINVAL;
    }
    if (!cfg->name || !cfg->name[0] || strlen(cfg->name) >= 64) {
        snprintf(err, errlen, "comm: a group name of 1..63 bytes is required (e.g. \"shard.3\")");
        return -EINVAL;
    }
    for (const char *p = cfg->name; *p; p++)
        if (!(*p == '.' || *p == '-' || *p == '_' || (*p >= '0' && *p <= '9') ||
              (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z'))) {
            snprintf(err, errlen, "comm: group name \"%s\" may hold only letters, digits, '.', '-', '_'",
                     cfg->name);
            return -EINVAL;
        }
    const comm_ops_t *ops;
    if (cfg->kind == COMM_SHM) ops = &comm_shm_ops;
    else if (cfg->kind == COMM_NCCL) ops = &comm_nccl_ops;
    else if (cfg->kind == COMM_GLOO) ops = &comm_gloo_ops;
    else {
        snprintf(err, errlen, "comm %s: backend %s must be resolved with comm_select first",
                 cfg->name, comm_kind_name(cfg->kind));
        return -EINVAL;
    }
    comm_t *c = calloc(1, sizeof *c);
    if (!c) goto oom;
    c->ranks = malloc(sizeof(int) * (size_t)cfg->n);
    if (!c->ranks) goto oom;
    c->ops = ops;
    snprintf(c->name, sizeof c->name, "%s", cfg->name);
    c->n = cfg->n;
    c->index = cfg->index;
    for (int i = 0; i < cfg->n; i++) c->ranks[i] = cfg->ranks ? cfg->ranks[i] : i;
    c->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : COMM_DEFAULT_TIMEOUT_S;
    c->next_seq = 1;
    int rc = ops->init(c, cfg, err, errlen);
    if (rc) {
        free(c->ranks);
        free(c);
        return rc;
    }
    *out = c;
    return 0;
oom:
    if (c) free(c->ranks);
    free(c);
    snprintf(err, errlen, "comm %s: out of memory", cfg->name);
    return -ENOMEM;
}

/* ---- accounting ---- */

double comm_wait_seconds(void) { return comm_host_wait_seconds() + comm_nccl_stall_seconds(); }

/* ---- node identity ---- */

int comm_node_id(const char *dir, char *out, size_t outlen, char *err, size_t errlen) {
    const char *d = dir && dir[0] ? dir : "/tmp";
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
    }
    boot[strcspn(boot, "\r\n")] = 0;
    if (!boot[0]) {
        snprintf(err, errlen, "cannot read /proc/sys/kernel/random/boot_id: is /proc mounted?");
        return -ENOENT;
    }
    struct stat sb;
    if (stat(d, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
        int e = errno ? errno : ENOTDIR;
        snprintf(err, errlen, "--comm-dir %s: %s: create it, or name a directory every rank of the node "
                 "shares (e.g. the directory of ballastd's socket, mounted into each container)", d,
                 S_ISDIR(sb.st_mode) ? strerror(e) : "not a directory");
        return -e;
    }
    snprintf(out, outlen, "boot %s dir %llx:%llx", boot, (unsigned long long)sb.st_dev, (unsigned long long)sb.st_ino);
    return 0;
}
