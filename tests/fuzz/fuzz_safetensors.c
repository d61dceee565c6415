/* fuzz_safetensors.c: a .safetensors file (workers/ckpt/safetensors.c):
 * st_open validates the header (JSON, dtypes, shapes, offsets, overlaps);
 * whatever it accepts can be read: each tensor (up to 1 Mi elements) is
 * converted to fp32 whole and by a range. */
#include <assert.h>

#include "tests/fuzz/fuzz_util.h"
#include "workers/ckpt/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], err[1024];
    int fd = fuzz_memfd(data, size, path, sizeof path);
    if (fd < 0) return 0;
    st_t *st = NULL;
    err[0] = 0;
    if (st_open(path, &st, err, sizeof err) == 0) {
        (void)st_metadata(st, "format");
        for (int i = 0; i < st_count(st); i++) {
            const st_info_t *t = st_info(st, i);
            assert(st_find(st, t->name) == t);
            int64_t n = 1;
            for (int k = 0; k < t->ndim; k++) n *= t->shape[k];
            if (n <= 0 || n > (1 << 20)) continue;
            float *buf = malloc((size_t)n * sizeof *buf);
            if (!buf) continue;
            (void)st_read_f32(st, t->name, t->shape, t->ndim, buf, err, sizeof err);
            (void)st_read_f32_range(st, t->name, n / 2, n - n / 2, buf, err, sizeof err);
            free(buf);
        }
        st_close(st);
    } else {
        assert(err[0]);
    }
    close(fd);
    return 0;
}
