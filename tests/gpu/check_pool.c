/* check_pool.c: ballastd's pool registered for DMA, and the speed of
 * device<->pool copies.
 *
 * Starts its own ballastd (a 2.5 GiB pool in two segments of 1.25 GiB, on a socket in a
 * temporary directory), opens a shared-memory session through the client
 * library, registers the mapped segments (pool_register), reserves two
 * 1 GiB blobs and copies between them and the GPU:
 *   - correctness: random bytes pool -> device -> pool (other blob) through
 *     pool_copy_async, compared byte for byte;
 *   - bandwidth, H2D and D2H, at 1 MiB, 16 MiB, 256 MiB and 1 GiB (best of
 *     5, cudaEvent timing) from the pool and from cudaHostAlloc memory of
 *     the same size; from 16 MiB up the pool must reach 0.95 of
 *     cudaHostAlloc (the target), and both are shown against the link's
 *     peak (PCIe generation and width from NVML when it loads, else
 *     "unknown"), plus pageable malloc memory at 256 MiB for scale;
 *   - fallback: a mapping the driver cannot pin (read-only) gives a handle
 *     with pool_registered() false and a warning, not an error.
 * Without a GPU the ballastd part still runs with a small pool (the mapped
 * segments are what oc_segments() reports) and the GPU cases SKIP.
 *
 * Built two ways: by the Makefile (ballastd and the client library
 * available: the above), and by tests/gpu/run.sh on a bare GPU machine with
 * -DGPU_STANDALONE, where neither is: then the "pool" is a sealed memfd
 * made the way ballastd makes its segments (common/shm.c), and the output
 * says so. TAP output; flags: --ballastd PATH, --max-mib N (largest size),
 * --json FILE (one line per measurement). */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/gpu/gpucheck.h"
#include "workers/backend/cuda/pool_register.h"
#ifndef GPU_STANDALONE
#include "workers/offload/client.h"
#endif
#include "common/shm.h"

#define MIB ((size_t)1 << 20)
#define REPS 5

static const char *o_ballastd, *o_json;
static uint64_t o_max_mib = 1024;

/* ---- TAP without a GPU requirement ---- */

static void tap(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s - pool/", ok ? "ok" : "not ok");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    GC.cases++;
    if (!ok) GC.failed++;
}

/* ---- the pool: ballastd's, or a memfd of the same kind ---- */

typedef struct {
    be_range_t segs[8];
    uint32_t nsegs;
    void *region[2];          /* two regions of `bytes` inside the pool */
    uint64_t bytes;
    const char *what;         /* for the output */
    const char *label;        /* "source" in the JSON lines */
#ifndef GPU_STANDALONE
    pid_t pid;
    char dir[64];
    oc_client_t *oc;
    oc_buf_t b[2];
    oc_key_t k[2];
#else
    shm_seg_t shm;
#endif
} pool_t;

#ifndef GPU_STANDALONE
static void pool_close(pool_t *p) {
    if (p->oc) {
        for (int i = 0; i < 2; i++)
            if (p->b[i].ptr) oc_put_abort(p->oc, &p->k[i], &p->b[i]);
        oc_close(p->oc, false);
    }
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        int st;
        for (int i = 0; i < 100 && waitpid(p->pid, &st, WNOHANG) == 0; i++) usleep(50000);
        if (waitpid(p->pid, &st, WNOHANG) == 0) { kill(p->pid, SIGKILL); waitpid(p->pid, &st, 0); }
    }
    if (p->dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", p->dir);
        if (system(cmd)) {}
    }
}

/* Start ballastd with a pool of `pool` bytes in segments of `seg` bytes and
 * reserve two regions of `bytes` in it. 0, or -1 with a message. */
