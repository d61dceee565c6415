/* ring.c: see ring.h. SPSC ring in shared memory, eventfd doorbells.
 *
 * Memory ordering
 * ---------------
 * Data: the producer writes an entry with plain stores, then publishes it
 * with a release store of tail. The consumer reads tail with an acquire
 * load; every entry below that tail is therefore fully written when it
 * copies it out. The consumer then frees the slots with a release store of
 * head; the producer reads head with an acquire load before it reuses a
 * slot, so the consumer's copy-out happens before the slot is overwritten.
 * Each counter has exactly one writer, so no read-modify-write is needed.
 *
 * Wakeups (the store-buffer / Dekker pattern): a consumer about to sleep
 * does   store(cons_waiting = 1); load(tail)    and sleeps only if empty;
 * the producer does   store(tail); load(cons_waiting)   and notifies if 1.
 * All four are seq_cst, so they sit in one total order: if the consumer's
 * load of tail missed the new tail, that load precedes the producer's store
 * of tail, hence the consumer's flag store precedes the producer's flag
 * load, which then reads 1 and rings the doorbell. Either the consumer sees
 * the entry or the producer sees the flag; a wakeup cannot be lost. The
 * eventfd counts, so a notification that lands before poll() still makes
 * poll() return at once. The same argument covers prod_waiting / head.
 *
 * The flag says how the side sleeps: WAIT_FD (1) on the eventfd, for a
 * caller of ring_arm_* that polls many rings, or WAIT_FUTEX (2) on the flag
 * word itself, for ring_wait_* (one futex wait, where poll and the read that
 * drains the eventfd were two syscalls; the waker's FUTEX_WAKE replaces its
 * eventfd write). The waker swaps the flag to 0 and wakes the way the old
 * value says. A futex wake that lands before the sleeper's FUTEX_WAIT is not
 * lost either: the kernel sleeps only while the word still holds WAIT_FUTEX,
 * and the waker has already set it to 0. The word is in shared memory, so
 * the futex is a shared (not process-private) one; a peer that writes the
 * word can only cause early returns, and every wait has a timeout.
 * (seq_cst operations rather than fences: ThreadSanitizer does not model
 * atomic_thread_fence.)
 *
 * Trust: a side never trusts the counter the other side writes. It keeps
 * its own counter in ring_t and checks 0 <= tail - head <= capacity (32-bit
 * modular arithmetic) on every read of the other counter, before any entry
 * is touched; slot indexes are masked, so no access leaves the mapping. */
#include "ring.h"
#include "clock.h"
#include "errbuf.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

_Static_assert(sizeof(ring_hdr_t) == RING_HDR_BYTES, "ring header must be 4 cache lines");
_Static_assert(offsetof(ring_hdr_t, head) == 1 * RING_LINE, "head on line 1");
_Static_assert(offsetof(ring_hdr_t, tail) == 2 * RING_LINE, "tail on line 2");
_Static_assert(offsetof(ring_hdr_t, cons_waiting) == 3 * RING_LINE, "flags on line 3");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "ring needs lock-free 32-bit atomics in shared memory");


static bool is_pow2(uint32_t x) { return x && !(x & (x - 1)); }

/* Whether waits may spin: not on a machine with one online CPU, where the
 * peer cannot run while we spin. Computed once. */
static bool spin_allowed(void) {
    static _Atomic int allowed = -1;
    int a = atomic_load_explicit(&allowed, memory_order_relaxed);
    if (a < 0) {
        a = sysconf(_SC_NPROCESSORS_ONLN) > 1;
        atomic_store_explicit(&allowed, a, memory_order_relaxed);
    }
    return a;
}

/* ---- layout ---- */

size_t ring_bytes(uint32_t capacity, uint32_t entry_size) {
    if (!is_pow2(capacity) || capacity > RING_MAX_CAPACITY) return 0;
    if (entry_size < 8 || entry_size > RING_MAX_ENTRY || entry_size % 8) return 0;
    return RING_HDR_BYTES + (size_t)capacity * entry_size; /* <= 2^40, no overflow */
}

