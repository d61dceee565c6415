/* options.h: one table of options per program.
 *
 * Each option has one definition (name, type, default, bounds, help). The
 * effective value is, from lowest to highest precedence: the default, the
 * environment variable PREFIX<NAME> (the program's prefix, BALLAST_ unless
 * opt_set_env_prefix says otherwise; dashes become underscores, upper
 * case), then the command-line flag. Every value goes through the same
 * checked parser, so a bad default, environment value or flag gets the same
 * clear message naming where it came from. */
#ifndef BALLAST_OPTIONS_H
#define BALLAST_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    OPT_BOOL,     /* bool *           --x, --no-x, --x=true|false|1|0|yes|no */
    OPT_INT,      /* int64_t *        decimal or 0x hex, bounds [min, max] */
    OPT_SIZE,     /* uint64_t * bytes 512, 64K, 512M, 8G, 1T (powers of 1024), 1.5G */
    OPT_DURATION, /* double * seconds 30s, 100ms, 5m, 2h, 1.5 (bare = seconds) */
    OPT_DOUBLE,   /* double *         bounds [min, max] */
    OPT_STRING,   /* const char **    points into argv/environ/default */
    OPT_ENUM,     /* int *            index into choices "a|b|c" */
} opt_type_t;

typedef struct {
    const char *name;    /* long flag without dashes, e.g. "pool-bytes" */
    opt_type_t type;
    const char *def;     /* default, written as a user would; NULL = unset/empty */
    double min, max;     /* numeric bounds (inclusive); both 0 = unbounded */
    const char *choices; /* OPT_ENUM only: "auto|io_uring|threads" */
    const char *help;    /* one line */
    void *dst;           /* where the value goes; type per opt_type_t */
    const char *alias;   /* an older spelling still accepted (hidden from --help, no environment variable); NULL = none */
    const char *bare;    /* OPT_ENUM only: the choice meant by the flag alone (--x last, before another --flag, or
                            before a word that is no choice where the program takes positional arguments);
                            --no-x then means the first choice. NULL = the flag needs a value */
} opt_t;

#define OPT_ERR_LEN 512

/* Parse defaults, environment and argv[1..] into the table's destinations.
 * Non-option arguments are collected in order into pos[0..*npos) (at most
 * max_pos; more is an error); "--" ends option parsing.
 * Returns 0 on success, 1 if --help/-h was given (help already printed to
 * stdout), -1 on error with a message in err naming the option, the value
 * and what is accepted. */
int opt_parse(const opt_t *opts, size_t n, int argc, char **argv,
              const char **pos, int max_pos, int *npos,
              const char *usage, char *err, size_t errlen);

/* Names that are not in a program's table but that it takes (a launcher's
 * own flags, handled before the table), for "did you mean" only; a NULL-
 * ended list that must outlive the parsing. */
void opt_set_extra_names(const char *const *names);

/* The option name (of opts, or the extra names) nearest to name when it
 * looks like a slip of the keyboard, else NULL: the "did you mean" of an
 * unknown flag. */
const char *opt_suggest(const opt_t *opts, size_t n, const char *name);

/* The environment prefix of this program's options (default "BALLAST_";
 * ballastd's is "BALLASTD_", ballast-rdzv's "BALLAST_RDZV_"), so that
 * one program's variables never set another's options. Call before
 * opt_parse. */
void opt_set_env_prefix(const char *prefix);
const char *opt_env_prefix(void);

/* For a program whose variables moved from old_prefix (BALLAST_) to the
 * current prefix: one warning line to out for every old_prefix<NAME> set
 * (NAME an option or its older spelling), naming the variable the program
 * reads instead. Returns how many. */
int opt_warn_moved_env(const opt_t *opts, size_t n, const char *old_prefix, const char *prog, FILE *out);

/* Print "--name TYPE  help (default: X) [env BALLAST_NAME]" for every option. */
void opt_print_help(const opt_t *opts, size_t n, const char *usage, FILE *out);

/* Print the settings whose value is not the default, as flags on one
 * line ("--model tiny --steps 3"); returns how many. */
int opt_print_changed(const opt_t *opts, size_t n, FILE *out);

/* Print the effective settings as a two-column table. */
void opt_print_table(const opt_t *opts, size_t n, FILE *out);

/* Format the current value of one option into buf. */
void opt_format_value(const opt_t *o, char *buf, size_t len);

/* Checked scalar parsers (0 on success, -1 with a message in err). */
int parse_size(const char *s, uint64_t *out, char *err, size_t errlen);
int parse_duration(const char *s, double *seconds, char *err, size_t errlen);
int parse_int64(const char *s, int64_t *out, char *err, size_t errlen);
int parse_double(const char *s, double *out, char *err, size_t errlen);
int parse_bool(const char *s, bool *out, char *err, size_t errlen);

/* Format bytes as "512M", "1.5G". */
void format_size(uint64_t bytes, char *buf, size_t len);

#endif
