/* offload_trust.c: a victim job and a hostile one against ballastd, used by
 * tests/integration/ballastd_trust.sh.
 *
 *   offload_trust victim --addr A --job J --count N --state F [--seed S]
 *       open a remote-mode session, put N random blobs (every other one
 *       persistent), write "<session id hex> <count>" to F, then keep the
 *       session alive until F.go exists and check every blob byte for byte
 *       (exit 1 on any difference, 3 when F.go never came)
 *   offload_trust attack --addr A --state F --job J [--token T] [--fd-socket P]
 *       with the victim's session id from F: every RPC on that session, its
 *       job and its keys (and an fd-socket attach to the session); prints
 *       one line per attempt and exits with the number that succeeded (a
 *       call that neither is refused nor answers within 10 s counts, and
 *       ends the attack)
 *   offload_trust jobs --addr A --state F --count N [--seed S]
 *       N times: OpenSession of a new job name, Put, CloseSession,
 *       Release of the job; then ListKeys of N never-seen job names; every
 *       call must succeed (the job table must reuse released slots and a
 *       listing must register nothing); F is unused but required
 *   offload_trust memory --addr A --state F --fd-socket P --job J --count N [--seed S] [--token T]
 *       a hostile job (J, not the victim's) stores blobs of its own, opens a
 *       shared-memory session, attaches, and asks the fd socket for every
 *       segment id it can guess (slots 0..127 of generations 0..3); it maps
 *       every fd it receives, searches them for the victim's blobs (N blobs
 *       from seed S, as the victim made them) and for its own (the positive
 *       control), then writes garbage over every mapping and punches holes
 *       in every fd. Prints what it found; exits 0 only when no victim byte
 *       pattern was visible, its own was, and it received at least one fd
 *   offload_trust stats --addr A --state F [--token T]
 *       exit 0 when Stats shows the victim's session id (and job), 1 when not
 *
 * Exit status 2 for usage errors. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "offload.pb-c.h"
#include "proto/offload_ring.h"
#include "rpc.h"
#include "shm.h"

#define SVC "/ballast.offload.v1.Offload/"
#define PB(x) ((const ProtobufCMessage *)(x))
#define D(name) &ballast__offload__v1__##name##__descriptor

static const char *g_addr, *g_job = "victim", *g_state, *g_token = "", *g_fd_socket;
static int g_count = 16;
static uint64_t g_seed = 1;
static rpc_client_t *g_rpc;

static uint64_t rnd(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* A call's deadline: generous for the victim's own work; short for an
 * attack, which ballastd must refuse at once: an attack that gets through
 * and then blocks (a Put waiting for space in the victim's job) fails in
 * seconds, not after the script's timeout. */
static int64_t g_deadline_ms = 20000;

static grpc_status_code call(const char *m, const ProtobufCMessage *rq,
                             const ProtobufCMessageDescriptor *rd, ProtobufCMessage **rs, char *msg,
                             size_t msglen) {
    char path[128];
    snprintf(path, sizeof path, SVC "%s", m);
    *rs = NULL;
    return rpc_call(g_rpc, path, rq, rd, rs, g_deadline_ms, true, msg, msglen);
}

/* Blob i of the victim: length and bytes follow from (seed, i). */
static size_t blob_bytes(uint64_t seed, int i, uint8_t *buf, size_t cap) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i + 1;
    size_t n = 1 + rnd(&s) % cap;
    for (size_t k = 0; k < n; k++) buf[k] = (uint8_t)rnd(&s);
    return n;
}

static void key_of(int i, Ballast__Offload__V1__Key *k) {
    ballast__offload__v1__key__init(k);
    k->rank = 0;
    k->kind = BALLAST__OFFLOAD__V1__KIND__OTHER;
    k->index = (uint64_t)i;
    k->step = 7;
}

static int file_exists(const char *p) { return access(p, F_OK) == 0; }

