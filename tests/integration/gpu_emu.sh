#!/usr/bin/env bash
# gpu_emu.sh: the emulation tier (tests/emu): the CUDA backend's real .cu
# files compiled as host C++ and run on the CPU, with random thread and
# stream orders and AddressSanitizer.
#   1. the emulator's own semantics (selftest) and its libraries against
#      independent references (test_emu_libs: bf16/FP8 conversions,
#      cuBLASLt, NCCL)
#   2. every GPU check (tests/gpu/check_*.c) against the CPU oracle, on the
#      emulated device; each prints its seed (BALLAST_EMU_SEED replays it)
#   3. gpu_train check: 20 training steps on the emulated GPU against the
#      CPU backend, without activation checkpointing and with the selective kind
# `make test T=emu` runs this tier alone. Leak checking is off: the checks
# keep their buffers to the end, and the tier is about races and bounds.
# The programs are independent processes: they run BALLAST_EMU_JOBS at a
# time (default: the number of cores), and their results are reported in
# a fixed order once all have ended. No check depends on speed.
source "$(dirname "$0")/../lib.sh"

E=$ROOT/$BUILD/tests/emu
if [ ! -x "$E/selftest" ]; then
    t_fail "emulation tier" "$E/selftest was not built (make builds it; needs g++ and python3)"
    t_done; exit
fi
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:exitcode=99:print_summary=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# the emulated libraries come first for code that dlopens libcudart/libnccl
export LD_LIBRARY_PATH=$ROOT/$BUILD/emu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
EMU_TIMEOUT=${BALLAST_EMU_TIMEOUT:-300}

# Start one TAP program in the background, its output and exit status
# kept under $OUTD/<n>; at most $JOBS run at once.
OUTD=$(t_tmpdir)
JOBS=${BALLAST_EMU_JOBS:-$(nproc 2>/dev/null || echo 1)}
case "$JOBS" in ''|*[!0-9]*|0) t_fail "emulation tier" "BALLAST_EMU_JOBS='$JOBS' is not a positive count of parallel checks (unset it to use every core)"; t_done; exit ;; esac
NJOB=0
ORDER=()
start_tap() {
    local name=$1; shift
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    NJOB=$((NJOB + 1))
    local f=$OUTD/$NJOB
    ORDER+=("$NJOB:$name")
    ( timeout "$EMU_TIMEOUT" "$@" > "$f.out" 2>&1; echo $? > "$f.rc" ) &
}

# Pass one finished program's lines through under "emu/", and on a
# failure show its last stderr lines (the seed, the emulator's message).
report_tap() {
    local name=$1 f=$2
    local out rc
    out=$(cat "$f.out" 2>/dev/null); rc=$(cat "$f.rc" 2>/dev/null || echo 125)
    local lines
    lines=$(echo "$out" | grep -E '^(ok|not ok) ')
    if [ -z "$lines" ]; then
        t_fail "emu/$name" "no TAP output (exit $rc): $(echo "$out" | grep -v '^==.*WARNING: ASan' | tail -6 | tr '\n' ' ')"
        return
    fi
    while IFS= read -r l; do
        T_COUNT=$((T_COUNT + 1))
        case "$l" in "not ok"*) T_FAILED=$((T_FAILED + 1)) ;; esac
        echo "$l" | sed -E 's/^(ok|not ok)( [0-9]+)? - (emu\/)?/\1 - emu\//'
    done <<< "$lines"
    if echo "$lines" | grep -q '^not ok' || [ "$rc" -ne 0 ]; then
        echo "$out" | grep -E 'gpu-emu|ERROR: AddressSanitizer|runtime error|not ok|^#' | head -12 | sed 's/^/#   /'
    fi
    if [ "$rc" -ne 0 ] && ! echo "$lines" | grep -q '^not ok'; then t_fail "emu/$name" "exited $rc: $(echo "$out" | tail -4 | tr '\n' ' ')"; fi
    if echo "$lines" | grep -q '# SKIP'; then t_fail "emu/$name" "skipped a case on the emulated GPU: $(echo "$lines" | grep '# SKIP' | head -1)"; fi
}

# gpu_train's end-to-end check gives a verdict line, not TAP to pass through.
report_train() {
    local name=$1 f=$2
    local out rc
    out=$(cat "$f.out" 2>/dev/null); rc=$(cat "$f.rc" 2>/dev/null || echo 125)
    if [ "$rc" -eq 0 ] && echo "$out" | grep -q '^ok - e2e/.*_losses_track_cpu' && ! echo "$out" | grep -q '^not ok'; then
        t_ok "$name: $(echo "$out" | grep -o 'worst rel diff [^,]*' | head -1)"
    else
        t_fail "$name" "exit $rc: $(echo "$out" | grep -E '^(not ok|#)|gpu-emu|ERROR' | head -8 | tr '\n' ' ')"
    fi
}

# The training checks are the longest: they start first, so that neither
# ends the tier alone on one core.
if [ -x "$E/gpu_train" ]; then
    d=$(t_tmpdir)
    cp "$ROOT/tests/emu/config.json" "$d/config.json"  # head_dim 64, as the GPU kernels need
    # (selective checkpointing runs every op full checkpointing does but the
    # attention forward; gpu_emu_train checks both against no checkpointing
    # to the bit)
    for ck in false selective; do
        steps=20 seq=64 flag=()
        [ "$ck" = selective ] && steps=8 seq=32 flag=(--activation-checkpointing selective)
        start_tap "train:emu/gpu_train $steps steps track the CPU backend (activation checkpointing $ck)" \
            "$E/gpu_train" check --model "$d/config.json" --steps $steps --seq-len $seq \
            --micro-batch 2 --threads 1 "${flag[@]}" --dir "$d"
    done
else
    t_fail "emu/gpu_train" "$E/gpu_train was not built"
fi

start_tap selftest "$E/selftest"
if [ -x "$E/test_emu_libs" ]; then
    start_tap test_emu_libs "$E/test_emu_libs" "$ROOT/$BUILD/emu/plain/libnccl.so.2"
else
    t_fail "emu/test_emu_libs" "$E/test_emu_libs was not built"
fi

for src in "$ROOT"/tests/gpu/check_*.c; do
    name=$(basename "$src" .c)
    prog=$E/$name
    if [ ! -x "$prog" ]; then t_fail "emu/$name" "$prog was not built"; continue; fi
    args=()
    [ "$name" = check_pool ] && args=(--max-mib 16)
    # the fused paths (on by default, docs/cuda.md) are what the checks take;
    # check_attention's cuDNN cases run on the stand-in libcudnn (tests/emu/cudnn_fake.cc)
    start_tap "$name" env BALLAST_CUDA_FUSED=1 BALLAST_NCCL_LIB="$ROOT/$BUILD/emu/lib/libnccl.so.2" \
        BALLAST_CUDNN_LIB="$ROOT/$BUILD/emu/lib/cudnn-fake" "$prog" "${args[@]}"
done
wait

for e in "${ORDER[@]}"; do
    n=${e%%:*} name=${e#*:}
    case "$name" in
        train:*) report_train "${name#train:}" "$OUTD/$n" ;;
        *) report_tap "$name" "$OUTD/$n" ;;
    esac
done
t_done
