#!/usr/bin/env bash
# tests/bench/run.sh: what `make bench` runs. Every tests/bench/*.sh is one
# benchmark; each prints its figures as ratios measured side by side in the
# same run (ours vs memcpy, vs fio, vs PyTorch), with lines starting "RATIO "
# collected into the table printed last. BENCH=name runs only that one.
set -u
cd "$(dirname "$0")/../.."
export BUILD=${BUILD:-build}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
LOG=$BUILD/bench-logs
mkdir -p "$LOG"
status=0
: > "$LOG/ratios"
for s in tests/bench/*.sh; do
    name=$(basename "$s" .sh)
    [ "$name" = run ] && continue
    [ -n "${BENCH:-}" ] && [ "$name" != "$BENCH" ] && continue
    echo "==== $name"
    if bash "$s" 2>&1 | tee "$LOG/$name.log"; then :; else echo "bench $name failed"; status=1; fi
    grep -E '^RATIO ' "$LOG/$name.log" | sed "s/^RATIO /$name: /" >> "$LOG/ratios"
done
echo
echo "==== ratios (ours / baseline, measured in this run)"
cat "$LOG/ratios"
exit $status