int ring_init(void *mem, size_t bytes, uint32_t capacity, uint32_t entry_size,
              char *err, size_t errlen) {
    size_t need = ring_bytes(capacity, entry_size);
    if (!mem || ((uintptr_t)mem % RING_LINE)) {
        errbuf_set(err, errlen, "ring_init: memory %p is not %u-byte aligned", mem, RING_LINE);
        return -EINVAL;
    }
    if (need == 0) {
        errbuf_set(err, errlen, "ring_init: capacity %u must be a power of two <= %u and entry size %u "
               "a multiple of 8 in [8, %u]", capacity, RING_MAX_CAPACITY, entry_size, RING_MAX_ENTRY);
        return -EINVAL;
    }
    if (bytes < need) {
        errbuf_set(err, errlen, "ring_init: %zu bytes given, a ring of %u x %u-byte entries needs %zu",
               bytes, capacity, entry_size, need);
        return -EINVAL;
    }
    ring_hdr_t *h = mem;
    memset(h, 0, RING_HDR_BYTES);
    h->version = RING_VERSION;
    h->capacity = capacity;
    h->entry_size = entry_size;
    h->entries_off = RING_HDR_BYTES;
    atomic_init(&h->head, 0);
    atomic_init(&h->tail, 0);
    atomic_init(&h->cons_waiting, 0);
    atomic_init(&h->prod_waiting, 0);
    /* magic last, released: a reader that sees it sees the rest. */
    atomic_store_explicit((_Atomic uint64_t *)&h->magic, RING_MAGIC, memory_order_release);
    return 0;
}

int ring_attach(ring_t *r, void *mem, size_t bytes, uint32_t expect_entry_size,
                char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    r->data_fd = r->space_fd = -1;
    if (!mem || ((uintptr_t)mem % RING_LINE) || bytes < RING_HDR_BYTES) {
        errbuf_set(err, errlen, "ring_attach: mapping %p of %zu bytes cannot hold a %u-byte ring header",
               mem, bytes, RING_HDR_BYTES);
        return -EINVAL;
    }
    ring_hdr_t *h = mem;
    /* Read each field once: the other side may change them under us. */
    uint64_t magic = atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire);
    uint32_t version = ((volatile ring_hdr_t *)h)->version;
    uint32_t cap = ((volatile ring_hdr_t *)h)->capacity;
    uint32_t esz = ((volatile ring_hdr_t *)h)->entry_size;
    uint32_t off = ((volatile ring_hdr_t *)h)->entries_off;
    if (magic != RING_MAGIC) {
        errbuf_set(err, errlen, "ring_attach: bad magic 0x%016llx (want 0x%016llx): not a ring, or not "
               "initialized yet", (unsigned long long)magic, (unsigned long long)RING_MAGIC);
        return -EBADMSG;
    }
    if (version != RING_VERSION) {
        errbuf_set(err, errlen, "ring_attach: ring version %u, this build speaks %u: upgrade both sides "
               "together", version, RING_VERSION);
        return -EBADMSG;
    }
    if (!is_pow2(cap) || cap > RING_MAX_CAPACITY) {
        errbuf_set(err, errlen, "ring_attach: capacity %u is not a power of two in [1, %u]", cap,
               RING_MAX_CAPACITY);
        return -EBADMSG;
    }
    if (esz < 8 || esz > RING_MAX_ENTRY || esz % 8) {
        errbuf_set(err, errlen, "ring_attach: entry size %u is not a multiple of 8 in [8, %u]", esz,
               RING_MAX_ENTRY);
        return -EBADMSG;
    }
    if (expect_entry_size && esz != expect_entry_size) {
        errbuf_set(err, errlen, "ring_attach: entry size %u, expected %u: the peer speaks another "
               "protocol version", esz, expect_entry_size);
        return -EBADMSG;
    }
    if (off != RING_HDR_BYTES) {
        errbuf_set(err, errlen, "ring_attach: entries at offset %u, expected %u", off, RING_HDR_BYTES);
        return -EBADMSG;
    }
    size_t need = ring_bytes(cap, esz);
    if (need > bytes) {
        errbuf_set(err, errlen, "ring_attach: header claims %u x %u-byte entries (%zu bytes) but the "
               "mapping is %zu bytes", cap, esz, need, bytes);
        return -EBADMSG;
    }
    uint32_t head = atomic_load_explicit(&h->head, memory_order_acquire);
    uint32_t tail = atomic_load_explicit(&h->tail, memory_order_acquire);
    if (tail - head > cap) {
        errbuf_set(err, errlen, "ring_attach: tail %u - head %u = %u exceeds capacity %u: corrupt ring",
               tail, head, tail - head, cap);
        return -EBADMSG;
    }
    r->hdr = h;
    r->entries = (uint8_t *)mem + RING_HDR_BYTES;
    r->capacity = cap;
    r->mask = cap - 1;
    r->entry_size = esz;
    r->head = head;
    r->tail = tail;
    r->seen_head = head;
    r->seen_tail = tail;
    r->spin_ns = spin_allowed() ? RING_SPIN_MAX_NS / 4 : 0;
    return 0;
}

