/* ballastd_fixture.h: an in-process ballastd for unit tests (the store,
 * the session manager and the gRPC service of services/offload on a Unix
 * socket in a fresh temporary directory), as static functions for
 * Criterion programs. Needs tests/unit/helpers.h. */
#ifndef BALLAST_TESTS_BALLASTD_FIXTURE_H
#define BALLAST_TESTS_BALLASTD_FIXTURE_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "rpc.h"
#include "services/offload/rpc_service.h"
#include "services/offload/session.h"
#include "services/offload/store.h"
#include "tests/unit/helpers.h"

typedef struct {
    char dir[64], sock[96], fdsock[96], addr[112]; /* temp dir, its sockets, "unix:" + sock */
    store_t *store;
    sess_mgr_t *sm;
    rpc_server_t *srv;
    offload_svc_t svc;
} svc_t;

/* Start a ballastd with a 16 MiB pool (not locked) and leases of lease
 * seconds, at most max_sessions sessions of at most max_quota bytes each
 * (0: the default); tag names the temporary directory. */
static inline void svc_start_with(svc_t *t, const char *tag, double lease, uint32_t max_sessions,
                                  uint64_t max_quota) {
    memset(t, 0, sizeof *t);
    log_set_level(LOG_WARN);
    th_tmpdir(t->dir, sizeof t->dir, NULL, tag);
    snprintf(t->sock, sizeof t->sock, "%s/s.sock", t->dir);
    snprintf(t->fdsock, sizeof t->fdsock, "%s/s.sock.fd", t->dir);
    snprintf(t->addr, sizeof t->addr, "unix:%s", t->sock);
    store_config_t sc;
    store_config_default(&sc);
    sc.pool.pool_bytes = 16u << 20;
    sc.pool.mlock = false;
    char err[256];
    cr_assert_eq(store_open(&t->store, &sc, err, sizeof err), 0, "%s", err);
    sess_config_t cfg = { .lease_s = lease, .max_quota = max_quota, .max_sessions = max_sessions,
                          .ring_capacity = 64, .fd_socket = t->fdsock };
    cr_assert_eq(sess_mgr_open(&t->sm, &cfg, t->store, err, sizeof err), 0, "%s", err);
    t->srv = rpc_server_new(NULL, err, sizeof err);
    cr_assert_not_null(t->srv, "%s", err);
    t->svc = (offload_svc_t){ t->store, t->sm, t->srv, t->fdsock, 4u << 20, 0, NULL };
    cr_assert_eq(offload_svc_register(t->srv, &t->svc, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_listen(t->srv, t->addr, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(rpc_server_start(t->srv, err, sizeof err), 0, "%s", err);
}

/* Stop it and remove its directory. */
static inline void svc_stop(svc_t *t) {
    rpc_server_stop(t->srv, 1000);
    rpc_server_free(t->srv);
    sess_mgr_close(t->sm);
    store_close(t->store);
    th_rm_rf(t->dir);
}

#endif
