/* sched.cc: how the emulation tier runs a grid: blocks one after the other
 * in a random order, each block's threads as fibers (Boost.Context) that run
 * until a barrier, a warp collective or their end, in an order drawn anew
 * every round from the launch's seed.
 *
 * A block's steps: a warp drawn at random runs its runnable lanes (in
 * random order) until each blocks; a warp collective whose lanes have all
 * arrived then completes at once (a shuffle's values, a vote, a WMMA
 * operation, __syncwarp), so one warp may run far ahead of the others, as
 * warps do on the hardware; when every
 * live thread waits at __syncthreads, they must all wait at the same one
 * (else: an error naming two threads and their barriers) and go on
 * together. Anything else that leaves no thread runnable is a deadlock and
 * stops the run with each thread's state. Threads that have returned count
 * as arrived at later barriers, as on the hardware.
 *
 * The switches are Boost.Context's fcontext (make_fcontext/jump_fcontext,
 * libboost-context-dev): tens of nanoseconds each. glibc's swapcontext
 * makes a system call per switch (it saves the signal mask), which made a
 * check of a million-element kernel take minutes. Boost announces its
 * switches to AddressSanitizer only in its ucontext variant, so this file
 * does that itself (__sanitizer_start/finish_switch_fiber). */
#include "tests/emu/internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/detail/fcontext.hpp>

#include <algorithm>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

namespace bctx = boost::context::detail;

namespace emu {

thread_local thread_ctx *g_cur;

namespace {

enum state { READY, AT_BARRIER, AT_WARP, DONE };
enum warp_op { W_SYNCWARP, W_SHFL, W_VOTE, W_COLLECTIVE };
const char *const warp_op_name[] = { "__syncwarp", "a shuffle", "a vote", "a warp-wide operation" };

struct fiber {
    bctx::fcontext_t ctx = nullptr; /* where it resumes */
    char *stack = nullptr; /* usable part, above the guard page */
    size_t stack_size = 0;
    thread_ctx ctx_;
    state st = READY;
    const char *file = nullptr; /* where it waits */
    int line = 0;
    /* a pending warp operation */
    warp_op op = W_SYNCWARP;
    const char *what = nullptr;
    unsigned mask = 0;
    int kind = 0, arg = 0, width = 32, pred = 0;
    uint64_t bits = 0, result = 0;
    void *carg = nullptr;
    void (*cfn)(void **, int) = nullptr;
    void *fake_stack = nullptr;
};

struct shared_var {
    int id;
    void *p;
    size_t bytes;
};

struct block_run {
    const char *kernel;
    dim3 grid, block;
    uint3 bid;
    const std::function<void()> *body;
    std::vector<fiber> *f;
    unsigned nthreads;
    fiber *running = nullptr;
    bctx::fcontext_t sched = nullptr; /* where the scheduler resumes */
    const void *sched_stack = nullptr; /* for the sanitizer */
    size_t sched_stack_size = 0;
    std::vector<shared_var> shared;
    size_t static_smem = 0;
    void *dyn = nullptr;
    size_t dyn_bytes = 0, smem_limit = 0;
    uint64_t seed, launch_no;
};

thread_local block_run *g_blk;
thread_local std::vector<fiber> *g_fibers; /* reused across launches: stacks are costly */

size_t stack_bytes(void) {
    static size_t n;
    if (!n) {
        const char *e = getenv("BALLAST_EMU_STACK_KIB");
        long kib = e && *e ? strtol(e, nullptr, 10) : (EMU_ASAN ? 512 : 256);
        if (kib < 64 || kib > 65536) {
            fprintf(stderr, "gpu-emu: BALLAST_EMU_STACK_KIB=%s: give the fiber stack size in KiB, 64 to 65536\n", e);
            exit(2);
        }
        n = (size_t)kib << 10;
    }
    return n;
}

void alloc_stack(fiber &f) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = stack_bytes();
    char *m = (char *)mmap(nullptr, n + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) emu_fatal("cannot map a %zu KiB fiber stack: %s", n >> 10, strerror(errno));
    mprotect(m, page, PROT_NONE); /* an overflow faults instead of corrupting a neighbour */
    f.stack = m + page;
    f.stack_size = n;
}

const char *where(const fiber &f, char *buf, size_t n) {
    const thread_ctx &c = f.ctx_;
    switch (f.st) {
    case READY: snprintf(buf, n, "thread (%u,%u,%u) runnable", c.tid.x, c.tid.y, c.tid.z); break;
    case DONE: snprintf(buf, n, "thread (%u,%u,%u) returned", c.tid.x, c.tid.y, c.tid.z); break;
    case AT_BARRIER:
        snprintf(buf, n, "thread (%u,%u,%u) at __syncthreads %s:%d", c.tid.x, c.tid.y, c.tid.z, f.file, f.line);
        break;
    case AT_WARP:
        snprintf(buf, n, "thread (%u,%u,%u) at %s (%s) mask %#x", c.tid.x, c.tid.y, c.tid.z, warp_op_name[f.op],
                 f.what ? f.what : "", f.mask);
        break;
    }
    return buf;
}

[[noreturn]] void block_fatal(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    block_run *b = g_blk;
    emu_fatal("kernel %s, block (%u,%u,%u) of grid (%u,%u,%u) x block (%u,%u,%u), launch %llu: %s", b->kernel, b->bid.x,
              b->bid.y, b->bid.z, b->grid.x, b->grid.y, b->grid.z, b->block.x, b->block.y, b->block.z,
              (unsigned long long)b->launch_no, msg);
}

/* ---- switching ---- */

void fiber_entry(bctx::transfer_t t) {
    block_run *b = (block_run *)t.data;
    b->sched = t.fctx;
    fiber *f = b->running;
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &b->sched_stack, &b->sched_stack_size);
#endif
    (*b->body)();
    f->st = DONE;
    g_cur = nullptr;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, b->sched_stack, b->sched_stack_size); /* this stack is finished */
