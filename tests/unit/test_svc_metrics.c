/* test_svc_metrics.c: ballastd's metric families (services/offload/
 * svc_metrics.h): names and types, the sample mirrored at every scrape,
 * totals that never go down, and unhooking on free. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "services/offload/svc_metrics.h"
#include "tests/unit/helpers.h"

typedef struct {
    svc_metrics_sample_t s;
    int reads;
} fake_t;

static void read_fake(void *arg, svc_metrics_sample_t *out) {
    fake_t *f = arg;
    f->reads++;
    *out = f->s;
}

static uint64_t rng = 777;
static uint64_t rnd(void) { return th_lcg64(&rng) >> 24; } /* < 2^40: exact in a double */

static void expect_line(const char *t, const char *name, uint64_t v) {
    char want[256];
    snprintf(want, sizeof want, "\n%s %llu\n", name, (unsigned long long)v);
    cr_assert(strstr(t, want), "no '%s %llu' in\n%s", name, (unsigned long long)v, t);
}

Test(svc_metrics, families_mirror_the_sample) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    fake_t f = { 0 };
    svc_metrics_t *m = svc_metrics_init(r, read_fake, &f, err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    const char *types[][2] = {
        { "ballast_pool_used_bytes", "gauge" }, { "ballast_pool_capacity_bytes", "gauge" },
        { "ballast_spill_used_bytes", "gauge" }, { "ballast_blobs", "gauge" }, { "ballast_sessions", "gauge" },
        { "ballast_spill_bytes_total", "counter" }, { "ballast_spill_read_bytes_total", "counter" },
        { "ballast_evictions_total", "counter" }, { "ballast_crc_errors_total", "counter" },
        { "ballast_spill_ahead_writes_total", "counter" }, { "ballast_quota_refusals_total", "counter" }, { "ballast_offload_bytes_total", "counter" },
    };
    svc_metrics_sample_t hi = { 0 }; /* the highest totals seen */
    for (int round = 0; round < 4; round++) {
        svc_metrics_sample_t *s = &f.s;
        s->pool_used_bytes = rnd(); s->pool_capacity_bytes = rnd(); s->spill_used_bytes = rnd();
        s->blobs = rnd() % 100000; s->sessions = rnd() % 64;
        uint64_t *tot[] = { &s->put_bytes, &s->get_bytes, &s->spill_write_bytes, &s->spill_read_bytes,
                            &s->evictions, &s->crc_errors, &s->quota_refusals, &s->ahead_writes };
        uint64_t *his[] = { &hi.put_bytes, &hi.get_bytes, &hi.spill_write_bytes, &hi.spill_read_bytes,
                            &hi.evictions, &hi.crc_errors, &hi.quota_refusals, &hi.ahead_writes };
        for (int i = 0; i < 8; i++) {
            if (round == 2 && i % 2) *tot[i] /= 3; /* a total going down (a restarted part): the counter holds */
            else *tot[i] += rnd();
            if (*tot[i] > *his[i]) *his[i] = *tot[i];
        }
        char *t = NULL;
        cr_assert_eq(metrics_render(r, &t, NULL), 0);
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            char want[128];
            snprintf(want, sizeof want, "# TYPE %s %s\n", types[i][0], types[i][1]);
            cr_assert(strstr(t, want), "no %s", want);
        }
        expect_line(t, "ballast_pool_used_bytes", s->pool_used_bytes);
        expect_line(t, "ballast_pool_capacity_bytes", s->pool_capacity_bytes);
        expect_line(t, "ballast_spill_used_bytes", s->spill_used_bytes);
        expect_line(t, "ballast_blobs", s->blobs);
        expect_line(t, "ballast_sessions", s->sessions);
        expect_line(t, "ballast_offload_bytes_total{direction=\"to_host\"}", hi.put_bytes);
        expect_line(t, "ballast_offload_bytes_total{direction=\"to_device\"}", hi.get_bytes);
        expect_line(t, "ballast_spill_bytes_total", hi.spill_write_bytes);
        expect_line(t, "ballast_spill_read_bytes_total", hi.spill_read_bytes);
        expect_line(t, "ballast_evictions_total", hi.evictions);
        expect_line(t, "ballast_spill_ahead_writes_total", hi.ahead_writes);
        expect_line(t, "ballast_crc_errors_total", hi.crc_errors);
        expect_line(t, "ballast_quota_refusals_total", hi.quota_refusals);
        free(t);
    }
    cr_assert_eq(f.reads, 4, "one read per scrape");
    svc_metrics_free(m);
    char *t = NULL;
    metrics_render(r, &t, NULL);
    free(t);
    cr_assert_eq(f.reads, 4, "no read after svc_metrics_free");
    metrics_registry_free(r);
}

Test(svc_metrics, offload_series_present_from_the_start) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    fake_t f = { 0 };
    f.s.pool_capacity_bytes = 1 << 20;
    svc_metrics_t *m = svc_metrics_init(r, read_fake, &f, err, sizeof err);
    cr_assert_not_null(m, "%s", err);
    char *t = NULL;
    metrics_render(r, &t, NULL);
    cr_assert(strstr(t, "# TYPE ballast_offload_bytes_total counter\n"), "%s", t);
    cr_assert(strstr(t, "\nballast_offload_bytes_total{direction=\"to_host\"} 0\n"), "%s", t);
    cr_assert(strstr(t, "\nballast_offload_bytes_total{direction=\"to_device\"} 0\n"), "%s", t);
    free(t);
    uint64_t g = 4096 * (1 + rnd() % 1000);
    f.s.get_bytes = g;
    metrics_render(r, &t, NULL);
    cr_assert(strstr(t, "\nballast_offload_bytes_total{direction=\"to_host\"} 0\n"), "%s", t);
    expect_line(t, "ballast_offload_bytes_total{direction=\"to_device\"}", g);
    free(t);
    svc_metrics_free(m);
    metrics_registry_free(r);
}

Test(svc_metrics, bad_arguments) {
    char err[METRICS_ERR_LEN];
    cr_assert_null(svc_metrics_init(NULL, read_fake, NULL, err, sizeof err));
    metrics_registry_t *r = metrics_registry_new();
    cr_assert_null(svc_metrics_init(r, NULL, NULL, err, sizeof err));
    cr_assert(strstr(err, "read function"), "%s", err);
    /* a worker-style family of the same name with other labels is a conflict, named */
    metrics_register(r, METRIC_COUNTER, "ballast_offload_bytes_total", "x", (const char *[]){ "rank", "direction" }, 2,
                     NULL, 0, err, sizeof err);
    fake_t f = { 0 };
    cr_assert_null(svc_metrics_init(r, read_fake, &f, err, sizeof err));
    cr_assert(strstr(err, "ballast_offload_bytes_total") && strstr(err, "already registered"), "%s", err);
    metrics_registry_free(r);
}
