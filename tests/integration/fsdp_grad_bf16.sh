#!/usr/bin/env bash
# fsdp_grad_bf16.sh: --grad-reduce-dtype bf16. Gradients are rounded to
# bf16, reduce-scattered (shard group) and all-reduced (replica group) in
# bf16, and widened into the fp32 chunks. Same model, data and schedule as
# fsdp_losses.sh (tiny Llama, 10 steps, 2 micro-steps, 4 ranks).
#
# Checks, for (replicas, S) = (1, 4), (2, 2), (4, 1):
#   - the run differs from the same layout in fp32 (the parameters after 10
#     steps are not the same bits: the bf16 path really ran; the fp32
#     sharded runs are deterministic, fsdp_losses.sh);
#   - it tracks one process in fp32: every step's loss within 1e-2
#     relative, the parameters within 2e-2 norm-wise per tensor. Why these:
#     bf16 keeps 8 significant bits, so each rounding of a partial sum is
#     off by up to 2^-9 = 2e-3 relative; a gradient element goes through
#     two roundings per micro-step (rank's partial, then the reduced sum,
#     widened) and sums of 2-4 rounded terms, so gradients are off by about
#     4e-3 relative; AdamW normalizes each element by its own RMS, so the
#     weights move by lr-sized amounts in slightly different directions
#     (lr 3e-3, 10 steps); fp32 sharded runs are within 1e-5 / 1e-4 of
#     the same reference (fsdp_losses.sh).
# One process with bf16 is the fp32 run, bit for bit (groups of one never
# round). The same bits on the scrambled backend (memory that is not host
# memory). And a bad value is refused with the choices named.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/fsdp.lib"
fsdp_numpy_setup "$TBIN" "bf16 gradient reduction"
fsdp_tiny "$D" 5
STEPS=10 GB=8 SEQ=32 ACC=2 NP=4
COMMON=(--model "$D/m.json" --data "$D/c.bin" --init-seed 7 --data-order shuffled --data-seed 9 --seq-len $SEQ
        --grad-accum $ACC --steps $STEPS --lr 3e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1
        --rdzv-timeout 60s)

if "$W" "${COMMON[@]}" --micro-batch $GB --log-json "$D/ref.jsonl" --dump-params "$D/ref.st" > "$D/ref.out" 2>&1; then
    t_ok "reference: one process, fp32"
else t_fail "reference run" "$(tail -3 "$D/ref.out")"; fi

run4() {  # name S dtype
    timeout 120 "$B" train --nproc $NP "${COMMON[@]}" --micro-batch $((GB / NP)) --hybrid-shard-degree "$2" \
        --grad-reduce-dtype "$3" --log-json "$D/$1.jsonl" --dump-params "$D/$1.st" > "$D/$1.out" 2>&1
}

for lay in "1 4" "2 2" "4 1"; do
    set -- $lay
    R=$1 S=$2 what="(replicas $1, S $2)"
    if ! run4 "bf16-r$R-s$S" $S bf16; then
        t_fail "$what with --grad-reduce-dtype bf16 runs" "$(tail -5 "$D/bf16-r$R-s$S.out")"; continue
    fi
    if ! run4 "fp32-r$R-s$S" $S fp32; then
        t_fail "$what in fp32 runs" "$(tail -5 "$D/fp32-r$R-s$S.out")"; continue
    fi
    t_expect_fail "$what: bf16 reduction changes the weights (not the fp32 run's bits)" "max relative parameter difference (0\.0*[1-9]|[1-9])" \
        $PY "$CMP" params "$D/fp32-r$R-s$S.st" "$D/bf16-r$R-s$S.st" 0
    t_check "$what: bf16 losses within 1e-2 of one process in fp32" \
        $PY "$CMP" losses "$D/ref.jsonl" "$D/bf16-r$R-s$S.jsonl" 1e-2
    t_check "$what: bf16 parameters within 2e-2 of one process in fp32" \
        $PY "$CMP" params "$D/ref.st" "$D/bf16-r$R-s$S.st" 2e-2
done

# one process (world 1: every group one rank) has nothing to reduce, so bf16
# rounds nothing: the fp32 reference's bits
if "$W" "${COMMON[@]}" --micro-batch $GB --grad-reduce-dtype bf16 --log-json "$D/ref-bf16.jsonl" \
        --dump-params "$D/ref-bf16.st" > "$D/ref-bf16.out" 2>&1; then
    t_check "one process with --grad-reduce-dtype bf16: the fp32 run's losses and parameters, bit for bit" \
        bash -c "$PY '$CMP' losses '$D/ref.jsonl' '$D/ref-bf16.jsonl' 0 && cmp '$D/ref.st' '$D/ref-bf16.st'"
else t_fail "one process with --grad-reduce-dtype bf16 runs" "$(tail -3 "$D/ref-bf16.out")"; fi

# the bf16 ops go through the backend table: on a backend whose memory is
# not host memory (the scrambled backend, BALLAST_TEST_BACKEND=scrambled:
# every byte XOR 0x5A, collectives staged) the run is the same bits
if BALLAST_TEST_BACKEND=scrambled run4 scr-bf16-r2-s2 2 bf16 && grep -q "scrambled backend" "$D/scr-bf16-r2-s2.out"; then
    t_check "(replicas 2, S 2), bf16 reduction on the scrambled backend: the same bits as on the CPU backend" \
        $PY "$CMP" params "$D/bf16-r2-s2.st" "$D/scr-bf16-r2-s2.st" 0
else t_fail "bf16 reduction on the scrambled backend runs" "$(tail -3 "$D/scr-bf16-r2-s2.out")"; fi

if "$W" "${COMMON[@]}" --micro-batch $GB --steps 1 --grad-reduce-dtype fp16 > "$D/bad.out" 2>&1; then
    t_fail "--grad-reduce-dtype fp16 refused" "it ran"
elif grep -q "grad-reduce-dtype" "$D/bad.out" && grep -q "bf16" "$D/bad.out"; then
    t_ok "--grad-reduce-dtype fp16 is refused, naming the flag and the choices"
else t_fail "--grad-reduce-dtype fp16 message" "$(tail -2 "$D/bad.out")"; fi
t_done