static int pool_open(pool_t *p, uint64_t pool, uint64_t seg, uint64_t bytes, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->what = "ballastd pool";
    p->label = "ballastd-pool";
    snprintf(p->dir, sizeof p->dir, "/tmp/ballast-poolchk-XXXXXX");
    if (!mkdtemp(p->dir)) { p->dir[0] = 0; snprintf(err, errlen, "mkdtemp: %s", strerror(errno)); return -1; }
    char sock[128], ports[128], logf[128], pb[32], sb[32];
    snprintf(sock, sizeof sock, "%s/bd.sock", p->dir);
    snprintf(ports, sizeof ports, "%s/ports", p->dir);
    snprintf(logf, sizeof logf, "%s/ballastd.log", p->dir);
    snprintf(pb, sizeof pb, "%llu", (unsigned long long)pool);
    snprintf(sb, sizeof sb, "%llu", (unsigned long long)seg);
    fflush(NULL); /* the child must not write our buffered output again */
    p->pid = fork();
    if (p->pid < 0) { snprintf(err, errlen, "fork: %s", strerror(errno)); return -1; }
    if (p->pid == 0) {
        FILE *f = freopen(logf, "w", stdout);
        if (f) dup2(fileno(stdout), 2);
        execl(o_ballastd, o_ballastd, "--socket", sock, "--port-file", ports, "--pool-bytes", pb, "--segment-bytes", sb,
              "--session-quota", pb, "--log-level", "warn", (char *)NULL);
        fprintf(stderr, "exec %s: %s\n", o_ballastd, strerror(errno));
        _exit(127);
    }
    struct stat sst;
    for (int i = 0; i < 400 && (stat(ports, &sst) || sst.st_size == 0); i++) {
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            snprintf(err, errlen, "%s exited at start (see its log: %s)", o_ballastd, logf);
            return -1;
        }
        usleep(25000);
    }
    char addr[160];
    snprintf(addr, sizeof addr, "unix:%s", sock);
    oc_options_t oo = { .addr = addr, .job = "gpu-pool-check", .rank = 0, .timeout_s = 30 };
    if (oc_open(&oo, &p->oc) != STATUS_OK) { snprintf(err, errlen, "oc_open: %s", oc_last_error()); return -1; }
    p->bytes = bytes;
    for (int i = 0; i < 2; i++) {
        p->k[i] = (oc_key_t){ .rank = 0, .kind = OC_KIND_OTHER, .index = (uint64_t)i, .step = 1 };
        if (oc_put_alloc(p->oc, &p->k[i], bytes, false, &p->b[i]) != STATUS_OK) {
            snprintf(err, errlen, "oc_put_alloc(%llu bytes): %s", (unsigned long long)bytes, oc_last_error());
            return -1;
        }
        p->region[i] = p->b[i].ptr;
    }
    /* the job's segments exist once it has stored something (ballastd makes them on demand) */
    const oc_segment_t *s = oc_segments(p->oc, &p->nsegs);
    if (!s || p->nsegs == 0 || p->nsegs > 8) {
        snprintf(err, errlen, "oc_segments: %u segments (shared-memory mode expected, 1..8)", p->nsegs);
        return -1;
    }
    for (uint32_t i = 0; i < p->nsegs; i++) p->segs[i] = (be_range_t){ s[i].base, (size_t)s[i].bytes };
    return 0;
}
#else
static void pool_close(pool_t *p) { shm_destroy(&p->shm); }

static int pool_open(pool_t *p, uint64_t pool, uint64_t seg, uint64_t bytes, char *err, size_t errlen) {
    (void)seg;
    memset(p, 0, sizeof *p);
    p->what = "sealed memfd (no ballastd in this build)";
    p->label = "memfd-pool";
    if (shm_create(&p->shm, "ballast-poolchk", pool, 0, err, errlen)) return -1;
    p->segs[0] = (be_range_t){ p->shm.base, p->shm.bytes };
    p->nsegs = 1;
    p->bytes = bytes;
    p->region[0] = p->shm.base;
    p->region[1] = (char *)p->shm.base + bytes;
    return 0;
}
#endif

/* Whether [ptr, ptr + n) lies inside one of the segments. */
static bool in_pool(const pool_t *p, const void *ptr, uint64_t n) {
    for (uint32_t i = 0; i < p->nsegs; i++) {
        const char *b = p->segs[i].base;
        if ((const char *)ptr >= b && (const char *)ptr + n <= b + p->segs[i].bytes) return true;
    }
    return false;
}

/* ---- link peak ---- */

/* PCIe peak per direction in GB/s from NVML's generation and width; 0 and
 * a reason when NVML cannot tell. */
