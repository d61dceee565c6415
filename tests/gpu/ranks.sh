#!/usr/bin/env bash
# tests/gpu/ranks.sh: GPU ranks of the sharded trainer, 4 ranks on one GPU.
#
# NCCL refuses two ranks on one GPU, so the 4 ranks share the GPU through
# the shared-memory collectives behind host staging (workers/comm/stage.h;
# --comm auto picks that when ranks share a GPU). For (S, T) in (4, 1),
# (2, 2), (1, 4) (one replica), with each memory saver on in turn
# (--activation-checkpointing always; --activation-offload and
# --optimizer-offload host when this ballast-worker has them: `--help`
# says), 10 steps of `ballast train --nproc 4 --backend cuda` must give
# per-step losses within TOL (relative) of one GPU process reading the same
# global batch, and the loss must fall.
#
# The tolerance, TOL = 2e-2 relative per step: both runs keep activations
# and the working weights in bf16 (unit roundoff 2^-9) and differ only in
# where they round (TP partial sums are rounded per rank before they are
# added; fp32 gradient chunks are summed in another order). Each bf16 run
# is within the end-to-end check's 1e-2 of the fp32 CPU run over these step
# counts (tests/gpu/gpu_train.c check), so by the triangle inequality two
# bf16 runs are within 2e-2 of each other. The CPU runs of the same layouts
# (tests/integration/fsdp_losses.sh) agree to 1e-5, so anything past 2e-2
# here is a GPU-path bug, not rounding.
#
# Needs build/bin/ballast and build/bin/ballast-worker built by `make` with
# nvcc (so the worker has --backend cuda) and a GPU; says SKIP otherwise.
# Prints TAP lines; exit 0 when nothing failed. Usage:
#   tests/gpu/ranks.sh [LOGDIR]
# GPU_LD_PATH, when set, is the LD_LIBRARY_PATH of our programs (run.sh:
# the bundle's libraries and CUDA's), and of nothing else here.
# RANKS_BACKEND=cpu (with BALLAST_BIN=build/tests/bin and
# BALLAST_TEST_BACKEND=staged, the test build's CPU backend that the host
# may not touch, and an nvidia-smi stub on PATH) dry-runs the script's
# machinery on the CPU.
set -u
cd "$(dirname "$0")/../.."
BIN=${BALLAST_BIN:-build/bin}
LOGD=${1:-build/gpu/log}
TOL=2e-2
STEPS=10
mkdir -p "$LOGD"
D=$(mktemp -d /tmp/ballast-ranks.XXXXXX) || { echo "not ok - ranks: cannot make a temp directory"; exit 1; }
trap 'rm -rf "$D"; [ -n "${DPID:-}" ] && kill "$DPID" 2>/dev/null' EXIT
N=0 BAD=0
ok() { N=$((N + 1)); echo "ok $N - $1"; }
notok() { N=$((N + 1)); BAD=$((BAD + 1)); echo "not ok $N - $1"; [ -n "${2:-}" ] && echo "$2" | sed 's/^/# /'; }
skip() { N=$((N + 1)); echo "ok $N - $1 # SKIP $2"; }
finish() { echo "1..$N"; exit $((BAD > 0)); }

W=$BIN/ballast-worker B=$BIN/ballast
OURS=()
[ -n "${GPU_LD_PATH:-}" ] && OURS=(env "LD_LIBRARY_PATH=$GPU_LD_PATH")
if [ ! -x "$W" ] || [ ! -x "$B" ]; then skip "4 ranks on one GPU" "no $W / $B (run make on a machine with the project's packages and nvcc)"; finish; fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then skip "4 ranks on one GPU" "no GPU here"; finish; fi
HELP=$("${OURS[@]}" "$W" --help 2>&1)
EXTRA_SAVERS=()
echo "$HELP" | grep -q -- '--activation-offload' && EXTRA_SAVERS+=(aoff)
echo "$HELP" | grep -q -- '--optimizer-offload' && EXTRA_SAVERS+=(ooff)

# a model whose heads (8), kv heads (4), MLP rows (1024) and vocabulary
# (1024) divide by 4; head width 64
printf '%s\n' '{"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,' \
    ' "num_key_value_heads": 4, "intermediate_size": 1024, "vocab_size": 1024, "max_position_embeddings": 256,' \
    ' "rms_norm_eps": 1e-5}' > "$D/m.json"
