/* nccl.cc: NCCL for the emulation tier (tests/emu), as a shared library
 * that workers/comm/nccl.c dlopens in place of libnccl.so.2.
 *
 * Build (tests/emu/module.mk does it; nccl.c opens "libnccl.so.2" or
 * "libnccl.so", so the file must carry one of those names in a directory
 * on LD_LIBRARY_PATH):
 *   g++ -std=c++17 -O1 -g -Wall -Wextra -Werror -shared -fPIC -Itests/emu/include \
 *       tests/emu/nccl.cc -o /tmp/libnccl_emu.so
 * The emu_* functions (emu_defs.h) stay undefined here: they come from the
 * emulated executable, which is linked with -rdynamic and loads this
 * library with RTLD_NOW.
 *
 * What it offers: the functions nccl.c resolves (ncclGetUniqueId,
 * ncclCommInitRank, ncclCommDestroy, ncclCommAbort, ncclAllGather,
 * ncclReduceScatter, ncclAllReduce, ncclBroadcast, ncclSend, ncclRecv,
 * ncclGroupStart/End, ncclGetErrorString) plus ncclCommGetAsyncError,
 * ncclCommCount and ncclCommUserRank.
 *
 * One rank: every collective copies its input to its output (a sum,
 * average, min or max over one rank is the value itself, bit for bit),
 * queued on the stream with emu_enqueue so it is ordered like the kernel.
 *
 * Several ranks: one process per rank (each an emulated executable with
 * its own device), as with real NCCL, which also refuses two ranks on one
 * GPU (each rank's cudaGetDevice is compared at ncclCommInitRank; ranks of
 * one process, or processes on device 0 each, count as one GPU). The
 * unique id names a directory (under BALLAST_EMU_NCCL_DIR, else /dev/shm,
 * else /tmp); ncclCommInitRank publishes the rank there and waits, up to
 * BALLAST_EMU_PEER_TIMEOUT_S (default 300 s), for every rank. Data moves
 * as one file per message, "m-SRC-DST-SEQ", written under a temporary name
 * and renamed, so a receiver sees it whole; SEQ counts the messages from
 * SRC to DST in call order, which is how NCCL matches point-to-point
 * operations (by peer and order) and collectives (by order). Every
 * operation is two steps on its stream: posting its messages (reading the
 * send buffer when the stream gets there, as a kernel would), then, queued
 * with emu_enqueue_when so the stream stands still until every message it
 * needs has come, receiving them. Sends never wait, so operations inside
 * ncclGroupStart/End (posted together at ncclGroupEnd: all sends of the
 * group on a stream, then all receives) cannot deadlock, whatever order
 * the ranks list them in. Collectives over several ranks are built of
 * such messages: all-reduce and reduce-scatter add the ranks' values in
 * rank order in fp32 (one rounding to bf16 at the end), so every rank
 * gets the same bits; average divides that sum by the rank count. Only
 * float32 and bfloat16 reduce across ranks; gathers, broadcasts and
 * point-to-point move any type.
 *
 * Argument checks, as NCCL makes them: a NULL or destroyed communicator,
 * an unknown type or operation, a root or peer outside the communicator,
 * or a buffer that is not device memory at all gives ncclInvalidArgument
 * with a line on stderr (NCCL's argument check refuses such pointers too).
 * A buffer that starts in device memory but whose extent runs past its
 * allocation, input and output that overlap without being the same buffer,
 * or a message whose size differs from what the receiver expects (the
 * ranks' counts differ), is a fault on the GPU: emu_fatal. */
#include <emu_defs.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

