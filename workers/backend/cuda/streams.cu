/* streams.cu: the backend's four streams and a pool of events between them.
 *
 * compute runs every table op; comm is for collectives (NCCL takes it as
 * its stream); copy (device to host) and copy_in (host to device) move
 * offloaded activations and optimizer state (the table's xfer ops). Work
 * crosses streams only through events (record on the producer, wait on the
 * consumer), never through host synchronization, so the four overlap.
 * The streams are created non-blocking so the legacy default stream does
 * not serialize them. Single host thread (backend_cuda.h). */
#include "workers/backend/cuda/common.cuh"

/* ---- state ---- */

static cudaStream_t g_streams[CUDA_NSTREAMS];
static bool g_ready;

#define EVENT_POOL 256
static cudaEvent_t g_free_events[EVENT_POOL];
static int g_nfree;

/* Called once by backend_cuda() after the device is selected. */
void cuda_streams_init(void) {
    if (g_ready) return;
    int lo = 0, hi = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    /* collectives and copies get the greatest priority, compute the least:
     * a collective's or a copy's blocks are scheduled as soon as what they
     * wait for is done instead of queueing behind compute that does not
     * feed them (NCCL's communicator streams are made the same way,
     * workers/comm/nccl.c); compute fills every SM they leave */
    CUDA_CHECK(cudaStreamCreateWithPriority(&g_streams[CUDA_STREAM_COMPUTE], cudaStreamNonBlocking, lo));
    CUDA_CHECK(cudaStreamCreateWithPriority(&g_streams[CUDA_STREAM_COMM], cudaStreamNonBlocking, hi));
    CUDA_CHECK(cudaStreamCreateWithPriority(&g_streams[CUDA_STREAM_COPY], cudaStreamNonBlocking, hi));
    CUDA_CHECK(cudaStreamCreateWithPriority(&g_streams[CUDA_STREAM_COPY_IN], cudaStreamNonBlocking, hi));
    g_ready = true;
}

cudaStream_t cuda_compute_stream(void) { return g_streams[CUDA_STREAM_COMPUTE]; }

/* ---- public ---- */

extern "C" void *cuda_stream(cuda_stream_id_t s) { return (void *)g_streams[s]; }

extern "C" int cuda_stream_priority(cuda_stream_id_t s, int *least, int *greatest) {
    int p = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(least, greatest));
    CUDA_CHECK(cudaStreamGetPriority(g_streams[s], &p));
    return p;
}

extern "C" void cuda_sync(void) {
    for (int i = 0; i < CUDA_NSTREAMS; i++)
        if (g_streams[i]) CUDA_CHECK(cudaStreamSynchronize(g_streams[i]));
}

extern "C" void *cuda_event_record(cuda_stream_id_t s) {
    cudaEvent_t e;
    if (g_nfree > 0) e = g_free_events[--g_nfree];
    else CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(e, g_streams[s]));
    return (void *)e;
}

extern "C" void cuda_stream_wait_event(cuda_stream_id_t waiter, void *event) {
    CUDA_CHECK(cudaStreamWaitEvent(g_streams[waiter], (cudaEvent_t)event, 0));
}

extern "C" void cuda_event_sync(void *event) { CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)event)); }

/* A released event may still be pending: reuse is safe because a later
 * record replaces its captured work, as CUDA specifies. */
extern "C" void cuda_event_release(void *event) {
    if (g_nfree < EVENT_POOL) g_free_events[g_nfree++] = (cudaEvent_t)event;
    else CUDA_CHECK(cudaEventDestroy((cudaEvent_t)event));
}

extern "C" void cuda_copy_h2d_async(void *dst, const void *host_src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, g_streams[CUDA_STREAM_COPY]));
}

extern "C" void cuda_copy_d2h_async(void *host_dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, g_streams[CUDA_STREAM_COPY]));
}

extern "C" void *cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

extern "C" void cuda_host_free(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

/* ---- the table's xfer ops (backend.h): a copy on its direction's copy
 * stream after the compute queued so far; the handle is the event recorded
 * after it. ---- */

static struct be_xfer *xfer(cuda_stream_id_t s, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    void *after = cuda_event_record(CUDA_STREAM_COMPUTE);
    cuda_stream_wait_event(s, after);
    cuda_event_release(after); /* the wait took its state; reuse is safe */
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, g_streams[s]));
    return (struct be_xfer *)cuda_event_record(s);
}

struct be_xfer *cuda_xfer_to_host(void *host_dst, const void *src, size_t bytes) {
    return xfer(CUDA_STREAM_COPY, host_dst, src, bytes, cudaMemcpyDeviceToHost);
}

struct be_xfer *cuda_xfer_from_host(void *dst, const void *host_src, size_t bytes) {
    return xfer(CUDA_STREAM_COPY_IN, dst, host_src, bytes, cudaMemcpyHostToDevice);
}

void cuda_xfer_order(struct be_xfer *x) {
    if (x) cuda_stream_wait_event(CUDA_STREAM_COMPUTE, (void *)x);
}

void cuda_xfer_wait(struct be_xfer *x) {
    if (!x) return;
    cuda_event_sync((void *)x);
    cuda_event_release((void *)x);
}

bool cuda_xfer_done(struct be_xfer *x) {
    if (!x) return true;
    cudaError_t e = cudaEventQuery((cudaEvent_t)(void *)x);
    if (e == cudaErrorNotReady) return false;
    CUDA_CHECK(e);
    return true;
}

void *cuda_compute_stream_ptr(void) { return (void *)g_streams[CUDA_STREAM_COMPUTE]; }
