/* backend_scrambled.h: a test double of the CPU backend whose memory is
 * not host memory.
 *
 * It is the fp32 CPU backend (backend_cpu) except that every byte of its
 * memory is stored XOR 0x5A: to_host / from_host (and act_to_host) undo and
 * apply the scrambling, so host code that reads or writes backend memory
 * directly, as if it were host memory, gets or leaves wrong bits, the way it
 * would on a GPU. Every compute op unscrambles all live allocations, runs
 * the CPU op and scrambles them again (slow: for tests with tiny models),
 * so training on it gives the CPU backend's bits exactly. alloc and memset0
 * give memory that reads as zeros through to_host; host_alloc is plain host
 * memory; the asynchronous copies are synchronous (no xfer ops). Calls are
 * serialized by one lock, so ops from several threads stay correct.
 *
 * Its host_memory is false, so training on it takes the GPU ranks' paths
 * (collectives behind host staging, checkpoints through the backend's
 * copies) on the CPU. The test build of ballast-worker
 * (tests/lib/worker_test_main.c) uses it with BALLAST_TEST_BACKEND=scrambled. */
#ifndef BALLAST_TESTS_BACKEND_SCRAMBLED_H
#define BALLAST_TESTS_BACKEND_SCRAMBLED_H

#include <stddef.h>

#include "workers/backend/backend.h"

#define BACKEND_SCRAMBLE_BYTE 0x5A

/* The scrambled backend over backend_cpu(threads) (one table per process:
 * the first call's thread count stays). */
const backend_t *backend_scrambled(int threads);

/* Live allocations and their bytes (tests: what is held). */
size_t backend_scrambled_live(size_t *bytes);

#endif