/* ---- the NCCL declarations (nccl.h, 2.x; the values are ABI) ---- */

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum {
    ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
    ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11,
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

#define NCCL_MSG "gpu-emu NCCL: "
#define NCCL_ID_MAGIC "ballast-gpu-emu-nccl-id"
#define NCCL_COMM_MAGIC 0x6e63636cu /* "nccl" */

struct ncclComm {
    uint32_t magic;             /* NCCL_COMM_MAGIC while live */
    ncclResult_t err;           /* the asynchronous error (never set: the emulation has none) */
    int n, rank;                /* ranks, this one's */
    std::string dir;            /* the communicator's directory (several ranks) */
    std::vector<uint64_t> sent; /* (n) messages queued to each rank so far */
    std::vector<uint64_t> got;  /* (n) messages expected from each rank so far */
};

extern "C" {

/* ---- helpers ---- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs(NCCL_MSG, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Bytes per element; 0 for an unknown type. */
static size_t type_size(int t) {
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static bool comm_ok(const char *fn, ncclComm_t c) {
    if (c && c->magic == NCCL_COMM_MAGIC) return true;
    say("%s: %s communicator", fn, c ? "a destroyed or invalid" : "a NULL");
    return false;
}

/* A buffer of `bytes` at p for fn: ncclInvalidArgument when p is not device
 * memory; a fault (emu_fatal) when it only starts there. */
static ncclResult_t buffer_ok(const char *fn, const char *what, const void *p, size_t bytes) {
    if (!p || !emu_is_device(p, 1)) {
        say("%s: %s = %p is not device memory (cudaMalloc)", fn, what, p);
        return ncclInvalidArgument;
    }
    if (!emu_is_device(p, bytes))
        emu_fatal("NCCL %s: %s = %p: %zu bytes run past the end of its cudaMalloc allocation", fn, what, p, bytes);
    return ncclSuccess;
}

static void no_overlap(const char *fn, const void *send, size_t sb, const void *recv, size_t rb) {
    uintptr_t s = (uintptr_t)send, d = (uintptr_t)recv;
    if (s != d && s < d + rb && d < s + sb)
        emu_fatal("NCCL %s: sendbuff %p and recvbuff %p overlap without being the same buffer", fn, send, recv);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double peer_timeout_s(void) {
    const char *e = getenv("BALLAST_EMU_PEER_TIMEOUT_S");
    long v = e && *e ? strtol(e, NULL, 10) : 300;
    return v > 0 ? (double)v : 300.0;
}

/* ---- messages between ranks (one file each) ---- */

static std::string msg_path(const std::string &dir, int src, int dst, uint64_t seq) {
    char b[96];
    snprintf(b, sizeof b, "/m-%d-%d-%llu", src, dst, (unsigned long long)seq);
    return dir + b;
}

/* Write bytes at p as the message, whole or not at all (rename). */
static void msg_write(const std::string &path, const void *p, size_t bytes) {
    std::string tmp = path + ".tmp";
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) emu_fatal("NCCL: cannot create %s: %s", tmp.c_str(), strerror(errno));
    const char *c = (const char *)p;
    for (size_t off = 0; off < bytes;) {
        ssize_t w = write(fd, c + off, bytes - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) emu_fatal("NCCL: writing %s: %s (is the disk full?)", tmp.c_str(), strerror(errno));
        off += (size_t)w;
    }
    close(fd);
    if (rename(tmp.c_str(), path.c_str())) emu_fatal("NCCL: rename %s: %s", tmp.c_str(), strerror(errno));
}

/* Read the message into p (exactly bytes, else a fault) and remove it. */
static void msg_read(const std::string &path, void *p, size_t bytes) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) emu_fatal("NCCL: cannot open %s: %s", path.c_str(), strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || (size_t)st.st_size != bytes)
        emu_fatal("NCCL: message %s has %lld bytes where this rank expects %zu: the ranks' counts or types differ",
                  path.c_str(), (long long)st.st_size, bytes);
    char *c = (char *)p;
    for (size_t off = 0; off < bytes;) {
        ssize_t r = read(fd, c + off, bytes - off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) emu_fatal("NCCL: reading %s: %s", path.c_str(), r < 0 ? strerror(errno) : "short file");
        off += (size_t)r;
    }
    close(fd);
    unlink(path.c_str());
}

/* One operation of several ranks: messages out (their bytes copied when the
 * stream reaches the post step), messages in, then an optional finish
 * (the reduction) once all have come. */
typedef struct {
    std::string path;
    const void *src; /* device bytes to send */
    size_t bytes;
} out_msg_t;
typedef struct {
    std::string path;
    void *dst;       /* where the bytes go (device memory or a host scratch) */
    size_t bytes;
} in_msg_t;

struct op_t {
    std::vector<out_msg_t> out;
    std::vector<in_msg_t> in;
    std::vector<std::vector<char>> scratch; /* host buffers some in[] point into */
    void (*finish)(op_t *) = nullptr;
    /* for finish */
    void *recv = nullptr;
    const void *self = nullptr;
    size_t count = 0;
    int type = 0, red = 0, n = 0, rank = 0;
    double since = 0;   /* when the receive step first looked */
    std::string what;
};

static void op_post(void *arg) {
    op_t *o = (op_t *)arg;
    for (const out_msg_t &m : o->out) msg_write(m.path, m.src, m.bytes);
}

static int op_can_receive(void *arg) {
    op_t *o = (op_t *)arg;
    for (const in_msg_t &m : o->in)
        if (access(m.path.c_str(), F_OK) != 0) return 0;
    return 1;
}

static void op_receive(void *arg) {
    op_t *o = (op_t *)arg;
    for (const in_msg_t &m : o->in) msg_read(m.path, m.dst, m.bytes);
    if (o->finish) o->finish(o);
}

static void op_free(void *arg) { delete (op_t *)arg; }
static void op_nofree(void *arg) { (void)arg; }

/* Queue o on stream: the post step, then the receive step (which owns o). */
static void op_queue(op_t *o, cudaStream_t stream) {
    emu_enqueue(stream, (o->what + " (send)").c_str(), op_post, o, op_nofree);
    emu_enqueue_when(stream, (o->what + " (receive)").c_str(), op_can_receive, op_receive, o, op_free);
}

static void add_out(op_t *o, ncclComm_t c, int peer, const void *src, size_t bytes) {
    o->out.push_back(out_msg_t{ msg_path(c->dir, c->rank, peer, c->sent[peer]++), src, bytes });
}
static void add_in(op_t *o, ncclComm_t c, int peer, void *dst, size_t bytes) {
    o->in.push_back(in_msg_t{ msg_path(c->dir, peer, c->rank, c->got[peer]++), dst, bytes });
}

/* bf16 <-> fp32 (round to nearest even, NaN kept quiet) */
static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float load(const void *p, size_t i, int type) {
    return type == ncclBfloat16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* out[i] = op over the ranks' values in rank order (parts[r], count each), in fp32. */
static void reduce_into(void *out, const std::vector<const void *> &parts, size_t count, int type, int red) {
    int n = (int)parts.size();
    for (size_t i = 0; i < count; i++) {
        float a = load(parts[0], i, type);
        for (int r = 1; r < n; r++) {
            float b = load(parts[r], i, type);
            switch (red) {
            case ncclSum: case ncclAvg: a += b; break;
            case ncclProd: a *= b; break;
            case ncclMax: a = b > a ? b : a; break;
            case ncclMin: a = b < a ? b : a; break;
            }
        }
        if (red == ncclAvg) a /= (float)n;
        if (type == ncclBfloat16) ((uint16_t *)out)[i] = f32_to_bf16(a);
        else ((float *)out)[i] = a;
    }
}

/* The finish of all-reduce and reduce-scatter: scratch[r] holds rank r's
 * part except this rank's, which is copied from self (device memory, read
 * now, in stream order). */
static void finish_reduce(op_t *o) {
    size_t bytes = o->count * type_size(o->type);
    std::vector<char> mine(bytes);
    memcpy(mine.data(), o->self, bytes);
    std::vector<const void *> parts((size_t)o->n);
    for (int r = 0, k = 0; r < o->n; r++) parts[(size_t)r] = r == o->rank ? (const void *)mine.data() : o->scratch[(size_t)k++].data();
    reduce_into(o->recv, parts, o->count, o->type, o->red);
}

static void finish_copy_self(op_t *o) {
    size_t bytes = o->count * type_size(o->type);
    if (o->recv != o->self) memmove(o->recv, o->self, bytes);
}

/* ---- groups (several ranks): point-to-point operations wait for ncclGroupEnd ---- */

typedef struct {
    op_t *op;
    cudaStream_t stream;
} pending_t;
static thread_local int g_group_depth;
static thread_local std::vector<pending_t> *g_pending;

/* ---- one rank ---- */

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} copy_job_t;

static void copy_run(void *arg) {
    const copy_job_t *j = (const copy_job_t *)arg;
    if (j->dst != j->src) memcpy(j->dst, j->src, j->bytes);
}

/* The one-rank collective: queue recv <- send on stream. */
static ncclResult_t one_rank(const char *fn, const void *send, void *recv, size_t bytes, cudaStream_t stream) {
    copy_job_t *j = (copy_job_t *)malloc(sizeof *j);
    if (!j) return ncclSystemError;
    j->dst = recv;
    j->src = send;
    j->bytes = bytes;
    emu_enqueue(stream, fn, copy_run, j, free);
    return ncclSuccess;
}

/* What every collective checks first; *es gets the element size. */
static ncclResult_t coll_args(const char *fn, ncclComm_t comm, int type, int op, size_t *es) {
    if (!comm_ok(fn, comm)) return ncclInvalidArgument;
    if (!(*es = type_size(type))) {
        say("%s: unknown ncclDataType_t %d", fn, type);
        return ncclInvalidArgument;
    }
    if (op < ncclSum || op > ncclAvg) {
        say("%s: unknown ncclRedOp_t %d", fn, op);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static ncclResult_t reducible(const char *fn, int type) {
    if (type == ncclFloat32 || type == ncclBfloat16) return ncclSuccess;
    say("%s: the emulation reduces only float32 and bfloat16 across ranks (type %d)", fn, type);
    return ncclInvalidArgument;
}

/* ---- set-up ---- */

static const char *base_dir(void) {
    const char *e = getenv("BALLAST_EMU_NCCL_DIR");
    if (e && *e) return e;
    struct stat st;
    return stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static unsigned long next;
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int n = snprintf(id->internal, sizeof id->internal, "%s %s/ballast-emu-nccl-%ld-%lu-%lx", NCCL_ID_MAGIC, base_dir(),
                     (long)getpid(), __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED), (unsigned long)ts.tv_nsec);
    if (n < 0 || (size_t)n >= sizeof id->internal) {
        say("ncclGetUniqueId: BALLAST_EMU_NCCL_DIR is too long for the unique id (keep it under 60 characters)");
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* This thread's CUDA device, or -1 where no runtime is loaded. */
static int current_device(void) {
    int (*get)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, "cudaGetDevice");
    int d = -1;
    if (!get || get(&d) != 0) return -1;
    return d;
}

/* A rank that is done with the directory (destroyed, or failed to join)
 * leaves DIR/gone-RANK, its join file staying for peers still joining; the
 * one that finds every rank gone removes the directory (messages still in
 * it were never received). */
static void leave(ncclComm_t c) {
    msg_write(c->dir + "/gone-" + std::to_string(c->rank), "", 0);
    for (int r = 0; r < c->n; r++)
        if (access((c->dir + "/gone-" + std::to_string(r)).c_str(), F_OK) != 0) return;
    DIR *d = opendir(c->dir.c_str());
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink((c->dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(c->dir.c_str());
}

/* Several ranks: publish this rank's device as DIR/join-RANK and wait for
 * every rank's; two ranks on one device are refused as NCCL refuses them. */
static ncclResult_t join(ncclComm_t c) {
    if (mkdir(c->dir.c_str(), 0700) && errno != EEXIST) {
        say("ncclCommInitRank: cannot create %s: %s (set BALLAST_EMU_NCCL_DIR to a writable directory)",
            c->dir.c_str(), strerror(errno));
        return ncclSystemError;
    }
    int dev = current_device();
    char b[32];
    int len = snprintf(b, sizeof b, "%d\n", dev);
    msg_write(c->dir + "/join-" + std::to_string(c->rank), b, (size_t)len);
    std::vector<int> devs((size_t)c->n, -2);
    double t0 = now_s();
    for (;;) {
        int missing = -1;
        for (int r = 0; r < c->n; r++) {
            if (devs[(size_t)r] != -2) continue;
            FILE *f = fopen((c->dir + "/join-" + std::to_string(r)).c_str(), "r");
            int d;
            if (f && fscanf(f, "%d", &d) == 1) devs[(size_t)r] = d;
            else missing = r;
            if (f) fclose(f);
        }
        if (missing < 0) break;
        if (now_s() - t0 > peer_timeout_s()) {
            say("ncclCommInitRank: rank %d of %d did not join within %.0f s (BALLAST_EMU_PEER_TIMEOUT_S)", missing,
                c->n, peer_timeout_s());
            return ncclSystemError;
        }
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    for (int r = 0; r < c->n; r++)
        if (r != c->rank && devs[(size_t)r] == dev) {
            say("ncclCommInitRank: Duplicate GPU detected: rank %d and rank %d both on device %d (NCCL refuses two "
                "ranks on one GPU: give each rank its own, BALLAST_EMU_DEVICES, or use staged collectives)",
                c->rank, r, dev);
            return ncclInvalidUsage;
        }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return ncclInvalidArgument;
    *comm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        say("ncclCommInitRank: rank %d of %d ranks", rank, nranks);
        return ncclInvalidArgument;
    }
    size_t ml = strlen(NCCL_ID_MAGIC);
    if (memchr(id.internal, 0, sizeof id.internal) == NULL || strncmp(id.internal, NCCL_ID_MAGIC, ml) != 0 ||
        id.internal[ml] != ' ') {
        say("ncclCommInitRank: the unique id did not come from ncclGetUniqueId");
        return ncclInvalidArgument;
    }
    ncclComm_t c = new (std::nothrow) ncclComm;
    if (!c) return ncclSystemError;
    c->magic = NCCL_COMM_MAGIC;
    c->err = ncclSuccess;
    c->n = nranks;
    c->rank = rank;
    c->dir = id.internal + ml + 1;
    c->sent.assign((size_t)nranks, 0);
    c->got.assign((size_t)nranks, 0);
    if (nranks > 1) {
        ncclResult_t r = join(c);
        if (r != ncclSuccess) {
            leave(c);
            delete c;
            return r;
        }
    }
    *comm = c;
    return ncclSuccess;
}

/* Queued operations hold no reference to the communicator, so destroying
 * it with work in flight is safe, as in NCCL. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (!comm_ok("ncclCommDestroy", comm)) return ncclInvalidArgument;
    if (comm->n > 1) leave(comm);
    comm->magic = 0;
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
    if (!comm_ok("ncclCommGetAsyncError", comm) || !async_error) return ncclInvalidArgument;
    *async_error = comm->err;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm_ok("ncclCommCount", comm) || !count) return ncclInvalidArgument;
    *count = comm->n;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm_ok("ncclCommUserRank", comm) || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

/* Point-to-point operations between Start and End are posted together at
 * the outermost End: per stream, all their sends, then all their receives. */
ncclResult_t ncclGroupStart(void) {
    if (g_group_depth++ == 0 && !g_pending) g_pending = new std::vector<pending_t>();
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (g_group_depth == 0) {
        say("ncclGroupEnd without ncclGroupStart");
        return ncclInvalidUsage;
    }
    if (--g_group_depth > 0) return ncclSuccess;
    std::vector<pending_t> &p = *g_pending;
    std::vector<cudaStream_t> streams;
    for (const pending_t &x : p) {
        bool seen = false;
        for (cudaStream_t s : streams) seen |= s == x.stream;
        if (!seen) streams.push_back(x.stream);
    }
    for (cudaStream_t s : streams) {
        op_t *all = new op_t;
        all->what = "ncclGroupEnd";
        for (pending_t &x : p) {
            if (x.stream != s) continue;
            for (out_msg_t &m : x.op->out) all->out.push_back(m);
            for (in_msg_t &m : x.op->in) all->in.push_back(m);
            delete x.op;
        }
        op_queue(all, s);
    }
    p.clear();
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (see the gpu-emu NCCL line on stderr)";
    case ncclInvalidUsage: return "invalid usage (see the gpu-emu NCCL line on stderr)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

/* ---- collectives (count is per rank) ---- */

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const char *fn = "ncclAllReduce";
    size_t es;
    ncclResult_t r = coll_args(fn, comm, datatype, op, &es);
    if (r != ncclSuccess || count == 0) return r;
    size_t bytes = count * es;
    if ((r = buffer_ok(fn, "sendbuff", sendbuff, bytes)) != ncclSuccess) return r;
    if ((r = buffer_ok(fn, "recvbuff", recvbuff, bytes)) != ncclSuccess) return r;
    no_overlap(fn, sendbuff, bytes, recvbuff, bytes);
    if (comm->n == 1) return one_rank(fn, sendbuff, recvbuff, bytes, stream);
    if ((r = reducible(fn, datatype)) != ncclSuccess) return r;
    op_t *o = new op_t;
    o->what = fn;
    o->scratch.resize((size_t)comm->n - 1, std::vector<char>(bytes));
    for (int p = 0, k = 0; p < comm->n; p++) {
        if (p == comm->rank) continue;
        add_out(o, comm, p, sendbuff, bytes);
        add_in(o, comm, p, o->scratch[(size_t)k++].data(), bytes);
    }
    o->finish = finish_reduce;
    o->recv = recvbuff, o->self = sendbuff, o->count = count, o->type = datatype, o->red = op;
    o->n = comm->n, o->rank = comm->rank;
    op_queue(o, stream);
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const char *fn = "ncclReduceScatter";
    size_t es;
    ncclResult_t r = coll_args(fn, comm, datatype, op, &es);
    if (r != ncclSuccess || recvcount == 0) return r;
    size_t one = recvcount * es, n = (size_t)comm->n;
    if ((r = buffer_ok(fn, "sendbuff", sendbuff, n * one)) != ncclSuccess) return r;
    if ((r = buffer_ok(fn, "recvbuff", recvbuff, one)) != ncclSuccess) return r;
    /* NCCL allows recvbuff = sendbuff + rank * recvcount (in place) */
    const char *mine = (const char *)sendbuff + (size_t)comm->rank * one;
    if (recvbuff != mine) no_overlap(fn, sendbuff, n * one, recvbuff, one);
    if (comm->n == 1) return one_rank(fn, sendbuff, recvbuff, one, stream);
    if ((r = reducible(fn, datatype)) != ncclSuccess) return r;
    op_t *o = new op_t;
    o->what = fn;
    o->scratch.resize(n - 1, std::vector<char>(one));
    for (int p = 0, k = 0; p < comm->n; p++) {
        if (p == comm->rank) continue;
        add_out(o, comm, p, (const char *)sendbuff + (size_t)p * one, one);
        add_in(o, comm, p, o->scratch[(size_t)k++].data(), one);
    }
    o->finish = finish_reduce;
    o->recv = recvbuff, o->self = mine, o->count = recvcount, o->type = datatype, o->red = op;
    o->n = comm->n, o->rank = comm->rank;
    op_queue(o, stream);
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    const char *fn = "ncclAllGather";
    size_t es;
    ncclResult_t r = coll_args(fn, comm, datatype, ncclSum, &es);
    if (r != ncclSuccess || sendcount == 0) return r;
    size_t one = sendcount * es, n = (size_t)comm->n;
    if ((r = buffer_ok(fn, "sendbuff", sendbuff, one)) != ncclSuccess) return r;
    if ((r = buffer_ok(fn, "recvbuff", recvbuff, n * one)) != ncclSuccess) return r;
    char *mine = (char *)recvbuff + (size_t)comm->rank * one; /* in place when sendbuff is this rank's slot */
    if (sendbuff != mine) no_overlap(fn, sendbuff, one, recvbuff, n * one);
    if (comm->n == 1) return one_rank(fn, sendbuff, recvbuff, one, stream);
    op_t *o = new op_t;
    o->what = fn;
    for (int p = 0; p < comm->n; p++) {
        if (p == comm->rank) continue;
        add_out(o, comm, p, sendbuff, one);
        add_in(o, comm, p, (char *)recvbuff + (size_t)p * one, one);
    }
    o->finish = finish_copy_self;
    o->recv = mine, o->self = sendbuff, o->count = sendcount, o->type = datatype;
    op_queue(o, stream);
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    const char *fn = "ncclBroadcast";
    size_t es;
    ncclResult_t r = coll_args(fn, comm, datatype, ncclSum, &es);
    if (r != ncclSuccess) return r;
    if (root < 0 || root >= comm->n) {
        say("ncclBroadcast: root %d in a communicator of %d rank%s", root, comm->n, comm->n == 1 ? "" : "s");
        return ncclInvalidArgument;
    }
    if (count == 0) return ncclSuccess;
    size_t bytes = count * es;
    if (comm->rank == root && (r = buffer_ok(fn, "sendbuff", sendbuff, bytes)) != ncclSuccess) return r;
    if ((r = buffer_ok(fn, "recvbuff", recvbuff, bytes)) != ncclSuccess) return r;
    if (comm->rank == root) no_overlap(fn, sendbuff, bytes, recvbuff, bytes);
    if (comm->n == 1) return one_rank(fn, sendbuff, recvbuff, bytes, stream);
    op_t *o = new op_t;
    o->what = fn;
    if (comm->rank == root) {
        for (int p = 0; p < comm->n; p++)
            if (p != root) add_out(o, comm, p, sendbuff, bytes);
        o->finish = finish_copy_self;
        o->recv = recvbuff, o->self = sendbuff, o->count = count, o->type = datatype;
    } else {
        add_in(o, comm, root, recvbuff, bytes);
    }
    op_queue(o, stream);
    return ncclSuccess;
}

/* ---- point-to-point (inside a group: posted at ncclGroupEnd) ---- */

static ncclResult_t p2p(const char *fn, bool is_send, void *buf, size_t count, int type, int peer, ncclComm_t comm,
                        cudaStream_t stream) {
    size_t es;
    ncclResult_t r = coll_args(fn, comm, type, ncclSum, &es);
    if (r != ncclSuccess) return r;
    if (peer < 0 || peer >= comm->n) {
        say("%s: peer %d in a communicator of %d rank%s", fn, peer, comm->n, comm->n == 1 ? "" : "s");
        return ncclInvalidArgument;
    }
    if (count == 0) return ncclSuccess;
    size_t bytes = count * es;
    if ((r = buffer_ok(fn, is_send ? "sendbuff" : "recvbuff", buf, bytes)) != ncclSuccess) return r;
    op_t *o = new op_t;
    o->what = fn;
    if (is_send) add_out(o, comm, peer, buf, bytes);
    else add_in(o, comm, peer, buf, bytes);
    if (g_group_depth > 0) g_pending->push_back(pending_t{ o, stream });
    else op_queue(o, stream);
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p("ncclSend", true, (void *)sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}

} /* extern "C" */
