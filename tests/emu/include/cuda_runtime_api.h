/* cuda_runtime_api.h (emulation tier): what cuDNN's headers take from the
 * runtime API (cudaStream_t, and cudaGraph_t for cudnnBackendPopulateCudaGraph,
 * which the backend never calls). The emulated runtime is cuda_runtime.h. */
#ifndef BALLAST_EMU_CUDA_RUNTIME_API_H
#define BALLAST_EMU_CUDA_RUNTIME_API_H

#include "cuda_runtime.h"

typedef struct CUgraph_st *cudaGraph_t;

#endif
