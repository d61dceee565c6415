/* report.h: read a run's JSON log (--log-json) and render one self-contained
 * HTML page: a summary, inline SVG plots (loss with the corpus entropy
 * floor, tokens/s, MFU, memory, offload traffic, step time split) and the
 * run's settings. No scripts, fonts or anything fetched from elsewhere.
 *
 * Plot scaling (what tests/integration/report.sh inverts): each plot's
 * data area is REPORT_PLOT_X0, REPORT_PLOT_Y0, REPORT_PLOT_W x REPORT_PLOT_H
 * in SVG user units. x = X0 + W * (step - first) / (last - first) over the
 * steps that have the plot's field; y = Y0 + H * (ymax - v) / (ymax - ymin)
 * with [ymin, ymax] the range of the plotted values (and the entropy floor
 * on the loss plot) widened by 5% of its span on both sides (by 5% of |v|,
 * or 1, when the span is 0). Values are plotted as logged (bytes, ratios,
 * seconds); axis labels carry the units. Coordinates are written with 3
 * decimals. A run of more than REPORT_MAX_POINTS steps is thinned to every
 * k-th step plus the last. */
#ifndef BALLAST_REPORT_H
#define BALLAST_REPORT_H

#include <stddef.h>
#include <stdio.h>

#define REPORT_PLOT_X0 70.0
#define REPORT_PLOT_Y0 20.0
#define REPORT_PLOT_W 620.0
#define REPORT_PLOT_H 200.0
#define REPORT_MAX_POINTS 4000

typedef struct report_log report_log_t;

typedef struct {
    const char *title;    /* page title; NULL = "ballast run: FILE" */
    double entropy_nats;  /* floor line on the loss plot; NaN = the log's settings record, if any */
} report_opts_t;

/* Read a JSON-lines log. Blank lines are skipped; a first record of kind
 * "settings" gives the settings table; every object with a numeric "step"
 * is a step record (a step logged again after a resume replaces the earlier
 * records from that step on). A last line cut short is ignored with a note.
 * Any other line that is not a JSON object is an error naming the file and
 * the line. Returns 0 and *out, or -1 with err. */
int report_load(const char *path, report_log_t **out, char *err, size_t errlen);
void report_free(report_log_t *log);

/* Number of step records, and notes gathered while reading (truncated
 * line, records ignored), one per line; "" when none. */
size_t report_steps(const report_log_t *log);
const char *report_notes(const report_log_t *log);

/* Write the HTML page. Fills plotted/missing (if not NULL) with the names of
 * the plots drawn and of the fields absent from the log, comma-separated.
 * Returns 0, or -1 with err on a write error. */
int report_write_html(const report_log_t *log, const report_opts_t *o, FILE *out, char *plotted, size_t plotted_len,
                      char *missing, size_t missing_len, char *err, size_t errlen);

#endif
