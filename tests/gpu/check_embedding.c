/* check_embedding.c: embedding forward (row gather, bf16) and backward
 * (fp32 scatter-add with repeated tokens) against the CPU oracle; neither
 * may make the host wait for the device. */
#include "tests/gpu/gpucheck.h"

long cuda_host_waits(void); /* runtime.cu: host waits for a stream so far */

static void run(int N, int D, int V) {
    if (!gc_case("N%d_D%d_V%d", N, D, V)) return;
    size_t nw = (size_t)V * D, no = (size_t)N * D;
    int32_t *tok = (int32_t *)malloc((size_t)N * sizeof(int32_t));
    gc_rand_tokens(tok, N, V);
    float *wte = gc_host(nw), *dout = gc_host(no), *dw0 = gc_host(nw);
    gc_rand(wte, nw, -1, 1); gc_rand(dout, no, -1, 1); gc_rand(dw0, nw, -1, 1);
    gc_round_bf16(wte, nw); gc_round_bf16(dout, no);
    float *out = gc_host(no), *dw = gc_host(nw);
    memcpy(dw, dw0, nw * 4);
    GC.cpu->embedding_fwd(out, tok, wte, N, D);
    GC.cpu->embedding_bwd(dw, dout, tok, N, D);
    int32_t *gt = (int32_t *)gc_dev_bytes(tok, (size_t)N * sizeof(int32_t));
    act_t *gw = gc_dev_act(wte, nw), *gd = gc_dev_act(dout, no), *go = gc_dev_act(out, no);
    float *gdw = gc_dev_f32(dw0, nw);
    gc_poison_act(go, no);
    long w0 = cuda_host_waits();
    GC.gpu->embedding_fwd(go, gt, gw, N, D);
    GC.gpu->embedding_bwd(gdw, gd, gt, N, D);
    long waits = cuda_host_waits() - w0;
    GC.cases++;
    printf("%s - embedding/%s forward and backward queue without a host wait (%ld)\n", waits ? "not ok" : "ok", GC.name,
           waits);
    if (waits) GC.failed++;
    float *ho = gc_get_act(go, no), *hdw = gc_get_f32(gdw, nw);
    gc_compare("fwd", ho, out, no, GC_BF16_TOL);
    gc_compare("bwd dwte (fp32, accumulated)", hdw, dw, nw, GC_F32_TOL);
    GC.gpu->free(gt); GC.gpu->free(gw); GC.gpu->free(gd); GC.gpu->free(go); GC.gpu->free(gdw);
    free(tok); free(wte); free(dout); free(dw0); free(out); free(dw); free(ho); free(hdw);
}

int main(void) {
    gc_init("embedding");
    run(1, 8, 3);
    run(257, 100, 50);
    run(1024, 64, 7);
    run(4096, 2048, 32000);
    return gc_done();
}