static double link_peak(char *desc, size_t len) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) { snprintf(desc, len, "unknown (libnvidia-ml.so.1 not loadable)"); return 0; }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*get)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*gen)(void *, unsigned *) = (int (*)(void *, unsigned *))dlsym(h, "nvmlDeviceGetMaxPcieLinkGeneration");
    int (*wid)(void *, unsigned *) = (int (*)(void *, unsigned *))dlsym(h, "nvmlDeviceGetMaxPcieLinkWidth");
    int (*cgen)(void *, unsigned *) = (int (*)(void *, unsigned *))dlsym(h, "nvmlDeviceGetCurrPcieLinkGeneration");
    int (*cwid)(void *, unsigned *) = (int (*)(void *, unsigned *))dlsym(h, "nvmlDeviceGetCurrPcieLinkWidth");
    void *dev = NULL;
    unsigned g = 0, w = 0, cg = 0, cw = 0;
    int dnum = 0;
    if (cudaGetDevice(&dnum) != cudaSuccess) dnum = 0;
    if (!init || !get || !gen || !wid || init() != 0 || get((unsigned)dnum, &dev) != 0 || gen(dev, &g) != 0 ||
        wid(dev, &w) != 0 || g == 0 || w == 0) {
        snprintf(desc, len, "unknown (NVML gives no PCIe generation/width)");
        return 0;
    }
    if (cgen) cgen(dev, &cg);
    if (cwid) cwid(dev, &cw);
    /* GT/s per lane and line coding: gen 1-2 8b/10b, gen 3-5 128b/130b, gen 6 FLIT (~242/256) */
    static const double gts[] = { 0, 2.5, 5, 8, 16, 32, 64 };
    if (g > 6) { snprintf(desc, len, "unknown (PCIe generation %u)", g); return 0; }
    double code = g <= 2 ? 0.8 : g <= 5 ? 128.0 / 130.0 : 242.0 / 256.0;
    double peak = gts[g] * w * code / 8.0;
    snprintf(desc, len, "PCIe gen%u x%u = %.1f GB/s per direction (NVML; link now gen%u x%u)", g, w, peak, cg, cw);
    return peak;
}

/* ---- bandwidth ---- */

/* Best of REPS copies of n bytes, GB/s (1e9 bytes/s), timed with events. */
static double bandwidth(void *dev, void *host, size_t n, bool h2d, cudaStream_t s) {
    cudaEvent_t a, b;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) return -1;
    float best = 1e30f;
    for (int r = 0; r < REPS; r++) {
        cudaError_t e = cudaEventRecord(a, s);
        if (e == cudaSuccess) e = h2d ? cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s)
                                      : cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess) e = cudaEventRecord(b, s);
        if (e == cudaSuccess) e = cudaEventSynchronize(b);
        float ms = 0;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
        if (e != cudaSuccess) {
            printf("#   copy of %zu bytes: %s\n", n, cudaGetErrorString(e));
            cudaEventDestroy(a), cudaEventDestroy(b);
            return -1;
        }
        if (ms < best) best = ms;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return n / (best * 1e-3) / 1e9;
}

static void json_line(const char *src, const char *dir, size_t n, double gbs, double ratio, double peak) {
    if (!o_json) return;
    FILE *f = fopen(o_json, "a");
    if (!f) return;
    fprintf(f, "{\"kind\":\"pool_bw\",\"source\":\"%s\",\"dir\":\"%s\",\"bytes\":%zu,\"gbs\":%.3f,\"ratio\":%.4f,"
               "\"link_peak_gbs\":%.2f}\n", src, dir, n, gbs, ratio, peak);
    fclose(f);
}

/* ---- cases ---- */

static void check_accessor(const pool_t *p, uint64_t pool_bytes) {
    uint64_t sum = 0;
    bool ok = p->nsegs >= 1;
    for (uint32_t i = 0; i < p->nsegs; i++) {
        sum += p->segs[i].bytes;
        ok = ok && p->segs[i].base && p->segs[i].bytes > 0;
    }
    /* ballastd makes a job's segments on demand from the --pool-bytes
     * budget: after the two puts they hold both blobs, within the budget */
    tap(ok && sum >= 2 * (uint64_t)p->bytes && sum <= pool_bytes,
        "segments_hold_the_blobs (%u segments, %llu bytes for 2 blobs of %llu, budget %llu)", p->nsegs,
        (unsigned long long)sum, (unsigned long long)p->bytes, (unsigned long long)pool_bytes);
    tap(in_pool(p, p->region[0], p->bytes) && in_pool(p, p->region[1], p->bytes),
        "blob_regions_lie_in_mapped_segments");
    /* a byte written through the region is the byte in the segment mapping */
    ((volatile uint8_t *)p->region[0])[0] = 0xA5;
    ((volatile uint8_t *)p->region[1])[p->bytes - 1] = 0x5A;
    tap(((volatile uint8_t *)p->region[0])[0] == 0xA5 && ((volatile uint8_t *)p->region[1])[p->bytes - 1] == 0x5A,
        "regions_writable");
}

