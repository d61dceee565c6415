/* cmd_store.c: `ballast store put|get|ls|rm`: blobs in ballastd from the
 * shell, for operators and tests. put/get/rm open a short session through
 * the client library (shared memory on a Unix socket, remote over TCP); ls
 * is one ListKeys call. A put outlives its session: the session is closed
 * with keep_blobs, so the blob stays until `rm` or a Release of its job
 * (persistent blobs also survive restarts of ballastd). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "job_name.h"
#include "log.h"
#include "offload.pb-c.h"
#include "options.h"
#include "rpc.h"
#include "workers/cli/cli.h"
#include "workers/offload/client.h"

static const char *o_socket, *o_addr, *o_job, *o_file, *o_token_file;
static int64_t o_rank, o_index, o_step;
static int o_kind;
static bool o_persistent, o_all, o_remote;
static double o_timeout;

static const opt_t store_opts[] = {
    { "offload-socket", OPT_STRING, "unix:/run/ballast/ballastd.sock", 0, 0, NULL, "ballastd's socket: unix:PATH, a path, or HOST:PORT", &o_socket, "socket" },
    { "offload-remote", OPT_STRING, NULL, 0, 0, NULL, "ballastd's TCP address HOST:PORT (remote mode)", &o_addr, "addr" },
    { "remote", OPT_BOOL, "false", 0, 0, NULL, "carry bytes in gRPC messages even on the Unix socket", &o_remote },
    { "offload-job", OPT_STRING, NULL, 0, 0, NULL, "job name ([A-Za-z0-9._-], <= 63 chars)", &o_job, "job" },
    { "rank", OPT_INT, "0", 0, 4294967295.0, NULL, "key: rank", &o_rank },
    { "kind", OPT_ENUM, "other", 0, 0, "activation|optimizer_state|param|other", "key: kind", &o_kind },
    { "index", OPT_INT, "0", 0, 9.2e18, NULL, "key: index", &o_index },
    { "step", OPT_INT, "0", 0, 9.2e18, NULL, "key: step", &o_step },
    { "file", OPT_STRING, NULL, 0, 0, NULL, "put: read from this file; get: write to it (default stdin/stdout)", &o_file },
    { "persistent", OPT_BOOL, "false", 0, 0, NULL, "put: keep the blob across sessions and restarts (fsynced)", &o_persistent },
    { "all", OPT_BOOL, "false", 0, 0, NULL, "rm: release every blob of --offload-job (persistent ones too)", &o_all },
    { "offload-token-file", OPT_STRING, NULL, 0, 0, NULL, "file holding ballastd's token", &o_token_file, "token-file" },
    { "timeout", OPT_DURATION, "30s", 0.01, 3600, NULL, "per-call deadline", &o_timeout },
};
#define NOPTS (sizeof store_opts / sizeof store_opts[0])

static const char *USAGE =
    "usage: ballast store put|get|ls|rm --offload-job NAME [--rank R --kind K --index I --step S] [options]\n"
    "  put  --file F (or stdin) [--persistent]   store the bytes under the key\n"
    "  get  [--file F]                           write the blob to F (or stdout)\n"
    "  ls   [--offload-job NAME]                 list blobs (all jobs without --offload-job)\n"
    "  rm   (key) | --all                        free one blob, or release the whole job";

static const char *KIND_NAMES[] = { "?", "activation", "optimizer_state", "param", "other" };

/* The address of ballastd from --offload-remote (HOST:PORT) or
 * --offload-socket (unix:PATH, a bare path, or HOST:PORT). */
static void addr_of(char *buf, size_t n) {
    const char *s = o_socket;
    if (o_addr && o_addr[0]) snprintf(buf, n, "%s", o_addr);
    else if (!strncmp(s, "unix:", 5) || (strchr(s, ':') && !strchr(s, '/'))) snprintf(buf, n, "%s", s);
    else snprintf(buf, n, "unix:%s", s);
}

static int open_session(oc_client_t **c) {
    char addr[300];
    addr_of(addr, sizeof addr);
    oc_options_t o = { 0 };
    o.addr = addr;
    o.job = o_job;
    o.rank = (uint32_t)o_rank;
    o.token_file = o_token_file;
    o.flags = o_remote ? OC_REMOTE : 0;
    o.timeout_s = o_timeout;
    o.client_name = "ballast store";
    status_t st = oc_open(&o, c);
    if (st) { fprintf(stderr, "ballast store: %s\n", oc_last_error()); return 1; }
    return 0;
}

