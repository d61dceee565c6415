#!/usr/bin/env bash
# train_multinode.sh: the parts of `ballast train` as a launcher per node that
# need no second host (as deployed, across namespace hosts:
# tests/multihost/launch_hosts.sh):
#   - a launcher whose peer never comes names the missing node within
#     --rdzv-timeout; contradictory or bad launcher flags are refused;
#   - --resume auto with no checkpoint (a fresh start, said so) and with one
#     (the steps after it equal the uninterrupted run's); --resume PATH and
#     the switch form still work; a bad --resume value is named.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/fsdp.lib"
fsdp_numpy_setup "$BIN" "multi-node launcher"
fsdp_tiny "$D" 5

RUN=(--model "$D/m.json" --data "$D/c.bin" --init-seed 7 --data-order shuffled --data-seed 9 --seq-len 32
     --grad-accum 2 --lr 3e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1)
PORT_BASE=$((20000 + RANDOM % 20000))

"$W" "${RUN[@]}" --steps 10 --micro-batch 8 --log-json "$D/ref.jsonl" > "$D/ref.out" 2>&1 ||
    t_fail "reference run" "$(tail -3 "$D/ref.out")"

# ---- a node that never comes; bad launcher flags ----
timeout 60 "$B" train --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $PORT_BASE \
    "${RUN[@]}" --steps 2 --micro-batch 8 --rdzv-timeout 3s > "$D/alone.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "not every node joined attempt 0 within --rdzv-timeout 3.0 s.*1" "$D/alone.out"; then
    t_ok "node 1 never starts: node 0's launcher gives up after --rdzv-timeout and names it"
else t_fail "a missing node is named" "rc $rc; $(tail -n 3 "$D/alone.out")"; fi
t_expect_fail "--nproc and --nproc-per-node must agree" "--nproc 2 and --nproc-per-node 3 disagree" \
    "$B" train --nproc 2 --nproc-per-node 3 "${RUN[@]}"
t_expect_fail "--nproc with --nnodes 2 is refused, naming --nproc-per-node" "with --nnodes 2 give --nproc-per-node 2" \
    "$B" train --nproc 2 --nnodes 2 --node-rank 0 "${RUN[@]}"
t_expect_fail "--node-rank past --nnodes is refused" "must be less than" \
    "$B" train --nnodes 2 --node-rank 2 --nproc-per-node 1 "${RUN[@]}"
t_expect_fail "--rank is the launcher's to give" "the launcher gives every worker its rank" \
    "$B" train --nproc 2 --rank 1 "${RUN[@]}"
t_expect_fail "--master-port 65535 with --nnodes 2 leaves no port for the workers" "pick a port below 65535" \
    "$B" train --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-port 65535 "${RUN[@]}"
t_expect_fail "--max-restarts -1 is refused" "--max-restarts '-1': expected an integer from 0" \
    "$B" train --max-restarts -1 "${RUN[@]}"

# ---- --resume auto, PATH and the switch ----
"$W" "${RUN[@]}" --steps 10 --micro-batch 8 --resume auto --ckpt-dir "$D/auto" --ckpt-every 5 \
    --log-json "$D/auto1.jsonl" > "$D/auto1.out" 2>&1
if grep -q "resume auto: no complete checkpoint under $D/auto yet: starting at step 0" "$D/auto1.out" &&
    cmp -s <(jl_get "$D/auto1.jsonl" step loss) <(jl_get "$D/ref.jsonl" step loss); then
    t_ok "--resume auto without a checkpoint: a fresh start, said so, the reference's losses"
else t_fail "--resume auto without a checkpoint" "$(tail -n 3 "$D/auto1.out")"; fi
rm -rf "$D/auto/step-00000010"
"$W" "${RUN[@]}" --steps 10 --micro-batch 8 --resume auto --ckpt-dir "$D/auto" --log-json "$D/auto2.jsonl" \
    > "$D/auto2.out" 2>&1
if grep -q "resumed from $D/auto/step-00000005 (step 5)" "$D/auto2.out" && [ "$(jl_count "$D/auto2.jsonl")" -eq 5 ] &&
    cmp -s <(jl_get "$D/auto2.jsonl" step loss) <(jl_get "$D/ref.jsonl" --from 6 step loss); then
    t_ok "--resume auto with a checkpoint: steps 6..10 equal the uninterrupted run's"
else t_fail "--resume auto with a checkpoint" "$(grep -E "resum|error" "$D/auto2.out" | head -3)"; fi
"$W" "${RUN[@]}" --steps 10 --micro-batch 8 --resume "$D/auto/step-00000005" --log-json "$D/path.jsonl" \
    > "$D/path.out" 2>&1
if cmp -s <(jl_get "$D/path.jsonl" step loss) <(jl_get "$D/ref.jsonl" --from 6 step loss); then
    t_ok "--resume PATH (a step directory, no --ckpt-dir): steps 6..10 equal the uninterrupted run's"
else t_fail "--resume PATH" "$(tail -n 3 "$D/path.out")"; fi
rm -rf "$D/auto/step-00000010"
"$W" "${RUN[@]}" --steps 10 --micro-batch 8 --resume --ckpt-dir "$D/auto" --log-json "$D/sw.jsonl" > "$D/sw.out" 2>&1
if cmp -s <(jl_get "$D/sw.jsonl" step loss) <(jl_get "$D/ref.jsonl" --from 6 step loss); then
    t_ok "--resume as a switch (followed by another flag): the newest checkpoint, as before"
else t_fail "--resume switch" "$(tail -n 3 "$D/sw.out")"; fi
t_expect_fail "--resume at a directory that is not a checkpoint is named" "$D/nothing" \
    "$W" "${RUN[@]}" --steps 2 --micro-batch 8 --resume "$D/nothing"
t_done
