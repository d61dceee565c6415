/* check_elementwise.c: the small table ops of the CUDA backend (residual
 * add in bf16, fp32 scale, fp32 -> bf16 conversion, bf16 read-back) against
 * the CPU oracle. */
#include "tests/gpu/gpucheck.h"

static void run(size_t n) {
    if (!gc_case("n%zu", n)) return;
    float *a = gc_host(n), *b = gc_host(n), *s = gc_host(n);
    gc_rand(a, n, -4, 4); gc_rand(b, n, -4, 4); gc_rand(s, n, -100, 100);
    gc_round_bf16(a, n); gc_round_bf16(b, n);
    float *sum = gc_host(n), *sc = gc_host(n), *conv = gc_host(n);
    GC.cpu->add(sum, a, b, n);
    memcpy(sc, s, n * 4);
    GC.cpu->scale(sc, 0.37f, n);
    memcpy(conv, s, n * 4);
    gc_round_bf16(conv, n);
    act_t *ga = gc_dev_act(a, n), *gb = gc_dev_act(b, n), *gsum = gc_dev_act(a, n), *gconv = gc_dev_act(a, n);
    float *gs = gc_dev_f32(s, n), *gsc = gc_dev_f32(s, n);
    gc_poison_act(gsum, n); gc_poison_act(gconv, n);
    GC.gpu->add(gsum, ga, gb, n);
    GC.gpu->scale(gsc, 0.37f, n);
    GC.gpu->to_act(gconv, gs, n);
    float *hsum = gc_get_act(gsum, n), *hsc = gc_get_f32(gsc, n), *hconv = gc_get_act(gconv, n);
    gc_compare("add", hsum, sum, n, GC_BF16_TOL);
    gc_compare("scale (fp32)", hsc, sc, n, GC_F32_TOL);
    gc_compare("to_act", hconv, conv, n, GC_BF16_TOL);
    act_t *ds[] = { ga, gb, gsum, gconv };
    for (int i = 0; i < 4; i++) GC.gpu->free(ds[i]);
    GC.gpu->free(gs); GC.gpu->free(gsc);
    float *hs[] = { a, b, s, sum, sc, conv, hsum, hsc, hconv };
    for (int i = 0; i < 9; i++) free(hs[i]);
}

int main(void) {
    gc_init("elementwise");
    run(1);
    run(1001);
    run(1 << 20);
    return gc_done();
}
