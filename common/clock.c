/* clock.c: see clock.h. */
#include "clock.h"

static struct timespec now_ts(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts;
}

double clock_now_s(void) {
    struct timespec ts = now_ts();
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t clock_now_ms(void) {
    struct timespec ts = now_ts();
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t clock_now_ns(void) {
    struct timespec ts = now_ts();
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int clock_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    int rc = pthread_condattr_init(&a);
    if (rc) return rc;
    rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (!rc) rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

struct timespec clock_after(double s) {
    struct timespec ts = now_ts();
    if (s < 0) s = 0;
    int64_t ns = (int64_t)(s * 1e9) + ts.tv_nsec;
    ts.tv_sec += (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    return ts;
}