void ring_set_doorbells(ring_t *r, int data_fd, int space_fd) {
    r->data_fd = data_fd;
    r->space_fd = space_fd;
}

/* ---- doorbells ---- */

int ring_doorbell_create(int *fd_out, char *err, size_t errlen) {
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        errbuf_set(err, errlen, "eventfd: %s (raise the open file limit: ulimit -n)", strerror(e));
        return -e;
    }
    *fd_out = fd;
    return 0;
}

int ring_doorbell_notify(int fd) {
    uint64_t one = 1;
    for (;;) {
        ssize_t n = write(fd, &one, sizeof one);
        if (n == (ssize_t)sizeof one) return 0;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return 0; /* counter saturated: already rung */
        return n < 0 ? -errno : -EIO;
    }
}

static void doorbell_drain(int fd) {
    uint64_t v;
    while (read(fd, &v, sizeof v) < 0 && errno == EINTR) {}
}

/* poll() fd for input for up to timeout_ms (< 0: forever). 0 if readable,
 * -ETIMEDOUT, -errno. */
static int poll_in(int fd, int timeout_ms) {
    struct pollfd p = { .fd = fd, .events = POLLIN };
    int n = poll(&p, 1, timeout_ms);
    if (n < 0) return errno == EINTR ? 0 : -errno; /* EINTR: caller rechecks */
    if (n == 0) return -ETIMEDOUT;
    if (p.revents & (POLLERR | POLLNVAL)) return -EBADF;
    return 0;
}

int ring_doorbell_wait(int fd, int timeout_ms) {
    int rc = poll_in(fd, timeout_ms);
    if (rc == 0) doorbell_drain(fd);
    return rc;
}

/* ---- waking and sleeping on the flags ---- */

#define WAIT_FD    1u /* sleeping on the eventfd (ring_arm_*) */
#define WAIT_FUTEX 2u /* sleeping on the flag word (ring_wait_*) */

/* The other side may sleep (flag set): take the flag and wake it. */
static void wake_peer(_Atomic uint32_t *flag, int fd) {
    if (!atomic_load_explicit(flag, memory_order_seq_cst)) return;
    uint32_t old = atomic_exchange_explicit(flag, 0, memory_order_seq_cst);
    if (old == WAIT_FUTEX) syscall(SYS_futex, (uint32_t *)flag, FUTEX_WAKE, 1, NULL, NULL, 0);
    else if (old) ring_doorbell_notify(fd);
}

/* Sleep while *flag is WAIT_FUTEX, for up to timeout_ms (< 0: forever).
 * 0 on a wake, a timeout, a changed word or a signal (the caller rechecks);
 * -errno otherwise. */
static int futex_sleep(_Atomic uint32_t *flag, int timeout_ms) {
    struct timespec ts, *tp = NULL;
    if (timeout_ms >= 0) {
        ts.tv_sec = timeout_ms / 1000;
        ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
        tp = &ts;
    }
    if (syscall(SYS_futex, (uint32_t *)flag, FUTEX_WAIT, WAIT_FUTEX, tp, NULL, 0) == 0) return 0;
    return errno == EAGAIN || errno == EINTR || errno == ETIMEDOUT ? 0 : -errno;
}

