/* test_backend_xfer.c: the backend's asynchronous copies (backend.h xfer
 * ops): at once on the CPU backend, deferred on its staged test double
 * (tests/lib/backend_staged.h).
 *
 * At once: the data is there when the call returns and the handle is NULL.
 * Deferred: nothing moves until xfer_order or
 * xfer_wait of that handle or a later one; then every earlier copy runs in
 * queue order, with the source as it is at that moment (the latest a GPU
 * copy stream could read it). Inputs are seeded random floats. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/backend_staged.h"
#include "workers/backend/backend.h"

#define N 4099

static const backend_t *be;
static void setup(void) { be = backend_cpu(1); }
static void teardown(void) {}

static void fill(float *x, size_t n, unsigned seed) {
    srand(seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)rand() / (float)RAND_MAX * 2.f - 1.f + 1e-3f;
}

Test(backend_xfer, immediate_copies_are_complete, .init = setup, .fini = teardown) {
    float *dev = be->alloc(N * sizeof(float)), *host = calloc(N, sizeof(float)), *src = malloc(N * sizeof(float));
    fill(src, N, 1);
    be_xfer_t *x = be_xfer_from_host(be, dev, src, N * sizeof(float));
    cr_expect_null(x, "an immediate copy returns a complete (NULL) handle");
    cr_expect(be_xfer_done(be, x));
    be_xfer_t *y = be_xfer_to_host(be, host, dev, N * sizeof(float));
    cr_expect_null(y);
    cr_expect(memcmp(host, src, N * sizeof(float)) == 0, "round trip through backend memory changed bits");
    be_xfer_wait(be, y);
    be_xfer_wait(be, x);
    be->free(dev);
    free(host);
    free(src);
}

Test(backend_xfer, deferred_copies_run_at_order_or_wait_in_queue_order, .init = setup, .fini = teardown) {
    be = backend_staged(1);
    cr_expect(!be->host_memory, "the staged double keeps the host out of its memory");
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float)), *ref = malloc(N * sizeof(float));
    float *d1 = be->alloc(N * sizeof(float)), *d2 = be->alloc(N * sizeof(float));
    float *h = calloc(N, sizeof(float));
    fill(a, N, 2);
    fill(b, N, 3);
    be_xfer_t *x1 = be_xfer_from_host(be, d1, a, N * sizeof(float));
    be_xfer_t *x2 = be_xfer_from_host(be, d2, b, N * sizeof(float));
    cr_assert_not_null(x1);
    cr_assert_not_null(x2);
    cr_expect_eq(be_xfer_pending(be), 2);
    cr_expect(!be_xfer_done(be, x1), "a deferred copy is not done before its order or wait");
    cr_expect_eq(d1[7], 0.f, "a deferred copy moved data before its order or wait");
    /* the source changes before the copy runs: the copy sees the new bits */
    a[7] += 1.f;
    memcpy(ref, a, N * sizeof(float));
    be_xfer_order(be, x1);
    cr_expect(be_xfer_done(be, x1));
    cr_expect(!be_xfer_done(be, x2), "ordering after one copy ran a later one");
    cr_expect(memcmp(d1, ref, N * sizeof(float)) == 0);
    cr_expect_eq(d2[5], 0.f);
    cr_expect_eq(be_xfer_pending(be), 1);
    /* a later handle's wait runs everything queued before it */
    be_xfer_t *x3 = be_xfer_to_host(be, h, d2, N * sizeof(float));
    be_xfer_wait(be, x3);
    cr_expect(be_xfer_done(be, x2));
    cr_expect(memcmp(h, b, N * sizeof(float)) == 0, "the to_host copy ran before the from_host it follows");
    cr_expect_eq(be_xfer_pending(be), 0);
    be_xfer_wait(be, x1);
    be_xfer_wait(be, x2);
    be->free(d1);
    be->free(d2);
    free(a);
    free(b);
    free(ref);
    free(h);
}

Test(backend_xfer, tables_without_xfer_ops_copy_synchronously, .init = setup, .fini = teardown) {
    backend_t t = *be;
    t.xfer_to_host = NULL;
    t.xfer_from_host = NULL;
    t.xfer_order = NULL;
    t.xfer_wait = NULL;
    t.xfer_done = NULL;
    float *src = malloc(N * sizeof(float)), *dev = t.alloc(N * sizeof(float));
    fill(src, N, 4);
    be_xfer_t *x = be_xfer_from_host(&t, dev, src, N * sizeof(float));
    cr_expect_null(x);
    cr_expect(memcmp(dev, src, N * sizeof(float)) == 0);
    cr_expect_null(be_stream(&t), "the CPU backend has no stream");
    t.free(dev);
    free(src);
}

/* The bf16 gradient ops (--grad-reduce-dtype bf16): rounding to nearest,
 * ties to even, against a reference built from frexp/rint in double (8
 * significant bits), on random normal floats of many magnitudes plus exact
 * ties; acc_bf16 adds the widened values, from_bf16 overwrites. */
#include <math.h>

static double bf16_ref(float x) {
    int e;
    double m = frexp((double)x, &e);        /* x = m * 2^e, 0.5 <= |m| < 1 */
    return ldexp(rint(m * 256.0), e - 8);   /* default rounding: ties to even */
}

Test(backend_xfer, bf16_gradient_ops_round_to_nearest_even, .init = setup, .fini = teardown) {
    enum { M = 5000 };
    float *x = malloc(M * sizeof(float)), *y = malloc(M * sizeof(float)), *w = malloc(M * sizeof(float));
    uint16_t *b = malloc(M * sizeof(uint16_t));
    srand(11);
    for (int i = 0; i < M; i++) {
        double u = (double)rand() / RAND_MAX, s = rand() % 2 ? 1 : -1;
        x[i] = (float)(s * (0.5 + u) * pow(2.0, rand() % 60 - 30));
    }
    /* exact ties: 1 + 2^-8 (between 1 and 1 + 2^-7: even is 1) and 1 + 3 * 2^-8 (even is 1 + 2^-6) */
    x[0] = 1.f + 1.f / 256.f;
    x[1] = 1.f + 3.f / 256.f;
    be->to_bf16(b, x, M);
    be->from_bf16(w, b, M);
    int bad = 0;
    for (int i = 0; i < M && bad < 5; i++)
        if ((double)w[i] != bf16_ref(x[i])) {
            cr_log_error("element %d: %.9g -> %.9g, reference %.9g", i, x[i], w[i], bf16_ref(x[i]));
            bad++;
        }
    cr_expect_eq(bad, 0);
    cr_expect_eq(w[0], 1.f, "tie 1 + 2^-8 rounds to even (1)");
    cr_expect_eq(w[1], 1.f + 1.f / 64.f, "tie 1 + 3 * 2^-8 rounds to even (1 + 2^-6)");
    for (int i = 0; i < M; i++) y[i] = x[M - 1 - i];
    be->acc_bf16(y, b, M);
    for (int i = 0; i < M; i++)
        if (y[i] != x[M - 1 - i] + w[i]) { cr_expect_fail("acc_bf16 element %d", i); break; }
    free(x), free(y), free(w), free(b);
}
