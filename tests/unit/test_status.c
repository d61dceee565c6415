/* test_status.c: the offload path's status vocabulary (proto/status.h):
 * wire values are gRPC's numbers, every value maps to a gRPC code and back
 * to itself or to its documented coarser value, every value has a name and
 * a word, and values read off the wire are validated. */
#include <criterion/criterion.h>
#include <grpc/status.h>
#include <string.h>

#include "proto/status.h"

/* Every defined value, wire values first. */
static const status_t ALL[] = {
    STATUS_OK, STATUS_CANCELLED, STATUS_UNKNOWN, STATUS_INVALID_ARGUMENT, STATUS_DEADLINE_EXCEEDED,
    STATUS_NOT_FOUND, STATUS_ALREADY_EXISTS, STATUS_PERMISSION_DENIED, STATUS_RESOURCE_EXHAUSTED,
    STATUS_FAILED_PRECONDITION, STATUS_ABORTED, STATUS_OUT_OF_RANGE, STATUS_UNIMPLEMENTED,
    STATUS_INTERNAL, STATUS_UNAVAILABLE, STATUS_DATA_LOSS, STATUS_UNAUTHENTICATED,
    STATUS_QUOTA_EXCEEDED, STATUS_NO_SPACE, STATUS_BUSY, STATUS_IO_ERROR, STATUS_NO_SESSION,
    STATUS_NOT_HELD, STATUS_JOB_QUOTA_EXCEEDED,
};
#define NALL (sizeof ALL / sizeof ALL[0])

/* The refinements and the coarser value each is documented to travel as. */
static const struct { status_t st; grpc_status_code grpc; } REFINED[] = {
    { STATUS_QUOTA_EXCEEDED, GRPC_STATUS_RESOURCE_EXHAUSTED },
    { STATUS_NO_SPACE, GRPC_STATUS_RESOURCE_EXHAUSTED },
    { STATUS_BUSY, GRPC_STATUS_FAILED_PRECONDITION },
    { STATUS_IO_ERROR, GRPC_STATUS_INTERNAL },
    { STATUS_NO_SESSION, GRPC_STATUS_FAILED_PRECONDITION },
    { STATUS_NOT_HELD, GRPC_STATUS_FAILED_PRECONDITION },
    { STATUS_JOB_QUOTA_EXCEEDED, GRPC_STATUS_RESOURCE_EXHAUSTED },
};

/* wire values are gRPC's numbers */
#define SAME(x) _Static_assert((int)STATUS_##x == (int)GRPC_STATUS_##x, #x " must be gRPC's number")
SAME(OK); SAME(CANCELLED); SAME(UNKNOWN); SAME(INVALID_ARGUMENT); SAME(DEADLINE_EXCEEDED);
SAME(NOT_FOUND); SAME(ALREADY_EXISTS); SAME(PERMISSION_DENIED); SAME(RESOURCE_EXHAUSTED);
SAME(FAILED_PRECONDITION); SAME(ABORTED); SAME(OUT_OF_RANGE); SAME(UNIMPLEMENTED); SAME(INTERNAL);
SAME(UNAVAILABLE); SAME(DATA_LOSS); SAME(UNAUTHENTICATED);
/* gRPC has 17 codes, 0..16, UNAUTHENTICATED the highest */
#define GRPC_CODES (GRPC_STATUS_UNAUTHENTICATED + 1)
_Static_assert((int)STATUS_WIRE_COUNT_ == GRPC_CODES, "every gRPC code is a wire value");

static bool refined(status_t st, grpc_status_code *coarse) {
    for (size_t i = 0; i < sizeof REFINED / sizeof REFINED[0]; i++)
        if (REFINED[i].st == st) { *coarse = REFINED[i].grpc; return true; }
    return false;
}

