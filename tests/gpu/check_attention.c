/* check_attention.c: causal grouped-query flash attention, forward and
 * backward, against the CPU oracle (which materialises the probabilities),
 * for head dims 64 and 128 and odd sequence lengths; plus a long-sequence
 * forward (T = 32768) checked row by row against a direct double-precision
 * sum, since the oracle's (T, T) matrix would not fit. Both kernel paths
 * run every case: tensor cores ("tc", the default) and SIMT ("simt"), then
 * cuDNN's fused attention ("cudnn") where libcudnn.so.9 loads and passes
 * the backend's start-up self-check (otherwise one SKIP line with the
 * reason). Each of our paths also runs the same inputs twice and wants the
 * same bits (the determinism contract). */
#include "tests/gpu/gpucheck.h"

static const char *g_impl = "tc";

/* The gradients' tolerances (gc_compare_l2). The GPU rounds P and dS to
 * bf16 (relative error up to 2^-9 each) before fp32 products over up to T
 * terms, and stores dq, dk, dv in bf16 (another 2^-9): independent
 * roundings add in quadrature, so the relative L2 error stays a few 2^-9
 * (~4e-3); 1e-2 leaves room and still fails a wrong scale, mask or
 * missing term (those are 10% and more). The worst element may carry the
 * roundings of a whole row without averaging: 4e-2 of max |ref|. */
#define ATT_L2_TOL 1e-2
#define ATT_MAX_TOL 4e-2

/* cuDNN's cases: a call cuDNN refused ran our kernels, which the checks
 * then judged; say so, since it is cuDNN's support that is in question. */
static void note_refusal(long refused0) {
    long refused;
    const char *why;
    cuda_attention_cudnn_counts(NULL, &refused, &why);
    if (strcmp(g_impl, "cudnn") == 0 && refused != refused0)
        printf("# %s/%s: cuDNN refused it, our kernels ran: %s\n", GC.family, GC.name, why);
}

static void run(int B, int T, int H, int Hkv, int Dh) {
    if (!gc_case("%s_B%d_T%d_H%d_Hkv%d_Dh%d", g_impl, B, T, H, Hkv, Dh)) return;
    long refused0;
    cuda_attention_cudnn_counts(NULL, &refused0, NULL);
    size_t nq = (size_t)B * T * H * Dh, nk = (size_t)B * T * Hkv * Dh;
    float *q = gc_host(nq), *k = gc_host(nk), *v = gc_host(nk), *g = gc_host(nq);
    gc_rand(q, nq, -2, 2); gc_rand(k, nk, -2, 2); gc_rand(v, nk, -1, 1); gc_rand(g, nq, -1, 1);
    gc_round_bf16(q, nq); gc_round_bf16(k, nk); gc_round_bf16(v, nk); gc_round_bf16(g, nq);
    size_t natt = GC.cpu->attention_state_numel(B, T, H);
    float *att = gc_host(natt), *out = gc_host(nq), *dq = gc_host(nq), *dk = gc_host(nk), *dv = gc_host(nk);
    GC.cpu->attention_fwd(out, att, q, k, v, B, T, H, Hkv, Dh);

    const backend_t *be = GC.gpu;
    act_t *gq = gc_dev_act(q, nq), *gk = gc_dev_act(k, nk), *gv = gc_dev_act(v, nk), *gg = gc_dev_act(g, nq);
    act_t *go = gc_dev_act(q, nq), *gdq = gc_dev_act(q, nq), *gdk = gc_dev_act(k, nk), *gdv = gc_dev_act(k, nk);
    size_t gnatt = be->attention_state_numel(B, T, H);
    float *gatt = (float *)be->alloc(gnatt * sizeof(float));
    gc_poison_act(go, nq); gc_poison_act(gdq, nq); gc_poison_act(gdk, nk); gc_poison_act(gdv, nk);
    gc_poison_f32(gatt, gnatt);
    be->attention_fwd(go, gatt, gq, gk, gv, B, T, H, Hkv, Dh);
    float *ho = gc_get_act(go, nq);
    /* The oracle's backward starts from the output the GPU stored (bf16),
     * as the GPU's does: D = rowsum(dO * O) from the exact output would
     * differ from the GPU's by that rounding, 1-3% of dq and dk. */
    GC.cpu->attention_bwd(dq, dk, dv, g, ho, q, k, v, att, B, T, H, Hkv, Dh);
    be->attention_bwd(gdq, gdk, gdv, gg, go, gq, gk, gv, gatt, B, T, H, Hkv, Dh);
    float *hdq = gc_get_act(gdq, nq), *hdk = gc_get_act(gdk, nk), *hdv = gc_get_act(gdv, nk);
    gc_compare("out", ho, out, nq, GC_BF16_TOL);
    if (T == 1) {
        /* one key: softmax is constant, so dq = dk = 0 exactly */
        gc_compare_zero("dq", hdq, nq, 1e-4);
        gc_compare_zero("dk", hdk, nk, 1e-4);
    } else {
        gc_compare_l2("dq", hdq, dq, nq, ATT_L2_TOL, ATT_MAX_TOL);
        gc_compare_l2("dk", hdk, dk, nk, ATT_L2_TOL, ATT_MAX_TOL);
    }
    gc_compare_l2("dv", hdv, dv, nk, ATT_L2_TOL, ATT_MAX_TOL);
    note_refusal(refused0);
    act_t *ds[] = { gq, gk, gv, gg, go, gdq, gdk, gdv };
    for (int i = 0; i < 8; i++) be->free(ds[i]);
    be->free(gatt);
    float *hs[] = { q, k, v, g, att, out, dq, dk, dv, ho, hdq, hdk, hdv };
    for (int i = 0; i < 13; i++) free(hs[i]);
}

