/*
 * safetensors.c - Hugging Face safetensors reader (file, directory, or
 * sharded directory with model.safetensors.index.json) and writer.
 *
 * Files are mmap'ed read-only; every header is validated at open (header
 * size vs file size, JSON, dtypes, shape * element size == byte range,
 * ranges inside the buffer, neither overlapping nor leaving holes), so a
 * later read cannot run past a mapping. JSON goes through jansson.
 * The writer either keeps every tensor's converted bytes until
 * st_writer_save, or streams: the header from the declared tensors, then
 * the data as it is appended (for files larger than the memory to spend).
 */
#include "workers/ckpt/safetensors.h"
#include "errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20)   /* same cap as the reference reader */

typedef struct {
    char *path;
    const uint8_t *map;     /* whole file */
    size_t size;            /* bytes */
    const uint8_t *buf;     /* start of the byte buffer (map + 8 + N) */
    size_t buf_size;        /* bytes */
    json_t *meta;           /* "__metadata__" object or NULL (owned) */
} st_file_t;

typedef struct {
    st_info_t info;         /* info.name owned */
    int file;               /* index into files */
    size_t begin, end;      /* byte range within the file's buffer */
} st_tensor_t;

struct st {
    st_file_t *files;       /* (n_files) */
    int n_files;
    st_tensor_t *tensors;   /* (n_tensors), sorted by name */
    int n_tensors;
    json_t *index_meta;     /* index.json "metadata" or NULL (owned) */
};


/* ---- dtypes ---- */

typedef struct { const char *name; st_dtype_t t; int size; } dtype_desc_t;
static const dtype_desc_t DTYPES[] = {
    { "F32", ST_F32, 4 }, { "F16", ST_F16, 2 }, { "BF16", ST_BF16, 2 }, { "I32", ST_I32, 4 },
    { "I64", ST_I64, 8 }, { "U8", ST_U8, 1 }, { "F64", ST_OTHER, 8 }, { "I8", ST_OTHER, 1 },
    { "I16", ST_OTHER, 2 }, { "U16", ST_OTHER, 2 }, { "U32", ST_OTHER, 4 }, { "U64", ST_OTHER, 8 },
    { "BOOL", ST_OTHER, 1 }, { "F8_E4M3", ST_OTHER, 1 }, { "F8_E5M2", ST_OTHER, 1 },
};
#define N_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

const char *st_dtype_name(st_dtype_t t) {
    for (size_t i = 0; i < N_DTYPES; i++) if (DTYPES[i].t == t && t != ST_OTHER) return DTYPES[i].name;
    return "OTHER";
}

static int dtype_size(st_dtype_t t) {
    for (size_t i = 0; i < N_DTYPES; i++) if (DTYPES[i].t == t) return DTYPES[i].size;
    return 0;
}

/* ---- bf16 / f16 ---- */

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* NaN stays NaN, quiet */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);                 /* nearest, ties to even */
}

float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t f32_to_f16(float f) {
    uint32_t u = f2u(f), a = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    if (a > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);  /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;         /* >= 65520 rounds to inf */
    if (a >= 0x38800000u) {                               /* normal f16 */
        uint32_t r = a - 0x38000000u;                     /* rebias 127 -> 15 */
        return sign | (uint16_t)((r + 0xfffu + ((r >> 13) & 1)) >> 13);
    }
    if (a <= 0x33000000u) return sign;                    /* <= 2^-25: ties to even zero */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)e;                             /* value = m * 2^(e-150) = k * 2^-24 */
    uint32_t k = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1))) k++;
    return sign | (uint16_t)k;
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;                    /* exact: subnormal or zero */
        return u2f(f2u(v) | sign);
    }
    if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- reading ---- */

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const st_tensor_t *)a)->info.name, ((const st_tensor_t *)b)->info.name);
}

