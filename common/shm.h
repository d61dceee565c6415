/* shm.h: shared memory between ballastd and its clients.
 *
 * - Sealed memfd segments: created with a fixed size and sealed against
 *   shrinking and growing, so a receiver can map them without fearing SIGBUS
 *   from a truncated file; optional 2 MiB huge pages and mlock.
 * - Unix sockets for the fd-passing handshake (SOCK_SEQPACKET, so every
 *   message arrives whole): a listener guarded by a lock file, connect,
 *   accept with SO_PEERCRED checks against a set of allowed uids.
 * - fd passing with SCM_RIGHTS: a small message plus exactly N fds; anything
 *   else (too many or too few fds, truncated control data) is refused and
 *   stray fds are closed.
 *
 * Every function returns 0 or -errno and, on error, writes a message naming
 * the problem and the fix into a caller-supplied buffer (err, errlen; err may
 * be NULL). See docs/shm-ring.md for the handshake. */
#ifndef BALLAST_SHM_H
#define BALLAST_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SHM_ERR_LEN   256          /* a comfortable size for err buffers */
#define SHM_MAX_FDS   16           /* most fds one message may carry */
#define SHM_HUGE_2M   (2u << 20)   /* huge page size used with SHM_HUGE */
#define SHM_MAX_UIDS  8            /* most uids in one allowed set */

/* ---- sealed memfd segments ---- */

enum {
    SHM_HUGE     = 1u << 0, /* back with 2 MiB huge pages; fail if none are free */
    SHM_HUGE_TRY = 1u << 1, /* try 2 MiB huge pages, fall back to normal pages */
    SHM_THP      = 1u << 2, /* normal pages: ask the kernel to collapse them into transparent
                               huge pages (see shm_create); ignored with 2 MiB huge pages */
};

typedef struct {
    int fd;          /* memfd, owned by the segment; -1 when none */
    void *base;      /* MAP_SHARED mapping of the whole file; NULL when unmapped */
    size_t bytes;    /* size of the file and of the mapping, bytes */
    bool huge;       /* backed by 2 MiB huge pages */
    bool locked;     /* mlock()ed by shm_lock() */
    size_t thp_bytes; /* SHM_THP: bytes collapsed into transparent huge pages (0 when refused) */
    int thp_errno;   /* SHM_THP: why not, when thp_bytes is 0 (shm_thp_why explains it) */
} shm_seg_t;

/* Create a memfd named name (shown in /proc/PID/fd), size it to bytes
 * (rounded up to 2 MiB with huge pages, to the page size otherwise), seal it
 * with F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL and map it read-write.
 * On success *seg owns the fd and the mapping; on error *seg is {-1, NULL}.
 * Errors: -EINVAL (bytes 0 or too large), -ENOMEM (no huge pages with
 * SHM_HUGE, or no memory), -errno of memfd_create/ftruncate/fcntl/mmap.
 *
 * SHM_THP: the segment is mapped at a 2 MiB boundary, one byte of every
 * whole 2 MiB of it is faulted in (a zero written to a zero page) and
 * madvise(MADV_COLLAPSE) turns those into transparent huge pages: 2 MiB
 * physically contiguous each, the rest of each block filled with zeros.
 * MADV_COLLAPSE (Linux 6.1) works whatever transparent_hugepage/shmem_enabled
 * says except "deny", and compacts memory to find the blocks. Either way
 * the segment is created: when the kernel refuses, thp_bytes is 0, the pages
 * are normal ones and thp_errno says why (EINVAL: no MADV_COLLAPSE for
 * shared memory; EAGAIN or ENOMEM: no free 2 MiB blocks). A tail under 2 MiB
 * stays on normal pages. A peer that maps the memfd (shm_map_fd) sees the
 * same huge pages. */
int shm_create(shm_seg_t *seg, const char *name, size_t bytes, unsigned flags,
               char *err, size_t errlen);
/* A sentence on why SHM_THP was refused (thp_errno), naming the fix. */
const char *shm_thp_why(int thp_errno);

/* Map a memfd received from a peer. Takes ownership of fd (closed on error
 * too). Checks that it is a memfd-like regular file sealed against
 * shrinking (F_SEAL_SHRINK, so the sender cannot cut it under our feet) and,
 * when expect_bytes != 0, that its size equals expect_bytes. From 2 MiB on
 * the mapping starts at a 2 MiB boundary, so that the creator's huge pages
 * (SHM_HUGE, SHM_THP) are mapped whole here too.
 * Errors: -EBADF, -EPERM (not sealed), -EINVAL (size mismatch), -errno of mmap. */
int shm_map_fd(shm_seg_t *seg, int fd, size_t expect_bytes, char *err, size_t errlen);

/* mlock the mapping. Returns -ENOMEM or -EPERM with a message giving the
 * current RLIMIT_MEMLOCK and how to raise it; the segment stays usable, the
 * caller decides whether that is worth a warning. */
int shm_lock(shm_seg_t *seg, char *err, size_t errlen);

/* Unmap and close; safe on a zeroed or already closed segment. */
void shm_destroy(shm_seg_t *seg);

/* ---- Unix sockets ---- */

typedef struct {
    pid_t pid;       /* peer process id at connect time */
    uid_t uid;       /* effective uid of the peer at connect time */
    gid_t gid;       /* effective gid of the peer at connect time */
} shm_peer_t;

