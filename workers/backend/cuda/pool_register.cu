/* pool_register.cu: pin host memory that is mapped already (ballastd's
 * pool) for DMA (pool_register.h).
 *
 * cudaHostRegister on memory that is already mapped (the sealed memfd
 * segments ballastd hands over) page-locks it and tells the driver about
 * it, so cudaMemcpyAsync to or from it is a DMA transfer that overlaps
 * compute. The policy is all or nothing: either every byte of the pool is
 * registered, or none is and copies are pageable (staged by the driver),
 * with one warning. Partial pinning would make copy speed depend on where
 * a blob happens to lie, which is worse to reason about than either.
 * Returns codes, never exits: the worker decides. Relies on the CUDA
 * runtime and common/log.h. */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "log.h"
}
#include "workers/backend/cuda/pool_register.h"

typedef struct {
    char *base;     /* start of the registered range */
    uint64_t bytes; /* its length */
    bool ours;      /* registered by us (false: it already was; left alone at unregister) */
} pool_span_t;

struct be_pinned {
    bool registered;     /* every segment fully registered */
    pool_span_t *spans;  /* (n) registered ranges */
    uint32_t n, cap;
    uint64_t largest;    /* bytes of the largest span */
};

/* ---- helpers ---- */

static int span_add(pool_reg_t *r, char *base, uint64_t bytes, bool ours) {
    if (r->n == r->cap) {
        uint32_t cap = r->cap ? 2 * r->cap : 16;
        pool_span_t *s = (pool_span_t *)realloc(r->spans, cap * sizeof *s);
        if (!s) return -ENOMEM;
        r->spans = s;
        r->cap = cap;
    }
    r->spans[r->n++] = (pool_span_t){ base, bytes, ours };
    if (bytes > r->largest) r->largest = bytes;
    return 0;
}

/* Unregister spans [from, n) and drop them. */
static void spans_undo(pool_reg_t *r, uint32_t from) {
    for (uint32_t i = from; i < r->n; i++)
        if (r->spans[i].ours) {
            cudaError_t e = cudaHostUnregister(r->spans[i].base);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                log_warn("cudaHostUnregister(%p, %llu bytes): %s", (void *)r->spans[i].base,
                         (unsigned long long)r->spans[i].bytes, cudaGetErrorString(e));
            }
        }
    r->n = from;
    r->largest = 0;
    for (uint32_t i = 0; i < r->n; i++)
        if (r->spans[i].bytes > r->largest) r->largest = r->spans[i].bytes;
}

/* Register [base, base + bytes) as one range. cudaSuccess, or the error
 * (cleared from the runtime's sticky last error). */
static cudaError_t register_range(pool_reg_t *r, char *base, uint64_t bytes) {
    cudaError_t e = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
    bool ours = true;
    if (e == cudaErrorHostMemoryAlreadyRegistered) ours = false;
    else if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return e;
    }
    (void)cudaGetLastError();
    if (span_add(r, base, bytes, ours)) {
        if (ours) (void)cudaHostUnregister(base);
        return cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}

/* One segment: whole, else in chunks of each size in turn. */
static cudaError_t register_segment(pool_reg_t *r, char *base, uint64_t bytes) {
    cudaError_t e = register_range(r, base, bytes);
    if (e == cudaSuccess) return e;
    const uint64_t chunks[2] = { POOL_REG_CHUNK_BIG, POOL_REG_CHUNK_SMALL };
    for (int c = 0; c < 2; c++) {
        if (chunks[c] >= bytes) continue;
        uint32_t mark = r->n;
        uint64_t off = 0;
        for (; off < bytes; off += chunks[c]) {
            uint64_t len = bytes - off < chunks[c] ? bytes - off : chunks[c];
            if ((e = register_range(r, base + off, len)) != cudaSuccess) break;
        }
        if (off >= bytes) return cudaSuccess;
        spans_undo(r, mark);
    }
    return e;
}

/* ---- public ---- */

