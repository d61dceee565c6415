#!/usr/bin/env bash
# fsdp_losses.sh: the central test of hybrid sharding. The same model, seed
# and global batch (10 steps, tiny model, AdamW with warmup, cosine and
# active clipping, 2 micro-steps per step) give the same losses for one
# process (micro-batch 8) and for `ballast train --nproc 4` (micro-batch 2
# per rank) at (replicas, S) = (4, 1), (2, 2), (1, 4), with and without
# activation checkpointing.
#
# Tolerances, and why they are not zero: one process computes each weight
# gradient as one GEMM over 8 rows, the sharded runs as 4 GEMMs of 2 rows
# whose results are added (reduce-scatter, then all-reduce, in rank order);
# the loss and the gradient norm are sums in a different order too. So the
# runs differ only by fp32 rounding (about 1e-7 relative per gradient
# element), which 10 AdamW steps carry into the weights. Losses: relative
# difference <= 1e-5 per step (the issue's acceptance figure; about
# 4e-9 here). Parameters after 10 steps: ||run - ref|| / ||ref|| <= 1e-4 per
# tensor: AdamW divides each gradient element by its own RMS, so an element
# whose gradient is near zero can turn a rounding-level change into an
# lr-sized one (seen: 1e-6 here; 1.3e-5 with another corpus and order,
# from one embedding element that moved 3.7e-5).
# The sharded runs themselves are deterministic: the same layout twice gives
# the same bits.
#
# Also: each rank reads disjoint rows that together are the reference's
# batch; per-rank state falls as 1/S; S = 0 resolves to world / T; T > 1
# and an S that does not divide are refused with a message; a rank that
# never starts is named; a worker killed with SIGKILL makes the launcher
# stop the others and name it.
source "$(dirname "$0")/../lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
B=$BIN/ballast
W=$BIN/ballast-worker
PY=/usr/bin/python3
CMP="$ROOT/tests/integration/fsdp_cmp.py"
D=$(t_tmpdir)
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }
if ! $PY -c 'import numpy' 2>/dev/null; then
    t_skip "fsdp losses" "no numpy for /usr/bin/python3 (apt-get install python3-numpy)"; t_done; exit 0
fi

"$B" data synth --out "$D/c.bin" --tokens 60000 --vocab 256 --seed 5 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
STEPS=10 MB=2 SEQ=32 ACC=2 DP=4
COMMON=(--model tiny --init-seed 7 --data "$D/c.bin" --data-order shuffled --data-seed 9 --seq-len $SEQ
        --grad-accum $ACC --steps $STEPS --lr 3e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1
        --rdzv-timeout 60s)

# the reference: one process reading the whole global batch
for ck in off on; do
    flag=(); [ $ck = on ] && flag=(--activation-checkpointing)
    mkdir -p "$D/ref-$ck"
    if "$W" "${COMMON[@]}" "${flag[@]}" --micro-batch $((DP * MB)) --log-json "$D/ref-$ck.jsonl" \
        --dump-params "$D/ref-$ck.st" --dump-batches "$D/ref-$ck" > "$D/ref-$ck.out" 2>&1; then
        t_ok "reference run, one process, activation checkpointing $ck"
    else t_fail "reference run ($ck)" "$(tail -3 "$D/ref-$ck.out")"; fi
done

run4() {  # name S ckpt -> D/name.{jsonl,st,out}, D/name/ token dumps
    local name=$1 S=$2 ck=$3 flag=()
    [ "$ck" = on ] && flag=(--activation-checkpointing)
    mkdir -p "$D/$name"
    timeout 120 "$B" train --nproc $DP "${COMMON[@]}" "${flag[@]}" --micro-batch $MB --hybrid-shard-degree "$S" \
        --log-json "$D/$name.jsonl" --dump-params "$D/$name.st" --dump-batches "$D/$name" > "$D/$name.out" 2>&1
}

for ck in off on; do
    for S in 1 2 4; do
        R=$((DP / S)) name="w4-s$S-$ck"
        if ! run4 "$name" $S $ck; then
            t_fail "world 4 (replicas $R, S $S), checkpointing $ck runs" "$(tail -5 "$D/$name.out")"
            continue
        fi
        if grep -q "layout: world 4 = $R replicas x hybrid shard degree $S x tensor-parallel degree 1" "$D/$name.out"; then
            t_ok "world 4 (replicas $R, S $S), checkpointing $ck: layout reported"
        else t_fail "layout reported ($name)" "$(grep layout "$D/$name.out")"; fi
        t_check "world 4 (replicas $R, S $S), checkpointing $ck: losses within 1e-5 of one process" \
            $PY "$CMP" losses "$D/ref-$ck.jsonl" "$D/$name.jsonl" 1e-5
        t_check "world 4 (replicas $R, S $S), checkpointing $ck: parameters after $STEPS steps within 1e-4" \
            $PY "$CMP" params "$D/ref-$ck.st" "$D/$name.st" 1e-4
        t_check "world 4 (replicas $R, S $S), checkpointing $ck: ranks read disjoint rows, together the global batch" \
            $PY "$CMP" batches "$D/ref-$ck" "$D/$name" $DP $MB $SEQ $ACC $STEPS
    done
