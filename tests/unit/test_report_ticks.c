/* test_report_ticks.c: report_ticks (workers/cli/report.h), the round value
 * labels of `ballast report`'s plots, on random ranges of every magnitude
 * and sign: the step is 1, 2 or 5 x 10^k, the ticks are its multiples in
 * [lo, hi], all of them, no more than asked for, and the step is the
 * smallest that fits (the next smaller one gives too many); the printed
 * labels (with `decimals` digits) read back as the ticks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/unit/helpers.h"
#include "workers/cli/report.h"

static uint64_t rng_state = 0x5eed2026ull;
static double unif(void) { return (double)(th_xorshift64s(&rng_state) >> 11) / 9007199254740992.0; }

/* the 1-2-5 sequence around a step: m x 10^e with m in {1, 2, 5} */
static int mantissa(double step, int *e) {
    *e = (int)floor(log10(step) + 1e-9);
    double m = step / pow(10, *e);
    for (int k = 1; k <= 5; k++)
        if (fabs(m - k) < 1e-9 * k) return k;
    return 0;
}
static double smaller_step(double step) {
    int e, m = mantissa(step, &e);
    return m == 1 ? 5 * pow(10, e - 1) : m == 2 ? pow(10, e) : 2 * pow(10, e);
}
static long multiples_in(double lo, double hi, double step) {
    double tol = 1e-9;
    return (long)(floor(hi / step + tol) - ceil(lo / step - tol) + 1);
}

static void check_range(double lo, double hi, int max) {
    report_ticks_t t;
    cr_assert_eq(report_ticks(lo, hi, max, &t), 0, "[%g, %g] max %d refused", lo, hi, max);
    int e, m = mantissa(t.step, &e);
    cr_assert(m == 1 || m == 2 || m == 5, "[%.17g, %.17g]: step %.17g is not 1, 2 or 5 x 10^k", lo, hi, t.step);
    cr_assert(t.n >= 1 && t.n <= max, "[%.17g, %.17g]: %d ticks for at most %d", lo, hi, t.n, max);
    if (max >= 5) cr_assert(t.n >= 2, "[%.17g, %.17g] max %d: only %d tick", lo, hi, max, t.n);
    double eps = 1e-9 * t.step;
    cr_assert(t.v[0] >= lo - eps && t.v[0] - t.step < lo + eps, "[%.17g, %.17g]: first tick %.17g (step %g) is not "
              "the first multiple in the range", lo, hi, t.v[0], t.step);
    cr_assert(t.v[t.n - 1] <= hi + eps && t.v[t.n - 1] + t.step > hi - eps, "[%.17g, %.17g]: last tick %.17g (step "
              "%g) is not the last multiple", lo, hi, t.v[t.n - 1], t.step);
    for (int i = 0; i < t.n; i++) {
        double k = t.v[i] / t.step;
        cr_assert(fabs(k - round(k)) < 1e-6, "[%g, %g]: tick %.17g is not a multiple of %g", lo, hi, t.v[i], t.step);
        if (i) cr_assert(fabs(t.v[i] - t.v[i - 1] - t.step) <= 1e-6 * t.step, "[%g, %g]: ticks %.17g, %.17g are not %g "
                         "apart", lo, hi, t.v[i - 1], t.v[i], t.step);
        char lab[64];
        snprintf(lab, sizeof lab, "%.*f", t.decimals, t.v[i]);
        cr_assert(fabs(strtod(lab, NULL) - t.v[i]) <= 1e-9 * t.step, "tick %.17g printed as %s", t.v[i], lab);
        cr_assert(t.v[i] < 0 || (strcmp(lab, "-0") != 0 && strncmp(lab, "-0.", 3) != 0), "tick %.17g printed as %s",
                  t.v[i], lab);
        /* the label has no more digits than the step needs */
        const char *dot = strchr(lab, '.');
        int want = e < 0 ? -e : 0;
        cr_assert_eq(dot ? (int)strlen(dot + 1) : 0, want, "tick %.17g (step %g) printed as %s", t.v[i], t.step, lab);
    }
    /* the smallest such step: the one before it in 1-2-5 gives too many */
    double s2 = smaller_step(t.step);
    cr_assert(multiples_in(lo, hi, s2) > max, "[%.17g, %.17g] max %d: step %g would do with %ld ticks, %g chosen", lo,
              hi, max, s2, multiples_in(lo, hi, s2), t.step);
}

Test(report_ticks, random_ranges) {
    rng_state = th_seed((uint64_t)time(NULL));
    cr_log_info("seed %llu (BALLAST_TEST_SEED repeats it)", (unsigned long long)rng_state);
    for (int it = 0; it < 20000; it++) {
        double mag = pow(10, -9 + 21 * unif());           /* 1e-9 .. 1e12 */
        double a = (unif() * 2 - 1) * mag, span = mag * pow(10, -3 * unif()) * (0.01 + unif());
        if (unif() < 0.3) a = fabs(a);                    /* plenty of non-negative ranges */
        if (unif() < 0.1) a = 0;                          /* ranges from 0 */
        int max = 3 + (int)(unif() * (REPORT_MAX_TICKS - 2));
        check_range(a, a + span, max > REPORT_MAX_TICKS ? REPORT_MAX_TICKS : max);
    }
}

Test(report_ticks, the_figures_of_the_issue) {
    /* the axis that printed 6.54 / 5.104 / 3.668: loss from about 3.3 to 6.9 */
    report_ticks_t t;
    cr_assert_eq(report_ticks(3.3, 6.9, 6, &t), 0);
    cr_assert(t.step == 1 && t.n == 3 && t.v[0] == 4 && t.v[2] == 6, "step %g n %d first %g", t.step, t.n, t.v[0]);
    check_range(3.3, 6.9, 6);
    check_range(0, 0.00063, 6);   /* a learning-rate warm-up */
    check_range(1, 300, 6);       /* steps */
}

Test(report_ticks, degenerate_and_bad_arguments) {
    report_ticks_t t;
    cr_assert_eq(report_ticks(2.5, 2.5, 6, &t), 0);
    cr_assert(t.n == 1 && t.v[0] == 2.5);
    cr_assert_eq(report_ticks(2, 1, 6, &t), -1, "lo > hi refused");
    cr_assert_eq(report_ticks(NAN, 1, 6, &t), -1, "NaN refused");
    cr_assert_eq(report_ticks(0, INFINITY, 6, &t), -1, "infinity refused");
    cr_assert_eq(report_ticks(0, 1, 2, &t), -1, "fewer than 3 ticks refused");
    cr_assert_eq(report_ticks(0, 1, REPORT_MAX_TICKS + 1, &t), -1, "more than REPORT_MAX_TICKS refused");
}
