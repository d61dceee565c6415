/* cmd_doctor.c: `ballast doctor`: checks what training and ballastd need
 * from the machine or container they run in, and prints one line per check:
 * found (ok), missing, warn or skipped, with what was seen and the fix.
 *
 * Checks, in order (name: what it looks at):
 *   shm            size of /dev/shm (--shm-dir) against --min-shm
 *   memlock        RLIMIT_MEMLOCK against --min-memlock
 *   io_uring       io_uring_queue_init; EPERM/ENOSYS are explained through
 *                  kernel.io_uring_disabled or the seccomp profile
 *   spill_odirect  an O_DIRECT write and read-back of 4 KiB in --spill-dir
 *   spill_free     free space in --spill-dir against --min-free
 *   hugepages      reserved and free huge pages (/proc/meminfo), and
 *                  whether a 2 MiB memfd collapses into a transparent huge
 *                  page (what ballastd's default --huge-pages thp asks)
 *   gpu            libcuda.so.1 (dlopen), cuInit, driver version, devices;
 *                  libcudart (dlopen) cudaGetDeviceCount when present
 *   nccl           libnccl.so.2 (dlopen), ncclGetVersion
 *   host_register  cuMemHostRegister of a memfd mapping (what a worker does
 *                  with ballastd's pool), only with a GPU
 *   ballastd       grpc.health.v1 at --offload-socket / --offload-remote,
 *                  then an offload session opened and closed through the
 *                  client library (shared memory on a Unix socket: this
 *                  also proves the fd hand-over and the uid match)
 *   rendezvous     grpc.health.v1 at --master-addr:--master-port
 *                  (MASTER_ADDR / MASTER_PORT)
 *
 * Required checks make the exit status 1 when missing: shm, memlock,
 * ballastd, rendezvous (when an address is known), and gpu, nccl,
 * host_register with --backend cuda. The others are advisory (ballastd has
 * a fallback: threads instead of io_uring, buffered instead of direct I/O)
 * and only ever warn. --wait repeats the checks until nothing required is
 * missing (for an init container that starts next to ballastd). Nothing
 * here needs CUDA at build or run time: the
 * NVIDIA libraries are opened with dlopen. See docs/deploy.md. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <liburing.h>

#include "clock.h"

#include "grpc/health/v1/health.pb-c.h"
#include "log.h"
#include "shm.h"
#include "offload.pb-c.h"
#include "options.h"
#include "rpc.h"
#include "workers/cli/cli.h"
#include "workers/offload/client.h"

typedef enum { DS_OK, DS_MISSING, DS_WARN, DS_SKIPPED } doc_status_t;

static const char *const status_names[] = { "ok", "missing", "warn", "skipped" };

typedef struct {
    const char *name;     /* check name, e.g. "memlock" */
    bool required;        /* missing -> exit status 1 */
    doc_status_t st;
    char detail[640];     /* what was found */
    char fix[640];        /* what to do; "" when ok */
} doc_check_t;

/* options */
static const char *o_shm_dir, *o_spill_dir, *o_socket, *o_remote, *o_token_file, *o_master_addr, *o_skip;
static uint64_t o_min_shm, o_min_memlock, o_min_free;
static int64_t o_master_port, o_device;
static int o_backend;           /* 0 auto, 1 cpu, 2 cuda */
static bool o_json, o_need_huge;
static double o_timeout, o_wait;

enum { BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA };

static const opt_t doctor_opts[] = {
    { "backend", OPT_ENUM, "auto", 0, 0, "auto|cpu|cuda",
      "cuda: GPU, NCCL and host registration are required; cpu: not checked; auto: checked, advisory", &o_backend },
    { "device", OPT_INT, "0", 0, 1024, NULL, "GPU index for the GPU checks", &o_device },
    { "shm-dir", OPT_STRING, "/dev/shm", 0, 0, NULL, "the shared-memory mount to measure", &o_shm_dir },
    { "min-shm", OPT_SIZE, "1G", 0, 0, NULL, "smallest /dev/shm that passes (NCCL and the CPU collectives live there)", &o_min_shm },
    { "min-memlock", OPT_SIZE, "1G", 0, 0, NULL, "smallest RLIMIT_MEMLOCK that passes (unlimited always passes)", &o_min_memlock },
    { "spill-dir", OPT_STRING, "/var/lib/ballast/spill", 0, 0, NULL, "ballastd's spill directory to test for O_DIRECT and free space", &o_spill_dir },
    { "min-free", OPT_SIZE, "10G", 0, 0, NULL, "free space in --spill-dir below which the check warns", &o_min_free },
    { "need-huge-pages", OPT_BOOL, "false", 0, 0, NULL, "ballastd runs with --huge-pages 2M: warn when no reserved huge pages are free", &o_need_huge },
    { "offload-socket", OPT_STRING, "unix:/run/ballast/ballastd.sock", 0, 0, NULL, "ballastd's Unix socket (unix:/path)", &o_socket },
    { "offload-remote", OPT_STRING, NULL, 0, 0, NULL, "ballastd in remote mode, HOST:PORT (instead of the socket)", &o_remote },
    { "offload-token-file", OPT_STRING, NULL, 0, 0, NULL, "token for ballastd's remote mode (to open a test session)", &o_token_file },
    { "master-addr", OPT_STRING, NULL, 0, 0, NULL, "rendezvous host (default MASTER_ADDR; none: not checked)", &o_master_addr },
    { "master-port", OPT_INT, "-1", -1, 65535, NULL, "rendezvous port (-1: MASTER_PORT, else 29500)", &o_master_port },
    { "skip", OPT_STRING, "", 0, 0, NULL, "comma-separated checks not to run, e.g. rendezvous,gpu", &o_skip },
    { "timeout", OPT_DURATION, "3s", 0.01, 600, NULL, "how long each network check waits", &o_timeout },
    { "wait", OPT_DURATION, "0", 0, 86400, NULL, "repeat the checks every 2s until nothing required is missing or this much time passed (init containers)", &o_wait },
    { "json", OPT_BOOL, "false", 0, 0, NULL, "print one JSON object instead of lines", &o_json },
};

