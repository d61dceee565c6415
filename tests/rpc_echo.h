/* rpc_echo.h: the echo service shared by tests/unit/test_rpc.c and
 * tests/integration/rpc_stress.c (static functions; include once per
 * program). Echo returns payload and seq unchanged plus the CRC-32 of the
 * payload it received; sleep_ms and fail_code let a test make it slow or
 * fail. */
#ifndef BALLAST_TEST_RPC_ECHO_H
#define BALLAST_TEST_RPC_ECHO_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "rpc.h"
#include "test/echo.pb-c.h"

#define ECHO_PATH "/ballast.test.v1.Echo/Echo"
#define HEALTH_PATH "/grpc.health.v1.Health/Check"

static atomic_int echo_user_seen;   /* set when a handler saw its user pointer, path, peer */
static int echo_user_token = 42;    /* its address is the method's user pointer */

/* xorshift64*: seeded, never all zeros */
static uint64_t rnd(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static uint32_t crc32_ieee(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return ~c;
}

static grpc_status_code echo_handler(rpc_ctx_t *ctx, const ProtobufCMessage *reqm,
                                     ProtobufCMessage *respm) {
    const Ballast__Test__V1__EchoRequest *req = (const void *)reqm;
    Ballast__Test__V1__EchoResponse *resp = (void *)respm;
    if (ctx->user == &echo_user_token && strcmp(ctx->method, ECHO_PATH) == 0 && ctx->peer &&
        ctx->peer[0])
        atomic_store(&echo_user_seen, 1);
    if (req->sleep_ms) usleep(req->sleep_ms * 1000u);
    if (req->fail_code)
        return rpc_ctx_errf(ctx, (grpc_status_code)req->fail_code, "asked to fail with %u",
                            req->fail_code);
    resp->seq = req->seq;
    resp->peer_local = ctx->peer_local;
    resp->peer_uid = ctx->peer_uid;
    resp->crc = crc32_ieee(req->payload.data, req->payload.len);
    if (req->payload.len) {
        uint8_t *p = rpc_ctx_alloc(ctx, req->payload.len);
        if (!p) return rpc_ctx_errf(ctx, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        memcpy(p, req->payload.data, req->payload.len);
        resp->payload.data = p;
        resp->payload.len = req->payload.len;
    }
    return GRPC_STATUS_OK;
}

static const rpc_method_t echo_method = {
    ECHO_PATH, &ballast__test__v1__echo_request__descriptor,
    &ballast__test__v1__echo_response__descriptor, echo_handler, &echo_user_token};

/* One echo call with a random payload of 1..maxlen bytes; checks seq,
 * payload byte for byte and the server's CRC. Returns NULL when all is
 * well, else a description (in msg or a constant). */
static const char *echo_random(rpc_client_t *c, uint64_t *seed, size_t maxlen, uint8_t *buf,
                               char *msg, size_t msglen) {
    size_t n = 1 + rnd(seed) % maxlen;
    for (size_t k = 0; k < n; k++) buf[k] = (uint8_t)rnd(seed);
    Ballast__Test__V1__EchoRequest req = BALLAST__TEST__V1__ECHO_REQUEST__INIT;
    req.payload.data = buf;
    req.payload.len = n;
    req.seq = (int64_t)(rnd(seed) >> 1);
    ProtobufCMessage *r = NULL;
    grpc_status_code st = rpc_call(c, ECHO_PATH, &req.base,
                                   &ballast__test__v1__echo_response__descriptor, &r, 20000, false,
                                   msg, msglen);
    Ballast__Test__V1__EchoResponse *resp = (void *)r;
    const char *bad = NULL;
    if (st != GRPC_STATUS_OK) bad = msg;
    else if (resp->seq != req.seq) bad = "seq differs";
    else if (resp->payload.len != n || memcmp(resp->payload.data, buf, n) != 0)
        bad = "payload differs";
    else if (resp->crc != crc32_ieee(buf, n)) bad = "server's crc differs";
    if (r) protobuf_c_message_free_unpacked(r, NULL);
    return bad;
}

#endif
