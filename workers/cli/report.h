/* report.h: read runs' JSON logs (--log-json) and render one self-contained
 * HTML page: a summary per run, inline SVG plots (loss with the corpus
 * entropy floor, learning rate, gradient norm, tokens/s, MFU, memory,
 * offload traffic, step time split) with every run overlaid, and the runs'
 * settings. No scripts, fonts or anything fetched from elsewhere.
 *
 * Plot scaling (what tests/integration/report.sh inverts): each plot's
 * data area is REPORT_PLOT_X0, REPORT_PLOT_Y0, REPORT_PLOT_W x REPORT_PLOT_H
 * in SVG user units. x = X0 + W * (step - first) / (last - first) over the
 * steps, of every run, that have the plot's field; y = Y0 + H * (ymax - v) /
 * (ymax - ymin) with [ymin, ymax] the range of the plotted values of every
 * run (and the entropy floor on the loss plot) widened by 5% of its span on
 * both sides (by 5% of |v| when the span is 0), and ymin raised to 0 where
 * that widening would take a range of non-negative values below 0. The
 * value labels sit at round values (report_ticks). Values are plotted as
 * logged (bytes, ratios, seconds); axis labels carry the units.
 * Coordinates are written with 3 decimals. A run of more than
 * REPORT_MAX_POINTS steps is thinned to every k-th step plus the last. A
 * plot whose every value is 0 (a run without offload) is a sentence saying
 * so, not an axis. */
#ifndef BALLAST_REPORT_H
#define BALLAST_REPORT_H

#include <stddef.h>
#include <stdio.h>

#define REPORT_PLOT_X0 70.0
#define REPORT_PLOT_Y0 20.0
#define REPORT_PLOT_W 620.0
#define REPORT_PLOT_H 200.0
#define REPORT_MAX_POINTS 4000
#define REPORT_MAX_RUNS 8
#define REPORT_MAX_TICKS 16

typedef struct report_log report_log_t;

typedef struct {
    const char *title;    /* page title; NULL = "ballast run: FILE" (or "ballast runs: A, B") */
    double entropy_nats;  /* floor line on the loss plot; NaN = the first run's settings record, if any */
} report_opts_t;

/* Round tick values for an axis over [lo, hi]. */
typedef struct {
    double step;                  /* 1, 2 or 5 x 10^k */
    int decimals;                 /* digits after the point that print every tick exactly */
    int n;                        /* ticks, >= 1 */
    double v[REPORT_MAX_TICKS];   /* the multiples of step in [lo, hi], ascending */
} report_ticks_t;

/* Fill t with the multiples of the smallest step (1, 2 or 5 x 10^k) of
 * which at most max_ticks lie in [lo, hi]. Needs finite lo <= hi and
 * 2 <= max_ticks <= REPORT_MAX_TICKS; lo == hi gives the one tick lo
 * (step: the power of ten at lo's magnitude). Returns 0, or -1 on bad
 * arguments. Ticks are k * step, k whole, rounded to `decimals` digits. */
int report_ticks(double lo, double hi, int max_ticks, report_ticks_t *t);

/* Read a JSON-lines log. Blank lines are skipped; a first record of kind
 * "settings" gives the settings table; every object with a numeric "step"
 * is a step record (a step logged again after a resume replaces the earlier
 * records from that step on, and starts a new segment of the run). A last
 * line cut short is ignored with a note. Any other line that is not a JSON
 * object, and a step field that is neither a number nor null, is an error
 * naming the file, the line and the problem. Returns 0 and *out, or -1
 * with err. */
int report_load(const char *path, report_log_t **out, char *err, size_t errlen);
void report_free(report_log_t *log);

/* Number of step records, and notes gathered while reading (truncated
 * line, records ignored, resumes), one per line; "" when none. */
size_t report_steps(const report_log_t *log);
const char *report_notes(const report_log_t *log);

/* Segments of the run (1, plus one per resume) and the wall time they took
 * together: the sum over segments of each one's last elapsed_s (0 when the
 * log has none). */
size_t report_segments(const report_log_t *log);
double report_total_elapsed(const report_log_t *log);

/* Write the HTML page of nlogs runs (1..REPORT_MAX_RUNS), overlaid in every
 * plot. Fills plotted/missing (if not NULL) with the names of the plots
 * drawn and of the fields absent from every log, comma-separated. Returns
 * 0, or -1 with err on a write error or a bad nlogs. */
int report_write_html(report_log_t *const *logs, size_t nlogs, const report_opts_t *o, FILE *out, char *plotted,
                      size_t plotted_len, char *missing, size_t missing_len, char *err, size_t errlen);

#endif