static void setf(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void setf(char *dst, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}
#define DETAIL(c, ...) setf((c)->detail, sizeof (c)->detail, __VA_ARGS__)
#define FIX(c, ...) setf((c)->fix, sizeof (c)->fix, __VA_ARGS__)

static bool skipped(const char *name) {
    size_t n = strlen(name);
    for (const char *p = o_skip; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

static const char *fs_name(long type) {
    switch ((unsigned long)type) {
    case 0x01021994: return "tmpfs";
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x794C7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x65735546: return "fuse";
    case 0x2FC12FC1: return "zfs";
    case 0x01021997: return "9p";
    default: return "other";
    }
}

/* ---- local resources ---- */

static void check_shm(doc_check_t *c) {
    struct statvfs v;
    if (statvfs(o_shm_dir, &v) != 0) {
        c->st = DS_MISSING;
        DETAIL(c, "%s: %s", o_shm_dir, strerror(errno));
        FIX(c, "mount a tmpfs at %s (docker run --shm-size=1g; Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm)", o_shm_dir);
        return;
    }
    struct statfs f;
    const char *fs = statfs(o_shm_dir, &f) == 0 ? fs_name((long)f.f_type) : "?";
    uint64_t size = (uint64_t)v.f_blocks * v.f_frsize, avail = (uint64_t)v.f_bavail * v.f_frsize;
    char a[32], b[32], m[32];
    format_size(size, a, sizeof a);
    format_size(avail, b, sizeof b);
    format_size(o_min_shm, m, sizeof m);
    DETAIL(c, "%s (%s): %s, %s free; needs >= %s", o_shm_dir, fs, a, b, m);
    if (size < o_min_shm) {
        c->st = DS_MISSING;
        FIX(c, "give the container a larger /dev/shm: docker run --shm-size=%s; compose: shm_size (BALLAST_SHM_SIZE); "
            "Kubernetes: emptyDir {medium: Memory, sizeLimit: %s} at /dev/shm (Docker's default is 64M)", m, m);
    }
}

static void check_memlock(doc_check_t *c) {
    struct rlimit r;
    if (getrlimit(RLIMIT_MEMLOCK, &r) != 0) {
        c->st = DS_MISSING;
        DETAIL(c, "getrlimit(RLIMIT_MEMLOCK): %s", strerror(errno));
        return;
    }
    char cur[32], hard[32], m[32];
    if (r.rlim_cur == RLIM_INFINITY) snprintf(cur, sizeof cur, "unlimited");
    else format_size(r.rlim_cur, cur, sizeof cur);
    if (r.rlim_max == RLIM_INFINITY) snprintf(hard, sizeof hard, "unlimited");
    else format_size(r.rlim_max, hard, sizeof hard);
    format_size(o_min_memlock, m, sizeof m);
    DETAIL(c, "RLIMIT_MEMLOCK %s (hard %s); needs unlimited or >= %s", cur, hard, m);
    if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur < o_min_memlock) {
        c->st = DS_MISSING;
        FIX(c, "ballastd cannot mlock its pool and NCCL over InfiniBand/EFA cannot register memory: "
            "docker run --ulimit memlock=-1; compose: ulimits: memlock: -1; Kubernetes: the runtime's limit "
            "(containerd/docker systemd unit LimitMEMLOCK=infinity); a shell: ulimit -l unlimited "
            "(/etc/security/limits.conf: '* - memlock unlimited')");
    }
}

static int read_int_file(const char *path, long *out) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fscanf(f, "%ld", out) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

static void check_io_uring(doc_check_t *c) {
    struct io_uring ring;
    int rc = io_uring_queue_init(8, &ring, 0);
    if (rc == 0) {
        io_uring_queue_exit(&ring);
        DETAIL(c, "io_uring_setup works: ballastd's spill tier can use --io-backend io_uring");
        return;
    }
    c->st = DS_WARN;
    long dis = -1;
    read_int_file("/proc/sys/kernel/io_uring_disabled", &dis);
    if (rc == -EPERM && dis == 2) {
        DETAIL(c, "io_uring_setup: EPERM: kernel.io_uring_disabled=2 (off for everyone); ballastd uses its thread pool");
        FIX(c, "on the host: sysctl -w kernel.io_uring_disabled=0 (or leave it: threads are slower for NVMe spill, not wrong)");
    } else if (rc == -EPERM && dis == 1) {
        DETAIL(c, "io_uring_setup: EPERM: kernel.io_uring_disabled=1 and this process is not in kernel.io_uring_group");
        FIX(c, "on the host: add ballastd's group to kernel.io_uring_group or set kernel.io_uring_disabled=0");
    } else if (rc == -EPERM || rc == -ENOSYS) {
        DETAIL(c, "io_uring_setup: %s: blocked by the seccomp profile (Docker 25+/containerd 2.0 default) or a kernel "
               "without io_uring; ballastd falls back to its thread pool", rc == -EPERM ? "EPERM" : "ENOSYS");
        FIX(c, "docker run --security-opt seccomp=docker/seccomp-io_uring.json; Kubernetes: seccompProfile "
            "{type: Localhost, localhostProfile: ballast/seccomp-io_uring.json}; kernel 5.6+ with CONFIG_IO_URING");
    } else {
        DETAIL(c, "io_uring_setup: %s; ballastd falls back to its thread pool", strerror(-rc));
        FIX(c, "io_uring needs kernel 5.6+, enough RLIMIT_MEMLOCK on kernels before 5.12, and a seccomp profile that allows it");
    }
}

static void check_spill_odirect(doc_check_t *c) {
    struct stat st;
    int se = stat(o_spill_dir, &st) != 0 ? errno : 0;
    if (se || !S_ISDIR(st.st_mode)) {
        c->st = DS_WARN;
        DETAIL(c, "spill directory %s: %s", o_spill_dir, se ? strerror(se) : "not a directory");
        FIX(c, "create it on a local NVMe filesystem, owned by ballastd's user (uid 10001 in the images), or pass "
            "--spill-dir (BALLAST_SPILL_DIR); only needed where ballastd runs with --spill-dir");
        return;
    }
    struct statfs f;
    const char *fs = statfs(o_spill_dir, &f) == 0 ? fs_name((long)f.f_type) : "?";
    char path[4200];
    snprintf(path, sizeof path, "%s/.ballast-doctor-XXXXXX", o_spill_dir);
    int tfd = mkstemp(path);
    if (tfd < 0) {
        c->st = DS_WARN;
        DETAIL(c, "cannot create a file in %s (%s): %s", o_spill_dir, fs, strerror(errno));
        FIX(c, "make %s writable by ballastd's user (uid 10001 in the images: chown 10001:10001)", o_spill_dir);
        return;
    }
    close(tfd);
    const size_t blk = 4096;
    void *buf = NULL, *back = NULL;
    int fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
    int e = errno;
    const char *what = NULL;
    if (fd < 0) what = "open(O_DIRECT)";
    else if (posix_memalign(&buf, blk, blk) || posix_memalign(&back, blk, blk)) { what = "allocate"; e = ENOMEM; }
    else {
        for (size_t i = 0; i < blk; i++) ((unsigned char *)buf)[i] = (unsigned char)(i * 131 + 7);
        ssize_t w = pwrite(fd, buf, blk, 0);
        e = errno;
        if (w != (ssize_t)blk) what = "pwrite(O_DIRECT)";
        else {
            ssize_t r = pread(fd, back, blk, 0);
            e = errno;
            if (r != (ssize_t)blk) what = "pread(O_DIRECT)";
            else if (memcmp(buf, back, blk) != 0) { what = "read-back compare"; e = EIO; }
        }
    }
    if (fd >= 0) close(fd);
    unlink(path);
    free(buf);
    free(back);
    if (what) {
        c->st = DS_WARN;
        DETAIL(c, "%s (%s): %s failed: %s; ballastd then spills with buffered I/O through the page cache",
               o_spill_dir, fs, what, e == EINVAL ? "EINVAL (the filesystem has no direct I/O)" : strerror(e));
        FIX(c, "put --spill-dir on a local NVMe filesystem with direct I/O (ext4, xfs), e.g. a hostPath on the node");
    } else {
        DETAIL(c, "%s (%s): a 4 KiB O_DIRECT write and read-back works", o_spill_dir, fs);
    }
}

static void check_spill_free(doc_check_t *c) {
    struct statvfs v;
    if (statvfs(o_spill_dir, &v) != 0) {
        c->st = DS_WARN;
        DETAIL(c, "spill directory %s: %s", o_spill_dir, strerror(errno));
        FIX(c, "create it or pass --spill-dir; only needed where ballastd runs with --spill-dir");
        return;
    }
    uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize, size = (uint64_t)v.f_blocks * v.f_frsize;
    char a[32], b[32], m[32];
    format_size(avail, a, sizeof a);
    format_size(size, b, sizeof b);
    format_size(o_min_free, m, sizeof m);
    DETAIL(c, "%s: %s free of %s; wants >= %s", o_spill_dir, a, b, m);
    if (avail < o_min_free) {
        c->st = DS_WARN;
        FIX(c, "free space there or lower ballastd's --spill-bytes to what fits (it refuses a spill tier larger than the free space)");
    }
}

static void check_hugepages(doc_check_t *c) {
    FILE *f = fopen("/proc/meminfo", "r");
    long total = -1, freep = -1, sz = -1;
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        sscanf(line, "HugePages_Total: %ld", &total);
        sscanf(line, "HugePages_Free: %ld", &freep);
        sscanf(line, "Hugepagesize: %ld kB", &sz);
    }
    if (f) fclose(f);
    /* what ballastd's default (--huge-pages thp) gets: one 2 MiB memfd
     * collapsed as the pool's segments are */
    shm_seg_t probe;
    char perr[SHM_ERR_LEN];
    int thp = -1; /* errno of the refusal; 0: collapsed; -1: no memfd */
    if (shm_create(&probe, "ballast-doctor-thp", SHM_HUGE_2M, SHM_THP, perr, sizeof perr) == 0) {
        thp = probe.thp_bytes ? 0 : probe.thp_errno;
        shm_destroy(&probe);
    }
    char thps[400];
    if (thp == 0) setf(thps, sizeof thps, "shared memory collapses into transparent huge pages (ballastd's default, --huge-pages thp)");
    else if (thp > 0) setf(thps, sizeof thps, "no transparent huge pages for shared memory: %s", shm_thp_why(thp));
    else setf(thps, sizeof thps, "no 2 MiB memfd to try transparent huge pages on: %s", perr);
    if (total < 0) {
        c->st = o_need_huge ? DS_WARN : thp == 0 ? DS_OK : DS_SKIPPED;
        DETAIL(c, "/proc/meminfo has no HugePages_Total (kernel without hugetlbfs); %s", thps);
        if (o_need_huge) FIX(c, "run ballastd with --huge-pages thp or off, not 2M");
        return;
    }
    DETAIL(c, "%ld huge pages of %ld kB reserved, %ld free; %s", total, sz, freep, thps);
    if (freep <= 0 && o_need_huge) {
        c->st = DS_WARN;
        FIX(c, "on the host: sysctl -w vm.nr_hugepages=N (N x %ld kB >= ballastd's --pool-bytes); "
            "Kubernetes: a hugepages-2Mi resource on the ballastd container", sz > 0 ? sz : 2048);
    } else if (freep <= 0 && thp != 0) {
        /* neither kind: the pool is on 4 KiB pages, which only slows spilling */
        c->st = DS_SKIPPED;
        FIX(c, "for 2 MiB pages in ballastd's pool (device-sized spill writes): %s",
            thp > 0 ? "see the reason above, or reserve huge pages (sysctl -w vm.nr_hugepages=N) and run ballastd "
                      "with --huge-pages 2M" : "reserve huge pages (sysctl -w vm.nr_hugepages=N) and run ballastd with --huge-pages 2M");
    }
}

/* ---- GPU (everything through dlopen) ---- */

typedef int (*cu_i_fn)(int *);
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_dev_get_fn)(int *, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_mem_fn)(size_t *, int);
typedef int (*cu_err_fn)(int, const char **);
typedef int (*cu_ctx_retain_fn)(void **, int);
typedef int (*cu_ctx_release_fn)(int);
typedef int (*cu_ctx_push_fn)(void *);
typedef int (*cu_ctx_pop_fn)(void **);
typedef int (*cu_reg_fn)(void *, size_t, unsigned);
typedef int (*cu_unreg_fn)(void *);

