#!/usr/bin/env bash
# train_multinode.sh: `ballast train` as a launcher per node. Two launchers
# (--nnodes 2 --node-rank 0|1 --nproc-per-node 2, one rendezvous at
# --master-addr/--master-port) run here as host processes on 127.0.0.1, so
# the "nodes" share /tmp and the shared-memory collectives; what is checked
# is the launchers' part:
#   - 2 nodes x 2 ranks at (replicas, S, T) = (1, 4, 1) and (2, 2, 1): the
#     losses of one process within 1e-5 relative (rounding of the sums in
#     another order, as fsdp_losses.sh explains);
#   - every process of node 1 killed mid-run (SIGKILL to its process group):
#     node 0's launcher names node 1 as lost (its own account of the time is
#     within --rdzv-timeout); node 1's launcher started again (as a
#     restarted pod is) joins attempt 1, both resume from the newest complete
#     checkpoint (--max-restarts 1), and every step after it logs the loss
#     of an uninterrupted run of the same layout, bit for bit (resume is
#     exact: fsdp_ckpt.sh);
#   - optimizer offload to a ballastd reached over TCP (--offload-remote, the
#     ballastd of "a third host"): the same losses within 1e-5;
#   - each node its own --ckpt-dir: every launcher fails at step 0 with the
#     message naming the directory and the fix (a shared / ReadWriteMany
#     volume), before any step;
#   - a launcher whose peer never comes names the missing node within
#     --rdzv-timeout; contradictory or bad launcher flags are refused;
#   - --resume auto with no checkpoint (a fresh start, said so) and with one
#     (the steps after it equal the uninterrupted run's); --resume PATH and
#     the switch form still work; a bad --resume value is named.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/fsdp.lib"
source "$(dirname "$0")/ballastd.lib"
fsdp_numpy_setup "$BIN" "multi-node launcher"
fsdp_tiny "$D" 5

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 -- "-$p" 2>/dev/null; done
    bd_kill_all
}
trap cleanup EXIT

RUN=(--model "$D/m.json" --data "$D/c.bin" --init-seed 7 --data-order shuffled --data-seed 9 --seq-len 32
     --grad-accum 2 --lr 3e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1)
PORT_BASE=$((20000 + RANDOM % 20000))

