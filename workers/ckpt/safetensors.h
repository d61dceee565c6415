/*
 * safetensors.h - reader and writer for the Hugging Face safetensors format.
 *
 * File layout: 8-byte little-endian header size N, N bytes of UTF-8 JSON
 * {"name": {"dtype","shape","data_offsets":[begin,end]}, "__metadata__":{..}},
 * then the byte buffer (offsets are relative to its start). The reader takes
 * one file or a directory holding model.safetensors or
 * model.safetensors.index.json plus shards; files are mmap'ed read-only and
 * every header field is validated at open. See docs/data.md.
 */
#ifndef BALLAST_SAFETENSORS_H
#define BALLAST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ST_F32, ST_F16, ST_BF16, ST_I32, ST_I64, ST_U8, ST_OTHER } st_dtype_t;
typedef struct { const char *name; st_dtype_t dtype; int ndim; int64_t shape[8]; int64_t nbytes; } st_info_t;
typedef struct st st_t;   /* a .safetensors file, or a directory (model.safetensors or model.safetensors.index.json + shards) */
int st_open(const char *path, st_t **out, char *err, size_t errlen);   /* validates header JSON, offsets, overlaps, dtypes, shapes vs sizes */
int st_count(const st_t *st);
const st_info_t *st_info(const st_t *st, int i);
const st_info_t *st_find(const st_t *st, const char *name);           /* NULL if absent */
/* Read a tensor converted to fp32; fails (naming file, tensor, shapes) unless its shape equals shape[0..ndim). */
int st_read_f32(st_t *st, const char *name, const int64_t *shape, int ndim, float *dst, char *err, size_t errlen);
/* Elements [start, start + n) of a tensor in flat row-major order, converted
 * to fp32 (F32, BF16, F16): for reading a large tensor a part at a time.
 * Fails naming the file and tensor unless the range is inside it. */
int st_read_f32_range(st_t *st, const char *name, int64_t start, int64_t n, float *dst, char *err, size_t errlen);
/* Metadata value for key from "__metadata__" (first file / index), or NULL. */
const char *st_metadata(const st_t *st, const char *key);
/* The file a tensor lives in (for messages), or NULL if absent. */
const char *st_file_of(const st_t *st, const char *name);
void st_close(st_t *st);
typedef struct st_writer st_writer_t;
st_writer_t *st_writer_new(void);
/* Add a tensor from fp32 data, stored as dtype (ST_F32, ST_BF16 or ST_F16; round to nearest even). Data is copied. */
int st_writer_add_f32(st_writer_t *w, const char *name, st_dtype_t dtype, const int64_t *shape, int ndim, const float *data);
int st_writer_set_metadata(st_writer_t *w, const char *key, const char *value);   /* "__metadata__" */
int st_writer_save(st_writer_t *w, const char *path, char *err, size_t errlen);    /* write to path.tmp, fsync, rename */
/* Streaming, for files larger than the memory one wants to spend: declare
 * every tensor (no data; not mixed with st_writer_add_f32) and the metadata,
 * st_writer_begin writes the header to path.tmp, st_writer_append_f32 feeds
 * fp32 elements of the declared tensors in declaration order (any split,
 * converted through a 64 KiB buffer), st_writer_finish checks every byte
 * came, fsyncs and renames to path. The same bytes as st_writer_save of the
 * same tensors. After a failure st_writer_free removes path.tmp. */
int st_writer_declare(st_writer_t *w, const char *name, st_dtype_t dtype, const int64_t *shape, int ndim);
int st_writer_begin(st_writer_t *w, const char *path, char *err, size_t errlen);
int st_writer_append_f32(st_writer_t *w, const float *data, size_t n, char *err, size_t errlen);
int st_writer_finish(st_writer_t *w, char *err, size_t errlen);
void st_writer_free(st_writer_t *w);
/* Name of a dtype as written in headers ("F32", "BF16", ...). */
const char *st_dtype_name(st_dtype_t t);
/* bf16/f16 conversion helpers */
uint16_t f32_to_bf16(float f); float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  float f16_to_f32(uint16_t h);

#endif