static struct {
    void *lib;
    bool ok;          /* gpu check passed: driver loaded, a device at --device */
    int dev;          /* CUdevice */
    cu_err_fn err_name;
} g_cu;

static const char *cu_err(int rc) {
    const char *s = NULL;
    if (g_cu.err_name && g_cu.err_name(rc, &s) == 0 && s) return s;
    return "CUDA error";
}

static void *sym(void *lib, const char *name) { return lib ? dlsym(lib, name) : NULL; }

static void check_gpu(doc_check_t *c) {
    g_cu.ok = false;
    g_cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!g_cu.lib) {
        c->st = DS_MISSING;
        DETAIL(c, "no NVIDIA driver library: %s", dlerror());
        FIX(c, "install the NVIDIA driver on the host and run with the NVIDIA container toolkit "
            "(docker run --gpus all; compose --profile gpu; Kubernetes: the device plugin and nvidia.com/gpu limits)");
        return;
    }
    cu_init_fn init = (cu_init_fn)sym(g_cu.lib, "cuInit");
    cu_i_fn drv = (cu_i_fn)sym(g_cu.lib, "cuDriverGetVersion"), count = (cu_i_fn)sym(g_cu.lib, "cuDeviceGetCount");
    cu_dev_get_fn get = (cu_dev_get_fn)sym(g_cu.lib, "cuDeviceGet");
    cu_name_fn name = (cu_name_fn)sym(g_cu.lib, "cuDeviceGetName");
    cu_mem_fn mem = (cu_mem_fn)sym(g_cu.lib, "cuDeviceTotalMem_v2");
    g_cu.err_name = (cu_err_fn)sym(g_cu.lib, "cuGetErrorName");
    if (!init || !drv || !count || !get || !name) {
        c->st = DS_MISSING;
        DETAIL(c, "libcuda.so.1 lacks the driver API entry points (cuInit, cuDeviceGetCount)");
        FIX(c, "reinstall the NVIDIA driver; the container toolkit mounts the host's libcuda.so.1");
        return;
    }
    int v = 0, n = 0, rc = init(0);
    drv(&v);
    if (rc != 0) {
        c->st = DS_MISSING;
        DETAIL(c, "driver %d.%d loaded, cuInit failed: %s (%d)", v / 1000, (v % 1000) / 10, cu_err(rc), rc);
        FIX(c, rc == 100 ? "no GPU is visible: check NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES and the nvidia.com/gpu limit"
                         : "check nvidia-smi on the host; the kernel module and libcuda.so.1 must be the same version");
        return;
    }
    count(&n);
    if (n <= o_device) {
        c->st = DS_MISSING;
        DETAIL(c, "driver %d.%d, %d GPU(s) visible, --device %lld is not one of them", v / 1000, (v % 1000) / 10, n,
               (long long)o_device);
        FIX(c, "use --device 0..%d or make more GPUs visible (CUDA_VISIBLE_DEVICES, nvidia.com/gpu)", n - 1);
        return;
    }
    char nm[128] = "?";
    size_t bytes = 0;
    get(&g_cu.dev, (int)o_device);
    name(nm, sizeof nm, g_cu.dev);
    if (mem) mem(&bytes, g_cu.dev);
    char mb[32];
    format_size(bytes, mb, sizeof mb);
    DETAIL(c, "driver %d.%d, %d GPU(s); device %lld: %s, %s", v / 1000, (v % 1000) / 10, n, (long long)o_device, nm, mb);
    /* The runtime library, when present as a shared library, must not be
     * newer than the driver (cudaErrorInsufficientDriver). */
    static const char *const rts[] = { "libcudart.so.13", "libcudart.so.12", "libcudart.so" };
    for (size_t i = 0; i < sizeof rts / sizeof rts[0]; i++) {
        void *rt = dlopen(rts[i], RTLD_NOW | RTLD_LOCAL);
        if (!rt) continue;
        cu_i_fn rcount = (cu_i_fn)sym(rt, "cudaGetDeviceCount"), rver = (cu_i_fn)sym(rt, "cudaRuntimeGetVersion");
        int rn = 0, rv = 0;
        int rrc = rcount ? rcount(&rn) : -1;
        if (rver) rver(&rv);
        size_t l = strlen(c->detail);
        setf(c->detail + l, sizeof c->detail - l, "; %s %d.%d: cudaGetDeviceCount %s %d", rts[i], rv / 1000,
             (rv % 1000) / 10, rrc == 0 ? "=" : "failed with", rrc == 0 ? rn : rrc);
        if (rrc != 0) {
            c->st = DS_MISSING;
            FIX(c, rrc == 35 ? "the CUDA runtime is newer than the driver: upgrade the host's driver or use an image with an older CUDA"
                             : "the CUDA runtime cannot use the GPU: check the driver with nvidia-smi");
            return;
        }
        break;
    }
    g_cu.ok = true;
}

