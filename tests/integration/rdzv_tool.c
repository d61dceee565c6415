/* rdzv_tool.c: a command-line client of the rendezvous store for
 * tests/integration/rdzv.sh.
 *
 *   rdzv_tool ADDR JOB WORLD set KEY HEX          value given in hex (any bytes)
 *   rdzv_tool ADDR JOB WORLD get KEY              prints the value in hex
 *   rdzv_tool ADDR JOB WORLD wait KEY TIMEOUT_S   prints the value in hex
 *   rdzv_tool ADDR JOB WORLD barrier NAME RANK TIMEOUT_S
 *   rdzv_tool ADDR JOB WORLD rank RANK TIMEOUT_S  a rank's bootstrap: rank 0
 *       serves the store in-process on ADDR and publishes "hello"; every rank
 *       waits for it, then barrier "start", then barrier "done"
 *
 * Exit 0 on success; 1 with the error on stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/rendezvous/rdzv.h"

static int unhex(const char *s, unsigned char *out, size_t cap, size_t *len) {
    size_t n = strlen(s);
    if (n % 2 || n / 2 > cap) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (unsigned char)v;
    }
    *len = n / 2;
    return 0;
}

static void print_hex(const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) printf("%02x", ((const unsigned char *)p)[i]);
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: rdzv_tool ADDR JOB WORLD set|get|wait|barrier|rank ARGS\n");
        return 2;
    }
    const char *addr = argv[1], *job = argv[2], *cmd = argv[4];
    int world = atoi(argv[3]);
    char err[RDZV_ERR_LEN];
    rdzv_server_t *srv = NULL;
    if (!strcmp(cmd, "rank") && argc >= 7 && atoi(argv[5]) == 0) {
        rdzv_server_opts_t o = { .listen = addr, .job_id = job, .world = world };
        if (!(srv = rdzv_server_start(&o, NULL, err, sizeof err))) {
            fprintf(stderr, "rdzv_tool: %s\n", err);
            return 1;
        }
    }
    rdzv_client_t *c = rdzv_client_open(addr, job, world, err, sizeof err);
    if (!c) {
        fprintf(stderr, "rdzv_tool: %s\n", err);
        return 1;
    }
    int rc = 2;
    void *v = NULL;
    size_t len = 0;
    if (!strcmp(cmd, "set") && argc == 7) {
        static unsigned char buf[1 << 20];
        if (unhex(argv[6], buf, sizeof buf, &len)) {
            fprintf(stderr, "rdzv_tool: value must be hex\n");
            return 2;
        }
        rc = rdzv_set(c, argv[5], buf, len, true, 10, err, sizeof err);
    } else if (!strcmp(cmd, "get") && argc == 6) {
        rc = rdzv_get(c, argv[5], &v, &len, 10, err, sizeof err);
        if (!rc) print_hex(v, len);
    } else if (!strcmp(cmd, "wait") && argc == 7) {
        rc = rdzv_wait(c, argv[5], &v, &len, atof(argv[6]), err, sizeof err);
        if (!rc) print_hex(v, len);
    } else if (!strcmp(cmd, "barrier") && argc == 8) {
        rc = rdzv_barrier(c, argv[5], atoi(argv[6]), world, atof(argv[7]), err, sizeof err);
    } else if (!strcmp(cmd, "rank") && argc == 7) {
        int rank = atoi(argv[5]);
        double to = atof(argv[6]);
        if (rank == 0) rc = rdzv_set(c, "hello", "from rank 0", 11, true, to, err, sizeof err);
        else rc = 0;
        if (!rc) rc = rdzv_wait(c, "hello", &v, &len, to, err, sizeof err);
        if (!rc && (len != 11 || memcmp(v, "from rank 0", 11))) {
            snprintf(err, sizeof err, "key hello holds the wrong value");
            rc = 1;
        }
        if (!rc) rc = rdzv_barrier(c, "start", rank, world, to, err, sizeof err);
        /* rank 0 serves until every rank has left "start" */
        if (!rc) rc = rdzv_barrier(c, "done", rank, world, to, err, sizeof err);
        if (!rc) printf("rank %d ok\n", rank);
    } else {
        fprintf(stderr, "rdzv_tool: bad arguments for %s\n", cmd);
    }
    free(v);
    if (rc && rc != 2)
        fprintf(stderr, "rdzv_tool: %s%s\n", rc == -EINVAL ? "INVALID_ARGUMENT: " : rc == -ENOSPC ? "RESOURCE_EXHAUSTED: " : "", err);
    rdzv_client_close(c);
    rdzv_server_stop(srv);
    return rc == 0 ? 0 : rc == 2 ? 2 : 1;
}
