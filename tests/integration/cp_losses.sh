#!/usr/bin/env bash
# cp_losses.sh: context parallelism (--context-parallel-degree C, ring
# attention over 2C load-balanced causal chunks) changes no number.
#
# The same tiny model as fsdp_losses.sh (heads 8 / kv heads 4: grouped-query
# heads), seed and global batch (10 steps, 2 micro-steps of 8 rows of 32
# tokens) give the one-process losses within 1e-5 relative for
#   (replicas, S, T, C) = (1, 1, 1, 4)  checkpointing off, offload off
#                         (1, 1, 1, 4)  checkpointing on,  activation offload on
#                         (1, 2, 1, 2)  checkpointing on,  offload off
#                         (1, 1, 1, 2)  selective checkpointing, activation offload on
#                         (1, 1, 2, 2)  checkpointing off, activation offload on
#                         (2, 1, 1, 2)  checkpointing off, offload off
#                         (1, 1, 1, 2)  world 2
# and the parameters after 10 steps within 1e-4 (per tensor, relative norm).
# Tolerance: the ring computes each attention row as up to 2C partial
# softmaxes merged by their log-sum-exp, the reference as one; the weight
# gradients are GEMMs over C times fewer rows added across ranks. Both are
# fp32 rounding (about 1e-7 relative), carried by 10 AdamW steps; the
# reasons and figures of fsdp_losses.sh apply unchanged.
#
# Eval and resume at C = 2: the validation loss (--val-data, every 5
# steps) of the (1, 1, 1, 2) run equals one process's within 1e-5; its
# checkpoint of step 5 resumes at C = 2 with the uninterrupted run's
# losses, lr and grad norms to the bit, and in one process (C = 1: a
# checkpoint holds S x T shards, whatever C wrote it) within 1e-5 of it.
#
# Also: the activation bytes per rank (the layout record) fall as 1/C at
# the same rows per rank (plus the ring's own buffers, counted exactly); a sequence whose activations are over
# --max-activation-bytes (half the one-process figure) trains at C = 4 and
# is refused at C = 1 with a message naming the degree that fits; C that
# does not divide world / T, a seq-len not divisible by 2C and C > 1 in one
# process are refused with their reasons.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/ballastd.lib"
source "$(dirname "$0")/fsdp.lib"
fsdp_numpy_setup "$BIN" "context-parallel losses"
trap bd_kill_all EXIT

fsdp_tiny "$D" 5
bd_start cp "$D" --pool-bytes 64M --no-mlock ||
    { t_fail "ballastd starts" "$(tail -3 "$D/cp.log")"; t_done; exit 1; }
SOCK=$(bd_sock cp)
STEPS=10 GB=8 SEQ=32 ACC=2
RUN=(--model "$D/m.json" --data "$D/c.bin" --init-seed 7 --data-order shuffled --data-seed 9 --seq-len $SEQ
     --grad-accum $ACC --steps $STEPS --lr 3e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1
     --rdzv-timeout 60s)

# the activation bytes of a --log-json file's layout record
act() { jl_get "$1" --kind layout activation_bytes_per_rank 2>/dev/null; }

# the reference: one process reading the whole global batch
VAL=(--val-data "$D/c.bin" --eval-every 5 --eval-batches 2)
if "$W" "${RUN[@]}" "${VAL[@]}" --micro-batch $GB --log-json "$D/ref.jsonl" --dump-params "$D/ref.st" > "$D/ref.out" 2>&1; then
    t_ok "reference (1, 1, 1, 1), one process"
else t_fail "reference run" "$(tail -3 "$D/ref.out")"; t_done; exit 1; fi
A1=$(act "$D/ref.jsonl")
LIMIT=$((A1 / 2))

