/* options.c: see options.h. No getopt: the table is the single source. */
#include "options.h"
#include "errbuf.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- scalar parsers ---- */


static bool blank(const char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    return *s == 0;
}

int parse_int64(const char *s, int64_t *out, char *err, size_t errlen) {
    if (!s || blank(s)) return errbuf_set(err, errlen, "empty value where an integer is expected");
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 0);
    if (errno == ERANGE) return errbuf_set(err, errlen, "'%s' overflows a 64-bit integer", s);
    if (*end != 0 || end == s) return errbuf_set(err, errlen, "'%s' is not an integer", s);
    *out = v;
    return 0;
}

int parse_double(const char *s, double *out, char *err, size_t errlen) {
    if (!s || blank(s)) return errbuf_set(err, errlen, "empty value where a number is expected");
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end != 0 || end == s) return errbuf_set(err, errlen, "'%s' is not a number", s);
    if (errno == ERANGE || !isfinite(v)) return errbuf_set(err, errlen, "'%s' is out of range", s);
    *out = v;
    return 0;
}

int parse_bool(const char *s, bool *out, char *err, size_t errlen) {
    static const char *yes[] = { "1", "true", "yes", "on" }, *no[] = { "0", "false", "no", "off" };
    for (int i = 0; i < 4; i++) {
        if (s && strcasecmp(s, yes[i]) == 0) { *out = true; return 0; }
        if (s && strcasecmp(s, no[i]) == 0) { *out = false; return 0; }
    }
    return errbuf_set(err, errlen, "'%s' is not a boolean (use true/false, 1/0, yes/no)", s ? s : "");
}

int parse_size(const char *s, uint64_t *out, char *err, size_t errlen) {
    if (!s || blank(s)) return errbuf_set(err, errlen, "empty value where a size is expected (e.g. 512M, 8G)");
    const char *p = s;
    while (isspace((unsigned char)*p)) p++;
    if (*p == '-') return errbuf_set(err, errlen, "size '%s' is negative", s);
    if (!isdigit((unsigned char)*p) && *p != '.') return errbuf_set(err, errlen, "'%s' is not a size (e.g. 4096, 512M, 8G)", s);
    /* Integer part exactly, optional fraction, optional unit. */
    errno = 0;
    char *end;
    unsigned long long whole = strtoull(p, &end, 10);
    if (errno == ERANGE) return errbuf_set(err, errlen, "size '%s' overflows 64 bits", s);
    double frac = 0;
    if (*end == '.') {
        char *fend;
        frac = strtod(end, &fend);
        if (fend == end + 1 && end == p) return errbuf_set(err, errlen, "'%s' is not a size", s);
        end = fend;
    }
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    case 'P': shift = 50; end++; break;
    case 'B': break;
    default: return errbuf_set(err, errlen, "size '%s' has an unknown unit (use K, M, G, T, P)", s);
    }
    if (shift && (*end == 'i' || *end == 'I')) end++; /* KiB, MiB */
    if (*end == 'B' || *end == 'b') end++;
    if (*end != 0) return errbuf_set(err, errlen, "size '%s' has trailing characters '%s'", s, end);
    if (shift && whole > (UINT64_MAX >> shift)) return errbuf_set(err, errlen, "size '%s' overflows 64 bits", s);
    uint64_t v = (uint64_t)whole << shift;
    if (frac > 0) {
        double extra = frac * (double)((uint64_t)1 << shift);
        if ((double)v + extra >= 18446744073709551615.0) return errbuf_set(err, errlen, "size '%s' overflows 64 bits", s);
        v += (uint64_t)extra;
    }
    *out = v;
    return 0;
}

