/* check_norm.c: the sum of squares behind the global gradient norm, through
 * the table and over many buffers (cuda_sumsq_multi), against the CPU
 * oracle (double accumulation); and bit-identical on a second run. */
#include "tests/gpu/gpucheck.h"

static void run(int count) {
    if (!gc_case("%d_buffers", count)) return;
    size_t total = 0, *ns = (size_t *)malloc((size_t)count * sizeof(size_t));
    for (int i = 0; i < count; i++) { ns[i] = 1 + (size_t)((i * 104729) % 300000); total += ns[i]; }
    float *x = gc_host(total);
    gc_rand(x, total, -3, 3);
    float *gx = gc_dev_f32(x, total);
    const float **ptrs = (const float **)malloc((size_t)count * sizeof *ptrs);
    float ref_each[64], got_each[64];
    double ref = 0;
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        ptrs[i] = gx + off;
        double r = GC.cpu->sumsq(x + off, ns[i]);
        ref += r;
        if (i < 64) { ref_each[i] = (float)r; got_each[i] = (float)GC.gpu->sumsq(gx + off, ns[i]); }
        off += ns[i];
    }
    double got = cuda_sumsq_multi(ptrs, ns, count), again = cuda_sumsq_multi(ptrs, ns, count);
    float fr = (float)ref, fg = (float)got;
    gc_compare("table sumsq per buffer", got_each, ref_each, (size_t)(count < 64 ? count : 64), GC_F32_TOL);
    gc_compare("multi-buffer sumsq", &fg, &fr, 1, GC_F32_TOL);
    GC.cases++;
    if (memcmp(&got, &again, sizeof got) == 0) printf("ok - norm/%s deterministic\n", GC.name);
    else { printf("not ok - norm/%s deterministic\n#   %.17g then %.17g\n", GC.name, got, again); GC.failed++; }
    GC.gpu->free(gx);
    free(x); free(ns); free(ptrs);
}

int main(void) {
    gc_init("norm");
    run(1);
    run(7);
    run(gc_emulated() ? 13 : 50);
    return gc_done();
}