"${OURS[@]}" "$B" data synth --out "$D/c.bin" --tokens 200000 --vocab 1024 --seed 5 > "$D/synth.out" 2>&1 ||
    { notok "synth corpus" "$(tail -3 "$D/synth.out")"; finish; }
GB=8 SEQ=128 ACC=2
RUN=(--backend ${RANKS_BACKEND:-cuda} --model "$D/m.json" --data "$D/c.bin" --init-seed 7 --data-order shuffled --data-seed 9
     --seq-len $SEQ --grad-accum $ACC --steps $STEPS --lr 1e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 1.0
     --rdzv-timeout 120s)

# ballastd for the offload savers (a private socket under $D)
SAVER_FLAGS_aoff=() SAVER_FLAGS_ooff=()
if [ ${#EXTRA_SAVERS[@]} -gt 0 ]; then
    if [ -x "$BIN/ballastd" ]; then
        # a spill directory for --optimizer-offload (host mode is not durable by default and never writes to it)
        "${OURS[@]}" "$BIN/ballastd" --socket "$D/ballastd.sock" --pool-bytes 2G --spill-dir "$D/spill" --spill-bytes 2G \
            --spill-file-bytes 256M --no-mlock > "$D/ballastd.out" 2>&1 &
        DPID=$!
        for _ in $(seq 50); do [ -S "$D/ballastd.sock" ] && break; sleep 0.1; done
        SAVER_FLAGS_aoff=(--activation-offload --offload-socket "unix:$D/ballastd.sock")
        SAVER_FLAGS_ooff=(--optimizer-offload host --offload-socket "unix:$D/ballastd.sock")
    else
        EXTRA_SAVERS=()
        skip "offload savers" "no $BIN/ballastd"
    fi
else
    skip "--activation-offload / --optimizer-offload" "this ballast-worker has neither flag yet"
fi

saver_flags() {  # saver -> flags
    case $1 in
    ckpt) echo --activation-checkpointing ;;
    aoff) echo "${SAVER_FLAGS_aoff[@]}" ;;
    ooff) echo "${SAVER_FLAGS_ooff[@]}" ;;
    esac
}

# losses of a --log-json file, one per step
losses() { grep -o '"loss": *[-0-9.eE+naif]*' "$1" | sed 's/.*: *//'; }
# compare REF RUN: every step within TOL relative, the loss falls
cmp_losses() {
    paste <(losses "$1") <(losses "$2") | awk -v tol=$TOL -v n=$STEPS '
        { k++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
          if (!(r <= tol)) { bad++; printf "step %d: ref %.6f run %.6f rel %.2e > %g\n", k, $1, $2, r, tol }
          if (r > worst) worst = r; if (k == 1) first = $2; last = $2 }
        END { if (k != n) { printf "%d steps logged, %d expected\n", k, n; exit 1 }
              if (!(last < first)) { printf "loss did not fall: %.6f -> %.6f\n", first, last; exit 1 }
              printf "worst relative difference %.2e (tol %g)\n", worst, tol; exit bad > 0 }'
}

for saver in ckpt "${EXTRA_SAVERS[@]}"; do
    flags=$(saver_flags $saver)
    # the reference: one GPU process reading the whole global batch
    ref=$D/ref-$saver
    if timeout 240 "${OURS[@]}" "$W" "${RUN[@]}" $flags --micro-batch $GB --log-json "$ref.jsonl" > "$ref.out" 2>&1; then
        ok "one GPU process, $saver: $STEPS steps"
    elif grep -q "run on --backend cpu in this build" "$ref.out"; then
        skip "$saver on GPU ranks" "this ballast-worker runs the offload savers on the CPU backend only"; continue
    else
        notok "one GPU process, $saver" "$(tail -5 "$ref.out")"; cp "$ref.out" "$LOGD/" 2>/dev/null; continue
    fi
    for lay in "4 1" "2 2" "1 4"; do
        set -- $lay
        S=$1 T=$2 name=$D/w4-s$1-t$2-$saver
        what="4 ranks on one GPU (S $S, T $T), $saver"
        if ! timeout 300 "${OURS[@]}" "$B" train --nproc 4 "${RUN[@]}" $flags --micro-batch $((GB * T / 4)) \
                --hybrid-shard-degree $S --tensor-parallel-degree $T --log-json "$name.jsonl" > "$name.out" 2>&1; then
            notok "$what runs" "$(tail -8 "$name.out")"; cp "$name.out" "$LOGD/" 2>/dev/null; continue
        fi
        if grep -q 'collectives shm+stage' "$name.out"; then ok "$what: shm collectives with host staging"
        else notok "$what: shm collectives with host staging" "$(grep -m3 'GPU\|comm' "$name.out")"; fi
        if msg=$(cmp_losses "$ref.jsonl" "$name.jsonl"); then ok "$what: losses within $TOL of one GPU ($msg)"
        else notok "$what: losses within $TOL of one GPU" "$msg"; fi
        cp "$name.out" "$name.jsonl" "$LOGD/" 2>/dev/null
    done
