/* selftest.cu: the emulator's own semantics, checked through the same path
 * as the backend's kernels (cu2cc.py, the emulation headers, runtime and
 * scheduler): block reductions through shared memory and shuffles, every
 * shuffle kind against its CUDA definition, votes, WMMA against a plain
 * product, the PTX primitives of warp_mma.cuh (mma.sync m16n8k16,
 * ldmatrix x4 and .trans, cp.async groups) against scalar references,
 * stream order and event waits, pageable and pinned copies.
 * Then, each in a child process that must die with the emulator's
 * message: threads at different barriers, a missing barrier (wrong bits on
 * some seed), a kernel given a pageable host pointer, a copy past an
 * allocation, too much shared memory, reading a result without waiting
 * for its stream.
 *
 *   selftest          TAP lines; exit status 0 when all pass */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "workers/backend/cuda/warp_mma.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_n, g_failed;

static void check(bool ok, const char *name, const char *why) {
    g_n++;
    if (ok) printf("ok %d - emu/%s\n", g_n, name);
    else { g_failed++; printf("not ok %d - emu/%s: %s\n", g_n, name, why); }
    fflush(stdout);
}

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)

/* ---- kernels ---- */

__global__ void block_sum_kernel(float *out, const float *x, int n) {
    __shared__ float part[32];
    float v = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[blockIdx.x * n + i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += part[w];
        out[blockIdx.x] = s;
    }
}

/* the same without the barrier: thread 0 may read part[] before the other warps wrote it */
__global__ void block_sum_racy(float *out, const float *x, int n) {
    __shared__ float part[32];
    float v = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[blockIdx.x * n + i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    if (threadIdx.x == 0) {
        float s = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += part[w];
        out[blockIdx.x] = s;
    }
}

__global__ void shuffles(int *out, int width, int arg) {
    int l = threadIdx.x;
    int *o = out + 4 * l;
    o[0] = __shfl_sync(0xffffffffu, l * 10, arg, width);
    o[1] = __shfl_up_sync(0xffffffffu, l * 10, arg, width);
    o[2] = __shfl_down_sync(0xffffffffu, l * 10, arg, width);
    o[3] = __shfl_xor_sync(0xffffffffu, l * 10, arg, width);
}

__global__ void votes(unsigned *out) {
    int l = threadIdx.x;
    out[3 * l] = __ballot_sync(0xffffffffu, l % 3 == 0);
    out[3 * l + 1] = __any_sync(0xffffffffu, l == 7);
    out[3 * l + 2] = __all_sync(0xffffffffu, l < 40);
}

__global__ void diverged(float *x) {
    if (threadIdx.x < 16) __syncthreads();
    else __syncthreads();
    x[threadIdx.x] = 1;
}

__global__ void touch(float *x, int n, float add) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = 2.f * i + add;
}

__global__ void big_shared(float *x) {
    __shared__ float a[16384]; /* 64 KiB: more than a block may have */
    a[threadIdx.x] = 1;
    x[0] = a[0];
}

__global__ void wmma_kernel(float *c, const __nv_bfloat16 *a, const __nv_bfloat16 *b) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.5f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

/* ---- the PTX primitives of warp_mma.cuh ---- */

/* D (16x8) = A (16x16 row-major) . B (16x8 as Bt: 8 rows of 16, i.e. col) + C,
 * each lane packing its fragments straight from memory by the ISA's layout */
__global__ void ptx_mma_kernel(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *bt, const float *c) {
    int l = threadIdx.x, g = l >> 2, t = l & 3;
    const uint16_t *A = (const uint16_t *)a, *Bt = (const uint16_t *)bt;
    uint32_t fa[4], fb[2];
    float fc[4], fd[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
        fa[i] = A[row * 16 + col] | ((uint32_t)A[row * 16 + col + 1] << 16);
    }
    for (int i = 0; i < 2; i++) fb[i] = Bt[g * 16 + 2 * t + 8 * i] | ((uint32_t)Bt[g * 16 + 2 * t + 8 * i + 1] << 16);
    for (int i = 0; i < 4; i++) fc[i] = c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    warp_mma_bf16(fd, fa, fb, fc);
    for (int i = 0; i < 4; i++) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = fd[i];
}

