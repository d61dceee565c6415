/* check_rope.c: rotary embedding forward and inverse (backward), in place on
 * bf16, against the CPU oracle, for two thetas. */
#include "tests/gpu/gpucheck.h"

static void run(int B, int T, int nh, int Dh, float theta) {
    if (!gc_case("B%d_T%d_nh%d_Dh%d_theta%g", B, T, nh, Dh, theta)) return;
    size_t n = (size_t)B * T * nh * Dh;
    float *x = gc_host(n), *dx = gc_host(n);
    gc_rand(x, n, -1, 1); gc_rand(dx, n, -1, 1);
    gc_round_bf16(x, n); gc_round_bf16(dx, n);
    act_t *gx = gc_dev_act(x, n), *gdx = gc_dev_act(dx, n);
    GC.cpu->rope_fwd(x, B, T, nh, Dh, theta);
    GC.cpu->rope_bwd(dx, B, T, nh, Dh, theta);
    GC.gpu->rope_fwd(gx, B, T, nh, Dh, theta);
    GC.gpu->rope_bwd(gdx, B, T, nh, Dh, theta);
    float *hx = gc_get_act(gx, n), *hdx = gc_get_act(gdx, n);
    gc_compare("fwd", hx, x, n, GC_BF16_TOL);
    gc_compare("bwd", hdx, dx, n, GC_BF16_TOL);
    GC.gpu->free(gx); GC.gpu->free(gdx);
    free(x); free(dx); free(hx); free(hdx);
}

int main(void) {
    gc_init("rope");
    run(1, 1, 1, 2, 10000.f);
    run(2, 17, 3, 64, 10000.f);
    run(1, 300, 8, 128, 500000.f);
    run(3, 129, 5, 64, 500000.f);
    run(1, 8192, 2, 128, 500000.f);
    return gc_done();
}