/* ---- victim ---- */

static int cmd_victim(void) {
    enum { CAP = 65536 };
    static uint8_t buf[CAP];
    char msg[1024];
    Ballast__Offload__V1__OpenSessionRequest o = BALLAST__OFFLOAD__V1__OPEN_SESSION_REQUEST__INIT;
    o.job = (char *)g_job;
    o.token = (char *)g_token;
    o.client_name = "victim";
    ProtobufCMessage *r;
    grpc_status_code st = call("OpenSession", PB(&o), D(open_session_response), &r, msg, sizeof msg);
    if (st) { fprintf(stderr, "victim: OpenSession: %s\n", msg); return 1; }
    uint64_t sid = ((Ballast__Offload__V1__OpenSessionResponse *)r)->session_id;
    protobuf_c_message_free_unpacked(r, NULL);
    for (int i = 0; i < g_count; i++) {
        Ballast__Offload__V1__PutRequest p = BALLAST__OFFLOAD__V1__PUT_REQUEST__INIT;
        Ballast__Offload__V1__Key k;
        key_of(i, &k);
        p.session_id = sid;
        p.key = &k;
        p.data.data = buf;
        p.data.len = blob_bytes(g_seed, i, buf, CAP);
        p.persistent = i % 2;
        st = call("Put", PB(&p), D(put_response), &r, msg, sizeof msg);
        if (st) { fprintf(stderr, "victim: Put %d: %s\n", i, msg); return 1; }
        protobuf_c_message_free_unpacked(r, NULL);
    }
    char tmp[4200], go[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_state);
    snprintf(go, sizeof go, "%s.go", g_state);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%016" PRIx64 " %d\n", sid, g_count) < 0 || fclose(f) || rename(tmp, g_state)) {
        fprintf(stderr, "victim: cannot write %s\n", g_state);
        return 1;
    }
    printf("victim: session %016" PRIx64 " holds %d blobs\n", sid, g_count);
    fflush(stdout);
    for (int t = 0; !file_exists(go); t++) {
        if (t > 2400) { fprintf(stderr, "victim: %s never appeared\n", go); return 3; }
        Ballast__Offload__V1__HeartbeatRequest h = BALLAST__OFFLOAD__V1__HEARTBEAT_REQUEST__INIT;
        h.session_id = sid;
        st = call("Heartbeat", PB(&h), D(heartbeat_response), &r, msg, sizeof msg);
        if (st) { fprintf(stderr, "victim: its own Heartbeat failed: %s\n", msg); return 1; }
        protobuf_c_message_free_unpacked(r, NULL);
        usleep(100000);
    }
    int bad = 0;
    for (int i = 0; i < g_count; i++) {
        Ballast__Offload__V1__GetRequest g = BALLAST__OFFLOAD__V1__GET_REQUEST__INIT;
        Ballast__Offload__V1__Key k;
        key_of(i, &k);
        g.session_id = sid;
        g.key = &k;
        size_t n = blob_bytes(g_seed, i, buf, CAP);
        st = call("Get", PB(&g), D(get_response), &r, msg, sizeof msg);
        if (st) { fprintf(stderr, "victim: Get %d: %s\n", i, msg); bad++; continue; }
        Ballast__Offload__V1__GetResponse *gr = (void *)r;
        if (gr->data.len != n || memcmp(gr->data.data, buf, n)) {
            fprintf(stderr, "victim: blob %d changed (%zu bytes, want %zu)\n", i, gr->data.len, n);
            bad++;
        }
        protobuf_c_message_free_unpacked(r, NULL);
    }
    printf("victim: %d of %d blobs byte-exact\n", g_count - bad, g_count);
    return bad ? 1 : 0;
}

/* ---- attack ---- */

static int read_state(uint64_t *sid, int *count) {
    FILE *f = fopen(g_state, "r");
    if (!f) { fprintf(stderr, "cannot read %s\n", g_state); return -1; }
    int n = fscanf(f, "%" SCNx64 " %d", sid, count);
    fclose(f);
    return n == 2 ? 0 : -1;
}

