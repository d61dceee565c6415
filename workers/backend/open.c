/* open.c: backend_open and backend_device_count (backend.h): the one place
 * that turns the worker's --backend flags into a table. The CUDA part comes
 * from libballast_cuda.a: the real backend when the build found nvcc,
 * otherwise workers/backend/cuda/none.c, which says how to get one. */
#include "workers/backend/backend.h"

#include <stdio.h>

#include "workers/backend/cuda/backend_cuda.h"

const backend_t *backend_open(const backend_spec_t *spec, char *err, size_t errlen) {
    switch (spec->kind) {
    case BACKEND_CPU:
        if (spec->fp8) {
            snprintf(err, errlen, "--precision fp8 runs the matmuls on FP8 tensor cores: it needs --backend cuda "
                     "(the CPU backend is fp32)");
            return NULL;
        }
        if (spec->attention == BE_ATTENTION_CUDNN) {
            snprintf(err, errlen, "--attention cudnn runs cuDNN's fused attention on a GPU: it needs --backend cuda "
                     "(the CPU backend has its own fp32 attention only); use --attention auto or own");
            return NULL;
        }
        return backend_cpu(spec->threads);
    case BACKEND_CUDA:
        return backend_cuda_open(spec, err, errlen);
    }
    snprintf(err, errlen, "unknown backend %d", (int)spec->kind);
    return NULL;
}

int backend_device_count(backend_kind_t kind, char *why, size_t whylen) {
    if (kind == BACKEND_CPU) return 1;
    return cuda_device_count(why, whylen);
}
