/* fuzz_ring.c: ring entries from a peer (common/ring.h, the wire format of
 * proto/offload_ring.h). The shared memory of a ring is writable by the
 * other side, so its header, indices and entries are untrusted: the input
 * is a ring's memory (header included, as a hostile peer left it);
 * ring_attach validates it, then every entry the indices claim is popped
 * and read as an rp_req_t, and the indices are moved under the consumer's
 * feet between pops. Nothing may read outside the mapping.
 * BALLAST_FUZZ_WRITE_SEED=DIR writes a real ring (ring_init, two requests
 * pushed) to DIR/valid.ring. */
#include <assert.h>
#include <stdatomic.h>

#include "common/ring.h"
#include "proto/offload_ring.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *seed = getenv("BALLAST_FUZZ_WRITE_SEED");
    if (!seed) return 0;
    size_t n = ring_bytes(4, RING_PROTO_ENTRY_BYTES);
    uint8_t *mem = aligned_alloc(64, n);
    ring_t r;
    char err[256], p[512];
    memset(mem, 0, n);
    if (ring_init(mem, n, 4, RING_PROTO_ENTRY_BYTES, err, sizeof err) ||
        ring_attach(&r, mem, n, RING_PROTO_ENTRY_BYTES, err, sizeof err)) { fprintf(stderr, "%s\n", err); exit(1); }
    rp_req_t q = { .op = RP_OP_PUT_ALLOC, .req_id = 1, .rank = 3, .kind = 2, .index = 5, .step = 7, .length = 4096 };
    ring_push(&r, &q);
    q = (rp_req_t){ .op = RP_OP_GET, .req_id = 2, .rank = 3, .kind = 2, .index = 5, .step = 7 };
    ring_push(&r, &q);
    snprintf(p, sizeof p, "%s/valid.ring", seed);
    exit(fuzz_write_file(p, mem, n) ? 1 : 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < RING_HDR_BYTES || size > (1u << 20)) return 0;
    /* 64-byte aligned copy, as a mapping would be */
    uint8_t *mem = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (!mem) return 0;
    memcpy(mem, data, size);
    ring_t r;
    char err[256];
    if (ring_attach(&r, mem, size, RING_PROTO_ENTRY_BYTES, err, sizeof err) == 0) {
        rp_req_t q;
        const uint8_t *tail_src = data + RING_HDR_BYTES - 8; /* where a hostile tail comes from */
        for (uint32_t k = 0; k < 2 * RING_PROTO_MAX_CAPACITY; k++) {
            if (ring_pop(&r, &q) != 0) break; /* empty, or -EBADMSG: the peer's indices do not add up */
            (void)rp_op_name(q.op);
            (void)rp_detail_text(q.reserved);
            (void)ring_count(&r);
            if (k == 1) { /* the peer rewrites the tail after we started */
                uint32_t t;
                memcpy(&t, tail_src, sizeof t);
                atomic_store(&r.hdr->tail, t);
            }
        }
    } else {
        assert(err[0]);
    }
    free(mem);
    return 0;
}
