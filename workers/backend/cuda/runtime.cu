/* runtime.cu: what every file of the CUDA backend stands on: launch
 * checks (and --cuda-sync), the scratch buffers ops borrow, the device
 * count, and bf16 rounding on the host. Relies on streams.cu for the
 * compute stream only. */
#define BALLAST_CUDA_WITH_CUBLAS
#include "workers/backend/cuda/common.cuh"

#include <string.h>

/* ---- launch checks ---- */

static bool g_sync; /* --cuda-sync: wait for every kernel and check it */
static cuda_counts_t g_counts;

cuda_counts_t *cuda_counts(void) { return &g_counts; }

/* for the checks (C): how many times the backend has waited for a stream */
extern "C" long cuda_host_waits(void) { return g_counts.host_waits; }

void cuda_host_wait(cudaStream_t s) {
    g_counts.host_waits++;
    CUDA_CHECK(cudaStreamSynchronize(s));
}

extern "C" void cuda_set_sync(bool on) { g_sync = on; }

void cuda_launch_check_at(const char *kernel, const char *file, int line) {
    g_counts.launches++;
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && g_sync) e = cudaStreamSynchronize(cuda_compute_stream());
    if (e == cudaSuccess) return;
    const char *hint = cuda_hint(e);
    fprintf(stderr, "%s:%d: CUDA error %s (%s) launching %s; hint: %s\n", file, line, cudaGetErrorName(e),
            cudaGetErrorString(e), kernel,
            hint ? hint : "rerun with --cuda-sync (BALLAST_CUDA_SYNC=1) to stop at the kernel that failed");
    exit(1);
}

/* ---- scratch ---- */

static void *g_scratch[SCRATCH_NSLOTS];
static size_t g_scratch_cap[SCRATCH_NSLOTS];

void *cuda_scratch(int slot, size_t bytes) {
    if (bytes <= g_scratch_cap[slot]) return g_scratch[slot];
    if (g_scratch[slot]) CUDA_CHECK(cudaFree(g_scratch[slot])); /* synchronizes: in-flight users finish first */
    size_t cap = bytes + bytes / 4 + 256;
    CUDA_CHECK(cudaMalloc(&g_scratch[slot], cap));
    g_scratch_cap[slot] = cap;
    return g_scratch[slot];
}

/* ---- host helpers ---- */

extern "C" uint16_t cuda_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1);                                           /* round to nearest even */
    return (uint16_t)(u >> 16);
}

extern "C" float cuda_bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- devices ---- */

extern "C" int cuda_device_count(char *why, size_t whylen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (why) snprintf(why, whylen, "%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        return 0;
    }
    if (n == 0 && why) snprintf(why, whylen, "no CUDA device");
    return n;
}