static int g_won;

/* One attempt: it must be refused. One that ran into its deadline was
 * neither refused nor answered: ballastd refuses an attack at once, so that
 * counts as a breach, and the attack stops there (the calls after it would
 * stall the same way). */
static void attempt(const char *what, grpc_status_code st, const char *msg) {
    bool stalled = st == GRPC_STATUS_DEADLINE_EXCEEDED;
    if (st == GRPC_STATUS_OK || stalled) g_won++;
    printf("%s %s -> %s%s%s\n", st == GRPC_STATUS_OK ? "SUCCEEDED" : stalled ? "STALLED" : "refused", what,
           rpc_status_name(st), msg[0] ? ": " : "", msg);
    if (stalled) {
        printf("attack: stopped at a call ballastd neither refused nor answered in %lld ms; %d attempt(s) "
               "succeeded or stalled\n", (long long)g_deadline_ms, g_won);
        fflush(stdout);
        exit(g_won);
    }
}

static bool stats_shows(uint64_t sid, const char *job) {
    char msg[1024];
    Ballast__Offload__V1__StatsRequest q = BALLAST__OFFLOAD__V1__STATS_REQUEST__INIT;
    q.token = (char *)g_token;
    ProtobufCMessage *r;
    if (call("Stats", PB(&q), D(stats_response), &r, msg, sizeof msg)) {
        fprintf(stderr, "Stats: %s\n", msg);
        return false;
    }
    Ballast__Offload__V1__StatsResponse *sr = (void *)r;
    bool seen = false;
    for (size_t i = 0; i < sr->n_sessions; i++)
        seen |= sr->sessions[i]->session_id == sid || strcmp(sr->sessions[i]->job, job) == 0;
    protobuf_c_message_free_unpacked(r, NULL);
    return seen;
}