/* Note this side's CPU in its header line (only when it changed). */
static inline void note_cpu(ring_t *r, _Atomic uint32_t *slot) {
    int cpu = sched_getcpu();
    uint32_t v = cpu >= 0 ? (uint32_t)cpu + 1 : 0;
    if (v != r->my_cpu) {
        r->my_cpu = v;
        atomic_store_explicit(slot, v, memory_order_relaxed);
    }
}

/* ---- producer ---- */

static int64_t cons_ready(ring_t *r, uint32_t want);
static int64_t prod_space(ring_t *r, uint32_t want);

/* Record that a wait's entry (or slot) came gap_ns after the wait began and
 * set the budget from the last RING_SPIN_HIST such gaps (see ring.h). */
static void spin_learn(ring_t *r, int64_t gap_ns) {
    if (!spin_allowed()) return;
    uint32_t g = gap_ns < 0 ? 0 : gap_ns > 2 * (int64_t)RING_SPIN_MAX_NS ? 2 * RING_SPIN_MAX_NS : (uint32_t)gap_ns;
    r->gap_ns[r->gap_n++ % RING_SPIN_HIST] = g;
    uint32_t n = r->gap_n < RING_SPIN_HIST ? r->gap_n : RING_SPIN_HIST, shorts = 0, longest = 0;
    for (uint32_t i = 0; i < n; i++)
        if (r->gap_ns[i] <= RING_SPIN_MAX_NS) {
            shorts++;
            if (r->gap_ns[i] > longest) longest = r->gap_ns[i];
        }
    uint32_t b = longest + longest / 4 + 1000;
    r->spin_ns = 4 * shorts < n ? 0 : b > RING_SPIN_MAX_NS ? RING_SPIN_MAX_NS : b;
}

/* Poll the ring for up to r->spin_ns (see ring.h) until an entry is ready
 * (consumer) or a slot is free (producer). 1: it is, 0: the spin ran out
 * (or is off; sleep now), -EBADMSG. t0 is when the wait began. */
static int spin_wait(ring_t *r, bool consumer, int64_t t0) {
    uint32_t budget = r->spin_ns;
    if (budget == 0 || !spin_allowed()) return 0;
    /* the peer last ran here: it cannot answer while we spin, so give it the
     * CPU instead (sched_yield), for as long as a spin would have lasted */
    uint32_t peer = atomic_load_explicit(consumer ? &r->hdr->prod_cpu : &r->hdr->cons_cpu, memory_order_relaxed);
    int cpu = sched_getcpu();
    bool yield = cpu >= 0 && peer == (uint32_t)cpu + 1;
    if (r->spin_off) {
        r->spin_off--;
        return 0;
    }
    for (uint32_t i = 1;; i++) {
        int64_t v = consumer ? cons_ready(r, 1) : prod_space(r, 1);
        if (v != 0) {
            r->spin_fails = 0;
            if (v > 0) spin_learn(r, clock_now_ns() - t0);
            return v < 0 ? (int)v : 1;
        }
        if (yield) {
            sched_yield();
            if (clock_now_ns() - t0 >= (int64_t)budget) break;
            continue;
        }
        cpu_relax();
        if (i % 16 == 0 && clock_now_ns() - t0 >= (int64_t)budget) break;
    }
    if (++r->spin_fails >= RING_SPIN_FAILS) {
        r->spin_fails = 0;
        r->spin_off = RING_SPIN_PROBE;
    }
    return 0;
}

static int corrupt(ring_t *r, const char *who, uint32_t tail, uint32_t head) {
    snprintf(r->err, sizeof r->err, "%s: tail %u - head %u = %u exceeds capacity %u: corrupt "
             "ring, drop the session", who, tail, head, tail - head, r->capacity);
    return -EBADMSG;
}

/* Free slots as the producer sees them, reloading head if fewer than want
 * appear free. -EBADMSG if head is inconsistent with our tail. */