static int cmp_tensor_range(const void *a, const void *b) {
    const st_tensor_t *x = *(st_tensor_t *const *)a, *y = *(st_tensor_t *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int add_tensor(st_t *st, st_tensor_t *t) {
    st_tensor_t *nt = realloc(st->tensors, (size_t)(st->n_tensors + 1) * sizeof *nt);
    if (!nt) return -1;
    st->tensors = nt;
    st->tensors[st->n_tensors++] = *t;
    return 0;
}

/* Parse and validate one tensor entry of a header. */
static int parse_entry(const char *path, const char *name, json_t *v, size_t buf_size, st_tensor_t *t,
                       char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    if (!json_is_object(v))
        return errbuf_set(err, errlen, "%s: header entry '%s' is not an object with dtype, shape and data_offsets", path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo))
        return errbuf_set(err, errlen, "%s: tensor '%s' lacks a string \"dtype\", an array \"shape\" or an array "
                    "\"data_offsets\"; the file is not valid safetensors", path, name);
    const char *ds = json_string_value(jd);
    int found = -1;
    for (size_t i = 0; i < N_DTYPES; i++) if (strcmp(DTYPES[i].name, ds) == 0) found = (int)i;
    if (found < 0)
        return errbuf_set(err, errlen, "%s: tensor '%s' has unknown dtype \"%s\" (known: F32 F16 BF16 F64 I8 I16 I32 "
                    "I64 U8 U16 U32 U64 BOOL F8_E4M3 F8_E5M2)", path, name, ds);
    t->info.dtype = DTYPES[found].t;
    size_t nd = json_array_size(js);
    if (nd > 8) return errbuf_set(err, errlen, "%s: tensor '%s' has %zu dimensions; at most 8 are supported", path, name, nd);
    t->info.ndim = (int)nd;
    unsigned __int128 count = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *x = json_array_get(js, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return errbuf_set(err, errlen, "%s: tensor '%s' shape[%zu] is not a non-negative integer", path, name, i);
        t->info.shape[i] = json_integer_value(x);
        count *= (unsigned __int128)t->info.shape[i];
        if (count > ((unsigned __int128)1 << 62))
            return errbuf_set(err, errlen, "%s: tensor '%s' shape is absurdly large", path, name);
    }
    if (json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)))
        return errbuf_set(err, errlen, "%s: tensor '%s' data_offsets must be [begin, end] integers", path, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return errbuf_set(err, errlen, "%s: tensor '%s' data_offsets [%lld, %lld] are not 0 <= begin <= end",
                    path, name, (long long)b, (long long)e);
    if ((unsigned long long)e > buf_size)
        return errbuf_set(err, errlen, "%s: tensor '%s' data_offsets [%lld, %lld] run past the end of the %zu-byte "
                    "data buffer; the file is truncated or its header lies", path, name, (long long)b, (long long)e, buf_size);
    unsigned __int128 want = count * (unsigned __int128)DTYPES[found].size;
    if (want != (unsigned __int128)(e - b)) {
        char sh[160] = "";
        size_t o = 0;
        for (int i = 0; i < t->info.ndim && o < sizeof sh - 24; i++)
            o += (size_t)snprintf(sh + o, sizeof sh - o, "%s%lld", i ? ", " : "", (long long)t->info.shape[i]);
        return errbuf_set(err, errlen, "%s: tensor '%s' shape [%s] of %s needs %llu bytes but data_offsets [%lld, %lld] "
                    "span %lld bytes; the header is inconsistent", path, name, sh, ds,
                    (unsigned long long)want, (long long)b, (long long)e, (long long)(e - b));
    }
    t->begin = (size_t)b;
    t->end = (size_t)e;
    t->info.nbytes = (int64_t)(e - b);
    t->info.name = strdup(name);
    if (!t->info.name) return errbuf_set(err, errlen, "out of memory");
    return 0;
}

/* Map one .safetensors file, validate its header and append its tensors
 * (all of them) to st. On error the file is still recorded so st_close
 * frees it. */
