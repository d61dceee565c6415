/* nccl.c: the NCCL backend of comm.h.
 *
 * libnccl and the CUDA runtime are loaded at run time (dlopen), so every
 * build links and the CPU-only machines that run `make test` need neither;
 * a GPU worker picks this backend with --comm nccl (or auto). The few NCCL
 * and CUDA declarations used are restated below; building with
 * -DCOMM_NCCL_ABI_CHECK and the CUDA include path checks them against the
 * real nccl.h and cuda_runtime.h (tests/integration/comm_nccl.sh).
 *
 * Where libnccl comes from: $BALLAST_NCCL_LIB (the library file, or the
 * directory holding libnccl.so.2) when set, and nothing else then; else
 * the loader's path (libnccl.so.2, libnccl.so); else the nvidia-nccl pip
 * wheel (site-packages/nvidia/nccl/lib) of the usual Python installs, as
 * PyTorch brings it. The CUDA runtime likewise: $BALLAST_CUDART_LIB, else
 * its sonames (tests point both at a stand-in library).
 *
 * Set-up: group index 0 calls ncclGetUniqueId and publishes it under the
 * rendezvous key "comm/<name>/nccl-id"; the others wait for it; everyone
 * calls ncclCommInitRank (a group of one needs no rendezvous). Each
 * collective is enqueued on the communicator's own stream with a CUDA event
 * recorded after it; the handle completes when the event has. comm_wait
 * polls that event and, between polls, ncclCommGetAsyncError and the
 * communicator's timeout (comm_config_t.timeout_s): an asynchronous error
 * (a peer died, the network failed) or a collective not done in time
 * aborts the communicator (ncclCommAbort ends the kernels stuck in it), so
 * the wait returns an error naming the group and its peers instead of
 * hanging, and every later call on that communicator fails the same way.
 * With cfg->compute_stream, that stream's work so far is ordered before
 * each collective through an event (inputs are ready, no host wait), and
 * comm_stream_wait() orders a collective before later compute the same
 * way. Buffers are device memory of cfg->device.
 *
 * Exposed communication on a GPU is not host time: the host no longer
 * waits, the compute stream does. comm_stream_wait brackets its wait with
 * two timing events on the waiting stream, and comm_nccl_stall_seconds()
 * adds up, for every pair that has completed, the time between them: how
 * long that stream stood still for a collective. comm_wait_seconds()
 * includes it. */
#include "workers/comm/impl.h"

#include "clock.h"

#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef COMM_NCCL_ABI_CHECK
#include <cuda_runtime.h>
#include <nccl.h>
#endif

/* ---- the declarations we rely on ---- */

typedef struct { char internal[128]; } nccl_unique_id_t; /* ncclUniqueId */
typedef void *nccl_comm_p;                                /* ncclComm_t */
typedef void *cuda_stream_p;                              /* cudaStream_t */
typedef void *cuda_event_p;                               /* cudaEvent_t */

enum {
    NCCL_OK = 0,            /* ncclSuccess */
    NCCL_REMOTE_ERROR = 6,  /* ncclRemoteError */
    NCCL_IN_PROGRESS = 7,   /* ncclInProgress */
    NCCL_FLOAT32 = 7,       /* ncclFloat32 */
    NCCL_BFLOAT16 = 9,      /* ncclBfloat16 */
    NCCL_SUM = 0,           /* ncclSum */
    NCCL_AVG = 4,           /* ncclAvg */
    CUDA_OK = 0,            /* cudaSuccess */
    CUDA_NOT_READY = 600,   /* cudaErrorNotReady */
    CUDA_STREAM_NON_BLOCKING = 1, /* cudaStreamNonBlocking */
    CUDA_EVENT_DISABLE_TIMING = 2, /* cudaEventDisableTiming */
};

#ifdef COMM_NCCL_ABI_CHECK
#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(sizeof(nccl_unique_id_t) == sizeof(ncclUniqueId), "ncclUniqueId size");
_Static_assert(SAME(NCCL_OK, ncclSuccess) && SAME(NCCL_IN_PROGRESS, ncclInProgress) &&
               SAME(NCCL_REMOTE_ERROR, ncclRemoteError), "ncclResult_t");
