/* tsan.h: telling ThreadSanitizer about an ordering it cannot see.
 *
 * Some hand-offs between threads go through code TSan does not instrument:
 * Debian's libgrpc (a tag given to grpc_call_start_batch comes back from a
 * completion queue on another thread) or the kernel (an io_uring SQE's
 * user_data comes back in a CQE). What the first thread did before the
 * hand-off is ordered before what the second does after it, but TSan would
 * report it as a race. TSAN_RELEASE(p) at the hand-off and TSAN_ACQUIRE(p)
 * where p comes back say so; outside a TSan build they are nothing. */
#ifndef BALLAST_TSAN_H
#define BALLAST_TSAN_H

#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TSAN_RELEASE(p) __tsan_release(p)
#define TSAN_ACQUIRE(p) __tsan_acquire(p)
#else
#define TSAN_RELEASE(p) ((void)(p))
#define TSAN_ACQUIRE(p) ((void)(p))
#endif

#endif
