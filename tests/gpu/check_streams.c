/* check_streams.c: the three streams and the events between them. A result
 * made on the compute stream is copied out on the copy stream after an
 * event wait, and a copy-stream upload is consumed on the compute stream
 * the same way; both must see complete data. Also checks that the three
 * streams are distinct. */
#include "tests/gpu/gpucheck.h"

static void run(size_t n) {
    if (!gc_case("events_n%zu", n)) return;
    float *a = gc_host(n), *b = gc_host(n);
    gc_rand(a, n, -4, 4); gc_rand(b, n, -4, 4);
    gc_round_bf16(a, n); gc_round_bf16(b, n);
    float *ref = gc_host(n);
    GC.cpu->add(ref, a, b, n);
    act_t *ga = gc_dev_act(a, n), *gb = gc_dev_act(b, n), *gsum = gc_dev_act(a, n), *gin = gc_dev_act(a, n);
    gc_poison_act(gsum, n); gc_poison_act(gin, n);
    /* upload b on the copy stream; compute waits for it */
    uint16_t *pin = (uint16_t *)cuda_host_alloc(n * 2), *pout = (uint16_t *)cuda_host_alloc(n * 2);
    for (size_t i = 0; i < n; i++) pin[i] = cuda_f32_to_bf16(b[i]);
    cuda_copy_h2d_async(gin, pin, n * 2);
    void *up = cuda_event_record(CUDA_STREAM_COPY);
    cuda_stream_wait_event(CUDA_STREAM_COMPUTE, up);
    GC.gpu->add(gsum, ga, gin, n);
    void *done = cuda_event_record(CUDA_STREAM_COMPUTE);
    cuda_stream_wait_event(CUDA_STREAM_COPY, done);
    memset(pout, 0xff, n * 2);
    cuda_copy_d2h_async(pout, gsum, n * 2);
    void *out = cuda_event_record(CUDA_STREAM_COPY);
    cuda_event_sync(out);
    float *got = gc_host(n);
    for (size_t i = 0; i < n; i++) got[i] = cuda_bf16_to_f32(pout[i]);
    gc_compare("compute -> copy through events", got, ref, n, GC_BF16_TOL);
    cuda_event_release(up); cuda_event_release(done); cuda_event_release(out);
    /* distinct streams */
    GC.cases++;
    bool distinct = cuda_stream(CUDA_STREAM_COMPUTE) != cuda_stream(CUDA_STREAM_COMM) &&
                    cuda_stream(CUDA_STREAM_COMPUTE) != cuda_stream(CUDA_STREAM_COPY) &&
                    cuda_stream(CUDA_STREAM_COMM) != cuda_stream(CUDA_STREAM_COPY);
    printf("%s - streams/%s three distinct streams\n", distinct ? "ok" : "not ok", GC.name);
    if (!distinct) GC.failed++;
    cuda_sync();
    cuda_host_free(pin); cuda_host_free(pout);
    GC.gpu->free(ga); GC.gpu->free(gb); GC.gpu->free(gsum); GC.gpu->free(gin);
    free(a); free(b); free(ref); free(got);
}

int main(void) {
    gc_init("streams");
    run(1000);
    run(1 << 22);
    return gc_done();
}
