/* errbuf.h: library-style error reporting into a caller-supplied buffer. */
#ifndef BALLAST_ERRBUF_H
#define BALLAST_ERRBUF_H

#include <stddef.h>

/* Format a message into err[0..len) (err may be NULL or len 0: nothing is
 * written). Returns -1, so a failing function can `return errbuf_set(...)`. */
int errbuf_set(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