_Static_assert(SAME(NCCL_FLOAT32, ncclFloat32) && SAME(NCCL_BFLOAT16, ncclBfloat16), "ncclDataType_t");
_Static_assert(SAME(NCCL_SUM, ncclSum) && SAME(NCCL_AVG, ncclAvg), "ncclRedOp_t");
_Static_assert(SAME(CUDA_OK, cudaSuccess) && SAME(CUDA_NOT_READY, cudaErrorNotReady), "cudaError_t");
_Static_assert(SAME(CUDA_STREAM_NON_BLOCKING, cudaStreamNonBlocking), "cudaStreamNonBlocking");
_Static_assert(SAME(CUDA_EVENT_DISABLE_TIMING, cudaEventDisableTiming), "cudaEventDisableTiming");
_Static_assert(sizeof(nccl_comm_p) == sizeof(ncclComm_t) && sizeof(cuda_stream_p) == sizeof(cudaStream_t),
               "handle sizes");
#endif

typedef struct {
    void *nccl, *cudart;
    int (*get_unique_id)(nccl_unique_id_t *);
    int (*comm_init_rank)(nccl_comm_p *, int, nccl_unique_id_t, int);
    int (*comm_destroy)(nccl_comm_p);
    int (*comm_abort)(nccl_comm_p);
    int (*get_async_error)(nccl_comm_p, int *);
    int (*all_gather)(const void *, void *, size_t, int, nccl_comm_p, cuda_stream_p);
    int (*reduce_scatter)(const void *, void *, size_t, int, int, nccl_comm_p, cuda_stream_p);
    int (*all_reduce)(const void *, void *, size_t, int, int, nccl_comm_p, cuda_stream_p);
    int (*broadcast)(const void *, void *, size_t, int, int, nccl_comm_p, cuda_stream_p);
    /* point to point for the ring shift (optional: NULL in a library without them) */
    int (*send)(const void *, size_t, int, int, nccl_comm_p, cuda_stream_p);
    int (*recv)(void *, size_t, int, int, nccl_comm_p, cuda_stream_p);
    int (*group_start)(void);
    int (*group_end)(void);
    const char *(*nccl_error)(int);
    int (*set_device)(int);
    int (*stream_create)(cuda_stream_p *, unsigned, int);
    int (*priority_range)(int *, int *);
    int (*stream_destroy)(cuda_stream_p);
    int (*event_create)(cuda_event_p *, unsigned);
    int (*event_record)(cuda_event_p, cuda_stream_p);
    int (*event_query)(cuda_event_p);
    int (*event_sync)(cuda_event_p);
    int (*event_destroy)(cuda_event_p);
    int (*event_elapsed)(float *, cuda_event_p, cuda_event_p);
    int (*stream_wait_event)(cuda_stream_p, cuda_event_p, unsigned);
    int (*cuda_malloc)(void **, size_t);
    int (*cuda_free)(void *);
    int (*device_count)(int *);
    const char *(*cuda_error)(int);
} nccl_lib_t;

static nccl_lib_t lib;
static int lib_state;            /* 0 unknown, 1 loaded, -1 failed */
static char lib_err[COMM_ERR_LEN];
static pthread_mutex_t lib_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- finding the libraries ---- */

/* Where the nvidia-nccl wheel (PyTorch's pip packages) may be: under the
 * active $VIRTUAL_ENV / $CONDA_PREFIX and ~/.local first, then the usual
 * system-wide Python installs. */
static const char *const nccl_wheel_envs[][2] = {
    { "VIRTUAL_ENV", "/lib/python3*/site-packages" }, { "CONDA_PREFIX", "/lib/python3*/site-packages" },
    { "HOME", "/.local/lib/python3*/site-packages" },
};
static const char *const nccl_wheel_dirs[] = {
    "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
    "/usr/lib/python3/dist-packages", "/opt/*/.venv/lib/python3*/site-packages",
    "/opt/conda/lib/python3*/site-packages",
};
#define NCCL_WHEEL_LIB "/nvidia/nccl/lib/libnccl.so.2"

/* dlopen the first match of pattern (the last in glob's order: the newest
 * python3.N); NULL when none loads. */
