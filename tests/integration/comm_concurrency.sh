#!/usr/bin/env bash
# comm_concurrency.sh: the comm layer and the rendezvous store with ranks as
# threads of one process (tests/integration/comm_concurrency.c). Under
# `make tsan` this is the ThreadSanitizer check of workers/comm*.c and
# services/rendezvous/ (Criterion cannot run under TSan); tests/tsan.supp
# silences reports that lie wholly inside libgrpc.
source "$(dirname "$0")/../lib.sh"
P=$ROOT/$BUILD/tests/integration/comm_concurrency
ITERS=40
if [ "${BALLAST_SAN:-}" = tsan ]; then
    export TSAN_OPTIONS="suppressions=$ROOT/tests/tsan.supp halt_on_error=0 exitcode=66 ${TSAN_OPTIONS:-}"
    ITERS=10
fi
if [ ! -x "$P" ]; then
    t_fail "comm_concurrency built" "$P is missing; run make"
elif out=$(timeout 300 "$P" $ITERS 2>&1); then
    t_ok "comm: 4 rank threads, two communicators in flight, rendezvous barriers"
    echo "# $(echo "$out" | tail -1)"
else
    t_fail "comm: 4 rank threads, two communicators in flight, rendezvous barriers" "$(echo "$out" | grep -v '^ *#[0-9]' | tail -25)"
fi
t_done
