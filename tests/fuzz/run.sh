#!/usr/bin/env bash
# tests/fuzz/run.sh: `make fuzz`. Runs each libFuzzer target of
# $BUILD/fuzz for FUZZ_SECONDS (default 60) from its seed corpus
# (tests/fuzz/corpus/TARGET, copied: new inputs go to
# $BUILD/fuzz/corpus/TARGET, never into the tree), crashes to
# $BUILD/fuzz/crashes/TARGET/. FILTER (the first argument) keeps the
# targets whose name contains it. Exits non-zero when any target crashed.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
SECS=${FUZZ_SECONDS:-60}
FILTER=${1:-}
failed=()
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
for bin in "$BUILD"/fuzz/fuzz_*; do
    [ -x "$bin" ] || continue
    t=$(basename "$bin")
    case "$t" in *"$FILTER"*) ;; *) continue ;; esac
    work=$BUILD/fuzz/corpus/$t crashes=$BUILD/fuzz/crashes/$t
    mkdir -p "$work" "$crashes"
    cp -n tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null
    echo "fuzz: $t for ${SECS}s (corpus $work)"
    if TMPDIR=$tmp "$bin" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="$crashes/" "$work" > "$BUILD/fuzz/$t.log" 2>&1; then
        grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$BUILD/fuzz/$t.log" | tail -2 | sed "s/^/fuzz: $t: /"
    else
        echo "fuzz: $t FAILED: see $BUILD/fuzz/$t.log and the input in $crashes/"
        grep -E 'ERROR|SUMMARY|assert' "$BUILD/fuzz/$t.log" | head -5 | sed "s/^/fuzz: $t: /"
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then echo "fuzz: crashes in ${failed[*]}"; exit 1; fi
echo "fuzz: no crash"