static void check_nccl(doc_check_t *c) {
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        c->st = DS_MISSING;
        DETAIL(c, "libnccl.so.2 not found: %s", dlerror());
        FIX(c, "install NCCL (libnccl2 from NVIDIA's CUDA apt repository; the worker image has it) or add it to LD_LIBRARY_PATH");
        return;
    }
    cu_i_fn ver = (cu_i_fn)sym(lib, "ncclGetVersion");
    int v = 0;
    if (!ver || ver(&v) != 0) {
        c->st = DS_MISSING;
        DETAIL(c, "libnccl.so.2 loaded but ncclGetVersion %s", ver ? "failed" : "is missing");
        FIX(c, "reinstall libnccl2");
        dlclose(lib);
        return;
    }
    int major, minor, patch;
    if (v >= 10000) { major = v / 10000; minor = (v % 10000) / 100; patch = v % 100; }
    else { major = v / 1000; minor = (v % 1000) / 100; patch = v % 100; }
    const char *net = getenv("NCCL_NET"), *fi = getenv("FI_PROVIDER"), *ifn = getenv("NCCL_SOCKET_IFNAME");
    DETAIL(c, "NCCL %d.%d.%d (NCCL_SOCKET_IFNAME=%s, NCCL_NET=%s, FI_PROVIDER=%s)", major, minor, patch,
           ifn ? ifn : "-", net ? net : "-", fi ? fi : "-");
    dlclose(lib);
}

