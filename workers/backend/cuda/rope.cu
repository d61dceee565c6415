/* rope.cu: rotary position embedding, rotate-half form, in place on bf16
 * (B, T, nh, Dh); the backward is the inverse rotation.
 *
 * The cos/sin table (P, Dh/2) of positions 0..P-1 is computed on the host in
 * double from be_rope_inv_freq (theta and rope_scaling) and rounded to fp32,
 * as the CPU oracle does, then cached on the device per (Dh, rope settings):
 * angles stay exact at long sequences. Rows start at position pos0.
 *
 * The packed q | k | v projection (backend.h, qkv_split_rope and
 * qkv_pack_rope) gets the rotation in the same pass as its split: one
 * launch per block forward and one per backward, where separate rotations
 * of q and k take two each. */
#include "workers/backend/cuda/common.cuh"

#include <math.h>

/* ---- kernels ----
 * One block per row (b, t) of the (B, T, ...) tensors, the threads over
 * the row's (head, i < Dh/2) pairs: indices are 32-bit, the position is the
 * block's row mod T once per block, no 64-bit division. */

__device__ __forceinline__ void rope_pair(const bf16 *src, bf16 *dst, int i, int half, float2 c, float dir) {
    float s = dir * c.y;
    float x1 = __bfloat162float(src[i]), x2 = __bfloat162float(src[i + half]);
    dst[i] = __float2bfloat16(x1 * c.x - x2 * s);
    dst[i + half] = __float2bfloat16(x2 * c.x + x1 * s);
}

/* x (rows, nh, 2 half) in place; cs (P, half) of (cos, sin) */
__global__ void rope_kernel(bf16 *x, const float2 *cs, int T, int pos0, int nh, int half, float dir) {
    unsigned row = blockIdx.x;
    const float2 *c = cs + (size_t)(pos0 + (int)(row % (unsigned)T)) * half;
    bf16 *xr = x + (size_t)row * nh * 2 * half;
    for (int j = threadIdx.x; j < nh * half; j += blockDim.x) {
        int h = j / half, i = j - h * half;
        bf16 *p = xr + h * 2 * half;
        rope_pair(p, p, i, half, c[i], dir);
    }
}

/* The packed projection's row q | k | v (W = (H + 2 Hkv) Dh) split into
 * q, k (rotated: heads 0..H-1 then the Hkv key heads, one after the other
 * in the row) and v; inverse: dq, dk rotated back and packed with dv. */
__global__ void qkv_rope_kernel(bf16 *qkv, bf16 *q, bf16 *k, bf16 *v, const float2 *cs, int T, int pos0, int H,
                                int Hkv, int half, float dir, bool pack) {
    unsigned row = blockIdx.x;
    int Dh = 2 * half, qd = H * Dh, kvd = Hkv * Dh, W = qd + 2 * kvd;
    const float2 *c = cs + (size_t)(pos0 + (int)(row % (unsigned)T)) * half;
    bf16 *pr = qkv + (size_t)row * W, *qr = q + (size_t)row * qd, *kr = k + (size_t)row * kvd,
         *vr = v + (size_t)row * kvd;
    for (int j = threadIdx.x; j < (H + Hkv) * half; j += blockDim.x) {
        int h = j / half, i = j - h * half;
        bf16 *packed = pr + h * Dh, *sep = h < H ? qr + h * Dh : kr + (h - H) * Dh;
        if (pack) rope_pair(sep, packed, i, half, c[i], dir);
        else rope_pair(packed, sep, i, half, c[i], dir);
    }
    bf16 *pv = pr + qd + kvd;
    if ((kvd & 7) == 0 && (W & 7) == 0 && (qd & 7) == 0 && (((uintptr_t)qkv | (uintptr_t)v) & 15) == 0) {
        uint4 *a = (uint4 *)pv, *b = (uint4 *)vr;
        for (int j = threadIdx.x; j < kvd / 8; j += blockDim.x) {
            if (pack) a[j] = b[j];
            else b[j] = a[j];
        }
    } else {
        for (int j = threadIdx.x; j < kvd; j += blockDim.x) {
            if (pack) pv[j] = vr[j];
            else vr[j] = pv[j];
        }
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

/* ---- launchers ---- */

static int rope_threads(int pairs) { return pairs >= 256 ? 256 : pairs > 32 ? (pairs + 31) / 32 * 32 : 32; }

void launch_rope(bf16 *x, int B, int T, int nh, int Dh, int pos0, const be_rope_t *r, bool inverse) {
    if (B <= 0 || T <= 0 || nh <= 0 || Dh < 2 || pos0 < 0) return;
    const float2 *cs = rope_table(pos0 + T, Dh, r);
    rope_kernel<<<(unsigned)B * (unsigned)T, rope_threads(nh * (Dh / 2)), 0, cuda_compute_stream()>>>(
        x, cs, T, pos0, nh, Dh / 2, inverse ? -1.f : 1.f);
    CUDA_LAUNCH_CHECK("rope_kernel");
}

void launch_qkv_split_rope(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, int B, int T, int H, int Hkv, int Dh, int pos0,
                           const be_rope_t *r) {
    if (B <= 0 || T <= 0 || H <= 0 || Dh < 2 || pos0 < 0) return;
    const float2 *cs = rope_table(pos0 + T, Dh, r);
    qkv_rope_kernel<<<(unsigned)B * (unsigned)T, rope_threads((H + Hkv) * (Dh / 2)), 0, cuda_compute_stream()>>>(
        (bf16 *)qkv, q, k, v, cs, T, pos0, H, Hkv, Dh / 2, 1.f, false);
    CUDA_LAUNCH_CHECK("qkv_rope_kernel");
}

void launch_qkv_pack_rope(bf16 *dqkv, const bf16 *dq, const bf16 *dk, const bf16 *dv, int B, int T, int H, int Hkv,
                          int Dh, int pos0, const be_rope_t *r) {
    if (B <= 0 || T <= 0 || H <= 0 || Dh < 2 || pos0 < 0) return;
    const float2 *cs = rope_table(pos0 + T, Dh, r);
    qkv_rope_kernel<<<(unsigned)B * (unsigned)T, rope_threads((H + Hkv) * (Dh / 2)), 0, cuda_compute_stream()>>>(
        dqkv, (bf16 *)dq, (bf16 *)dk, (bf16 *)dv, cs, T, pos0, H, Hkv, Dh / 2, -1.f, true);
    CUDA_LAUNCH_CHECK("qkv_rope_kernel");
}
