/* test_safetensors.c: safetensors round trips (single file, directory,
 * sharded directory with index.json), the bf16/f16 conversions against
 * reference rounding computed in double precision, and headers that lie. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "workers/ckpt/safetensors.h"
#include "tests/unit/helpers.h"

static uint64_t rng_state;
static uint64_t rnd(void) { return th_xorshift64s(&rng_state); }
static float rnd_normal(void) {
    double u1 = ((double)(rnd() >> 11) + 1) * 0x1p-53, u2 = (double)(rnd() >> 11) * 0x1p-53;
    return (float)(sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
}
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static char tmpdir[64];
static void mk_tmpdir(void) { th_tmpdir(tmpdir, sizeof tmpdir, NULL, "test-st"); }
static void rm_tmpdir(void) { cr_assert_eq(th_tmpdir_remove(tmpdir), 0); }
TestSuite(st, .init = mk_tmpdir, .fini = rm_tmpdir);

/* ---- reference rounding, independent of the code under test ---- */

/* Round x to a binary format with `mant` stored mantissa bits, minimum
 * normal exponent emin and largest finite value maxf, nearest-even, in
 * double arithmetic (exact for float inputs). */
static double ref_round(float x, int mant, int emin, double maxf) {
    if (isnan(x) || isinf(x) || x == 0) return x;
    double a = fabs((double)x);
    int e;
    frexp(a, &e);                        /* a = m * 2^e, m in [0.5, 1) */
    int lead = e - 1;
    double q = ldexp(1.0, (lead > emin ? lead : emin) - mant);
    double r = nearbyint(a / q) * q;     /* default mode: ties to even */
    if (r > maxf) r = INFINITY;
    return copysign(r, (double)x);
}
static double ref_f16(float x) { return ref_round(x, 10, -14, 65504.0); }
static double ref_bf16(float x) { return ref_round(x, 7, -126, ldexp(255.0, 120)); }   /* (2 - 2^-7) * 2^127 */

/* Decode f16 bits by the IEEE definition. */
static double dec_f16(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void check_same(double want, float got, const char *what, float x) {
    if (isnan(want)) { cr_assert(isnan(got), "%s(%a) = %a, want NaN", what, (double)x, (double)got); return; }
    cr_assert((double)got == want && !signbit(got) == !signbit(want), "%s(%a) = %a, want %a", what, (double)x,
              (double)got, want);
}

Test(st, f16_decode_all_patterns) {
    for (uint32_t h = 0; h < 65536; h++) check_same(dec_f16((uint16_t)h), f16_to_f32((uint16_t)h), "f16_to_f32", (float)h);
}

Test(st, bf16_decode_all_patterns) {
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t hh = (uint16_t)h;
        float got = bf16_to_f32(hh);
        int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
        double v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128 + m, e - 134);
        check_same(s ? -v : v, got, "bf16_to_f32", (float)h);
    }
}

/* Random floats over every exponent, plus exact ties, specials, boundaries. */
static float sample_float(int kind) {
    switch (kind % 4) {
    case 0: return u2f((uint32_t)rnd());                                     /* any bit pattern */
    case 1: return rnd_normal();
    case 2: return u2f((uint32_t)(rnd() & 0x807fffffu) | (uint32_t)((100 + rnd() % 45) << 23));  /* near f16 range */
    default: return u2f((uint32_t)rnd() & 0x80ffffffu);                     /* tiny: f32 subnormals and small normals */
    }
}

