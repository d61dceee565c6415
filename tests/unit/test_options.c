/* test_options.c: the option table, its parsers and their error messages. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

static bool b_flag;
static int64_t i_val;
static uint64_t sz_val;
static double dur_val, d_val;
static const char *s_val;
static int e_val;

static const opt_t table[] = {
    { "verbose", OPT_BOOL, "false", 0, 0, NULL, "talk more", &b_flag },
    { "workers", OPT_INT, "4", 1, 64, NULL, "worker threads", &i_val },
    { "pool-bytes", OPT_SIZE, "256M", 4096, 1e15, NULL, "pool size", &sz_val },
    { "lease", OPT_DURATION, "30s", 0.001, 86400, NULL, "lease", &dur_val },
    { "lr", OPT_DOUBLE, "3e-4", 0, 10, NULL, "learning rate", &d_val },
    { "socket", OPT_STRING, "/run/ballast/ballastd.sock", 0, 0, NULL, "socket", &s_val },
    { "io-backend", OPT_ENUM, "auto", 0, 0, "auto|io_uring|threads", "io", &e_val },
};
#define N (sizeof table / sizeof table[0])

static int parse(char *err, int argc, char **argv) {
    const char *pos[4];
    int npos = 0;
    return opt_parse(table, N, argc, argv, pos, 4, &npos, "usage: t", err, OPT_ERR_LEN);
}

static void clear_env(void) {
    unsetenv("BALLAST_POOL_BYTES"); unsetenv("BALLAST_WORKERS"); unsetenv("BALLAST_IO_BACKEND");
}

Test(options, defaults_env_and_flags_in_order) {
    clear_env();
    char err[OPT_ERR_LEN];
    char *argv0[] = { "t", NULL };
    cr_assert_eq(parse(err, 1, argv0), 0, "%s", err);
    cr_assert_eq(sz_val, 256ull << 20);
    cr_assert_eq(i_val, 4);
    cr_assert_float_eq(dur_val, 30.0, 1e-12);
    cr_assert_str_eq(s_val, "/run/ballast/ballastd.sock");

    setenv("BALLAST_POOL_BYTES", "8G", 1);
    setenv("BALLAST_IO_BACKEND", "threads", 1);
    cr_assert_eq(parse(err, 1, argv0), 0, "%s", err);
    cr_assert_eq(sz_val, 8ull << 30);
    cr_assert_eq(e_val, 2);

    char *argv1[] = { "t", "--pool-bytes", "512M", "--io-backend=io_uring", "--verbose",
                      "--workers=7", "--lease", "100ms", "--lr", "0.5", "pos1", NULL };
    cr_assert_eq(parse(err, 11, argv1), 0, "%s", err);
    cr_assert_eq(sz_val, 512ull << 20);
    cr_assert_eq(e_val, 1);
    cr_assert(b_flag);
    cr_assert_eq(i_val, 7);
    cr_assert_float_eq(dur_val, 0.1, 1e-12);
    cr_assert_float_eq(d_val, 0.5, 1e-12);
    char *argv2[] = { "t", "--no-verbose", NULL };
    cr_assert_eq(parse(err, 2, argv2), 0, "%s", err);
    cr_assert(!b_flag);
    clear_env();
}

/* Each bad input fails, and the message names the option and the value. */
struct bad { const char *flag, *value, *needle; };
static const struct bad bads[] = {
    { "--pool-bytes", "-5M", "negative" },
    { "--pool-bytes", "99999999999999999999", "overflow" },
    { "--pool-bytes", "17179869184P", "overflow" },
    { "--pool-bytes", "12Q", "unknown unit" },
    { "--pool-bytes", "1K", "outside" },
    { "--workers", "abc", "not an integer" },
    { "--workers", "0", "outside" },
    { "--workers", "99999999999999999999999", "overflow" },
    { "--lease", "5 parsecs", "unknown unit" },
    { "--lease", "-3s", "negative" },
    { "--lr", "fast", "not a number" },
    { "--io-backend", "aio", "not one of auto|io_uring|threads" },
    { "--bogus", "1", "unknown option '--bogus'" },
};

Test(options, bad_values_are_named) {
    clear_env();
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        char err[OPT_ERR_LEN] = "";
        char *argv[] = { "t", (char *)bads[i].flag, (char *)bads[i].value, NULL };
        cr_assert_eq(parse(err, 3, argv), -1, "%s %s accepted", bads[i].flag, bads[i].value);
        cr_assert(strstr(err, bads[i].needle), "%s %s: message '%s' lacks '%s'", bads[i].flag,
                  bads[i].value, err, bads[i].needle);
        if (strcmp(bads[i].flag, "--bogus") != 0) {
            cr_assert(strstr(err, bads[i].flag), "message '%s' does not name %s", err, bads[i].flag);
        }
    }
}

Test(options, bad_environment_is_named) {
    clear_env();
    setenv("BALLAST_WORKERS", "many", 1);
    char err[OPT_ERR_LEN] = "";
    char *argv[] = { "t", NULL };
    cr_assert_eq(parse(err, 1, argv), -1);
    cr_assert(strstr(err, "BALLAST_WORKERS"), "%s", err);
    clear_env();
}