#endif
    bctx::jump_fcontext(b->sched, nullptr);
    abort(); /* never resumed */
}

/* From the scheduler into fiber f until it blocks or returns. */
void resume(block_run *b, fiber *f) {
    b->running = f;
    g_cur = &f->ctx_;
#if EMU_ASAN
    void *save = nullptr;
    __sanitizer_start_switch_fiber(&save, f->stack, f->stack_size);
#endif
    bctx::transfer_t t = bctx::jump_fcontext(f->ctx, b);
    f->ctx = t.fctx;
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(save, nullptr, nullptr);
#endif
    g_cur = nullptr;
    b->running = nullptr;
}

/* The running fiber (inside a kernel). */
fiber *self(const char *what) {
    block_run *b = g_blk;
    if (!b || !b->running) no_thread(what);
    return b->running;
}

/* From the running fiber back to the scheduler; returns when resumed. */
void yield(fiber *f) {
    block_run *b = g_blk;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&f->fake_stack, b->sched_stack, b->sched_stack_size);
#endif
    bctx::transfer_t t = bctx::jump_fcontext(b->sched, nullptr);
    b->sched = t.fctx;
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake_stack, &b->sched_stack, &b->sched_stack_size);
#endif
    g_cur = &f->ctx_;
}

/* ---- warp collectives ---- */

bool lane_exists(block_run *b, unsigned warp, unsigned lane) { return warp * 32 + lane < b->nthreads; }

/* Complete the collective of warp w whose first waiting lane is `first`,
 * if every lane it names has arrived; true when it did. */