Test(st, f32_to_f16_rounding) {
    rng_state = 0xf16f16ULL;
    for (int i = 0; i < 400000; i++) {
        float x = sample_float(i);
        check_same(ref_f16(x), f16_to_f32(f32_to_f16(x)), "f16", x);
    }
    /* Ties: halfway between consecutive f16 values (normal and subnormal). */
    for (int i = 0; i < 20000; i++) {
        uint16_t h = (uint16_t)(rnd() & 0x7bfe);            /* finite, below max */
        double lo = dec_f16(h), hi = dec_f16((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2);
        cr_assert_eq((double)mid, (lo + hi) / 2);         /* exactly representable */
        uint16_t want = (h & 1) ? (uint16_t)(h + 1) : h;
        cr_assert_eq(f32_to_f16(mid), want, "tie %a: got %#x want %#x", (double)mid, f32_to_f16(mid), want);
        cr_assert_eq(f32_to_f16(-mid), want | 0x8000);
    }
    cr_assert_eq(f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(f32_to_f16(65519.996f), 0x7bff);
    cr_assert_eq(f32_to_f16(65520.0f), 0x7c00);         /* tie to even rounds to inf */
    cr_assert_eq(f32_to_f16(INFINITY), 0x7c00);
    cr_assert_eq(f32_to_f16(-INFINITY), 0xfc00);
    cr_assert_eq(f32_to_f16(0x1p-25f), 0x0000);         /* tie between 0 and min subnormal */
    cr_assert_eq(f32_to_f16(0x1.000002p-25f), 0x0001);
    cr_assert_eq(f32_to_f16(-0.0f), 0x8000);
    cr_assert(isnan(f16_to_f32(f32_to_f16(NAN))));
    cr_assert(isnan(f16_to_f32(f32_to_f16(u2f(0x7f800001u)))), "signalling NaN must stay NaN");
    cr_assert(signbit(f16_to_f32(f32_to_f16(-NAN))));
#ifdef __FLT16_MAX__
    /* The compiler's own float -> _Float16 conversion as a second oracle. */
    for (int i = 0; i < 200000; i++) {
        float x = sample_float(i);
        if (isnan(x)) continue;
        _Float16 c = (_Float16)x;
        uint16_t cb;
        memcpy(&cb, &c, 2);
        cr_assert_eq(f32_to_f16(x), cb, "x=%a: ours %#x, compiler %#x", (double)x, f32_to_f16(x), cb);
    }
#endif
}

Test(st, f32_to_bf16_rounding) {
    rng_state = 0xbf16bf16ULL;
    for (int i = 0; i < 400000; i++) {
        float x = sample_float(i);
        check_same(ref_bf16(x), bf16_to_f32(f32_to_bf16(x)), "bf16", x);
    }
    for (int i = 0; i < 20000; i++) {
        uint32_t u = (uint32_t)rnd() & 0x7f7f0000u;         /* finite bf16 below max */
        float mid = u2f(u | 0x8000u);                         /* exactly halfway to the next */
        uint16_t h = (uint16_t)(u >> 16), want = (h & 1) ? (uint16_t)(h + 1) : h;
        cr_assert_eq(f32_to_bf16(mid), want, "tie %a", (double)mid);
    }
    cr_assert_eq(f32_to_bf16(u2f(0x7f7fffffu)), 0x7f80);  /* FLT_MAX rounds to inf */
    cr_assert_eq(f32_to_bf16(-INFINITY), 0xff80);
    cr_assert(isnan(bf16_to_f32(f32_to_bf16(u2f(0x7f800001u)))), "NaN with low payload must stay NaN");
    cr_assert(isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

/* ---- round trips ---- */

typedef struct { char name[64]; st_dtype_t dt; int ndim; int64_t shape[8]; float *data; int64_t n; } tens_t;

static void rand_tensor(tens_t *t, int i) {
    static const st_dtype_t dts[3] = { ST_F32, ST_BF16, ST_F16 };
    snprintf(t->name, sizeof t->name, "model.layers.%d.w%d", i, (int)(rnd() % 100));
    t->dt = dts[i % 3];
    t->ndim = (int)(rnd() % 4);
    t->n = 1;
    for (int d = 0; d < t->ndim; d++) { t->shape[d] = 1 + (int64_t)(rnd() % 9); t->n *= t->shape[d]; }
    if (i == 4) { t->ndim = 2; t->shape[0] = 3; t->shape[1] = 0; t->n = 0; }   /* an empty tensor */
    t->data = malloc((size_t)(t->n ? t->n : 1) * sizeof(float));
    for (int64_t k = 0; k < t->n; k++) t->data[k] = rnd_normal() * 10;
}

static float expect_val(const tens_t *t, int64_t k) {
    if (t->dt == ST_F32) return t->data[k];
    return (float)(t->dt == ST_BF16 ? ref_bf16(t->data[k]) : ref_f16(t->data[k]));
}

static void check_tensor(st_t *st, const tens_t *t) {
    const st_info_t *in = st_find(st, t->name);
    cr_assert_not_null(in, "%s missing", t->name);
    cr_assert_eq(in->dtype, t->dt);
    cr_assert_eq(in->ndim, t->ndim);
    for (int d = 0; d < t->ndim; d++) cr_assert_eq(in->shape[d], t->shape[d]);
    cr_assert_eq(in->nbytes, t->n * (t->dt == ST_F32 ? 4 : 2));
    float *got = malloc((size_t)(t->n ? t->n : 1) * sizeof(float));
    char err[512];
    cr_assert_eq(st_read_f32(st, t->name, t->shape, t->ndim, got, err, sizeof err), 0, "%s", err);
    for (int64_t k = 0; k < t->n; k++)
        cr_assert_eq(got[k], expect_val(t, k), "%s[%lld]: %a vs %a", t->name, (long long)k, (double)got[k],
                     (double)expect_val(t, k));
    free(got);
}

static void write_set(const char *path, tens_t *ts, int lo, int hi) {
    st_writer_t *w = st_writer_new();
    cr_assert_not_null(w);
    for (int i = lo; i < hi; i++)
        cr_assert_eq(st_writer_add_f32(w, ts[i].name, ts[i].dt, ts[i].shape, ts[i].ndim, ts[i].data), 0);
    cr_assert_eq(st_writer_set_metadata(w, "format", "pt"), 0);
    char err[512];
    cr_assert_eq(st_writer_save(w, path, err, sizeof err), 0, "%s", err);
    st_writer_free(w);
}

Test(st, roundtrip_single_file_bytes_and_values) {
    rng_state = 0x5afe7e45ULL;
    tens_t ts[12];
    for (int i = 0; i < 12; i++) rand_tensor(&ts[i], i);
    char p[256];
    snprintf(p, sizeof p, "%s/model.safetensors", tmpdir);
    write_set(p, ts, 0, 12);
    /* Bytes by hand: header length, JSON, 8-byte padding with spaces, offsets tile the buffer. */
    size_t fsz;
    uint8_t *b = th_read_file(p, &fsz);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)b[i] << (8 * i);
    cr_assert_eq(n % 8, 0);
    cr_assert_leq(8 + n, (uint64_t)fsz);
    json_error_t je;
    json_t *root = json_loadb((char *)b + 8, n, 0, &je);
    cr_assert_not_null(root, "header not JSON: %s", je.text);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "__metadata__"), "format")), "pt");
    int64_t total = 0;
    for (int i = 0; i < 12; i++) {
        json_t *e = json_object_get(root, ts[i].name);
        cr_assert_not_null(e);
        int64_t beg = json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
        int64_t end = json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1));
        int es = ts[i].dt == ST_F32 ? 4 : 2;
        cr_assert_eq(end - beg, ts[i].n * es);
        total += end - beg;
        for (int64_t k = 0; k < ts[i].n; k++) {   /* raw bytes are the reference encoding */
            const uint8_t *q = b + 8 + n + beg + k * es;
            float v;
            if (es == 4) memcpy(&v, q, 4);
            else {
                uint16_t h = (uint16_t)(q[0] | q[1] << 8);
                v = ts[i].dt == ST_F16 ? (float)dec_f16(h) : u2f((uint32_t)h << 16);
            }
            cr_assert_eq(v, expect_val(&ts[i], k));
        }
    }
    cr_assert_eq(8 + (int64_t)n + total, fsz);
    json_decref(root);
    free(b);
    char err[512];
    st_t *st;
    cr_assert_eq(st_open(p, &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st_count(st), 12);
    cr_assert_str_eq(st_metadata(st, "format"), "pt");
    for (int i = 0; i < 12; i++) check_tensor(st, &ts[i]);
    cr_assert_null(st_find(st, "nope"));
    st_close(st);
    /* The directory form finds model.safetensors. */
    cr_assert_eq(st_open(tmpdir, &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st_count(st), 12);
    check_tensor(st, &ts[7]);
    /* Shape mismatch on read names the tensor and both shapes. */
    int64_t wrong[3] = { ts[7].shape[0] + 1, 2, 2 };
    float dummy[1024];
    cr_assert_neq(st_read_f32(st, ts[7].name, wrong, 3, dummy, err, sizeof err), 0);
    cr_assert(strstr(err, ts[7].name) && strstr(err, "expects"), "%s", err);
    st_close(st);
    for (int i = 0; i < 12; i++) free(ts[i].data);
}

Test(st, roundtrip_sharded_directory_with_index) {
    rng_state = 0x5a4dULL;
    tens_t ts[9];
    for (int i = 0; i < 9; i++) rand_tensor(&ts[i], i);
    char p[256];
    const char *files[3] = { "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                             "model-00003-of-00003.safetensors" };
    json_t *wm = json_object();
    for (int s = 0; s < 3; s++) {
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[s]);
        write_set(p, ts, 3 * s, 3 * s + 3);
        for (int i = 3 * s; i < 3 * s + 3; i++) json_object_set_new(wm, ts[i].name, json_string(files[s]));
    }
    json_t *idx = json_pack("{s:{s:s}, s:o}", "metadata", "total_size", "123", "weight_map", wm);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", tmpdir);
    cr_assert_eq(json_dump_file(idx, p, 0), 0);
    st_t *st;
    char err[512];
    cr_assert_eq(st_open(tmpdir, &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st_count(st), 9);
    cr_assert_str_eq(st_metadata(st, "total_size"), "123");
    for (int i = 0; i < 9; i++) {
        check_tensor(st, &ts[i]);
        cr_assert(strstr(st_file_of(st, ts[i].name), files[i / 3]) != NULL);
    }
    st_close(st);

    /* index naming a missing file */
    json_object_set_new(wm, "extra.weight", json_string("model-00004-of-00003.safetensors"));
    cr_assert_eq(json_dump_file(idx, p, 0), 0);
    cr_assert_neq(st_open(tmpdir, &st, err, sizeof err), 0);
    cr_assert(strstr(err, "index.json") && strstr(err, "model-00004-of-00003.safetensors") && strstr(err, "does not exist"),
              "%s", err);
    /* index naming a tensor the file does not hold */
    json_object_set_new(wm, "extra.weight", json_string(files[1]));
    cr_assert_eq(json_dump_file(idx, p, 0), 0);
    cr_assert_neq(st_open(tmpdir, &st, err, sizeof err), 0);
    cr_assert(strstr(err, "extra.weight") && strstr(err, files[1]) && strstr(err, "no such tensor"), "%s", err);
    json_decref(idx);
    for (int i = 0; i < 9; i++) free(ts[i].data);
}

Test(st, writer_rejects_bad_tensors) {
    st_writer_t *w = st_writer_new();
    float x[4] = { 1, 2, 3, 4 };
    int64_t sh[1] = { 4 }, neg[1] = { -1 };
    cr_assert_eq(st_writer_add_f32(w, "a", ST_F32, sh, 1, x), 0);
    cr_assert_neq(st_writer_add_f32(w, "a", ST_F32, sh, 1, x), 0);        /* duplicate */
    cr_assert_neq(st_writer_add_f32(w, "b", ST_I64, sh, 1, x), 0);        /* not a float dtype */
    cr_assert_neq(st_writer_add_f32(w, "c", ST_F32, neg, 1, x), 0);
    cr_assert_neq(st_writer_add_f32(w, "__metadata__", ST_F32, sh, 1, x), 0);
    st_writer_free(w);
}

/* ---- headers that lie ---- */

/* Write an 8-byte size, the header text, then buf_len bytes of data. */
static void write_lying(const char *path, uint64_t claimed, const char *hdr, size_t buf_len) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    uint64_t n = claimed ? claimed : strlen(hdr);
    uint8_t n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (uint8_t)(n >> (8 * i));
    fwrite(n8, 1, 8, f);
    fwrite(hdr, 1, strlen(hdr), f);
    for (size_t i = 0; i < buf_len; i++) fputc((int)(i * 37 + 11), f);
    fclose(f);
}

static void expect_reject(const char *name, uint64_t claimed, const char *hdr, size_t buf_len, const char *needle) {
    char p[256], err[1024];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    write_lying(p, claimed, hdr, buf_len);
    st_t *st = NULL;
    cr_assert_neq(st_open(p, &st, err, sizeof err), 0, "%s was accepted", name);
    cr_assert_null(st);
    cr_assert(strstr(err, p) != NULL, "message lacks the file: %s", err);
    cr_assert(strstr(err, needle) != NULL, "message lacks '%s': %s", needle, err);
}

Test(st, lying_headers_are_rejected) {
    /* sanity: a correct hand-written file opens */
    char p[256], err[512];
    snprintf(p, sizeof p, "%s/ok.safetensors", tmpdir);
    write_lying(p, 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,3],\"data_offsets\":[8,14]}}", 14);
    st_t *st;
    cr_assert_eq(st_open(p, &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st_count(st), 2);
    st_close(st);

    expect_reject("past_end.safetensors", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                  "past the end");
    expect_reject("overlap.safetensors", 0,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap");
    expect_reject("hole.safetensors", 0,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "no holes");
    expect_reject("trailing.safetensors", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9,
                  "trailing");
    expect_reject("shape.safetensors", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                  "needs 12 bytes");
    expect_reject("f16shape.safetensors", 0, "{\"a\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16,
                  "needs 8 bytes");
    expect_reject("dtype.safetensors", 0, "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                  "unknown dtype \"F33\"");
    expect_reject("toolong.safetensors", 1000, "{}", 10, "larger than");
    expect_reject("notjson.safetensors", 0, "this is not json at all", 0, "not valid JSON");
    expect_reject("array.safetensors", 0, "[1,2,3]  ", 0, "not an object");
    expect_reject("neg.safetensors", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                  "non-negative");
    expect_reject("backwards.safetensors", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                  "begin <= end");
    expect_reject("nooffsets.safetensors", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets");
    expect_reject("dup.safetensors", 0,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "not valid JSON");
    /* fewer than 8 bytes */
    snprintf(p, sizeof p, "%s/tiny.safetensors", tmpdir);
    th_write_file(p, "abc", 3);
    cr_assert_neq(st_open(p, &st, err, sizeof err), 0);
    cr_assert(strstr(err, p) && strstr(err, "too short"), "%s", err);
    /* a directory with nothing in it */
    snprintf(p, sizeof p, "%s/emptydir", tmpdir);
    cr_assert_eq(mkdir(p, 0755), 0);
    cr_assert_neq(st_open(p, &st, err, sizeof err), 0);
    cr_assert(strstr(err, p) && strstr(err, "neither"), "%s", err);
    /* a non-float tensor cannot be read as fp32 */
    snprintf(p, sizeof p, "%s/int.safetensors", tmpdir);
    write_lying(p, 0, "{\"i\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16);
    cr_assert_eq(st_open(p, &st, err, sizeof err), 0, "%s", err);
    int64_t sh[1] = { 2 };
    float out[2];
    cr_assert_neq(st_read_f32(st, "i", sh, 1, out, err, sizeof err), 0);
    cr_assert(strstr(err, "I64") && strstr(err, p), "%s", err);
    st_close(st);
}

Test(st, bad_index_and_metadata) {
    char p[256], err[1024];
    st_t *st;
    snprintf(p, sizeof p, "%s/meta.safetensors", tmpdir);
    write_lying(p, 0, "{\"__metadata__\":{\"format\":7},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    cr_assert_neq(st_open(p, &st, err, sizeof err), 0);
    cr_assert(strstr(err, p) && strstr(err, "format") && strstr(err, "not a string"), "%s", err);

    snprintf(p, sizeof p, "%s/model.safetensors.index.json", tmpdir);
    th_write_str(p, "{\"metadata\": {}, \"weight_map\": {}}");
    cr_assert_neq(st_open(tmpdir, &st, err, sizeof err), 0);
    cr_assert(strstr(err, p) && strstr(err, "weight_map"), "%s", err);

    th_write_str(p, "{\"weight_map\": {\"a\": \"../meta.safetensors\"}}");
    cr_assert_neq(st_open(tmpdir, &st, err, sizeof err), 0);
    cr_assert(strstr(err, p) && strstr(err, "inside the directory"), "%s", err);

    th_write_str(p, "{\"weight_map\": {\"a\": \"meta.safetensors\"");   /* cut short */
    cr_assert_neq(st_open(tmpdir, &st, err, sizeof err), 0);
    cr_assert(strstr(err, p) && strstr(err, "not valid JSON"), "%s", err);

    /* A shard with a lying header is reported through the index too. */
    char q[256];
    snprintf(q, sizeof q, "%s/s1.safetensors", tmpdir);
    write_lying(q, 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8);
    th_write_str(p, "{\"weight_map\": {\"a\": \"s1.safetensors\"}}");
    cr_assert_neq(st_open(tmpdir, &st, err, sizeof err), 0);
    cr_assert(strstr(err, q) && strstr(err, "needs 16 bytes"), "%s", err);
}