int parse_duration(const char *s, double *seconds, char *err, size_t errlen) {
    if (!s || blank(s)) return errbuf_set(err, errlen, "empty value where a duration is expected (e.g. 30s, 5m)");
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s) return errbuf_set(err, errlen, "'%s' is not a duration (e.g. 500ms, 30s, 5m, 2h)", s);
    if (errno == ERANGE || !isfinite(v)) return errbuf_set(err, errlen, "duration '%s' is out of range", s);
    if (v < 0) return errbuf_set(err, errlen, "duration '%s' is negative", s);
    double mul;
    if (*end == 0 || strcmp(end, "s") == 0) mul = 1;
    else if (strcmp(end, "ms") == 0) mul = 1e-3;
    else if (strcmp(end, "us") == 0) mul = 1e-6;
    else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0) mul = 60;
    else if (strcmp(end, "h") == 0) mul = 3600;
    else if (strcmp(end, "d") == 0) mul = 86400;
    else return errbuf_set(err, errlen, "duration '%s' has an unknown unit '%s' (use ms, s, m, h, d)", s, end);
    if (v * mul > 1e12) return errbuf_set(err, errlen, "duration '%s' is out of range", s);
    *seconds = v * mul;
    return 0;
}

void format_size(uint64_t b, char *buf, size_t len) {
    static const char *u[] = { "", "K", "M", "G", "T", "P" };
    int i = 0;
    double v = (double)b;
    while (v >= 1024 && i < 5 && (b % 1024 == 0 || v >= 10240)) { v /= 1024; i++; b /= 1024; }
    if (v == floor(v)) snprintf(buf, len, "%.0f%s", v, u[i]);
    else snprintf(buf, len, "%.1f%s", v, u[i]);
}

/* ---- the table ---- */

static const char *type_name(const opt_t *o) {
    switch (o->type) {
    case OPT_BOOL: return "";
    case OPT_INT: return "INT";
    case OPT_SIZE: return "SIZE";
    case OPT_DURATION: return "DURATION";
    case OPT_DOUBLE: return "NUM";
    case OPT_STRING: return "STR";
    case OPT_ENUM: return o->choices;
    }
    return "?";
}

static char g_env_prefix[32] = "BALLAST_"; /* opt_set_env_prefix */

void opt_set_env_prefix(const char *prefix) {
    if (prefix && strlen(prefix) < sizeof g_env_prefix) snprintf(g_env_prefix, sizeof g_env_prefix, "%s", prefix);
}

const char *opt_env_prefix(void) { return g_env_prefix; }

static void env_name(const opt_t *o, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "%s", g_env_prefix);
    for (const char *p = o->name; *p && n + 1 < len; p++)
        buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    buf[n] = 0;
}

/* prefix + name with dashes as underscores, upper case */
static void env_join(const char *prefix, const char *name, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "%s", prefix);
    for (const char *p = name; *p && n + 1 < len; p++)
        buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    buf[n] = 0;
}

int opt_warn_moved_env(const opt_t *opts, size_t n, const char *old_prefix, const char *prog, FILE *out) {
    int warned = 0;
    for (size_t i = 0; i < n; i++) {
        const char *names[2] = { opts[i].name, opts[i].alias };
        for (int k = 0; k < 2; k++) {
            if (!names[k]) continue;
            char old[96], now[96];
            env_join(old_prefix, names[k], old, sizeof old);
            env_join(g_env_prefix, opts[i].name, now, sizeof now);
            if (!strcmp(old, now) || !getenv(old)) continue;
            fprintf(out, "%s: warning: %s is not read by %s; it reads %s\n", prog, old, prog, now);
            warned++;
        }
    }
    return warned;
}

static bool bounded(const opt_t *o) { return !(o->min == 0 && o->max == 0); }

/* Parse text into o->dst; origin says where the text came from. */
static size_t edit_distance(const char *a, size_t la, const char *b);

/* The choice of "a|b|c" nearest to text when it looks like a slip (as
 * nearest() judges names), else NULL; a static buffer. */
static const char *nearest_choice(const char *choices, const char *text) {
    static char best[64];
    size_t tl = strlen(text), bd = (tl / 3 > 2 ? tl / 3 : 2) + 1;
    bool found = false;
    for (const char *c = choices; c && *c;) {
        const char *bar = strchr(c, '|');
        size_t cl = bar ? (size_t)(bar - c) : strlen(c);
        char one[64];
        if (cl < sizeof one) {
            memcpy(one, c, cl);
            one[cl] = 0;
            size_t d = edit_distance(text, tl, one);
            if (d < bd) { bd = d; snprintf(best, sizeof best, "%s", one); found = true; }
        }
        c = bar ? bar + 1 : NULL;
    }
    return found ? best : NULL;
}