/* Forward only at long T: rows t of head h checked against a direct sum. */
static void run_long(int T, int H, int Hkv, int Dh) {
    if (!gc_case("%s_long_T%d_H%d_Hkv%d_Dh%d", g_impl, T, H, Hkv, Dh)) return;
    size_t nq = (size_t)T * H * Dh, nk = (size_t)T * Hkv * Dh;
    float *q = gc_host(nq), *k = gc_host(nk), *v = gc_host(nk);
    gc_rand(q, nq, -2, 2); gc_rand(k, nk, -2, 2); gc_rand(v, nk, -1, 1);
    gc_round_bf16(q, nq); gc_round_bf16(k, nk); gc_round_bf16(v, nk);
    const backend_t *be = GC.gpu;
    act_t *gq = gc_dev_act(q, nq), *gk = gc_dev_act(k, nk), *gv = gc_dev_act(v, nk), *go = gc_dev_act(q, nq);
    float *gatt = (float *)be->alloc(be->attention_state_numel(1, T, H) * sizeof(float));
    gc_poison_act(go, nq);
    be->attention_fwd(go, gatt, gq, gk, gv, 1, T, H, Hkv, Dh);
    float *ho = gc_get_act(go, nq);
    const int rows[] = { 0, 1, 31 % T, 32 % T, 1000 % T, T / 2, T - 2, T - 1 };
    const int nr = (int)(sizeof rows / sizeof rows[0]);
    float *ref = gc_host((size_t)nr * H * Dh), *got = gc_host((size_t)nr * H * Dh);
    double *s = (double *)malloc((size_t)T * sizeof(double));
    double sc = 1.0 / sqrt((double)Dh);
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < H; h++) {
            int t = rows[r], kh = h / (H / Hkv);
            const float *qt = q + ((size_t)t * H + h) * Dh;
            double mx = -INFINITY, sum = 0;
            for (int u = 0; u <= t; u++) {
                const float *ku = k + ((size_t)u * Hkv + kh) * Dh;
                double d = 0;
                for (int e = 0; e < Dh; e++) d += (double)qt[e] * ku[e];
                s[u] = d * sc;
                if (s[u] > mx) mx = s[u];
            }
            for (int u = 0; u <= t; u++) { s[u] = exp(s[u] - mx); sum += s[u]; }
            for (int e = 0; e < Dh; e++) {
                double o = 0;
                for (int u = 0; u <= t; u++) o += s[u] * v[((size_t)u * Hkv + kh) * Dh + e];
                ref[((size_t)r * H + h) * Dh + e] = (float)(o / sum);
                got[((size_t)r * H + h) * Dh + e] = ho[((size_t)t * H + h) * Dh + e];
            }
        }
    gc_compare("out rows 0..T-1 (direct sum)", got, ref, (size_t)nr * H * Dh, GC_BF16_TOL);
    be->free(gq); be->free(gk); be->free(gv); be->free(go); be->free(gatt);
    free(q); free(k); free(v); free(ho); free(ref); free(got); free(s);
}

/* Determinism: the same inputs through forward and backward twice give
 * the same bits in out, lse, dq, dk and dv (the emulator draws a new thread
 * and block order for every launch, so a result that depends on the order
 * of a sum differs). One TAP line. */
