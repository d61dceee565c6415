/* runtime.cc: the emulated CUDA runtime: one device, its memory, streams
 * and events, on the CPU.
 *
 * Nothing queued on a stream runs when it is queued. Work runs when the
 * host waits for it (a stream, event or device synchronization, a
 * synchronous copy, cudaFree), and then in an order drawn at random among
 * the streams whose next operation may start: each stream keeps its own
 * order, an event wait holds its stream until the record it captured has
 * run, and nothing else orders two streams. So a missing event wait
 * between compute, copy and collective streams, a host read without a
 * synchronization, or a pinned buffer reused while its copy is in flight
 * shows as wrong bits. Copies involving pageable host memory behave as
 * CUDA documents: host to device reads the source at the call, device to
 * host returns once done.
 *
 * Device memory is host memory (malloc, so AddressSanitizer guards it),
 * filled with 0xff bytes (NaN) when allocated; kernels may take device
 * pointers and pinned or registered host memory only. The legacy default
 * stream orders itself with the blocking streams as CUDA's does.
 * Calls from several host threads are serialized by one lock. */
#include "tests/emu/internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct CUstream_st;
struct CUevent_st;

namespace emu {
namespace {

std::recursive_mutex g_mu;
#define LOCK std::lock_guard<std::recursive_mutex> lock_(g_mu)

/* ---- seed and generators ---- */

uint64_t g_seed;
bool g_seeded;

uint64_t splitmix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

long env_long(const char *name, long def, long lo, long hi, const char *what) {
    const char *e = getenv(name);
    if (!e || !*e) return def;
    char *end;
    errno = 0;
    long v = strtol(e, &end, 0);
    if (errno || *end || v < lo || v > hi) {
        fprintf(stderr, "gpu-emu: %s=%s: %s (%ld to %ld)\n", name, e, what, lo, hi);
        exit(2);
    }
    return v;
}

/* ---- memory ---- */

enum mem_kind { MEM_DEVICE, MEM_PINNED, MEM_REGISTERED };
struct alloc {
    size_t bytes;
    mem_kind kind;
};
std::map<uintptr_t, alloc> g_mem;
size_t g_device_used;

const alloc *find(const void *p, uintptr_t *base) {
    uintptr_t a = (uintptr_t)p;
    auto it = g_mem.upper_bound(a);
    if (it == g_mem.begin()) return nullptr;
    --it;
    if (a > it->first + it->second.bytes) return nullptr; /* one past the end still belongs */
    if (base) *base = it->first;
    return &it->second;
}

bool inside(const void *p, size_t bytes, bool device) {
    uintptr_t base;
    const alloc *m = find(p, &base);
    if (!m || (m->kind == MEM_DEVICE) != device) return false;
    return (uintptr_t)p + bytes <= base + m->bytes;
}

/* ---- streams and events ---- */

struct record {
    bool done = false;
    double t = 0;
};

struct op {
    enum { FN, RECORD, WAIT, GUARD } kind;
    std::function<void()> fn;
    std::shared_ptr<record> rec;
    std::string what;
    std::function<bool()> can_start; /* GUARD: whether fn may run (another process's data has come) */
};

} // namespace
} // namespace emu

struct CUstream_st {
    std::deque<emu::op> q;
    bool blocking;
    int id;
    int priority = 0;
};
struct CUevent_st {
    std::shared_ptr<emu::record> last;
    unsigned flags;
};

