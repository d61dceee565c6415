/* gloo_engine.h: the C surface of the Gloo adapter (gloo_engine.cc), private to
 * workers/comm/: one Gloo context over TCP for one group, rendezvoused
 * through our key/value store (services/rendezvous), and Gloo's blocking
 * collectives on raw bytes and fp32. gloo.c builds the comm table on it.
 *
 * Every function catches Gloo's C++ exceptions and returns 0 or a negative
 * errno (-ETIMEDOUT, -EPIPE for a peer that closed its connection, -EIO)
 * with a message in err. After an error the context is unusable. */
#ifndef BALLAST_COMM_GLOO_ENGINE_H
#define BALLAST_COMM_GLOO_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "services/rendezvous/rdzv.h"

typedef struct gloo_engine gloo_engine_t;

typedef struct {
    rdzv_client_t *rdzv;      /* the store: keys "<prefix><i>" carry addresses */
    const char *prefix;       /* e.g. "comm/shard.0/gloo/" */
    const char *name;         /* group name, for messages */
    int n, index;             /* group size, this rank's index */
    const int *ranks;         /* global ranks of the group (n), for messages */
    double setup_timeout_s;   /* how long to wait for every peer's address and connection */
    double timeout_s;         /* per collective */
    const char *hostname;     /* address to listen on and publish ("10.0.0.2"); NULL: iface */
    const char *iface;        /* network interface instead of hostname; NULL: neither */
} gloo_engine_opts_t;

int gloo_engine_open(gloo_engine_t **out, const gloo_engine_opts_t *o, char *err, size_t errlen);
void gloo_engine_close(gloo_engine_t *g);

/* buf (count fp32) = elementwise sum over the group, the same bits on every
 * rank. tag: distinct for collectives that could overlap (we run one at a
 * time, so any value). */
int gloo_engine_all_reduce_f32(gloo_engine_t *g, float *buf, size_t count, uint32_t tag,
                               char *err, size_t errlen);

/* out (n * bytes) = the in buffers (bytes each) of group index 0..n-1. */
int gloo_engine_all_gather(gloo_engine_t *g, const void *in, void *out, size_t bytes, uint32_t tag,
                           char *err, size_t errlen);

/* buf (bytes) of group index root into every rank's buf. */
int gloo_engine_broadcast(gloo_engine_t *g, void *buf, size_t bytes, int root, uint32_t tag,
                          char *err, size_t errlen);

int gloo_engine_barrier(gloo_engine_t *g, uint32_t tag, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