done

# per-rank state falls as 1/S: bytes(S) = 16 x sum over units of ceil(numel / S),
# so S x bytes(S) - bytes(1) is only the padding, under 16 x S floats per unit
mem() { sed -nE 's/^memory: .*\(([0-9]+) bytes\).*/\1/p' "$D/w4-s$1-off.out"; }
m1=$(mem 1) m2=$(mem 2) m4=$(mem 4)
units=3   # the tiny model: 2 blocks + the embedding/head unit
if [ -n "$m1" ] && [ -n "$m2" ] && [ -n "$m4" ] &&
   awk -v a="$m1" -v b="$m2" -v c="$m4" -v u=$units 'BEGIN { exit !(2*b >= a && 2*b - a < 16*2*u && 4*c >= a && 4*c - a < 16*4*u) }'; then
    t_ok "per-rank weights + gradient + moments fall as 1/S ($m1, $m2, $m4 bytes at S 1, 2, 4)"
else t_fail "per-rank state falls as 1/S" "S 1: $m1, S 2: $m2, S 4: $m4 bytes"; fi

# activation checkpointing changes nothing within one layout
if [ -f "$D/w4-s2-off.jsonl" ] && cmp -s <(cut -d, -f1-4 "$D/w4-s2-off.jsonl") <(cut -d, -f1-4 "$D/w4-s2-on.jsonl"); then
    t_ok "S 2: losses with and without activation checkpointing are bit-identical"
else t_fail "S 2: checkpointing bit-identical" "$(paste "$D/w4-s2-off.jsonl" "$D/w4-s2-on.jsonl" | head -3)"; fi
# the same layout twice: the same bits
if run4 w4-s2-again 2 off && cmp -s <(cut -d, -f1-4 "$D/w4-s2-off.jsonl") <(cut -d, -f1-4 "$D/w4-s2-again.jsonl") &&
   cmp -s "$D/w4-s2-off.st" "$D/w4-s2-again.st"; then
    t_ok "S 2 twice: the same losses and parameters, bit for bit"
else t_fail "S 2 twice: deterministic" "$(tail -3 "$D/w4-s2-again.out")"; fi
# S = 0: largest that fits; without a memory figure (CPU) world / T
if run4 w4-s0 0 off && grep -q "1 replicas x hybrid shard degree 4" "$D/w4-s0.out"; then
    t_ok "--hybrid-shard-degree 0 on the CPU is world / T = 4"
else t_fail "--hybrid-shard-degree 0" "$(grep -E 'layout|error' "$D/w4-s0.out" | head -3)"; fi

t_expect_fail "--tensor-parallel-degree 2 is refused as not implemented" "tensor parallelism is not implemented yet" \
    "$B" train --nproc 2 "${COMMON[@]}" --micro-batch $MB --tensor-parallel-degree 2
t_expect_fail "S that does not divide the world is named" "not divisible by --hybrid-shard-degree 3" \
    timeout 60 "$B" train --nproc 4 "${COMMON[@]}" --micro-batch $MB --hybrid-shard-degree 3

# a rank that never starts is named within --rdzv-timeout
t_expect_fail "a missing rank is named within --rdzv-timeout" "rank 1 did not arrive within 2.0 s" \
    timeout 60 "$W" "${COMMON[@]}" --micro-batch $MB --rank 0 --world-size 2 --master-port $((30000 + RANDOM % 20000)) --rdzv-timeout 2s

# kill -9 of one worker: the launcher stops the rest and names the rank
"$B" train --nproc 3 "${COMMON[@]}" --steps 1000000 --micro-batch 1 > "$D/kill.out" 2>&1 &
LP=$!
for _ in $(seq 100); do grep -q '^step' "$D/kill.out" 2>/dev/null && break; sleep 0.1; done
victim=""
for p in $(pgrep -P $LP); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'RANK=1'; then victim=$p; fi
done
if [ -n "$victim" ]; then
    kill -9 "$victim"
    rc=0; timeout 30 tail --pid=$LP -f /dev/null || true; wait $LP || rc=$?
    left=$(pgrep -P $LP 2>/dev/null | wc -l)
    if [ $rc -ne 0 ] && [ "$left" -eq 0 ] && grep -q "rank 1 (pid $victim) was killed by signal 9" "$D/kill.out"; then
        t_ok "kill -9 of rank 1: launcher exits $rc naming it, no worker left"
    else t_fail "kill -9 of rank 1" "rc $rc, $left left: $(tail -3 "$D/kill.out")"; fi
else
    kill $LP 2>/dev/null; wait $LP 2>/dev/null
    t_fail "kill -9 of rank 1" "rank 1 not found among the launcher's children: $(tail -3 "$D/kill.out")"
fi
t_done
