/* st_tool.c: helper for tests/reference/safetensors_torch.sh.
 *   st_tool write OUT SEED   random F32/BF16/F16 tensors (with ties, subnormals,
 *                            overflow, inf, NaN) to OUT; their fp32 sources,
 *                            concatenated in order, to OUT.src
 *   st_tool read IN RAW      every tensor of IN (sorted by name) as fp32,
 *                            concatenated, to RAW; names and shapes on stdout */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "workers/ckpt/safetensors.h"

static uint64_t rs;
static uint64_t rnd(void) { rs ^= rs >> 12; rs ^= rs << 25; rs ^= rs >> 27; return rs * 2685821657736338717ULL; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static float sample(int i) {
    switch (i % 6) {
    case 0: return (float)((double)(rnd() >> 11) * 0x1p-53 * 20 - 10);
    case 1: return u2f((uint32_t)rnd() & 0x80ffffffu);                                   /* tiny */
    case 2: return u2f(((uint32_t)rnd() & 0x807f0000u) | 0x8000u | (uint32_t)((100 + rnd() % 40) << 23)); /* bf16 ties */
    case 3: return u2f(((uint32_t)rnd() & 0x807fe000u) | 0x1000u | (uint32_t)((103 + rnd() % 40) << 23)); /* f16 ties */
    case 4: return u2f(((uint32_t)rnd() & 0x807fffffu) | (uint32_t)((140 + rnd() % 10) << 23));          /* large */
    default: { static const float sp[] = { INFINITY, -INFINITY, 0.0f, -0.0f, 65504.0f, 65520.0f, 65519.99f, 0x1p-25f, 0x1p-24f, 3e38f };
               return sp[rnd() % 10]; }
    }
}

int main(int argc, char **argv) {
    if (argc != 4) die("usage: st_tool write OUT SEED | st_tool read IN RAW");
    char err[1024];
    if (strcmp(argv[1], "write") == 0) {
        rs = strtoull(argv[3], NULL, 0) | 1;
        static const struct { const char *name; st_dtype_t dt; int ndim; int64_t shape[3]; } T[] = {
            { "a.f32", ST_F32, 2, { 5, 7 } }, { "b.bf16", ST_BF16, 2, { 30, 11 } }, { "c.f16", ST_F16, 1, { 413 } },
            { "d.bf16", ST_BF16, 3, { 2, 3, 4 } }, { "e.f16", ST_F16, 2, { 17, 19 } },
        };
        st_writer_t *w = st_writer_new();
        char src[4096];
        snprintf(src, sizeof src, "%s.src", argv[2]);
        FILE *f = fopen(src, "wb");
        if (!w || !f) die("cannot create %s", src);
        for (size_t t = 0; t < sizeof T / sizeof T[0]; t++) {
            int64_t n = 1;
            for (int d = 0; d < T[t].ndim; d++) n *= T[t].shape[d];
            float *x = malloc((size_t)n * sizeof *x);
            for (int64_t i = 0; i < n; i++) x[i] = sample((int)i);
            if (st_writer_add_f32(w, T[t].name, T[t].dt, T[t].shape, T[t].ndim, x) != 0) die("add %s", T[t].name);
            fwrite(x, sizeof *x, (size_t)n, f);
            free(x);
        }
        fclose(f);
        st_writer_set_metadata(w, "format", "pt");
        if (st_writer_save(w, argv[2], err, sizeof err) != 0) die("%s", err);
        st_writer_free(w);
        return 0;
    }
    if (strcmp(argv[1], "read") == 0) {
        st_t *st;
        if (st_open(argv[2], &st, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
        FILE *f = fopen(argv[3], "wb");
        if (!f) die("cannot create %s", argv[3]);
        for (int i = 0; i < st_count(st); i++) {
            const st_info_t *in = st_info(st, i);
            int64_t n = 1;
            for (int d = 0; d < in->ndim; d++) n *= in->shape[d];
            float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
            if (st_read_f32(st, in->name, in->shape, in->ndim, x, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
            fwrite(x, sizeof *x, (size_t)n, f);
            printf("%s %lld\n", in->name, (long long)n);
            free(x);
        }
        fclose(f);
        st_close(st);
        return 0;
    }
    die("unknown mode %s", argv[1]);
}