static int open_file(st_t *st, const char *path, char *err, size_t errlen) {
    st_file_t *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) return errbuf_set(err, errlen, "out of memory");
    st->files = nf;
    int fi = st->n_files++;
    st_file_t *f = &st->files[fi];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return errbuf_set(err, errlen, "out of memory");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errbuf_set(err, errlen, "%s: cannot open safetensors file: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return errbuf_set(err, errlen, "%s: not a regular file", path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size < 8) {
        close(fd);
        return errbuf_set(err, errlen, "%s: file is %zu bytes, too short for the 8-byte header size; not a safetensors file",
                    path, f->size);
    }
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return errbuf_set(err, errlen, "%s: mmap: %s", path, strerror(e));
    f->map = m;
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)f->map[i] << (8 * i);
    if (n > f->size - 8)
        return errbuf_set(err, errlen, "%s: header size %llu is larger than the %zu bytes after it; the file is truncated "
                    "or not safetensors", path, (unsigned long long)n, f->size - 8);
    if (n > ST_MAX_HEADER)
        return errbuf_set(err, errlen, "%s: header size %llu exceeds the %u-byte limit", path, (unsigned long long)n, ST_MAX_HEADER);
    if (n < 2) return errbuf_set(err, errlen, "%s: header of %llu bytes cannot hold a JSON object", path, (unsigned long long)n);
    f->buf = f->map + 8 + n;
    f->buf_size = f->size - 8 - n;
    json_error_t je;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return errbuf_set(err, errlen, "%s: header is not valid JSON (%s at byte %d); not a safetensors file", path, je.text,
                    je.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return errbuf_set(err, errlen, "%s: header JSON is not an object", path);
    }
    int first = st->n_tensors;
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) { rc = errbuf_set(err, errlen, "%s: __metadata__ is not an object", path); break; }
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) { rc = errbuf_set(err, errlen, "%s: __metadata__ value for '%s' is not a string", path, mk); break; }
            }
            if (rc) break;
            f->meta = json_incref(v);
            continue;
        }
        st_tensor_t t;
        if (parse_entry(path, key, v, f->buf_size, &t, err, errlen) != 0) { rc = -1; break; }
        t.file = fi;
        if (add_tensor(st, &t) != 0) { free((char *)t.info.name); rc = errbuf_set(err, errlen, "out of memory"); break; }
    }
    json_decref(root);
    if (rc) return rc;
    /* Ranges must tile the buffer exactly: no overlap, no hole. */
    int cnt = st->n_tensors - first;
    st_tensor_t **by = malloc((size_t)(cnt ? cnt : 1) * sizeof *by);
    if (!by) return errbuf_set(err, errlen, "out of memory");
    for (int i = 0; i < cnt; i++) by[i] = &st->tensors[first + i];
    qsort(by, (size_t)cnt, sizeof *by, cmp_tensor_range);
    size_t pos = 0;
    for (int i = 0; i < cnt && rc == 0; i++) {
        if (by[i]->begin < pos)
            rc = errbuf_set(err, errlen, "%s: tensor '%s' bytes [%zu, %zu) overlap tensor '%s' [%zu, %zu); the header lies",
                      path, by[i]->info.name, by[i]->begin, by[i]->end, by[i - 1]->info.name, by[i - 1]->begin, by[i - 1]->end);
        else if (by[i]->begin > pos)
            rc = errbuf_set(err, errlen, "%s: bytes [%zu, %zu) of the data buffer belong to no tensor (before '%s'); "
                      "safetensors buffers have no holes", path, pos, by[i]->begin, by[i]->info.name);
        else pos = by[i]->end;
    }
    if (rc == 0 && pos != f->buf_size)
        rc = errbuf_set(err, errlen, "%s: the tensors cover %zu bytes but the data buffer has %zu; the file has trailing "
                  "bytes or is truncated", path, pos, f->buf_size);
    free(by);
    return rc;
}

static bool is_dir(const char *p) { struct stat sb; return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode); }
static bool exists(const char *p) { struct stat sb; return stat(p, &sb) == 0; }

/* Open dir/model.safetensors.index.json and the shards it names; keep only
 * the tensors in its weight_map, each checked to be in the file named. */