done

# --grad-reduce-dtype bf16 on GPU ranks: (S 2, T 2) against one GPU process
name=$D/w4-s2-t2-bf16grad
if timeout 300 "${OURS[@]}" "$B" train --nproc 4 "${RUN[@]}" --activation-checkpointing --micro-batch $((GB * 2 / 4)) \
        --hybrid-shard-degree 2 --tensor-parallel-degree 2 --grad-reduce-dtype bf16 --log-json "$name.jsonl" \
        > "$name.out" 2>&1; then
    if msg=$(cmp_losses "$D/ref-ckpt.jsonl" "$name.jsonl"); then
        ok "4 ranks (S 2, T 2), gradients reduced in bf16: losses within $TOL of one GPU ($msg)"
    else notok "4 ranks (S 2, T 2), gradients reduced in bf16: losses within $TOL of one GPU" "$msg"; fi
else notok "4 ranks with --grad-reduce-dtype bf16 runs" "$(tail -8 "$name.out")"; fi
cp "$name.out" "$LOGD/" 2>/dev/null

# sharded checkpoints on GPU ranks: (S 2, T 2) saves at steps 5 and 10;
# with step 10's directory removed, --resume continues from step 5 and
# steps 6..10 track the first run's own
name=$D/w4-s2-t2-ck
if timeout 300 "${OURS[@]}" "$B" train --nproc 4 "${RUN[@]}" --activation-checkpointing --micro-batch $((GB * 2 / 4)) \
        --hybrid-shard-degree 2 --tensor-parallel-degree 2 --ckpt-dir "$D/ck" --ckpt-every 5 \
        --log-json "$name-first.jsonl" > "$name.out" 2>&1 && [ -f "$D/ck/step-00000005/manifest.json" ] &&
   rm -rf "$D/ck/step-00000010" &&
   timeout 300 "${OURS[@]}" "$B" train --nproc 4 "${RUN[@]}" --activation-checkpointing --micro-batch $((GB * 2 / 4)) \
        --hybrid-shard-degree 2 --tensor-parallel-degree 2 --ckpt-dir "$D/ck" --resume --log-json "$name.jsonl" \
        >> "$name.out" 2>&1; then
    msg=$(paste <(losses "$name-first.jsonl" | tail -5) <(losses "$name.jsonl" | tail -5) | awk -v tol=$TOL '
        { k++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > w) w = r; if (!(r <= tol)) bad++ }
        END { printf "%d steps, worst relative difference %.2e", k, w; exit (k != 5 || bad > 0) }')
    if [ $? -eq 0 ]; then ok "GPU ranks save sharded checkpoints and resume from step 5: $msg"
    else notok "GPU ranks resume from a sharded checkpoint within $TOL" "$msg"; fi
else notok "GPU ranks save and resume a sharded checkpoint" "$(tail -8 "$name.out")"; fi
cp "$name.out" "$LOGD/" 2>/dev/null

# the NCCL path with one rank per communicator: one GPU process in the
# sharded loop (activation offload puts it there) with --comm nccl
if [ ${#SAVER_FLAGS_aoff[@]} -gt 0 ] && [ -f "$D/ref-aoff.jsonl" ]; then
    name=$D/w1-nccl-aoff
    if timeout 240 "${OURS[@]}" "$B" train --nproc 1 "${RUN[@]}" "${SAVER_FLAGS_aoff[@]}" --comm nccl --micro-batch $GB \
            --log-json "$name.jsonl" > "$name.out" 2>&1; then
        if msg=$(cmp_losses "$D/ref-aoff.jsonl" "$name.jsonl"); then
            ok "one GPU rank, NCCL groups of one, activation offload: losses within $TOL ($msg)"
        else notok "one GPU rank with NCCL: losses within $TOL" "$msg"; fi
    else notok "one GPU rank with --comm nccl runs" "$(tail -8 "$name.out")"; fi
    cp "$name.out" "$LOGD/" 2>/dev/null
else skip "one GPU rank with --comm nccl" "no activation-offload reference run"; fi
finish