static int64_t prod_space(ring_t *r, uint32_t want) {
    uint32_t used = r->tail - r->seen_head;
    if (r->capacity - used >= want) return r->capacity - used;
    uint32_t head = atomic_load_explicit(&r->hdr->head, memory_order_acquire);
    used = r->tail - head;
    if (used > r->capacity) return corrupt(r, "ring_push", r->tail, head);
    r->seen_head = head;
    return r->capacity - used;
}

/* Publish tail and ring the data doorbell if the consumer sleeps. */
static void prod_publish(ring_t *r) {
    if (r->data_fd < 0) {
        atomic_store_explicit(&r->hdr->tail, r->tail, memory_order_release);
        return;
    }
    note_cpu(r, &r->hdr->prod_cpu);
    atomic_store_explicit(&r->hdr->tail, r->tail, memory_order_seq_cst);
    wake_peer(&r->hdr->cons_waiting, r->data_fd);
}

int ring_push_batch(ring_t *r, const void *entries, uint32_t n) {
    int64_t space = prod_space(r, n ? n : 1);
    if (space < 0) return (int)space;
    if (n > space) n = (uint32_t)space;
    if (n == 0) return 0;
    const uint8_t *src = entries;
    uint32_t slot = r->tail & r->mask;
    uint32_t first = r->capacity - slot < n ? r->capacity - slot : n;
    memcpy(r->entries + (size_t)slot * r->entry_size, src, (size_t)first * r->entry_size);
    if (n > first)
        memcpy(r->entries, src + (size_t)first * r->entry_size, (size_t)(n - first) * r->entry_size);
    r->tail += n;
    prod_publish(r);
    return (int)n;
}

int ring_push(ring_t *r, const void *entry) {
    int n = ring_push_batch(r, entry, 1);
    return n < 0 ? n : n == 1 ? 0 : -EAGAIN;
}

static int arm_space(ring_t *r, uint32_t how) {
    int64_t space = prod_space(r, 1);
    if (space != 0) return space < 0 ? (int)space : 1;
    atomic_store_explicit(&r->hdr->prod_waiting, how, memory_order_seq_cst);
    uint32_t head = atomic_load_explicit(&r->hdr->head, memory_order_seq_cst);
    if (r->tail - head == r->capacity) return 0; /* still full: safe to sleep */
    atomic_store_explicit(&r->hdr->prod_waiting, 0, memory_order_relaxed);
    space = prod_space(r, 1); /* freed meanwhile, or corrupt */
    return space < 0 ? (int)space : 1;
}

int ring_arm_space(ring_t *r) { return arm_space(r, WAIT_FD); }

void ring_disarm_space(ring_t *r) {
    atomic_store_explicit(&r->hdr->prod_waiting, 0, memory_order_relaxed);
    if (r->space_fd >= 0) doorbell_drain(r->space_fd);
}

int ring_wait_space(ring_t *r, int timeout_ms) {
    if (r->space_fd < 0) return -EINVAL;
    int64_t t0 = clock_now_ns();
    if (timeout_ms != 0) {
        int sp = spin_wait(r, false, t0);
        if (sp != 0) return sp < 0 ? sp : 0;
    }
    int64_t deadline = timeout_ms < 0 ? -1 : clock_now_ms() + timeout_ms;
    for (;;) {
        int rc = arm_space(r, WAIT_FUTEX);
        if (rc != 0) {
            if (rc > 0 && timeout_ms != 0) spin_learn(r, clock_now_ns() - t0);
            return rc < 0 ? rc : 0;
        }
        int left = -1;
        if (deadline >= 0) {
            int64_t l = deadline - clock_now_ms();
            if (l <= 0) {
                atomic_store_explicit(&r->hdr->prod_waiting, 0, memory_order_relaxed);
                spin_learn(r, clock_now_ns() - t0);
                return -ETIMEDOUT;
            }
            left = (int)l;
        }
        rc = futex_sleep(&r->hdr->prod_waiting, left);
        atomic_store_explicit(&r->hdr->prod_waiting, 0, memory_order_relaxed);
        if (rc < 0) return rc;
    }
}

