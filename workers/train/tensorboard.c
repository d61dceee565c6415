/* tensorboard.c: TensorBoard event files, TFRecord framing around
 * protobuf-c Events (build/gen/tensorboard/event.pb-c.h). The format is in
 * tensorboard.h; docs/observability.md says which scalars a step writes. */
#include "workers/train/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "tensorboard/event.pb-c.h"

#define TB_MAX_SCALARS 32

struct tb_writer {
    int fd;
    char *path;
};

uint32_t tb_masked_crc32c(const void *buf, size_t len) {
    uint32_t c = crc32c(0, buf, len);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Frame and write one Event: one write(2) of the whole record (retried
 * only for what a short write left). 0 or -1 with err. */
static int write_event(tb_writer_t *w, const Tensorboard__Event *ev, char *err, size_t errlen) {
    size_t n = tensorboard__event__get_packed_size(ev);
    uint8_t *rec = malloc(n + 16);
    if (!rec) { snprintf(err, errlen, "out of memory"); return -1; }
    put_le64(rec, n);
    put_le32(rec + 8, tb_masked_crc32c(rec, 8));
    tensorboard__event__pack(ev, rec + 12);
    put_le32(rec + 12 + n, tb_masked_crc32c(rec + 12, n));
    size_t off = 0, total = n + 16;
    while (off < total) {
        ssize_t k = write(w->fd, rec + off, total - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            snprintf(err, errlen, "writing the TensorBoard events %s failed: %s; free space or choose another "
                     "--tensorboard-dir", w->path, k < 0 ? strerror(errno) : "short write");
            free(rec);
            return -1;
        }
        off += (size_t)k;
    }
    free(rec);
    return 0;
}

tb_writer_t *tb_open(const char *dir, char *err, size_t errlen) {
    if (!dir || !*dir) { snprintf(err, errlen, "--tensorboard-dir is empty; give a directory"); return NULL; }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "--tensorboard-dir %s: cannot create it: %s; create its parent or choose another "
                 "directory", dir, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "--tensorboard-dir %s: not a directory; give a directory for the event files", dir);
        return NULL;
    }
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++) if (*p == '/') *p = '_';
    size_t plen = strlen(dir) + strlen(host) + 80;
    tb_writer_t *w = calloc(1, sizeof *w);
    if (!w || !(w->path = malloc(plen))) { free(w); snprintf(err, errlen, "out of memory"); return NULL; }
    snprintf(w->path, plen, "%s/events.out.tfevents.%lld.%s.%d", dir, (long long)time(NULL), host, (int)getpid());
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        snprintf(err, errlen, "--tensorboard-dir %s: cannot create %s: %s; check the directory's permissions", dir,
                 w->path, strerror(errno));
        free(w->path);
        free(w);
        return NULL;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)"brain.Event:2";
    if (write_event(w, &ev, err, errlen) != 0) { tb_close(w); return NULL; }
    return w;
}

int tb_write_scalars(tb_writer_t *w, int64_t step, double wall_time, const char *const *tags, const double *values,
                     size_t n, char *err, size_t errlen) {
    if (!w) return 0;
    Tensorboard__Summary__Value vals[TB_MAX_SCALARS], *ptrs[TB_MAX_SCALARS];
    size_t k = 0;
    for (size_t i = 0; i < n && k < TB_MAX_SCALARS; i++) {
        if (!isfinite(values[i])) continue;
        tensorboard__summary__value__init(&vals[k]);
        vals[k].tag = (char *)tags[i];
        vals[k].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        vals[k].simple_value = (float)values[i];
        ptrs[k] = &vals[k];
        k++;
    }
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = k;
    sum.value = ptrs;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(w, &ev, err, errlen);
}

const char *tb_path(const tb_writer_t *w) { return w ? w->path : NULL; }

void tb_close(tb_writer_t *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    free(w->path);
    free(w);
}