namespace emu {
namespace {

CUstream_st g_legacy{ {}, true, 0 };
std::vector<CUstream_st *> g_streams{ &g_legacy };
int g_next_stream = 1;
uint64_t g_launches;
thread_local cudaError_t g_last;
int g_device;
std::map<const void *, size_t> g_smem_attr;

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

CUstream_st *stream_of(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == (cudaStream_t)0x2) return &g_legacy;
    for (CUstream_st *x : g_streams)
        if (x == s) return x;
    emu_fatal("stream %p is not a stream of this device (destroyed, or never created)", (void *)s);
}

std::shared_ptr<record> push_record(CUstream_st *s) {
    auto r = std::make_shared<record>();
    s->q.push_back(op{ op::RECORD, nullptr, r, "event record" });
    return r;
}

/* The legacy stream waits for the blocking streams' earlier work, and they
 * for its. */
void legacy_order(CUstream_st *s) {
    if (s == &g_legacy) {
        for (CUstream_st *x : g_streams)
            if (x != &g_legacy && x->blocking && !x->q.empty())
                g_legacy.q.push_back(op{ op::WAIT, nullptr, push_record(x), "legacy stream order" });
    } else if (s->blocking && !g_legacy.q.empty()) {
        s->q.push_back(op{ op::WAIT, nullptr, push_record(&g_legacy), "legacy stream order" });
    }
}

void push_fn(CUstream_st *s, std::string what, std::function<void()> fn) {
    legacy_order(s);
    s->q.push_back(op{ op::FN, std::move(fn), nullptr, std::move(what) });
}

bool ready(const op &o) {
    if (o.kind == op::WAIT) return o.rec->done;
    if (o.kind == op::GUARD) return o.can_start();
    return true;
}

void exec_head(CUstream_st *s) {
    op o = std::move(s->q.front());
    s->q.pop_front();
    switch (o.kind) {
    case op::FN: case op::GUARD: o.fn(); break;
    case op::RECORD: o.rec->done = true; o.rec->t = now_s(); break;
    case op::WAIT: break;
    }
}

rng &sched_rng(void) {
    static rng r(0x5eed);
    return r;
}

/* Seconds a host wait may stand still on operations that wait for another
 * process (emu_enqueue_when) before the run stops naming them. */
double guard_timeout_s(void) {
    static long t = env_long("BALLAST_EMU_PEER_TIMEOUT_S", 300, 1, 86400, "seconds to wait for another process");
    return (double)t;
}

/* Run queued work, one operation at a time from a random ready stream,
 * until pred holds. When only operations waiting for another process
 * (GUARD) could go on, sleep a little and look again, up to
 * guard_timeout_s(). */
template <class P>
void run_until(P pred, const char *waiting_for) {
    std::vector<CUstream_st *> cand;
    double stalled_since = 0;
    while (!pred()) {
        cand.clear();
        bool guarded = false;
        for (CUstream_st *x : g_streams) {
            if (x->q.empty()) continue;
            if (ready(x->q.front())) cand.push_back(x);
            else if (x->q.front().kind == op::GUARD) guarded = true;
        }
        if (cand.empty() && guarded) {
            double t = now_s();
            if (stalled_since == 0) stalled_since = t;
            if (t - stalled_since <= guard_timeout_s()) {
                struct timespec ts = { 0, 200000 };
                nanosleep(&ts, NULL);
                continue;
            }
        }
        stalled_since = 0;
        if (cand.empty()) {
            std::string msg;
            for (CUstream_st *x : g_streams)
                if (!x->q.empty()) msg += " stream " + std::to_string(x->id) + " waits at '" + x->q.front().what + "';";
            if (guarded)
                emu_fatal("%s: no stream went on for %.0f s (BALLAST_EMU_PEER_TIMEOUT_S):%s (a peer process that "
                          "exited, or collectives started in a different order on different ranks?)",
                          waiting_for, guard_timeout_s(), msg.c_str());
            emu_fatal("%s can never happen: no stream can go on:%s (an event wait on a record that never runs?)",
                      waiting_for, msg.c_str());
        }
        exec_head(cand[sched_rng().below((unsigned)cand.size())]);
    }
}

bool all_idle(void) {
    for (CUstream_st *x : g_streams)
        if (!x->q.empty()) return false;
    return true;
}

void sync_all(const char *why) { run_until(all_idle, why); }

/* Up to a few random steps: a query may see work progress, as on a GPU. */
void progress(void) {
    unsigned k = sched_rng().below(4);
    for (unsigned i = 0; i < k; i++) {
        std::vector<CUstream_st *> cand;
        for (CUstream_st *x : g_streams)
            if (!x->q.empty() && ready(x->q.front())) cand.push_back(x);
        if (cand.empty()) return;
        exec_head(cand[sched_rng().below((unsigned)cand.size())]);
    }
}

cudaError_t fail(cudaError_t e) {
    g_last = e;
    return e;
}

const char *kind_name(cudaMemcpyKind k) {
    static const char *const n[] = { "cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                                     "cudaMemcpyDeviceToDevice", "cudaMemcpyDefault" };
    return (unsigned)k <= 4 ? n[k] : "an unknown kind";
}

/* Checks a copy's pointers against its kind; the kind it really is. */
cudaMemcpyKind check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *call) {
    uintptr_t base;
    const alloc *md = find(dst, &base), *ms = find(src, &base);
    bool ddev = md && md->kind == MEM_DEVICE, sdev = ms && ms->kind == MEM_DEVICE;
    if (ddev && !inside(dst, bytes, true))
        emu_fatal("%s: writing %zu bytes at %p runs past the end of its device allocation", call, bytes, dst);
    if (sdev && !inside(src, bytes, true))
        emu_fatal("%s: reading %zu bytes at %p runs past the end of its device allocation", call, bytes, src);
    cudaMemcpyKind real = (cudaMemcpyKind)((sdev ? 2 : 0) | (ddev ? 1 : 0));
    real = sdev && ddev ? cudaMemcpyDeviceToDevice : sdev ? cudaMemcpyDeviceToHost : ddev ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost;
    if ((unsigned)kind > 4) emu_fatal("%s: copy kind %d is not a cudaMemcpyKind", call, (int)kind);
    if (kind != cudaMemcpyDefault && kind != real)
        emu_fatal("%s: kind %s, but the destination %p is %s and the source %p is %s memory", call, kind_name(kind), dst,
                  ddev ? "device" : "host", src, sdev ? "device" : "host");
    return real;
}

cudaError_t memcpy_on(CUstream_st *s, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, bool sync,
                      const char *call) {
    if (!bytes) return cudaSuccess;
    if (!dst || !src) return fail(cudaErrorInvalidValue);
    cudaMemcpyKind real = check_copy(dst, src, bytes, kind, call);
    bool src_pageable = (real == cudaMemcpyHostToDevice || real == cudaMemcpyHostToHost) && !inside(src, bytes, false);
    bool dst_pageable = (real == cudaMemcpyDeviceToHost || real == cudaMemcpyHostToHost) && !inside(dst, bytes, false);
    if (src_pageable) { /* staged at the call: the caller may reuse its buffer at once */
        auto copy = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                                 (const unsigned char *)src + bytes);
        push_fn(s, call, [dst, copy]() { memcpy(dst, copy->data(), copy->size()); });
    } else {
        push_fn(s, call, [dst, src, bytes]() { memmove(dst, src, bytes); });
    }
    if (sync || dst_pageable) {
        auto r = push_record(s);
        run_until([&r]() { return r->done; }, call);
    }
    return cudaSuccess;
}

} // namespace

