/* test_offload_link.c: the worker's link to ballastd (workers/offload/link.h).
 *
 * Its metrics: names, labels and values of
 * ballast_offload_bytes_total{rank, direction} and
 * ballast_offload_wait_seconds_total{rank} after random byte counts,
 * sharing the bytes family that workers/train/progress.c registers with the
 * same labels, and per-rank series kept apart (no ballastd needed: the
 * accounting does not touch the session).
 *
 * Its wait accounting, the exposed offload waits: a backend copy that is
 * still running when the host waits for it (a test double whose copies
 * take a set time) must add at least the time the host blocked, to the
 * counter and the metric; a copy found done must add nothing. Against an
 * in-process ballastd (store, sessions and gRPC server on a Unix socket
 * under /tmp): a synchronous commit and waits for gets that block are
 * counted, polls (timeout 0) never. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "rpc.h"
#include "services/offload/rpc_service.h"
#include "services/offload/session.h"
#include "services/offload/store.h"
#include "workers/backend/backend.h"
#include "workers/offload/link.h"
#include "tests/unit/helpers.h"
#include "tests/unit/ballastd_fixture.h"

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

/* ---- wait accounting: a backend whose copies take time ---- */

/* A copy of this double: done once the clock passes ready_at (the bytes are
 * copied at once; only the completion is late, like a DMA still running). */
struct be_xfer {
    double ready_at;           /* clock_now_s() when the copy is done */
};

static double g_delay;         /* seconds the next copy takes */
static int g_open;             /* handles not yet waited for */

static struct be_xfer *slow_xfer(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
    struct be_xfer *x = malloc(sizeof *x);
    cr_assert_not_null(x);
    x->ready_at = clock_now_s() + g_delay;
    g_open++;
    return x;
}
static bool slow_done(struct be_xfer *x) { return clock_now_s() >= x->ready_at; }
static void slow_order(struct be_xfer *x) { (void)x; }
/* Blocks until the copy is done, then ends the handle. */
static void slow_wait(struct be_xfer *x) {
    for (double left; (left = x->ready_at - clock_now_s()) > 0;) {
        struct timespec ts = { (time_t)left, (long)((left - (double)(time_t)left) * 1e9) + 1 };
        nanosleep(&ts, NULL);
    }
    free(x);
    g_open--;
}
static size_t slow_pending(void) { return (size_t)g_open; }

static backend_t slow_backend(void) {
    backend_t be = *backend_cpu(1);
    be.xfer_to_host = slow_xfer;
    be.xfer_from_host = slow_xfer;
    be.xfer_order = slow_order;
    be.xfer_wait = slow_wait;
    be.xfer_done = slow_done;
    be.xfer_pending = slow_pending;
    return be;
}

/* A registry with rank="<rank>" on every series, and l's series in it. */
static metrics_registry_t *link_registry(offload_link_t *l, const char *rank) {
    char err[METRICS_ERR_LEN];
    metrics_registry_t *r = metrics_registry_new();
    cr_assert_eq(metrics_set_const_label(r, "rank", rank, err, sizeof err), 0, "%s", err);
    offload_link_metrics(l, r);
    cr_assert_not_null(l->m_wait);
    return r;
}

/* The exposed-wait metric of r (the sum over its series). */
static double wait_metric(metrics_registry_t *r) {
    return metrics_sum(r, "ballast_offload_wait_seconds_total", NULL, NULL);
}

Test(offload_link, a_blocking_copy_wait_counts_the_time_blocked_and_a_finished_copy_nothing) {
    offload_link_t l = { .rank = 1 };
    metrics_registry_t *r = link_registry(&l, "1");
    backend_t be = slow_backend();
    float src[512], dst[512];
    for (int i = 0; i < 512; i++) src[i] = (float)(rnd() % 100000) / 7.f;

    /* copies still running: the host blocks, and at least that long is counted */
    double blocked = 0, spent = 0;
    for (int i = 0; i < 4; i++) {
        g_delay = 0.02 + (double)(rnd() % 40) * 1e-3;   /* 20..59 ms */
        be_xfer_t *x = be_xfer_to_host(&be, dst, src, sizeof src);
        double before = l.wait_s, t0 = clock_now_s(), ready = x->ready_at;
        cr_assert(!be_xfer_done(&be, x));
        offload_link_xfer_wait(&l, &be, &x);
        double t1 = clock_now_s(), added = l.wait_s - before;
        cr_assert_null(x, "the handle is ended");
        cr_assert_geq(added, ready - t0, "copy %d: the host blocked %.4f s for it but %.4f s were counted", i,
                      ready - t0, added);
        cr_assert_leq(added, t1 - t0, "copy %d: %.4f s counted for a call of %.4f s", i, added, t1 - t0);
        blocked += ready - t0;
        spent += t1 - t0;
    }
    cr_assert_eq(memcmp(src, dst, sizeof src), 0);
    cr_assert_geq(l.wait_s, blocked);
    cr_assert_leq(l.wait_s, spent);
    cr_assert_float_eq(wait_metric(r), l.wait_s, 1e-9, "metric %.6f s, counter %.6f s", wait_metric(r), l.wait_s);

    /* copies done by the time the host asks: nothing is counted */
    double counted = l.wait_s;
    g_delay = 0;
    for (int i = 0; i < 8; i++) {
        be_xfer_t *x = be_xfer_from_host(&be, dst, src, sizeof src);
        cr_assert(be_xfer_done(&be, x));
        offload_link_xfer_wait(&l, &be, &x);
        cr_assert_null(x);
    }
    be_xfer_t *none = NULL;
    offload_link_xfer_wait(&l, &be, &none);   /* a complete (NULL) copy */
    cr_assert_eq(l.wait_s, counted, "finished copies added %.9f s of exposed wait", l.wait_s - counted);
    cr_assert_float_eq(wait_metric(r), counted, 1e-9);
    cr_assert_eq(g_open, 0, "%d copy handles never ended", g_open);
    metrics_registry_free(r);
}

