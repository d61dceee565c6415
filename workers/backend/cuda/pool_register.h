/* pool_register.h: make ballastd's pool DMA-able for the GPU.
 *
 * In shared-memory mode the worker maps the pool segments of ballastd
 * (workers/offload/client.h); the offload layer hands them to the backend's
 * host_register (workers/backend/backend.h), and pool_register() registers them
 * once with cudaHostRegister, so device<->pool copies run as DMA from pinned
 * memory at link speed instead of being staged through a driver bounce
 * buffer. A segment the driver refuses whole is registered in chunks
 * (1 GiB, then 128 MiB). When registration still fails (memlock limits, a
 * driver without the feature), the pool stays usable with pageable copies:
 * one warning says so and why, and pool_registered() is false.
 *
 * pool_copy_async() splits a copy at chunk boundaries, so every piece lies
 * inside one registration. C header, usable from C11 and CUDA C++. */
#ifndef BALLAST_POOL_REGISTER_H
#define BALLAST_POOL_REGISTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct be_pinned pool_reg_t;

#define POOL_REG_CHUNK_BIG (1ull << 30)    /* first chunk size when a segment is refused whole */
#define POOL_REG_CHUNK_SMALL (128ull << 20) /* second chunk size */

/* Register n segments (base, bytes) on the current CUDA device. *out gets a
 * handle on 0, also when registration failed and copies stay pageable (one
 * log_warn then; pool_registered() is false). Returns -ENODEV (no usable
 * GPU), -EINVAL (a NULL or zero-length segment) or -ENOMEM with a message
 * in err; then *out is NULL. The segments must stay mapped until
 * pool_unregister. */
int pool_register(pool_reg_t **out, const be_range_t *segs, uint32_t n, char *err, size_t errlen);

/* Unregister everything pool_register registered and free the handle.
 * NULL is fine. Call before the segments are unmapped (oc_close). */
void pool_unregister(pool_reg_t *r);

/* Whether the whole pool is pinned (registered). */
bool pool_registered(const pool_reg_t *r);

/* Registrations made (1 per segment unless chunked), and the size of the
 * largest one, bytes: for the start-up log and the checks. */
uint32_t pool_registrations(const pool_reg_t *r);
uint64_t pool_largest_registration(const pool_reg_t *r);

/* Asynchronous copy between device memory and the pool on `stream` (a
 * cudaStream_t as void *), split at registration boundaries. to_device:
 * host (in the pool, or anywhere when not registered) -> dev; else dev ->
 * host. Returns 0 or -EIO with the CUDA error in err. */
int pool_copy_async(const pool_reg_t *r, void *dev, void *host, size_t bytes, bool to_device, void *stream,
                    char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
