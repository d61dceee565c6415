/* fuzz_rpc.c: every RPC message of proto/offload.proto and
 * proto/rendezvous.proto, as a server or client would receive it. The
 * first input byte picks the message type, the rest is its wire bytes:
 * protobuf-c unpacks them; what it accepts packs again to the same size
 * and unpacks again, and its string fields go through the checks the
 * service makes on names (job_name_ok). The services' per-method checks
 * live in their handlers (services/offload/rpc_service.c,
 * services/rendezvous/) and need a running service: their fuzzing is the
 * hostile-client tests'. */
#include <assert.h>

#include "job_name.h"
#include "offload.pb-c.h"
#include "rendezvous.pb-c.h"
#include "tests/fuzz/fuzz_util.h"

static const ProtobufCMessageDescriptor *const MSGS[] = {
    &ballast__offload__v1__key__descriptor, &ballast__offload__v1__open_session_request__descriptor,
    &ballast__offload__v1__open_session_response__descriptor, &ballast__offload__v1__close_session_request__descriptor,
    &ballast__offload__v1__close_session_response__descriptor, &ballast__offload__v1__heartbeat_request__descriptor,
    &ballast__offload__v1__heartbeat_response__descriptor, &ballast__offload__v1__stats_request__descriptor,
    &ballast__offload__v1__session_stats__descriptor, &ballast__offload__v1__stats_response__descriptor,
    &ballast__offload__v1__allocator_stats__descriptor, &ballast__offload__v1__list_keys_request__descriptor,
    &ballast__offload__v1__blob_info__descriptor, &ballast__offload__v1__list_keys_response__descriptor,
    &ballast__offload__v1__release_request__descriptor, &ballast__offload__v1__release_response__descriptor,
    &ballast__offload__v1__drain_request__descriptor, &ballast__offload__v1__drain_response__descriptor,
    &ballast__offload__v1__put_request__descriptor, &ballast__offload__v1__put_response__descriptor,
    &ballast__offload__v1__get_request__descriptor, &ballast__offload__v1__get_response__descriptor,
    &ballast__offload__v1__free_request__descriptor, &ballast__offload__v1__free_response__descriptor,
    &ballast__rdzv__v1__job_ref__descriptor, &ballast__rdzv__v1__set_request__descriptor,
    &ballast__rdzv__v1__set_response__descriptor, &ballast__rdzv__v1__get_request__descriptor,
    &ballast__rdzv__v1__get_response__descriptor, &ballast__rdzv__v1__wait_request__descriptor,
    &ballast__rdzv__v1__wait_response__descriptor, &ballast__rdzv__v1__barrier_request__descriptor,
    &ballast__rdzv__v1__barrier_response__descriptor,
};
#define N_MSGS (sizeof MSGS / sizeof MSGS[0])

/* Every string field of msg (one level deep) through the name check. */
static void check_strings(const ProtobufCMessage *msg) {
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED) continue;
        const char *s = *(const char *const *)((const char *)msg + f->offset);
        if (s) (void)job_name_ok(s);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const ProtobufCMessageDescriptor *d = MSGS[data[0] % N_MSGS];
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1);
    if (!m) return 0;
    check_strings(m);
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf) {
        assert(protobuf_c_message_pack(m, buf) == n);
        /* protobuf-c keeps fields it does not know and packs them back as
         * they came, including field number 0, which its own unpack then
         * refuses (corpus/fuzz_rpc/bad-field0.bin): the services ignore
         * unknown fields and never send a received message on, so the
         * round trip is only required of messages without them */
        ProtobufCMessage *again = protobuf_c_message_unpack(d, NULL, n, buf);
        if (!m->n_unknown_fields) {
            assert(again);
            assert(protobuf_c_message_get_packed_size(again) == n);
        }
        if (again) protobuf_c_message_free_unpacked(again, NULL);
        free(buf);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