static int open_index(st_t *st, const char *dir, const char *index, char *err, size_t errlen) {
    json_error_t je;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
    if (!root) return errbuf_set(err, errlen, "%s: not valid JSON (%s, line %d)", index, je.text, je.line);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm) || json_object_size(wm) == 0) {
        json_decref(root);
        return errbuf_set(err, errlen, "%s: needs a non-empty \"weight_map\" object {tensor name: file}", index);
    }
    json_t *meta = json_object_get(root, "metadata");
    if (meta && json_is_object(meta)) st->index_meta = json_incref(meta);
    /* Open each distinct file once, in first-mention order. */
    const char *name;
    json_t *v;
    int rc = 0;
    char path[PATH_MAX];
    st_t tmp = { 0 };   /* all tensors of all shards */
    json_object_foreach(wm, name, v) {
        const char *fn = json_string_value(v);
        if (!fn || !*fn || fn[0] == '/' || strstr(fn, "..")) {
            rc = errbuf_set(err, errlen, "%s: weight_map entry for '%s' is not a file name inside the directory", index, name);
            break;
        }
        snprintf(path, sizeof path, "%s/%s", dir, fn);
        bool seen = false;
        for (int i = 0; i < tmp.n_files; i++) if (strcmp(tmp.files[i].path, path) == 0) seen = true;
        if (seen) continue;
        if (!exists(path)) {
            rc = errbuf_set(err, errlen, "%s: weight_map names '%s' for tensor '%s' but %s does not exist; the checkpoint "
                      "is incomplete", index, fn, name, path);
            break;
        }
        if (open_file(&tmp, path, err, errlen) != 0) { rc = -1; break; }
    }
    if (rc == 0) {
        json_object_foreach(wm, name, v) {
            snprintf(path, sizeof path, "%s/%s", dir, json_string_value(v));
            int hit = -1;
            for (int i = 0; i < tmp.n_tensors && hit < 0; i++)
                if (tmp.tensors[i].info.name && strcmp(tmp.tensors[i].info.name, name) == 0 && strcmp(tmp.files[tmp.tensors[i].file].path, path) == 0)
                    hit = i;
            if (hit < 0) {
                rc = errbuf_set(err, errlen, "%s: weight_map puts tensor '%s' in %s but that file has no such tensor",
                          index, name, path);
                break;
            }
            if (add_tensor(st, &tmp.tensors[hit]) != 0) { rc = errbuf_set(err, errlen, "out of memory"); break; }
            tmp.tensors[hit].info.name = NULL;   /* moved to st */
        }
    }
    /* Files move to st; leftover tensors (not in the map) are dropped. */
    st->files = tmp.files;
    st->n_files = tmp.n_files;
    for (int i = 0; i < tmp.n_tensors; i++) free((char *)tmp.tensors[i].info.name);
    free(tmp.tensors);
    json_decref(root);
    return rc;
}

int st_open(const char *path, st_t **out, char *err, size_t errlen) {
    *out = NULL;
    st_t *st = calloc(1, sizeof *st);
    if (!st) return errbuf_set(err, errlen, "out of memory");
    int rc;
    if (is_dir(path)) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (exists(p)) rc = open_index(st, path, p, err, errlen);
        else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            if (exists(p)) rc = open_file(st, p, err, errlen);
            else rc = errbuf_set(err, errlen, "%s: directory has neither model.safetensors nor model.safetensors.index.json; "
                           "point at a Hugging Face model directory or a .safetensors file", path);
        }
    } else {
        rc = open_file(st, path, err, errlen);
    }
    if (rc == 0 && st->n_tensors > 1) {
        qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_tensor_name);
        for (int i = 1; i < st->n_tensors; i++)
            if (strcmp(st->tensors[i].info.name, st->tensors[i - 1].info.name) == 0) {
                rc = errbuf_set(err, errlen, "%s: tensor '%s' appears twice (in %s and %s)", path, st->tensors[i].info.name,
                          st->files[st->tensors[i - 1].file].path, st->files[st->tensors[i].file].path);
                break;
            }
    }
    if (rc != 0) { st_close(st); return -1; }
    *out = st;
    return 0;
}

void st_close(st_t *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap((void *)st->files[i].map, st->files[i].size);
        if (st->files[i].meta) json_decref(st->files[i].meta);
        free(st->files[i].path);
    }
    for (int i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].info.name);
    if (st->index_meta) json_decref(st->index_meta);
    free(st->files);
    free(st->tensors);
    free(st);
}

int st_count(const st_t *st) { return st->n_tensors; }

const st_info_t *st_info(const st_t *st, int i) {
    return i >= 0 && i < st->n_tensors ? &st->tensors[i].info : NULL;
}

