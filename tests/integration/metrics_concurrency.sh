#!/usr/bin/env bash
# metrics_concurrency.sh: run metrics_concurrency (updates, series creation
# and HTTP scrapes from many threads at once; exact sums). A plain program so
# that `make tsan` checks common/metrics.c under ThreadSanitizer.
source "$(dirname "$0")/../lib.sh"
P=$ROOT/$BUILD/tests/integration/metrics_concurrency
[ -x "$P" ] || { t_fail "metrics_concurrency binary" "missing $P (run make)"; t_done; exit 1; }
out=$(timeout 120 "$P" 2>&1); rc=$?
echo "$out" | grep -E '^(not )?ok ' || true
T_COUNT=$(echo "$out" | grep -cE '^(not )?ok ' || true)
[ $rc -eq 0 ] || t_fail "metrics_concurrency exit status" "exit $rc: $(echo "$out" | tail -5)"
t_done