Test(options, missing_value_and_single_dash) {
    clear_env();
    char err[OPT_ERR_LEN] = "";
    char *argv[] = { "t", "--workers", NULL };
    cr_assert_eq(parse(err, 2, argv), -1);
    cr_assert(strstr(err, "needs a value"), "%s", err);
    char *argv2[] = { "t", "-w", NULL };
    cr_assert_eq(parse(err, 2, argv2), -1);
    cr_assert(strstr(err, "unknown option '-w'"), "%s", err);
}

Test(options, size_parser_matches_arithmetic) {
    /* Random sizes round-trip through text in every unit. */
    srand(1234);
    const char *units[] = { "", "K", "M", "G", "T" };
    for (int i = 0; i < 2000; i++) {
        int u = rand() % 5;
        uint64_t v = (uint64_t)rand() % 100000;
        char buf[64], err[128];
        snprintf(buf, sizeof buf, "%llu%s", (unsigned long long)v, units[u]);
        uint64_t got;
        cr_assert_eq(parse_size(buf, &got, err, sizeof err), 0, "%s: %s", buf, err);
        cr_assert_eq(got, v << (10 * u), "%s", buf);
    }
    uint64_t got;
    char err[128];
    cr_assert_eq(parse_size("1.5G", &got, err, sizeof err), 0);
    cr_assert_eq(got, 3ull << 29);
    cr_assert_eq(parse_size("16EiB", &got, err, sizeof err), -1);
    cr_assert_eq(parse_size("", &got, err, sizeof err), -1);
}

Test(options, help_lists_every_option_with_default) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    opt_print_help(table, N, "usage: t", f);
    fclose(f);
    for (size_t i = 0; i < N; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "--%s", table[i].name);
        cr_assert(strstr(buf, needle), "help lacks %s", needle);
        snprintf(needle, sizeof needle, "(default: %s)", table[i].def);
        cr_assert(strstr(buf, needle), "help lacks %s", needle);
    }
    free(buf);
}

/* An enum with a bare form (--activation-checkpointing [MODE]): alone it
 * means its bare choice, before a choice it takes it, --no-x is the first
 * choice; a program without positionals takes any word as the value, so a
 * slip is named with the nearest choice. */
static int mode_val;
static const opt_t bare_table[] = {
    { "mode", OPT_ENUM, "false", 0, 0, "false|true|full|selective", "mode", &mode_val, NULL, "full" },
    { "verbose", OPT_BOOL, "false", 0, 0, NULL, "talk more", &b_flag },
};

static int parse_bare(char *err, int argc, char **argv, int max_pos, int *npos) {
    const char *pos[4];
    return opt_parse(bare_table, 2, argc, argv, pos, max_pos, npos, "usage: t", err, OPT_ERR_LEN);
}

Test(options, enum_with_a_bare_form) {
    unsetenv("BALLAST_MODE");
    char err[OPT_ERR_LEN];
    int npos = 0;
    char *a1[] = { "t", "--mode", NULL };
    cr_assert_eq(parse_bare(err, 2, a1, 0, &npos), 0, "%s", err);
    cr_assert_eq(mode_val, 2, "the flag alone is its bare choice");
    char *a2[] = { "t", "--mode", "selective", "--verbose", NULL };
    cr_assert_eq(parse_bare(err, 4, a2, 0, &npos), 0, "%s", err);
    cr_assert_eq(mode_val, 3);
    char *a3[] = { "t", "--mode", "--verbose", NULL };
    cr_assert_eq(parse_bare(err, 3, a3, 0, &npos), 0, "%s", err);
    cr_assert_eq(mode_val, 2, "before another flag: bare");
    char *a4[] = { "t", "--mode=true", "--no-mode", NULL };
    cr_assert_eq(parse_bare(err, 3, a4, 0, &npos), 0, "%s", err);
    cr_assert_eq(mode_val, 0, "--no-mode is the first choice");
    char *a5[] = { "t", "--mode", "selectve", NULL };
    cr_assert_eq(parse_bare(err, 3, a5, 0, &npos), -1);
    cr_assert(strstr(err, "'selectve' is not one of false|true|full|selective (did you mean selective?)"), "%s", err);
    /* with positionals, a word that is no choice stays a positional */
    char *a6[] = { "t", "--mode", "bench", NULL };
    cr_assert_eq(parse_bare(err, 3, a6, 1, &npos), 0, "%s", err);
    cr_assert_eq(mode_val, 2);
    cr_assert_eq(npos, 1);
    char *a7[] = { "t", "--mode", "selective", "bench", NULL };
    cr_assert_eq(parse_bare(err, 4, a7, 1, &npos), 0, "%s", err);
    cr_assert_eq(mode_val, 3);
    cr_assert_eq(npos, 1);
    /* an enum without a bare form still needs its value */
    char *a8[] = { "t", "--io-backend", NULL };
    cr_assert_eq(parse(err, 2, a8), -1);
}