int ring_push_wait(ring_t *r, const void *entry, int timeout_ms) {
    int64_t deadline = timeout_ms < 0 ? -1 : clock_now_ms() + timeout_ms;
    for (;;) {
        int rc = ring_push(r, entry);
        if (rc != -EAGAIN) return rc;
        int left = -1;
        if (deadline >= 0) {
            int64_t l = deadline - clock_now_ms();
            left = l > 0 ? (int)l : 0;
        }
        rc = ring_wait_space(r, left);
        if (rc < 0) return rc;
    }
}

/* ---- consumer ---- */

/* Entries ready as the consumer sees them, reloading tail if fewer than
 * want appear ready. -EBADMSG if tail is inconsistent with our head. */
static int64_t cons_ready(ring_t *r, uint32_t want) {
    uint32_t ready = r->seen_tail - r->head;
    if (ready >= want) return ready;
    uint32_t tail = atomic_load_explicit(&r->hdr->tail, memory_order_acquire);
    ready = tail - r->head;
    if (ready > r->capacity) return corrupt(r, "ring_pop", tail, r->head);
    r->seen_tail = tail;
    return ready;
}

/* Publish head and ring the space doorbell if the producer sleeps. */
static void cons_publish(ring_t *r) {
    if (r->space_fd < 0) {
        atomic_store_explicit(&r->hdr->head, r->head, memory_order_release);
        return;
    }
    note_cpu(r, &r->hdr->cons_cpu);
    atomic_store_explicit(&r->hdr->head, r->head, memory_order_seq_cst);
    wake_peer(&r->hdr->prod_waiting, r->space_fd);
}

int ring_pop_batch(ring_t *r, void *entries, uint32_t max) {
    int64_t ready = cons_ready(r, max ? max : 1);
    if (ready < 0) return (int)ready;
    uint32_t n = max < ready ? max : (uint32_t)ready;
    if (n == 0) return 0;
    uint8_t *dst = entries;
    uint32_t slot = r->head & r->mask;
    uint32_t first = r->capacity - slot < n ? r->capacity - slot : n;
    memcpy(dst, r->entries + (size_t)slot * r->entry_size, (size_t)first * r->entry_size);
    if (n > first)
        memcpy(dst + (size_t)first * r->entry_size, r->entries, (size_t)(n - first) * r->entry_size);
    r->head += n;
    cons_publish(r);
    return (int)n;
}

int ring_pop(ring_t *r, void *entry) {
    int n = ring_pop_batch(r, entry, 1);
    return n < 0 ? n : n == 1 ? 0 : -EAGAIN;
}

static int arm_data(ring_t *r, uint32_t how) {
    int64_t ready = cons_ready(r, 1);
    if (ready != 0) return ready < 0 ? (int)ready : 1;
    atomic_store_explicit(&r->hdr->cons_waiting, how, memory_order_seq_cst);
    uint32_t tail = atomic_load_explicit(&r->hdr->tail, memory_order_seq_cst);
    if (tail == r->head) return 0; /* still empty: safe to sleep */
    atomic_store_explicit(&r->hdr->cons_waiting, 0, memory_order_relaxed);
    ready = cons_ready(r, 1); /* arrived meanwhile, or corrupt */
    return ready < 0 ? (int)ready : 1;
}

int ring_arm_data(ring_t *r) { return arm_data(r, WAIT_FD); }

void ring_disarm_data(ring_t *r) {
    atomic_store_explicit(&r->hdr->cons_waiting, 0, memory_order_relaxed);
    if (r->data_fd >= 0) doorbell_drain(r->data_fd);
}

