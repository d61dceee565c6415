/* test_shm.c: sealed memfd segments, the lock-file guarded listener,
 * SO_PEERCRED checks and SCM_RIGHTS fd passing (common/shm.c). Several
 * tests fork a peer process; the uid checks need root (skipped otherwise). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm.h"
#include "tests/unit/helpers.h"

#define NOBODY 65534

/* ---- helpers ---- */

static uint64_t rng_next(uint64_t *s) { return th_xorshift64s(s); }

static uint64_t test_seed(void) { return th_seed(0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 17)); }

static void fill(void *p, size_t n, uint64_t seed) {
    uint64_t s = seed ? seed : 1;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v = rng_next(&s);
        memcpy((char *)p + i, &v, 8);
    }
}

/* Offset of the first 8-byte word that differs from the pattern, or -1. */
static long long mismatch(const void *p, size_t n, uint64_t seed) {
    uint64_t s = seed ? seed : 1;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v = rng_next(&s), w;
        memcpy(&w, (const char *)p + i, 8);
        if (v != w) return (long long)i;
    }
    return -1;
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    cr_assert(d);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static char tmpdir_path[64];

/* A fresh directory under /tmp that anyone can traverse (for the uid tests)
 * and a socket path in it. */
static void sock_path(char *out, size_t cap) {
    th_tmpdir(tmpdir_path, sizeof tmpdir_path, NULL, "shm");
    chmod(tmpdir_path, 0755);
    snprintf(out, cap, "%s/offload.sock", tmpdir_path);
}

static void rm_tmpdir(void) { th_tmpdir_remove(tmpdir_path); }

/* Child side: report a line to the parent over sock and exit. */
static void child_reply(int sock, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void child_reply(int sock, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    shm_send_fds(sock, msg, strlen(msg) + 1, NULL, 0, NULL, 0);
    _exit(0);
}

/* Drop root for good: nobody/nogroup, no supplementary groups. */
static int become_nobody(void) {
    if (setgroups(0, NULL) < 0) return -1;
    if (setresgid(NOBODY, NOBODY, NOBODY) < 0) return -1;
    return setresuid(NOBODY, NOBODY, NOBODY);
}

/* fork() whose child dies with the test process, so that a failing test
 * never leaves a peer behind holding its pipes. */
static pid_t fork_peer(void) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(99);
    }
    return pid;
}

static void wait_ok(pid_t pid) {
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
}

/* ---- segments ---- */