static void run_bits(int B, int T, int H, int Hkv, int Dh) {
    if (!gc_case("%s_B%d_T%d_H%d_Hkv%d_Dh%d_same_bits", g_impl, B, T, H, Hkv, Dh)) return;
    size_t nq = (size_t)B * T * H * Dh, nk = (size_t)B * T * Hkv * Dh;
    float *q = gc_host(nq), *k = gc_host(nk), *v = gc_host(nk), *g = gc_host(nq);
    gc_rand(q, nq, -2, 2); gc_rand(k, nk, -2, 2); gc_rand(v, nk, -1, 1); gc_rand(g, nq, -1, 1);
    const backend_t *be = GC.gpu;
    size_t natt = be->attention_state_numel(B, T, H);
    act_t *gq = gc_dev_act(q, nq), *gk = gc_dev_act(k, nk), *gv = gc_dev_act(v, nk), *gg = gc_dev_act(g, nq);
    float *res[2][5];
    for (int r = 0; r < 2; r++) {
        act_t *go = gc_dev_act(q, nq), *gdq = gc_dev_act(q, nq), *gdk = gc_dev_act(k, nk), *gdv = gc_dev_act(k, nk);
        float *gatt = (float *)be->alloc(natt * sizeof(float));
        gc_poison_act(go, nq); gc_poison_act(gdq, nq); gc_poison_act(gdk, nk); gc_poison_act(gdv, nk);
        gc_poison_f32(gatt, natt);
        be->attention_fwd(go, gatt, gq, gk, gv, B, T, H, Hkv, Dh);
        be->attention_bwd(gdq, gdk, gdv, gg, go, gq, gk, gv, gatt, B, T, H, Hkv, Dh);
        res[r][0] = gc_get_act(go, nq); res[r][1] = gc_get_f32(gatt, (size_t)B * H * T);
        res[r][2] = gc_get_act(gdq, nq); res[r][3] = gc_get_act(gdk, nk); res[r][4] = gc_get_act(gdv, nk);
        be->free(go); be->free(gdq); be->free(gdk); be->free(gdv); be->free(gatt);
    }
    const char *names[5] = { "out", "lse", "dq", "dk", "dv" };
    size_t ns[5] = { nq, (size_t)B * H * T, nq, nk, nk };
    int di = -1;
    size_t at = 0;
    for (int i = 0; i < 5 && di < 0; i++)
        for (size_t e = 0; e < ns[i]; e++)
            if (memcmp(&res[0][i][e], &res[1][i][e], sizeof(float)) != 0) { di = i; at = e; break; }
    GC.cases++;
    printf("%s - %s/%s out, lse, dq, dk, dv\n", di >= 0 ? "not ok" : "ok", GC.family, GC.name);
    if (di >= 0) {
        printf("#   %s differs between two runs at %zu: %.9g then %.9g\n", names[di], at, res[0][di][at], res[1][di][at]);
        GC.failed++;
    }
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 5; i++) free(res[r][i]);
    be->free(gq); be->free(gk); be->free(gv); be->free(gg);
    free(q); free(k); free(v); free(g);
}

int main(void) {
    gc_init("attention");
    const char *impls[] = { "tc", "simt", "cudnn" };
    for (int i = 0; i < 3; i++) {
        g_impl = impls[i];
        if (i == 2 && GC.have_gpu) { /* cuDNN's fused attention, where it loads and passes its self-check */
            char msg[1536];
            int rc = cuda_attention_select("cudnn", msg, sizeof msg);
            printf("# %s\n", msg);
            if (rc) {
                GC.cases++;
                printf("ok - %s/cudnn # SKIP %s\n", GC.family, msg);
                break;
            }
        } else cuda_attention_use(g_impl);
        if (i == 2 && gc_emulated()) { /* the stand-in cuDNN interprets its graphs on the CPU: two cases */
            run(2, 37, 4, 2, 64);
            run(1, 100, 8, 2, 128);
            continue;
        }
        run(1, 1, 1, 1, 64);
        run(2, 37, 4, 2, 64);
        run(1, 100, 8, 2, 128);
        run(1, 257, 4, 4, 128);
        run(2, 64, 6, 1, 64);
        run(2, 77, 4, 2, 64);   /* T not a multiple of 64, B 2, GQA ratio 2 */
        run(1, 200, 8, 2, 128); /* T not a multiple of 64, GQA ratio 4 */
        run_bits(2, 77, 8, 2, 64);
        run_bits(1, 130, 4, 2, 128);
        if (gc_emulated()) { /* the emulator runs kernels on the CPU: the long cases shrink */
            run(1, 130, 2, 1, 128);
            run_long(300, 2, 1, 128);
            run_long(193, 4, 2, 64);
            continue;
        }
        run(1, 1024, 8, 2, 128);
        run(1, 200, 4, 1, 128);
        run_long(32768, 2, 1, 128);
        run_long(4097, 4, 2, 64);
    }
    return gc_done();
}