static int cmd_attack(void) {
    uint64_t sid;
    int count;
    if (read_state(&sid, &count)) return 2;
    g_deadline_ms = 10000;
    char msg[1024];
    ProtobufCMessage *r;
    grpc_status_code st;
    uint8_t junk[512];
    uint64_t s = g_seed | 1;
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)rnd(&s);

    for (int i = 0; i < count; i++) {
        Ballast__Offload__V1__Key k;
        key_of(i, &k);
        Ballast__Offload__V1__GetRequest g = BALLAST__OFFLOAD__V1__GET_REQUEST__INIT;
        g.session_id = sid;
        g.key = &k;
        st = call("Get", PB(&g), D(get_response), &r, msg, sizeof msg);
        if (r) protobuf_c_message_free_unpacked(r, NULL);
        attempt("Get of the victim's blob", st, msg);
        Ballast__Offload__V1__PutRequest p = BALLAST__OFFLOAD__V1__PUT_REQUEST__INIT;
        p.session_id = sid;
        p.key = &k;
        p.data.data = junk;
        p.data.len = 1 + rnd(&s) % sizeof junk;
        st = call("Put", PB(&p), D(put_response), &r, msg, sizeof msg);
        if (r) protobuf_c_message_free_unpacked(r, NULL);
        attempt("Put over the victim's blob", st, msg);
        Ballast__Offload__V1__FreeRequest fr = BALLAST__OFFLOAD__V1__FREE_REQUEST__INIT;
        fr.session_id = sid;
        fr.key = &k;
        st = call("Free", PB(&fr), D(free_response), &r, msg, sizeof msg);
        if (r) protobuf_c_message_free_unpacked(r, NULL);
        attempt("Free of the victim's blob", st, msg);
    }
    Ballast__Offload__V1__HeartbeatRequest h = BALLAST__OFFLOAD__V1__HEARTBEAT_REQUEST__INIT;
    h.session_id = sid;
    st = call("Heartbeat", PB(&h), D(heartbeat_response), &r, msg, sizeof msg);
    if (r) protobuf_c_message_free_unpacked(r, NULL);
    attempt("Heartbeat of the victim's session", st, msg);
    for (int keep = 0; keep < 2; keep++) {
        Ballast__Offload__V1__CloseSessionRequest c = BALLAST__OFFLOAD__V1__CLOSE_SESSION_REQUEST__INIT;
        c.session_id = sid;
        c.keep_blobs = keep;
        st = call("CloseSession", PB(&c), D(close_session_response), &r, msg, sizeof msg);
        if (r) protobuf_c_message_free_unpacked(r, NULL);
        attempt(keep ? "CloseSession(keep_blobs) of the victim's session" : "CloseSession of the victim's session", st, msg);
    }
    /* listing: by job, everything, and through the victim's session */
    const char *jobs[2] = { g_job, "" };
    for (int j = 0; j < 3; j++) {
        Ballast__Offload__V1__ListKeysRequest l = BALLAST__OFFLOAD__V1__LIST_KEYS_REQUEST__INIT;
        l.job = (char *)jobs[j == 1];
        l.token = (char *)g_token;
        if (j == 2) l.session_id = sid;
        st = call("ListKeys", PB(&l), D(list_keys_response), &r, msg, sizeof msg);
        size_t n = 0;
        if (st == GRPC_STATUS_OK) {
            Ballast__Offload__V1__ListKeysResponse *lr = (void *)r;
            for (size_t i = 0; i < lr->n_blobs; i++) n += strcmp(lr->blobs[i]->job, g_job) == 0;
        }
        if (r) protobuf_c_message_free_unpacked(r, NULL);
        /* an answer without the victim's keys is not a success of the attack */
        char what[128];
        snprintf(what, sizeof what, "ListKeys(%s) shows the victim's keys (%zu)",
                 j == 2 ? "victim's session" : j ? "every job" : "victim's job", n);
        attempt(what, st == GRPC_STATUS_OK && n ? GRPC_STATUS_OK : st ? st : GRPC_STATUS_NOT_FOUND, msg);
    }
    st = stats_shows(sid, g_job) ? GRPC_STATUS_OK : GRPC_STATUS_NOT_FOUND;
    attempt("Stats shows the victim's session or job", st, "");
    /* the job name itself: a session of the victim's job reaches its blobs */
    Ballast__Offload__V1__OpenSessionRequest o = BALLAST__OFFLOAD__V1__OPEN_SESSION_REQUEST__INIT;
    o.job = (char *)g_job;
    o.token = (char *)g_token;
    st = call("OpenSession", PB(&o), D(open_session_response), &r, msg, sizeof msg);
    if (r) protobuf_c_message_free_unpacked(r, NULL);
    attempt("OpenSession of the victim's job", st, msg);
    /* a NUL-extended name of the victim's job */
    char nj[80];
    int nl = snprintf(nj, sizeof nj, "%s", g_job);
    uint8_t raw[128];
    size_t rl = 0;
    raw[rl++] = (1 << 3) | 2;
    raw[rl++] = (uint8_t)(nl + 5);
    memcpy(raw + rl, nj, (size_t)nl);
    rl += (size_t)nl;
    memcpy(raw + rl, "\0evil", 5);
    rl += 5;
    if (g_token[0] && strlen(g_token) < 100) {
        raw[rl++] = (4 << 3) | 2;
        raw[rl++] = (uint8_t)strlen(g_token);
        memcpy(raw + rl, g_token, strlen(g_token));
        rl += strlen(g_token);
    }
    void *out = NULL;
    size_t outlen = 0;
    st = rpc_call_raw(g_rpc, SVC "OpenSession", raw, rl, &out, &outlen, g_deadline_ms, true, msg, sizeof msg);
    free(out);
    attempt("OpenSession of '<victim job>\\0evil'", st, msg);
    Ballast__Offload__V1__ReleaseRequest rel = BALLAST__OFFLOAD__V1__RELEASE_REQUEST__INIT;
    rel.job = (char *)g_job;
    rel.token = (char *)g_token;
    st = call("Release", PB(&rel), D(release_response), &r, msg, sizeof msg);
    if (r) protobuf_c_message_free_unpacked(r, NULL);
    attempt("Release of the victim's job", st, msg);
    Ballast__Offload__V1__DrainRequest dr = BALLAST__OFFLOAD__V1__DRAIN_REQUEST__INIT;
    dr.token = (char *)g_token;
    st = call("Drain", PB(&dr), D(drain_response), &r, msg, sizeof msg);
    if (r) protobuf_c_message_free_unpacked(r, NULL);
    attempt("Drain", st, msg);
    /* ring: attach to the victim's session on the fd socket with guessed nonces */
    if (g_fd_socket) {
        for (int t = 0; t < 4; t++) {
            int fd = -1;
            char e[SHM_ERR_LEN] = "";
            st = GRPC_STATUS_UNAVAILABLE;
            if (shm_connect(g_fd_socket, &fd, e, sizeof e) == 0) {
                rp_attach_t a = { RP_ATTACH_MAGIC, sid, t == 0 ? 0 : rnd(&s), RING_PROTO_VERSION, 0 };
                rp_attach_reply_t rep;
                size_t len = 0;
                if (shm_send_fds(fd, &a, sizeof a, NULL, 0, e, sizeof e) == 0 &&
                    shm_recv_fds(fd, &rep, sizeof rep, &len, NULL, 0, 10000, e, sizeof e) == 0 &&
                    len == sizeof rep) {
                    st = rep.status == 0 ? GRPC_STATUS_OK : GRPC_STATUS_PERMISSION_DENIED;
                    snprintf(e, sizeof e, "%.200s", rep.msg);
                }
                close(fd);
            }
            attempt("fd-socket attach to the victim's session", st, e);
        }
    }
    printf("attack: %d attempt(s) succeeded\n", g_won);
    return g_won > 100 ? 100 : g_won;
}