static int set_value(const opt_t *o, const char *text, const char *origin, char *err, size_t errlen) {
    char why[256];
    why[0] = 0;
    int rc = 0;
    switch (o->type) {
    case OPT_BOOL: {
        bool v;
        rc = parse_bool(text, &v, why, sizeof why);
        if (!rc) *(bool *)o->dst = v;
        break;
    }
    case OPT_INT: {
        int64_t v;
        rc = parse_int64(text, &v, why, sizeof why);
        if (!rc && bounded(o) && ((double)v < o->min || (double)v > o->max)) {
            snprintf(why, sizeof why, "%lld is outside [%.0f, %.0f]", (long long)v, o->min, o->max);
            rc = -1;
        }
        if (!rc) *(int64_t *)o->dst = v;
        break;
    }
    case OPT_SIZE: {
        uint64_t v;
        rc = parse_size(text, &v, why, sizeof why);
        if (!rc && bounded(o) && ((double)v < o->min || (double)v > o->max)) {
            char lo[32], hi[32];
            format_size((uint64_t)o->min, lo, sizeof lo);
            format_size((uint64_t)o->max, hi, sizeof hi);
            snprintf(why, sizeof why, "%s is outside [%s, %s]", text, lo, hi);
            rc = -1;
        }
        if (!rc) *(uint64_t *)o->dst = v;
        break;
    }
    case OPT_DURATION: {
        double v;
        rc = parse_duration(text, &v, why, sizeof why);
        if (!rc && bounded(o) && (v < o->min || v > o->max)) {
            snprintf(why, sizeof why, "%s is outside [%gs, %gs]", text, o->min, o->max);
            rc = -1;
        }
        if (!rc) *(double *)o->dst = v;
        break;
    }
    case OPT_DOUBLE: {
        double v;
        rc = parse_double(text, &v, why, sizeof why);
        if (!rc && bounded(o) && (v < o->min || v > o->max)) {
            snprintf(why, sizeof why, "%s is outside [%g, %g]", text, o->min, o->max);
            rc = -1;
        }
        if (!rc) *(double *)o->dst = v;
        break;
    }
    case OPT_STRING:
        *(const char **)o->dst = text;
        break;
    case OPT_ENUM: {
        int idx = 0;
        const char *c = o->choices;
        size_t tl = text ? strlen(text) : 0;
        rc = -1;
        while (c && *c) {
            const char *bar = strchr(c, '|');
            size_t cl = bar ? (size_t)(bar - c) : strlen(c);
            if (text && cl == tl && strncmp(c, text, cl) == 0) { *(int *)o->dst = idx; rc = 0; break; }
            idx++;
            c = bar ? bar + 1 : NULL;
        }
        if (rc) {
            const char *near = nearest_choice(o->choices, text ? text : "");
            char hint[96] = "";
            if (near) snprintf(hint, sizeof hint, " (did you mean %s?)", near);
            snprintf(why, sizeof why, "'%s' is not one of %s%s", text ? text : "", o->choices, hint);
        }
        break;
    }
    }
    if (rc) return errbuf_set(err, errlen, "invalid value for --%s (from %s): %s", o->name, origin, why);
    return 0;
}

/* ---- "did you mean" ---- */

static const char *const *g_extra; /* more names for suggestions only (opt_set_extra_names) */

void opt_set_extra_names(const char *const *names) { g_extra = names; }

