/* check_fused.c: the backend's fused paths (backend.h, "fused paths")
 * against the CPU oracle's separate ops on the same bf16 inputs:
 *   qkv_split_rope  vs  splitting q | k | v rows, then rope_fwd on q and k
 *   qkv_pack_rope   vs  rope_bwd on dq and dk, then packing with dv
 *   swiglu_gu_*     vs  swiglu_fwd / swiglu_bwd on the split gate and up
 *   matmul_fwd_res  vs  matmul_fwd then add (the residual; also in place)
 *   adamw_spans     vs  adamw per span, with and without weight decay
 * Shapes include GQA (Hkv < H), both head dims, odd widths that take the
 * scalar paths, and rows starting at pos0 > 0. */
#include "tests/gpu/gpucheck.h"

static be_rope_t rope_cfg(bool llama3) {
    be_rope_t r = { 10000.f, BE_ROPE_DEFAULT, 1.f, 1.f, 4.f, 8192 };
    if (llama3) { r.theta = 500000.f; r.type = BE_ROPE_LLAMA3; r.factor = 32.f; r.original_max_pos = 64; }
    return r;
}

/* qkv_split_rope and qkv_pack_rope for one shape */
static void run_qkv(int B, int T, int H, int Hkv, int Dh, int pos0, bool llama3) {
    if (!gc_case("qkv_B%d_T%d_H%d_Hkv%d_Dh%d_pos%d%s", B, T, H, Hkv, Dh, pos0, llama3 ? "_llama3" : "")) return;
    const backend_t *be = GC.gpu;
    size_t N = (size_t)B * T, qd = (size_t)H * Dh, kvd = (size_t)Hkv * Dh, W = qd + 2 * kvd;
    be_rope_t r = rope_cfg(llama3);
    /* forward: packed rows in, rotated q, k and v out */
    float *qkv = gc_host(N * W);
    gc_rand(qkv, N * W, -3, 3);
    gc_round_bf16(qkv, N * W);
    float *q = gc_host(N * qd), *k = gc_host(N * kvd), *v = gc_host(N * kvd);
    for (size_t i = 0; i < N; i++) {
        memcpy(q + i * qd, qkv + i * W, qd * 4);
        memcpy(k + i * kvd, qkv + i * W + qd, kvd * 4);
        memcpy(v + i * kvd, qkv + i * W + qd + kvd, kvd * 4);
    }
    GC.cpu->rope_fwd(q, B, T, H, Dh, pos0, &r);
    GC.cpu->rope_fwd(k, B, T, Hkv, Dh, pos0, &r);
    act_t *gqkv = gc_dev_act(qkv, N * W), *gq = gc_dev_act(q, N * qd), *gk = gc_dev_act(k, N * kvd),
          *gv = gc_dev_act(v, N * kvd);
    gc_poison_act(gq, N * qd); gc_poison_act(gk, N * kvd); gc_poison_act(gv, N * kvd);
    be->qkv_split_rope(gq, gk, gv, gqkv, B, T, H, Hkv, Dh, pos0, &r);
    float *hq = gc_get_act(gq, N * qd), *hk = gc_get_act(gk, N * kvd), *hv = gc_get_act(gv, N * kvd);
    gc_compare("split q (rotated)", hq, q, N * qd, GC_BF16_TOL);
    gc_compare("split k (rotated)", hk, k, N * kvd, GC_BF16_TOL);
    gc_compare("split v", hv, v, N * kvd, 0);
    /* backward: gradients of q, k, v in, packed and rotated back out */
    float *dq = gc_host(N * qd), *dk = gc_host(N * kvd), *dv = gc_host(N * kvd);
    gc_rand(dq, N * qd, -1, 1); gc_rand(dk, N * kvd, -1, 1); gc_rand(dv, N * kvd, -1, 1);
    gc_round_bf16(dq, N * qd); gc_round_bf16(dk, N * kvd); gc_round_bf16(dv, N * kvd);
    act_t *gdq = gc_dev_act(dq, N * qd), *gdk = gc_dev_act(dk, N * kvd), *gdv = gc_dev_act(dv, N * kvd);
    GC.cpu->rope_bwd(dq, B, T, H, Dh, pos0, &r);
    GC.cpu->rope_bwd(dk, B, T, Hkv, Dh, pos0, &r);
    float *dqkv = gc_host(N * W);
    for (size_t i = 0; i < N; i++) {
        memcpy(dqkv + i * W, dq + i * qd, qd * 4);
        memcpy(dqkv + i * W + qd, dk + i * kvd, kvd * 4);
        memcpy(dqkv + i * W + qd + kvd, dv + i * kvd, kvd * 4);
    }
    gc_poison_act(gqkv, N * W);
    be->qkv_pack_rope(gqkv, gdq, gdk, gdv, B, T, H, Hkv, Dh, pos0, &r);
    float *hd = gc_get_act(gqkv, N * W);
    gc_compare("packed dq | dk | dv (rotated back)", hd, dqkv, N * W, GC_BF16_TOL);
    act_t *ds[] = { gqkv, gq, gk, gv, gdq, gdk, gdv };
    for (int i = 0; i < 7; i++) be->free(ds[i]);
    float *hs[] = { qkv, q, k, v, hq, hk, hv, dq, dk, dv, dqkv, hd };
    for (int i = 0; i < 12; i++) free(hs[i]);
}