typedef struct {
    uid_t uid[SHM_MAX_UIDS]; /* allowed peer uids */
    int n;                   /* entries used in uid[] */
    bool by_group;           /* also allow members of gid (primary or supplementary) */
    gid_t gid;               /* the group, when by_group */
} shm_uidset_t;

typedef struct {
    int fd;          /* listening SOCK_SEQPACKET socket; -1 when closed */
    int lock_fd;     /* flock()ed "<path>.lock", holds our pid; -1 when none */
    char path[108];  /* socket path (sun_path size) */
} shm_listener_t;

/* Take the lock file "<sock_path>.lock" (flock, non-blocking) and write our
 * pid into it. Returns the lock fd in *lock_fd. If another process holds it:
 * -EADDRINUSE with a message naming the path and the holder's pid when known.
 * Release with shm_unlock_path(). */
int shm_lock_path(const char *sock_path, int *lock_fd, char *err, size_t errlen);

/* Remove "<sock_path>.lock" and close lock_fd (only call while holding it). */
void shm_unlock_path(const char *sock_path, int lock_fd);

/* Listen on a Unix SOCK_SEQPACKET socket at path: takes the lock file first
 * (-EADDRINUSE if another live instance holds it), then removes a stale
 * socket file left by a dead instance (-EEXIST if path is not a socket),
 * binds, gives the socket file mode 0660 (owner and group may connect;
 * shm_socket_access sets the group), and
 * listens with the given backlog (<= 0: SOMAXCONN).
 * Errors: -ENAMETOOLONG, -EADDRINUSE, -errno of socket/bind/listen. */
int shm_listen(shm_listener_t *l, const char *path, int backlog, char *err, size_t errlen);

/* Close the socket, unlink the socket file and release the lock. */
void shm_listener_close(shm_listener_t *l);

/* Connect to a listener at path; *fd_out is a SOCK_SEQPACKET socket (CLOEXEC).
 * Errors: -ENOENT / -ECONNREFUSED with a message suggesting that the service
 * is not running, -ENAMETOOLONG, other -errno. */
int shm_connect(const char *path, int *fd_out, char *err, size_t errlen);

/* A connected SOCK_SEQPACKET pair (for tests and forked helpers). */
int shm_socketpair(int sv[2], char *err, size_t errlen);

/* The peer's pid/uid/gid (SO_PEERCRED) of a connected Unix socket. */
int shm_peer_cred(int fd, shm_peer_t *peer, char *err, size_t errlen);

/* The default allowed set: our effective uid, plus root (0). */
void shm_uidset_default(shm_uidset_t *set);

/* Add uid to set (no-op if present). -ENOSPC when full. */
int shm_uidset_add(shm_uidset_t *set, uid_t uid);

/* Whether uid is in set. */
bool shm_uidset_has(const shm_uidset_t *set, uid_t uid);

/* Also allow every member of group gid (the peer's primary gid, or a
 * supplementary group of the peer's user in the group database). */
void shm_uidset_allow_group(shm_uidset_t *set, gid_t gid);

/* Whether a peer with these credentials is allowed by set. */
bool shm_peer_allowed(const shm_uidset_t *set, const shm_peer_t *peer);

/* Give a socket file mode 0660, and group gid when group_set (else the
 * group stays the creator's). -errno with a message. */
int shm_socket_access(const char *path, bool group_set, gid_t gid, char *err, size_t errlen);

/* Resolve a group given by name or number. -ENOENT with a message. */
int shm_group_lookup(const char *name, gid_t *gid, char *err, size_t errlen);

/* Check a connected socket's peer against allowed (NULL: the default set).
 * Fills *peer (may be NULL). -EACCES with a message naming the peer's uid
 * and pid when it is not allowed. Does not close fd. */
int shm_check_peer(int fd, const shm_uidset_t *allowed, shm_peer_t *peer,
                   char *err, size_t errlen);

/* Accept one connection on listen_fd (blocking unless the socket is
 * non-blocking: then -EAGAIN) and check its credentials against allowed
 * (NULL: the default set). On success *fd_out is the connection (CLOEXEC)
 * and *peer (may be NULL) its credentials. A refused peer is closed and the
 * call returns -EACCES naming its uid and pid; the listener stays usable. */
int shm_accept(int listen_fd, const shm_uidset_t *allowed, int *fd_out, shm_peer_t *peer,
               char *err, size_t errlen);

/* ---- fd passing (SCM_RIGHTS) ---- */

/* Send msg (1..SHM_MAX_MSG bytes) with nfds (0..SHM_MAX_FDS) file
 * descriptors in one message. The fds stay open on our side.
 * Errors: -EINVAL (sizes), -EPIPE / -ECONNRESET (peer gone), other -errno. */
#define SHM_MAX_MSG 4096
int shm_send_fds(int sock, const void *msg, size_t msg_len, const int *fds, int nfds,
                 char *err, size_t errlen);

/* Receive one message of at most msg_cap bytes carrying exactly nfds fds
 * (received CLOEXEC) into fds[0..nfds). *msg_len gets the message size.
 * timeout_ms < 0 waits forever.
 * Errors: -ETIMEDOUT; -ECONNRESET (peer closed: EOF); -EMSGSIZE (message
 * larger than msg_cap); -EBADMSG (wrong number of fds, truncated control
 * data, or a control message other than SCM_RIGHTS). On any error no fd is
 * left open: every fd that did arrive is closed. */
int shm_recv_fds(int sock, void *msg, size_t msg_cap, size_t *msg_len, int *fds, int nfds,
                 int timeout_ms, char *err, size_t errlen);

#endif