static const st_tensor_t *find(const st_t *st, const char *name) {
    int lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(st->tensors[mid].info.name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}

const st_info_t *st_find(const st_t *st, const char *name) {
    const st_tensor_t *t = find(st, name);
    return t ? &t->info : NULL;
}

const char *st_file_of(const st_t *st, const char *name) {
    const st_tensor_t *t = find(st, name);
    return t ? st->files[t->file].path : NULL;
}

const char *st_metadata(const st_t *st, const char *key) {
    json_t *m = st->index_meta ? st->index_meta : (st->n_files ? st->files[0].meta : NULL);
    json_t *v = m ? json_object_get(m, key) : NULL;
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static void fmt_shape(char *buf, size_t len, const int64_t *shape, int ndim) {
    size_t o = 0;
    buf[0] = 0;
    o += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len - 24; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + o, len - o, "]");
}

int st_read_f32(st_t *st, const char *name, const int64_t *shape, int ndim, float *dst, char *err, size_t errlen) {
    const st_tensor_t *t = find(st, name);
    if (!t) return errbuf_set(err, errlen, "tensor '%s' is not in %s", name, st->n_files ? st->files[0].path : "(empty)");
    const char *path = st->files[t->file].path;
    bool same = t->info.ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->info.shape[i] == shape[i];
    if (!same) {
        char a[200], b[200];
        fmt_shape(a, sizeof a, t->info.shape, t->info.ndim);
        fmt_shape(b, sizeof b, shape, ndim);
        return errbuf_set(err, errlen, "%s: tensor '%s' has shape %s but the model expects %s; the checkpoint does not "
                    "match the model config", path, name, a, b);
    }
    const uint8_t *p = st->files[t->file].buf + t->begin;
    int64_t n = t->info.nbytes / (dtype_size(t->info.dtype) ? dtype_size(t->info.dtype) : 1);
    switch (t->info.dtype) {
    case ST_F32:
        memcpy(dst, p, (size_t)t->info.nbytes);
        break;
    case ST_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        break;
    case ST_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        break;
    default:
        return errbuf_set(err, errlen, "%s: tensor '%s' has dtype %s, which cannot be read as fp32 (F32, BF16, F16 only)",
                    path, name, st_dtype_name(t->info.dtype));
    }
    return 0;
}

int st_read_f32_range(st_t *st, const char *name, int64_t start, int64_t n, float *dst, char *err, size_t errlen) {
    const st_tensor_t *t = find(st, name);
    if (!t) return errbuf_set(err, errlen, "tensor '%s' is not in %s", name, st->n_files ? st->files[0].path : "(empty)");
    const char *path = st->files[t->file].path;
    int es = dtype_size(t->info.dtype);
    int64_t total = es ? t->info.nbytes / es : 0;
    if (t->info.dtype != ST_F32 && t->info.dtype != ST_BF16 && t->info.dtype != ST_F16)
        return errbuf_set(err, errlen, "%s: tensor '%s' has dtype %s, which cannot be read as fp32 (F32, BF16, F16 only)",
                          path, name, st_dtype_name(t->info.dtype));
    if (start < 0 || n < 0 || start > total || n > total - start)
        return errbuf_set(err, errlen, "%s: tensor '%s' has %lld elements; elements %lld..%lld are not all inside it",
                          path, name, (long long)total, (long long)start, (long long)(start + n));
    const uint8_t *p = st->files[t->file].buf + t->begin + (size_t)start * (size_t)es;
    if (t->info.dtype == ST_F32) {
        memcpy(dst, p, (size_t)n * 4);
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            dst[i] = t->info.dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    return 0;
}

/* ---- writing ---- */

typedef struct {
    char *name;
    st_dtype_t dtype;
    int ndim;
    int64_t shape[8];
    uint8_t *data;          /* converted bytes */
    size_t nbytes;
} wtensor_t;

struct st_writer {
    wtensor_t *t;           /* (n) in insertion order */
    int n;
    json_t *meta;           /* object of strings */
    /* streaming (st_writer_declare / begin / append / finish) */
    int streaming;          /* tensors were declared without data */
    char *path;             /* the final path while a file is open */
    char tmp[PATH_MAX];     /* path.tmp being written */
    FILE *fp;               /* open between begin and finish */
    int cur;                /* tensor being appended to */
    size_t cur_bytes;       /* bytes of it written so far */
};

st_writer_t *st_writer_new(void) {
    st_writer_t *w = calloc(1, sizeof *w);
    if (w) w->meta = json_object();
    if (w && !w->meta) { free(w); return NULL; }
    return w;
}

void st_writer_free(st_writer_t *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) { free(w->t[i].name); free(w->t[i].data); }
    free(w->t);
    if (w->fp) { fclose(w->fp); unlink(w->tmp); }   /* abandoned half-written file */
    free(w->path);
    json_decref(w->meta);
    free(w);
}

/* dst (n elements of dtype, little-endian bytes) = src (n fp32) converted */
static void convert_f32(uint8_t *dst, st_dtype_t dtype, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (dtype == ST_F32) {
            uint32_t u = f2u(src[i]);
            for (int j = 0; j < 4; j++) dst[4 * i + j] = (uint8_t)(u >> (8 * j));
        } else {
            uint16_t h = dtype == ST_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
            dst[2 * i] = (uint8_t)h;
            dst[2 * i + 1] = (uint8_t)(h >> 8);
        }
    }
}

