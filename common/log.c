/* log.c: see log.h. Lines go to stderr. */
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static struct {
    log_level_t level;
    bool json;
    int rank;
    char prog[32];
    int format_warned;  /* BALLAST_LOG_FORMAT was bad: said once */
} g_log = { LOG_INFO, false, -1, "ballast" };

static const char *level_names[] = { "debug", "info", "warn", "error", "off" };

int log_level_parse(const char *s) {
    for (int i = 0; i <= LOG_OFF; i++)
        if (s && strcasecmp(s, level_names[i]) == 0) return i;
    return -1;
}

void log_init(const char *prog, int rank) {
    if (prog) snprintf(g_log.prog, sizeof g_log.prog, "%s", prog);
    g_log.rank = rank;
    const char *lv = getenv("BALLAST_LOG_LEVEL");
    if (lv && log_level_parse(lv) >= 0) g_log.level = (log_level_t)log_level_parse(lv);
    /* the format of log lines; not BALLAST_LOG_JSON, which is the
     * trainer's --log-json FILE */
    const char *fm = getenv("BALLAST_LOG_FORMAT");
    if (fm && strcasecmp(fm, "json") == 0) g_log.json = true;
    else if (fm && *fm && strcasecmp(fm, "text") != 0 && !g_log.format_warned++)
        fprintf(stderr, "%s: warning: BALLAST_LOG_FORMAT='%s' is not text or json; logging text\n", g_log.prog, fm);
}

void log_set_level(log_level_t level) { g_log.level = level; }
void log_set_rank(int rank) { g_log.rank = rank; }
void log_set_json(bool on) { g_log.json = on; }
log_level_t log_get_level(void) { return g_log.level; }

/* Append s to buf as a JSON string body (no quotes). */
static size_t json_escape(char *buf, size_t cap, const char *s) {
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { buf[n++] = '\\'; buf[n++] = (char)c; }
        else if (c == '\n') { buf[n++] = '\\'; buf[n++] = 'n'; }
        else if (c < 0x20) n += (size_t)snprintf(buf + n, cap - n, "\\u%04x", c);
        else buf[n++] = (char)c;
    }
    buf[n] = 0;
    return n;
}

void log_vmsg(log_level_t level, const char *file, int line, const char *fmt, va_list ap) {
    if (level < g_log.level || level >= LOG_OFF) return;
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    char out[4096];
    int n;
    if (g_log.json) {
        char esc[3072];
        json_escape(esc, sizeof esc, msg);
        const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
        char rankf[24] = "";
        if (g_log.rank >= 0) snprintf(rankf, sizeof rankf, "\"rank\":%d,", g_log.rank);
        n = snprintf(out, sizeof out,
                     "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"prog\":\"%s\",\"pid\":%d,%s"
                     "\"src\":\"%s:%d\",\"msg\":\"%s\"}\n",
                     when, ts.tv_nsec / 1000000, level_names[level], g_log.prog, (int)getpid(),
                     rankf, base, line, esc);
    } else {
        char who[64];
        if (g_log.rank >= 0) snprintf(who, sizeof who, "%s rank %d pid %d", g_log.prog, g_log.rank, (int)getpid());
        else snprintf(who, sizeof who, "%s pid %d", g_log.prog, (int)getpid());
        n = snprintf(out, sizeof out, "%s [%s] %s: %s\n", when, who, level_names[level], msg);
    }
    if (n < 0) return;
    if ((size_t)n >= sizeof out) { n = sizeof out - 1; out[n - 1] = '\n'; }
    ssize_t w = write(STDERR_FILENO, out, (size_t)n);
    (void)w;
}

void log_msg(log_level_t level, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_vmsg(level, file, line, fmt, ap);
    va_end(ap);
}

void die_at(const char *file, int line, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    log_msg(LOG_ERROR, file, line, "fatal (%s:%d): %s", base, line, msg);
    if (g_log.level >= LOG_OFF) fprintf(stderr, "fatal (%s:%d): %s\n", base, line, msg);
    exit(1);
}
