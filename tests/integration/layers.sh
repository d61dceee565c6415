#!/usr/bin/env bash
# layers.sh: the tree's layering holds (docs/layers.md).
#   - tests/layers/check.py on this checkout and its build: no #include and
#     no symbol use points up or sideways between layers, no cycle between
#     files;
#   - the checker catches what it must: on a copy of the sources, one
#     forbidden include at a time (a lower worker layer including a higher
#     one, the CUDA backend including offload code, common including a
#     service, a service including worker code) and one include cycle
#     each make it fail, naming the file;
#   - ballastd, ballast-rdzv and ballast-probe contain no symbol defined by
#     an object of workers/ (nm).
source "$(dirname "$0")/../lib.sh"
cd "$ROOT"
T_TMP=$(t_tmpdir)
trap t_cleanup EXIT

if ! command -v python3 >/dev/null; then t_skip "layer check" "no python3"; t_done; exit; fi
# its TAP lines, each problem on a "#   " line after its check
python3 tests/layers/check.py --objects "$BUILD" --tap > "$T_TMP/check.tap" 2>&1
rc=$?
n=$(grep -c '^ok - \|^not ok - ' "$T_TMP/check.tap")
T_COUNT=$((T_COUNT + n)); T_FAILED=$((T_FAILED + $(grep -c '^not ok - ' "$T_TMP/check.tap")))
cat "$T_TMP/check.tap"
[ "$n" -ge 4 ] && [ $rc -le 1 ] || t_fail "check.py ran its 4 checks" "exit $rc, $n checks: $(tail -3 "$T_TMP/check.tap")"

# ---- the checker fails on a planted violation ----
C=$T_TMP/copy
mkdir -p "$C"
git ls-files -z -- proto common services workers | xargs -0 cp --parents -t "$C" 2>/dev/null
plant() {  # NAME FILE LINE EXPECT: append LINE to FILE in a fresh copy; the check must fail with EXPECT
    local name=$1 file=$2 line=$3 expect=$4
    rm -rf "$C.p"; cp -r "$C" "$C.p"
    printf '%s\n' "$line" >> "$C.p/$file"
    local out rc
    out=$(python3 tests/layers/check.py --root "$C.p" 2>&1); rc=$?
    if [ $rc -eq 1 ] && echo "$out" | grep -qF -- "$expect"; then
        t_ok "planted: $name is refused ($(echo "$out" | grep -F -- "$expect" | head -1 | cut -c1-160))"
    else
        t_fail "planted: $name is refused" "exit $rc, wanted a line with '$expect': $(echo "$out" | head -5)"
    fi
}
# the clean copy passes (so the failures below are the planted lines')
if out=$(python3 tests/layers/check.py --root "$C" 2>&1); then t_ok "a copy of the sources passes: $out"
else t_fail "a copy of the sources passes" "$out"; fi
plant "model includes train" workers/model/model.c '#include "workers/train/train.h"' \
    'workers/model/model.c includes "workers/train/train.h": a lower layer uses a higher one'
plant "the CUDA backend includes offload" workers/backend/cuda/gemm.cu '#include "workers/offload/link.h"' \
    'workers/backend/cuda/gemm.cu includes "workers/offload/link.h"'
plant "the CUDA backend includes comm" workers/backend/cuda/parallel.cu '#include "workers/comm/comm.h"' \
    'workers/backend/cuda/parallel.cu includes "workers/comm/comm.h"'
plant "common includes a service" common/log.c '#include "services/offload/store.h"' \
    'common/log.c includes "services/offload/store.h": common uses services/offload'
plant "a service includes worker code" services/rendezvous/server.c '#include "workers/comm/comm.h"' \
    'a service uses worker code'
plant "ckpt and offload, independent layers" workers/ckpt/safetensors.c '#include "workers/offload/link.h"' \
    'independent layers use each other'
plant "an include cycle inside a layer" workers/model/config.h '#include "workers/model/optim.h"' \
    'workers/model/config -> workers/model/optim'
rm -rf "$C.p"

# ---- the services contain no worker code ----
WSYMS=$T_TMP/worker.syms
for o in $(find "$BUILD/obj/workers" "$BUILD/cuobj/workers" -name '*.o' 2>/dev/null); do
    nm --defined-only -g "$o" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBRVW]/ { print $3 }'
done | sort -u > "$WSYMS"
if [ "$(wc -l < "$WSYMS")" -lt 100 ]; then
    t_fail "worker symbols collected" "only $(wc -l < "$WSYMS") from $BUILD/obj/workers"
else
    for p in ballastd ballast-rdzv ballast-probe; do
        b=$BIN/$p
        if [ ! -x "$b" ]; then t_fail "$p built" "missing $b"; continue; fi
        nm --defined-only "$b" 2>/dev/null | awk 'NF == 3 && $3 != "main" { print $3 }' | sort -u > "$T_TMP/$p.syms"
        both=$(comm -12 "$WSYMS" "$T_TMP/$p.syms")
        n=$(wc -l < "$T_TMP/$p.syms")
        if [ -z "$both" ] && [ "$n" -gt 50 ]; then t_ok "$p: none of its $n symbols is defined under workers/"
        else t_fail "$p: no symbol defined under workers/" "$(echo "$both" | head -10 | tr '\n' ' ') ($n symbols read)"; fi
    done
fi
t_done