/* ---- memory of another job ---- */

typedef struct { int fd; uint8_t *base; size_t bytes; uint32_t id; } mapped_t;

static int map_fd(mapped_t *v, int *n, int fd, uint32_t id) {
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) { close(fd); return -1; }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { close(fd); return -1; }
    v[*n] = (mapped_t){ fd, p, (size_t)st.st_size, id };
    (*n)++;
    return 0;
}

/* Receive the chunks of nsegs segment fds (and, with ring, the ring chunk). */
static void recv_segments(int fd, uint32_t nsegs, bool ring, mapped_t *v, int *n, int cap) {
    char e[SHM_ERR_LEN];
    for (uint32_t got = 0; got < nsegs;) {
        rp_fd_chunk_t ch;
        int fds[RP_CHUNK_FDS];
        size_t len = 0;
        uint32_t want = nsegs - got < RP_CHUNK_FDS ? nsegs - got : RP_CHUNK_FDS;
        if (shm_recv_fds(fd, &ch, sizeof ch, &len, fds, (int)want, 10000, e, sizeof e)) return;
        for (uint32_t i = 0; i < want; i++) {
            if (*n < cap) map_fd(v, n, fds[i], ch.seg[i]);
            else close(fds[i]);
        }
        got += want;
    }
    if (ring) {
        rp_fd_chunk_t ch;
        int fds[RP_FD_COUNT];
        size_t len = 0;
        if (shm_recv_fds(fd, &ch, sizeof ch, &len, fds, RP_FD_COUNT, 10000, e, sizeof e) == 0)
            for (int i = 0; i < RP_FD_COUNT; i++) {
                /* the ring memfd is mapped and searched too: it is memory this session was handed */
                if (i == RP_FD_RING && *n < cap) map_fd(v, n, fds[i], UINT32_MAX);
                else close(fds[i]);
            }
    }
}

