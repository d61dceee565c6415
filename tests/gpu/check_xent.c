/* check_xent.c: softmax cross-entropy forward (fp32 losses) and backward
 * (bf16 dlogits, separate and in place) against the CPU oracle, up to the
 * Llama-3 vocabulary. */
#include "tests/gpu/gpucheck.h"

static void run(int N, int V, bool in_place) {
    if (!gc_case("N%d_V%d%s", N, V, in_place ? "_inplace" : "")) return;
    size_t n = (size_t)N * V;
    int32_t *tgt = (int32_t *)malloc((size_t)N * sizeof(int32_t));
    gc_rand_tokens(tgt, N, V);
    float *logits = gc_host(n);
    gc_rand(logits, n, -8, 8);
    gc_round_bf16(logits, n);
    float scale = 1.0f / (float)N;
    float *loss = gc_host(N), *dl = gc_host(n);
    GC.cpu->xent_fwd(loss, logits, tgt, N, V);
    GC.cpu->xent_bwd(dl, logits, tgt, scale, N, V);
    int32_t *gt = (int32_t *)gc_dev_bytes(tgt, (size_t)N * sizeof(int32_t));
    act_t *gl = gc_dev_act(logits, n), *gdl = in_place ? gl : gc_dev_act(logits, n);
    float *gloss = gc_dev_f32(loss, N);
    gc_poison_f32(gloss, N);
    if (!in_place) gc_poison_act(gdl, n);
    GC.gpu->xent_fwd(gloss, gl, gt, N, V);
    GC.gpu->xent_bwd(gdl, gl, gt, scale, N, V);
    float *hl = gc_get_f32(gloss, N), *hd = gc_get_act(gdl, n);
    gc_compare("losses (fp32)", hl, loss, N, GC_F32_TOL);
    gc_compare("dlogits", hd, dl, n, GC_BF16_TOL);
    GC.gpu->free(gt); GC.gpu->free(gl); if (!in_place) GC.gpu->free(gdl); GC.gpu->free(gloss);
    free(tgt); free(logits); free(loss); free(dl); free(hl); free(hd);
}

int main(void) {
    gc_init("xent");
    run(1, 8, false);
    run(7, 1000, false);
    run(33, 32003, false);
    run(64, 128256, false);
    run(65, 128256, true);
    return gc_done();
}
