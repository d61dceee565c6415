#!/usr/bin/env bash
# rpc_stress.sh: the rpc layer under concurrent load as a plain program (see
# tests/integration/rpc_stress.c): 8 threads x calls, mixed good and bad
# requests, and stops with calls in flight. Under `make tsan` this is the
# ThreadSanitizer check of common/rpc.c (Criterion cannot run under TSan);
# tests/tsan.supp silences reports that lie wholly inside libgrpc, which is
# not built with TSan and so hides its own synchronization.
source "$(dirname "$0")/../lib.sh"
P=$ROOT/$BUILD/tests/integration/rpc_stress
N_CALLS=1000; N_MIXED=200; N_CYCLES=20
if [ "${BALLAST_SAN:-}" = tsan ]; then
    export TSAN_OPTIONS="suppressions=$ROOT/tests/tsan.supp halt_on_error=0 exitcode=66 ${TSAN_OPTIONS:-}"
    N_CYCLES=10
fi
if [ ! -x "$P" ]; then
    t_fail "rpc_stress built" "$P is missing; run make"
else
    for spec in "calls $N_CALLS" "mixed $N_MIXED" "cycles $N_CYCLES"; do
        set -- $spec
        if out=$("$P" "$1" "$2" 2>&1); then
            t_ok "rpc: $1 x $2 under 8 client threads"
            echo "# $(echo "$out" | tail -1)"
        else
            t_fail "rpc: $1 x $2 under 8 client threads" "$(echo "$out" | grep -v '^ *#[0-9]' | tail -25)"
        fi
    done
fi
t_done