int ring_wait_data(ring_t *r, int timeout_ms) {
    if (r->data_fd < 0) return -EINVAL;
    int64_t t0 = clock_now_ns();
    if (timeout_ms != 0) {
        int sp = spin_wait(r, true, t0);
        if (sp != 0) return sp < 0 ? sp : 0;
    }
    int64_t deadline = timeout_ms < 0 ? -1 : clock_now_ms() + timeout_ms;
    for (;;) {
        int rc = arm_data(r, WAIT_FUTEX);
        if (rc != 0) {
            if (rc > 0 && timeout_ms != 0) spin_learn(r, clock_now_ns() - t0);
            return rc < 0 ? rc : 0;
        }
        int left = -1;
        if (deadline >= 0) {
            int64_t l = deadline - clock_now_ms();
            if (l <= 0) {
                atomic_store_explicit(&r->hdr->cons_waiting, 0, memory_order_relaxed);
                spin_learn(r, clock_now_ns() - t0);
                return -ETIMEDOUT;
            }
            left = (int)l;
        }
        rc = futex_sleep(&r->hdr->cons_waiting, left);
        atomic_store_explicit(&r->hdr->cons_waiting, 0, memory_order_relaxed);
        if (rc < 0) return rc;
    }
}

/* Sleep on the futex word *flag (WAIT_FUTEX) for up to ns; like
 * futex_sleep. */
static int futex_sleep_ns(_Atomic uint32_t *flag, int64_t ns) {
    struct timespec ts = { .tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000 };
    if (syscall(SYS_futex, (uint32_t *)flag, FUTEX_WAIT, WAIT_FUTEX, &ts, NULL, 0) == 0) return 0;
    return errno == EAGAIN || errno == EINTR || errno == ETIMEDOUT ? 0 : -errno;
}

int ring_wait_data_at(ring_t *r, int64_t at, int64_t until) {
    if (r->data_fd < 0) return -EINVAL; /* a producer without doorbells never wakes a sleeper */
    int64_t ready = cons_ready(r, 1);
    if (ready != 0) return ready < 0 ? (int)ready : 1;
    if (!spin_allowed()) return 0;
    uint32_t peer = atomic_load_explicit(&r->hdr->prod_cpu, memory_order_relaxed);
    int cpu = sched_getcpu();
    if (cpu >= 0 && peer == (uint32_t)cpu + 1) return 0;
    int64_t lead = (r->late_ns ? r->late_ns : RING_SPIN_MAX_NS / 2) + RING_AT_MARGIN_NS;
    int64_t wake = at - lead;
    for (int64_t now = clock_now_ns(); now < wake; now = clock_now_ns()) {
        int rc = arm_data(r, WAIT_FUTEX);
        if (rc != 0) return rc;
        rc = futex_sleep_ns(&r->hdr->cons_waiting, wake - now);
        atomic_store_explicit(&r->hdr->cons_waiting, 0, memory_order_relaxed);
        if (rc < 0) return rc;
        ready = cons_ready(r, 1);
        if (ready != 0) return ready < 0 ? (int)ready : 1;
        int64_t late = clock_now_ns() - wake;
        if (late >= 0) { /* the sleep ran out: learn how late it woke (a quarter of each new sample) */
            uint32_t l = late > RING_AT_LATE_MAX ? RING_AT_LATE_MAX : (uint32_t)late;
            r->late_ns = r->late_ns ? (uint32_t)(((uint64_t)r->late_ns * 3 + l) / 4) : l;
            break;
        }
    }
    for (uint32_t i = 1;; i++) {
        ready = cons_ready(r, 1);
        if (ready != 0) return ready < 0 ? (int)ready : 1;
        cpu_relax();
        if (i % 16 == 0 && clock_now_ns() >= until) return 0;
    }
}

int ring_pop_wait(ring_t *r, void *entry, int timeout_ms) {
    int64_t deadline = timeout_ms < 0 ? -1 : clock_now_ms() + timeout_ms;
    for (;;) {
        int rc = ring_pop(r, entry);
        if (rc != -EAGAIN) return rc;
        int left = -1;
        if (deadline >= 0) {
            int64_t l = deadline - clock_now_ms();
            left = l > 0 ? (int)l : 0;
        }
        rc = ring_wait_data(r, left);
        if (rc < 0) return rc;
    }
}

/* ---- both ---- */

uint32_t ring_count(const ring_t *r) {
    uint32_t head = atomic_load_explicit(&r->hdr->head, memory_order_acquire);
    uint32_t tail = atomic_load_explicit(&r->hdr->tail, memory_order_acquire);
    uint32_t n = tail - head;
    return n > r->capacity ? r->capacity : n;
}