/* Edit distance (insert, delete, substitute, swap of neighbours) of a[0..la) and b, capped at 64 characters. */
static size_t edit_distance(const char *a, size_t la, const char *b) {
    size_t lb = strlen(b);
    if (la > 64 || lb > 64) return 99;
    size_t d[65][65];
    for (size_t i = 0; i <= la; i++) d[i][0] = i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

/* The known name nearest to name[0..len) when it is near enough to be a
 * slip (a third of its length, at least 2 edits), else NULL. */
static const char *nearest(const opt_t *opts, size_t n, const char *name, size_t len) {
    const char *best = NULL;
    size_t bd = len / 3 > 2 ? len / 3 : 2;
    bd++;
    for (size_t i = 0; i < n; i++) {
        size_t dd = edit_distance(name, len, opts[i].name);
        if (dd < bd) { bd = dd; best = opts[i].name; }
    }
    for (const char *const *e = g_extra; e && *e; e++) {
        size_t dd = edit_distance(name, len, *e);
        if (dd < bd) { bd = dd; best = *e; }
    }
    return best;
}

const char *opt_suggest(const opt_t *opts, size_t n, const char *name) {
    return nearest(opts, n, name, strlen(name));
}

static const opt_t *find(const opt_t *opts, size_t n, const char *name, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0) return &opts[i];
    for (size_t i = 0; i < n; i++)
        if (opts[i].alias && strlen(opts[i].alias) == len && strncmp(opts[i].alias, name, len) == 0) return &opts[i];
    return NULL;
}

void opt_format_value(const opt_t *o, char *buf, size_t len) {
    switch (o->type) {
    case OPT_BOOL: snprintf(buf, len, "%s", *(bool *)o->dst ? "true" : "false"); break;
    case OPT_INT: snprintf(buf, len, "%lld", (long long)*(int64_t *)o->dst); break;
    case OPT_SIZE: format_size(*(uint64_t *)o->dst, buf, len); break;
    case OPT_DURATION: snprintf(buf, len, "%gs", *(double *)o->dst); break;
    case OPT_DOUBLE: snprintf(buf, len, "%g", *(double *)o->dst); break;
    case OPT_STRING: snprintf(buf, len, "%s", *(const char **)o->dst ? *(const char **)o->dst : "(unset)"); break;
    case OPT_ENUM: {
        int idx = *(int *)o->dst, i = 0;
        const char *c = o->choices;
        while (c && i < idx) { c = strchr(c, '|'); if (c) c++; i++; }
        if (!c) { snprintf(buf, len, "?"); break; }
        const char *bar = strchr(c, '|');
        snprintf(buf, len, "%.*s", bar ? (int)(bar - c) : (int)strlen(c), c);
        break;
    }
    }
}

void opt_print_help(const opt_t *opts, size_t n, const char *usage, FILE *out) {
    if (usage) fprintf(out, "%s\n\n", usage);
    fprintf(out, "Options (each also settable as %s<NAME> in the environment):\n", g_env_prefix);
    for (size_t i = 0; i < n; i++) {
        const opt_t *o = &opts[i];
        char flag[96];
        if (o->type == OPT_ENUM && o->bare)
            snprintf(flag, sizeof flag, "--%s [%s]", o->name, type_name(o));
        else
            snprintf(flag, sizeof flag, "--%s%s%s", o->name, o->type == OPT_BOOL ? "" : " ", type_name(o));
        fprintf(out, "  %-34s %s (default: %s)\n", flag, o->help ? o->help : "",
                o->def ? (o->def[0] ? o->def : "\"\"") : "unset");
    }
    fprintf(out, "  %-34s %s\n", "--help", "print this help and exit");
}

void opt_print_table(const opt_t *opts, size_t n, FILE *out) {
    fprintf(out, "+------------------------------+--------------------------------+\n");
    fprintf(out, "| %-28s | %-30s |\n", "setting", "value");
    fprintf(out, "+------------------------------+--------------------------------+\n");
    for (size_t i = 0; i < n; i++) {
        char v[256];
        opt_format_value(&opts[i], v, sizeof v);
        fprintf(out, "| %-28s | %-30s |\n", opts[i].name, v);
    }
    fprintf(out, "+------------------------------+--------------------------------+\n");
}

int opt_print_changed(const opt_t *opts, size_t n, FILE *out) {
    int shown = 0;
    for (size_t i = 0; i < n; i++) {
        const opt_t *o = &opts[i];
        union { bool b; int64_t i; uint64_t u; double d; const char *s; int e; } v;
        memset(&v, 0, sizeof v);
        opt_t d = *o;
        d.dst = &v;
        char e[OPT_ERR_LEN], now[256], def[256];
        if (o->def && set_value(&d, o->def, "the built-in default", e, sizeof e)) continue;
        opt_format_value(&d, def, sizeof def);
        opt_format_value(o, now, sizeof now);
        if (!strcmp(now, def)) continue;
        fprintf(out, "%s--%s %s", shown++ ? " " : "", o->name, now);
    }
    return shown;
}

