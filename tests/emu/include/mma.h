/* mma.h of the emulation tier: nvcuda::wmma for the shapes the backend uses
 * (16x16x16, bf16 operands, fp32 accumulator).
 *
 * The hardware spreads a fragment over the 32 lanes in an unspecified
 * layout; here every lane holds the whole 16x16 tile (the backend never
 * indexes a fragment's elements, which is what makes that layout safe to
 * replace). load_matrix_sync, store_matrix_sync and mma_sync are warp
 * collectives, as their _sync names say: the warp's lanes all arrive
 * (emu::warp_collective) and the operation then runs once for the warp, so
 * a lane that reads a tile before the others wrote it, or a warp that is
 * not converged, shows. Products are exact in fp32 (bf16 x bf16) and summed
 * in k order in fp32. */
#ifndef BALLAST_EMU_MMA_H
#define BALLAST_EMU_MMA_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16x16x16 shape only");
    enum { num_elements = 256 };
    T x[256]; /* row-major logical tile */
};

namespace detail {

template <class T>
static inline float to_f(T v) { return (float)v; }
static inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class F, class T>
struct load_args {
    F *frag;
    const T *p;
    unsigned ld;
    bool col; /* memory is column-major */
};

template <class F, class T>
void load_all(void **args, int n) {
    for (int i = 0; i < n; i++) {
        load_args<F, T> *a = (load_args<F, T> *)args[i];
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++)
                a->frag->x[r * 16 + c] = a->col ? a->p[(size_t)c * a->ld + r] : a->p[(size_t)r * a->ld + c];
    }
}

template <class F>
struct store_args {
    float *p;
    const F *frag;
    unsigned ld;
    bool col;
};

template <class F>
void store_one(void **args, int n) {
    /* the lanes hold the same tile: lane 0's is the warp's */
    store_args<F> *a = (store_args<F> *)args[0];
    (void)n;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            float v = a->frag->x[r * 16 + c];
            if (a->col) a->p[(size_t)c * a->ld + r] = v;
            else a->p[(size_t)r * a->ld + c] = v;
        }
}

template <class D, class A, class B, class C>
struct mma_args {
    D *d;
    const A *a;
    const B *b;
    const C *c;
};

template <class D, class A, class B, class C>
void mma_all(void **args, int n) {
    mma_args<D, A, B, C> *m = (mma_args<D, A, B, C> *)args[0];
    float out[256];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = m->c->x[i * 16 + j];
            for (int k = 0; k < 16; k++) s += to_f(m->a->x[i * 16 + k]) * to_f(m->b->x[k * 16 + j]);
            out[i * 16 + j] = s;
        }
    for (int l = 0; l < n; l++) {
        mma_args<D, A, B, C> *ml = (mma_args<D, A, B, C> *)args[l];
        for (int e = 0; e < 256; e++) ml->d->x[e] = out[e];
    }
}

} // namespace detail

template <class Use, class T, class L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v) {
    for (int e = 0; e < 256; e++) f.x[e] = (T)v;
}
template <class Use, class L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f, float v) {
    for (int e = 0; e < 256; e++) f.x[e] = __float2bfloat16(v);
}

template <class Use, class T>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, row_major> &f, const T *p, unsigned ld) {
    detail::load_args<fragment<Use, 16, 16, 16, T, row_major>, T> a{ &f, p, ld, false };
    emu::warp_collective("wmma::load_matrix_sync", detail::load_all<fragment<Use, 16, 16, 16, T, row_major>, T>, &a);
}
template <class Use, class T>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, col_major> &f, const T *p, unsigned ld) {
    detail::load_args<fragment<Use, 16, 16, 16, T, col_major>, T> a{ &f, p, ld, true };
    emu::warp_collective("wmma::load_matrix_sync", detail::load_all<fragment<Use, 16, 16, 16, T, col_major>, T>, &a);
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ld,
                                    layout_t l) {
    detail::load_args<fragment<accumulator, 16, 16, 16, float>, float> a{ &f, p, ld, l == mem_col_major };
    emu::warp_collective("wmma::load_matrix_sync", detail::load_all<fragment<accumulator, 16, 16, 16, float>, float>, &a);
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ld,
                                     layout_t l) {
    detail::store_args<fragment<accumulator, 16, 16, 16, float>> a{ p, &f, ld, l == mem_col_major };
    emu::warp_collective("wmma::store_matrix_sync", detail::store_one<fragment<accumulator, 16, 16, 16, float>>, &a);
}

template <class LA, class LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
    typedef fragment<accumulator, 16, 16, 16, float> FC;
    typedef fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> FA;
    typedef fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> FB;
    detail::mma_args<FC, FA, FB, FC> m{ &d, &a, &b, &c };
    emu::warp_collective("wmma::mma_sync", detail::mma_all<FC, FA, FB, FC>, &m);
}

} // namespace wmma
} // namespace nvcuda

#endif