static void *open_glob(const char *pattern) {
    glob_t g;
    void *h = NULL;
    if (glob(pattern, 0, NULL, &g) == 0)
        for (size_t i = g.gl_pathc; i-- > 0 && !h;) h = dlopen(g.gl_pathv[i], RTLD_NOW | RTLD_GLOBAL);
    globfree(&g);
    return h;
}

/* Open a library: the file or directory $env names when it is set (and
 * nothing else: a wrong setting is an error, not a fall-back), else the
 * first of sonames that the loader finds. NULL with the reason in why
 * (*from_env tells which case failed). */
static void *open_lib(const char *env, const char *file, const char *const *sonames, size_t n,
                      bool *from_env, char *why, size_t whylen) {
    const char *v = getenv(env);
    *from_env = v && v[0];
    void *h = NULL;
    if (*from_env) {
        char path[4096];
        struct stat sb;
        if (stat(v, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(path, sizeof path, "%s/%s", v, file);
        else snprintf(path, sizeof path, "%s", v);
        if (!(h = dlopen(path, RTLD_NOW | RTLD_GLOBAL)))
            snprintf(why, whylen, "%s=%s: %s", env, v, dlerror());
        return h;
    }
    for (size_t i = 0; i < n && !h; i++) h = dlopen(sonames[i], RTLD_NOW | RTLD_GLOBAL);
    if (!h) snprintf(why, whylen, "%s", dlerror());
    return h;
}

/* libnccl: $BALLAST_NCCL_LIB, the loader's path, the pip wheel. */
static void *open_nccl(char *err, size_t errlen) {
    static const char *const names[] = { "libnccl.so.2", "libnccl.so" };
    char why[COMM_ERR_LEN] = "";
    bool from_env;
    void *h = open_lib("BALLAST_NCCL_LIB", "libnccl.so.2", names, 2, &from_env, why, sizeof why);
    if (h) return h;
    if (from_env) {
        snprintf(err, errlen, "cannot load libnccl (%s): point BALLAST_NCCL_LIB at libnccl.so.2 or the "
                 "directory holding it", why);
        return NULL;
    }
    char pat[4096];
    for (size_t i = 0; i < sizeof nccl_wheel_envs / sizeof nccl_wheel_envs[0] && !h; i++) {
        const char *root = getenv(nccl_wheel_envs[i][0]);
        if (!root || !root[0]) continue;
        snprintf(pat, sizeof pat, "%s%s%s", root, nccl_wheel_envs[i][1], NCCL_WHEEL_LIB);
        h = open_glob(pat);
    }
    for (size_t i = 0; i < sizeof nccl_wheel_dirs / sizeof nccl_wheel_dirs[0] && !h; i++) {
        snprintf(pat, sizeof pat, "%s%s", nccl_wheel_dirs[i], NCCL_WHEEL_LIB);
        h = open_glob(pat);
    }
    if (!h)
        snprintf(err, errlen, "cannot load libnccl.so.2 (%s; no nvidia-nccl pip wheel under site-packages "
                 "either): install NCCL, add its directory to LD_LIBRARY_PATH, or set BALLAST_NCCL_LIB to "
                 "it (PyTorch's: python3 -c 'import nvidia.nccl, os; print(os.path.join("
                 "list(nvidia.nccl.__path__)[0], \"lib\"))')", why);
    return h;
}

/* Load libnccl and libcudart once; 0 or -1 with the reason in lib_err. */
static int lib_load(void) {
    pthread_mutex_lock(&lib_mu);
    if (lib_state) goto done;
    if (!(lib.nccl = open_nccl(lib_err, sizeof lib_err))) {
        lib_state = -1;
        goto done;
    }
    static const char *const crt[] = { "libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0" };
    char why[COMM_ERR_LEN] = "";
    bool from_env;
    if (!(lib.cudart = open_lib("BALLAST_CUDART_LIB", "libcudart.so", crt, 4, &from_env, why, sizeof why))) {
        if (from_env)
            snprintf(lib_err, sizeof lib_err, "cannot load the CUDA runtime (%s): point BALLAST_CUDART_LIB "
                     "at libcudart.so or the directory holding it", why);
        else
            snprintf(lib_err, sizeof lib_err, "cannot load the CUDA runtime libcudart.so: add the CUDA "
                     "library directory to LD_LIBRARY_PATH");
        lib_state = -1;
        goto done;
    }
#define SYM(h, f, name) do { *(void **)&lib.f = dlsym(lib.h, name); \
        if (!lib.f) { snprintf(lib_err, sizeof lib_err, "%s lacks %s: NCCL >= 2.10 and CUDA >= 11 " \
                               "are needed", #h, name); lib_state = -1; goto done; } } while (0)
    SYM(nccl, get_unique_id, "ncclGetUniqueId");
    SYM(nccl, comm_init_rank, "ncclCommInitRank");
    SYM(nccl, comm_destroy, "ncclCommDestroy");
    SYM(nccl, comm_abort, "ncclCommAbort");
    SYM(nccl, get_async_error, "ncclCommGetAsyncError");
    SYM(nccl, all_gather, "ncclAllGather");
    SYM(nccl, reduce_scatter, "ncclReduceScatter");
    SYM(nccl, all_reduce, "ncclAllReduce");
    SYM(nccl, broadcast, "ncclBroadcast");
    *(void **)&lib.send = dlsym(lib.nccl, "ncclSend");
    *(void **)&lib.recv = dlsym(lib.nccl, "ncclRecv");
    *(void **)&lib.group_start = dlsym(lib.nccl, "ncclGroupStart");
    *(void **)&lib.group_end = dlsym(lib.nccl, "ncclGroupEnd");
    SYM(nccl, nccl_error, "ncclGetErrorString");
    SYM(cudart, set_device, "cudaSetDevice");
    SYM(cudart, stream_create, "cudaStreamCreateWithPriority");
    SYM(cudart, priority_range, "cudaDeviceGetStreamPriorityRange");
    SYM(cudart, stream_destroy, "cudaStreamDestroy");
    SYM(cudart, event_create, "cudaEventCreateWithFlags");
    SYM(cudart, event_record, "cudaEventRecord");
    SYM(cudart, event_query, "cudaEventQuery");
    SYM(cudart, event_sync, "cudaEventSynchronize");
    SYM(cudart, event_destroy, "cudaEventDestroy");
    SYM(cudart, event_elapsed, "cudaEventElapsedTime");
    SYM(cudart, stream_wait_event, "cudaStreamWaitEvent");
    SYM(cudart, cuda_malloc, "cudaMalloc");
    SYM(cudart, cuda_free, "cudaFree");
    SYM(cudart, device_count, "cudaGetDeviceCount");
    SYM(cudart, cuda_error, "cudaGetErrorString");
#undef SYM
    lib_state = 1;
done:;
    int st = lib_state;
    pthread_mutex_unlock(&lib_mu);
    return st > 0 ? 0 : -1;
}

bool comm_nccl_available(char *err, size_t errlen) {
    if (lib_load()) {
        snprintf(err, errlen, "%s", lib_err);
        return false;
    }
    int n = 0;
    int rc = lib.device_count(&n);
    if (rc != CUDA_OK || n < 1) {
        snprintf(err, errlen, "NCCL loads but no GPU is visible (cudaGetDeviceCount: %s)",
                 rc != CUDA_OK ? lib.cuda_error(rc) : "0 devices");
        return false;
    }
    return true;
}

/* ---- backend ---- */

typedef struct {
    nccl_comm_p comm;            /* NULL once aborted */
    cuda_stream_p stream;        /* this communicator's own stream */
    cuda_stream_p order_stream;  /* cfg->compute_stream, or NULL */
    cuda_event_p order_ev;       /* re-recorded on order_stream before each collective */
    float *scratch;              /* one device float for barriers */
    int device;
    /* failure (guarded by mu): set once, by the wait that aborted */
    pthread_mutex_t mu;
    int fail_status;             /* 0, or -EPIPE (asynchronous error) / -ETIMEDOUT */
    char fail_msg[COMM_ERR_LEN]; /* why; every later call on the communicator repeats it */
} nccl_state_t;

/* The failure recorded on c, if any: its status, with the message in err
 * (when not NULL). */
static int failed(comm_t *c, char *err, size_t errlen) {
    nccl_state_t *st = c->backend;
    pthread_mutex_lock(&st->mu);
    int rc = st->fail_status;
    if (rc && err) snprintf(err, errlen, "%s", st->fail_msg);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* "rank 5" / "ranks 0, 2, 3": the global ranks of c's group other than
 * this process, for messages. */
static void peer_list(const comm_t *c, char *buf, size_t len) {
    size_t off = (size_t)snprintf(buf, len, c->n > 2 ? "ranks " : "rank ");
    bool first = true;
    for (int i = 0; i < c->n && off < len; i++) {
        if (i == c->index) continue;
        if (off + 16 >= len) {
            snprintf(buf + off, len - off, ", ...");
            return;
        }
        off += (size_t)snprintf(buf + off, len - off, "%s%d", first ? "" : ", ", c->ranks[i]);
        first = false;
    }
}

/* Abort c's NCCL communicator once, ending the kernels stuck in it, and
 * record why; under st->mu. Returns the status (the first failure's when
 * another thread got there first). */
__attribute__((format(printf, 3, 4)))
static int abort_comm(comm_t *c, int status, const char *fmt, ...) {
    nccl_state_t *st = c->backend;
    if (st->fail_status) return st->fail_status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->fail_msg, sizeof st->fail_msg, fmt, ap);
    va_end(ap);
    st->fail_status = status;
    if (st->comm) lib.comm_abort(st->comm);
    st->comm = NULL;
    return status;
}

static void nccl_destroy_backend(comm_t *c) {
    nccl_state_t *st = c->backend;
    if (!st) return;
    if (st->comm) {
        /* a communicator with an asynchronous error may never finish a
         * destroy (it waits for its peers): abort it instead */
        int ar = NCCL_OK;
        if (lib.get_async_error(st->comm, &ar) != NCCL_OK || (ar != NCCL_OK && ar != NCCL_IN_PROGRESS))
            lib.comm_abort(st->comm);
        else
            lib.comm_destroy(st->comm);
    }
    if (st->scratch) lib.cuda_free(st->scratch);
    if (st->order_ev) lib.event_destroy(st->order_ev);
    if (st->stream) lib.stream_destroy(st->stream);
    pthread_mutex_destroy(&st->mu);
    free(st);
    c->backend = NULL;
}

static int nccl_init(comm_t *c, const comm_config_t *cfg, char *err, size_t errlen) {
    if (lib_load()) {
        snprintf(err, errlen, "comm %s: %s", c->name, lib_err);
        return -ENOSYS;
    }
    if (!cfg->rdzv && c->n > 1) {
        snprintf(err, errlen, "comm %s: the NCCL backend needs a rendezvous client for the unique id", c->name);
        return -EINVAL;
    }
    nccl_state_t *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "comm %s: out of memory", c->name);
        return -ENOMEM;
    }
    pthread_mutex_init(&st->mu, NULL);
    c->backend = st;
    st->device = cfg->device;
    int rc = lib.set_device(cfg->device);
    if (rc != CUDA_OK) {
        snprintf(err, errlen, "comm %s: cudaSetDevice(%d): %s", c->name, cfg->device, lib.cuda_error(rc));
        goto fail;
    }
    char key[RDZV_MAX_KEY];
    snprintf(key, sizeof key, "comm/%s/nccl-id", c->name);
    nccl_unique_id_t id;
    if (c->index == 0) {
        if ((rc = lib.get_unique_id(&id)) != NCCL_OK) {
            snprintf(err, errlen, "comm %s: ncclGetUniqueId: %s", c->name, lib.nccl_error(rc));
            goto fail;
        }
        if (c->n > 1 && rdzv_set(cfg->rdzv, key, &id, sizeof id, true, c->timeout_s, err, errlen)) goto fail;
    } else {
        void *v = NULL;
        size_t len = 0;
        if (rdzv_wait(cfg->rdzv, key, &v, &len, c->timeout_s, err, errlen)) goto fail;
        if (len != sizeof id) {
            free(v);
            snprintf(err, errlen, "comm %s: rendezvous key %s holds %zu bytes, not a %zu-byte NCCL "
                     "unique id: another job on this rendezvous?", c->name, key, len, sizeof id);
            goto fail;
        }
        memcpy(&id, v, sizeof id);
        free(v);
    }
    if ((rc = lib.comm_init_rank(&st->comm, c->n, id, c->index)) != NCCL_OK) {
        st->comm = NULL;
        snprintf(err, errlen, "comm %s: ncclCommInitRank(%d of %d): %s", c->name, c->index, c->n,
                 lib.nccl_error(rc));
        goto fail;
    }
    /* collectives at the device's greatest priority: their blocks start
     * ahead of queued compute, so a gather or reduce-scatter that overlaps
     * a block is not left waiting for SMs until the compute drains */
    int least = 0, greatest = 0;
    if ((rc = lib.priority_range(&least, &greatest)) != CUDA_OK ||
        (rc = lib.stream_create(&st->stream, CUDA_STREAM_NON_BLOCKING, greatest)) != CUDA_OK ||
        (rc = lib.cuda_malloc((void **)&st->scratch, sizeof(float))) != CUDA_OK) {
        snprintf(err, errlen, "comm %s: CUDA stream/scratch: %s", c->name, lib.cuda_error(rc));
        goto fail;
    }
    if (cfg->compute_stream) {
        st->order_stream = cfg->compute_stream;
        if ((rc = lib.event_create(&st->order_ev, CUDA_EVENT_DISABLE_TIMING)) != CUDA_OK) {
            st->order_ev = NULL;
            snprintf(err, errlen, "comm %s: CUDA event: %s", c->name, lib.cuda_error(rc));
            goto fail;
        }
    }
    return 0;
fail:
    nccl_destroy_backend(c);
    return -EIO;
}

static int nccl_start(comm_t *c, comm_req_t *r, char *err, size_t errlen) {
    nccl_state_t *st = c->backend;
    int frc = failed(c, err, errlen);
    if (frc) return frc;
    int dt = r->dt == COMM_BF16 ? NCCL_BFLOAT16 : NCCL_FLOAT32;
    int op = r->op == COMM_AVG ? NCCL_AVG : NCCL_SUM;
    int rc = NCCL_OK;
    int crc = lib.set_device(st->device);
    if (crc == CUDA_OK && st->order_stream && (crc = lib.event_record(st->order_ev, st->order_stream)) == CUDA_OK)
        crc = lib.stream_wait_event(st->stream, st->order_ev, 0);
    if (crc != CUDA_OK) {
        snprintf(err, errlen, "comm %s: %s: ordering after the compute stream: %s", c->name, comm_coll_name(r->coll),
                 lib.cuda_error(crc));
        return -EIO;
    }
    if (r->count > 0 || r->coll == COLL_BARRIER) {
        switch (r->coll) {
        case COLL_ALL_GATHER: rc = lib.all_gather(r->send, r->recv, r->count, dt, st->comm, st->stream); break;
        case COLL_REDUCE_SCATTER:
            rc = lib.reduce_scatter(r->send, r->recv, r->count, dt, op, st->comm, st->stream);
            break;
        case COLL_ALL_REDUCE: rc = lib.all_reduce(r->send, r->recv, r->count, dt, op, st->comm, st->stream); break;
        case COLL_BROADCAST: rc = lib.broadcast(r->recv, r->recv, r->count, dt, r->root, st->comm, st->stream); break;
        case COLL_BARRIER:
            rc = lib.all_reduce(st->scratch, st->scratch, 1, NCCL_FLOAT32, NCCL_SUM, st->comm, st->stream);
            break;
        case COLL_SHIFT:
            if (!lib.send || !lib.recv || !lib.group_start || !lib.group_end) {
                snprintf(err, errlen, "comm %s: ring_shift: this libnccl lacks ncclSend/ncclRecv/ncclGroupStart: "
                         "install NCCL >= 2.7", c->name);
                return -ENOTSUP;
            }
            rc = lib.group_start();
            if (rc == NCCL_OK) rc = lib.send(r->send, r->count, dt, (c->index + 1) % c->n, st->comm, st->stream);
            if (rc == NCCL_OK) rc = lib.recv(r->recv, r->count, dt, (c->index + c->n - 1) % c->n, st->comm, st->stream);
            {
                int erc = lib.group_end();
                if (rc == NCCL_OK) rc = erc;
            }
            break;
        }
    }
    if (rc != NCCL_OK) {
        snprintf(err, errlen, "comm %s: %s: %s", c->name, comm_coll_name(r->coll), lib.nccl_error(rc));
        return -EIO;
    }
    cuda_event_p ev = NULL;
    crc = lib.event_create(&ev, CUDA_EVENT_DISABLE_TIMING);
    if (crc == CUDA_OK) crc = lib.event_record(ev, st->stream);
    if (crc != CUDA_OK) {
        if (ev) lib.event_destroy(ev);
        snprintf(err, errlen, "comm %s: cudaEventRecord: %s", c->name, lib.cuda_error(crc));
        return -EIO;
    }
    r->backend = ev;
    return 0;
}

/* Poll r's event until it is done (0), NCCL reports an asynchronous
 * error on the communicator (-EPIPE), c->timeout_s passes (-ETIMEDOUT) or
 * CUDA fails (-EIO); the last three with the message in msg. The first two
 * abort the communicator. A few polls back to back, then sleeps of 10 us
 * doubling to 1 ms: a wait for a collective that is nearly done costs no
 * sleep, a long one little CPU. */
static int poll_event(comm_t *c, comm_req_t *r, cuda_event_p ev, char *msg, size_t len) {
    nccl_state_t *st = c->backend;
    double t0 = clock_now_s();
    long pause_ns = 0;
    char peers[160];
    for (int polls = 0;; polls++) {
        int rc = failed(c, msg, len);
        if (rc) return rc;
        int crc = lib.event_query(ev);
        if (crc == CUDA_OK) return 0;
        if (crc != CUDA_NOT_READY) {
            snprintf(msg, len, "comm %s: %s: cudaEventQuery: %s", c->name, comm_coll_name(r->coll),
                     lib.cuda_error(crc));
            return -EIO;
        }
        pthread_mutex_lock(&st->mu);
        int ar = NCCL_OK;
        if (!st->fail_status) {
            int qr = st->comm ? lib.get_async_error(st->comm, &ar) : NCCL_OK;
            if (qr != NCCL_OK) ar = qr;
        }
        double waited = clock_now_s() - t0;
        if (!st->fail_status && ar != NCCL_OK && ar != NCCL_IN_PROGRESS) {
            peer_list(c, peers, sizeof peers);
            abort_comm(c, -EPIPE, "comm %s (index %d of %d): %s: NCCL reports an asynchronous error after "
                       "%.1f s: %s: %s%s%s; the communicator was aborted. Look for the first error in the "
                       "ranks' logs (NCCL_DEBUG=WARN adds NCCL's view), then restart the job (--resume "
                       "continues from the last checkpoint)", c->name, c->index, c->n, comm_coll_name(r->coll),
                       waited, lib.nccl_error(ar), ar == NCCL_REMOTE_ERROR ? "" : "in this process or its link to ",
                       peers, ar == NCCL_REMOTE_ERROR ? " of this group failed, exited or lost its connection" : "");
        } else if (!st->fail_status && waited >= c->timeout_s) {
            peer_list(c, peers, sizeof peers);
            abort_comm(c, -ETIMEDOUT, "comm %s (index %d of %d): %s not done after %.1f s (the "
                       "communicator's timeout): %s of this group is dead, stuck, or did not start the "
                       "same collective; the communicator was aborted. Check that every rank runs and "
                       "look for the first error in their logs (NCCL_DEBUG=WARN adds NCCL's view)",
                       c->name, c->index, c->n, comm_coll_name(r->coll), c->timeout_s, peers);
        }
        pthread_mutex_unlock(&st->mu);
        if (polls < 64) continue;
        pause_ns = pause_ns ? (pause_ns < 500000 ? 2 * pause_ns : 1000000) : 10000;
        struct timespec ts = { 0, pause_ns };
        nanosleep(&ts, NULL);
    }
}

/* comm_wait: poll the event (poll_event), then complete the handle. */
static void nccl_wait(comm_t *c, comm_req_t *r) {
    cuda_event_p ev = r->backend;
    char msg[COMM_ERR_LEN];
    int rc = poll_event(c, r, ev, msg, sizeof msg);
    lib.event_destroy(ev);
    r->backend = NULL;
    comm_req_done(r, rc, rc ? msg : NULL);
}

/* Done, or failed (comm_wait then reports it). */
static bool nccl_test(comm_t *c, comm_req_t *r) {
    if (failed(c, NULL, 0)) return true;
    return r->backend && lib.event_query(r->backend) != CUDA_NOT_READY;
}

/* ---- stalls of the waiting stream ---- */

#define STALL_MAX 65536       /* pairs in flight; more are not timed */
typedef struct { cuda_event_p a, b; } stall_pair_t;
static stall_pair_t g_stall[STALL_MAX];
static int g_nstall;
static cuda_event_p g_free_ev[2 * 256];
static int g_nfree_ev;
static double g_stall_s;
static pthread_mutex_t g_stall_mu = PTHREAD_MUTEX_INITIALIZER;

static cuda_event_p timing_event(void) {   /* under g_stall_mu */
    if (g_nfree_ev > 0) return g_free_ev[--g_nfree_ev];
    cuda_event_p e = NULL;
    return lib.event_create(&e, 0) == CUDA_OK ? e : NULL;
}

static void drop_event(cuda_event_p e) {   /* under g_stall_mu */
    if (g_nfree_ev < (int)(sizeof g_free_ev / sizeof g_free_ev[0])) g_free_ev[g_nfree_ev++] = e;
    else lib.event_destroy(e);
}

double comm_nccl_stall_seconds(void) {
    if (__atomic_load_n(&lib_state, __ATOMIC_ACQUIRE) != 1) return 0;
    pthread_mutex_lock(&g_stall_mu);
    int k = 0;
    for (int i = 0; i < g_nstall; i++) {
        stall_pair_t p = g_stall[i];
        if (lib.event_query(p.b) == CUDA_NOT_READY) { g_stall[k++] = p; continue; }
        float ms = 0;
        if (lib.event_elapsed(&ms, p.a, p.b) == CUDA_OK && ms > 0) g_stall_s += 1e-3 * ms;
        drop_event(p.a);
        drop_event(p.b);
    }
    g_nstall = k;
    double s = g_stall_s;
    pthread_mutex_unlock(&g_stall_mu);
    return s;
}

/* comm_stream_wait: the stream waits on the collective's event, between
 * two timing events (the stall it causes, when there is room to time it). */
static int nccl_stream_wait(comm_t *c, comm_req_t *r, void *stream, char *err, size_t errlen) {
    int frc = failed(c, err, errlen);
    if (frc) return frc;
    cuda_event_p a = NULL, b = NULL;
    if (r->backend) {
        pthread_mutex_lock(&g_stall_mu);
        if (g_nstall < STALL_MAX && (a = timing_event()) && !(b = timing_event())) {
            drop_event(a);
            a = NULL;
        }
        pthread_mutex_unlock(&g_stall_mu);
    }
    bool timed = a && b && lib.event_record(a, stream) == CUDA_OK;
    int rc = r->backend ? lib.stream_wait_event(stream, r->backend, 0) : CUDA_OK;
    if (a) {
        pthread_mutex_lock(&g_stall_mu);
        if (timed && rc == CUDA_OK && lib.event_record(b, stream) == CUDA_OK && g_nstall < STALL_MAX) {
            g_stall[g_nstall++] = (stall_pair_t){ a, b };
        } else {
            drop_event(a);
            drop_event(b);
        }
        pthread_mutex_unlock(&g_stall_mu);
    }
    if (rc != CUDA_OK) {
        snprintf(err, errlen, "comm %s: %s: cudaStreamWaitEvent: %s", c->name, comm_coll_name(r->coll),
                 lib.cuda_error(rc));
        return -EIO;
    }
    return 0;
}

const comm_ops_t comm_nccl_ops = {
    .name = "nccl",
    .init = nccl_init,
    .destroy = nccl_destroy_backend,
    .start = nccl_start,
    .wait = nccl_wait,
    .test = nccl_test,
    .stream_wait = nccl_stream_wait,
};