static bool visible(const mapped_t *v, int n, const uint8_t *pat, size_t len) {
    for (int i = 0; i < n; i++)
        if (v[i].bytes >= len && memmem(v[i].base, v[i].bytes, pat, len)) return true;
    return false;
}

static int cmd_memory(void) {
    enum { CAP = 65536, MAXM = 1024, OWN = 3 };
    static uint8_t buf[CAP];
    static mapped_t v[MAXM];
    int nm = 0;
    char msg[1024], e[SHM_ERR_LEN];
    ProtobufCMessage *r;
    /* a shared-memory session of our own job */
    Ballast__Offload__V1__OpenSessionRequest o = BALLAST__OFFLOAD__V1__OPEN_SESSION_REQUEST__INIT;
    o.job = (char *)g_job;
    o.token = (char *)g_token;
    o.shared_memory = true;
    o.client_name = "intruder";
    grpc_status_code st = call("OpenSession", PB(&o), D(open_session_response), &r, msg, sizeof msg);
    if (st) { fprintf(stderr, "memory: OpenSession of job %s: %s\n", g_job, msg); return 1; }
    Ballast__Offload__V1__OpenSessionResponse *os = (void *)r;
    uint64_t sid = os->session_id, nonce = os->attach_nonce;
    protobuf_c_message_free_unpacked(r, NULL);
    /* our own blobs, so that our job has a segment with known bytes in it */
    uint64_t own_seed = g_seed ^ 0xa5a5a5a5a5a5ull;
    for (int i = 0; i < OWN; i++) {
        Ballast__Offload__V1__PutRequest p = BALLAST__OFFLOAD__V1__PUT_REQUEST__INIT;
        Ballast__Offload__V1__Key k;
        key_of(1000 + i, &k);
        p.session_id = sid;
        p.key = &k;
        p.data.data = buf;
        p.data.len = blob_bytes(own_seed, i, buf, CAP);
        p.persistent = i % 2;
        st = call("Put", PB(&p), D(put_response), &r, msg, sizeof msg);
        if (st) { fprintf(stderr, "memory: own Put %d: %s\n", i, msg); return 1; }
        protobuf_c_message_free_unpacked(r, NULL);
    }
    /* attach: every fd the service hands over */
    int fd = -1;
    if (shm_connect(g_fd_socket, &fd, e, sizeof e)) { fprintf(stderr, "memory: %s\n", e); return 1; }
    rp_attach_t a = { RP_ATTACH_MAGIC, sid, nonce, RING_PROTO_VERSION, 0 };
    rp_attach_reply_t rep;
    size_t len = 0;
    if (shm_send_fds(fd, &a, sizeof a, NULL, 0, e, sizeof e) ||
        shm_recv_fds(fd, &rep, sizeof rep, &len, NULL, 0, 10000, e, sizeof e) || len != sizeof rep || rep.status) {
        fprintf(stderr, "memory: attach: %s %.200s\n", e, rep.msg);
        return 1;
    }
    recv_segments(fd, rep.nsegs, true, v, &nm, MAXM);
    close(fd);
    int attached = nm;
    /* every segment id it can guess */
    int asked = 0, handed = 0;
    for (uint32_t gen = 0; gen < 4; gen++) {
        for (uint32_t slot = 0; slot < 128; slot++) {
            uint32_t id = slot + 1024 * gen;
            if (shm_connect(g_fd_socket, &fd, e, sizeof e)) continue;
            rp_segment_req_t q = { RP_SEGMENT_MAGIC, sid, nonce, RING_PROTO_VERSION, id };
            asked++;
            if (shm_send_fds(fd, &q, sizeof q, NULL, 0, e, sizeof e) == 0 &&
                shm_recv_fds(fd, &rep, sizeof rep, &len, NULL, 0, 10000, e, sizeof e) == 0 && len == sizeof rep &&
                rep.status == 0 && rep.nsegs == 1) {
                handed++;
                recv_segments(fd, 1, false, v, &nm, MAXM);
            }
            close(fd);
        }
    }
    /* search for the victim's bytes (windows of up to 64 bytes at the start and the middle of each blob) */
    int seen = 0, tried = 0;
    for (int i = 0; i < g_count; i++) {
        size_t n = blob_bytes(g_seed, i, buf, CAP);
        if (n < 24) continue; /* too short to be a pattern nobody else could hold by chance */
        size_t w = n < 64 ? n : 64;
        tried++;
        bool hit = visible(v, nm, buf, w) || visible(v, nm, buf + (n - w) / 2, w);
        if (hit) printf("SUCCEEDED victim blob %d (%zu bytes) is visible in a mapping of job %s\n", i, n, g_job);
        seen += hit;
    }
    int own = 0;
    for (int i = 0; i < OWN; i++) {
        size_t n = blob_bytes(own_seed, i, buf, CAP);
        own += visible(v, nm, buf, n < 64 ? n : 64);
    }
    /* garbage over everything, then holes in every fd */
    uint64_t s = g_seed * 31 + 7;
    int punched = 0;
    for (int i = 0; i < nm; i++) {
        for (size_t k = 0; k + 8 <= v[i].bytes; k += 8) { uint64_t x = rnd(&s); memcpy(v[i].base + k, &x, 8); }
        punched += fallocate(v[i].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)v[i].bytes) == 0;
        munmap(v[i].base, v[i].bytes);
        close(v[i].fd);
    }
    printf("memory: job %s attached with %d fd(s) (segments and ring), asked for %d segment ids, was handed %d; "
           "mapped %d, wrote garbage over all, punched holes in %d; victim blobs visible: %d of %d searched; "
           "own blobs visible: %d of %d\n", g_job, attached, asked, handed, nm, punched, seen, tried, own, OWN);
    Ballast__Offload__V1__CloseSessionRequest c = BALLAST__OFFLOAD__V1__CLOSE_SESSION_REQUEST__INIT;
    c.session_id = sid;
    if (call("CloseSession", PB(&c), D(close_session_response), &r, msg, sizeof msg) == 0)
        protobuf_c_message_free_unpacked(r, NULL);
    if (own < OWN) { fprintf(stderr, "memory: positive control failed: own blobs not found in own mappings\n"); return 1; }
    return seen || nm == 0 || tried == 0 ? 1 : 0;
}

