/* nccl_fake.c: a stand-in for libnccl.so.2 and libcudart.so in one shared
 * library, for tests/unit/test_comm_nccl_wait.c: the NCCL backend
 * (workers/comm/nccl.c) loads it through BALLAST_NCCL_LIB and
 * BALLAST_CUDART_LIB, so its waiting can be driven on a machine without a
 * GPU. Built by tests/module.mk as $(BUILD)/tests/lib/nccl_fake.so.
 *
 * Only the calls nccl.c makes exist, with the ABI nccl.c restates (int for
 * the result enums, void * for handles). Nothing is computed: a collective
 * only counts; an event is done after `ready_after` queries (never when
 * -1); ncclCommGetAsyncError reports `async_code` from its
 * `async_after`-th call on (never when async_code is 0). The test sets
 * these with nccl_fake_set and reads what happened with nccl_fake_counts
 * (both through dlsym). */
#include <stdlib.h>
#include <string.h>

typedef struct {
    int ready_after;   /* event queries before an event is done; -1 = never */
    int async_code;    /* what ncclCommGetAsyncError reports; 0 = ncclSuccess */
    int async_after;   /* its calls before it starts reporting async_code */
} nccl_fake_cfg_t;

typedef struct {
    int inits, destroys, aborts, collectives;
    int async_queries, event_queries, event_syncs;
} nccl_fake_counts_t;

static nccl_fake_cfg_t cfg = { 0, 0, 0 };
static nccl_fake_counts_t counts;

typedef struct { int queries; } fake_event_t;
typedef struct { int magic; } fake_comm_t;

/* ---- control, for the test ---- */

void nccl_fake_set(const nccl_fake_cfg_t *c) { cfg = *c; }
void nccl_fake_counts(nccl_fake_counts_t *out) { *out = counts; }

/* ---- NCCL ---- */

typedef struct { char internal[128]; } fake_id_t;

int ncclGetUniqueId(fake_id_t *id) { memset(id, 7, sizeof *id); return 0; }
int ncclCommInitRank(void **comm, int n, fake_id_t id, int rank) {
    (void)n, (void)id, (void)rank;
    fake_comm_t *c = malloc(sizeof *c);
    if (!c) return 2;   /* ncclSystemError */
    c->magic = 0x6e63;
    counts.inits++;
    *comm = c;
    return 0;
}
int ncclCommDestroy(void *comm) { counts.destroys++; free(comm); return 0; }
int ncclCommAbort(void *comm) { counts.aborts++; free(comm); return 0; }
int ncclCommGetAsyncError(void *comm, int *async) {
    if (!comm || ((fake_comm_t *)comm)->magic != 0x6e63) return 4;   /* ncclInvalidArgument */
    *async = cfg.async_code && counts.async_queries >= cfg.async_after ? cfg.async_code : 0;
    counts.async_queries++;
    return 0;
}
int ncclAllGather(const void *s, void *r, size_t n, int dt, void *comm, void *st) {
    (void)s, (void)r, (void)n, (void)dt, (void)comm, (void)st;
    counts.collectives++;
    return 0;
}
int ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, void *comm, void *st) {
    (void)s, (void)r, (void)n, (void)dt, (void)op, (void)comm, (void)st;
    counts.collectives++;
    return 0;
}
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *comm, void *st) {
    (void)s, (void)r, (void)n, (void)dt, (void)op, (void)comm, (void)st;
    counts.collectives++;
    return 0;
}
int ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, void *comm, void *st) {
    (void)s, (void)r, (void)n, (void)dt, (void)root, (void)comm, (void)st;
    counts.collectives++;
    return 0;
}
const char *ncclGetErrorString(int rc) {
    switch (rc) {
    case 0: return "no error";
    case 2: return "unhandled system error (fake)";
    case 6: return "remote process exited or there was a network error (fake)";
    default: return "some NCCL error (fake)";
    }
}

/* ---- CUDA runtime ---- */

int cudaSetDevice(int d) { (void)d; return 0; }
int cudaGetDeviceCount(int *n) { *n = 1; return 0; }
const char *cudaGetErrorString(int rc) { return rc == 600 ? "device not ready (fake)" : "some CUDA error (fake)"; }
int cudaStreamCreateWithFlags(void **s, unsigned f) { (void)f; *s = malloc(1); return *s ? 0 : 2; }
int cudaStreamCreateWithPriority(void **s, unsigned f, int prio) { (void)prio; return cudaStreamCreateWithFlags(s, f); }
int cudaDeviceGetStreamPriorityRange(int *least, int *greatest) { *least = 0, *greatest = -5; return 0; }
int cudaStreamDestroy(void *s) { free(s); return 0; }
int cudaStreamWaitEvent(void *s, void *e, unsigned f) { (void)s, (void)e, (void)f; return 0; }
int cudaMalloc(void **p, size_t n) { *p = malloc(n ? n : 1); return *p ? 0 : 2; }
int cudaFree(void *p) { free(p); return 0; }
int cudaEventCreateWithFlags(void **e, unsigned f) {
    (void)f;
    *e = calloc(1, sizeof(fake_event_t));
    return *e ? 0 : 2;
}
int cudaEventRecord(void *e, void *s) { (void)s; ((fake_event_t *)e)->queries = 0; return 0; }
int cudaEventQuery(void *e) {
    fake_event_t *ev = e;
    counts.event_queries++;
    return cfg.ready_after >= 0 && ev->queries++ >= cfg.ready_after ? 0 : 600;   /* cudaErrorNotReady */
}
/* nccl.c must not block here: a dead peer would hang it for good */
int cudaEventSynchronize(void *e) { (void)e; counts.event_syncs++; return 0; }
int cudaEventDestroy(void *e) { free(e); return 0; }
int cudaEventElapsedTime(float *ms, void *a, void *b) { (void)a, (void)b; *ms = 0; return 0; }
