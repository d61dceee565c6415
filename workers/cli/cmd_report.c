/*
 * cmd_report.c - `ballast report RUN.jsonl [--out report.html] [--title T]
 * [--entropy NATS]`: one self-contained HTML page from a run's JSON log
 * (workers/cli/report.h). Written to a temporary file and renamed, so a reader
 * never sees half a page.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "options.h"
#include "workers/cli/cli.h"
#include "workers/cli/report.h"

static const char *rep_out, *rep_title, *rep_entropy;
static const opt_t REPORT_OPTS[] = {
    { "out", OPT_STRING, NULL, 0, 0, NULL, "HTML file to write; unset = the log's name with .html", &rep_out },
    { "title", OPT_STRING, NULL, 0, 0, NULL, "page title; unset = \"ballast run: LOG\"", &rep_title },
    { "entropy", OPT_STRING, NULL, 0, 0, NULL,
      "corpus entropy floor (nats per token) for the loss plot; unset = the log's settings record", &rep_entropy },
};
#define N_REPORT (sizeof REPORT_OPTS / sizeof REPORT_OPTS[0])
static const char REPORT_USAGE[] =
    "usage: ballast report RUN.jsonl [--out report.html] [--title TEXT] [--entropy NATS]\n"
    "  RUN.jsonl is the file written by `ballast train --log-json RUN.jsonl`";

int cmd_report(int argc, char **argv) {
    char err[1024];
    const char *pos[2];
    int npos = 0;
    int r = opt_parse(REPORT_OPTS, N_REPORT, argc, argv, pos, 2, &npos, REPORT_USAGE, err, sizeof err);
    if (r == 1) return 0;
    if (r < 0) { fprintf(stderr, "ballast report: %s\n%s\n", err, REPORT_USAGE); return 2; }
    if (npos != 1) {
        fprintf(stderr, "ballast report: give exactly one JSON log (got %d)\n%s\n", npos, REPORT_USAGE);
        return 2;
    }
    report_opts_t ro = { .title = rep_title, .entropy_nats = NAN };
    if (rep_entropy && *rep_entropy) {
        if (parse_double(rep_entropy, &ro.entropy_nats, err, sizeof err) != 0 || !(ro.entropy_nats >= 0) ||
            !isfinite(ro.entropy_nats)) {
            fprintf(stderr, "ballast report: --entropy %s: give the floor in nats per token, a number >= 0\n",
                    rep_entropy);
            return 2;
        }
    }
    char out[4096];
    if (rep_out && *rep_out) snprintf(out, sizeof out, "%s", rep_out);
    else {
        snprintf(out, sizeof out, "%s", pos[0]);
        char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
        if (dot && (!slash || dot > slash)) *dot = 0;
        strncat(out, ".html", sizeof out - strlen(out) - 1);
    }
    if (strcmp(out, pos[0]) == 0) {
        fprintf(stderr, "ballast report: --out %s would overwrite the log; choose another file\n", out);
        return 2;
    }

    report_log_t *log = NULL;
    if (report_load(pos[0], &log, err, sizeof err) != 0) {
        fprintf(stderr, "ballast report: %s\n", err);
        return 1;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "ballast report: cannot write %s: %s; choose another --out\n", tmp, strerror(errno));
        report_free(log);
        return 1;
    }
    char plotted[256], missing[512];
    int rc = report_write_html(log, &ro, f, plotted, sizeof plotted, missing, sizeof missing, err, sizeof err);
    if (fclose(f) != 0 && rc == 0) { snprintf(err, sizeof err, "%s", strerror(errno)); rc = -1; }
    if (rc == 0 && rename(tmp, out) != 0) { snprintf(err, sizeof err, "rename: %s", strerror(errno)); rc = -1; }
    if (rc != 0) {
        unlink(tmp);
        fprintf(stderr, "ballast report: writing %s failed: %s\n", out, err);
        report_free(log);
        return 1;
    }
    const char *notes = report_notes(log);
    if (*notes) fprintf(stderr, "ballast report: %s", notes);
    printf("wrote %s: %zu steps; plots: %s%s%s\n", out, report_steps(log), *plotted ? plotted : "none",
           *missing ? "; not in the log: " : "", missing);
    report_free(log);
    return 0;
}
