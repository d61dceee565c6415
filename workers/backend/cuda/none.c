/* none.c: the CUDA entry points of a build without nvcc (CUDA=0, or no
 * toolkit found). libballast_cuda.a holds this file instead of the .cu
 * files then, so callers link the same way and learn at run time that the
 * backend is missing, with the fix. */
#include <stdio.h>

#include "workers/backend/cuda/backend_cuda.h"

static const char NO_CUDA[] = "this build has no CUDA backend (no nvcc at build time, or CUDA=0); rebuild with the "
                              "CUDA toolkit (nvcc on PATH or at /usr/local/cuda), or use --backend cpu";

const backend_t *backend_cuda_open(const backend_spec_t *spec, char *err, size_t errlen) {
    (void)spec;
    snprintf(err, errlen, "--backend cuda: %s", NO_CUDA);
    return NULL;
}

int cuda_device_count(char *why, size_t whylen) {
    if (why) snprintf(why, whylen, "%s", NO_CUDA);
    return 0;
}