/* swiglu_gu_fwd / swiglu_gu_bwd on (N, 2F) rows gate | up */
static void run_gu(int N, int F) {
    if (!gc_case("swiglu_gu_N%d_F%d", N, F)) return;
    const backend_t *be = GC.gpu;
    size_t n = (size_t)N * F;
    float *gu = gc_host(2 * n), *dh = gc_host(n);
    gc_rand(gu, 2 * n, -5, 5); gc_rand(dh, n, -1, 1);
    gc_round_bf16(gu, 2 * n); gc_round_bf16(dh, n);
    float *g = gc_host(n), *u = gc_host(n), *h = gc_host(n), *dg = gc_host(n), *du = gc_host(n), *dgu = gc_host(2 * n);
    for (int i = 0; i < N; i++) {
        memcpy(g + (size_t)i * F, gu + (size_t)i * 2 * F, (size_t)F * 4);
        memcpy(u + (size_t)i * F, gu + (size_t)i * 2 * F + F, (size_t)F * 4);
    }
    GC.cpu->swiglu_fwd(h, g, u, n);
    GC.cpu->swiglu_bwd(dg, du, dh, g, u, n);
    for (int i = 0; i < N; i++) {
        memcpy(dgu + (size_t)i * 2 * F, dg + (size_t)i * F, (size_t)F * 4);
        memcpy(dgu + (size_t)i * 2 * F + F, du + (size_t)i * F, (size_t)F * 4);
    }
    act_t *ggu = gc_dev_act(gu, 2 * n), *gdh = gc_dev_act(dh, n), *gh = gc_dev_act(dh, n), *gdgu = gc_dev_act(gu, 2 * n);
    gc_poison_act(gh, n); gc_poison_act(gdgu, 2 * n);
    be->swiglu_gu_fwd(gh, ggu, N, F);
    be->swiglu_gu_bwd(gdgu, gdh, ggu, N, F);
    float *hh = gc_get_act(gh, n), *hdgu = gc_get_act(gdgu, 2 * n);
    gc_compare("h", hh, h, n, GC_BF16_TOL);
    gc_compare("dgate | dup", hdgu, dgu, 2 * n, GC_BF16_TOL);
    be->free(ggu); be->free(gdh); be->free(gh); be->free(gdgu);
    float *hs[] = { gu, dh, g, u, h, dg, du, dgu, hh, hdgu };
    for (int i = 0; i < 10; i++) free(hs[i]);
}

/* matmul_fwd_res: out = res + x w^T, into a separate buffer and in place */
static void run_res(int N, int I, int O) {
    if (!gc_case("matmul_res_N%d_I%d_O%d", N, I, O)) return;
    const backend_t *be = GC.gpu;
    size_t nx = (size_t)N * I, nw = (size_t)O * I, no = (size_t)N * O;
    float *x = gc_host(nx), *w = gc_host(nw), *res = gc_host(no), *tmp = gc_host(no), *ref = gc_host(no);
    gc_rand(x, nx, -1, 1); gc_rand(w, nw, -0.2f, 0.2f); gc_rand(res, no, -2, 2);
    gc_round_bf16(x, nx); gc_round_bf16(w, nw); gc_round_bf16(res, no);
    GC.cpu->matmul_fwd(tmp, x, w, N, I, O);
    GC.cpu->add(ref, res, tmp, no);
    act_t *gx = gc_dev_act(x, nx), *gw = gc_dev_act(w, nw), *gres = gc_dev_act(res, no), *gout = gc_dev_act(res, no);
    gc_poison_act(gout, no);
    be->matmul_fwd_res(gout, gres, gx, gw, N, I, O);
    float *h1 = gc_get_act(gout, no);
    gc_compare("out = res + x w^T", h1, ref, no, GC_BF16_TOL);
    be->matmul_fwd_res(gres, gres, gx, gw, N, I, O); /* in place: res += x w^T */
    float *h2 = gc_get_act(gres, no);
    gc_compare("res += x w^T (in place)", h2, ref, no, GC_BF16_TOL);
    be->free(gx); be->free(gw); be->free(gres); be->free(gout);
    float *hs[] = { x, w, res, tmp, ref, h1, h2 };
    for (int i = 0; i < 7; i++) free(hs[i]);
}

