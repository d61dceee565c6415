#!/usr/bin/env bash
# gpu_emu_train.sh: ballast-worker's CUDA backend on the emulated GPU
# (tests/emu), through ballastd: activation offload (out and back a
# horizon ahead), optimizer state offloaded to host (double buffered), and
# selective activation checkpointing (no offload), and two ranks sharing
# the one emulated device with staged collectives. The
# savers run the same ops in the same order as one process without them,
# so they must give its losses to the bit (the kernels are deterministic,
# so random thread and stream orders may not change a single bit unless an
# ordering is missing). Two sharding ranks (S 2) sum each weight gradient
# in another order (two half-batch GEMMs added by the reduce-scatter, the
# norm over two shards) and so differ from one process in the last fp32
# bits of the master weights (about 1% of them after one step, with the
# fused paths or without); those reach the bf16 working copy only where a
# rounding flips, so the losses agree within LOSS_TOL, not to the bit.
# Context parallelism (C 2) over the emulated NCCL (a process and an
# emulated device per rank), with the ring's shifts waited for by the GPU
# (--cp-overlap, the default) and by the host: those two to the bit, and
# each within CP_TOL of the CPU backend's C 1 (and of the CUDA backend's
# C 1) at every step. BALLAST_EMU_CP_ALL=1 adds C 2 on one emulated device
# (staged shm) and C 4 over NCCL (four devices), under the same tolerance
# (they take longer than make test's budget allows). CP_TOL is
# 2^-9, bf16's relative rounding of one value: the CUDA runs keep every
# activation in bf16 and the ring only reorders attention's fp32 sums and
# rounds each partial output once more before the merge, so a loss that
# moves by more than one bf16 rounding of itself is not explained by
# storage (measured: under 1e-4 over these 4 steps). A chunk attended at
# the wrong position or a pair left out moves it by more.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/ballastd.lib"
E=$ROOT/$BUILD/tests/emu/bin
[ -x "$E/ballast-worker" ] || { t_fail "emu ballast-worker built" "missing $E/ballast-worker"; t_done; exit; }
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_NUM_THREADS=1
export LD_LIBRARY_PATH=$ROOT/$BUILD/emu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
D=$(t_tmpdir)
cp "$ROOT/tests/emu/config.json" "$D/cfg.json"  # head_dim 64, as the GPU kernels need
"$BIN/ballast" data synth --out "$D/c.bin" --tokens 20000 --vocab 256 >/dev/null
bd_start main "$D" --pool-bytes 64M --no-mlock ||
    { t_fail "ballastd starts" "$(tail -3 "$D/main.log")"; t_done; exit; }
COMMON=(--backend cuda --model "$D/cfg.json" --init-seed 3 --data "$D/c.bin" --seq-len 32 --steps 4 --threads 1
        --offload-socket "$(bd_sock main)" --rdzv-timeout 60s)
run() {  # NAME NPROC MICRO [flags...]
    local name=$1 np=$2 mb=$3; shift 3
    timeout 300 "$E/ballast" train --nproc "$np" --micro-batch "$mb" "${COMMON[@]}" --offload-job "$name" \
        --log-json "$D/$name.jsonl" "$@" > "$D/$name.out" 2>&1
}
near() {  # NAME REF TOL: NAME's losses within TOL relative of REF's, every step
    /usr/bin/python3 - "$D/$2.jsonl" "$D/$1.jsonl" "$3" <<'PY'
import sys
import jsonlog
ref, run, tol = jsonlog.by_step(sys.argv[1], "loss"), jsonlog.by_step(sys.argv[2], "loss"), float(sys.argv[3])
if len(ref) != 4 or sorted(ref) != sorted(run):
    sys.exit("steps differ: %s vs %s" % (sorted(ref), sorted(run)))
worst = max(abs(run[s] - ref[s]) / abs(ref[s]) for s in ref)
if not worst <= tol:
    sys.exit("worst relative difference %.3e over %g: %s vs %s" % (worst, tol, run, ref))
print("worst relative difference %.1e" % worst)
PY
}
same() {  # NAME: its losses equal ref's, every step, to the bit
    /usr/bin/python3 - "$D/ref.jsonl" "$D/$1.jsonl" <<'PY'
import sys
import jsonlog
ref, run = jsonlog.by_step(sys.argv[1], "loss"), jsonlog.by_step(sys.argv[2], "loss")
if len(ref) != 4 or ref != run:
    sys.exit("losses differ: %s vs %s" % (ref, run))
PY
}
# 5e-4: the S 2 losses of 4 steps come within 1e-4 of one process (with
# the fused paths and without); a missing or doubled shard of a gradient
# moves them by 1e-2 or more
LOSS_TOL=5e-4
near_ref() {  # NAME: its losses within LOSS_TOL of ref's, every step
    /usr/bin/python3 - "$D/ref.jsonl" "$D/$1.jsonl" "$LOSS_TOL" <<'PY'
import sys
import jsonlog
ref, run = jsonlog.by_step(sys.argv[1], "loss"), jsonlog.by_step(sys.argv[2], "loss")
tol = float(sys.argv[3])
if len(ref) != 4 or sorted(ref) != sorted(run) or any(abs(ref[s] - run[s]) > tol for s in ref):
    sys.exit("losses differ by more than %g: %s vs %s" % (tol, ref, run))
PY
}
cd "$ROOT"
if ! run ref 1 2; then t_fail "emu: one process on the emulated GPU trains" "$(tail -4 "$D/ref.out")"; t_done; exit; fi
t_ok "emu: one process on the emulated GPU trains 4 steps"
CP_TOL=0.001953125  # 2^-9 (above)
if ! timeout 300 "$BIN/ballast" train --nproc 1 --micro-batch 2 --backend cpu "${COMMON[@]:2}" --offload-job cpu1 \
        --log-json "$D/cpu1.jsonl" > "$D/cpu1.out" 2>&1; then
    t_fail "cpu: the CPU backend's C 1 reference trains" "$(tail -4 "$D/cpu1.out")"
