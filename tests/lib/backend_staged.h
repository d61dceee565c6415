/* backend_staged.h: a test double of the CPU backend that behaves, for
 * every caller, like a GPU backend whose memory the host cannot touch.
 *
 * It is backend_cpu()'s table with host_memory false, so the collectives go
 * behind host staging (workers/comm/stage.h) and the offload savers copy
 * through staging buffers instead of computing on ballastd's pool in place;
 * and with asynchronous copies that run as late as a GPU could: each copy
 * runs only at the xfer_order or xfer_wait of its handle or of a later one
 * (in queue order). The memory is still host memory and the copies memcpy,
 * so no number may change against the CPU backend; a missing order or wait
 * gives wrong bits, and a copy never waited for shows in xfer_pending.
 * One host thread. */
#ifndef BALLAST_TESTS_BACKEND_STAGED_H
#define BALLAST_TESTS_BACKEND_STAGED_H

#include <stddef.h>

#include "workers/backend/backend.h"

/* The staged table over backend_cpu(threads) (one table per process: the
 * first call's thread count stays). */
const backend_t *backend_staged(int threads);

#endif