/* a 16x16 bf16 tile through shared memory, read back with ldmatrix x4:
 * lanes 0-15 give rows 0-15 of columns 0-7, lanes 16-31 of columns 8-15 */
__global__ void ptx_ldmatrix_kernel(uint32_t *out, const __nv_bfloat16 *x, int trans) {
    __shared__ __align__(16) __nv_bfloat16 tile[256];
    int l = threadIdx.x;
    for (int i = l; i < 256; i += 32) tile[i] = x[i];
    __syncwarp();
    uint32_t r[4];
    const __nv_bfloat16 *row = tile + (l & 15) * 16 + (l >> 4) * 8;
    if (trans) warp_ldmatrix_x4<true>(r, row);
    else warp_ldmatrix_x4<false>(r, row);
    for (int j = 0; j < 4; j++) out[4 * l + j] = r[j];
}

/* cp.async: out[0..] what thread l sees of its 16 bytes before any wait,
 * after wait<1> (first group landed), after wait<0> (both) */
__global__ void ptx_cp_async_kernel(float *out, const float *src) {
    __shared__ __align__(16) float buf[2][32 * 4];
    int l = threadIdx.x;
    for (int i = 0; i < 4; i++) buf[0][4 * l + i] = buf[1][4 * l + i] = -1.f;
    cp_async_16(&buf[0][4 * l], src + 4 * l, true);
    cp_async_commit();
    cp_async_16(&buf[1][4 * l], src + 128 + 4 * l, l % 2 == 0); /* odd lanes zero-fill */
    cp_async_commit();
    out[l] = buf[0][4 * l] + buf[1][4 * l];
    cp_async_wait<1>();
    out[32 + l] = buf[0][4 * l] + 100.f * buf[1][4 * l + 1];
    cp_async_wait<0>();
    out[64 + l] = buf[0][4 * l + 2] + 100.f * buf[1][4 * l + 3];
}

/* ---- helpers ---- */

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.f - 0.5f;
}

/* Run fn in a child; true when it died and its stderr holds `expect`. */
static bool dies_with(void (*fn)(void), const char *expect, char *got, size_t gotlen) {
    int p[2];
    if (pipe(p)) return false;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        fn();
        _exit(0);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < gotlen && (r = read(p[0], got + n, gotlen - 1 - n)) > 0) n += (size_t)r;
    got[n] = 0;
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && strstr(got, expect) != NULL;
}

static void do_diverged(void) {
    float *x;
    CK(cudaMalloc((void **)&x, 64 * 4));
    diverged<<<1, 64>>>(x);
    cudaDeviceSynchronize();
}

static void do_host_pointer(void) {
    static float host[64];
    touch<<<1, 32>>>(host, 64, 0.f);
    cudaDeviceSynchronize();
}

static void do_copy_past(void) {
    float *x, h[32];
    CK(cudaMalloc((void **)&x, 16 * 4));
    cudaMemcpy(h, x, 32 * 4, cudaMemcpyDeviceToHost);
}

static void do_big_shared(void) {
    float *x;
    CK(cudaMalloc((void **)&x, 4));
    big_shared<<<1, 32>>>(x);
    cudaDeviceSynchronize();
}

static void do_overrun(void) {
    float *x;
    CK(cudaMalloc((void **)&x, 100 * 4));
    touch<<<1, 32>>>(x, 101, 0.f); /* one element past the allocation */
    cudaDeviceSynchronize();
}