/* adamw_spans over count spans of one flat buffer against adamw per span */
static void run_spans(int count) {
    if (!gc_case("adamw_spans_%d", count)) return;
    const backend_t *be = GC.gpu;
    const float LR = 1e-3f, B1 = 0.9f, B2 = 0.95f, EPS = 1e-8f, WD = 0.1f;
    be_span_t *sp = (be_span_t *)calloc((size_t)count, sizeof *sp);
    size_t total = 0;
    for (int i = 0; i < count; i++) {
        /* gaps between spans stay untouched */
        total += (size_t)(gc_next() % 7);
        sp[i].offset = total;
        sp[i].n = 1 + (size_t)(gc_next() % (gc_emulated() ? 700 : 40000));
        sp[i].decay = gc_next() % 2 == 0;
        total += sp[i].n;
    }
    float *p = gc_host(total), *g = gc_host(total), *m = gc_host(total), *v = gc_host(total);
    gc_rand(p, total, -1, 1); gc_rand(g, total, -0.1f, 0.1f); gc_rand(m, total, -0.01f, 0.01f); gc_rand(v, total, 1e-6f, 1e-4f);
    float *gp = gc_dev_f32(p, total), *gg = gc_dev_f32(g, total), *gm = gc_dev_f32(m, total), *gv = gc_dev_f32(v, total);
    float *pa = gc_host(total);
    memcpy(pa, p, total * 4);
    gc_round_bf16(pa, total);
    act_t *gpa = gc_dev_act(pa, total);
    const float step_size = LR / (1.f - B1 * B1), bc2 = sqrtf(1.f - B2 * B2), gs = 0.7f;
    for (int i = 0; i < count; i++) {
        size_t o = sp[i].offset;
        GC.cpu->adamw(p + o, g + o, m + o, v + o, sp[i].n, LR, B1, B2, EPS, sp[i].decay ? WD : 0.f, step_size, bc2, gs,
                      NULL);
    }
    memcpy(pa, p, total * 4);
    gc_round_bf16(pa, total); /* the gaps keep their old bf16 copy, which equals p rounded there */
    be->adamw_spans(gp, gg, gm, gv, gpa, sp, count, LR, B1, B2, EPS, WD, step_size, bc2, gs);
    float *hp = gc_get_f32(gp, total), *hm = gc_get_f32(gm, total), *hv = gc_get_f32(gv, total),
          *hpa = gc_get_act(gpa, total);
    gc_compare("p (fp32)", hp, p, total, GC_F32_TOL);
    gc_compare("m (fp32)", hm, m, total, GC_F32_TOL);
    gc_compare("v (fp32)", hv, v, total, GC_F32_TOL);
    gc_compare("p bf16 copy", hpa, pa, total, GC_BF16_TOL);
    be->free(gp); be->free(gg); be->free(gm); be->free(gv); be->free(gpa);
    float *hs[] = { p, g, m, v, pa, hp, hm, hv, hpa };
    for (int i = 0; i < 9; i++) free(hs[i]);
    free(sp);
}

int main(void) {
    gc_init("fused");
    if (GC.gpu && (!GC.gpu->qkv_split_rope || !GC.gpu->qkv_pack_rope || !GC.gpu->swiglu_gu_fwd ||
                   !GC.gpu->swiglu_gu_bwd || !GC.gpu->matmul_fwd_res || !GC.gpu->adamw_spans)) {
        printf("not ok - fused/table the CUDA table fills every fused op\n1..1\n");
        return 1;
    }
    bool emu = gc_emulated();
    run_qkv(2, 5, 4, 2, 64, 0, false);
    run_qkv(1, 7, 2, 1, 128, 3, true);
    run_qkv(1, 3, 3, 3, 6, 1, false); /* odd widths: the scalar copy of v */
    run_gu(5, 24);
    run_gu(3, 13);
    run_res(9, 32, 48);
    run_res(emu ? 17 : 300, emu ? 64 : 512, emu ? 40 : 1024);
    run_spans(5);
    run_spans(emu ? 300 : 600); /* more than one launch's worth of tensors */
    if (!emu) run_qkv(2, 512, 32, 8, 128, 0, true);
    return gc_done();
}
