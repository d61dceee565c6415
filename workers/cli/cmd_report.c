/*
 * cmd_report.c - `ballast report RUN.jsonl [MORE.jsonl...] [--out report.html]
 * [--title T] [--entropy NATS]`: one self-contained HTML page from the JSON
 * logs of one or more runs, overlaid (workers/cli/report.h). Written to a
 * temporary file and renamed, so a reader never sees half a page.
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
    { "out", OPT_STRING, NULL, 0, 0, NULL, "HTML file to write; unset = the (first) log's name with .html", &rep_out },
    { "title", OPT_STRING, NULL, 0, 0, NULL, "page title; unset = \"ballast run: LOG\"", &rep_title },
    { "entropy", OPT_STRING, NULL, 0, 0, NULL,
      "corpus entropy floor (nats per token) for the loss plot; unset = the first log's settings record", &rep_entropy },
};
#define N_REPORT (sizeof REPORT_OPTS / sizeof REPORT_OPTS[0])
static const char REPORT_USAGE[] =
    "usage: ballast report RUN.jsonl [MORE.jsonl...] [--out report.html] [--title TEXT] [--entropy NATS]\n"
    "  RUN.jsonl is the file written by `ballast train --log-json RUN.jsonl`; several logs are overlaid\n"
    "  in every plot (up to 8 runs)";

int cmd_report(int argc, char **argv) {
    char err[1024];
    const char *pos[REPORT_MAX_RUNS + 1];
    int npos = 0;
    int r = opt_parse(REPORT_OPTS, N_REPORT, argc, argv, pos, REPORT_MAX_RUNS + 1, &npos, REPORT_USAGE, err, sizeof err);
    if (r == 1) return 0;
    if (r < 0) { fprintf(stderr, "ballast report: %s\n%s\n", err, REPORT_USAGE); return 2; }
    if (npos < 1 || npos > REPORT_MAX_RUNS) {
        fprintf(stderr, "ballast report: give 1 to %d JSON logs (got %d%s)\n%s\n", REPORT_MAX_RUNS, npos,
                npos > REPORT_MAX_RUNS ? " or more" : "", REPORT_USAGE);
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
    for (int i = 0; i < npos; i++)
        if (strcmp(out, pos[i]) == 0) {
            fprintf(stderr, "ballast report: --out %s would overwrite the log; choose another file\n", out);
            return 2;
        }

    report_log_t *logs[REPORT_MAX_RUNS] = { 0 };
    for (int i = 0; i < npos; i++)
        if (report_load(pos[i], &logs[i], err, sizeof err) != 0) {
            fprintf(stderr, "ballast report: %s\n", err);
            for (int k = 0; k < i; k++) report_free(logs[k]);
            return 1;
        }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "ballast report: cannot write %s: %s; choose another --out\n", tmp, strerror(errno));
        for (int k = 0; k < npos; k++) report_free(logs[k]);
        return 1;
    }
    char plotted[256], missing[512];
    int rc = report_write_html(logs, (size_t)npos, &ro, f, plotted, sizeof plotted, missing, sizeof missing, err, sizeof err);
    if (fclose(f) != 0 && rc == 0) { snprintf(err, sizeof err, "%s", strerror(errno)); rc = -1; }
    if (rc == 0 && rename(tmp, out) != 0) { snprintf(err, sizeof err, "rename: %s", strerror(errno)); rc = -1; }
    if (rc != 0) {
        unlink(tmp);
        fprintf(stderr, "ballast report: writing %s failed: %s\n", out, err);
        for (int k = 0; k < npos; k++) report_free(logs[k]);
        return 1;
    }
    size_t steps = 0;
    for (int k = 0; k < npos; k++) {
        const char *notes = report_notes(logs[k]);
        if (*notes && npos > 1) fprintf(stderr, "ballast report: %s:\n%s", pos[k], notes);
        else if (*notes) fprintf(stderr, "ballast report: %s", notes);
        steps += report_steps(logs[k]);
    }
    char runs[32] = "";
    if (npos > 1) snprintf(runs, sizeof runs, "%d runs, ", npos);
    printf("wrote %s: %s%zu steps; plots: %s%s%s\n", out, runs, steps, *plotted ? plotted : "none",
           *missing ? "; not in the log: " : "", missing);
    for (int k = 0; k < npos; k++) report_free(logs[k]);
    return 0;
}
