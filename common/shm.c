/* shm.c: see shm.h. Sealed memfd segments, Unix sockets guarded by a lock
 * file, SO_PEERCRED checks and SCM_RIGHTS fd passing. Linux only (memfd,
 * file sealing, SOCK_SEQPACKET, SO_PEERCRED). */
#include "shm.h"
#include "errbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21u << 26) /* log2(2 MiB) << MFD_HUGE_SHIFT */
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1, uapi asm-generic/mman-common.h */
#endif


/* ---- sealed memfd segments ---- */

/* Map size bytes of fd shared at a 2 MiB boundary (a transparent huge page
 * is mapped whole only there): reserve 2 MiB more than needed, map the file
 * over the first boundary inside, give the slack back. */
static void *map_aligned(int fd, size_t size) {
    size_t a = SHM_HUGE_2M;
    char *r = mmap(NULL, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return MAP_FAILED;
    char *p = (char *)(((uintptr_t)r + a - 1) & ~(uintptr_t)(a - 1));
    if (mmap(p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        int e = errno;
        munmap(r, size + a);
        errno = e;
        return MAP_FAILED;
    }
    if (p > r) munmap(r, (size_t)(p - r));
    size_t tail = (size_t)(r + size + a - (p + size));
    if (tail) munmap(p + size, tail);
    return p;
}

/* SHM_THP on a fresh mapping (see shm.h). */
static void collapse(shm_seg_t *seg) {
    size_t whole = seg->bytes / SHM_HUGE_2M * SHM_HUGE_2M;
    seg->thp_bytes = 0;
    seg->thp_errno = 0;
    if (!whole) { seg->thp_errno = ERANGE; return; }
    volatile char *b = seg->base;
    for (size_t o = 0; o < whole; o += SHM_HUGE_2M) b[o] = 0; /* the page is zero already */
    if (madvise(seg->base, whole, MADV_COLLAPSE) == 0) seg->thp_bytes = whole;
    else seg->thp_errno = errno;
}

const char *shm_thp_why(int e) {
    switch (e) {
    case 0: return "on transparent huge pages";
    case ERANGE: return "the segment is smaller than one 2 MiB page";
    case EINVAL: return "the kernel cannot collapse shared memory into transparent huge pages "
                        "(needs Linux 6.1+ with CONFIG_TRANSPARENT_HUGEPAGE, and "
                        "/sys/kernel/mm/transparent_hugepage/shmem_enabled other than deny)";
    case EAGAIN: case ENOMEM: return "the kernel found no free 2 MiB blocks (memory fragmented or short); "
                                     "reserve huge pages (sysctl vm.nr_hugepages, --huge-pages 2M) to be sure of them";
    default: return strerror(e);
    }
}

/* One attempt at create + size + seal + map. Returns 0 or -errno; on error
 * nothing is left open. */
static int create_once(shm_seg_t *seg, const char *name, size_t bytes, bool huge, bool thp,
                       char *err, size_t errlen) {
    size_t unit = huge ? SHM_HUGE_2M : (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > SIZE_MAX - unit || bytes > (size_t)INT64_MAX - unit) {
        errbuf_set(err, errlen, "shm_create: %zu bytes is too large", bytes);
        return -EINVAL;
    }
    size_t size = (bytes + unit - 1) / unit * unit;
    unsigned mfd = MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB | MFD_HUGE_2MB : 0);
    int fd = memfd_create(name, mfd);
    if (fd < 0) {
        int e = errno;
        errbuf_set(err, errlen, "memfd_create(%s%s): %s%s", name, huge ? ", 2M huge pages" : "",
               strerror(e), huge && e == EINVAL ? " (kernel without sealable hugetlb memfds, "
               ">= 4.16 needed; run without huge pages)" : "");
        return -e;
    }
    if (ftruncate(fd, (off_t)size) < 0) {
        int e = errno;
        errbuf_set(err, errlen, "shm_create: sizing %s to %zu bytes: %s%s", name, size, strerror(e),
               huge ? " (are 2M huge pages reserved? sysctl vm.nr_hugepages)" : "");
        close(fd);
        return -e;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int e = errno;
        errbuf_set(err, errlen, "shm_create: sealing %s: %s", name, strerror(e));
        close(fd);
        return -e;
    }
    thp = thp && !huge;
    void *p = thp && size >= SHM_HUGE_2M ? map_aligned(fd, size) : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        errbuf_set(err, errlen, "shm_create: mapping %zu bytes of %s: %s%s", size, name, strerror(e),
               huge && e == ENOMEM ? " (not enough free 2M huge pages: raise vm.nr_hugepages "
               "or run without huge pages)" : "");
        close(fd);
        return -e;
    }
    seg->fd = fd;
    seg->base = p;
    seg->bytes = size;
    seg->huge = huge;
    seg->locked = false;
    seg->thp_bytes = 0;
    seg->thp_errno = 0;
    if (thp) collapse(seg);
    return 0;
}