run() {  # name nproc R S T C ckpt(on|sel|off) offload(on|off) [flags...]
    local name=$1 np=$2 R=$3 S=$4 T=$5 C=$6 ck=$7 off=$8 flag=()
    shift 8
    [ "$ck" = on ] && flag+=(--activation-checkpointing)
    [ "$ck" = sel ] && flag+=(--activation-checkpointing selective)
    [ "$off" = on ] && flag+=(--activation-offload --offload-socket "$SOCK" --offload-job "$name")
    local what="(replicas $R, S $S, T $T, C $C), checkpointing $ck, activation offload $off"
    if ! timeout 120 "$B" train --nproc "$np" "${RUN[@]}" "${flag[@]}" "$@" --micro-batch $((GB / (R * S))) \
        --hybrid-shard-degree "$S" --tensor-parallel-degree "$T" --context-parallel-degree "$C" \
        --log-json "$D/$name.jsonl" --dump-params "$D/$name.st" > "$D/$name.out" 2>&1; then
        t_fail "$what runs" "$(tail -5 "$D/$name.out")"
        return 1
    fi
    if grep -q "layout: world $np = $R replicas x hybrid shard degree $S x tensor-parallel degree $T x context-parallel degree $C" "$D/$name.out"; then
        t_ok "$what: layout reported"
    else t_fail "$what: layout reported" "$(grep layout "$D/$name.out")"; fi
    t_check "$what: losses within 1e-5 of one process" $PY "$CMP" losses "$D/ref.jsonl" "$D/$name.jsonl" 1e-5
    t_check "$what: parameters after $STEPS steps within 1e-4" $PY "$CMP" params "$D/ref.st" "$D/$name.st" 1e-4
}

run c4 4 1 1 1 4 off off --max-activation-bytes $LIMIT
run c4-ck-off 4 1 1 1 4 on on
run c2-s2 4 1 2 1 2 on off
run c2-sel 2 1 1 1 2 sel on
run c2-t2 4 1 1 2 2 off on
run c2-r2 4 2 1 1 2 off off
run c2 2 1 1 1 2 off off "${VAL[@]}" --ckpt-dir "$D/ck2" --ckpt-every 5

# eval at C 2: the validation loss at steps 5 and 10, against one process's
if /usr/bin/python3 - "$D/ref.jsonl" "$D/c2.jsonl" <<'PY'
import sys
import jsonlog
ref, run = (jsonlog.by_step(p, "val_loss") for p in sys.argv[1:3])
if sorted(ref) != [5, 10] or sorted(run) != [5, 10]:
    sys.exit("val_loss at steps %s (one process) and %s (C 2), not 5 and 10" % (sorted(ref), sorted(run)))
worst = max(abs(run[s] - ref[s]) / abs(ref[s]) for s in ref)
print("# val_loss %s vs %s: worst relative difference %.2g" % (run, ref, worst))
sys.exit(0 if worst <= 1e-5 else 1)
PY
then t_ok "C 2: the validation loss at steps 5 and 10 equals one process's within 1e-5"
else t_fail "C 2: validation loss equals one process's" "see above"; fi

# resume at C 2 from step 5: the uninterrupted run's records to the bit
fields() { jl_get "$1" step loss lr grad_norm; }
rm -rf "$D/ck2/step-00000010"
jl_raw "$D/c2.jsonl" --upto 5 > "$D/c2r.jsonl"
if timeout 120 "$B" train --nproc 2 "${RUN[@]}" "${VAL[@]}" --micro-batch $GB --context-parallel-degree 2 \
        --ckpt-dir "$D/ck2" --resume --log-json "$D/c2r.jsonl" > "$D/c2r.out" 2>&1 &&
   grep -q "resumed from .*step-00000005 (step 5)" "$D/c2r.out" && [ "$(fields "$D/c2.jsonl" | wc -l)" -eq 10 ] &&
   cmp -s <(fields "$D/c2.jsonl") <(fields "$D/c2r.jsonl"); then
    t_ok "C 2: a checkpoint of step 5 resumes at C 2 with the uninterrupted run's losses, lr, grad norms to the bit"