static int cmd_jobs(void) {
    char msg[1024], job[64];
    ProtobufCMessage *r;
    uint8_t buf[64];
    uint64_t s = g_seed | 1;
    for (int i = 0; i < g_count; i++) {
        snprintf(job, sizeof job, "j%d-%08x", i, (unsigned)rnd(&s));
        Ballast__Offload__V1__OpenSessionRequest o = BALLAST__OFFLOAD__V1__OPEN_SESSION_REQUEST__INIT;
        o.job = job;
        o.token = (char *)g_token;
        if (call("OpenSession", PB(&o), D(open_session_response), &r, msg, sizeof msg)) {
            fprintf(stderr, "jobs: OpenSession of job %d (%s): %s\n", i, job, msg);
            return 1;
        }
        uint64_t sid = ((Ballast__Offload__V1__OpenSessionResponse *)r)->session_id;
        protobuf_c_message_free_unpacked(r, NULL);
        Ballast__Offload__V1__PutRequest p = BALLAST__OFFLOAD__V1__PUT_REQUEST__INIT;
        Ballast__Offload__V1__Key k;
        key_of(i, &k);
        p.session_id = sid;
        p.key = &k;
        p.data.data = buf;
        p.data.len = blob_bytes(s, i, buf, sizeof buf);
        if (call("Put", PB(&p), D(put_response), &r, msg, sizeof msg)) {
            fprintf(stderr, "jobs: Put of job %d: %s\n", i, msg);
            return 1;
        }
        protobuf_c_message_free_unpacked(r, NULL);
        Ballast__Offload__V1__CloseSessionRequest c = BALLAST__OFFLOAD__V1__CLOSE_SESSION_REQUEST__INIT;
        c.session_id = sid;
        c.keep_blobs = true;
        if (call("CloseSession", PB(&c), D(close_session_response), &r, msg, sizeof msg)) {
            fprintf(stderr, "jobs: CloseSession of job %d: %s\n", i, msg);
            return 1;
        }
        protobuf_c_message_free_unpacked(r, NULL);
        Ballast__Offload__V1__ReleaseRequest rel = BALLAST__OFFLOAD__V1__RELEASE_REQUEST__INIT;
        rel.job = job;
        rel.token = (char *)g_token;
        if (call("Release", PB(&rel), D(release_response), &r, msg, sizeof msg)) {
            fprintf(stderr, "jobs: Release of job %d: %s\n", i, msg);
            return 1;
        }
        Ballast__Offload__V1__ReleaseResponse *rr = (void *)r;
        if (rr->freed_blobs != 1) {
            fprintf(stderr, "jobs: Release of job %d freed %" PRIu64 " blobs, want 1\n", i, rr->freed_blobs);
            return 1;
        }
        protobuf_c_message_free_unpacked(r, NULL);
        Ballast__Offload__V1__ListKeysRequest l = BALLAST__OFFLOAD__V1__LIST_KEYS_REQUEST__INIT;
        snprintf(job, sizeof job, "never-%d-%08x", i, (unsigned)rnd(&s));
        l.job = job;
        if (call("ListKeys", PB(&l), D(list_keys_response), &r, msg, sizeof msg)) {
            fprintf(stderr, "jobs: ListKeys of an unknown job: %s\n", msg);
            return 1;
        }
        protobuf_c_message_free_unpacked(r, NULL);
    }
    printf("jobs: %d jobs opened, used, released; %d unknown jobs listed\n", g_count, g_count);
    return 0;
}