static void check_copies(const pool_t *p, pool_reg_t *reg, cudaStream_t s) {
    if (!gc_case("copy_roundtrip")) return;
    size_t n = (size_t)(p->bytes < 64 * MIB ? p->bytes : 64 * MIB) - 4093; /* odd length */
    uint8_t *a = p->region[0], *b = p->region[1];
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = gc_next();
        memcpy(a + i, &r, n - i < 8 ? n - i : 8);
    }
    memset(b, 0, n);
    void *d = NULL;
    char err[256];
    bool ok = cudaMalloc(&d, n) == cudaSuccess;
    ok = ok && !pool_copy_async(reg, d, a + 3, n - 3, true, s, err, sizeof err);
    ok = ok && !pool_copy_async(reg, d, b + 5, n - 5, false, s, err, sizeof err);
    ok = ok && cudaStreamSynchronize(s) == cudaSuccess;
    ok = ok && memcmp(a + 3, b + 5, n - 5) == 0;
    GC.cases++;
    printf("%s - pool/copy_roundtrip pool -> device -> pool, %zu bytes at odd offsets\n", ok ? "ok" : "not ok", n - 5);
    if (!ok) GC.failed++;
    cudaFree(d);
}

static void check_fallback(void) {
    if (!gc_case("fallback_when_unpinnable")) return;
    size_t n = 8 * MIB;
    void *ro = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ro == MAP_FAILED) { printf("ok - pool/fallback_when_unpinnable # SKIP mmap failed\n"); GC.cases++; return; }
    be_range_t seg = { ro, n };
    pool_reg_t *r = NULL;
    char err[256];
    int rc = pool_register(&r, &seg, 1, err, sizeof err);
    GC.cases++;
    if (rc == 0 && pool_registered(r))
        printf("ok - pool/fallback_when_unpinnable # SKIP this driver pinned a read-only mapping: no failure to provoke\n");
    else if (rc == 0 && r && !pool_registered(r) && pool_registrations(r) == 0)
        printf("ok - pool/fallback_when_unpinnable (registration refused: handle kept, pageable copies)\n");
    else {
        printf("not ok - pool/fallback_when_unpinnable: rc %d (%s)\n", rc, rc ? err : "");
        GC.failed++;
    }
    pool_unregister(r);
    munmap(ro, n);
}