else t_fail "C 2: resume at C 2" "$(tail -3 "$D/c2r.out"; diff <(fields "$D/c2.jsonl") <(fields "$D/c2r.jsonl") | head -4)"; fi
# ... and in one process (C 1): steps 6-10 within 1e-5 of the C 2 run's
if "$W" "${RUN[@]}" --micro-batch $GB --resume "$D/ck2/step-00000005" --ckpt-dir "$D/ck1" \
        --log-json "$D/c1r.jsonl" > "$D/c1r.out" 2>&1 && grep -q "resumed from .*step-00000005 (step 5)" "$D/c1r.out"; then
    jl_raw "$D/c2.jsonl" --from 6 > "$D/c2tail.jsonl"
    t_check "C 2: its checkpoint of step 5 resumes in one process (C 1), losses within 1e-5 of the C 2 run" \
        $PY "$CMP" losses "$D/c2tail.jsonl" "$D/c1r.jsonl" 1e-5
else t_fail "C 2: its checkpoint resumes at C 1" "$(grep -iE 'error|refus' "$D/c1r.out" | head -3; tail -2 "$D/c1r.out")"; fi

# 1/C at the same rows per rank (8): every activation buffer holds a rank's
# tokens (the attention state is a log-sum-exp per token and head), and the
# ring adds its own: two K|V and two dK|dV blocks (8 x Hkv*Dh values per
# token) and one chunk's partial output and log-sum-exp. So, exactly,
# C * act(C) = act(1) + C * ring(C), with the sizes from the model's config
# (width 64, 8 heads of 8, kv heads 4; fp32 on the CPU).
A2=$(act "$D/c2.jsonl") A4=$(act "$D/c4.jsonl")
ring() {  # C -> bytes of the ring's buffers on a rank
    local C=$1 T=$((SEQ / $1)) H=8 KVD=32 DH=8
    echo $(( 4 * (8 * GB * T * KVD + T / 2 * H * DH) + 4 * (T / 2 * H) ))
}
if [ -n "$A1" ] && [ -n "$A2" ] && [ -n "$A4" ] &&
   [ $((2 * A2)) -eq $((A1 + 2 * $(ring 2))) ] && [ $((4 * A4)) -eq $((A1 + 4 * $(ring 4))) ]; then
    t_ok "activation bytes per rank at C 1, 2, 4: $A1, $A2, $A4 (1, 1/2, 1/4, plus the ring's $(ring 2), $(ring 4))"
else t_fail "activation bytes per rank fall as 1/C" "C 1: $A1, C 2: $A2, C 4: $A4; ring buffers $(ring 2), $(ring 4)"; fi
if grep -qE "^activations: .*\\($A4 bytes\\) per rank for 8 rows x 8 tokens \\(two chunks" "$D/c4.out"; then
    t_ok "the start banner says the same ($A4 bytes at C 4)"
else t_fail "activations in the banner" "$(grep '^activations' "$D/c4.out")"; fi

# longer than one rank's limit: C = 4 trained above under the same limit
t_expect_fail "over --max-activation-bytes at C = 1: refused, naming the degree that fits" \
    "over --max-activation-bytes.*--context-parallel-degree 2 or more" \
    "$W" "${RUN[@]}" --micro-batch $GB --max-activation-bytes $LIMIT
t_expect_fail "C that does not divide world / T is named" "not divisible by --context-parallel-degree 3" \
    timeout 60 "$B" train --nproc 4 "${RUN[@]}" --micro-batch 2 --seq-len 36 --context-parallel-degree 3
t_expect_fail "a seq-len not divisible by 2C is named" "--seq-len 30 is not divisible by 8" \
    "$W" "${RUN[@]}" --micro-batch 2 --seq-len 30 --context-parallel-degree 4 --world-size 4 --rank 0
t_expect_fail "C > 1 in one process is refused" "--context-parallel-degree 2 needs 2 or more processes" \
    "$W" "${RUN[@]}" --micro-batch 2 --context-parallel-degree 2
t_done
