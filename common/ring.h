/* ring.h: single-producer single-consumer ring of fixed-size entries in
 * shared memory, with eventfd doorbells.
 *
 * One ring carries entries in one direction between two processes (a worker
 * and ballastd use a request ring and a completion ring per session). The
 * memory holds a header followed by capacity entries of entry_size bytes:
 *
 *   offset   0  line 0: magic, version, capacity, entry_size, entries_off
 *   offset  64  line 1: head          (written by the consumer only)
 *   offset 128  line 2: tail          (written by the producer only)
 *   offset 192  line 3: cons_waiting, prod_waiting (the "needs wakeup" flags)
 *   offset 256  entries[capacity][entry_size]
 *
 * head and tail are free-running 32-bit counters; slot = counter & (capacity-1).
 * The other side is not trusted: ring_attach() validates the header against
 * the mapping length, each side keeps its own copy of the counter it owns and
 * every push/pop checks 0 <= tail - head <= capacity before touching an
 * entry, so a corrupt ring gives -EBADMSG and never an access out of bounds.
 * Entries are copied out of shared memory before the caller sees them, so
 * a validated entry cannot change under the caller.
 *
 * Spinning: ring_wait_data/ring_wait_space (and the *_wait calls built on
 * them) first poll the ring for a short, adaptive time (at most
 * RING_SPIN_MAX_NS) before sleeping, so that a peer on another CPU that
 * answers soon does not cost a cross-core wakeup (tens of microseconds when
 * that CPU has gone idle, more in a virtual machine). Every wait records how
 * long the entry took to come, whether the spin caught it or the wait slept
 * (so a sleeping side keeps learning without spinning); the budget is a
 * quarter more than the longest of the last RING_SPIN_HIST waits that were
 * within RING_SPIN_MAX_NS, and none when fewer than a quarter of them were.
 * A peer that takes 50 us between requests (it copies a megabyte) is thus
 * waited for by spinning, one that takes milliseconds is slept for. After
 * RING_SPIN_FAILS spins in a row that ran out, spinning stops for
 * RING_SPIN_PROBE waits. No spinning when the peer last ran on this CPU
 * (each side notes its CPU in the header as it pushes or pops: a hint, never
 * trusted for more), nor at all when the machine has one online CPU: the
 * peer could not run while we spin, and a spinning ballastd thread would
 * hold up whatever else runs there.
 *
 * Doorbells: a consumer that finds the ring empty sets cons_waiting,
 * re-checks the ring and only then sleeps on the data eventfd; a producer
 * rings that eventfd after a push only when cons_waiting is set. The same
 * holds in reverse (prod_waiting, space eventfd) for a producer blocked on
 * a full ring. The memory-ordering argument is in ring.c.
 *
 * Functions return 0 or -errno: -EAGAIN (full / empty), -EBADMSG (corrupt
 * ring; details in ring->err), -ETIMEDOUT (a wait ran out). */
#ifndef BALLAST_RING_H
#define BALLAST_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RING_MAGIC        0x31474e4952534c42ull /* "BLSRING1" little-endian */
#define RING_VERSION      1u
#define RING_LINE         64u                   /* cache line, bytes */
#define RING_HDR_BYTES    (4u * RING_LINE)      /* entries start here */
#define RING_MAX_CAPACITY (1u << 24)            /* entries */
#define RING_MAX_ENTRY    (64u << 10)           /* bytes */
#define RING_ERR_LEN      160
#define RING_SPIN_MAX_NS  100000u               /* longest spin before a wait sleeps */
#define RING_SPIN_HIST    8u                    /* waits the budget is learnt from */
#define RING_SPIN_FAILS   4u                    /* spins in a row that ran out before spinning pauses */
#define RING_SPIN_PROBE   64u                   /* waits without spinning after that */
#define RING_AT_MARGIN_NS 20000u                /* ring_wait_data_at wakes this much earlier still */
#define RING_AT_LATE_MAX  1000000u              /* the most late_ns it allows for, ns */