static void check_host_register(doc_check_t *c) {
    if (!g_cu.ok) {
        c->st = DS_SKIPPED;
        DETAIL(c, "no usable GPU (see the gpu check)");
        return;
    }
    cu_ctx_retain_fn retain = (cu_ctx_retain_fn)sym(g_cu.lib, "cuDevicePrimaryCtxRetain");
    cu_ctx_release_fn release = (cu_ctx_release_fn)sym(g_cu.lib, "cuDevicePrimaryCtxRelease_v2");
    if (!release) release = (cu_ctx_release_fn)sym(g_cu.lib, "cuDevicePrimaryCtxRelease");
    cu_ctx_push_fn push = (cu_ctx_push_fn)sym(g_cu.lib, "cuCtxPushCurrent_v2");
    cu_ctx_pop_fn pop = (cu_ctx_pop_fn)sym(g_cu.lib, "cuCtxPopCurrent_v2");
    cu_reg_fn reg = (cu_reg_fn)sym(g_cu.lib, "cuMemHostRegister_v2");
    cu_unreg_fn unreg = (cu_unreg_fn)sym(g_cu.lib, "cuMemHostUnregister");
    if (!retain || !release || !push || !pop || !reg || !unreg) {
        c->st = DS_MISSING;
        DETAIL(c, "libcuda.so.1 lacks cuMemHostRegister_v2 or the primary-context calls");
        FIX(c, "upgrade the NVIDIA driver");
        return;
    }
    const size_t len = 4u << 20;
    int fd = memfd_create("ballast-doctor", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        c->st = DS_MISSING;
        DETAIL(c, "memfd_create/ftruncate: %s", strerror(errno));
        FIX(c, "a kernel with memfd_create (3.17+) and a seccomp profile that allows it");
        if (fd >= 0) close(fd);
        return;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        c->st = DS_MISSING;
        DETAIL(c, "mmap of a 4M memfd: %s", strerror(errno));
        return;
    }
    memset(p, 0x5a, len);
    void *ctx = NULL, *old = NULL;
    int rc = retain(&ctx, g_cu.dev);
    if (rc == 0 && (rc = push(ctx)) != 0) release(g_cu.dev);
    if (rc != 0) {
        c->st = DS_MISSING;
        DETAIL(c, "no CUDA context on device %lld: %s (%d)", (long long)o_device, cu_err(rc), rc);
        FIX(c, "the GPU is in use in exclusive mode or faulted: check nvidia-smi");
        munmap(p, len);
        return;
    }
    rc = reg(p, len, 0);
    if (rc == 0) {
        unreg(p);
        DETAIL(c, "cuMemHostRegister of a 4M memfd mapping (what workers do with ballastd's pool) works");
    } else {
        c->st = DS_MISSING;
        DETAIL(c, "cuMemHostRegister of a 4M memfd mapping failed: %s (%d)", cu_err(rc), rc);
        FIX(c, "raise the memlock limit (docker --ulimit memlock=-1) and check that the IOMMU / the container allow "
            "pinning; without it, offload copies go through a bounce buffer");
    }
    pop(&old);
    release(g_cu.dev);
    munmap(p, len);
}