/* ---- what the other files use ---- */

uint64_t seed(void) {
    LOCK;
    if (!g_seeded) {
        const char *e = getenv("BALLAST_EMU_SEED");
        if (e && *e) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(e, &end, 0);
            if (errno || *end) {
                fprintf(stderr, "gpu-emu: BALLAST_EMU_SEED=%s: give a whole number (the seed a failed run printed)\n", e);
                exit(2);
            }
            g_seed = v;
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            g_seed = splitmix((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40)) % 1000000000ull;
        }
        g_seeded = true;
        fprintf(stderr, "gpu-emu: seed %llu (BALLAST_EMU_SEED=%llu replays this run)\n", (unsigned long long)g_seed,
                (unsigned long long)g_seed);
    }
    return g_seed;
}

rng::rng(uint64_t stream) : s(splitmix(stream ^ splitmix(g_seeded ? g_seed : seed()))) {}
uint64_t rng::next(void) { return s = splitmix(s); }

void set_error(cudaError_t e) { g_last = e; }

size_t smem_default(void) { return 48u << 10; }
size_t smem_optin(void) { return 227u << 10; }
size_t max_dynamic_smem(const void *kernel) {
    auto it = g_smem_attr.find(kernel);
    return it == g_smem_attr.end() ? smem_default() : std::max(smem_default(), it->second);
}