static int cmd_stats(void) {
    uint64_t sid;
    int count;
    if (read_state(&sid, &count)) return 2;
    return stats_shows(sid, g_job) ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: offload_trust victim|attack|memory|jobs|stats [options]\n"); return 2; }
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--addr")) g_addr = v;
        else if (!strcmp(a, "--job")) g_job = v;
        else if (!strcmp(a, "--state")) g_state = v;
        else if (!strcmp(a, "--token")) g_token = v;
        else if (!strcmp(a, "--fd-socket")) g_fd_socket = v;
        else if (!strcmp(a, "--count")) g_count = atoi(v);
        else if (!strcmp(a, "--seed")) g_seed = strtoull(v, NULL, 0);
        else { fprintf(stderr, "offload_trust: unknown option %s\n", a); return 2; }
    }
    if (!g_addr || !g_state || g_count < 1 || g_count > 100000) {
        fprintf(stderr, "offload_trust: --addr and --state are required, --count in 1..100000\n");
        return 2;
    }
    char err[256];
    rpc_client_opts_t ro = { 0 };
    ro.tls_ca = getenv("BALLAST_TLS_CA");
    g_rpc = rpc_client_open(g_addr, &ro, err, sizeof err);
    if (!g_rpc) { fprintf(stderr, "offload_trust: %s\n", err); return 2; }
    int rc = !strcmp(argv[1], "victim") ? cmd_victim() : !strcmp(argv[1], "attack") ? cmd_attack()
           : !strcmp(argv[1], "stats") ? cmd_stats() : !strcmp(argv[1], "jobs") ? cmd_jobs()
           : !strcmp(argv[1], "memory") ? cmd_memory() : 2;
    rpc_client_close(g_rpc);
    return rc;
}
