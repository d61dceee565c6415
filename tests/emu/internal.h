/* internal.h: what the emulator's own files (sched.cc, runtime.cc) share;
 * nothing outside tests/emu includes it. */
#ifndef BALLAST_EMU_INTERNAL_H
#define BALLAST_EMU_INTERNAL_H

#include <cuda_runtime.h>

#include <stdint.h>

namespace emu {

/* The run's seed (BALLAST_EMU_SEED, else drawn and printed once). */
uint64_t seed(void);
/* A generator per purpose, seeded from the run's seed and a counter, so a
 * run replays exactly from its seed. */
struct rng {
    uint64_t s;
    explicit rng(uint64_t stream);
    uint64_t next(void);
    unsigned below(unsigned n) { return (unsigned)(next() % n); }
};

/* The calling host thread's last error (cudaGetLastError). */
void set_error(cudaError_t e);

/* Run one grid now (called when its turn on the stream comes). */
void run_grid(const char *name, dim3 grid, dim3 block, size_t smem, size_t smem_limit,
              const std::function<void()> &body, uint64_t launch_no);

/* The limits the emulated device enforces (runtime.cc). */
size_t smem_default(void); /* per block without cudaFuncSetAttribute */
size_t smem_optin(void);   /* the most cudaFuncSetAttribute may allow */
size_t max_dynamic_smem(const void *kernel); /* its cudaFuncSetAttribute, else smem_default() */

} // namespace emu

#endif