bool launch_ok(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem) {
    LOCK;
    seed();
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024 ||
        !grid.x || !grid.y || !grid.z || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr, "gpu-emu: kernel %s: launch of grid (%u,%u,%u) x block (%u,%u,%u) is refused by CUDA\n", name,
                grid.x, grid.y, grid.z, block.x, block.y, block.z);
        set_error(cudaErrorInvalidConfiguration);
        return false;
    }
    if (smem > max_dynamic_smem(kernel)) {
        fprintf(stderr, "gpu-emu: kernel %s: %zu bytes of dynamic shared memory, but it may have %zu (%s)\n", name, smem,
                max_dynamic_smem(kernel),
                g_smem_attr.count(kernel) ? "its cudaFuncSetAttribute" : "48 KiB without cudaFuncSetAttribute");
        set_error(cudaErrorInvalidValue);
        return false;
    }
    return true;
}

void check_pointer_arg(const char *name, int index, const void *p) {
    LOCK;
    if (!p || inside(p, 0, true) || inside(p, 0, false)) return;
    emu_fatal("kernel %s: argument %d (%p) is neither device memory (cudaMalloc) nor pinned or registered host "
              "memory; a kernel cannot read pageable host memory", name, index, p);
}

void set_max_dynamic_smem(const void *kernel, int bytes) { g_smem_attr[kernel] = (size_t)bytes; }

void enqueue_grid(cudaStream_t s, const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem,
                  std::function<void()> body) {
    LOCK;
    CUstream_st *st = stream_of(s);
    uint64_t no = ++g_launches;
    size_t limit = max_dynamic_smem(kernel);
    push_fn(st, name, [name, grid, block, smem, limit, body, no]() { run_grid(name, grid, block, smem, limit, body, no); });
}

} // namespace emu

using namespace emu;

/* ---- for the other emulated libraries (emu_defs.h) ---- */

extern "C" void emu_enqueue(cudaStream_t s, const char *what, void (*fn)(void *), void *arg, void (*free_arg)(void *)) {
    LOCK;
    push_fn(stream_of(s), what, [fn, arg, free_arg]() {
        fn(arg);
        if (free_arg) free_arg(arg);
    });
}

extern "C" void emu_enqueue_when(cudaStream_t s, const char *what, int (*can_start)(void *), void (*fn)(void *),
                                 void *arg, void (*free_arg)(void *)) {
    LOCK;
    CUstream_st *x = stream_of(s);
    legacy_order(x);
    op o{ op::GUARD, [fn, arg, free_arg]() {
             fn(arg);
             if (free_arg) free_arg(arg);
         }, nullptr, what, [can_start, arg]() { return can_start(arg) != 0; } };
    x->q.push_back(std::move(o));
}

extern "C" int emu_is_device(const void *p, size_t bytes) {
    LOCK;
    return p && inside(p, bytes, true);
}

extern "C" int emu_is_pinned(const void *p, size_t bytes) {
    LOCK;
    return p && inside(p, bytes, false);
}

extern "C" void emu_fatal(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpu-emu: %s (seed %llu: BALLAST_EMU_SEED=%llu replays it)\n", msg, (unsigned long long)g_seed,
            (unsigned long long)g_seed);
    fflush(stderr);
    abort();
}

/* ---- errors and versions ---- */

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define N(x) case x: return #x;
        N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInitializationError)
        N(cudaErrorInvalidConfiguration) N(cudaErrorInsufficientDriver) N(cudaErrorInvalidDeviceFunction)
        N(cudaErrorNoDevice) N(cudaErrorInvalidDevice) N(cudaErrorNoKernelImageForDevice)
        N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady) N(cudaErrorIllegalAddress)
        N(cudaErrorLaunchOutOfResources) N(cudaErrorHostMemoryAlreadyRegistered) N(cudaErrorHostMemoryNotRegistered)
        N(cudaErrorLaunchFailure)