extern "C" int pool_register(pool_reg_t **out, const be_range_t *segs, uint32_t n, char *err, size_t errlen) {
    *out = NULL;
    for (uint32_t i = 0; i < n; i++)
        if (!segs[i].base || !segs[i].bytes) {
            snprintf(err, errlen, "pool segment %u is %s: pass the mapped segments of the pool", i,
                     segs[i].base ? "empty" : "not mapped");
            return -EINVAL;
        }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "registering the offload pool: no usable GPU (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return -ENODEV;
    }
    pool_reg_t *r = (pool_reg_t *)calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "registering the offload pool: out of memory");
        return -ENOMEM;
    }
    uint64_t total = 0;
    uint32_t i = 0;
    for (; i < n; i++) {
        if ((e = register_segment(r, (char *)segs[i].base, segs[i].bytes)) != cudaSuccess) break;
        total += segs[i].bytes;
    }
    if (i < n) {
        spans_undo(r, 0);
        r->registered = false;
        log_warn("cudaHostRegister of the offload pool failed on segment %u of %u (%llu bytes, also in %llu MiB "
                 "and %llu MiB chunks): %s. Device<->pool copies fall back to pageable memory (staged by the "
                 "driver, slower, and they do not overlap compute). Fix: raise the locked-memory limit "
                 "(ulimit -l unlimited, or memlock in the container/systemd unit) of this worker",
                 i, n, (unsigned long long)segs[i].bytes, (unsigned long long)(POOL_REG_CHUNK_BIG >> 20),
                 (unsigned long long)(POOL_REG_CHUNK_SMALL >> 20), cudaGetErrorString(e));
    } else {
        r->registered = n > 0;
        log_info("offload pool registered for DMA: %u segments, %.2f GiB in %u registrations", n,
                 total / (double)(1ull << 30), r->n);
    }
    *out = r;
    return 0;
}

extern "C" void pool_unregister(pool_reg_t *r) {
    if (!r) return;
    spans_undo(r, 0);
    free(r->spans);
    free(r);
}

extern "C" bool pool_registered(const pool_reg_t *r) { return r && r->registered; }
extern "C" uint32_t pool_registrations(const pool_reg_t *r) { return r ? r->n : 0; }
extern "C" uint64_t pool_largest_registration(const pool_reg_t *r) { return r ? r->largest : 0; }

extern "C" int pool_copy_async(const pool_reg_t *r, void *dev, void *host, size_t bytes, bool to_device, void *stream,
                               char *err, size_t errlen) {
    char *h = (char *)host, *d = (char *)dev;
    while (bytes > 0) {
        /* the piece up to the end of the span holding h, or up to the next span */
        size_t piece = bytes;
        for (uint32_t i = 0; r && i < r->n; i++) {
            const pool_span_t *s = &r->spans[i];
            if (h >= s->base && h < s->base + s->bytes) {
                uint64_t left = (uint64_t)(s->base + s->bytes - h);
                if (left < piece) piece = (size_t)left;
                break;
            }
            if (s->base > h && (uint64_t)(s->base - h) < piece) piece = (size_t)(s->base - h);
        }
        cudaError_t e = to_device ? cudaMemcpyAsync(d, h, piece, cudaMemcpyHostToDevice, (cudaStream_t)stream)
                                  : cudaMemcpyAsync(h, d, piece, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(err, errlen, "copy of %zu bytes %s the offload pool: %s", piece, to_device ? "from" : "to",
                     cudaGetErrorString(e));
            return -EIO;
        }
        h += piece;
        d += piece;
        bytes -= piece;
    }
    return 0;
}

/* ---- as the table's host_register / host_unregister ---- */

extern "C" struct be_pinned *cuda_host_register(const be_range_t *ranges, int n, char *err, size_t errlen) {
    pool_reg_t *r = NULL;
    if (n < 0 || pool_register(&r, ranges, (uint32_t)n, err, errlen)) return NULL;
    return r;
}

extern "C" void cuda_host_unregister(struct be_pinned *p) { pool_unregister(p); }