/* A new entry (name, dtype, shape) with no data yet: its index, or -1. */
static int add_entry(st_writer_t *w, const char *name, st_dtype_t dtype, const int64_t *shape, int ndim) {
    if (!w || w->fp || !name || !*name || strcmp(name, "__metadata__") == 0 || ndim < 0 || ndim > 8) return -1;
    if (dtype != ST_F32 && dtype != ST_BF16 && dtype != ST_F16) return -1;
    for (int i = 0; i < w->n; i++) if (strcmp(w->t[i].name, name) == 0) return -1;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && n > INT64_MAX / 8 / shape[i])) return -1;
        n *= shape[i];
    }
    wtensor_t *nt = realloc(w->t, (size_t)(w->n + 1) * sizeof *nt);
    if (!nt) return -1;
    w->t = nt;
    wtensor_t *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->nbytes = (size_t)n * (size_t)dtype_size(dtype);
    t->name = strdup(name);
    if (!t->name) return -1;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    return w->n++;
}

int st_writer_declare(st_writer_t *w, const char *name, st_dtype_t dtype, const int64_t *shape, int ndim) {
    if (!w || (w->n > 0 && !w->streaming)) return -1;   /* no mixing with st_writer_add_f32 */
    if (add_entry(w, name, dtype, shape, ndim) < 0) return -1;
    w->streaming = 1;
    return 0;
}

int st_writer_add_f32(st_writer_t *w, const char *name, st_dtype_t dtype, const int64_t *shape, int ndim, const float *data) {
    if (!w || w->streaming) return -1;
    int k = add_entry(w, name, dtype, shape, ndim);
    if (k < 0) return -1;
    wtensor_t *t = &w->t[k];
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    if (!t->data) { free(t->name); w->n--; return -1; }
    convert_f32(t->data, dtype, data, t->nbytes / (size_t)dtype_size(dtype));
    return 0;
}

int st_writer_set_metadata(st_writer_t *w, const char *key, const char *value) {
    if (!w || !key || !value) return -1;
    return json_object_set_new(w->meta, key, json_string(value));
}

/* Create path.tmp and write the 8-byte size and the header of every
 * tensor (in insertion order, offsets back to back). 0, or -1 with a
 * message. */
static int open_and_write_header(st_writer_t *w, const char *path, char *err, size_t errlen) {
    json_t *root = json_object();
    if (!root) return errbuf_set(err, errlen, "out of memory");
    if (json_object_size(w->meta) > 0) json_object_set(root, "__metadata__", w->meta);
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        wtensor_t *t = &w->t[i];
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(sh, json_integer(t->shape[d]));
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + t->nbytes)));
        json_object_set_new(e, "dtype", json_string(st_dtype_name(t->dtype)));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", of);
        json_object_set_new(root, t->name, e);
        off += t->nbytes;
    }
    char *js = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!js) return errbuf_set(err, errlen, "%s: cannot serialize the header", path);
    size_t jl = strlen(js), hl = (jl + 7) & ~(size_t)7;   /* pad with spaces so the buffer is 8-aligned */
    if ((size_t)snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path) >= sizeof w->tmp) { free(js); return errbuf_set(err, errlen, "%s: path too long", path); }
    free(w->path);
    w->path = strdup(path);
    if (!w->path) { free(js); return errbuf_set(err, errlen, "out of memory"); }
    int fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { int e = errno; free(js); return errbuf_set(err, errlen, "%s: cannot create %s: %s", path, w->tmp, strerror(e)); }
    FILE *fp = fdopen(fd, "wb");
    if (!fp) { int e = errno; close(fd); unlink(w->tmp); free(js); return errbuf_set(err, errlen, "%s: %s", path, strerror(e)); }
    uint8_t n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    bool ok = fwrite(n8, 1, 8, fp) == 8 && fwrite(js, 1, jl, fp) == jl;
    for (size_t i = jl; ok && i < hl; i++) ok = fputc(' ', fp) != EOF;
    int e = errno;
    free(js);
    w->fp = fp;
    w->cur = 0;
    w->cur_bytes = 0;
    if (!ok) return errbuf_set(err, errlen, "%s: write failed: %s (disk full?)", path, strerror(e));
    return 0;
}