/* Whether text is one of o's choices (OPT_ENUM). */
static bool is_choice(const opt_t *o, const char *text) {
    size_t tl = strlen(text);
    for (const char *c = o->choices; c && *c;) {
        const char *bar = strchr(c, '|');
        size_t cl = bar ? (size_t)(bar - c) : strlen(c);
        if (cl == tl && strncmp(c, text, cl) == 0) return true;
        c = bar ? bar + 1 : NULL;
    }
    return false;
}

int opt_parse(const opt_t *opts, size_t n, int argc, char **argv,
              const char **pos, int max_pos, int *npos,
              const char *usage, char *err, size_t errlen) {
    if (npos) *npos = 0;
    /* Defaults (an empty/NULL default for a string leaves NULL). */
    for (size_t i = 0; i < n; i++) {
        const opt_t *o = &opts[i];
        if (!o->def) {
            if (o->type == OPT_STRING) *(const char **)o->dst = NULL;
            continue;
        }
        if (set_value(o, o->def, "the built-in default", err, errlen)) return -1;
    }
    /* Environment. */
    for (size_t i = 0; i < n; i++) {
        char env[96], origin[128];
        env_name(&opts[i], env, sizeof env);
        const char *v = getenv(env);
        if (!v) continue;
        snprintf(origin, sizeof origin, "environment variable %s", env);
        if (set_value(&opts[i], v, origin, err, errlen)) return -1;
    }
    /* Flags. */
    bool only_pos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            opt_print_help(opts, n, usage, stdout);
            return 1;
        }
        if (!only_pos && strcmp(a, "--") == 0) { only_pos = true; continue; }
        if (only_pos || a[0] != '-' || a[1] == 0) {
            if (!pos || !npos || *npos >= max_pos)
                return errbuf_set(err, errlen, "unexpected argument '%s'%s", a,
                            max_pos ? " (too many arguments)" : " (this program takes only --options)");
            pos[(*npos)++] = a;
            continue;
        }
        if (a[1] != '-') return errbuf_set(err, errlen, "unknown option '%s' (options are spelled --name; see --help)", a);
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const opt_t *o = find(opts, n, name, len);
        const char *val = eq ? eq + 1 : NULL;
        if (!o && len > 3 && strncmp(name, "no-", 3) == 0) {
            const opt_t *b = find(opts, n, name + 3, len - 3);
            if (b && b->type == OPT_BOOL && !eq) { *(bool *)b->dst = false; continue; }
            if (b && b->type == OPT_ENUM && b->bare && !eq) { *(int *)b->dst = 0; continue; }
        }
        if (!o) {
            const char *near = nearest(opts, n, name, len);
            if (near)
                return errbuf_set(err, errlen, "unknown option '--%.*s': did you mean --%s? (see --help for the list)",
                                  (int)len, name, near);
            return errbuf_set(err, errlen, "unknown option '--%.*s' (see --help for the list)", (int)len, name);
        }
        char origin[128];
        snprintf(origin, sizeof origin, "the command line");
        if (o->type == OPT_BOOL && !val) { *(bool *)o->dst = true; continue; }
        if (o->type == OPT_ENUM && o->bare && !val) {
            /* the next argument is the value when it is a choice, or (a
             * program without positional arguments) any word, so that a
             * slip gets its message; otherwise the flag stands alone */
            const char *next = i + 1 < argc ? argv[i + 1] : NULL;
            val = next && next[0] != '-' && (max_pos == 0 || is_choice(o, next)) ? argv[++i] : o->bare;
        }
        if (!val) {
            if (i + 1 >= argc) return errbuf_set(err, errlen, "option --%s needs a value (%s)", o->name, type_name(o));
            val = argv[++i];
        }
        if (set_value(o, val, origin, err, errlen)) return -1;
    }
    return 0;
}