int main(void) {
    printf("TAP version 13\n");
    unsigned seed = 12345;
    /* block sums: 5 blocks of 128 threads, 300 values each */
    {
        const int B = 5, N = 300;
        float h[B * N], ref[B], out[B];
        for (int b = 0; b < B; b++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += h[b * N + i] = frand(&seed);
            ref[b] = (float)s;
        }
        float *dx, *dout;
        CK(cudaMalloc((void **)&dx, sizeof h));
        CK(cudaMalloc((void **)&dout, sizeof out));
        CK(cudaMemcpy(dx, h, sizeof h, cudaMemcpyHostToDevice));
        block_sum_kernel<<<B, 128>>>(dout, dx, N);
        CK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
        bool ok = true;
        for (int b = 0; b < B; b++) ok &= fabsf(out[b] - ref[b]) <= 1e-4f * (1 + fabsf(ref[b]));
        check(ok, "block_sum", "sums differ from the host's");
        /* the racy version gives a wrong sum on some launch (the barrier is missing) */
        bool wrong = false;
        for (int t = 0; t < 20 && !wrong; t++) {
            block_sum_racy<<<B, 128>>>(dout, dx, N);
            CK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
            for (int b = 0; b < B; b++) wrong |= !(fabsf(out[b] - ref[b]) <= 1e-4f * (1 + fabsf(ref[b])));
        }
        check(wrong, "missing_barrier_shows", "20 launches without the barrier all gave the right sums");
        CK(cudaFree(dx));
        CK(cudaFree(dout));
    }
    /* shuffles against CUDA's definitions */
    {
        int *d, h[128];
        CK(cudaMalloc((void **)&d, sizeof h));
        bool ok = true;
        int widths[] = { 32, 16, 8, 4 }, args[] = { 0, 1, 3, 5, 17 };
        for (int wi = 0; wi < 4; wi++)
            for (int ai = 0; ai < 5; ai++) {
                int w = widths[wi], a = args[ai];
                shuffles<<<1, 32>>>(d, w, a);
                CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
                for (int l = 0; l < 32; l++) {
                    int base = l / w * w;
                    int idx = base + a % w, up = l - a >= base ? l - a : l, down = l + a < base + w ? l + a : l;
                    int x = l ^ a, xr = x < base + w ? x : l;
                    ok &= h[4 * l] == idx * 10 && h[4 * l + 1] == up * 10 && h[4 * l + 2] == down * 10 &&
                          h[4 * l + 3] == xr * 10;
                }
            }
        check(ok, "shuffles", "a shuffle result differs from CUDA's definition");
        CK(cudaFree(d));
        unsigned *v, hv[96];
        CK(cudaMalloc((void **)&v, sizeof hv));
        votes<<<1, 32>>>(v);
        CK(cudaMemcpy(hv, v, sizeof hv, cudaMemcpyDeviceToHost));
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++) if (l % 3 == 0) ballot |= 1u << l;
        bool vok = true;
        for (int l = 0; l < 32; l++) vok &= hv[3 * l] == ballot && hv[3 * l + 1] == 1 && hv[3 * l + 2] == 1;
        check(vok, "votes", "ballot/any/all differ");
        CK(cudaFree(v));
    }
    /* WMMA: C = 0.5 + A B^T-stored (B column-major) */
    {
        __nv_bfloat16 ha[256], hb[256];
        float fa[256], fb[256], hc[256];
        for (int i = 0; i < 256; i++) {
            ha[i] = __float2bfloat16(frand(&seed)), fa[i] = __bfloat162float(ha[i]);
            hb[i] = __float2bfloat16(frand(&seed)), fb[i] = __bfloat162float(hb[i]);
        }
        __nv_bfloat16 *da, *db;
        float *dc;
        CK(cudaMalloc((void **)&da, sizeof ha));
        CK(cudaMalloc((void **)&db, sizeof hb));
        CK(cudaMalloc((void **)&dc, sizeof hc));
        CK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
        wmma_kernel<<<1, 32>>>(dc, da, db);
        CK(cudaMemcpy(hc, dc, sizeof hc, cudaMemcpyDeviceToHost));
        double err = 0;
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                double s = 0.5;
                for (int k = 0; k < 16; k++) s += (double)fa[i * 16 + k] * fb[j * 16 + k]; /* B(k, j) at j*16+k */
                err = fmax(err, fabs(s - hc[i * 16 + j]));
            }
        check(err < 1e-5, "wmma", "the product differs from the host's");
        CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dc));
    }
    /* mma.sync m16n8k16 against a scalar product on random data */
    {
        __nv_bfloat16 ha[256], hb[128];
        float fa[256], fb[128], hc[128], hd[128];
        for (int i = 0; i < 256; i++) ha[i] = __float2bfloat16(frand(&seed) * 4), fa[i] = __bfloat162float(ha[i]);
        for (int i = 0; i < 128; i++) hb[i] = __float2bfloat16(frand(&seed) * 4), fb[i] = __bfloat162float(hb[i]);
        for (int i = 0; i < 128; i++) hc[i] = frand(&seed);
        __nv_bfloat16 *da, *db;
        float *dc, *dd;
        CK(cudaMalloc((void **)&da, sizeof ha)); CK(cudaMalloc((void **)&db, sizeof hb));
        CK(cudaMalloc((void **)&dc, sizeof hc)); CK(cudaMalloc((void **)&dd, sizeof hd));
        CK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dc, hc, sizeof hc, cudaMemcpyHostToDevice));
        ptx_mma_kernel<<<1, 32>>>(dd, da, db, dc);
        CK(cudaMemcpy(hd, dd, sizeof hd, cudaMemcpyDeviceToHost));
        double err = 0;
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++) {
                double s = hc[i * 8 + j];
                for (int k = 0; k < 16; k++) s += (double)fa[i * 16 + k] * fb[j * 16 + k];
                err = fmax(err, fabs(s - hd[i * 8 + j]));
            }
        check(err < 1e-4, "ptx_mma_m16n8k16", "D differs from the scalar A.B + C");
        CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dc)); CK(cudaFree(dd));
    }
    /* ldmatrix x4 and x4.trans against the ISA's lane mapping */
    {
        __nv_bfloat16 hx[256];
        uint32_t hr[128];
        for (int i = 0; i < 256; i++) hx[i] = __float2bfloat16(frand(&seed));
        const uint16_t *X = (const uint16_t *)hx;
        __nv_bfloat16 *dx;
        uint32_t *dr;
        CK(cudaMalloc((void **)&dx, sizeof hx)); CK(cudaMalloc((void **)&dr, sizeof hr));
        CK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
        for (int trans = 0; trans < 2; trans++) {
            ptx_ldmatrix_kernel<<<1, 32>>>(dr, dx, trans);
            CK(cudaMemcpy(hr, dr, sizeof hr, cudaMemcpyDeviceToHost));
            bool ok = true;
            for (int l = 0; l < 32; l++)
                for (int j = 0; j < 4; j++) {
                    /* matrix j: rows 8(j%2).., columns 8(j/2).. of the tile */
                    int r0 = 8 * (j & 1), c0 = 8 * (j >> 1), r = l >> 2, c = 2 * (l & 3);
                    uint32_t e0 = trans ? X[(r0 + c) * 16 + c0 + r] : X[(r0 + r) * 16 + c0 + c];
                    uint32_t e1 = trans ? X[(r0 + c + 1) * 16 + c0 + r] : X[(r0 + r) * 16 + c0 + c + 1];
                    ok &= hr[4 * l + j] == (e0 | (e1 << 16));
                }
            check(ok, trans ? "ptx_ldmatrix_x4_trans" : "ptx_ldmatrix_x4", "a lane's register differs from the ISA's mapping");
        }
        CK(cudaFree(dx)); CK(cudaFree(dr));
    }
    /* cp.async lands at the wait that retires its group, zero-fills when invalid */
    {
        float hs[256], ho[96];
        for (int i = 0; i < 256; i++) hs[i] = (float)(i + 1);
        float *ds, *dout;
        CK(cudaMalloc((void **)&ds, sizeof hs)); CK(cudaMalloc((void **)&dout, sizeof ho));
        CK(cudaMemcpy(ds, hs, sizeof hs, cudaMemcpyHostToDevice));
        ptx_cp_async_kernel<<<1, 32>>>(dout, ds);
        CK(cudaMemcpy(ho, dout, sizeof ho, cudaMemcpyDeviceToHost));
        bool before = true, first = true, both = true;
        for (int l = 0; l < 32; l++) {
            before &= ho[l] == -2.f;
            first &= ho[32 + l] == hs[4 * l] - 100.f;
            float b3 = l % 2 == 0 ? hs[128 + 4 * l + 3] : 0.f;
            both &= ho[64 + l] == hs[4 * l + 2] + 100.f * b3;
        }
        check(before, "cp_async_lands_at_wait", "shared memory changed before any cp.async.wait_group");
        check(first, "cp_async_wait_group_1", "wait_group 1 did not land exactly the older group");
        check(both, "cp_async_wait_group_0_zero_fill", "wait_group 0 did not land both groups (odd lanes zeros)");
        CK(cudaFree(ds)); CK(cudaFree(dout));
    }
    /* streams: work on s2 ordered after s1 by an event; the host reads after syncing s2 */
    {
        const int n = 4096;
        float *d, *h;
        CK(cudaMalloc((void **)&d, n * 4));
        CK(cudaMallocHost((void **)&h, n * 4));
        cudaStream_t s1, s2;
        cudaEvent_t e;
        CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        bool ok = true, unordered_wrong = false;
        for (int t = 0; t < 20; t++) {
            CK(cudaMemsetAsync(d, 0, n * 4, s1));
            touch<<<2, 64, 0, s1>>>(d, n, (float)t);
            CK(cudaEventRecord(e, s1));
            CK(cudaStreamWaitEvent(s2, e, 0));
            CK(cudaMemcpyAsync(h, d, n * 4, cudaMemcpyDeviceToHost, s2));
            CK(cudaStreamSynchronize(s2));
            for (int i = 0; i < n; i++) ok &= h[i] == 2.f * i + t;
            /* without the wait the copy may run first */
            CK(cudaMemsetAsync(d, 0, n * 4, s1));
            touch<<<2, 64, 0, s1>>>(d, n, 100.f + t);
            CK(cudaMemcpyAsync(h, d, n * 4, cudaMemcpyDeviceToHost, s2));
            CK(cudaStreamSynchronize(s2));
            for (int i = 0; i < n; i++) unordered_wrong |= h[i] != 2.f * i + 100.f + t;
            CK(cudaStreamSynchronize(s1));
        }
        check(ok, "event_wait_orders_streams", "a copy after the wait saw old values");
        check(unordered_wrong, "missing_event_wait_shows", "20 copies without the wait all saw the new values");
        CK(cudaEventDestroy(e));
        CK(cudaStreamDestroy(s1));
        CK(cudaStreamDestroy(s2));
        CK(cudaFree(d));
        CK(cudaFreeHost(h));
    }
    char got[4096];
    check(dies_with(do_diverged, "different barriers", got, sizeof got), "diverged_barriers_refused", got);
    check(dies_with(do_host_pointer, "pageable host memory", got, sizeof got), "host_pointer_refused", got);
    check(dies_with(do_copy_past, "runs past the end", got, sizeof got), "copy_past_end_refused", got);
    check(dies_with(do_big_shared, "shared memory", got, sizeof got), "too_much_shared_refused", got);
    check(dies_with(do_overrun, "heap-buffer-overflow", got, sizeof got), "kernel_overrun_caught", got);
    printf("1..%d\n", g_n);
    return g_failed ? 1 : 0;
}
