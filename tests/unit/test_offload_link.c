/* test_offload_link.c: the worker's offload metrics (workers/offload/link.h):
 * names, labels and values of ballast_offload_bytes_total{rank, direction}
 * and ballast_offload_wait_seconds_total{rank} after random byte counts,
 * sharing the bytes family that workers/train/progress.c registers with the same
 * labels, and per-rank series kept apart. No ballastd is needed: the
 * accounting does not touch the session. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "workers/offload/link.h"
#include "tests/unit/helpers.h"

static uint64_t rng_state = 0x5eed0ff10adull;
static uint64_t rnd(void) { return th_splitmix64(&rng_state); }

/* The value of the sample line starting with `series ` in the exposition, or -1. */
static double sample(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    return -1;
}

Test(offload_link, byte_counters_by_direction_with_the_rank_label) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    /* a worker's registry carries rank="N" on every series */
    cr_assert_eq(metrics_set_const_label(r, "rank", "3", err, sizeof err), 0, "%s", err);
    /* progress.c's family, registered first with the same labels */
    const char *labels[] = { "direction" };
    cr_assert_not_null(metrics_register(r, METRIC_COUNTER, "ballast_offload_bytes_total", "bytes", labels, 1, NULL, 0,
                                        err, sizeof err), "%s", err);
    /* two links of one process count into the same series */
    offload_link_t a = { .rank = 3 }, b = { .rank = 3 };
    offload_link_metrics(&a, r);
    offload_link_metrics(&b, r);
    cr_assert(a.m_to && a.m_from && a.m_wait && b.m_to && b.m_from && b.m_wait);
    uint64_t to_a = 0, from_a = 0, to_b = 0;
    for (int i = 0; i < 200; i++) {
        uint64_t x = rnd() % 1000003 + 1, y = rnd() % 65537;
        offload_link_count(&a, x, y);
        to_a += x;
        from_a += y;
        uint64_t z = rnd() % 4099 + 1;
        offload_link_count(&b, z, 0);
        to_b += z;
    }
    cr_assert_eq(a.to_service, to_a);
    cr_assert_eq(a.from_service, from_a);
    cr_assert_eq(b.to_service, to_b);
    cr_assert_eq(b.from_service, 0);
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(metrics_render(r, &text, &len), 0);
    cr_assert_eq(sample(text, "ballast_offload_bytes_total{rank=\"3\",direction=\"to_service\"}"), (double)(to_a + to_b), "%s", text);
    cr_assert_eq(sample(text, "ballast_offload_bytes_total{rank=\"3\",direction=\"from_service\"}"), (double)from_a, "%s", text);
    cr_assert_eq(sample(text, "ballast_offload_wait_seconds_total{rank=\"3\"}"), 0.0, "%s", text);
    cr_assert_not_null(strstr(text, "# TYPE ballast_offload_wait_seconds_total counter"), "%s", text);
    free(text);
    metrics_registry_free(r);
}

Test(offload_link, open_refuses_a_bad_job_name_without_contacting_anyone) {
    offload_link_t l;
    char err[512];
    cr_assert_eq(offload_link_open(&l, "unix:/nonexistent/x.sock", NULL, "bad/job", NULL, 0, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, "--offload-job 'bad/job'"), "%s", err);
    cr_assert_null(l.c);
}

Test(offload_link, unreachable_service_names_the_socket_and_the_fix) {
    offload_link_t l;
    char err[2048], path[64];
    snprintf(path, sizeof path, "unix:/tmp/ballast-no-such-%llu.sock", (unsigned long long)(rnd() % 1000000000));
    cr_assert_eq(offload_link_open(&l, path, NULL, "job-1", NULL, 2, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, path + 5), "%s", err);
    cr_assert_not_null(strstr(err, "--offload-socket"), "%s", err);
    cr_assert_not_null(strstr(err, "ballastd --socket PATH"), "%s", err);
}
