#!/usr/bin/env bash
# fuzz_corpus.sh: every libFuzzer target of $BUILD/fuzz (tests/fuzz/)
# replays its seed corpus, tests/fuzz/corpus/TARGET/ (real inputs and
# broken ones), and each corpus file runs without a crash, sanitizer report
# or failed check; every target has a corpus and every corpus a target.
# Skips, saying why, when the targets were not built (no clang/libFuzzer).
source "$(dirname "$0")/../lib.sh"
D=$(t_tmpdir)
FZ=$ROOT/$BUILD/fuzz
CORPUS=$ROOT/tests/fuzz/corpus
targets=$(cd "$ROOT/tests/fuzz" && ls fuzz_*.c | sed 's/\.c$//')
if ! ls "$FZ"/fuzz_* >/dev/null 2>&1; then
    t_skip "fuzz corpus replay" "no fuzz targets in $FZ: clang and libFuzzer were missing at build time (apt-get install clang-14 libclang-rt-14-dev)"
    t_done; exit 0
fi
for t in $targets; do
    if [ ! -x "$FZ/$t" ]; then t_fail "$t built" "missing $FZ/$t"; continue; fi
    files=("$CORPUS/$t"/*)
    if [ ! -f "${files[0]}" ]; then t_fail "$t has a seed corpus" "no files in $CORPUS/$t"; continue; fi
    if out=$(TMPDIR=$D timeout 300 "$FZ/$t" -timeout=30 -rss_limit_mb=2048 "${files[@]}" 2>&1); then
        t_ok "$t replays its ${#files[@]} corpus files without a crash or a failed check"
    else
        t_fail "$t replays its corpus" "$(echo "$out" | grep -E 'ERROR|SUMMARY|Assertion|Running' | tail -4)"
    fi
done
for c in "$CORPUS"/*/; do
    c=$(basename "$c")
    echo "$targets" | grep -qx "$c" || t_fail "corpus $c has a target" "no tests/fuzz/$c.c"
done
t_done