int shm_create(shm_seg_t *seg, const char *name, size_t bytes, unsigned flags,
               char *err, size_t errlen) {
    seg->fd = -1;
    seg->base = NULL;
    seg->bytes = 0;
    seg->huge = seg->locked = false;
    if (!name || !*name) name = "ballast";
    if (bytes == 0) {
        errbuf_set(err, errlen, "shm_create(%s): size 0; ask for at least one byte", name);
        return -EINVAL;
    }
    seg->thp_bytes = 0;
    seg->thp_errno = 0;
    if (flags & (SHM_HUGE | SHM_HUGE_TRY)) {
        int rc = create_once(seg, name, bytes, true, false, err, errlen);
        if (rc == 0 || (flags & SHM_HUGE)) return rc;
    }
    return create_once(seg, name, bytes, false, (flags & SHM_THP) != 0, err, errlen);
}

int shm_map_fd(shm_seg_t *seg, int fd, size_t expect_bytes, char *err, size_t errlen) {
    seg->fd = -1;
    seg->base = NULL;
    seg->bytes = 0;
    seg->huge = seg->locked = false;
    seg->thp_bytes = 0;
    seg->thp_errno = 0;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        errbuf_set(err, errlen, "shm_map_fd: fd %d is not open", fd);
        if (fd >= 0) close(fd);
        return -EBADF;
    }
    if (!S_ISREG(st.st_mode) || st.st_size <= 0) {
        errbuf_set(err, errlen, "shm_map_fd: fd %d is not a non-empty memfd (mode 0%o, %lld bytes)",
               fd, (unsigned)st.st_mode, (long long)st.st_size);
        close(fd);
        return -EINVAL;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        errbuf_set(err, errlen, "shm_map_fd: segment is not sealed against shrinking (seals 0x%x): "
               "the peer could truncate it under us; refusing it", seals < 0 ? 0 : seals);
        close(fd);
        return -EPERM;
    }
    if (expect_bytes && (uint64_t)st.st_size != expect_bytes) {
        errbuf_set(err, errlen, "shm_map_fd: segment is %lld bytes, the handshake said %zu",
               (long long)st.st_size, expect_bytes);
        close(fd);
        return -EINVAL;
    }
    /* at a 2 MiB boundary from 2 MiB on, so that huge pages the creator
     * has (SHM_HUGE, SHM_THP) are mapped whole here too */
    size_t sz = (size_t)st.st_size;
    void *p = sz >= SHM_HUGE_2M ? map_aligned(fd, sz) : mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        errbuf_set(err, errlen, "shm_map_fd: mapping %lld bytes: %s", (long long)st.st_size, strerror(e));
        close(fd);
        return -e;
    }
    seg->fd = fd;
    seg->base = p;
    seg->bytes = (size_t)st.st_size;
    seg->huge = st.st_blksize >= (blksize_t)SHM_HUGE_2M;
    return 0;
}

int shm_lock(shm_seg_t *seg, char *err, size_t errlen) {
    if (!seg->base) return -EINVAL;
    if (mlock(seg->base, seg->bytes) == 0) {
        seg->locked = true;
        return 0;
    }
    int e = errno;
    struct rlimit rl = { 0, 0 };
    getrlimit(RLIMIT_MEMLOCK, &rl);
    char lim[32];
    if (rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof lim, "unlimited");
    else snprintf(lim, sizeof lim, "%llu bytes", (unsigned long long)rl.rlim_cur);
    errbuf_set(err, errlen, "mlock of %zu bytes failed: %s; RLIMIT_MEMLOCK is %s. Raise it (ulimit -l "
           "unlimited, systemd LimitMEMLOCK=infinity, docker --ulimit memlock=-1) or grant "
           "CAP_IPC_LOCK; the memory stays usable but may be swapped", seg->bytes, strerror(e), lim);
    return -e;
}