fi
# The four runs are independent of each other: they run two at a time
# (each against ref, which ran first) and report in a fixed order.
# (ballastd runs in the background too: only the runs' own PIDs are
# counted and waited for)
JOBS=$(nproc 2>/dev/null || echo 1)
NAMES=() LABELS=() PIDS=()
declare -A CMP
running() { local n=0 p; for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done; echo $n; }
start() {  # NAME LABEL NPROC MICRO flags...
    local name=$1 label=$2; shift 2
    local waited=0
    while [ "$(running)" -ge "$JOBS" ] && [ $waited -lt 3000 ]; do sleep 0.2; waited=$((waited + 1)); done
    NAMES+=("$name") LABELS+=("$label")
    ( run "$name" "$@"; echo $? > "$D/$name.rc" ) &
    PIDS+=($!)
}
start act "activation offload, horizon 1" 1 2 --activation-offload --activation-loading-horizon 1
start actck "activation offload, horizon 0, with checkpointing" 1 2 --activation-offload --activation-loading-horizon 0 \
    --activation-checkpointing
start actsel "selective checkpointing (attention output and log-sum-exp kept)" 1 2 --activation-checkpointing selective
start opt "optimizer state offloaded to host" 1 2 --optimizer-offload host
start w2 "two ranks on one emulated GPU (S 2), staged collectives" 2 1 --hybrid-shard-degree 2
CMP=([act]=same [actck]=same [actsel]=same [opt]=same [w2]=near_ref)
if [ "${BALLAST_EMU_CP_ALL:-0}" = 1 ]; then
    start cp2s "context parallel C 2 on one emulated GPU, staged collectives" 2 2 --context-parallel-degree 2
    BALLAST_EMU_DEVICES=4 start cp4n "context parallel C 4 over the emulated NCCL (a device per rank)" \
        4 2 --context-parallel-degree 4 --comm nccl
fi
BALLAST_EMU_DEVICES=2 start cp2n "context parallel C 2 over the emulated NCCL (a device per rank), shifts waited for by the GPU" \
    2 2 --context-parallel-degree 2 --comm nccl
BALLAST_EMU_DEVICES=2 start cp2h "context parallel C 2 over the emulated NCCL, shifts waited for by the host" \
    2 2 --context-parallel-degree 2 --comm nccl --no-cp-overlap
wait "${PIDS[@]}"
for i in "${!NAMES[@]}"; do
    name=${NAMES[$i]} label=${LABELS[$i]}
    if [ "$(cat "$D/$name.rc" 2>/dev/null)" != 0 ]; then
        t_fail "emu: $label" "$(grep -E 'gpu-emu|error|ERROR' "$D/$name.out" | head -4)"; continue
    fi
    case $name in
    cp[0-9]*)
        if ! grep -q "context-parallel degree ${name:2:1}; comm" "$D/$name.out"; then
            t_fail "emu: $label" "no 'context-parallel degree ${name:2:1}' in its layout line"; continue
        fi
        c="" g=""
        if c=$(near "$name" cpu1 $CP_TOL 2>&1) && g=$(near "$name" ref $CP_TOL 2>&1); then
            t_ok "emu: $label: within 2^-9 of the CPU backend's C 1 ($c) and of CUDA's C 1 ($g), $(grep -o 'comm [a-z+]*$' "$D/$name.out" | head -1)"
        else t_fail "emu: $label" "$c $g"; fi ;;
    *)
        cmp=${CMP[$name]}
        what="the losses of one process, to the bit"
        [ "$cmp" = near_ref ] && what="the losses of one process within $LOSS_TOL"
        if why=$($cmp "$name" 2>&1); then t_ok "emu: $label: $what"
        else t_fail "emu: $label" "$why"; fi ;;
    esac
done
if [ "$(cat "$D/cp2n.rc" "$D/cp2h.rc" 2>/dev/null | tr -d '\n')" = 00 ]; then
    if why=$(/usr/bin/python3 - "$D/cp2h.jsonl" "$D/cp2n.jsonl" 2>&1 <<'PY'
import sys
import jsonlog
host, gpu = jsonlog.by_step(sys.argv[1], "loss"), jsonlog.by_step(sys.argv[2], "loss")
if len(host) != 4 or host != gpu:
    sys.exit("losses differ: host waits %s, GPU waits %s" % (host, gpu))
PY
    ); then t_ok "emu: context parallel over NCCL: the GPU waiting for the ring's shifts gives the host-waiting losses, to the bit"
    else t_fail "emu: context parallel over NCCL, --cp-overlap against --no-cp-overlap" "$why"; fi
else
    t_fail "emu: context parallel over NCCL, --cp-overlap against --no-cp-overlap" "a run failed (above)"
fi
t_done
