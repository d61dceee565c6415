/* check_swiglu.c: SwiGLU forward and backward on bf16 against the CPU
 * oracle, on the vectorised path (n a multiple of 8, aligned) and the
 * scalar one (odd n, or a pointer one element in). */
#include "tests/gpu/gpucheck.h"

static void run(size_t n, int offset) {
    if (!gc_case("n%zu_off%d", n, offset)) return;
    size_t m = n + offset;
    float *g = gc_host(m), *u = gc_host(m), *dh = gc_host(m);
    gc_rand(g, m, -6, 6); gc_rand(u, m, -2, 2); gc_rand(dh, m, -1, 1);
    gc_round_bf16(g, m); gc_round_bf16(u, m); gc_round_bf16(dh, m);
    float *h = gc_host(m), *dg = gc_host(m), *du = gc_host(m);
    GC.cpu->swiglu_fwd(h + offset, g + offset, u + offset, n);
    GC.cpu->swiglu_bwd(dg + offset, du + offset, dh + offset, g + offset, u + offset, n);
    act_t *gg = gc_dev_act(g, m), *gu = gc_dev_act(u, m), *gdh = gc_dev_act(dh, m);
    act_t *gh = gc_dev_act(g, m), *gdg = gc_dev_act(g, m), *gdu = gc_dev_act(g, m);
    gc_poison_act(gh, m); gc_poison_act(gdg, m); gc_poison_act(gdu, m);
    const backend_t *be = GC.gpu;
    be->swiglu_fwd(be_act_at(be, gh, offset), be_act_at(be, gg, offset), be_act_at(be, gu, offset), n);
    be->swiglu_bwd(be_act_at(be, gdg, offset), be_act_at(be, gdu, offset), be_act_at(be, gdh, offset),
                   be_act_at(be, gg, offset), be_act_at(be, gu, offset), n);
    float *hh = gc_get_act(gh, m), *hdg = gc_get_act(gdg, m), *hdu = gc_get_act(gdu, m);
    gc_compare("h", hh + offset, h + offset, n, GC_BF16_TOL);
    gc_compare("dgate", hdg + offset, dg + offset, n, GC_BF16_TOL);
    gc_compare("dup", hdu + offset, du + offset, n, GC_BF16_TOL);
    act_t *ds[] = { gg, gu, gdh, gh, gdg, gdu };
    for (int i = 0; i < 6; i++) be->free(ds[i]);
    float *hs[] = { g, u, dh, h, dg, du, hh, hdg, hdu };
    for (int i = 0; i < 9; i++) free(hs[i]);
}

int main(void) {
    gc_init("swiglu");
    run(1, 0);
    run(7, 0);
    run(1000, 0);
    run(8 * 12345, 0);
    run(1001, 1);
    run(4096 * 8, 1);
    return gc_done();
}
