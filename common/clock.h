/* clock.h: the one monotonic clock of the tree (CLOCK_MONOTONIC), in the
 * units callers need: seconds for timings and timeouts, milliseconds and
 * nanoseconds for deadlines and leases. */
#ifndef BALLAST_CLOCK_H
#define BALLAST_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Seconds since an arbitrary fixed point (monotonic, never jumps). */
double clock_now_s(void);
/* The same in milliseconds and nanoseconds. */
int64_t clock_now_ms(void);
int64_t clock_now_ns(void);
/* The CLOCK_MONOTONIC time `s` seconds from now, as a timespec for waits
 * on a monotonic clock (pthread_condattr_setclock, sem_clockwait). */
struct timespec clock_after(double s);
/* pthread_cond_init on this clock, so that pthread_cond_timedwait takes
 * clock_after() deadlines and a change of the wall clock moves no wait.
 * 0 or an errno. */
int clock_cond_init(pthread_cond_t *cv);

#endif