bool try_warp(block_run *b, unsigned w) {
    std::vector<fiber> &F = *b->f;
    int first = -1;
    for (unsigned l = 0; l < 32 && lane_exists(b, w, l); l++)
        if (F[w * 32 + l].st == AT_WARP) { first = (int)l; break; }
    if (first < 0) return false;
    fiber &L = F[w * 32 + first];
    unsigned mask = L.mask;
    char a[256], c[256];
    if (!(mask >> first & 1))
        block_fatal("%s: lane %d's mask %#x leaves out the lane itself", where(L, a, sizeof a), first, mask);
    fiber *lanes[32] = { nullptr };
    for (unsigned l = 0; l < 32; l++) {
        if (!(mask >> l & 1) || !lane_exists(b, w, l)) continue;
        fiber &g = F[w * 32 + l];
        if (g.st == DONE)
            block_fatal("%s, but lane %u, named in the mask, has returned", where(L, a, sizeof a), l);
        if (g.st != AT_WARP) return false; /* not there yet */
        if (g.op != L.op || g.mask != L.mask || (L.op == W_SHFL && g.kind != L.kind))
            block_fatal("lanes of warp %u reach different warp operations: %s; %s", w, where(L, a, sizeof a),
                        where(g, c, sizeof c));
        lanes[l] = &g;
    }
    switch (L.op) {
    case W_SYNCWARP: break;
    case W_SHFL:
        for (unsigned l = 0; l < 32; l++) {
            fiber *g = lanes[l];
            if (!g) continue;
            int width = g->width, base = (int)l & ~(width - 1), s;
            if (width < 1 || width > 32 || (width & (width - 1)))
                block_fatal("%s: width %d is not a power of two from 1 to 32", where(*g, a, sizeof a), width);
            switch ((shfl_kind)g->kind) {
            case SHFL_IDX: s = base + (g->arg & (width - 1)); break;
            case SHFL_UP: s = (int)l - g->arg; if (s < base) s = (int)l; break;
            case SHFL_DOWN: s = (int)l + g->arg; if (s >= base + width) s = (int)l; break;
            default: s = (int)l ^ g->arg; if (s >= base + width) s = (int)l; break;
            }
            /* reading a lane outside the mask is undefined: it reads poison */
            g->result = s >= 0 && s < 32 && lanes[s] ? lanes[s]->bits : ~0ull;
        }
        break;
    case W_VOTE: {
        unsigned ballot = 0;
        for (unsigned l = 0; l < 32; l++)
            if (lanes[l] && lanes[l]->pred) ballot |= 1u << l;
        unsigned live = 0;
        for (unsigned l = 0; l < 32; l++)
            if (lanes[l]) live |= 1u << l;
        for (unsigned l = 0; l < 32; l++) {
            fiber *g = lanes[l];
            if (!g) continue;
            g->result = g->kind == VOTE_BALLOT ? ballot : g->kind == VOTE_ANY ? ballot != 0 : ballot == live;
        }
        break;
    }
    case W_COLLECTIVE: {
        void *args[32];
        int n = 0;
        for (unsigned l = 0; l < 32; l++)
            if (lanes[l]) args[n++] = lanes[l]->carg;
        if (n != 32 && lane_exists(b, w, 31))
            block_fatal("%s needs all 32 lanes of warp %u", L.what, w);
        L.cfn(args, n);
        break;
    }
    }
    for (unsigned l = 0; l < 32; l++)
        if (lanes[l]) lanes[l]->st = READY;
    return true;
}

fiber *arrive_warp(const char *what, warp_op op, unsigned mask) {
    fiber *f = self(what);
    f->st = AT_WARP;
    f->op = op;
    f->what = what;
    f->mask = mask;
    return f;
}

