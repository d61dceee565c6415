/* check_gemm.c: the CUDA backend's cuBLASLt matmuls (forward, dx
 * overwritten and accumulated, dw accumulated in fp32) against the CPU
 * oracle, for (out, in) weights. */
#include "tests/gpu/gpucheck.h"

static void run(int N, int I, int O, bool dx_acc) {
    if (!gc_case("N%d_I%d_O%d%s", N, I, O, dx_acc ? "_acc" : "")) return;
    size_t nx = (size_t)N * I, nw = (size_t)O * I, no = (size_t)N * O;
    float *x = gc_host(nx), *w = gc_host(nw), *dout = gc_host(no), *dx0 = gc_host(nx), *dw0 = gc_host(nw);
    gc_rand(x, nx, -1, 1); gc_rand(w, nw, -1, 1); gc_rand(dout, no, -1, 1); gc_rand(dx0, nx, -1, 1); gc_rand(dw0, nw, -1, 1);
    gc_round_bf16(x, nx); gc_round_bf16(w, nw); gc_round_bf16(dout, no); gc_round_bf16(dx0, nx);
    /* CPU */
    float *out = gc_host(no), *dx = gc_host(nx), *dw = gc_host(nw);
    memcpy(dx, dx0, nx * 4); memcpy(dw, dw0, nw * 4);
    GC.cpu->matmul_fwd(out, x, w, N, I, O);
    GC.cpu->matmul_bwd(dx, dw, dout, x, w, N, I, O, dx_acc);
    /* GPU */
    act_t *gx = gc_dev_act(x, nx), *gw = gc_dev_act(w, nw), *gd = gc_dev_act(dout, no);
    act_t *gout = gc_dev_act(out, no), *gdx = gc_dev_act(dx0, nx);
    float *gdw = gc_dev_f32(dw0, nw);
    gc_poison_act(gout, no);
    if (!dx_acc) gc_poison_act(gdx, nx);
    GC.gpu->matmul_fwd(gout, gx, gw, N, I, O);
    GC.gpu->matmul_bwd(gdx, gdw, gd, gx, gw, N, I, O, dx_acc);
    float *hout = gc_get_act(gout, no), *hdx = gc_get_act(gdx, nx), *hdw = gc_get_f32(gdw, nw);
    gc_compare("out", hout, out, no, GC_BF16_TOL);
    gc_compare("dx", hdx, dx, nx, GC_BF16_TOL);
    gc_compare("dw (fp32)", hdw, dw, nw, GC_F32_TOL);
    act_t *ds[] = { gx, gw, gd, gout, gdx };
    for (int i = 0; i < 5; i++) GC.gpu->free(ds[i]);
    GC.gpu->free(gdw);
    float *hs[] = { x, w, dout, dx0, dw0, out, dx, dw, hout, hdx, hdw };
    for (int i = 0; i < 11; i++) free(hs[i]);
}

int main(void) {
    gc_init("gemm");
    run(1, 8, 16, false);
    run(37, 64, 40, false);
    run(37, 64, 40, true);
    run(129, 256, 72, true);
    run(512, 2048, 512, false);
    run(1000, 512, 1032, true);
    run(333, 1024, 4096, false);
    return gc_done();
}
