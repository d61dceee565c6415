/* check_streams.c: the streams and the events between them. A result
 * made on the compute stream is copied out on the copy stream after an
 * event wait, and a copy-stream upload is consumed on the compute stream
 * the same way; both must see complete data. Also checks that the streams
 * are distinct, and the table's xfer ops (backend.h): an upload ordered
 * before an add, the sum copied out after it with no host wait between,
 * a chain of both directions at once, and the compute stream accessor. */
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

/* The table's asynchronous copies: h2d of b, add after xfer_order, d2h of
 * the sum queued right behind (ordered after the add by the table), and an
 * unrelated h2d in flight at the same time on the other direction. */
static void run_xfer(size_t n) {
    if (!gc_case("xfer_n%zu", n)) return;
    const backend_t *be = GC.gpu;
    float *a = gc_host(n), *b = gc_host(n), *c = gc_host(n), *ref = gc_host(n), *got = gc_host(n);
    gc_rand(a, n, -4, 4); gc_rand(b, n, -4, 4); gc_rand(c, n, -4, 4);
    gc_round_bf16(a, n); gc_round_bf16(b, n); gc_round_bf16(c, n);
    GC.cpu->add(ref, a, b, n);
    act_t *ga = gc_dev_act(a, n), *gin = gc_dev_act(a, n), *gsum = gc_dev_act(a, n), *gc2 = gc_dev_act(a, n);
    gc_poison_act(gin, n); gc_poison_act(gsum, n); gc_poison_act(gc2, n);
    uint16_t *pin = (uint16_t *)be->host_alloc(n * 2), *pout = (uint16_t *)be->host_alloc(n * 2),
             *pc = (uint16_t *)be->host_alloc(n * 2), *pc_back = (uint16_t *)be->host_alloc(n * 2);
    for (size_t i = 0; i < n; i++) pin[i] = cuda_f32_to_bf16(b[i]), pc[i] = cuda_f32_to_bf16(c[i]);
    memset(pout, 0xff, n * 2);
    be_xfer_t *up = be_xfer_from_host(be, gin, pin, n * 2);
    be_xfer_t *up2 = be_xfer_from_host(be, gc2, pc, n * 2);
    be_xfer_order(be, up);
    be->add(gsum, ga, gin, n);
    be_xfer_t *down = be_xfer_to_host(be, pout, gsum, n * 2);
    be_xfer_order(be, up2);
    be_xfer_t *down2 = be_xfer_to_host(be, pc_back, gc2, n * 2);
    be_xfer_wait(be, down);
    GC.cases++;
    bool done = be_xfer_done(be, up);
    printf("%s - streams/%s an upload ordered before a finished download is done\n", done ? "ok" : "not ok", GC.name);
    if (!done) GC.failed++;
    for (size_t i = 0; i < n; i++) got[i] = cuda_bf16_to_f32(pout[i]);
    gc_compare("xfer: upload, add, download", got, ref, n, GC_BF16_TOL);
    be_xfer_wait(be, down2);
    for (size_t i = 0; i < n; i++) got[i] = cuda_bf16_to_f32(pc_back[i]);
    gc_compare("xfer: both directions at once", got, c, n, 0);
    be_xfer_wait(be, up);
    be_xfer_wait(be, up2);
    GC.cases++;
    bool st = be_stream(be) == cuda_stream(CUDA_STREAM_COMPUTE) &&
              cuda_stream(CUDA_STREAM_COPY) != cuda_stream(CUDA_STREAM_COPY_IN);
    printf("%s - streams/%s the table's stream is the compute stream; copies in and out on their own streams\n",
           st ? "ok" : "not ok", GC.name);
    if (!st) GC.failed++;
    /* collectives and copies ahead of compute: the greatest priority on comm
     * and both copy streams, the least on compute */
    int least = 0, greatest = 0, pr[CUDA_NSTREAMS];
    for (int i = 0; i < CUDA_NSTREAMS; i++) pr[i] = cuda_stream_priority((cuda_stream_id_t)i, &least, &greatest);
    GC.cases++;
    bool prio = least != greatest && pr[CUDA_STREAM_COMPUTE] == least && pr[CUDA_STREAM_COMM] == greatest &&
                pr[CUDA_STREAM_COPY] == greatest && pr[CUDA_STREAM_COPY_IN] == greatest;
    printf("%s - streams/%s comm and copy streams at priority %d (greatest), compute at %d (least): got %d %d %d, "
           "compute %d\n", prio ? "ok" : "not ok", GC.name, greatest, least, pr[CUDA_STREAM_COMM], pr[CUDA_STREAM_COPY],
           pr[CUDA_STREAM_COPY_IN], pr[CUDA_STREAM_COMPUTE]);
    if (!prio) GC.failed++;
    cuda_sync();
    be->host_free(pin); be->host_free(pout); be->host_free(pc); be->host_free(pc_back);
    be->free(ga); be->free(gin); be->free(gsum); be->free(gc2);
    free(a); free(b); free(c); free(ref); free(got);
}

int main(void) {
    gc_init("streams");
    run(1000);
    run(1 << 22);
    run_xfer(1000);
    run_xfer(1 << 22);
    return gc_done();
}