void run_block(block_run *b) {
    std::vector<fiber> &F = *b->f;
    rng r(b->seed);
    unsigned n = b->nthreads;
    for (unsigned i = 0; i < n; i++) {
        fiber &f = F[i];
        if (!f.stack) alloc_stack(f);
#if EMU_ASAN
        /* frames that returned were unpoisoned on return; fiber_entry's own
         * frame at the top never returns: clear the top of the stack */
        __asan_unpoison_memory_region(f.stack + f.stack_size - 16384, 16384);
#endif
        f.st = READY;
        f.fake_stack = nullptr;
        f.ctx_.tid = uint3{ i % b->block.x, (i / b->block.x) % b->block.y, i / (b->block.x * b->block.y) };
        f.ctx_.bid = b->bid;
        f.ctx_.bdim = b->block;
        f.ctx_.gdim = b->grid;
        f.ctx_.lane = i % 32;
        f.ctx_.warp = i / 32;
        f.ctx = bctx::make_fcontext(f.stack + f.stack_size, f.stack_size, fiber_entry);
    }
    std::vector<unsigned> order;
    order.reserve(n);
    unsigned nwarps = (n + 31) / 32;
    std::vector<unsigned> warps;
    for (;;) {
        /* a random warp with runnable lanes runs them (in random order) to
         * their next blocking point; its warp collective completes at once,
         * so a warp may run far ahead of the others, as on the hardware */
        warps.clear();
        for (unsigned w = 0; w < nwarps; w++)
            for (unsigned l = 0; l < 32 && w * 32 + l < n; l++)
                if (F[w * 32 + l].st == READY) { warps.push_back(w); break; }
        if (!warps.empty()) {
            unsigned w = warps[r.below((unsigned)warps.size())];
            order.clear();
            for (unsigned l = 0; l < 32 && w * 32 + l < n; l++)
                if (F[w * 32 + l].st == READY) order.push_back(w * 32 + l);
            for (unsigned i = (unsigned)order.size(); i > 1; i--) std::swap(order[i - 1], order[r.below(i)]);
            for (unsigned i : order) resume(b, &F[i]);
            while (try_warp(b, w)) {}
            continue;
        }
        bool progressed = false;
        for (unsigned w = 0; w < nwarps; w++)
            while (try_warp(b, w)) progressed = true;
        if (progressed) continue;
        int at_bar = -1;
        bool all_bar = true, any_live = false;
        for (unsigned i = 0; i < n; i++) {
            if (F[i].st == DONE) continue;
            any_live = true;
            if (F[i].st != AT_BARRIER) { all_bar = false; continue; }
            if (at_bar < 0) at_bar = (int)i;
        }
        if (!any_live) break;
        char a[256], c[256];
        if (all_bar) {
            fiber &L = F[at_bar];
            for (unsigned i = 0; i < n; i++) {
                fiber &g = F[i];
                if (g.st != AT_BARRIER) continue;
                if (g.line != L.line || strcmp(g.file, L.file) != 0)
                    block_fatal("threads of the block reach different barriers: %s; %s", where(L, a, sizeof a),
                                where(g, c, sizeof c));
            }
            for (unsigned i = 0; i < n; i++)
                if (F[i].st == AT_BARRIER) F[i].st = READY;
            continue;
        }
        /* deadlock: say what each kind of waiter waits at */
        std::string msg;
        int shown = 0;
        for (unsigned i = 0; i < n && shown < 4; i++)
            if (F[i].st != DONE) { msg += where(F[i], a, sizeof a); msg += "; "; shown++; }
        block_fatal("no thread can go on (a barrier or warp operation some threads never reach): %s", msg.c_str());
    }
}

} // namespace

[[noreturn]] void no_thread(const char *what) {
    emu_fatal("%s used outside a kernel (host code called device code?)", what);
}

/* ---- barriers and collectives ---- */

void syncthreads(const char *file, int line) {
    fiber *f = self("__syncthreads");
    f->st = AT_BARRIER;
    f->file = file;
    f->line = line;
    yield(f);
}

void syncwarp(const char *file, int line, unsigned mask) {
    (void)file, (void)line;
    fiber *f = arrive_warp("__syncwarp", W_SYNCWARP, mask);
    yield(f);
}

uint64_t shfl(unsigned mask, shfl_kind kind, uint64_t bits, int arg, int width) {
    static const char *const names[] = { "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync" };
    fiber *f = arrive_warp(names[kind], W_SHFL, mask);
    f->kind = kind;
    f->bits = bits;
    f->arg = arg;
    f->width = width;
    yield(f);
    return f->result;
}

unsigned vote(unsigned mask, vote_kind kind, int pred) {
    static const char *const names[] = { "__ballot_sync", "__any_sync", "__all_sync" };
    fiber *f = arrive_warp(names[kind], W_VOTE, mask);
    f->kind = kind;
    f->pred = pred != 0;
    yield(f);
    return (unsigned)f->result;
}

