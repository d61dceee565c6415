/* check_adamw.c: AdamW (fp32 master and moments, bf16 working copy) against
 * the CPU oracle over three steps, through the table (one tensor) and
 * through cuda_adamw_multi (40 tensors of mixed sizes and decay, two
 * launches). fp32 results are held to 1e-5. */
#include "tests/gpu/gpucheck.h"

static const float LR = 1e-3f, B1 = 0.9f, B2 = 0.95f, EPS = 1e-8f, WD = 0.1f;

static void cpu_steps(float *p, const float *g, float *m, float *v, size_t n, bool decay, int steps, float gs) {
    for (int t = 1; t <= steps; t++) {
        float step_size = LR / (1.f - powf(B1, (float)t)), bc2 = sqrtf(1.f - powf(B2, (float)t));
        GC.cpu->adamw(p, g + (size_t)(t - 1) * n, m, v, n, LR, B1, B2, EPS, decay ? WD : 0.f, step_size, bc2, gs, NULL);
    }
}

static void run_table(size_t n) {
    if (!gc_case("table_n%zu", n)) return;
    const int steps = 3;
    float *p = gc_host(n), *g = gc_host(n * steps), *m = gc_host(n), *v = gc_host(n);
    gc_rand(p, n, -1, 1); gc_rand(g, n * steps, -0.1f, 0.1f); gc_rand(m, n, -0.01f, 0.01f); gc_rand(v, n, 1e-6f, 1e-4f);
    float *gp = gc_dev_f32(p, n), *gm = gc_dev_f32(m, n), *gv = gc_dev_f32(v, n), *gg = gc_dev_f32(g, n * steps);
    act_t *gpa = (act_t *)GC.gpu->alloc(n * 2);
    gc_poison_act(gpa, n);
    cpu_steps(p, g, m, v, n, true, steps, 0.5f);
    for (int t = 1; t <= steps; t++) {
        float step_size = LR / (1.f - powf(B1, (float)t)), bc2 = sqrtf(1.f - powf(B2, (float)t));
        GC.gpu->adamw(gp, gg + (size_t)(t - 1) * n, gm, gv, n, LR, B1, B2, EPS, WD, step_size, bc2, 0.5f, gpa);
    }
    float *hp = gc_get_f32(gp, n), *hm = gc_get_f32(gm, n), *hv = gc_get_f32(gv, n), *hpa = gc_get_act(gpa, n);
    float *pr = gc_host(n);
    memcpy(pr, p, n * 4);
    gc_round_bf16(pr, n);
    gc_compare("p (fp32)", hp, p, n, GC_F32_TOL);
    gc_compare("m (fp32)", hm, m, n, GC_F32_TOL);
    gc_compare("v (fp32)", hv, v, n, GC_F32_TOL);
    gc_compare("p bf16 copy", hpa, pr, n, GC_BF16_TOL);
    GC.gpu->free(gp); GC.gpu->free(gm); GC.gpu->free(gv); GC.gpu->free(gg); GC.gpu->free(gpa);
    free(p); free(g); free(m); free(v); free(hp); free(hm); free(hv); free(hpa); free(pr);
}

static void run_multi(int count) {
    if (!gc_case("multi_%d_tensors", count)) return;
    size_t total = 0, *off = (size_t *)malloc(((size_t)count + 1) * sizeof(size_t)), *ns = (size_t *)malloc((size_t)count * sizeof(size_t));
    for (int i = 0; i < count; i++) { ns[i] = 1 + (size_t)((i * 7919) % 5000) + (i % 3 == 0 ? 70000 : 0); off[i] = total; total += ns[i]; }
    float *p = gc_host(total), *g = gc_host(total), *m = gc_host(total), *v = gc_host(total);
    gc_rand(p, total, -1, 1); gc_rand(g, total, -0.1f, 0.1f); gc_rand(m, total, -0.01f, 0.01f); gc_rand(v, total, 1e-6f, 1e-4f);
    float *gp = gc_dev_f32(p, total), *gm = gc_dev_f32(m, total), *gv = gc_dev_f32(v, total), *gg = gc_dev_f32(g, total);
    act_t *gpa = (act_t *)GC.gpu->alloc(total * 2);
    gc_poison_act(gpa, total);
    cuda_adamw_tensor_t *ts = (cuda_adamw_tensor_t *)calloc((size_t)count, sizeof *ts);
    const float step_size = LR / (1.f - B1), bc2 = sqrtf(1.f - B2);
    for (int i = 0; i < count; i++) {
        bool decay = i % 2 == 0;
        ts[i].p = gp + off[i]; ts[i].g = gg + off[i]; ts[i].m = gm + off[i]; ts[i].v = gv + off[i];
        ts[i].p_act = be_act_at(GC.gpu, gpa, off[i]);
        ts[i].n = ns[i];
        ts[i].decay = decay;
        GC.cpu->adamw(p + off[i], g + off[i], m + off[i], v + off[i], ns[i], LR, B1, B2, EPS, decay ? WD : 0.f, step_size, bc2, 1.f, NULL);
    }
    cuda_adamw_multi(ts, count, LR, B1, B2, EPS, WD, step_size, bc2, 1.f);
    float *hp = gc_get_f32(gp, total), *hm = gc_get_f32(gm, total), *hv = gc_get_f32(gv, total), *hpa = gc_get_act(gpa, total);
    float *pr = gc_host(total);
    memcpy(pr, p, total * 4);
    gc_round_bf16(pr, total);
    gc_compare("p (fp32)", hp, p, total, GC_F32_TOL);
    gc_compare("m (fp32)", hm, m, total, GC_F32_TOL);
    gc_compare("v (fp32)", hv, v, total, GC_F32_TOL);
    gc_compare("p bf16 copy", hpa, pr, total, GC_BF16_TOL);
    GC.gpu->free(gp); GC.gpu->free(gm); GC.gpu->free(gv); GC.gpu->free(gg); GC.gpu->free(gpa);
    free(p); free(g); free(m); free(v); free(hp); free(hm); free(hv); free(hpa); free(pr); free(ts); free(off); free(ns);
}

int main(void) {
    gc_init("adamw");
    run_table(1);
    run_table(1000);
    run_table(100003);
    run_multi(40);
    return gc_done();
}