/* ---- services ---- */

/* grpc.health.v1 Check at addr; 0 when SERVING, else -1 with why. */
static int health(const char *addr, char *why, size_t cap) {
    char rerr[RPC_ERR_LEN];
    rpc_client_t *rc = rpc_client_open(addr, NULL, rerr, sizeof rerr);
    if (!rc) { snprintf(why, cap, "%s", rerr); return -1; }
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)"";
    Grpc__Health__V1__HealthCheckResponse *r = NULL;
    char msg[512];
    grpc_status_code st = rpc_call(rc, "/grpc.health.v1.Health/Check", (ProtobufCMessage *)&req,
                                   &grpc__health__v1__health_check_response__descriptor, (ProtobufCMessage **)&r,
                                   (int64_t)(o_timeout * 1000), false, msg, sizeof msg);
    int out = 0;
    if (st != GRPC_STATUS_OK) { snprintf(why, cap, "%s", msg); out = -1; }
    else {
        if (r->status != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) {
            snprintf(why, cap, "answers %s", r->status == 2 ? "NOT_SERVING (draining)" : "not SERVING");
            out = -1;
        }
        protobuf_c_message_free_unpacked((ProtobufCMessage *)r, NULL);
    }
    rpc_client_close(rc);
    return out;
}

/* Append ballastd's pool/mlock/io state from Stats to the detail (best effort). */
static void ballastd_stats(doc_check_t *c, const char *addr) {
    char rerr[RPC_ERR_LEN];
    rpc_client_t *rc = rpc_client_open(addr, NULL, rerr, sizeof rerr);
    if (!rc) return;
    Ballast__Offload__V1__StatsRequest req = BALLAST__OFFLOAD__V1__STATS_REQUEST__INIT;
    Ballast__Offload__V1__StatsResponse *r = NULL;
    char msg[256];
    if (rpc_call(rc, "/ballast.offload.v1.Offload/Stats", (ProtobufCMessage *)&req,
                 &ballast__offload__v1__stats_response__descriptor, (ProtobufCMessage **)&r,
                 (int64_t)(o_timeout * 1000), false, msg, sizeof msg) == GRPC_STATUS_OK) {
        char a[32], b[32];
        format_size(r->pool_bytes, a, sizeof a);
        format_size(r->pool_free_bytes, b, sizeof b);
        size_t l = strlen(c->detail);
        setf(c->detail + l, sizeof c->detail - l, "; pool %s (%s free, %s), io backend %s", a, b,
             r->mlocked ? "mlocked" : "NOT mlocked: raise its memlock limit", r->io_backend ? r->io_backend : "?");
        protobuf_c_message_free_unpacked((ProtobufCMessage *)r, NULL);
    }
    rpc_client_close(rc);
}