void warp_collective(const char *what, void (*fn)(void **args, int n), void *arg) {
    fiber *f = arrive_warp(what, W_COLLECTIVE, 0xffffffffu);
    f->cfn = fn;
    f->carg = arg;
    yield(f);
}

/* ---- shared memory ---- */

void *shared_at(int id, size_t bytes, size_t align) {
    block_run *b = g_blk;
    if (!b || !b->running) no_thread("__shared__ memory");
    for (shared_var &v : b->shared)
        if (v.id == id) {
            if (v.bytes != bytes)
                block_fatal("one __shared__ variable asked with two sizes (%zu and %zu bytes)", v.bytes, bytes);
            return v.p;
        }
    b->static_smem += bytes;
    if (b->static_smem + b->dyn_bytes > b->smem_limit)
        block_fatal("the block uses %zu bytes of shared memory (%zu static, %zu dynamic), more than the %zu it may "
                    "have (48 KiB without cudaFuncSetAttribute(MaxDynamicSharedMemorySize))",
                    b->static_smem + b->dyn_bytes, b->static_smem, b->dyn_bytes, b->smem_limit);
    size_t a = align < 16 ? 16 : align, rounded = (bytes + a - 1) / a * a;
    void *p = aligned_alloc(a, rounded ? rounded : a);
    if (!p) emu_fatal("out of host memory for %zu bytes of shared memory", bytes);
    memset(p, 0xff, rounded); /* uninitialized shared memory reads as NaN */
    b->shared.push_back(shared_var{ id, p, bytes });
    return p;
}

void *dyn_shared(void) {
    block_run *b = g_blk;
    if (!b || !b->running) no_thread("extern __shared__ memory");
    if (!b->dyn) block_fatal("extern __shared__ memory used, but the launch gave 0 bytes of it");
    return b->dyn;
}

/* ---- grids ---- */

void run_grid(const char *name, dim3 grid, dim3 block, size_t smem, size_t smem_limit,
              const std::function<void()> &body, uint64_t launch_no) {
    unsigned n = block.x * block.y * block.z;
    if (!g_fibers) g_fibers = new std::vector<fiber>();
    if (g_fibers->size() < n) g_fibers->resize(n);
    size_t nblocks = (size_t)grid.x * grid.y * grid.z;
    rng r(seed() ^ (launch_no * 0x9E3779B97F4A7C15ull));
    /* blocks in a random order: no block may depend on another's progress */
    std::vector<size_t> order(nblocks);
    for (size_t i = 0; i < nblocks; i++) order[i] = i;
    for (size_t i = nblocks; i > 1; i--) std::swap(order[i - 1], order[r.next() % i]);
    for (size_t bi : order) {
        block_run b;
        b.kernel = name;
        b.grid = grid;
        b.block = block;
        b.bid = uint3{ (unsigned)(bi % grid.x), (unsigned)(bi / grid.x % grid.y), (unsigned)(bi / ((size_t)grid.x * grid.y)) };
        b.body = &body;
        b.f = g_fibers;
        b.nthreads = n;
        b.seed = r.next();
        b.launch_no = launch_no;
        b.dyn_bytes = smem;
        b.smem_limit = smem_limit;
        if (smem) {
            size_t rounded = (smem + 127) / 128 * 128;
            b.dyn = aligned_alloc(128, rounded);
            if (!b.dyn) emu_fatal("out of host memory for %zu bytes of dynamic shared memory", smem);
            memset(b.dyn, 0xff, rounded);
#if EMU_ASAN
            /* the rounding is not the kernel's: an access past smem is an overrun */
            __asan_poison_memory_region((char *)b.dyn + smem, rounded - smem);
#endif
        }
        g_blk = &b;
        run_block(&b);
        g_blk = nullptr;
        for (shared_var &v : b.shared) free(v.p);
        if (b.dyn) {
#if EMU_ASAN
            __asan_unpoison_memory_region(b.dyn, (smem + 127) / 128 * 128);
#endif
            free(b.dyn);
        }
    }
}

} // namespace emu
