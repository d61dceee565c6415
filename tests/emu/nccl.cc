/* nccl.cc: NCCL for the emulation tier (tests/emu), one rank per
 * communicator, as a shared library that workers/comm/nccl.c dlopens in
 * place of libnccl.so.2.
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
 * ncclReduceScatter, ncclAllReduce, ncclBroadcast, ncclGetErrorString)
 * plus ncclCommGetAsyncError, ncclCommCount, ncclCommUserRank and
 * ncclGroupStart/End. A communicator has exactly one rank (NCCL itself
 * refuses two ranks on one GPU; the emulated multi-rank paths go through
 * the staged collectives instead), so every collective copies its input to
 * its output: a sum, product, min, max or average over one rank is the
 * value itself, bit for bit (NCCL's average multiplies by 1/nranks = 1,
 * which changes no value). The copy is queued on the given stream with
 * emu_enqueue, so it is ordered like the real kernel.
 *
 * Argument checks, as NCCL makes them: a NULL or destroyed communicator,
 * an unknown type or operation, a root other than 0, or a buffer that is
 * not device memory at all gives ncclInvalidArgument with a line on
 * stderr (NCCL's argument check refuses such pointers too). A buffer that starts in device memory but
 * whose extent runs past its allocation, or input and output that overlap
 * without being the same buffer, is a fault on the GPU: emu_fatal. */
#include <emu_defs.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    uint32_t magic;   /* NCCL_COMM_MAGIC while live */
    ncclResult_t err; /* the asynchronous error (never set: the emulation has none) */
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

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} copy_job_t;

static void copy_run(void *arg) {
    const copy_job_t *j = (const copy_job_t *)arg;
    if (j->dst != j->src) memcpy(j->dst, j->src, j->bytes);
}

/* The one-rank collective: check, then queue recv <- send on stream. */
static ncclResult_t one_rank(const char *fn, const void *send, void *recv, size_t count, int type, int op,
                             ncclComm_t comm, cudaStream_t stream) {
    if (!comm_ok(fn, comm)) return ncclInvalidArgument;
    size_t es = type_size(type);
    if (!es) {
        say("%s: unknown ncclDataType_t %d", fn, type);
        return ncclInvalidArgument;
    }
    if (op < ncclSum || op > ncclAvg) {
        say("%s: unknown ncclRedOp_t %d", fn, op);
        return ncclInvalidArgument;
    }
    if (count == 0) return ncclSuccess;
    size_t bytes = count * es;
    ncclResult_t r;
    if ((r = buffer_ok(fn, "sendbuff", send, bytes)) != ncclSuccess) return r;
    if ((r = buffer_ok(fn, "recvbuff", recv, bytes)) != ncclSuccess) return r;
    uintptr_t s = (uintptr_t)send, d = (uintptr_t)recv;
    if (s != d && s < d + bytes && d < s + bytes)
        emu_fatal("NCCL %s: sendbuff %p and recvbuff %p overlap (%zu bytes) without being the same buffer", fn, send,
                  recv, bytes);
    copy_job_t *j = (copy_job_t *)malloc(sizeof *j);
    if (!j) return ncclSystemError;
    j->dst = recv;
    j->src = send;
    j->bytes = bytes;
    emu_enqueue(stream, fn, copy_run, j, free);
    return ncclSuccess;
}

/* ---- set-up ---- */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static unsigned long next;
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "%s %lu", NCCL_ID_MAGIC, __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return ncclInvalidArgument;
    *comm = NULL;
    if (nranks > 1) {
        say("one rank per communicator; several ranks use staged collectives (ncclCommInitRank with nranks = %d)",
            nranks);
        return ncclInvalidUsage;
    }
    if (nranks < 1 || rank != 0) {
        say("ncclCommInitRank: rank %d of %d ranks", rank, nranks);
        return ncclInvalidArgument;
    }
    if (strncmp(id.internal, NCCL_ID_MAGIC, strlen(NCCL_ID_MAGIC)) != 0) {
        say("ncclCommInitRank: the unique id did not come from ncclGetUniqueId");
        return ncclInvalidArgument;
    }
    ncclComm_t c = (ncclComm_t)calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    c->magic = NCCL_COMM_MAGIC;
    c->err = ncclSuccess;
    *comm = c;
    return ncclSuccess;
}

/* Queued copies hold no reference to the communicator, so destroying it
 * with work in flight is safe, as in NCCL. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (!comm_ok("ncclCommDestroy", comm)) return ncclInvalidArgument;
    comm->magic = 0;
    free(comm);
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
    *count = 1;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm_ok("ncclCommUserRank", comm) || !rank) return ncclInvalidArgument;
    *rank = 0;
    return ncclSuccess;
}

/* With one rank there is nothing to fuse or to order across ranks. */
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

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

/* ---- collectives (count is per rank; with one rank every buffer holds count elements) ---- */

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return one_rank("ncclAllReduce", sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return one_rank("ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return one_rank("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, ncclSum, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    if (!comm_ok("ncclBroadcast", comm)) return ncclInvalidArgument;
    if (root != 0) {
        say("ncclBroadcast: root %d in a communicator of one rank", root);
        return ncclInvalidArgument;
    }
    return one_rank("ncclBroadcast", sendbuff, recvbuff, count, datatype, ncclSum, comm, stream);
}

} /* extern "C" */