static void check_ballastd(doc_check_t *c) {
    bool remote = o_remote && o_remote[0];
    const char *addr = remote ? o_remote : o_socket;
    if (!addr || !addr[0]) {
        c->st = DS_MISSING;
        DETAIL(c, "no ballastd address: --offload-socket is empty");
        FIX(c, "pass --offload-socket unix:/run/ballast/ballastd.sock (BALLAST_OFFLOAD_SOCKET) or --offload-remote HOST:PORT");
        return;
    }
    char rpc_addr[600];
    if (addr[0] == '/') snprintf(rpc_addr, sizeof rpc_addr, "unix:%s", addr);
    else snprintf(rpc_addr, sizeof rpc_addr, "%s", addr);
    bool is_unix = strncmp(rpc_addr, "unix:", 5) == 0;
    const char *fix_start = remote
        ? "check the ballastd Deployment and Service (kubectl get pods -l app.kubernetes.io/name=ballastd-remote) "
          "and --offload-remote / BALLAST_OFFLOAD_REMOTE"
        : "start ballastd (compose: service ballastd; Kubernetes: the ballastd DaemonSet on this node; locally: "
          "ballastd --socket PATH) and share its socket directory with this container at the same path, or point "
          "--offload-socket / BALLAST_OFFLOAD_SOCKET at it";
    struct stat st;
    if (is_unix && !remote && stat(rpc_addr + 5, &st) != 0) {
        c->st = DS_MISSING;
        DETAIL(c, "%s: no socket file (%s)", rpc_addr, strerror(errno));
        FIX(c, "%s", fix_start);
        return;
    }
    char why[600];
    if (health(rpc_addr, why, sizeof why) != 0) {
        c->st = DS_MISSING;
        DETAIL(c, "%s does not answer grpc.health.v1: %s", rpc_addr, why);
        FIX(c, "%s", fix_start);
        return;
    }
    if (remote && !(o_token_file && o_token_file[0])) {
        DETAIL(c, "%s answers SERVING (remote mode; no --offload-token-file, so no test session)", rpc_addr);
        return;
    }
    oc_options_t oo = { 0 };
    oo.addr = rpc_addr;
    oo.job = "ballast-doctor";
    oo.rank = 0;
    oo.quota_bytes = 0;
    oo.token_file = o_token_file;
    oo.flags = remote ? OC_REMOTE : 0;
    oo.timeout_s = o_timeout;
    oo.client_name = "ballast-doctor";
    oc_client_t *cl = NULL;
    status_t s = oc_open(&oo, &cl);
    if (s != STATUS_OK) {
        c->st = DS_MISSING;
        DETAIL(c, "%s answers health checks but OpenSession fails: %s: %s", rpc_addr, status_name(s), oc_last_error());
        if (s == STATUS_PERMISSION_DENIED || s == STATUS_UNAUTHENTICATED)
            FIX(c, "run the worker with ballastd's uid (10001 in the images) or as root; in remote mode give the Secret's token "
                "(--offload-token-file)");
        else
            FIX(c, "see ballastd's log; `ballast status --socket PATH` shows its pool and sessions");
        return;
    }
    bool shared = oc_is_shared(cl);
    char q[40];
    if (oc_quota(cl)) format_size(oc_quota(cl), q, sizeof q);
    else snprintf(q, sizeof q, "none");
    oc_close(cl, false);
    DETAIL(c, "%s answers SERVING; a %s session opened and closed (quota %s)", rpc_addr,
           shared ? "shared-memory" : "remote", q);
    ballastd_stats(c, rpc_addr);
}

static void check_rendezvous(doc_check_t *c) {
    const char *host = o_master_addr && o_master_addr[0] ? o_master_addr : getenv("MASTER_ADDR");
    long port = o_master_port;
    if (port < 0) {
        const char *p = getenv("MASTER_PORT");
        char *end = NULL;
        port = p && p[0] ? strtol(p, &end, 10) : 29500;
        if (p && p[0] && (*end || port <= 0 || port > 65535)) {
            c->st = DS_MISSING;
            DETAIL(c, "MASTER_PORT=%s is not a port number", p);
            FIX(c, "set MASTER_PORT to 1..65535 (29500 by convention)");
            return;
        }
    }
    if (!host || !host[0]) {
        c->required = false;
        c->st = DS_SKIPPED;
        DETAIL(c, "no rendezvous address (--master-addr / MASTER_ADDR): a single process, or rank 0 serving it itself");
        return;
    }
    char addr[600], why[600];
    if (strchr(host, ':') && host[0] != '[') snprintf(addr, sizeof addr, "[%s]:%ld", host, port);
    else snprintf(addr, sizeof addr, "%s:%ld", host, port);
    if (health(addr, why, sizeof why) != 0) {
        c->st = DS_MISSING;
        DETAIL(c, "%s does not answer grpc.health.v1: %s", addr, why);
        FIX(c, "rank 0 serves the rendezvous once it runs: start it first, and check MASTER_ADDR/MASTER_PORT, DNS "
            "(the headless Service needs publishNotReadyAddresses: true) and network policies; skip this check "
            "before the job starts with --skip rendezvous");
        return;
    }
    DETAIL(c, "%s answers SERVING", addr);
}

/* ---- driver ---- */

typedef struct {
    const char *name;
    void (*fn)(doc_check_t *);
    int required;     /* 1 always, 0 never, 2 with --backend cuda */
} doc_def_t;