Test(shm, create_sizes_seals_and_maps) {
    char err[SHM_ERR_LEN];
    shm_seg_t seg;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    cr_assert_eq(shm_create(&seg, "t", 0, 0, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "size 0"), "%s", err);
    cr_assert_eq(seg.fd, -1);

    cr_assert_eq(shm_create(&seg, "t", pg + 1, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(seg.bytes, 2 * pg, "rounded up to pages");
    struct stat st;
    cr_assert_eq(fstat(seg.fd, &st), 0);
    cr_assert_eq((size_t)st.st_size, seg.bytes);
    int seals = fcntl(seg.fd, F_GET_SEALS);
    cr_assert_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, "seals 0x%x", seals);
    cr_assert_eq(seals & F_SEAL_WRITE, 0, "still writable");
    cr_assert(fcntl(seg.fd, F_GETFD) & FD_CLOEXEC);
    uint64_t seed = test_seed();
    fill(seg.base, seg.bytes, seed);
    cr_assert_eq(mismatch(seg.base, seg.bytes, seed), -1);
    shm_destroy(&seg);
    cr_assert_eq(seg.fd, -1);
    shm_destroy(&seg); /* twice is harmless */

    /* huge pages: optional ones always work; mandatory ones work or say why */
    cr_assert_eq(shm_create(&seg, "t-huge", 3 << 20, SHM_HUGE_TRY, err, sizeof err), 0, "%s", err);
    cr_assert_geq(seg.bytes, 3u << 20);
    if (seg.huge) cr_assert_eq(seg.bytes % SHM_HUGE_2M, 0);
    memset(seg.base, 0x5a, seg.bytes);
    cr_log_info("SHM_HUGE_TRY got %s pages", seg.huge ? "2M huge" : "normal");
    shm_destroy(&seg);
    int rc = shm_create(&seg, "t-huge", 1, SHM_HUGE, err, sizeof err);
    if (rc == 0) {
        cr_assert(seg.huge);
        cr_assert_eq(seg.bytes, SHM_HUGE_2M);
        shm_destroy(&seg);
    } else {
        cr_assert(strstr(err, "huge"), "the error names huge pages: %s", err);
        cr_assert_eq(seg.fd, -1);
    }
}

Test(shm, map_fd_refuses_unsealed_and_mismatched_segments) {
    char err[SHM_ERR_LEN];
    shm_seg_t seg;
    int before = count_fds();
    int fd = memfd_create("unsealed", MFD_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 8192), 0);
    cr_assert_eq(shm_map_fd(&seg, fd, 0, err, sizeof err), -EPERM);
    cr_assert(strstr(err, "not sealed"), "%s", err);

    shm_seg_t good;
    cr_assert_eq(shm_create(&good, "t", 8192, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(shm_map_fd(&seg, dup(good.fd), 4096, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "8192 bytes"), "%s", err);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(shm_map_fd(&seg, p[0], 0, err, sizeof err), -EINVAL, "a pipe is no memfd");
    close(p[1]);
    cr_assert_eq(shm_map_fd(&seg, -1, 0, err, sizeof err), -EBADF);
    cr_assert_eq(seg.fd, -1);
    cr_assert_eq(seg.base, NULL);
    /* a good one maps the same bytes */
    fill(good.base, good.bytes, 42);
    cr_assert_eq(shm_map_fd(&seg, dup(good.fd), 8192, err, sizeof err), 0, "%s", err);
    cr_assert_neq(seg.base, good.base);
    cr_assert_eq(mismatch(seg.base, seg.bytes, 42), -1);
    shm_destroy(&seg);
    shm_destroy(&good);
    cr_assert_eq(count_fds(), before, "every refused fd was closed");
}

Test(shm, lock_failure_names_rlimit_memlock) {
#ifdef __SANITIZE_ADDRESS__
    cr_skip_test("AddressSanitizer turns mlock() into a no-op that succeeds; checked in the plain build");
#endif
    char err[SHM_ERR_LEN];
    shm_seg_t seg;
    cr_assert_eq(shm_create(&seg, "t-lock", 1 << 20, 0, err, sizeof err), 0, "%s", err);
    int rc = shm_lock(&seg, err, sizeof err);
    if (rc == 0) cr_assert(seg.locked);
    shm_destroy(&seg);
    /* A process without CAP_IPC_LOCK and a 64 KiB limit cannot lock 4 MiB. */
    int sv[2];
    cr_assert_eq(shm_socketpair(sv, err, sizeof err), 0, "%s", err);
    pid_t pid = fork_peer();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct rlimit rl = { 64 << 10, 64 << 10 };
        if (setrlimit(RLIMIT_MEMLOCK, &rl) < 0) child_reply(sv[1], "setrlimit: %s", strerror(errno));
        if (geteuid() == 0 && become_nobody() < 0) child_reply(sv[1], "setresuid: %s", strerror(errno));
        shm_seg_t s;
        if (shm_create(&s, "t-lock", 4 << 20, 0, err, sizeof err)) child_reply(sv[1], "create: %s", err);
        int r = shm_lock(&s, err, sizeof err);
        memset(s.base, 1, s.bytes); /* still usable */
        child_reply(sv[1], "rc=%d %s", r, err);
    }
    char msg[300] = "";
    size_t len;
    cr_assert_eq(shm_recv_fds(sv[0], msg, sizeof msg - 1, &len, NULL, 0, 10000, err, sizeof err), 0, "%s", err);
    wait_ok(pid);
    cr_assert(strncmp(msg, "rc=-12 ", 7) == 0 || strncmp(msg, "rc=-1 ", 6) == 0,
              "want -ENOMEM or -EPERM: %s", msg);
    cr_assert(strstr(msg, "RLIMIT_MEMLOCK is 65536 bytes"), "%s", msg);
    cr_assert(strstr(msg, "ulimit -l"), "the message says how to fix it: %s", msg);
}

/* ---- fd passing between processes ---- */

/* The child connects, receives the segment, checks the parent's pattern,
 * writes its own and reports. */
static void peer_child(const char *path, uint64_t seed) __attribute__((noreturn));
static void peer_child(const char *path, uint64_t seed) {
    char err[SHM_ERR_LEN];
    int sock;
    if (shm_connect(path, &sock, err, sizeof err)) _exit(10);
    struct { uint64_t bytes, seed; } hello;
    size_t len;
    int fd;
    if (shm_recv_fds(sock, &hello, sizeof hello, &len, &fd, 1, 10000, err, sizeof err))
        child_reply(sock, "recv: %s", err);
    if (len != sizeof hello) child_reply(sock, "hello of %zu bytes", len);
    shm_seg_t seg;
    if (shm_map_fd(&seg, fd, hello.bytes, err, sizeof err)) child_reply(sock, "map: %s", err);
    long long at = mismatch(seg.base, seg.bytes, hello.seed);
    if (at >= 0) child_reply(sock, "parent's pattern differs at byte %lld", at);
    if (ftruncate(seg.fd, (off_t)seg.bytes / 2) == 0 || errno != EPERM)
        child_reply(sock, "shrinking was not refused with EPERM (%s)", strerror(errno));
    if (ftruncate(seg.fd, (off_t)seg.bytes * 2) == 0 || errno != EPERM)
        child_reply(sock, "growing was not refused with EPERM (%s)", strerror(errno));
    fill(seg.base, seg.bytes, seed);
    shm_destroy(&seg);
    child_reply(sock, "ok");
}

Test(shm, memfd_over_listening_socket_maps_the_same_bytes, .fini = rm_tmpdir) {
    char path[128], err[SHM_ERR_LEN];
    sock_path(path, sizeof path);
    shm_listener_t l;
    cr_assert_eq(shm_listen(&l, path, 0, err, sizeof err), 0, "%s", err);
    uint64_t seed = test_seed(), seed2 = seed * 31 + 7;
    pid_t pid = fork_peer();
    cr_assert_geq(pid, 0);
    if (pid == 0) peer_child(path, seed2);
    int conn;
    shm_peer_t peer;
    cr_assert_eq(shm_accept(l.fd, NULL, &conn, &peer, err, sizeof err), 0, "%s", err);
    cr_assert_eq(peer.pid, pid);
    cr_assert_eq(peer.uid, geteuid());
    shm_seg_t seg;
    size_t bytes = (1 << 20) + (size_t)(seed % 64) * 4096;
    cr_assert_eq(shm_create(&seg, "t-pass", bytes, 0, err, sizeof err), 0, "%s", err);
    fill(seg.base, seg.bytes, seed);
    struct { uint64_t bytes, seed; } hello = { seg.bytes, seed };
    cr_assert_eq(shm_send_fds(conn, &hello, sizeof hello, &seg.fd, 1, err, sizeof err), 0, "%s", err);
    char reply[256] = "";
    size_t len;
    cr_assert_eq(shm_recv_fds(conn, reply, sizeof reply - 1, &len, NULL, 0, 10000, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(reply, "ok");
    long long at = mismatch(seg.base, seg.bytes, seed2);
    cr_assert_eq(at, -1, "the child's pattern differs at byte %lld", at);
    struct stat st;
    cr_assert_eq(fstat(seg.fd, &st), 0);
    cr_assert_eq((size_t)st.st_size, seg.bytes, "size unchanged");
    wait_ok(pid);
    close(conn);
    shm_destroy(&seg);
    shm_listener_close(&l);
    struct stat ls;
    cr_assert_eq(stat(path, &ls), -1, "socket file removed");
}

Test(shm, sealed_segment_cannot_be_resized_by_the_receiver) {
    char err[SHM_ERR_LEN];
    int sv[2];
    cr_assert_eq(shm_socketpair(sv, err, sizeof err), 0, "%s", err);
    shm_seg_t seg;
    cr_assert_eq(shm_create(&seg, "t-seal", 256 << 10, 0, err, sizeof err), 0, "%s", err);
    pid_t pid = fork_peer();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        int fd;
        size_t len;
        char m[8];
        if (shm_recv_fds(sv[1], m, sizeof m, &len, &fd, 1, 10000, err, sizeof err))
            child_reply(sv[1], "recv: %s", err);
        struct stat st;
        fstat(fd, &st);
        if (ftruncate(fd, st.st_size / 2) == 0 || errno != EPERM)
            child_reply(sv[1], "shrink: %s", strerror(errno));
        if (ftruncate(fd, 0) == 0 || errno != EPERM) child_reply(sv[1], "truncate to 0: %s", strerror(errno));
        if (ftruncate(fd, st.st_size * 4) == 0 || errno != EPERM)
            child_reply(sv[1], "grow: %s", strerror(errno));
        if (fallocate(fd, 0, st.st_size, 4096) == 0 || errno != EPERM)
            child_reply(sv[1], "fallocate past the end: %s", strerror(errno));
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0 || errno != EPERM)
            child_reply(sv[1], "adding a seal: %s", strerror(errno));
        child_reply(sv[1], "ok");
    }
    close(sv[1]);
    cr_assert_eq(shm_send_fds(sv[0], "seg", 4, &seg.fd, 1, err, sizeof err), 0, "%s", err);
    char reply[256] = "";
    size_t len;
    cr_assert_eq(shm_recv_fds(sv[0], reply, sizeof reply - 1, &len, NULL, 0, 10000, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(reply, "ok");
    wait_ok(pid);
    struct stat st;
    cr_assert_eq(fstat(seg.fd, &st), 0);
    cr_assert_eq((size_t)st.st_size, seg.bytes);
    memset(seg.base, 0xa5, seg.bytes); /* every page is still there: no SIGBUS */
    close(sv[0]);
    shm_destroy(&seg);
}

/* ---- peer credentials ---- */

/* Wait (at most 20 s) for a connection on the listener, so that a peer
 * that could not connect fails the test instead of hanging it. */
static void wait_connection(int lfd, pid_t peer) {
    struct pollfd p = { .fd = lfd, .events = POLLIN };
    int rc = poll(&p, 1, 20000);
    if (rc <= 0) {
        int st = 0;
        pid_t w = waitpid(peer, &st, WNOHANG);
        cr_assert_fail("no connection within 20 s (peer %s, exit %d)", w == peer ? "exited" : "still running",
                       w == peer && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

Test(shm, peer_with_wrong_uid_is_refused, .fini = rm_tmpdir) {
    if (geteuid() != 0) cr_skip_test("needs root to run a peer as another uid (uid %u)", geteuid());
    char path[128], err[SHM_ERR_LEN];
    sock_path(path, sizeof path);
    shm_listener_t l;
    cr_assert_eq(shm_listen(&l, path, 0, err, sizeof err), 0, "%s", err);
    /* the file mode is not under test here (the socket is 0660): let
     * nobody reach the peer-credential check */
    cr_assert_eq(chmod(path, 0666), 0, "chmod %s: %s", path, strerror(errno));
    /* 1: nobody connects; the default set (our uid and root) refuses it */
    pid_t pid = fork_peer();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (become_nobody() < 0) _exit(10);
        int s;
        if (shm_connect(path, &s, err, sizeof err)) _exit(11);
        char m[8];
        int rc = shm_recv_fds(s, m, sizeof m, NULL, NULL, 0, 10000, err, sizeof err);
        _exit(rc == -ECONNRESET ? 0 : 12); /* the service hung up on us */
    }
    int conn = -1;
    shm_peer_t peer = { 0 };
    wait_connection(l.fd, pid);
    int rc = shm_accept(l.fd, NULL, &conn, &peer, err, sizeof err);
    cr_assert_eq(rc, -EACCES, "%s", err);
    cr_assert_eq(conn, -1);
    char want[64];
    snprintf(want, sizeof want, "uid %d", NOBODY);
    cr_assert(strstr(err, want), "the message names the uid: %s", err);
    snprintf(want, sizeof want, "pid %ld", (long)pid);
    cr_assert(strstr(err, want), "the message names the pid: %s", err);
    cr_assert_eq(peer.uid, NOBODY);
    wait_ok(pid);

    /* 2: the listener still serves: a root peer is accepted */
    pid = fork_peer();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int s;
        if (shm_connect(path, &s, err, sizeof err)) _exit(11);
        char m[8];
        _exit(shm_recv_fds(s, m, sizeof m, NULL, NULL, 0, 10000, err, sizeof err) == 0 ? 0 : 12);
    }
    wait_connection(l.fd, pid);
    cr_assert_eq(shm_accept(l.fd, NULL, &conn, &peer, err, sizeof err), 0, "%s", err);
    cr_assert_eq(peer.uid, 0);
    cr_assert_eq(peer.pid, pid);
    cr_assert_eq(shm_send_fds(conn, "hi", 3, NULL, 0, err, sizeof err), 0, "%s", err);
    wait_ok(pid);
    close(conn);

    /* 3: an explicit set that names nobody accepts it, and only it */
    shm_uidset_t only = { .n = 0 };
    cr_assert_eq(shm_uidset_add(&only, NOBODY), 0);
    cr_assert(!shm_uidset_has(&only, 0));
    pid = fork_peer();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (become_nobody() < 0) _exit(10);
        int s;
        if (shm_connect(path, &s, err, sizeof err)) _exit(11);
        char m[8];
        _exit(shm_recv_fds(s, m, sizeof m, NULL, NULL, 0, 10000, err, sizeof err) == 0 ? 0 : 12);
    }
    wait_connection(l.fd, pid);
    cr_assert_eq(shm_accept(l.fd, &only, &conn, &peer, err, sizeof err), 0, "%s", err);
    cr_assert_eq(peer.uid, NOBODY);
    cr_assert_eq(shm_send_fds(conn, "hi", 3, NULL, 0, err, sizeof err), 0, "%s", err);
    wait_ok(pid);
    close(conn);
    shm_listener_close(&l);
}

Test(shm, peer_cred_and_uid_sets) {
    char err[SHM_ERR_LEN];
    int sv[2];
    cr_assert_eq(shm_socketpair(sv, err, sizeof err), 0, "%s", err);
    shm_peer_t p;
    cr_assert_eq(shm_peer_cred(sv[0], &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(p.pid, getpid());
    cr_assert_eq(p.uid, geteuid());
    cr_assert_eq(p.gid, getegid());
    cr_assert_eq(shm_check_peer(sv[0], NULL, &p, err, sizeof err), 0, "%s", err);
    shm_uidset_t set = { .n = 0 };
    cr_assert_eq(shm_uidset_add(&set, geteuid() + 1000), 0);
    cr_assert_eq(shm_check_peer(sv[0], &set, &p, err, sizeof err), -EACCES);
    cr_assert(strstr(err, "is not allowed"), "%s", err);
    shm_uidset_default(&set);
    cr_assert(shm_uidset_has(&set, 0) && shm_uidset_has(&set, geteuid()));
    for (uid_t u = 1; u <= SHM_MAX_UIDS + 2; u++) shm_uidset_add(&set, 5000 + u);
    cr_assert_eq(set.n, SHM_MAX_UIDS);
    cr_assert_eq(shm_uidset_add(&set, 9999), -ENOSPC);
    int p2[2];
    cr_assert_eq(pipe(p2), 0);
    cr_assert_lt(shm_peer_cred(p2[0], &p, err, sizeof err), 0, "a pipe has no peer credentials");
    close(p2[0]);
    close(p2[1]);
    close(sv[0]);
    close(sv[1]);
}

/* ---- the listener's lock ---- */

Test(shm, second_listener_refused_while_the_first_lives, .fini = rm_tmpdir) {
    char path[128], err[SHM_ERR_LEN];
    sock_path(path, sizeof path);
    int ready[2], hold[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(hold), 0);
    pid_t pid = fork_peer();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* the first instance */
        shm_listener_t l;
        char c = shm_listen(&l, path, 0, err, sizeof err) == 0 ? 'y' : 'n';
        close(ready[0]);
        close(hold[1]);
        if (write(ready[1], &c, 1) != 1) _exit(1);
        if (read(hold[0], &c, 1) < 0) _exit(1); /* until the parent is done or gone */
        shm_listener_close(&l);
        _exit(0);
    }
    char c = 0;
    cr_assert_eq(read(ready[0], &c, 1), 1);
    cr_assert_eq(c, 'y');
    shm_listener_t l2;
    cr_assert_eq(shm_listen(&l2, path, 0, err, sizeof err), -EADDRINUSE);
    cr_assert(strstr(err, path), "the message names the path: %s", err);
    char want[32];
    snprintf(want, sizeof want, "pid %ld", (long)pid);
    cr_assert(strstr(err, want), "the message names the holder: %s", err);
    cr_assert_eq(l2.fd, -1);
    int lk;
    cr_assert_eq(shm_lock_path(path, &lk, err, sizeof err), -EADDRINUSE);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "the first socket is untouched");
    /* a client still reaches the first instance */
    int s;
    cr_assert_eq(shm_connect(path, &s, err, sizeof err), 0, "%s", err);
    close(s);

    /* the first one dies without cleaning up: stale socket and lock file */
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert(S_ISSOCK(st.st_mode), "a stale socket file is left");
    cr_assert_eq(shm_connect(path, &s, err, sizeof err), -ECONNREFUSED);
    cr_assert(strstr(err, "running"), "%s", err);
    cr_assert_eq(shm_listen(&l2, path, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(shm_connect(path, &s, err, sizeof err), 0, "%s", err);
    int conn;
    cr_assert_eq(shm_accept(l2.fd, NULL, &conn, NULL, err, sizeof err), 0, "%s", err);
    close(conn);
    close(s);
    shm_listener_close(&l2);
    char lp[160];
    snprintf(lp, sizeof lp, "%s.lock", path);
    cr_assert_eq(stat(path, &st), -1, "socket removed on close");
    cr_assert_eq(stat(lp, &st), -1, "lock removed on close");

    /* a graceful first instance: its close lets the next one in */
    shm_listener_t a, b;
    cr_assert_eq(shm_listen(&a, path, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(shm_listen(&b, path, 0, err, sizeof err), -EADDRINUSE, "also within one process");
    shm_listener_close(&a);
    cr_assert_eq(shm_listen(&b, path, 0, err, sizeof err), 0, "%s", err);
    shm_listener_close(&b);

    /* a path that is not a socket is left alone */
    char other[160];
    snprintf(other, sizeof other, "%s/not-a-socket", tmpdir_path);
    int fd = open(other, O_CREAT | O_WRONLY, 0644);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(shm_listen(&a, other, 0, err, sizeof err), -EEXIST);
    cr_assert(strstr(err, "not a socket"), "%s", err);
    cr_assert_eq(stat(other, &st), 0, "not removed");
    char long_path[200];
    memset(long_path, 'x', sizeof long_path - 1);
    long_path[0] = '/';
    long_path[sizeof long_path - 1] = 0;
    cr_assert_eq(shm_listen(&a, long_path, 0, err, sizeof err), -ENAMETOOLONG);
    cr_assert_eq(shm_connect("/tmp/ballast-no-such-dir/x.sock", &s, err, sizeof err), -ENOENT);
}

/* ---- control message validation ---- */

static void send_raw_fds(int sock, int nfds, int fd) {
    int fds[64];
    for (int i = 0; i < nfds; i++) fds[i] = fd;
    char data = 'x';
    struct iovec iov = { &data, 1 };
    union { struct cmsghdr h; char b[CMSG_SPACE(sizeof fds)]; } cb;
    memset(&cb, 0, sizeof cb);
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds) };
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    cr_assert_eq(sendmsg(sock, &mh, 0), 1, "sendmsg: %s", strerror(errno));
}

Test(shm, recv_fds_validates_the_control_message) {
    char err[SHM_ERR_LEN], m[64];
    size_t len;
    int sv[2], got[4] = { -1, -1, -1, -1 };
    cr_assert_eq(shm_socketpair(sv, err, sizeof err), 0, "%s", err);
    int f1 = memfd_create("a", MFD_CLOEXEC), f2 = memfd_create("b", MFD_CLOEXEC);
    int f3 = memfd_create("c", MFD_CLOEXEC);
    cr_assert(f1 >= 0 && f2 >= 0 && f3 >= 0);
    int three[3] = { f1, f2, f3 };
    int base = count_fds();

    /* the happy path: three fds, same files, close-on-exec */
    cr_assert_eq(shm_send_fds(sv[0], "three", 6, three, 3, err, sizeof err), 0, "%s", err);
    cr_assert_eq(shm_recv_fds(sv[1], m, sizeof m, &len, got, 3, 1000, err, sizeof err), 0, "%s", err);
    cr_assert_eq(len, 6);
    cr_assert_str_eq(m, "three");
    for (int i = 0; i < 3; i++) {
        struct stat a, b;
        fstat(three[i], &a);
        fstat(got[i], &b);
        cr_assert(a.st_ino == b.st_ino && got[i] != three[i], "fd %d is the same file", i);
        cr_assert(fcntl(got[i], F_GETFD) & FD_CLOEXEC);
        close(got[i]);
    }
    cr_assert_eq(count_fds(), base);

    /* more fds than expected: refused, all closed */
    cr_assert_eq(shm_send_fds(sv[0], "two", 4, three, 2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(shm_recv_fds(sv[1], m, sizeof m, &len, got, 1, 1000, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "2 fds, 1 expected"), "%s", err);
    cr_assert_eq(count_fds(), base, "the extra fds were closed");
    /* fewer */
    cr_assert_eq(shm_send_fds(sv[0], "none", 5, NULL, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(shm_recv_fds(sv[1], m, sizeof m, &len, got, 1, 1000, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "0 fds, 1 expected"), "%s", err);
    /* so many that the control data is truncated */
    send_raw_fds(sv[0], 40, f1);
    cr_assert_eq(shm_recv_fds(sv[1], m, sizeof m, &len, got, 1, 1000, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "truncated"), "%s", err);
    cr_assert_eq(count_fds(), base, "no fd leaked from a truncated message");
    /* a message longer than the buffer, with an fd */
    char big[512];
    memset(big, 'b', sizeof big);
    cr_assert_eq(shm_send_fds(sv[0], big, sizeof big, three, 1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(shm_recv_fds(sv[1], m, sizeof m, &len, got, 1, 1000, err, sizeof err), -EMSGSIZE);
    cr_assert_eq(count_fds(), base);
    /* nothing arrives */
    cr_assert_eq(shm_recv_fds(sv[1], m, sizeof m, &len, got, 1, 50, err, sizeof err), -ETIMEDOUT);
    cr_assert(strstr(err, "50 ms"), "%s", err);
    /* credentials riding along are not SCM_RIGHTS: refused */
    int on = 1;
    cr_assert_eq(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof on), 0);
    cr_assert_eq(shm_send_fds(sv[0], "cred", 5, three, 1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(shm_recv_fds(sv[1], m, sizeof m, &len, got, 1, 1000, err, sizeof err), -EBADMSG);
    cr_assert(strstr(err, "unexpected control message"), "%s", err);
    cr_assert_eq(count_fds(), base);
    on = 0;
    setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
    /* bad arguments */
    int many[SHM_MAX_FDS + 1];
    for (int i = 0; i <= SHM_MAX_FDS; i++) many[i] = f1;
    cr_assert_eq(shm_send_fds(sv[0], "x", 2, many, SHM_MAX_FDS + 1, err, sizeof err), -EINVAL);
    cr_assert_eq(shm_send_fds(sv[0], "x", 0, NULL, 0, err, sizeof err), -EINVAL);
    cr_assert_eq(shm_recv_fds(sv[1], m, sizeof m, &len, got, SHM_MAX_FDS + 1, 0, err, sizeof err), -EINVAL);
    /* the peer goes away */
    close(sv[0]);
    cr_assert_eq(shm_recv_fds(sv[1], m, sizeof m, &len, got, 1, 1000, err, sizeof err), -ECONNRESET);
    cr_assert(strstr(err, "closed"), "%s", err);
    int s2[2];
    cr_assert_eq(shm_socketpair(s2, err, sizeof err), 0);
    close(s2[1]);
    cr_assert_eq(shm_send_fds(s2[0], "x", 2, NULL, 0, err, sizeof err), -EPIPE);
    cr_assert(strstr(err, "went away"), "%s", err);
    close(s2[0]);
    close(sv[1]);
    close(f1);
    close(f2);
    close(f3);
}

/* ShmemPmdMapped of the /proc/self/smaps entry that starts at base, kB; -1
 * when no entry starts there. */
static long long smaps_pmd_kb(const void *base) {
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert(f, "/proc/self/smaps: %s", strerror(errno));
    char line[512];
    bool in = false;
    long long kb = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            in = lo == (unsigned long)(uintptr_t)base;
            continue;
        }
        if (in && sscanf(line, "ShmemPmdMapped: %lld kB", &kb) == 1) break;
    }
    fclose(f);
    return kb;
}

/* Page frame of the 4 KiB page at p (root only: others read 0), or 0. */
static uint64_t pfn_of(int pagemap, const void *p) {
    uint64_t e = 0;
    off_t at = (off_t)((uintptr_t)p / 4096 * 8);
    if (pread(pagemap, &e, 8, at) != 8 || !(e >> 63)) return 0;
    return e & ((1ull << 55) - 1);
}

/* Whether this kernel collapses a 2 MiB-aligned, touched shared memfd
 * mapping into a huge page, asked without shm.c (so that a refusal by
 * shm_create of a kernel that can is a failure, not a skip). 0 or errno. */
static int kernel_collapses_shmem(void) {
    size_t h = SHM_HUGE_2M;
    int fd = memfd_create("t-thp-probe", MFD_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)h), 0);
    char *r = mmap(NULL, 2 * h, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(r, MAP_FAILED);
    char *a = (char *)(((uintptr_t)r + h - 1) & ~(uintptr_t)(h - 1));
    cr_assert_neq(mmap(a, h, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0), MAP_FAILED);
    a[0] = 1;
    int e = madvise(a, h, 25 /* MADV_COLLAPSE */) == 0 ? 0 : errno;
    munmap(r, 2 * h);
    close(fd);
    return e;
}

Test(shm, thp_segment_is_aligned_collapsed_and_contiguous) {
    char err[SHM_ERR_LEN];
    shm_seg_t seg;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = (8u << 20) + 3 * pg; /* four huge pages and a tail of normal ones */
    cr_assert_eq(shm_create(&seg, "t-thp", bytes, SHM_THP, err, sizeof err), 0, "%s", err);
    cr_assert_eq(seg.bytes, bytes);
    cr_assert_not(seg.huge);
    cr_assert_eq((uintptr_t)seg.base % SHM_HUGE_2M, 0, "base %p is not at a 2 MiB boundary", seg.base);
    int seals = fcntl(seg.fd, F_GET_SEALS);
    cr_assert_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, "seals 0x%x", seals);
    for (size_t i = 0; i < seg.bytes; i += 8) {
        uint64_t w;
        memcpy(&w, (char *)seg.base + i, 8);
        cr_assert_eq(w, 0, "a fresh segment holds a nonzero word at %zu", i);
    }
    if (!seg.thp_bytes) {
        cr_assert_neq(seg.thp_errno, 0);
        int k = kernel_collapses_shmem();
        cr_assert_neq(k, 0, "shm_create was refused (%s) where the kernel collapses a probe mapping",
                      shm_thp_why(seg.thp_errno));
        char why[256];
        snprintf(why, sizeof why, "the kernel refused transparent huge pages: %s", shm_thp_why(seg.thp_errno));
        shm_destroy(&seg);
        cr_skip_test("%s", why);
    }
    cr_assert_eq(seg.thp_bytes, 8u << 20, "collapsed %zu bytes", seg.thp_bytes);
    cr_assert_eq(seg.thp_errno, 0);
    long long kb = smaps_pmd_kb(seg.base);
    cr_assert_eq(kb, 8192, "smaps shows %lld kB of the segment mapped by huge pages, not 8192", kb);

    /* physically contiguous within each 2 MiB (frames are readable by root only) */
    int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    cr_assert_geq(pm, 0);
    if (pfn_of(pm, seg.base)) {
        for (size_t h = 0; h < seg.thp_bytes; h += SHM_HUGE_2M) {
            uint64_t first = pfn_of(pm, (char *)seg.base + h);
            cr_assert_eq(first % (SHM_HUGE_2M / 4096), 0, "huge page at %zu starts at frame %llu", h,
                         (unsigned long long)first);
            for (size_t o = 4096; o < SHM_HUGE_2M; o += 4096) {
                uint64_t f = pfn_of(pm, (char *)seg.base + h + o);
                cr_assert_eq(f, first + o / 4096, "page %zu of the huge page at %zu is frame %llu, not %llu",
                             o / 4096, h, (unsigned long long)f, (unsigned long long)(first + o / 4096));
            }
        }
    } else {
        cr_log_info("page frames unreadable (not root): contiguity not checked");
    }
    close(pm);

    /* a peer mapping the memfd sees the same bytes, both ways */
    uint64_t seed = test_seed();
    fill(seg.base, seg.bytes, seed);
    shm_seg_t peer;
    cr_assert_eq(shm_map_fd(&peer, dup(seg.fd), seg.bytes, err, sizeof err), 0, "%s", err);
    cr_assert_eq((uintptr_t)peer.base % SHM_HUGE_2M, 0, "the peer's base %p is not at a 2 MiB boundary", peer.base);
    cr_assert_eq(mismatch(peer.base, peer.bytes, seed), -1);
    kb = smaps_pmd_kb(peer.base);
    cr_assert_eq(kb, 8192, "the peer sees %lld kB of the segment mapped by huge pages, not 8192", kb);
    fill(peer.base, peer.bytes, seed ^ 0x5555);
    cr_assert_eq(mismatch(seg.base, seg.bytes, seed ^ 0x5555), -1);
    shm_destroy(&peer);
    shm_destroy(&seg);
    cr_assert_eq(seg.thp_bytes, 0);
}

Test(shm, thp_below_one_huge_page_is_refused_and_usable) {
    char err[SHM_ERR_LEN];
    shm_seg_t seg;
    cr_assert_eq(shm_create(&seg, "t-thp-small", 1u << 20, SHM_THP, err, sizeof err), 0, "%s", err);
    cr_assert_eq(seg.thp_bytes, 0);
    cr_assert_eq(seg.thp_errno, ERANGE);
    cr_assert(strstr(shm_thp_why(seg.thp_errno), "2 MiB"), "%s", shm_thp_why(seg.thp_errno));
    uint64_t seed = test_seed();
    fill(seg.base, seg.bytes, seed);
    cr_assert_eq(mismatch(seg.base, seg.bytes, seed), -1);
    shm_destroy(&seg);
    /* refusals name their fix */
    cr_assert(strstr(shm_thp_why(EINVAL), "shmem_enabled"), "%s", shm_thp_why(EINVAL));
    cr_assert(strstr(shm_thp_why(EAGAIN), "nr_hugepages"), "%s", shm_thp_why(EAGAIN));
}