/* The shared header. Each line is written by one side only. */
typedef struct {
    uint64_t magic;                  /* RING_MAGIC */
    uint32_t version;                /* RING_VERSION */
    uint32_t capacity;               /* entries, a power of two */
    uint32_t entry_size;             /* bytes per entry, a multiple of 8 */
    uint32_t entries_off;            /* bytes from header start to entry 0 (RING_HDR_BYTES) */
    uint8_t  pad0[RING_LINE - 24];
    _Atomic uint32_t head;           /* entries consumed (free-running); consumer writes */
    _Atomic uint32_t cons_cpu;       /* CPU the consumer last popped on, + 1 (0: not yet); a hint */
    uint8_t  pad1[RING_LINE - 8];
    _Atomic uint32_t tail;           /* entries produced (free-running); producer writes */
    _Atomic uint32_t prod_cpu;       /* CPU the producer last pushed on, + 1 (0: not yet); a hint */
    uint8_t  pad2[RING_LINE - 8];
    _Atomic uint32_t cons_waiting;   /* 1: consumer sleeps on the data doorbell, 2: on this word */
    _Atomic uint32_t prod_waiting;   /* 1: producer sleeps on the space doorbell, 2: on this word */
    uint8_t  pad3[RING_LINE - 8];
} ring_hdr_t;

/* A process-local handle on a ring. One side pushes, the other pops. */
typedef struct {
    ring_hdr_t *hdr;       /* shared header (in the mapping) */
    uint8_t *entries;      /* shared entries, capacity * entry_size bytes */
    uint32_t capacity;     /* entries (validated copy) */
    uint32_t mask;         /* capacity - 1 */
    uint32_t entry_size;   /* bytes (validated copy) */
    uint32_t head;         /* consumer: our copy of head */
    uint32_t tail;         /* producer: our copy of tail */
    uint32_t seen_head;    /* producer: last head read from shared memory */
    uint32_t seen_tail;    /* consumer: last tail read from shared memory */
    int data_fd;           /* eventfd producer -> consumer ("entries ready"); -1 none */
    int space_fd;          /* eventfd consumer -> producer ("slots free"); -1 none */
    uint32_t spin_ns;      /* adaptive spin budget before sleeping, ns (0: sleep at once) */
    uint32_t spin_fails;   /* spins in a row that ran out */
    uint32_t spin_off;     /* waits left with spinning paused */
    uint32_t gap_n;        /* waits recorded (gap_ns[gap_n % RING_SPIN_HIST] is next) */
    uint32_t gap_ns[RING_SPIN_HIST]; /* how long the last waits' entries took to come, ns (capped) */
    uint32_t my_cpu;       /* last CPU noted in the header by this side, + 1 */
    uint32_t late_ns;      /* how late this side's timed sleeps wake, ns (ring_wait_data_at; 0: not yet seen) */
    char err[RING_ERR_LEN];/* what was wrong when a call returned -EBADMSG */
} ring_t;

/* Bytes of shared memory a ring of capacity entries of entry_size bytes
 * needs (header + entries); 0 if the parameters are invalid (capacity not a
 * power of two in [1, RING_MAX_CAPACITY], entry_size not a multiple of 8 in
 * [8, RING_MAX_ENTRY]). */
size_t ring_bytes(uint32_t capacity, uint32_t entry_size);

/* Format mem (bytes long, 64-byte aligned) as an empty ring. Creator side,
 * before the memory is shared. -EINVAL with a message on bad parameters or
 * when bytes < ring_bytes(capacity, entry_size). */
int ring_init(void *mem, size_t bytes, uint32_t capacity, uint32_t entry_size,
              char *err, size_t errlen);

/* Validate a header we may not have written and fill *r. Checks magic,
 * version, capacity (power of two, bounded), entry_size (bounded, and equal
 * to expect_entry_size unless that is 0), that header plus entries fit in
 * bytes, and that 0 <= tail - head <= capacity. Doorbells start unset (-1).
 * -EINVAL (bad arguments) or -EBADMSG (bad header) with a message. */
int ring_attach(ring_t *r, void *mem, size_t bytes, uint32_t expect_entry_size,
                char *err, size_t errlen);

/* Use these eventfds as doorbells (fds stay owned by the caller; -1: none).
 * data_fd: the producer writes it when the consumer sleeps; space_fd: the
 * consumer writes it when the producer sleeps. */
