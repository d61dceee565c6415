/* check_rmsnorm.c: RMSNorm forward (bf16 out, fp32 1/rms) and backward
 * (dx accumulated in bf16, dw accumulated in fp32) against the CPU oracle. */
#include "tests/gpu/gpucheck.h"

static void run(int N, int D) {
    if (!gc_case("N%d_D%d", N, D)) return;
    size_t n = (size_t)N * D;
    const float eps = 1e-5f;
    float *x = gc_host(n), *w = gc_host(D), *g = gc_host(n), *dx0 = gc_host(n), *dw0 = gc_host(D);
    gc_rand(x, n, -2, 2); gc_rand(w, D, 0.5f, 1.5f); gc_rand(g, n, -1, 1); gc_rand(dx0, n, -1, 1); gc_rand(dw0, D, -1, 1);
    gc_round_bf16(x, n); gc_round_bf16(w, D); gc_round_bf16(g, n); gc_round_bf16(dx0, n);
    float *out = gc_host(n), *rstd = gc_host(N), *dx = gc_host(n), *dw = gc_host(D);
    memcpy(dx, dx0, n * 4); memcpy(dw, dw0, (size_t)D * 4);
    GC.cpu->rmsnorm_fwd(out, rstd, x, w, N, D, eps);
    GC.cpu->rmsnorm_bwd(dx, dw, g, x, w, rstd, N, D);

    act_t *gx = gc_dev_act(x, n), *gw = gc_dev_act(w, D), *gg = gc_dev_act(g, n), *gout = gc_dev_act(out, n);
    act_t *gdx = gc_dev_act(dx0, n);
    float *grstd = gc_dev_f32(rstd, N), *gdw = gc_dev_f32(dw0, D);
    gc_poison_act(gout, n);
    gc_poison_f32(grstd, N);
    GC.gpu->rmsnorm_fwd(gout, grstd, gx, gw, N, D, eps);
    GC.gpu->rmsnorm_bwd(gdx, gdw, gg, gx, gw, grstd, N, D);
    float *hout = gc_get_act(gout, n), *hr = gc_get_f32(grstd, N), *hdx = gc_get_act(gdx, n), *hdw = gc_get_f32(gdw, D);
    gc_compare("out", hout, out, n, GC_BF16_TOL);
    gc_compare("rstd (fp32)", hr, rstd, N, GC_F32_TOL);
    gc_compare("dx (accumulated)", hdx, dx, n, GC_BF16_TOL);
    gc_compare("dw (fp32, accumulated)", hdw, dw, D, GC_F32_TOL);
    GC.gpu->free(gx); GC.gpu->free(gw); GC.gpu->free(gg); GC.gpu->free(gout); GC.gpu->free(gdx);
    GC.gpu->free(grstd); GC.gpu->free(gdw);
    float *hs[] = { x, w, g, dx0, dw0, out, rstd, dx, dw, hout, hr, hdx, hdw };
    for (int i = 0; i < 13; i++) free(hs[i]);
}

int main(void) {
    gc_init("rmsnorm");
    run(1, 8);
    run(17, 100);
    run(64, 2048);
    run(300, 4096);
    run(2049, 576);
    return gc_done();
}
