/* crc32c.h: CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78),
 * the checksum every blob carries (iSCSI, ext4 and RocksDB use the same one).
 *
 * On x86-64 CPUs with SSE4.2 the crc32 instruction does the work, 8 bytes at
 * a time in three interleaved chains; elsewhere a slicing-by-8 table does. The choice is made once at
 * run time, so the library needs no -msse4.2 and runs on any x86-64. */
#ifndef BALLAST_CRC32C_H
#define BALLAST_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CRC-32C of buf[0..len) continuing from crc; start a new checksum with
 * crc = 0. Chaining holds: crc32c(crc32c(0, a, n), b, m) equals the crc of
 * the concatenation a||b. buf may be NULL when len is 0. Thread-safe. */
uint32_t crc32c(uint32_t crc, const void *buf, size_t len);

/* The two implementations, callable directly (tests, benchmarks).
 * crc32c_hw must only be called when crc32c_hw_available() is true. */
uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len);
uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t len);
bool crc32c_hw_available(void);

/* Force crc32c() onto the table path (force = true) or back to the best
 * path (false). For tests and for "ballast doctor" comparisons. */
void crc32c_force_sw(bool force);

/* The path crc32c() takes now: "sse4.2" or "table". Static string. */
const char *crc32c_impl(void);

#endif