Test(status, the_list_here_is_complete) {
    /* every number below STATUS_END_ that has a name is in ALL */
    size_t named = 0;
    for (int v = 0; v < STATUS_END_ + 8; v++)
        if (strcmp(status_name((status_t)v), "UNKNOWN_STATUS") != 0) named++;
    cr_assert_eq(named, NALL, "status.h defines %zu named values, this test knows %zu", named, NALL);
}

Test(status, every_value_maps_to_grpc_and_back) {
    for (size_t i = 0; i < NALL; i++) {
        status_t st = ALL[i];
        int code = status_to_grpc(st);
        cr_assert(code >= GRPC_STATUS_OK && code < GRPC_CODES, "%s -> %d is not a gRPC code",
                  status_name(st), code);
        status_t back = status_from_grpc(code);
        grpc_status_code coarse;
        if (refined(st, &coarse)) {
            cr_assert_eq(code, (int)coarse, "%s must travel as %d, got %d", status_name(st), coarse, code);
            cr_assert_eq(back, (status_t)coarse, "%s comes back as its coarser value", status_name(st));
            cr_assert_eq(status_wire(st), (status_t)coarse);
        } else {
            cr_assert_eq((int)st, code, "wire value %s is its own gRPC code", status_name(st));
            cr_assert_eq(back, st, "%s round-trips", status_name(st));
            cr_assert_eq(status_wire(st), st);
        }
        /* travelling twice changes nothing more */
        cr_assert_eq(status_wire(status_wire(st)), status_wire(st));
    }
}

Test(status, every_grpc_code_is_received_as_itself) {
    for (int code = 0; code < GRPC_CODES; code++) {
        cr_assert_eq((int)status_from_grpc(code), code);
        cr_assert_eq(status_to_grpc(status_from_grpc(code)), code);
    }
}

Test(status, values_off_the_wire_are_validated) {
    /* a ring completion or attach reply carries a uint32_t: anything that is
     * not a wire value reads as UNKNOWN, refinements included (they never travel) */
    const int64_t bad[] = { -1, 17, 31, STATUS_QUOTA_EXCEEDED, STATUS_NOT_HELD, STATUS_END_, 1000,
                            0x7fffffff, 0xffffffffll, INT64_MIN };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(status_from_grpc(bad[i]), STATUS_UNKNOWN, "%lld", (long long)bad[i]);
    cr_assert_eq(status_wire((status_t)999), STATUS_UNKNOWN, "a number that is no status travels as UNKNOWN");
}

Test(status, every_value_has_a_name_and_a_word) {
    for (size_t i = 0; i < NALL; i++) {
        const char *n = status_name(ALL[i]), *w = status_word(ALL[i]);
        cr_assert(n && n[0] && strcmp(n, "UNKNOWN_STATUS") != 0, "value %d has no name", ALL[i]);
        cr_assert(w && w[0] && strcmp(w, "unknown_status") != 0, "value %d has no word", ALL[i]);
        for (size_t j = 0; j < i; j++) {
            cr_assert_str_neq(n, status_name(ALL[j]), "two values named %s", n);
            cr_assert_str_neq(w, status_word(ALL[j]), "two values worded %s", w);
        }
        /* the word is the name in lower case, but for the two historic short words */
        if (ALL[i] == STATUS_ALREADY_EXISTS) { cr_assert_str_eq(w, "exists"); continue; }
        if (ALL[i] == STATUS_INVALID_ARGUMENT) { cr_assert_str_eq(w, "invalid"); continue; }
        cr_assert_eq(strlen(n), strlen(w), "%s / %s", n, w);
        for (size_t k = 0; n[k]; k++)
            cr_assert_eq(w[k], (n[k] >= 'A' && n[k] <= 'Z') ? n[k] - 'A' + 'a' : n[k], "%s / %s", n, w);
    }
    cr_assert_str_eq(status_name(STATUS_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
    cr_assert_str_eq(status_word(STATUS_QUOTA_EXCEEDED), "quota_exceeded");
    cr_assert_str_eq(status_name((status_t)999), "UNKNOWN_STATUS");
}