void shm_destroy(shm_seg_t *seg) {
    if (seg->base) {
        if (seg->locked) munlock(seg->base, seg->bytes);
        munmap(seg->base, seg->bytes);
    }
    if (seg->fd >= 0) close(seg->fd);
    seg->fd = -1;
    seg->base = NULL;
    seg->bytes = 0;
    seg->locked = false;
    seg->thp_bytes = 0;
}

/* ---- lock file and listener ---- */

static int lock_name(const char *sock_path, char *out, size_t cap, char *err, size_t errlen) {
    if (!sock_path || !*sock_path || (size_t)snprintf(out, cap, "%s.lock", sock_path) >= cap) {
        errbuf_set(err, errlen, "socket path '%s' is empty or too long", sock_path ? sock_path : "");
        return -ENAMETOOLONG;
    }
    return 0;
}

int shm_lock_path(const char *sock_path, int *lock_fd, char *err, size_t errlen) {
    char lp[PATH_MAX];
    int rc = lock_name(sock_path, lp, sizeof lp, err, errlen);
    if (rc) return rc;
    /* The holder unlinks the lock file when it leaves; a lock taken on an
     * inode that is no longer at lp is worthless, so check and retry. */
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) {
            int e = errno;
            errbuf_set(err, errlen, "cannot open lock file %s: %s (is the directory writable?)", lp,
                   strerror(e));
            return -e;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
            int e = errno;
            if (e != EWOULDBLOCK) {
                close(fd);
                errbuf_set(err, errlen, "flock %s: %s", lp, strerror(e));
                return -e;
            }
            char buf[32] = { 0 };
            ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
            close(fd);
            long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
            if (pid > 0)
                errbuf_set(err, errlen, "%s is in use: another instance (pid %ld) holds %s; stop it or "
                       "choose another socket path", sock_path, pid, lp);
            else
                errbuf_set(err, errlen, "%s is in use: another instance (pid unknown) holds %s; stop "
                       "it or choose another socket path", sock_path, lp);
            return -EADDRINUSE;
        }
        struct stat a, b;
        if (fstat(fd, &a) < 0 || stat(lp, &b) < 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            close(fd); /* the previous holder removed it meanwhile: retry */
            continue;
        }
        char buf[32];
        int len = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)len, 0) != len) {
            int e = errno ? errno : EIO;
            errbuf_set(err, errlen, "writing our pid to %s: %s", lp, strerror(e));
            unlink(lp);
            close(fd);
            return -e;
        }
        *lock_fd = fd;
        return 0;
    }
    errbuf_set(err, errlen, "lock file %s keeps changing under us; another instance is starting and "
           "stopping in a loop", lp);
    return -EAGAIN;
}

void shm_unlock_path(const char *sock_path, int lock_fd) {
    char lp[PATH_MAX];
    if (lock_fd < 0) return;
    if (lock_name(sock_path, lp, sizeof lp, NULL, 0) == 0) unlink(lp);
    close(lock_fd);
}

static int fill_addr(struct sockaddr_un *a, const char *path, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (!path || !*path || strlen(path) >= sizeof a->sun_path) {
        errbuf_set(err, errlen, "socket path '%s' is empty or longer than %zu bytes; choose a shorter "
               "one", path ? path : "", sizeof a->sun_path - 1);
        return -ENAMETOOLONG;
    }
    memcpy(a->sun_path, path, strlen(path));
    return 0;
}