#undef N
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return cudaGetErrorName(e);
    }
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }

/* ---- device ---- */

static int device_count(void) {
    return (int)env_long("BALLAST_EMU_DEVICES", 1, 0, 16, "the number of emulated GPUs");
}
static size_t device_bytes(void) {
    return (size_t)env_long("BALLAST_EMU_DEVICE_MIB", 8192, 16, 1 << 20, "emulated GPU memory in MiB") << 20;
}

cudaError_t cudaGetDeviceCount(int *n) {
    LOCK;
    seed();
    *n = device_count();
    return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d) {
    LOCK;
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    g_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) { *d = g_device; return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "ballast gpu-emu (sm_90 on the CPU)");
    p->totalGlobalMem = device_bytes();
    p->sharedMemPerBlock = smem_default();
    p->sharedMemPerBlockOptin = smem_optin();
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 4;
    p->pciBusID = d + 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    LOCK;
    sync_all("cudaDeviceSynchronize");
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    *least = 0, *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    LOCK;
    *total = device_bytes();
    *free_bytes = *total - g_device_used;
    return cudaSuccess;
}

/* ---- memory ---- */

cudaError_t cudaMalloc(void **p, size_t bytes) {
    LOCK;
    seed();
    *p = nullptr;
    if (g_device_used + bytes > device_bytes()) return fail(cudaErrorMemoryAllocation);
    size_t n = bytes ? bytes : 1;
    void *m = nullptr; /* exactly n bytes, so AddressSanitizer flags the first byte past them */
    if (posix_memalign(&m, 256, n) != 0) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, n); /* fresh device memory is garbage: NaN, not zero */
    g_mem[(uintptr_t)m] = alloc{ n, MEM_DEVICE };
    g_device_used += n;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    LOCK;
    if (!p) return cudaSuccess;
    auto it = g_mem.find((uintptr_t)p);
    if (it == g_mem.end() || it->second.kind != MEM_DEVICE) return fail(cudaErrorInvalidValue);
    sync_all("cudaFree"); /* as CUDA: in-flight work on it finishes first */
    g_device_used -= it->second.bytes;
    g_mem.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    LOCK;
    (void)flags;
    size_t n = bytes ? bytes : 1;
    void *m = nullptr;
    if (posix_memalign(&m, 4096, n) != 0) return fail(cudaErrorMemoryAllocation);
    g_mem[(uintptr_t)m] = alloc{ n, MEM_PINNED };
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void *p) {
    LOCK;
    if (!p) return cudaSuccess;
    auto it = g_mem.find((uintptr_t)p);
    if (it == g_mem.end() || it->second.kind != MEM_PINNED) return fail(cudaErrorInvalidValue);
    sync_all("cudaFreeHost");
    g_mem.erase(it);
    free(p);
    return cudaSuccess;
}

/* Every page of [p, p + bytes) mapped writable (/proc/self/maps). */
static bool writable(const void *p, size_t bytes) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return true;
    uintptr_t at = (uintptr_t)p, end = at + bytes;
    char line[512];
    while (at < end && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
        if (lo <= at && at < hi) {
            if (perms[1] != 'w') break;
            at = hi;
        }
    }
    fclose(f);
    return at >= end;
}

cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags) {
    LOCK;
    if (!p || !bytes) return fail(cudaErrorInvalidValue);
    uintptr_t a = (uintptr_t)p;
    auto it = g_mem.lower_bound(a);
    if (it != g_mem.end() && it->first < a + bytes) return fail(cudaErrorHostMemoryAlreadyRegistered);
    if (it != g_mem.begin()) {
        --it;
        if (it->first + it->second.bytes > a) return fail(cudaErrorHostMemoryAlreadyRegistered);
    }
    /* as the driver: pinning needs write access unless the caller says
     * read-only (cudaHostRegisterReadOnly) */
    if (!(flags & 0x08) && !writable(p, bytes)) return fail(cudaErrorInvalidValue);
    g_mem[a] = alloc{ bytes, MEM_REGISTERED };
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p) {
    LOCK;
    auto it = g_mem.find((uintptr_t)p);
    if (it == g_mem.end() || it->second.kind != MEM_REGISTERED) return fail(cudaErrorHostMemoryNotRegistered);
    sync_all("cudaHostUnregister"); /* copies from or to it finish first */
    g_mem.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    LOCK;
    return memcpy_on(&g_legacy, dst, src, bytes, kind, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    LOCK;
    return memcpy_on(stream_of(s), dst, src, bytes, kind, false, "cudaMemcpyAsync");
}

static cudaError_t memset_on(CUstream_st *s, void *p, int v, size_t bytes, const char *call) {
    if (!bytes) return cudaSuccess;
    if (!inside(p, bytes, true) && !inside(p, bytes, false))
        emu_fatal("%s: %zu bytes at %p are not (all) device or pinned memory", call, bytes, p);
    push_fn(s, call, [p, v, bytes]() { memset(p, v, bytes); });
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t bytes) {
    LOCK;
    return memset_on(&g_legacy, p, v, bytes, "cudaMemset");
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
    LOCK;
    return memset_on(stream_of(s), p, v, bytes, "cudaMemsetAsync");
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority) {
    LOCK;
    /* the emulator's order is random whatever the priority; it is kept for
     * cudaStreamGetPriority */
    CUstream_st *x = new CUstream_st{ {}, !(flags & cudaStreamNonBlocking), g_next_stream++ };
    x->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority; /* clamped to the range, as CUDA does */
    g_streams.push_back(x);
    *s = x;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) { return cudaStreamCreateWithPriority(s, flags, 0); }
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, cudaStreamDefault, 0); }
cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority) {
    LOCK;
    *priority = s ? s->priority : 0;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    LOCK;
    CUstream_st *x = stream_of(s);
    if (x == &g_legacy) return fail(cudaErrorInvalidResourceHandle);
    run_until([x]() { return x->q.empty(); }, "cudaStreamDestroy"); /* its work still completes */
    for (size_t i = 0; i < g_streams.size(); i++)
        if (g_streams[i] == x) g_streams.erase(g_streams.begin() + (long)i);
    delete x;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    LOCK;
    CUstream_st *x = stream_of(s);
    run_until([x]() { return x->q.empty(); }, "cudaStreamSynchronize");
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    LOCK;
    CUstream_st *x = stream_of(s);
    progress();
    return x->q.empty() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    LOCK;
    (void)flags;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    CUstream_st *x = stream_of(s);
    if (!e->last) return cudaSuccess; /* never recorded: nothing to wait for */
    legacy_order(x);
    x->q.push_back(op{ op::WAIT, nullptr, e->last, "cudaStreamWaitEvent" });
    return cudaSuccess;
}

/* ---- events ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = new CUevent_st{ nullptr, flags };
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    LOCK;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    delete e; /* pending records and waits hold their own state */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    LOCK;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    CUstream_st *x = stream_of(s);
    legacy_order(x);
    e->last = push_record(x);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    LOCK;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    std::shared_ptr<record> r = e->last;
    if (r) run_until([&r]() { return r->done; }, "cudaEventSynchronize");
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    LOCK;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    if (!e->last || e->last->done) return cudaSuccess;
    progress();
    return e->last->done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    LOCK;
    if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming) || !a->last || !b->last)
        return fail(cudaErrorInvalidResourceHandle);
    if (!a->last->done || !b->last->done) return fail(cudaErrorNotReady);
    *ms = (float)((b->last->t - a->last->t) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    LOCK;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
        fprintf(stderr, "gpu-emu: cudaFuncSetAttribute: attribute %d is not emulated\n", (int)attr);
        return fail(cudaErrorInvalidValue);
    }
    if (value < 0 || (size_t)value > smem_optin()) return fail(cudaErrorInvalidValue);
    set_max_dynamic_smem(func, value);
    return cudaSuccess;
}

} /* extern "C" */
