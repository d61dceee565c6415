/* check_ring.c: the ring-attention ops (attn_block_fwd, attn_merge,
 * attn_block_bwd: workers/backend/cuda/ring.cu) against the CPU oracle's,
 * on the chunk pairs of context parallelism: a causal diagonal pair, a
 * whole earlier chunk, and the merge of the two into one row's output;
 * then both pairs' backward from the merged output, accumulating into
 * dq, dk, dv that start from random values. Grouped-query heads, odd
 * chunk lengths, head dims 64 and 128. */
#include "tests/gpu/gpucheck.h"

/* Tolerances as check_attention.c's: the GPU stores every output and the
 * accumulated gradients in bf16 (2^-9 relative each, and the merge rounds
 * the merged output once more), the sums are fp32 in another order; the
 * inputs are bf16-exact on both sides. */
#define RING_L2_TOL 1e-2
#define RING_MAX_TOL 4e-2

static void run(int Tc, int H, int Hkv, int Dh) {
    if (!gc_case("Tc%d_H%d_Hkv%d_Dh%d", Tc, H, Hkv, Dh)) return;
    size_t nq = (size_t)Tc * H * Dh, nk = (size_t)Tc * Hkv * Dh, nl = (size_t)Tc * H;
    /* query chunk 1 of a row; key chunks 0 (earlier: whole) and 1 (diagonal) */
    float *q = gc_host(nq), *k0 = gc_host(nk), *v0 = gc_host(nk), *k1 = gc_host(nk), *v1 = gc_host(nk),
          *g = gc_host(nq), *dq = gc_host(nq), *dk0 = gc_host(nk), *dv0 = gc_host(nk), *dk1 = gc_host(nk),
          *dv1 = gc_host(nk);
    float *hs[] = { q, k0, v0, k1, v1, g, dq, dk0, dv0, dk1, dv1 };
    for (int i = 0; i < 11; i++) {
        size_t n = i == 0 || i == 5 || i == 6 ? nq : nk;
        gc_rand(hs[i], n, -1.5f, 1.5f);
        gc_round_bf16(hs[i], n);
    }
    const backend_t *be = GC.gpu, *cpu = GC.cpu;
    act_t *gq = gc_dev_act(q, nq), *gk0 = gc_dev_act(k0, nk), *gv0 = gc_dev_act(v0, nk), *gk1 = gc_dev_act(k1, nk),
          *gv1 = gc_dev_act(v1, nk), *gg = gc_dev_act(g, nq), *gdq = gc_dev_act(dq, nq), *gdk0 = gc_dev_act(dk0, nk),
          *gdv0 = gc_dev_act(dv0, nk), *gdk1 = gc_dev_act(dk1, nk), *gdv1 = gc_dev_act(dv1, nk);
    act_t *go = gc_dev_act(q, nq), *gob = gc_dev_act(q, nq);
    float *gl = (float *)be->alloc(nl * sizeof(float)), *glb = (float *)be->alloc(nl * sizeof(float));
    gc_poison_act(go, nq); gc_poison_act(gob, nq); gc_poison_f32(gl, nl); gc_poison_f32(glb, nl);

    /* the diagonal pair alone, checked; then merged with the earlier chunk */
    float *out = gc_host(nq), *lse = gc_host(nl), *ob = gc_host(nq), *lb = gc_host(nl);
    cpu->attn_block_fwd(out, lse, q, k1, v1, Tc, Tc, H, Hkv, Dh, true);
    be->attn_block_fwd(go, gl, gq, gk1, gv1, Tc, Tc, H, Hkv, Dh, true);
    float *h1 = gc_get_act(go, nq), *hl1 = gc_get_f32(gl, nl);
    gc_compare("diagonal pair out", h1, out, nq, GC_BF16_TOL);
    gc_compare("diagonal pair lse", hl1, lse, nl, 1e-4);
    cpu->attn_block_fwd(ob, lb, q, k0, v0, Tc, Tc, H, Hkv, Dh, false);
    cpu->attn_merge(out, lse, ob, lb, Tc, H, Dh);
    be->attn_block_fwd(gob, glb, gq, gk0, gv0, Tc, Tc, H, Hkv, Dh, false);
    be->attn_merge(go, gl, gob, glb, Tc, H, Dh);
    float *ho = gc_get_act(go, nq), *hl = gc_get_f32(gl, nl);
    gc_compare("merged out", ho, out, nq, GC_BF16_TOL);
    gc_compare("merged lse", hl, lse, nl, 1e-4);

    /* backward of both pairs from the GPU's merged output (as the model
     * does: the oracle starts from the same bf16 output) */
    cpu->attn_block_bwd(dq, dk1, dv1, g, ho, hl, q, k1, v1, Tc, Tc, H, Hkv, Dh, true);
    cpu->attn_block_bwd(dq, dk0, dv0, g, ho, hl, q, k0, v0, Tc, Tc, H, Hkv, Dh, false);
    be->attn_block_bwd(gdq, gdk1, gdv1, gg, go, gl, gq, gk1, gv1, Tc, Tc, H, Hkv, Dh, true);
    be->attn_block_bwd(gdq, gdk0, gdv0, gg, go, gl, gq, gk0, gv0, Tc, Tc, H, Hkv, Dh, false);
    float *r[] = { gc_get_act(gdq, nq), gc_get_act(gdk0, nk), gc_get_act(gdv0, nk), gc_get_act(gdk1, nk),
                   gc_get_act(gdv1, nk) };
    gc_compare_l2("dq", r[0], dq, nq, RING_L2_TOL, RING_MAX_TOL);
    gc_compare_l2("dk (earlier chunk)", r[1], dk0, nk, RING_L2_TOL, RING_MAX_TOL);
    gc_compare_l2("dv (earlier chunk)", r[2], dv0, nk, RING_L2_TOL, RING_MAX_TOL);
    gc_compare_l2("dk (diagonal)", r[3], dk1, nk, RING_L2_TOL, RING_MAX_TOL);
    gc_compare_l2("dv (diagonal)", r[4], dv1, nk, RING_L2_TOL, RING_MAX_TOL);

    act_t *ds[] = { gq, gk0, gv0, gk1, gv1, gg, gdq, gdk0, gdv0, gdk1, gdv1, go, gob };
    for (int i = 0; i < 13; i++) be->free(ds[i]);
    be->free(gl); be->free(glb);
    for (int i = 0; i < 11; i++) free(hs[i]);
    for (int i = 0; i < 5; i++) free(r[i]);
    free(out); free(lse); free(ob); free(lb); free(h1); free(hl1); free(ho); free(hl);
}

int main(void) {
    gc_init("ring");
    run(1, 2, 1, 64);
    run(7, 4, 2, 64);
    run(13, 8, 2, 128);
    if (!gc_emulated()) {
        run(128, 8, 2, 128);
        run(257, 4, 4, 64);
    }
    return gc_done();
}