int shm_listen(shm_listener_t *l, const char *path, int backlog, char *err, size_t errlen) {
    l->fd = l->lock_fd = -1;
    l->path[0] = 0;
    struct sockaddr_un a;
    int rc = fill_addr(&a, path, err, errlen);
    if (rc) return rc;
    rc = shm_lock_path(path, &l->lock_fd, err, errlen);
    if (rc) return rc;
    /* We hold the lock, so a socket file here was left by a dead instance. */
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            errbuf_set(err, errlen, "%s exists and is not a socket; remove it or choose another path",
                   path);
            rc = -EEXIST;
            goto fail;
        }
        if (unlink(path) < 0 && errno != ENOENT) {
            rc = -errno;
            errbuf_set(err, errlen, "removing stale socket %s: %s", path, strerror(-rc));
            goto fail;
        }
    }
    l->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (l->fd < 0) {
        rc = -errno;
        errbuf_set(err, errlen, "socket(AF_UNIX, SOCK_SEQPACKET): %s", strerror(-rc));
        goto fail;
    }
    if (bind(l->fd, (struct sockaddr *)&a, sizeof a) < 0) {
        rc = -errno;
        errbuf_set(err, errlen, "bind %s: %s", path, strerror(-rc));
        goto fail;
    }
    if (chmod(path, 0660) < 0 || listen(l->fd, backlog > 0 ? backlog : SOMAXCONN) < 0) {
        rc = -errno;
        errbuf_set(err, errlen, "listen on %s: %s", path, strerror(-rc));
        unlink(path);
        goto fail;
    }
    snprintf(l->path, sizeof l->path, "%s", path);
    return 0;
fail:
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
    shm_unlock_path(path, l->lock_fd);
    l->lock_fd = -1;
    return rc;
}

void shm_listener_close(shm_listener_t *l) {
    if (l->fd >= 0) {
        close(l->fd);
        l->fd = -1;
        if (l->path[0]) unlink(l->path);
    }
    if (l->lock_fd >= 0 && l->path[0]) shm_unlock_path(l->path, l->lock_fd);
    else if (l->lock_fd >= 0) close(l->lock_fd);
    l->lock_fd = -1;
}

int shm_connect(const char *path, int *fd_out, char *err, size_t errlen) {
    struct sockaddr_un a;
    int rc = fill_addr(&a, path, err, errlen);
    if (rc) return rc;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = -errno;
        errbuf_set(err, errlen, "socket(AF_UNIX, SOCK_SEQPACKET): %s", strerror(-rc));
        return rc;
    }
    while (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (errno == EINTR) continue;
        rc = -errno;
        if (rc == -ENOENT || rc == -ECONNREFUSED)
            errbuf_set(err, errlen, "connect %s: %s: is ballastd running, and is this its socket "
                   "path?", path, strerror(-rc));
        else if (rc == -EACCES)
            errbuf_set(err, errlen, "connect %s: permission denied on the socket or its directory",
                   path);
        else
            errbuf_set(err, errlen, "connect %s: %s", path, strerror(-rc));
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

int shm_socketpair(int sv[2], char *err, size_t errlen) {
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        int e = errno;
        errbuf_set(err, errlen, "socketpair(AF_UNIX, SOCK_SEQPACKET): %s", strerror(e));
        return -e;
    }
    return 0;
}

/* ---- peer credentials ---- */

int shm_peer_cred(int fd, shm_peer_t *peer, char *err, size_t errlen) {
    struct ucred uc;
    socklen_t len = sizeof uc;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0 || len != sizeof uc) {
        int e = errno ? errno : EPROTO;
        errbuf_set(err, errlen, "SO_PEERCRED on fd %d: %s (not a connected Unix socket?)", fd,
               strerror(e));
        return -e;
    }
    peer->pid = uc.pid;
    peer->uid = uc.uid;
    peer->gid = uc.gid;
    return 0;
}

void shm_uidset_default(shm_uidset_t *set) {
    set->n = 0;
    shm_uidset_add(set, geteuid());
    shm_uidset_add(set, 0);
}

int shm_uidset_add(shm_uidset_t *set, uid_t uid) {
    if (shm_uidset_has(set, uid)) return 0;
    if (set->n >= SHM_MAX_UIDS) return -ENOSPC;
    set->uid[set->n++] = uid;
    return 0;
}

bool shm_uidset_has(const shm_uidset_t *set, uid_t uid) {
    for (int i = 0; i < set->n && i < SHM_MAX_UIDS; i++)
        if (set->uid[i] == uid) return true;
    return false;
}

void shm_uidset_allow_group(shm_uidset_t *set, gid_t gid) {
    set->by_group = true;
    set->gid = gid;
}

