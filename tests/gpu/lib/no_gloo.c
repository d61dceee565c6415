/* no_gloo.c: comm_gloo_ops for tests/gpu/run.sh's programs. They are built
 * on the GPU machine, which has none of Debian's libraries and so no Gloo;
 * their collectives are NCCL and shared memory (one node). --comm gloo
 * there fails at set-up, naming the reason. */
#include <errno.h>
#include <stdio.h>

#include "workers/comm/impl.h"

static int no_gloo_init(comm_t *c, const comm_config_t *cfg, char *err, size_t errlen) {
    (void)c; (void)cfg;
    snprintf(err, errlen, "this program is built without Gloo (tests/gpu/run.sh's build): use --comm nccl or shm");
    return -ENOSYS;
}

static void no_gloo_destroy(comm_t *c) { (void)c; }

static int no_gloo_start(comm_t *c, comm_req_t *req, char *err, size_t errlen) {
    (void)c; (void)req;
    snprintf(err, errlen, "this program is built without Gloo");
    return -ENOSYS;
}

const comm_ops_t comm_gloo_ops = {
    .name = "gloo",
    .init = no_gloo_init,
    .destroy = no_gloo_destroy,
    .start = no_gloo_start,
};