/* Close the file (flushed and fsynced when ok) and rename it into place,
 * or remove it. 0, or -1 with a message. */
static int close_and_rename(st_writer_t *w, bool ok, char *err, size_t errlen) {
    FILE *fp = w->fp;
    const char *path = w->path;
    w->fp = NULL;
    if (!fp) return errbuf_set(err, errlen, "safetensors writer: no file is open");
    ok = ok && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    int e = errno;
    if (fclose(fp) != 0) ok = false;
    if (!ok) { unlink(w->tmp); return errbuf_set(err, errlen, "%s: write failed: %s (disk full?)", path, strerror(e)); }
    if (rename(w->tmp, path) != 0) { e = errno; unlink(w->tmp); return errbuf_set(err, errlen, "%s: rename failed: %s", path, strerror(e)); }
    /* Make the rename durable. */
    char dcopy[PATH_MAX];
    snprintf(dcopy, sizeof dcopy, "%s", path);
    int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) { fsync(dfd); close(dfd); }
    return 0;
}

int st_writer_save(st_writer_t *w, const char *path, char *err, size_t errlen) {
    if (!w || w->streaming || w->fp)
        return errbuf_set(err, errlen, "%s: st_writer_save needs tensors added with their data", path ? path : "?");
    if (open_and_write_header(w, path, err, errlen)) {
        if (w->fp) { fclose(w->fp); w->fp = NULL; unlink(w->tmp); }
        return -1;
    }
    bool ok = true;
    for (int i = 0; ok && i < w->n; i++) ok = fwrite(w->t[i].data, 1, w->t[i].nbytes, w->fp) == w->t[i].nbytes;
    int e = errno;
    if (!ok) {
        fclose(w->fp);
        w->fp = NULL;
        unlink(w->tmp);
        return errbuf_set(err, errlen, "%s: write failed: %s (disk full?)", path, strerror(e));
    }
    return close_and_rename(w, true, err, errlen);
}

int st_writer_begin(st_writer_t *w, const char *path, char *err, size_t errlen) {
    if (!w || !path || w->fp || (w->n > 0 && !w->streaming))
        return errbuf_set(err, errlen, "%s: st_writer_begin needs tensors declared without data, and no file open",
                          path ? path : "?");
    if (open_and_write_header(w, path, err, errlen)) {
        if (w->fp) { fclose(w->fp); w->fp = NULL; unlink(w->tmp); }
        return -1;
    }
    return 0;
}

int st_writer_append_f32(st_writer_t *w, const float *data, size_t n, char *err, size_t errlen) {
    if (!w || !w->fp) return errbuf_set(err, errlen, "safetensors writer: no file is open (st_writer_begin first)");
    uint8_t buf[1 << 16];
    while (n > 0) {
        while (w->cur < w->n && w->cur_bytes == w->t[w->cur].nbytes) { w->cur++; w->cur_bytes = 0; }
        if (w->cur >= w->n)
            return errbuf_set(err, errlen, "%s: %zu elements past the end of the declared tensors", w->path, n);
        wtensor_t *t = &w->t[w->cur];
        size_t es = (size_t)dtype_size(t->dtype), left = (t->nbytes - w->cur_bytes) / es;
        size_t k = n < left ? n : left;
        if (k > sizeof buf / es) k = sizeof buf / es;
        convert_f32(buf, t->dtype, data, k);
        if (fwrite(buf, 1, k * es, w->fp) != k * es)
            return errbuf_set(err, errlen, "%s: write failed: %s (disk full?)", w->path, strerror(errno));
        w->cur_bytes += k * es;
        data += k;
        n -= k;
    }
    return 0;
}

int st_writer_finish(st_writer_t *w, char *err, size_t errlen) {
    if (!w || !w->fp) return errbuf_set(err, errlen, "safetensors writer: no file is open (st_writer_begin first)");
    while (w->cur < w->n && w->cur_bytes == w->t[w->cur].nbytes) { w->cur++; w->cur_bytes = 0; }
    if (w->cur < w->n) {
        errbuf_set(err, errlen, "%s: tensor %s got %zu of its %zu bytes: the file would be incomplete", w->path,
                   w->t[w->cur].name, w->cur_bytes, w->t[w->cur].nbytes);
        fclose(w->fp);
        w->fp = NULL;
        unlink(w->tmp);
        return -1;
    }
    return close_and_rename(w, true, err, errlen);
}