bool shm_peer_allowed(const shm_uidset_t *set, const shm_peer_t *peer) {
    if (shm_uidset_has(set, peer->uid)) return true;
    if (!set->by_group) return false;
    if (peer->gid == set->gid) return true;
    /* supplementary groups of the peer's user, from the group database */
    char buf[16384];
    struct passwd pw, *pr = NULL;
    if (getpwuid_r(peer->uid, &pw, buf, sizeof buf, &pr) != 0 || !pr) return false;
    gid_t groups[256];
    int ng = (int)(sizeof groups / sizeof groups[0]);
    if (getgrouplist(pr->pw_name, pr->pw_gid, groups, &ng) < 0) return false;
    for (int i = 0; i < ng; i++)
        if (groups[i] == set->gid) return true;
    return false;
}

int shm_socket_access(const char *path, bool group_set, gid_t gid, char *err, size_t errlen) {
    if (group_set && chown(path, (uid_t)-1, gid) < 0) {
        int e = errno;
        errbuf_set(err, errlen, "chown %s to group %u: %s (the service must belong to that group "
                   "or run as root)", path, (unsigned)gid, strerror(e));
        return -e;
    }
    if (chmod(path, 0660) < 0) {
        int e = errno;
        errbuf_set(err, errlen, "chmod 0660 %s: %s", path, strerror(e));
        return -e;
    }
    return 0;
}

int shm_group_lookup(const char *name, gid_t *gid, char *err, size_t errlen) {
    char buf[16384];
    struct group g, *r = NULL;
    if (name && name[0] && getgrnam_r(name, &g, buf, sizeof buf, &r) == 0 && r) {
        *gid = r->gr_gid;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long v = name && name[0] ? strtoul(name, &end, 10) : 0;
    if (name && name[0] && !*end && !errno && v < (unsigned long)(gid_t)-1) {
        *gid = (gid_t)v;
        return 0;
    }
    errbuf_set(err, errlen, "group '%s' is not known: give a group name from /etc/group or a "
               "numeric gid", name ? name : "");
    return -ENOENT;
}

int shm_check_peer(int fd, const shm_uidset_t *allowed, shm_peer_t *peer,
                   char *err, size_t errlen) {
    shm_uidset_t def;
    if (!allowed) {
        shm_uidset_default(&def);
        allowed = &def;
    }
    shm_peer_t p;
    int rc = shm_peer_cred(fd, &p, err, errlen);
    if (rc) return rc;
    if (peer) *peer = p;
    if (!shm_peer_allowed(allowed, &p)) {
        char list[SHM_MAX_UIDS * 12] = "";
        size_t off = 0;
        for (int i = 0; i < allowed->n && off < sizeof list; i++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%u", i ? "," : "",
                                    (unsigned)allowed->uid[i]);
        char grp[32] = "";
        if (allowed->by_group) snprintf(grp, sizeof grp, ", members of gid %u", (unsigned)allowed->gid);
        errbuf_set(err, errlen, "refused peer pid %ld: uid %u is not allowed (allowed uids: %s%s); run "
               "the client as one of them or start the service with --socket-group naming its group",
               (long)p.pid, (unsigned)p.uid, list, grp);
        return -EACCES;
    }
    return 0;
}

int shm_accept(int listen_fd, const shm_uidset_t *allowed, int *fd_out, shm_peer_t *peer,
               char *err, size_t errlen) {
    int fd;
    while ((fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC)) < 0) {
        int e = errno;
        if (e == EINTR || e == ECONNABORTED) continue;
        if (e != EAGAIN && e != EWOULDBLOCK) errbuf_set(err, errlen, "accept: %s", strerror(e));
        else errbuf_set(err, errlen, "accept: no pending connection");
        return -e;
    }
    int rc = shm_check_peer(fd, allowed, peer, err, errlen);
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

/* ---- fd passing ---- */

typedef union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * SHM_MAX_FDS)];
} cmsg_buf_t;

