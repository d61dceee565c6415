#!/usr/bin/env bash
# gpu_checks.sh: run every GPU check program (tests/gpu/check_*.c) and pass
# its TAP lines through. On a machine without a GPU each case reports
# "SKIP no GPU"; when the CUDA parts were not built (no nvcc, or CUDA=0)
# one line says so. The real runs happen on a GPU machine: tests/gpu/run.sh.
source "$(dirname "$0")/../lib.sh"

srcs=$(ls "$ROOT"/tests/gpu/check_*.c 2>/dev/null)
[ -n "$srcs" ] || { t_fail "gpu checks" "no tests/gpu/check_*.c found"; t_done; exit; }
if [ ! -d "$ROOT/$BUILD/tests/gpu" ]; then
    t_skip "gpu checks" "CUDA parts not built (no nvcc, or CUDA=0)"
    t_done; exit
fi
for src in $srcs; do
    name=$(basename "$src" .c)
    prog=$ROOT/$BUILD/tests/gpu/$name
    if [ ! -x "$prog" ]; then t_fail "gpu/$name" "$prog was not built"; continue; fi
    out=$("$prog" 2>&1); rc=$?
    lines=$(echo "$out" | grep -E '^(ok|not ok) ')
    if [ -z "$lines" ]; then t_fail "gpu/$name" "no TAP output (exit $rc): $(echo "$out" | tail -3)"; continue; fi
    # count each line of the program as one of ours so run.sh tallies them
    while IFS= read -r l; do
        T_COUNT=$((T_COUNT + 1))
        case "$l" in "not ok"*) T_FAILED=$((T_FAILED + 1)) ;; esac
        echo "$l"
    done <<< "$lines"
    echo "$out" | grep -E '^# ' | head -3
    if [ $rc -ne 0 ] && ! echo "$lines" | grep -q '^not ok'; then t_fail "gpu/$name" "exited $rc"; fi
    echo "$lines" | grep -q '# SKIP no GPU' && NO_GPU=1
done
# The end-to-end harness itself, CPU against CPU: losses must agree exactly
# and fall, so a GPU run's verdict rests on a harness known to work.
if [ -x "$ROOT/$BUILD/tests/gpu/gpu_train" ]; then
    d=$(t_tmpdir)
    out=$("$ROOT/$BUILD/tests/gpu/gpu_train" check --backend cpu --model tiny --steps 8 --seq-len 32 --micro-batch 4 \
          --threads 2 --dir "$d" 2>&1); rc=$?
    if echo "$out" | grep -q '^ok - e2e/tiny_losses_track_cpu' && echo "$out" | grep -q '^ok - e2e/tiny_loss_decreases' && [ $rc -eq 0 ]; then
        t_ok "gpu_train check harness, cpu against cpu"
    else
        t_fail "gpu_train check harness, cpu against cpu" "exit $rc: $(echo "$out" | grep -E '^(not ok|ok)' | tr '\n' ' ')"
    fi
fi
# check_fp8's tolerance, tried on an emulation of the formats: tight enough
# to catch a format mistake, loose enough for correct FP8
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
    t_check "check_fp8 tolerance holds for emulated FP8 and catches a wrong format" \
        /usr/bin/python3 "$ROOT/tests/gpu/fp8_emulate.py"
else
    t_skip "check_fp8 tolerance on emulated FP8" "python3-numpy not installed"
fi
# --precision fp8 is refused without the CUDA backend
if [ -x "$BIN/ballast-worker" ]; then
    d=$(t_tmpdir)
    "$BIN/ballast" data synth --out "$d/tok.bin" --tokens 4096 --vocab 512 >/dev/null 2>&1
    t_expect_fail "worker --precision fp8 on the CPU backend is refused" "precision fp8 .*needs --backend cuda" \
        "$BIN/ballast-worker" --precision fp8 --model demo --data "$d/tok.bin" --steps 1
fi
# Without a GPU, asking the worker for the CUDA backend must fail at once
# with a message that says why (and not crash or train on the CPU).
if [ "${NO_GPU:-0}" = 1 ] && [ -x "$BIN/ballast-worker" ]; then
    d=$(t_tmpdir)
    "$BIN/ballast" data synth --out "$d/tok.bin" --tokens 4096 --vocab 512 >/dev/null 2>&1
    t_expect_fail "worker --backend cuda without a GPU says so" "backend cuda: (no usable GPU|no NVIDIA driver|this ballast-worker was built without CUDA)" \
        "$BIN/ballast-worker" --backend cuda --model demo --data "$d/tok.bin" --steps 1
fi
t_done