static void check_bandwidth(const pool_t *p, pool_reg_t *reg, cudaStream_t s) {
    if (!gc_case("bandwidth")) return;
    char desc[200];
    double peak = link_peak(desc, sizeof desc);
    printf("# link: %s\n", desc);
    printf("# pool: %s, %s\n", p->what, pool_registered(reg) ? "registered (pinned)" : "NOT registered (pageable)");
    size_t maxn = (size_t)(o_max_mib * MIB < p->bytes ? o_max_mib * MIB : p->bytes);
    void *dev = NULL, *pinned = NULL;
    if (cudaMalloc(&dev, maxn) != cudaSuccess || cudaHostAlloc(&pinned, maxn, cudaHostAllocDefault) != cudaSuccess) {
        printf("not ok - pool/bandwidth: cannot allocate %zu bytes on the device and pinned\n", maxn);
        GC.cases++, GC.failed++;
        cudaFree(dev);
        return;
    }
    memset(pinned, 1, maxn);
    memset(p->region[0], 2, maxn);
    printf("# %-5s %10s %12s %12s %8s %8s\n", "dir", "size", "pool GB/s", "pinned GB/s", "ratio", "of peak");
    const size_t sizes[] = { 1 * MIB, 16 * MIB, 256 * MIB, 1024 * MIB };
    for (int dir = 0; dir < 2; dir++)
        for (int i = 0; i < 4; i++) {
            size_t n = sizes[i];
            if (n > maxn) continue;
            double bp = bandwidth(dev, p->region[0], n, dir == 0, s);
            double bh = bandwidth(dev, pinned, n, dir == 0, s);
            double ratio = bh > 0 ? bp / bh : 0;
            const char *dn = dir == 0 ? "H2D" : "D2H";
            char of[16] = "-";
            if (peak > 0) snprintf(of, sizeof of, "%.2f", bp / peak);
            printf("# %-5s %8zuMiB %12.2f %12.2f %8.3f %8s\n", dn, n / MIB, bp, bh, ratio, of);
            json_line(p->label, dn, n, bp, ratio, peak);
            json_line("cudaHostAlloc", dn, n, bh, 1.0, peak);
            if (n >= 16 * MIB) {
                /* emulated copies are memcpy: their timing says nothing */
                bool ok = bp > 0 && bh > 0 && (ratio >= 0.95 || gc_emulated());
                GC.cases++;
                printf("%s - pool/bandwidth_%s_%zuMiB pool %.2f GB/s vs cudaHostAlloc %.2f GB/s: ratio %.3f (target >= 0.95)\n",
                       ok ? "ok" : "not ok", dn, n / MIB, bp, bh, ratio);
                if (!ok) GC.failed++;
            }
        }
    size_t n = 256 * MIB < maxn ? 256 * MIB : maxn;
    void *pageable = malloc(n);
    if (pageable) {
        memset(pageable, 3, n);
        double a = bandwidth(dev, pageable, n, true, s), b = bandwidth(dev, pageable, n, false, s);
        printf("# pageable malloc memory, %zu MiB: H2D %.2f GB/s, D2H %.2f GB/s (what an unregistered pool gets)\n",
               n / MIB, a, b);
        json_line("pageable", "H2D", n, a, 0, peak);
        json_line("pageable", "D2H", n, b, 0, peak);
        free(pageable);
    }
    cudaFreeHost(pinned);
    cudaFree(dev);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ballastd") && i + 1 < argc) o_ballastd = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) o_json = argv[++i];
        else if (!strcmp(argv[i], "--max-mib") && i + 1 < argc) o_max_mib = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: check_pool [--ballastd PATH] [--max-mib N] [--json FILE]\n");
            return 2;
        }
    }
    if (o_max_mib < 16) o_max_mib = 16;
    static char path[4200];
    if (!o_ballastd) o_ballastd = getenv("BALLASTD");
    if (!o_ballastd) { /* build/tests/gpu/check_pool -> build/bin/ballastd */
        char self[4096];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len > 0) {
            self[len] = 0;
            char *sl = strrchr(self, '/');
            if (sl) *sl = 0;
            snprintf(path, sizeof path, "%s/../../bin/ballastd", self);
            o_ballastd = path;
        }
    }
    gc_init("pool");
    /* with a GPU the full size; without one a small pool for the accessor */
    uint64_t region = GC.have_gpu ? o_max_mib * MIB : 4 * MIB;
    uint64_t seg = region + (region / 4 > 4 * MIB ? region / 4 : 4 * MIB), pool_bytes = 2 * seg;
    pool_t p;
    char err[512];
    if (pool_open(&p, pool_bytes, seg, region, err, sizeof err)) {
        tap(false, "open_pool: %s", err);
        pool_close(&p);
        return gc_done();
    }
    printf("# %s: %u segments\n", p.what, p.nsegs);
    check_accessor(&p, pool_bytes);
    pool_reg_t *reg = NULL;
    if (gc_case("register")) {
        int rc = pool_register(&reg, p.segs, p.nsegs, err, sizeof err);
        tap(rc == 0 && pool_registered(reg) && pool_registrations(reg) >= p.nsegs,
            "register %u segments: %s, %u registrations, largest %llu MiB%s%s", p.nsegs,
            rc ? "error" : pool_registered(reg) ? "pinned" : "NOT pinned", pool_registrations(reg),
            (unsigned long long)(pool_largest_registration(reg) / MIB), rc ? ": " : "", rc ? err : "");
        cudaStream_t s;
        if (reg && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
            check_copies(&p, reg, s);
            check_bandwidth(&p, reg, s);
            cudaStreamDestroy(s);
        }
        pool_unregister(reg);
        /* registering again after unregistering works (no stale registrations) */
        rc = pool_register(&reg, p.segs, p.nsegs, err, sizeof err);
        tap(rc == 0 && pool_registered(reg), "register_again_after_unregister");
        pool_unregister(reg);
    } else {
        gc_case("copy_roundtrip");
        gc_case("bandwidth");
    }
    check_fallback();
    pool_close(&p);
    return gc_done();
}
