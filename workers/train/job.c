/* job.c: the job of a training process from its flags; see job.h. Relies
 * on options.c for the topology and the backend, on dist.c for joining and
 * on workers/comm/stage.h for putting the shm collectives behind host
 * staging. */
#include "workers/train/job.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "log.h"
#include "workers/comm/stage.h"

/* The GPU of a rank: local rank r -> (--device + r) mod count (one process:
 * --device itself), and the collectives: NCCL when every local rank has a
 * GPU of its own (and --comm allows), shm with host staging when ranks
 * share a GPU. 0, or -1 with a message. */
static int gpu_setup(train_job_t *j, const train_opts_t *o, char *err, size_t errlen) {
    char why[256] = "";
    int count = backend_device_count(BACKEND_CUDA, why, sizeof why);
    /* without the kernel driver the runtime calls the driver "insufficient": name the real cause */
    if (count <= 0 && access("/proc/driver/nvidia/version", F_OK) != 0)
        return errbuf_set(err, errlen, "--backend cuda: no NVIDIA driver on this machine (/proc/driver/nvidia/version "
                          "is missing; the CUDA runtime says: %s): install the NVIDIA driver (in a container: start it "
                          "with the GPUs exposed, e.g. docker run --gpus all), or train on the CPU with --backend cpu",
                          why);
    if (count <= 0)
        return errbuf_set(err, errlen, "--backend cuda: no usable GPU: %s; check nvidia-smi and CUDA_VISIBLE_DEVICES", why);
    if (j->world == 1) {
        j->device = (int)o->device;
        return (j->be = train_open_backend(o, j->device, err, errlen)) ? 0 : -1;
    }
    int local = j->topo.local_rank, local_world = j->topo.local_world_size;
    j->device = (int)((o->device + local) % count);
    bool shared = local_world > count; /* some GPU drives two ranks or more: NCCL refuses that */
    if (shared && j->comm == COMM_NCCL)
        return errbuf_set(err, errlen, "--comm nccl: %d ranks on this node share %d GPU%s and NCCL refuses two ranks on "
                          "one GPU; use --comm auto or shm (shared-memory collectives with host staging), or one rank "
                          "per GPU", local_world, count, count == 1 ? "" : "s");
    if (shared) j->comm = COMM_SHM;
    return (j->be = train_open_backend(o, j->device, err, errlen)) ? 0 : -1;
}

int train_job_open(train_job_t *j, const train_opts_t *o, char *err, size_t errlen) {
    memset(j, 0, sizeof *j);
    if (train_resolve_topology(o, &j->topo, err, errlen)) return -1;
    j->rank = j->topo.rank;
    j->world = j->topo.world_size;
    j->comm = (comm_kind_t)o->comm;
    if (j->world > 1) snprintf(j->who, sizeof j->who, "rank %d: ", j->rank);
    if (o->backend == 1) return gpu_setup(j, o, err, errlen);
    return (j->be = train_open_backend(o, 0, err, errlen)) ? 0 : -1;
}

/* With device buffers on the shm backend: put each communicator behind
 * host staging. 0, or -1 with a message. */
static int stage_comms(dist_t *d, const backend_t *be, char *err, size_t errlen) {
    for (int k = 0; k < GROUP_NKINDS; k++) {
        if (!d->comm[k]) continue; /* a group of one rank */
        comm_t *w = NULL;
        if (comm_stage_wrap(&w, d->comm[k], be, err, errlen)) return -1;
        d->comm[k] = w;
    }
    return 0;
}

/* --comm-dir, or by default the directory of --offload-socket (created when
 * missing; /tmp, with a warning, when it cannot be). into: a buffer of
 * PATH_MAX bytes. NULL with a message when --comm-dir is not a directory. */
static const char *comm_dir(const train_opts_t *o, char *into, size_t len, char *err, size_t errlen) {
    struct stat sb;
    if (o->comm_dir && o->comm_dir[0]) {
        if (stat(o->comm_dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
            errbuf_set(err, errlen, "--comm-dir %s: %s: create it, or name a directory every rank of the node "
                       "shares", o->comm_dir, stat(o->comm_dir, &sb) < 0 ? strerror(errno) : "not a directory");
            return NULL;
        }
        return o->comm_dir;
    }
    const char *s = o->offload_socket && o->offload_socket[0] ? o->offload_socket : "unix:/run/ballast/ballastd.sock";
    if (!strncmp(s, "unix:", 5)) s += 5;
    snprintf(into, len, "%s", s);
    char *slash = strrchr(into, '/');
    if (!slash || slash == into) snprintf(into, len, "/tmp");
    else *slash = 0;
    if (stat(into, &sb) == 0 && S_ISDIR(sb.st_mode) && access(into, W_OK | X_OK) == 0) return into;
    if (mkdir(into, 0755) == 0 || (errno == EEXIST && access(into, W_OK | X_OK) == 0)) return into;
    log_warn("the default --comm-dir %s (beside --offload-socket) cannot be used (%s): using /tmp, which "
             "ranks in other containers do not share; set --comm-dir", into, strerror(errno));
    snprintf(into, len, "/tmp");
    return into;
}

int train_job_join(train_job_t *j, const train_opts_t *o, char *err, size_t errlen) {
    char addr[TOPO_ADDR_MAX + 16], cdir[PATH_MAX];
    const char *cd = j->world > 1 ? comm_dir(o, cdir, sizeof cdir, err, errlen) : NULL;
    if (j->world > 1 && !cd) return -1;
    snprintf(addr, sizeof addr, "%s:%d", j->topo.master_addr, j->topo.master_port);
    dist_opts_t dopt = {
        .world = j->world, .rank = j->rank, .S = (int)o->shard_degree, .T = (int)o->tp_degree, .C = (int)o->cp_degree,
        .comm = j->comm, .on_gpu = o->backend == 1, .device = j->device, .compute_stream = be_stream(j->be),
        .rdzv_addr = addr, .rdzv_serve = true, .job_id = "ballast-train", .rdzv_timeout_s = o->rdzv_timeout,
        .comm_dir = cd,
    };
    if (dist_init(&j->d, &dopt, err, errlen)) return -1;
    j->joined = true;
    /* shm collectives read and write host memory: stage them for a backend
     * whose memory the host may not touch */
    j->staged = j->d.kind != COMM_NCCL && !j->be->host_memory;
    if (j->staged && stage_comms(&j->d, j->be, err, errlen)) return -1;
    if (o->backend == 1 && j->world > 1)
        log_info("rank %d: GPU %d, collectives %s", j->rank, j->device, dist_comm_name(&j->d));
    else if (j->staged)
        log_info("rank %d: %s backend, collectives %s", j->rank, j->be->name, dist_comm_name(&j->d));
    return 0;
}

int train_job_leave(train_job_t *j, char *err, size_t errlen) {
    if (!j->joined) return 0;
    j->joined = false;
    return dist_destroy(&j->d, err, errlen);
}

void train_job_abort(train_job_t *j) {
    if (!j->joined) return;
    j->joined = false;
    dist_abort(&j->d);
}