static oc_key_t the_key(void) {
    oc_key_t k = { (uint32_t)o_rank, (uint32_t)o_kind + 1, (uint64_t)o_index, (uint64_t)o_step };
    return k;
}

/* Read all of fd into a malloc()ed buffer. */
static int slurp(FILE *f, uint8_t **out, size_t *len) {
    size_t cap = 1 << 20, n = 0;
    uint8_t *b = malloc(cap);
    if (!b) return -ENOMEM;
    for (;;) {
        if (n == cap) {
            uint8_t *nb = realloc(b, cap * 2);
            if (!nb) { free(b); return -ENOMEM; }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) { free(b); return -EIO; }
    *out = b;
    *len = n;
    return 0;
}

static int do_put(void) {
    FILE *f = stdin;
    if (o_file && strcmp(o_file, "-") != 0) {
        f = fopen(o_file, "rb");
        if (!f) { fprintf(stderr, "ballast store put: --file %s: %s\n", o_file, strerror(errno)); return 1; }
    }
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = slurp(f, &data, &len);
    if (f != stdin) fclose(f);
    if (rc) { fprintf(stderr, "ballast store put: reading input: %s\n", strerror(-rc)); return 1; }
    if (len == 0) { free(data); fprintf(stderr, "ballast store put: input is empty; blobs hold at least 1 byte\n"); return 1; }
    oc_client_t *c;
    if (open_session(&c)) { free(data); return 1; }
    oc_key_t k = the_key();
    status_t st = oc_put_copy(c, &k, data, len, o_persistent);
    free(data);
    if (st) {
        fprintf(stderr, "ballast store put: %s\n", oc_last_error());
        oc_close(c, false);
        return 1;
    }
    st = oc_close(c, true);
    if (st) { fprintf(stderr, "ballast store put: %s\n", oc_last_error()); return 1; }
    fprintf(stderr, "stored %zu bytes: job %s rank %lld kind %s index %lld step %lld%s\n", len, o_job,
            (long long)o_rank, KIND_NAMES[o_kind + 1], (long long)o_index, (long long)o_step,
            o_persistent ? " (persistent)" : "");
    return 0;
}

static int do_get(void) {
    oc_client_t *c;
    if (open_session(&c)) return 1;
    oc_key_t k = the_key();
    oc_buf_t b;
    status_t st = oc_get(c, &k, &b);
    if (st) { fprintf(stderr, "ballast store get: %s\n", oc_last_error()); oc_close(c, false); return 1; }
    int rc = 0;
    FILE *f = stdout;
    if (o_file && strcmp(o_file, "-") != 0) {
        f = fopen(o_file, "wb");
        if (!f) { fprintf(stderr, "ballast store get: --file %s: %s\n", o_file, strerror(errno)); rc = 1; }
    }
    if (f && fwrite(b.ptr, 1, b.len, f) != b.len) {
        fprintf(stderr, "ballast store get: writing output: %s\n", strerror(errno));
        rc = 1;
    }
    if (f && f != stdout && fclose(f)) { fprintf(stderr, "ballast store get: closing %s: %s\n", o_file, strerror(errno)); rc = 1; }
    if (f == stdout) fflush(stdout);
    oc_get_done(c, &k, &b);
    oc_close(c, false);
    return rc;
}

static int do_rm(void) {
    if (o_all) {
        char addr[300], rerr[RPC_ERR_LEN], msg[512], token[300] = "";
        addr_of(addr, sizeof addr);
        if (o_token_file && o_token_file[0]) {
            FILE *f = fopen(o_token_file, "r");
            if (!f) { fprintf(stderr, "ballast store rm: --offload-token-file %s: %s\n", o_token_file, strerror(errno)); return 1; }
            if (!fgets(token, sizeof token, f)) token[0] = 0;
            fclose(f);
            token[strcspn(token, "\r\n")] = 0;
        }
        rpc_client_t *rc = rpc_client_open(addr, NULL, rerr, sizeof rerr);
        if (!rc) { fprintf(stderr, "ballast store rm: %s\n", rerr); return 1; }
        Ballast__Offload__V1__ReleaseRequest req = BALLAST__OFFLOAD__V1__RELEASE_REQUEST__INIT;
        req.job = (char *)o_job;
        req.token = token;
        Ballast__Offload__V1__ReleaseResponse *r = NULL;
        grpc_status_code st = rpc_call(rc, "/ballast.offload.v1.Offload/Release", (ProtobufCMessage *)&req,
                                       &ballast__offload__v1__release_response__descriptor, (ProtobufCMessage **)&r,
                                       (int64_t)(o_timeout * 1000), false, msg, sizeof msg);
        rpc_client_close(rc);
        if (st) { fprintf(stderr, "ballast store rm: %s\n", msg); return 1; }
        fprintf(stderr, "released job %s: %llu blobs, %llu bytes\n", o_job, (unsigned long long)r->freed_blobs,
                (unsigned long long)r->freed_bytes);
        protobuf_c_message_free_unpacked((ProtobufCMessage *)r, NULL);
        return 0;
    }
    oc_client_t *c;
    if (open_session(&c)) return 1;
    oc_key_t k = the_key();
    status_t st = oc_free(c, &k);
    if (st) fprintf(stderr, "ballast store rm: %s\n", oc_last_error());
    oc_close(c, false);
    return st ? 1 : 0;
}

static int do_ls(void) {
    char addr[300], rerr[RPC_ERR_LEN], msg[512];
    addr_of(addr, sizeof addr);
    rpc_client_t *rc = rpc_client_open(addr, NULL, rerr, sizeof rerr);
    if (!rc) { fprintf(stderr, "ballast store ls: %s\n", rerr); return 1; }
    Ballast__Offload__V1__ListKeysRequest req = BALLAST__OFFLOAD__V1__LIST_KEYS_REQUEST__INIT;
    req.job = (char *)(o_job ? o_job : "");
    Ballast__Offload__V1__ListKeysResponse *r = NULL;
    grpc_status_code st = rpc_call(rc, "/ballast.offload.v1.Offload/ListKeys", (ProtobufCMessage *)&req,
                                   &ballast__offload__v1__list_keys_response__descriptor, (ProtobufCMessage **)&r,
                                   (int64_t)(o_timeout * 1000), false, msg, sizeof msg);
    rpc_client_close(rc);
    if (st) {
        fprintf(stderr, "ballast store ls: %s\n", msg);
        if (st == GRPC_STATUS_UNAVAILABLE) fprintf(stderr, "ballast store ls: is ballastd running at %s?\n", addr);
        return 1;
    }
    printf("%-24s %6s %-16s %10s %10s %12s %-5s %-4s %-8s\n", "JOB", "RANK", "KIND", "INDEX", "STEP", "BYTES",
           "TIER", "PERS", "CRC32C");
    for (size_t i = 0; i < r->n_blobs; i++) {
        const Ballast__Offload__V1__BlobInfo *b = r->blobs[i];
        unsigned kind = b->key ? (unsigned)b->key->kind : 0;
        char crc[16] = "-"; /* not computed yet (never written to NVMe) */
        if (b->crc32c_known) snprintf(crc, sizeof crc, "%08x", b->crc32c);
        printf("%-24s %6u %-16s %10llu %10llu %12llu %-5s %-4s %s\n", b->job, b->key ? b->key->rank : 0,
               kind <= 4 ? KIND_NAMES[kind] : "?", (unsigned long long)(b->key ? b->key->index : 0),
               (unsigned long long)(b->key ? b->key->step : 0), (unsigned long long)b->length, b->tier,
               b->persistent ? "yes" : "no", crc);
    }
    if (r->truncated) printf("(list truncated)\n");
    protobuf_c_message_free_unpacked((ProtobufCMessage *)r, NULL);
    return 0;
}

int cmd_store(int argc, char **argv) {
    char err[OPT_ERR_LEN];
    const char *pos[2];
    int npos = 0;
    int rc = opt_parse(store_opts, NOPTS, argc, argv, pos, 1, &npos, USAGE, err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) { fprintf(stderr, "ballast store: %s\n", err); return 2; }
    if (npos != 1) { fprintf(stderr, "%s\n", USAGE); return 2; }
    const char *verb = pos[0];
    bool ls = strcmp(verb, "ls") == 0;
    if (!ls && strcmp(verb, "put") && strcmp(verb, "get") && strcmp(verb, "rm")) {
        fprintf(stderr, "ballast store: unknown command '%s': use put, get, ls or rm\n", verb);
        return 2;
    }
    if ((!ls || (o_job && o_job[0])) && !job_name_ok(o_job)) {
        fprintf(stderr, "ballast store %s: --offload-job '%s' is missing or invalid: use " JOB_NAME_RULE "\n",
                verb, o_job ? o_job : "");
        return 2;
    }
    if (strcmp(verb, "put") == 0) return do_put();
    if (strcmp(verb, "get") == 0) return do_get();
    if (strcmp(verb, "rm") == 0) return do_rm();
    return do_ls();
}
