/* test_log.c: levels filter, the prefix names program, rank and pid, JSON
 * lines are valid JSON with escaped messages. stderr is redirected to a pipe
 * and read back. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

/* Run fn with stderr captured; return what it wrote (caller frees). */
static char *capture(void (*fn)(void)) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    int saved = dup(STDERR_FILENO);
    dup2(p[1], STDERR_FILENO);
    close(p[1]);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    char *buf = calloc(1, 65536);
    size_t n = 0;
    ssize_t r;
    while ((r = read(p[0], buf + n, 65535 - n)) > 0) n += (size_t)r;
    close(p[0]);
    return buf;
}

static void emit_levels(void) {
    log_init("unit", 3);
    log_set_json(false);
    log_set_level(LOG_WARN);
    log_debug("dbg %d", 1);
    log_info("inf %d", 2);
    log_warn("wrn %d", 3);
    log_error("err %s", "four");
}

Test(log, levels_and_prefix) {
    char *out = capture(emit_levels);
    cr_assert_null(strstr(out, "dbg 1"), "%s", out);
    cr_assert_null(strstr(out, "inf 2"), "%s", out);
    cr_assert_not_null(strstr(out, "warn: wrn 3"), "%s", out);
    cr_assert_not_null(strstr(out, "error: err four"), "%s", out);
    char pfx[64];
    snprintf(pfx, sizeof pfx, "[unit rank 3 pid %d]", (int)getpid());
    cr_assert_not_null(strstr(out, pfx), "missing '%s' in %s", pfx, out);
    free(out);
}

static char random_msg[200];

static void emit_json(void) {
    log_init("unit", 0);
    log_set_level(LOG_DEBUG);
    log_set_json(true);
    log_info("%s", random_msg);
    log_set_rank(-1);
    log_debug("no rank");
}

Test(log, json_lines_parse_and_escape) {
    srand((unsigned)getpid());
    /* random printable text plus quotes, backslashes, tabs and newlines */
    const char *special = "\"\\\t\n";
    for (int i = 0; i < 199; i++)
        random_msg[i] = (rand() % 5 == 0) ? special[rand() % 4] : (char)(' ' + rand() % 94);
    random_msg[199] = 0;
    char *out = capture(emit_json);
    char *line2 = strchr(out, '\n');
    cr_assert_not_null(line2);
    *line2++ = 0;
    json_error_t je;
    json_t *a = json_loads(out, 0, &je);
    cr_assert_not_null(a, "not JSON: %s (%s)", out, je.text);
    cr_assert_str_eq(json_string_value(json_object_get(a, "msg")), random_msg);
    cr_assert_str_eq(json_string_value(json_object_get(a, "level")), "info");
    cr_assert_eq(json_integer_value(json_object_get(a, "rank")), 0);
    cr_assert_eq(json_integer_value(json_object_get(a, "pid")), getpid());
    json_t *b = json_loads(line2, JSON_DISABLE_EOF_CHECK, &je);
    cr_assert_not_null(b, "not JSON: %s", line2);
    cr_assert_null(json_object_get(b, "rank"));
    cr_assert_str_eq(json_string_value(json_object_get(b, "level")), "debug");
    json_decref(a);
    json_decref(b);
    free(out);
}

Test(log, level_names) {
    cr_assert_eq(log_level_parse("debug"), LOG_DEBUG);
    cr_assert_eq(log_level_parse("WARN"), LOG_WARN);
    cr_assert_eq(log_level_parse("off"), LOG_OFF);
    cr_assert_eq(log_level_parse("loud"), -1);
}