static const doc_def_t defs[] = {
    { "shm", check_shm, 1 },
    { "memlock", check_memlock, 1 },
    { "io_uring", check_io_uring, 0 },
    { "spill_odirect", check_spill_odirect, 0 },
    { "spill_free", check_spill_free, 0 },
    { "hugepages", check_hugepages, 0 },
    { "gpu", check_gpu, 2 },
    { "nccl", check_nccl, 2 },
    { "host_register", check_host_register, 2 },
    { "ballastd", check_ballastd, 1 },
    { "rendezvous", check_rendezvous, 1 },
};
#define NDEFS (sizeof defs / sizeof defs[0])

static bool is_gpu_check(const char *n) {
    return !strcmp(n, "gpu") || !strcmp(n, "nccl") || !strcmp(n, "host_register");
}

int cmd_doctor(int argc, char **argv) {
    char err[OPT_ERR_LEN];
    int npos = 0;
    int rc = opt_parse(doctor_opts, sizeof doctor_opts / sizeof doctor_opts[0], argc, argv, NULL, 0, &npos,
                       "usage: ballast doctor [--json] [--spill-dir DIR] [--offload-socket unix:PATH | --offload-remote HOST:PORT]\n"
                       "                      [--master-addr HOST --master-port PORT] [--backend auto|cpu|cuda] [--skip a,b] [--wait 120s]\n"
                       "Check what training and ballastd need from this machine or container; one line per check.\n"
                       "Checks: shm memlock io_uring spill_odirect spill_free hugepages gpu nccl host_register ballastd rendezvous.\n"
                       "Exit 0 when no required check is missing, 1 otherwise, 2 on bad flags.",
                       err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) { fprintf(stderr, "ballast doctor: %s\n", err); return 2; }
    for (const char *p = o_skip; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        bool known = len == 0;
        for (size_t i = 0; i < NDEFS && !known; i++) known = strlen(defs[i].name) == len && !strncmp(defs[i].name, p, len);
        if (!known) {
            fprintf(stderr, "ballast doctor: --skip: unknown check '%.*s' (checks: shm memlock io_uring spill_odirect "
                    "spill_free hugepages gpu nccl host_register ballastd rendezvous)\n", (int)len, p);
            return 2;
        }
        p = e ? e + 1 : NULL;
    }

    doc_check_t checks[NDEFS];
    int missing_required;
    double t0 = clock_now_s();
again:
    missing_required = 0;
    for (size_t i = 0; i < NDEFS; i++) {
        doc_check_t *c = &checks[i];
        memset(c, 0, sizeof *c);
        c->name = defs[i].name;
        c->required = defs[i].required == 1 || (defs[i].required == 2 && o_backend == BACKEND_CUDA);
        c->st = DS_OK;
        if (skipped(c->name)) {
            c->st = DS_SKIPPED;
            DETAIL(c, "skipped by --skip");
        } else if (is_gpu_check(c->name) && o_backend == BACKEND_CPU) {
            c->st = DS_SKIPPED;
            DETAIL(c, "--backend cpu: not needed");
        } else {
            defs[i].fn(c);
        }
        if (c->st == DS_OK) c->fix[0] = 0;
        /* an advisory check may say missing (a GPU with --backend auto)
         * without failing the run */
        if (c->st == DS_MISSING && c->required) missing_required++;
    }

    double waited = clock_now_s() - t0;
    if (missing_required && waited + 2 <= o_wait) {
        for (size_t i = 0; i < NDEFS; i++)
            if (checks[i].st == DS_MISSING && checks[i].required)
                fprintf(stderr, "ballast doctor: waiting (%.0fs of %.0fs): %s missing: %s\n", waited, o_wait,
                        checks[i].name, checks[i].detail);
        sleep(2);
        goto again;
    }

    if (o_json) {
        json_t *o = json_object();
        json_object_set_new(o, "ok", json_boolean(missing_required == 0));
        json_object_set_new(o, "missing_required", json_integer(missing_required));
        json_t *arr = json_array();
        for (size_t i = 0; i < NDEFS; i++) {
            json_t *j = json_object();
            json_object_set_new(j, "name", json_string(checks[i].name));
            json_object_set_new(j, "status", json_string(status_names[checks[i].st]));
            json_object_set_new(j, "required", json_boolean(checks[i].required));
            json_object_set_new(j, "detail", json_string(checks[i].detail));
            json_object_set_new(j, "fix", json_string(checks[i].fix));
            json_array_append_new(arr, j);
        }
        json_object_set_new(o, "checks", arr);
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (s) printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        for (size_t i = 0; i < NDEFS; i++) {
            const doc_check_t *c = &checks[i];
            printf("%-8s %-14s %-9s %s%s%s\n", status_names[c->st], c->name, c->required ? "required" : "advisory",
                   c->detail, c->fix[0] ? "  FIX: " : "", c->fix);
        }
        if (missing_required)
            printf("ballast doctor: %d required check(s) missing\n", missing_required);
        else
            printf("ballast doctor: nothing required is missing\n");
    }
    fflush(stdout);
    return missing_required ? 1 : 0;
}