/* ---- wait accounting: an in-process ballastd ---- */

static void svc_start(svc_t *t) { svc_start_with(t, "link", 30, 4, 0); }

Test(offload_link, service_waits_that_block_are_counted_and_polls_never) {
    svc_t t;
    svc_start(&t);
    offload_link_t l;
    char err[1024];
    cr_assert_eq(offload_link_open(&l, t.addr, NULL, "unit-link", NULL, 4, err, sizeof err), 0, "%s", err);
    cr_assert(offload_link_is_shared(&l));
    metrics_registry_t *r = link_registry(&l, "4");
    enum { N = 3000 };
    uint8_t data[N];
    for (int i = 0; i < N; i++) data[i] = (uint8_t)rnd();
    oc_key_t k = { .rank = 4, .kind = OC_KIND_ACTIVATION, .index = 3, .step = 1 };

    /* a synchronous commit blocks on the service: counted */
    double t0 = clock_now_s();
    cr_assert_eq(offload_link_put(&l, &k, data, N, false, err, sizeof err), 0, "%s", err);
    double t1 = clock_now_s();
    cr_assert_gt(l.wait_s, 0, "the commit of a put was not counted");
    cr_assert_leq(l.wait_s, t1 - t0);
    cr_assert_eq(l.to_service, N);

    /* polls take the completion when it is there and never count */
    double counted = l.wait_s;
    oc_handle_t h = 0;
    oc_buf_t b;
    cr_assert_eq(offload_link_get_async(&l, &k, &h, "fetching", err, sizeof err), 0, "%s", err);
    int got = 0, polls = 0;
    for (; polls < 2000 && !(got = offload_link_poll(&l, &h, &b, "fetching", err, sizeof err)); polls++)
        nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
    cr_assert_eq(got, 1, "no completion after %d polls: %s", polls, err);
    cr_assert_eq(h, 0, "a completed handle is cleared");
    cr_assert_eq(b.len, N);
    cr_assert_eq(memcmp(b.ptr, data, N), 0);
    cr_assert_eq(offload_link_get_done(&l, &k, &b, "releasing", err, sizeof err), 0, "%s", err);
    cr_assert_eq(l.wait_s, counted, "%d polls added %.9f s of exposed wait", polls + 1, l.wait_s - counted);
    cr_assert_eq(offload_link_poll(&l, &h, NULL, "fetching", err, sizeof err), 1, "nothing in flight: done");
    cr_assert_eq(offload_link_wait(&l, &h, NULL, "fetching", err, sizeof err), 0, "nothing in flight: no wait");
    cr_assert_eq(l.wait_s, counted);

    /* waits for gets issued just before: the service has to wake up and
     * answer, so the host blocks (nearly always; one in 20 is required) and
     * what it blocked is counted, never more than the call took */
    int blocked = 0;
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(offload_link_get_async(&l, &k, &h, "fetching", err, sizeof err), 0, "%s", err);
        double before = l.wait_s, a = clock_now_s();
        cr_assert_eq(offload_link_wait(&l, &h, &b, "fetching", err, sizeof err), 0, "%s", err);
        double took = clock_now_s() - a, added = l.wait_s - before;
        cr_assert_eq(h, 0);
        cr_assert_geq(added, 0);
        cr_assert_leq(added, took, "wait %d: %.6f s counted for a call of %.6f s", i, added, took);
        blocked += added > 0;
        cr_assert_eq(b.len, N);
        cr_assert_eq(offload_link_get_done(&l, &k, &b, "releasing", err, sizeof err), 0, "%s", err);
    }
    cr_assert_gt(blocked, 0, "none of 20 waits for a get just issued was counted as exposed wait");
    cr_assert_float_eq(wait_metric(r), l.wait_s, 1e-9, "metric %.6f s, counter %.6f s", wait_metric(r), l.wait_s);

    /* a failed request names what it was for; a missing key is no error to free */
    cr_assert_eq(offload_link_free(&l, &k, err, sizeof err), 0, "%s", err);
    cr_assert_eq(offload_link_free(&l, &k, err, sizeof err), 0, "%s", err);
    cr_assert_eq(offload_link_get_async(&l, &k, &h, "fetching a block input", err, sizeof err), 0, "%s", err);
    cr_assert_eq(offload_link_wait(&l, &h, &b, "fetching a block input", err, sizeof err), -1);
    cr_assert_eq(h, 0, "a failed handle is cleared");
    cr_assert(!strncmp(err, "fetching a block input: ", 24), "%s", err);
    uint64_t len = 0;
    cr_assert_eq(offload_link_get_copy(&l, &k, data, N, &len, "reading", err, sizeof err), 0, "a missing blob: 0");

    offload_link_close(&l);
    metrics_registry_free(r);
    svc_stop(&t);
}