# two launchers (node 0 in the foreground); each its own session so a
# "host" can be killed whole
two_nodes() {  # name port node0-args -- node1-args   (both get "${RUN[@]}" before)
    local name=$1 port=$2 a=() b=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do a+=("$1"); shift; done
    shift
    b=("$@")
    local L=(--nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port")
    setsid timeout 150 "$B" train "${L[@]}" --node-rank 1 "${RUN[@]}" "${b[@]}" > "$D/$name.n1.out" 2>&1 &
    local p1=$!
    PIDS+=($p1)
    timeout 150 "$B" train "${L[@]}" --node-rank 0 "${RUN[@]}" "${a[@]}" > "$D/$name.n0.out" 2>&1
    local rc0=$?
    wait $p1
    local rc1=$?
    echo "$rc0 $rc1" > "$D/$name.rc"
    [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]
}

# ---- the losses of one process ----
"$W" "${RUN[@]}" --steps 10 --micro-batch 8 --log-json "$D/ref.jsonl" > "$D/ref.out" 2>&1 ||
    t_fail "reference run" "$(tail -3 "$D/ref.out")"
for lay in "1 4 1" "2 2 1"; do
    set -- $lay
    name="n2-r$1-s$2"
    if two_nodes "$name" $PORT_BASE --steps 10 --micro-batch 2 --hybrid-shard-degree "$2" --log-json "$D/$name.jsonl" \
        -- --steps 10 --micro-batch 2 --hybrid-shard-degree "$2"; then
        grep -q "layout: world 4 = $1 replicas x hybrid shard degree $2" "$D/$name.n0.out" &&
            t_ok "2 nodes x 2 ranks (replicas $1, S $2): layout reported" ||
            t_fail "layout (replicas $1, S $2)" "$(grep layout "$D/$name.n0.out")"
        t_check "2 nodes x 2 ranks (replicas $1, S $2): losses within 1e-5 of one process" \
            $PY "$CMP" losses "$D/ref.jsonl" "$D/$name.jsonl" 1e-5
    else
        t_fail "2 nodes x 2 ranks (replicas $1, S $2) run" "rc $(cat "$D/$name.rc"); $(tail -n 4 "$D/$name.n0.out" "$D/$name.n1.out")"
    fi
    PORT_BASE=$((PORT_BASE + 2))
done

# ---- node 1 lost mid-run; one restart resumes from the last checkpoint ----
LONG=(--steps 120 --micro-batch 2 --hybrid-shard-degree 2 --ckpt-every 20 --rdzv-timeout 10s)
if two_nodes full $PORT_BASE "${LONG[@]}" --ckpt-dir "$D/ck-full" --log-json "$D/full.jsonl" -- "${LONG[@]}" \
    --ckpt-dir "$D/ck-full"; then
    t_ok "uninterrupted 2 x 2 run of 120 steps"
else t_fail "uninterrupted 2 x 2 run" "$(tail -n 4 "$D/full.n0.out" "$D/full.n1.out")"; fi
PORT_BASE=$((PORT_BASE + 2))

L=(--nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port $PORT_BASE)
K=(--ckpt-dir "$D/ck-kill" --max-restarts 1)
setsid timeout 150 "$B" train "${L[@]}" --node-rank 1 "${RUN[@]}" "${LONG[@]}" "${K[@]}" > "$D/kill.n1.out" 2>&1 &
P1=$!
PIDS+=($P1)
timeout 150 "$B" train "${L[@]}" --node-rank 0 "${RUN[@]}" "${LONG[@]}" "${K[@]}" --log-json "$D/kill.jsonl" \
    > "$D/kill.n0.out" 2>&1 &
P0=$!
# kill node 1 once a checkpoint exists and training goes on
for _ in $(seq 1 600); do
    [ -d "$D/ck-kill/step-00000040" ] && break
    kill -0 $P0 2>/dev/null || break
    sleep 0.1
done
kill -9 -- "-$P1" 2>/dev/null
wait $P1 2>/dev/null
killed_at=$(jl_get "$D/kill.jsonl" step 2>/dev/null | tail -n 1)
for _ in $(seq 1 300); do
    grep -q "node 1 .*lost" "$D/kill.n0.out" && break
    kill -0 $P0 2>/dev/null || break
    sleep 0.1
done
if line=$(grep -m1 "node 1 .*lost" "$D/kill.n0.out"); then
    secs=$(sed -nE 's/.*heartbeat stopped ([0-9.]+) s ago.*/\1/p' <<< "$line")
    if [ -n "$secs" ] && awk -v s="$secs" 'BEGIN { exit !(s <= 10) }'; then
        t_ok "node 1 killed after step ${killed_at:-?}: node 0's launcher names it lost ($secs s without a heartbeat, --rdzv-timeout 10s)"
    else t_fail "lost node named within --rdzv-timeout" "$line"; fi
else t_fail "node 0's launcher names the lost node 1" "$(tail -n 5 "$D/kill.n0.out")"; fi
# node 1 comes back, as its pod would
setsid timeout 150 "$B" train "${L[@]}" --node-rank 1 "${RUN[@]}" "${LONG[@]}" "${K[@]}" > "$D/kill.n1b.out" 2>&1 &
P1=$!
PIDS+=($P1)
wait $P0
rc0=$?
wait $P1
rc1=$?
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q "restart 1 of 1" "$D/kill.n0.out" && grep -q "restart 1 of 1" "$D/kill.n1b.out"; then
    t_ok "--max-restarts 1: both launchers run attempt 1 to the end"
else t_fail "restart after the lost node" "rc $rc0 $rc1; $(tail -n 4 "$D/kill.n0.out" "$D/kill.n1b.out")"; fi
from=$(sed -nE 's/.*resumed from .*step-0*([0-9]+) .*/\1/p' "$D/kill.n0.out" | tail -n 1)
if [ -n "$from" ] && [ "$from" -ge 40 ]; then
    t_ok "attempt 1 resumed from the newest complete checkpoint (step $from)"
    # the log is appended to: attempt 1's records are its last 120 - from
    n=$((120 - from))
    after() { jl_get "$D/kill.jsonl" --from $((from + 1)) step loss | tail -n $n; }
    if [ "$(after | head -n 1 | cut -d' ' -f1)" = $((from + 1)) ] &&
        cmp -s <(after) <(jl_get "$D/full.jsonl" --from $((from + 1)) step loss); then
        t_ok "steps $((from + 1))..120 after the restart: the uninterrupted run's losses, bit for bit ($n steps)"
    else t_fail "losses after the restart equal the uninterrupted run's" \
        "$(diff <(after) <(jl_get "$D/full.jsonl" --from $((from + 1)) step loss) | head -5)"
    fi
else t_fail "attempt 1 resumed from a checkpoint" "$(grep -E "resum|restart" "$D/kill.n0.out" | head -5)"; fi
PORT_BASE=$((PORT_BASE + 2))

# ---- optimizer offload to a remote ballastd ----
if bd_start remote "$D" --pool-bytes 64M --spill-dir "$D/spill" --spill-bytes 64M --spill-file-bytes 16M --no-mlock \
    --listen 127.0.0.1:0; then
    RP=$BD_LISTEN_remote
    OFF=(--steps 10 --micro-batch 2 --optimizer-offload host --offload-remote "127.0.0.1:$RP" --offload-job mn-remote)
    if two_nodes remote $PORT_BASE "${OFF[@]}" --log-json "$D/remote.jsonl" -- "${OFF[@]}" &&
        grep -q "remote mode" "$D/remote.n0.out"; then
        t_check "2 nodes x 2 ranks, optimizer offload over --offload-remote: losses within 1e-5 of one process" \
            $PY "$CMP" losses "$D/ref.jsonl" "$D/remote.jsonl" 1e-5
    else t_fail "2 x 2 with --offload-remote runs" "$(tail -n 4 "$D/remote.n0.out" "$D/remote.n1.out")"; fi
else t_fail "remote ballastd starts" "$(tail -3 "$D/remote.log")"; fi
PORT_BASE=$((PORT_BASE + 2))

# ---- each node its own --ckpt-dir ----
two_nodes unshared $PORT_BASE --steps 10 --micro-batch 2 --ckpt-dir "$D/own0" -- --steps 10 --micro-batch 2 \
    --ckpt-dir "$D/own1"
read -r rc0 rc1 < "$D/unshared.rc"
if [ "$rc0" -ne 0 ] && [ "$rc1" -ne 0 ] &&
    grep -q "rank 2 (node 1, host .*): --ckpt-dir $D/own1 is not the directory rank 0 writes" "$D/unshared.n1.out" &&
    grep -q "ReadWriteMany volume" "$D/unshared.n1.out" && ! grep -q "^step " "$D/unshared.n0.out"; then
    t_ok "an unshared --ckpt-dir: both launchers fail at step 0, node 1's rank naming the directory and the fix"
else t_fail "unshared --ckpt-dir refused at start" "rc $rc0 $rc1; $(grep -h -- "--ckpt-dir" "$D/unshared.n1.out" | head -3)"; fi
PORT_BASE=$((PORT_BASE + 2))

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
