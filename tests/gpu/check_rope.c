/* check_rope.c: rotary embedding forward and inverse (backward), in place on
 * bf16, against the CPU oracle, for two thetas, linear and Llama 3 scaling
 * and a start position past 0 (KV-cached decoding). */
#include "tests/gpu/gpucheck.h"

static void run_r(int B, int T, int nh, int Dh, int pos0, const be_rope_t *r) {
    if (!gc_case("B%d_T%d_nh%d_Dh%d_theta%g_type%d_pos%d", B, T, nh, Dh, r->theta, (int)r->type, pos0)) return;
    size_t n = (size_t)B * T * nh * Dh;
    float *x = gc_host(n), *dx = gc_host(n);
    gc_rand(x, n, -1, 1); gc_rand(dx, n, -1, 1);
    gc_round_bf16(x, n); gc_round_bf16(dx, n);
    act_t *gx = gc_dev_act(x, n), *gdx = gc_dev_act(dx, n);
    GC.cpu->rope_fwd(x, B, T, nh, Dh, pos0, r);
    GC.cpu->rope_bwd(dx, B, T, nh, Dh, pos0, r);
    GC.gpu->rope_fwd(gx, B, T, nh, Dh, pos0, r);
    GC.gpu->rope_bwd(gdx, B, T, nh, Dh, pos0, r);
    float *hx = gc_get_act(gx, n), *hdx = gc_get_act(gdx, n);
    gc_compare("fwd", hx, x, n, GC_BF16_TOL);
    gc_compare("bwd", hdx, dx, n, GC_BF16_TOL);
    GC.gpu->free(gx); GC.gpu->free(gdx);
    free(x); free(dx); free(hx); free(hdx);
}

static void run(int B, int T, int nh, int Dh, float theta) {
    be_rope_t r = { .theta = theta };
    run_r(B, T, nh, Dh, 0, &r);
}

int main(void) {
    gc_init("rope");
    run(1, 1, 1, 2, 10000.f);
    run(2, 17, 3, 64, 10000.f);
    run(1, 300, 8, 128, 500000.f);
    run(3, 129, 5, 64, 500000.f);
    run(1, 8192, 2, 128, 500000.f);
    /* Llama 3.x scaling (its three frequency bands at head_dim 64 and 128),
     * linear scaling, and rows starting past position 0 */
    be_rope_t l3 = { .theta = 500000.f, .type = BE_ROPE_LLAMA3, .factor = 32.f, .low_freq_factor = 1.f,
                     .high_freq_factor = 4.f, .original_max_pos = 8192 };
    be_rope_t l3s = { .theta = 10000.f, .type = BE_ROPE_LLAMA3, .factor = 8.f, .low_freq_factor = 1.f,
                      .high_freq_factor = 4.f, .original_max_pos = 64 };
    be_rope_t lin = { .theta = 10000.f, .type = BE_ROPE_LINEAR, .factor = 4.f };
    run_r(2, 300, 3, 128, 0, &l3);
    run_r(3, 65, 4, 64, 0, &l3s);
    run_r(2, 33, 2, 32, 0, &lin);
    run_r(2, 1, 3, 64, 777, &l3s);
    run_r(1, 9, 2, 128, 5000, &l3);
    return gc_done();
}
