#!/usr/bin/env bash
# gpu_emu_cudnn.sh: --attention auto|cudnn|own on the emulated GPU. Without
# a usable cuDNN, auto picks our kernels and says why, and cudnn stops with
# a message; with the stand-in libcudnn.so.9 (tests/emu/cudnn_fake.cc,
# through BALLAST_CUDNN_LIB), the fused-attention graphs are built, checked
# call by call, planned once per shape and executed: the start-up
# self-check against our kernels passes, the run takes cuDNN, and its
# losses track the run on our kernels within bf16 tolerance. The CPU
# backend refuses --attention cudnn.
source "$(dirname "$0")/../lib.sh"
E=$ROOT/$BUILD/tests/emu/bin
FAKE=$ROOT/$BUILD/emu/lib/cudnn-fake
[ -x "$E/ballast-worker" ] || { t_fail "emu ballast-worker built" "missing $E/ballast-worker"; t_done; exit; }
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_NUM_THREADS=1
export LD_LIBRARY_PATH=$ROOT/$BUILD/emu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset BALLAST_CUDNN_LIB BALLAST_FAKE_CUDNN_LOG BALLAST_FAKE_CUDNN_NO_DEVICE BALLAST_ATTENTION
D=$(t_tmpdir)
cd "$ROOT"
"$BIN/ballast" data synth --out "$D/c.bin" --tokens 20000 --vocab 256 >/dev/null
COMMON=(--model tests/emu/config.json --init-seed 3 --data "$D/c.bin" --seq-len 16 --micro-batch 2 --threads 1)
emu() {  # OUT [flags...]: the emulated worker, its output in $D/OUT
    local out=$1; shift
    timeout 300 "$E/ballast-worker" --backend cuda "${COMMON[@]}" "$@" > "$D/$out" 2>&1
}
line() { grep -m1 'attention: ' "$D/$1"; }

# the two long runs first, in the background: cuDNN (the stand-in) and ours
BALLAST_CUDNN_LIB=$FAKE BALLAST_FAKE_CUDNN_LOG=$D/fake.log emu dnn.out --attention cudnn --steps 2 \
    --log-json "$D/dnn.jsonl" & P1=$!
emu own.out --attention own --steps 2 --log-json "$D/own.jsonl" & P2=$!

# the CPU backend: cudnn refused with the fix, own accepted
if "$BIN/ballast-worker" --backend cpu "${COMMON[@]}" --attention cudnn --steps 0 > "$D/cpu.out" 2>&1; then
    t_fail "cpu: --attention cudnn refused" "it ran"
elif grep -q 'needs --backend cuda.*use --attention auto or own' "$D/cpu.out"; then
    t_ok "cpu: --attention cudnn refused, naming --backend cuda and auto/own"
else t_fail "cpu: --attention cudnn refused with a clear message" "$(tail -2 "$D/cpu.out")"; fi
if "$BIN/ballast-worker" --backend cpu "${COMMON[@]}" --attention own --steps 0 > "$D/cpu2.out" 2>&1; then
    t_ok "cpu: --attention own accepted"
else t_fail "cpu: --attention own accepted" "$(tail -2 "$D/cpu2.out")"; fi

# no cuDNN where BALLAST_CUDNN_LIB points: auto -> own, saying why; cudnn stops
if BALLAST_CUDNN_LIB=$D/none emu none.out --attention auto --steps 0 &&
   line none.out | grep -q "libcudnn.so.9 did not load from BALLAST_CUDNN_LIB=$D/none.*-> own$"; then
    t_ok "emu: auto without cuDNN picks own and says why"
else t_fail "emu: auto without cuDNN picks own and says why" "$(line none.out || tail -2 "$D/none.out")"; fi
if BALLAST_CUDNN_LIB=$D/none emu none2.out --attention cudnn --steps 0; then
    t_fail "emu: --attention cudnn without cuDNN stops" "it ran"
elif grep -q 'error: attention: libcudnn.so.9 did not load.*--attention cudnn cannot run (use auto or own)' "$D/none2.out"; then
    t_ok "emu: --attention cudnn without cuDNN stops with the reason"
else t_fail "emu: --attention cudnn without cuDNN stops with the reason" "$(tail -2 "$D/none2.out")"; fi
# the default search (this machine may have a real cuDNN, which cannot
# start on the emulated device, or none)
if emu def.out --steps 0 && line def.out | grep -Eq '(not found \(looked in .*nvidia/cudnn/lib|cudnnCreate: ).*-> own$'; then
    t_ok "emu: auto with the default search picks own: $(line def.out | sed 's/.*attention: //' | cut -c1-90)"
else t_fail "emu: auto with the default search picks own" "$(line def.out || tail -2 "$D/def.out")"; fi
wait $P1; RC1=$?
wait $P2; RC2=$?
if [ $RC1 = 0 ] && line dnn.out | grep -Eq 'cuDNN 9.19.0: self-check max rel err [0-9.e+-]+ \((out|lse|dq|dk|dv); tolerance 3.2e-02\) -> cudnn$'; then
    t_ok "emu: stand-in cuDNN: self-check passes, --attention cudnn runs: $(line dnn.out | sed 's/.*self-check //')"
else t_fail "emu: stand-in cuDNN: self-check passes and the run takes cuDNN" "rc $RC1: $(line dnn.out || tail -3 "$D/dnn.out")"; fi
# plans once per shape: the check's two (Dh 64, 128) and the model's, each
# forward and backward; executions: 2 + 2 blocks x 2 steps of each
G=$(grep -c '^graph: ' "$D/fake.log" 2>/dev/null); X=$(grep -c '^execute: ' "$D/fake.log" 2>/dev/null)
if [ "$G" = 6 ] && [ "$X" = 12 ] && [ "$(grep -c '^graph: 14 ops' "$D/fake.log")" = 3 ]; then
    t_ok "emu: stand-in cuDNN: 6 graphs built and planned (3 shapes x fwd/bwd), 12 executions"
else t_fail "emu: stand-in cuDNN: plans cached per shape" "graphs $G, executions $X: $(sort "$D/fake.log" | uniq -c | tr '\n' ';')"; fi
if [ $RC2 = 0 ] && why=$(/usr/bin/python3 - "$D/own.jsonl" "$D/dnn.jsonl" <<'PY'
import sys
import jsonlog
own, dnn = jsonlog.by_step(sys.argv[1], "loss"), jsonlog.by_step(sys.argv[2], "loss")
if len(own) != 2 or len(dnn) != 2:
    sys.exit("steps: %d and %d" % (len(own), len(dnn)))
# bf16 activations on both paths: per-step losses within 1e-2 relative
for a, b in zip(own, dnn):
    if abs(a - b) > 1e-2 * abs(a):
        sys.exit("losses differ: own %s vs cudnn %s" % (own, dnn))
print("own %s, cudnn %s" % (own, dnn))
PY
); then t_ok "emu: losses on cuDNN's path track our kernels' within 1e-2: $why"
else t_fail "emu: losses on cuDNN's path track our kernels'" "rc $RC2: ${why:-$(tail -2 "$D/own.out")}"; fi
t_done
