#!/usr/bin/env bash
# ring_stress.sh: 10^6 entries through a 64-entry request/completion ring
# pair, between two threads and between two processes (see
# tests/integration/ring_stress.c). Under `make tsan` this is the
# ThreadSanitizer check of the ring: the program is built with TSan and any
# report makes it exit non-zero.
source "$(dirname "$0")/../lib.sh"
P=$ROOT/$BUILD/tests/integration/ring_stress
if [ ! -x "$P" ]; then
    t_fail "ring_stress built" "$P is missing; run make"
else
    for mode in threads fork; do
        if out=$("$P" "$mode" 1000000 64 2>&1); then
            t_ok "ring: 10^6 entries between two $mode, none lost, duplicated or reordered"
            echo "# $(echo "$out" | tail -1)"
        else
            t_fail "ring: 10^6 entries between two $mode" "$(echo "$out" | tail -20)"
        fi
    done
fi
t_done
