/* log.h: leveled logging with a "[rank r pid p]" prefix, optionally as JSON
 * lines. Thread-safe; one write(2) per line so lines from several processes
 * sharing a terminal or file do not interleave. */
#ifndef BALLAST_LOG_H
#define BALLAST_LOG_H

#include <stdarg.h>
#include <stdbool.h>

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF } log_level_t;

/* Configure the process-wide logger. prog: short program name shown in each
 * line; rank < 0 leaves the rank out. Also reads BALLAST_LOG_LEVEL
 * (debug|info|warn|error|off) and BALLAST_LOG_JSON=1 when called. */
void log_init(const char *prog, int rank);
void log_set_level(log_level_t level);
void log_set_rank(int rank);
void log_set_json(bool on);
log_level_t log_get_level(void);

/* Parse "debug", "info", "warn", "error", "off"; -1 if unknown. */
int log_level_parse(const char *s);

void log_msg(log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void log_vmsg(log_level_t level, const char *file, int line, const char *fmt, va_list ap);

#define log_debug(...) log_msg(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

/* Fatal error in a batch program: print file, line, what failed and a hint,
 * then exit(1). For services use return codes instead. */
void die_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
#define die(...) die_at(__FILE__, __LINE__, __VA_ARGS__)

/* CHECK_ALLOC(p): exit with a clear message when an allocation failed. */
#define CHECK_ALLOC(p) do { if (!(p)) die("out of memory allocating %s", #p); } while (0)

#endif