int shm_send_fds(int sock, const void *msg, size_t msg_len, const int *fds, int nfds,
                 char *err, size_t errlen) {
    if (!msg || msg_len == 0 || msg_len > SHM_MAX_MSG || nfds < 0 || nfds > SHM_MAX_FDS ||
        (nfds > 0 && !fds)) {
        errbuf_set(err, errlen, "shm_send_fds: message of %zu bytes (want 1..%d) with %d fds "
               "(want 0..%d)", msg_len, SHM_MAX_MSG, nfds, SHM_MAX_FDS);
        return -EINVAL;
    }
    struct iovec iov = { .iov_base = (void *)msg, .iov_len = msg_len };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    cmsg_buf_t cb;
    if (nfds > 0) {
        memset(&cb, 0, sizeof cb);
        mh.msg_control = cb.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;
    while ((n = sendmsg(sock, &mh, MSG_NOSIGNAL)) < 0 && errno == EINTR) {}
    if (n < 0) {
        int e = errno;
        errbuf_set(err, errlen, "sending %zu bytes and %d fds: %s%s", msg_len, nfds, strerror(e),
               e == EPIPE || e == ECONNRESET ? " (the peer went away)" : "");
        return -e;
    }
    if ((size_t)n != msg_len) {
        errbuf_set(err, errlen, "sending %zu bytes: only %zd went out; use a SOCK_SEQPACKET socket",
               msg_len, n);
        return -EIO;
    }
    return 0;
}

int shm_recv_fds(int sock, void *msg, size_t msg_cap, size_t *msg_len, int *fds, int nfds,
                 int timeout_ms, char *err, size_t errlen) {
    if (!msg || msg_cap == 0 || nfds < 0 || nfds > SHM_MAX_FDS || (nfds > 0 && !fds)) {
        errbuf_set(err, errlen, "shm_recv_fds: buffer of %zu bytes for %d fds (want 0..%d)", msg_cap,
               nfds, SHM_MAX_FDS);
        return -EINVAL;
    }
    if (timeout_ms >= 0) {
        struct pollfd p = { .fd = sock, .events = POLLIN };
        int r;
        while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {}
        if (r < 0) {
            int e = errno;
            errbuf_set(err, errlen, "poll: %s", strerror(e));
            return -e;
        }
        if (r == 0) {
            errbuf_set(err, errlen, "no message from the peer within %d ms", timeout_ms);
            return -ETIMEDOUT;
        }
    }
    struct iovec iov = { .iov_base = msg, .iov_len = msg_cap };
    cmsg_buf_t cb;
    memset(&cb, 0, sizeof cb);
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = cb.buf, .msg_controllen = sizeof cb.buf };
    ssize_t n;
    while ((n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {}
    if (n < 0) {
        int e = errno;
        errbuf_set(err, errlen, "receiving from the peer: %s", strerror(e));
        return -e;
    }
    /* Collect every fd that arrived, whatever happens next. */
    int got[SHM_MAX_FDS + 1];
    int ngot = 0;
    bool foreign = false;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(0)) {
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (ngot < SHM_MAX_FDS + 1) got[ngot++] = fd;
                else close(fd);
            }
        } else {
            foreign = true;
        }
    }
    int rc = 0;
    if (n == 0 && ngot == 0) {
        errbuf_set(err, errlen, "the peer closed the connection");
        rc = -ECONNRESET;
    } else if (mh.msg_flags & MSG_TRUNC) {
        errbuf_set(err, errlen, "message from the peer exceeds %zu bytes; protocol mismatch", msg_cap);
        rc = -EMSGSIZE;
    } else if (mh.msg_flags & MSG_CTRUNC) {
        errbuf_set(err, errlen, "control data from the peer was truncated (more than %d fds sent, "
               "%d expected); protocol mismatch", SHM_MAX_FDS, nfds);
        rc = -EBADMSG;
    } else if (foreign) {
        errbuf_set(err, errlen, "unexpected control message from the peer (only SCM_RIGHTS is "
               "accepted)");
        rc = -EBADMSG;
    } else if (ngot != nfds) {
        errbuf_set(err, errlen, "the peer sent %d fds, %d expected; protocol mismatch", ngot, nfds);
        rc = -EBADMSG;
    }
    if (rc) {
        for (int i = 0; i < ngot; i++) close(got[i]);
        return rc;
    }
    for (int i = 0; i < nfds; i++) fds[i] = got[i];
    if (msg_len) *msg_len = (size_t)n;
    return 0;
}
