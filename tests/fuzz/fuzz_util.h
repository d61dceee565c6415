/* fuzz_util.h: what the fuzz targets share. The parsers under test read
 * files, so an input is handed to them as one: a memfd named through
 * /proc/self/fd, or a file in a private directory made once per process. */
#ifndef BALLAST_FUZZ_UTIL_H
#define BALLAST_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A memfd holding data[0..n); its path into path. The fd, or -1. */
static inline int fuzz_memfd(const uint8_t *data, size_t n, char *path, size_t len) {
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (n && write(fd, data, n) != (ssize_t)n) { close(fd); return -1; }
    snprintf(path, len, "/proc/self/fd/%d", fd);
    return fd;
}

/* Write data[0..n) to path (replacing it). 0 or -1. */
static inline int fuzz_write_file(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* A private directory, made once per process under $TMPDIR (or /tmp);
 * the caller of the target removes it (tests/fuzz/run.sh and the replay
 * test point TMPDIR at a directory of their own). */
static inline const char *fuzz_dir(const char *what) {
    static char dir[512];
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/ballast-fuzz-%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", what);
        if (!mkdtemp(dir)) { perror("mkdtemp"); abort(); }
    }
    return dir;
}

#endif
