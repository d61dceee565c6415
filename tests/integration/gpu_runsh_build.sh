#!/usr/bin/env bash
# gpu_runsh_build.sh: tests/gpu/run.sh builds on its own (nvcc and gcc,
# no Makefile: the GPU machine has none of our Debian packages), with its
# own source lists and link lines, so a change that builds under make can
# still break the one run a GPU machine gets. Here, with nvcc and no GPU:
# `run.sh --quick` must build every check program (one per
# tests/gpu/check_*.c) and gpu_train (when jansson is found), then report
# every check skipped for want of a GPU, none failed, and exit 0.
source "$(dirname "$0")/../lib.sh"
NVCC_BIN=${NVCC:-/usr/local/cuda/bin/nvcc}
if [ ! -x "$NVCC_BIN" ] && ! command -v nvcc >/dev/null; then
    t_skip "tests/gpu/run.sh builds" "no nvcc (CUDA toolkit not at /usr/local/cuda)"; t_done; exit 0
fi
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    t_skip "tests/gpu/run.sh builds without a GPU" "this machine has a GPU: run tests/gpu/run.sh itself"; t_done; exit 0
fi
D=$(t_tmpdir)
cd "$ROOT"
# a budget for this machine's nvcc (the GPU run's 450 s would skip the
# checks after a slow build here)
if GPU_BUILD="$D/gpu" timeout 900 bash tests/gpu/run.sh --quick --budget 900 > "$D/run.out" 2>&1; then
    t_ok "run.sh --quick exits 0 without a GPU"
else t_fail "run.sh --quick exits 0 without a GPU" "$(grep -E 'FAILED|failed|error' "$D/run.out" | head -5; tail -3 "$D/run.out")"; fi
built=$(sed -n 's/.*built: //p' "$D/run.out")
missing=""
for src in tests/gpu/check_*.c; do
    n=$(basename "$src" .c)
    echo " $built " | grep -q " $n " || missing="$missing $n"
    [ -x "$D/gpu/bin/$n" ] || missing="$missing $n(no binary)"
done
if [ -z "$missing" ]; then t_ok "every tests/gpu/check_*.c program is built and linked"
else t_fail "every check program is built" "missing:$missing"; fi
if grep -q "jansson" "$D/run.out" && ! grep -qi "no jansson\|without jansson" "$D/run.out"; then
    if echo " $built " | grep -q " gpu_train "; then t_ok "gpu_train (model, tp, optimizer, checkpoints) links"
    else t_fail "gpu_train links" "built: $built"; fi
fi
bad=$(grep -E '^\[gpu \+[0-9]+s\] check_[a-z0-9_]+: [0-9]+ passed, [1-9][0-9]* failed' "$D/run.out")
nchk=$(grep -cE '^\[gpu \+[0-9]+s\] check_[a-z0-9_]+: [0-9]+ passed, 0 failed, [0-9]+ skipped' "$D/run.out")
if [ -z "$bad" ] && [ "$nchk" -ge "$(ls tests/gpu/check_*.c | wc -l)" ]; then
    t_ok "$nchk check programs ran and none failed (their GPU cases skip here)"
else t_fail "check programs report without failures" "${bad:-only $nchk summaries}"; fi
t_done