void ring_set_doorbells(ring_t *r, int data_fd, int space_fd);

/* ---- producer ---- */

/* Copy one entry (entry_size bytes) in. 0, -EAGAIN (full), -EBADMSG.
 * Rings the data doorbell if the consumer waits. */
int ring_push(ring_t *r, const void *entry);

/* Copy up to n entries in, in order; returns how many (0 if full) or -EBADMSG. */
int ring_push_batch(ring_t *r, const void *entries, uint32_t n);

/* Push, sleeping on the space doorbell while the ring is full.
 * timeout_ms < 0 waits forever. 0, -ETIMEDOUT, -EBADMSG, -EINVAL (no space_fd). */
int ring_push_wait(ring_t *r, const void *entry, int timeout_ms);

/* ---- consumer ---- */

/* Copy the oldest entry out. 0, -EAGAIN (empty), -EBADMSG.
 * Rings the space doorbell if the producer waits. */
int ring_pop(ring_t *r, void *entry);

/* Copy up to max entries out, oldest first; returns how many (0 if empty)
 * or -EBADMSG. */
int ring_pop_batch(ring_t *r, void *entries, uint32_t max);

/* Pop, sleeping on the data doorbell while the ring is empty.
 * timeout_ms < 0 waits forever. 0, -ETIMEDOUT, -EBADMSG, -EINVAL (no data_fd). */
int ring_pop_wait(ring_t *r, void *entry, int timeout_ms);

/* Consumer: wait until the ring holds at least one entry (0) or timeout
 * (-ETIMEDOUT); -EBADMSG if corrupt. For event loops that pop in batches. */
int ring_wait_data(ring_t *r, int timeout_ms);

/* Producer: wait until at least one slot is free (0) or timeout. */
int ring_wait_space(ring_t *r, int timeout_ms);

/* Consumer, for a peer whose next entry is expected at about time at
 * (clock_now_ns()) and no later than until: one that copies a blob of many
 * megabytes between two requests, too long to spin for (RING_SPIN_MAX_NS)
 * and too regular to pay a cross-core wakeup for each time. Sleeps on the
 * ring's futex (a push wakes it at once) until shortly before at, by how
 * late this ring's timed sleeps have been waking (learnt, late_ns) and
 * RING_AT_MARGIN_NS, then polls until until. 1: an entry is ready; 0: none
 * by until (the caller waits as usual); -EBADMSG; -EINVAL (no data_fd: the
 * producer would not wake the sleep, as for ring_wait_data). Returns 0 at once where
 * spinning is off (one online CPU, or the peer last ran on this CPU). The
 * poll costs this CPU at most until - at plus the lead, per call. */
int ring_wait_data_at(ring_t *r, int64_t at, int64_t until);

/* ---- event loops ---- */

/* For a loop that waits on several fds (epoll/poll) instead of calling the
 * *_wait functions. Consumer: ring_arm_data() sets cons_waiting and
 * re-checks the ring; it returns 0 when the ring is still empty (sleeping on
 * data_fd is now safe: a later push rings it), 1 when entries arrived
 * meanwhile (the flag is cleared again: do not sleep), or -EBADMSG. After
 * waking, call ring_disarm_data() (clears the flag, drains data_fd), then
 * pop. ring_arm_space() / ring_disarm_space() are the producer's twins for
 * a full ring and space_fd. Disarming an unarmed ring is harmless. */
int ring_arm_data(ring_t *r);
void ring_disarm_data(ring_t *r);
int ring_arm_space(ring_t *r);
void ring_disarm_space(ring_t *r);

/* ---- both ---- */

/* Entries queued right now (a snapshot, clamped to [0, capacity]). */
uint32_t ring_count(const ring_t *r);

/* ---- doorbells ---- */

/* A non-blocking, close-on-exec eventfd for use as a doorbell. */
int ring_doorbell_create(int *fd_out, char *err, size_t errlen);

/* Add 1 to the doorbell. 0 or -errno. */
int ring_doorbell_notify(int fd);

/* Wait until the doorbell is rung or timeout_ms passes (< 0: forever); resets
 * it. 0 (rung), -ETIMEDOUT, -errno. */
int ring_doorbell_wait(int fd, int timeout_ms);

#endif
