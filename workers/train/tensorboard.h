/* tensorboard.h: TensorBoard event files (--tensorboard-dir), written by
 * rank 0 next to the JSON log.
 *
 * A file is a sequence of TFRecords, each
 *   uint64 length (little endian), uint32 masked crc32c of those 8 bytes,
 *   length bytes of a serialized tensorboard.Event (proto/tensorboard/),
 *   uint32 masked crc32c of the data,
 * where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The first event
 * carries file_version "brain.Event:2"; each step then gets one event with
 * a Summary of scalar values (simple_value, a float). Every record goes to
 * the kernel in one write(2) when it is made, so a killed run leaves a file
 * whose records are all complete. */
#ifndef BALLAST_TENSORBOARD_H
#define BALLAST_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

typedef struct tb_writer tb_writer_t;

/* Create DIR if missing (one level, mode 0755) and open a new event file
 * DIR/events.out.tfevents.<unix seconds>.<host>.<pid> in it, with its
 * file-version record. Returns NULL with err naming the directory, the
 * cause and the fix. */
tb_writer_t *tb_open(const char *dir, char *err, size_t errlen);

/* Append one event at `step` (wall_time: seconds since the epoch) holding
 * the n scalars tags[i] = values[i]; values that are not finite are left
 * out. Returns 0, or -1 with err (disk full, removed directory). */
int tb_write_scalars(tb_writer_t *w, int64_t step, double wall_time, const char *const *tags, const double *values,
                     size_t n, char *err, size_t errlen);

/* The file's path (valid until tb_close). */
const char *tb_path(const tb_writer_t *w);

/* Close the file. NULL is fine. */
void tb_close(tb_writer_t *w);

/* The record checksum: masked crc32c of len bytes. */
uint32_t tb_masked_crc32c(const void *buf, size_t len);

#endif
