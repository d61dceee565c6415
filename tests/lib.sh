# tests/lib.sh: helpers for shell tests. Source it; each check prints one TAP
# line that tests/run.sh counts. A script ends with `t_done`.
#
#   t_ok NAME / t_fail NAME WHY / t_skip NAME WHY
#   t_check NAME CMD...          passes when CMD exits 0
#   t_expect_fail NAME PATTERN CMD...  passes when CMD exits non-zero and its
#                                output (stdout+stderr) matches PATTERN (grep -E)
#   t_tmpdir                     a fresh directory removed at exit
#
# The JSON log of ballast-worker --log-json, through tests/jsonlog.py (its
# header has the details; values print as logged, so runs compare as text):
#   jl_get FILE [SELECT...] FIELD...  the fields of each step record, one line
#                                a record; SELECT: --kind settings|layout (that
#                                record instead), --step N, --from N,
#                                --first N, --last N; --upto N: every record
#                                through step N's (a log cut after step N)
#   jl_count FILE [SELECT...]    how many records are selected
#   jl_raw FILE [SELECT...]      the selected records' lines as logged
# Python snippets can `import jsonlog` (records, steps, first, by_step,
# values): tests/ is on PYTHONPATH.
set -u
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/$BUILD/bin
# the test build of ballast-worker (and a ballast that starts it), with the
# test doubles of BALLAST_TEST_BACKEND (tests/lib/worker_test_main.c)
TBIN=$ROOT/$BUILD/tests/bin
T_FAILED=0
T_COUNT=0
T_PY=/usr/bin/python3
[ -x "$T_PY" ] || T_PY=python3
export PYTHONPATH="$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the tree

t_ok()   { T_COUNT=$((T_COUNT+1)); echo "ok - $1"; }
t_fail() { T_COUNT=$((T_COUNT+1)); T_FAILED=$((T_FAILED+1)); echo "not ok - $1"; shift; echo "#   $*" | sed 's/^/#   /' >&2; echo "  # $*"; }
t_skip() { T_COUNT=$((T_COUNT+1)); echo "ok - $1 # SKIP $2"; }

t_check() {
    local name=$1; shift
    local out
    if out=$("$@" 2>&1); then t_ok "$name"; else t_fail "$name" "command failed: $*: $(echo "$out" | tail -5)"; fi
}

t_expect_fail() {
    local name=$1 pat=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc -eq 0 ]; then t_fail "$name" "expected failure, got exit 0: $*"
    elif [ $rc -ge 128 ]; then t_fail "$name" "crashed with signal $((rc-128)): $*"
    elif echo "$out" | grep -Eq -- "$pat"; then t_ok "$name"
    else t_fail "$name" "message did not match /$pat/: $(echo "$out" | tail -3)"; fi
}

# Every t_tmpdir lives under one directory made when this file is sourced,
# so that t_tmpdir works in $(...) subshells and one rm removes them all.
T_TMPROOT=$(mktemp -d /tmp/ballast-test.XXXXXX) || { echo "not ok - $(basename "$0"): cannot create a temp directory under /tmp (disk full?)"; exit 1; }
# A fresh directory under the script's temp root. When it cannot be made
# (disk full), the whole script stops: an empty $D would send its files to /.
t_tmpdir() {
    mktemp -d "$T_TMPROOT/t.XXXXXX" && return 0
    echo "not ok - $(basename "$0"): cannot create a temp directory under $T_TMPROOT (disk full?)" >&2
    kill -TERM $$; exit 1
}
t_cleanup() { [ -n "${T_TMPROOT:-}" ] && rm -rf "$T_TMPROOT"; }
trap t_cleanup EXIT   # a script that sets its own EXIT trap must call t_cleanup in it

jl_get()   { "$T_PY" "$ROOT/tests/jsonlog.py" "$@"; }
jl_count() { "$T_PY" "$ROOT/tests/jsonlog.py" "$@" --count; }
jl_raw()   { "$T_PY" "$ROOT/tests/jsonlog.py" "$@" --raw; }

t_done() { [ "$T_COUNT" -gt 0 ] || { echo "not ok - $(basename "$0") ran no check"; exit 1; }; [ "$T_FAILED" -eq 0 ]; }
