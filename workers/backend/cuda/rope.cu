/* rope.cu: rotary position embedding, rotate-half form, in place on bf16
 * (B, T, nh, Dh); the backward is the inverse rotation.
 *
 * The cos/sin table (P, Dh/2) of positions 0..P-1 is computed on the host in
 * double from be_rope_inv_freq (theta and rope_scaling) and rounded to fp32,
 * as the CPU oracle does, then cached on the device per (Dh, rope settings):
 * angles stay exact at long sequences. Rows start at position pos0. */
#include "workers/backend/cuda/common.cuh"

#include <math.h>

/* ---- kernels ---- */

/* One thread per (row, head, i < Dh/2); cs (T, Dh/2) of (cos, sin). */
__global__ void rope_kernel(bf16 *x, const float2 *cs, int T, int pos0, int nh, int half, float dir, size_t total) {
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t rh = idx / half;            /* (b*T + t)*nh + h */
        int t = (int)((rh / nh) % T);
        float2 c = cs[(size_t)(pos0 + t) * half + i];
        float s = dir * c.y;
        bf16 *p = x + rh * (size_t)(2 * half);
        float x1 = __bfloat162float(p[i]), x2 = __bfloat162float(p[i + half]);
        p[i] = __float2bfloat16(x1 * c.x - x2 * s);
        p[i + half] = __float2bfloat16(x2 * c.x + x1 * s);
    }
}

/* ---- table cache ---- */

typedef struct { int P, Dh; be_rope_t r; float2 *dev; } rope_table_t;
#define ROPE_CACHE 4
static rope_table_t g_tables[ROPE_CACHE];
static int g_next;

static bool same_rope(const be_rope_t *a, const be_rope_t *b) {
    return a->theta == b->theta && a->type == b->type && a->factor == b->factor &&
           a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
           a->original_max_pos == b->original_max_pos;
}

/* The table of positions 0..T-1 (at least). */
static const float2 *rope_table(int T, int Dh, const be_rope_t *r) {
    for (int i = 0; i < ROPE_CACHE; i++)
        if (g_tables[i].dev && g_tables[i].P >= T && g_tables[i].Dh == Dh && same_rope(&g_tables[i].r, r))
            return g_tables[i].dev; /* rows of a longer table are the same angles */
    int half = Dh / 2;
    float2 *host = (float2 *)malloc((size_t)T * half * sizeof(float2));
    if (!host) { fprintf(stderr, "%s:%d: out of host memory for the rotary table\n", __FILE__, __LINE__); exit(1); }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double a = (double)t * be_rope_inv_freq(r, Dh, i);
            host[(size_t)t * half + i] = make_float2((float)cos(a), (float)sin(a));
        }
    rope_table_t *e = &g_tables[g_next];
    g_next = (g_next + 1) % ROPE_CACHE;
    if (e->dev) CUDA_CHECK(cudaFree(e->dev));
    CUDA_CHECK(cudaMalloc(&e->dev, (size_t)T * half * sizeof(float2)));
    CUDA_CHECK(cudaMemcpy(e->dev, host, (size_t)T * half * sizeof(float2), cudaMemcpyHostToDevice));
    free(host);
    e->P = T;
    e->Dh = Dh;
    e->r = *r;
    return e->dev;
}

/* ---- launcher ---- */

void launch_rope(bf16 *x, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r, bool inverse) {
    if (B <= 0 || T <= 0 || nh <= 0 || Dh < 2 || pos0 < 0) return;
    const float2 *cs = rope_table(pos0 + T, Dh, r);
    size_t total = (size_t)B * T * nh * (Dh / 2);
    rope_kernel<<<cuda_blocks(total, 256), 256, 0, cuda_compute_stream()>>>(x, cs, T, pos0, nh, Dh / 2,
                                                                             inverse ? -1.f : 1.f, total);
    CUDA_LAUNCH_CHECK("rope_kernel");
}
