#!/usr/bin/env bash
# launch_hosts.sh: `ballast train` as a launcher per node, as deployed: each
# node a namespace host (hosts.lib) with its own network, /tmp, /dev/shm,
# /run and PID namespace, sharing only the directory that holds the model,
# the corpus, the logs and the checkpoints. One launcher per host,
# --nnodes 2 --node-rank R --nproc-per-node 2 --master-addr <host 0's
# address> --comm auto (shm inside a host, Gloo between):
#   - (replicas 2, S 2, T 1): the losses of one process within 1e-5
#     relative (sums in another order, as fsdp_losses.sh explains);
#   - context parallelism across hosts: (replicas 1, S 1, T 2, C 2), so
#     each context-parallel group pairs rank r of host 0 with rank r of
#     host 1 (ring attention's shifts over Gloo) while each TP group stays
#     inside a host (shm): the losses of one process within 1e-5 relative
#     (cp_losses.sh gives the reasons for the tolerance);
#   - every process of host 1 killed mid-run (mh_kill_host): host 0's
#     launcher names node 1 lost within --rdzv-timeout; host 1's launcher
#     started again (as Kubernetes restarts a pod) joins attempt 1
#     (--max-restarts 1), both resume from the newest complete checkpoint
#     and every later step logs the loss of an uninterrupted run, bit for
#     bit (resume is exact: fsdp_ckpt.sh);
#   - optimizer offload to a ballastd on a third host in remote mode
#     (--offload-remote host2:port): the same losses within 1e-5;
#   - each host its own --ckpt-dir (the same path on both, in each host's
#     private /tmp): both launchers fail at step 0, node 1's rank naming the
#     directory and the fix.
# Flag validation and the --resume forms: tests/integration/train_multinode.sh.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../integration/fsdp.lib"
source "$(dirname "$0")/hosts.lib"
fsdp_numpy_setup "$BIN" "the launcher across namespace hosts"
if ! mh_up 3 "$D"; then t_skip "the launcher across namespace hosts" "$MH_WHY"; t_done; exit 0; fi
fsdp_tiny "$D" 5

RUN=(--model "$D/m.json" --data "$D/c.bin" --init-seed 7 --data-order shuffled --data-seed 9 --seq-len 32
     --grad-accum 2 --lr 3e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1 --comm auto)
PORT=$((20000 + RANDOM % 20000))
M=$(mh_ip 0)

# launch NAME NODE node-args...: the launcher of node NODE on host NODE,
# in the background (output $MH_LOG/NAME.out); every launcher gets 150 s
launch() {
    local name=$1 node=$2
    shift 2
    mh_bg "$node" "$name" timeout 150 "$B" train --nnodes 2 --node-rank "$node" --nproc-per-node 2 \
        --master-addr "$M" --master-port "$PORT" "${RUN[@]}" "$@"
}
# two NAME ARGS...: both launchers with the same ARGS; node 0 logs
# D/NAME.jsonl; 0 when both exit 0, their statuses in D/NAME.rc
two() {
    local name=$1 rc0 rc1
    shift
    PORT=$((PORT + 2))
    launch "$name.n1" 1 "$@"
    launch "$name.n0" 0 "$@" --log-json "$D/$name.jsonl"
    mh_wait "$name.n0" 160; rc0=$?
    mh_wait "$name.n1" 160; rc1=$?
    echo "$rc0 $rc1" > "$D/$name.rc"
    [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]
}
tails() { local f; for f in "$@"; do echo "[$f] $(tail -n 3 "$MH_LOG/$f.out" | tr '\n' ' ')"; done; }

"$W" "${RUN[@]}" --steps 10 --micro-batch 8 --log-json "$D/ref.jsonl" > "$D/ref.out" 2>&1 ||
    t_fail "reference run" "$(tail -3 "$D/ref.out")"

# ---- 2 hosts x 2 ranks, the losses of one process ----
if two n2 --steps 10 --micro-batch 2 --hybrid-shard-degree 2; then
    if grep -q "layout: world 4 = 2 replicas x hybrid shard degree 2" "$MH_LOG/n2.n0.out" &&
        grep -q "replica.0 group (2 ranks): gloo" "$MH_LOG/n2.n0.out" &&
        grep -q "shard.0 group (2 ranks): shm" "$MH_LOG/n2.n0.out"; then
        t_ok "2 hosts x 2 ranks by launcher: layout reported, shm inside host 0, gloo across hosts"
    else t_fail "layout and backends" "$(grep -E "layout| group \(" "$MH_LOG/n2.n0.out" | head -4)"; fi
    t_check "2 hosts x 2 ranks by launcher (replicas 2, S 2): losses within 1e-5 of one process" \
        $PY "$CMP" losses "$D/ref.jsonl" "$D/n2.jsonl" 1e-5
else t_fail "2 hosts x 2 ranks by launcher runs" "rc $(cat "$D/n2.rc"); $(tails n2.n0 n2.n1)"; fi

# ---- context parallel across hosts: each CP group spans both hosts (Gloo) ----
if two cp --steps 10 --micro-batch 8 --tensor-parallel-degree 2 --context-parallel-degree 2; then
    if grep -q "layout: world 4 = 1 replicas x hybrid shard degree 1 x tensor-parallel degree 2 x context-parallel degree 2" \
            "$MH_LOG/cp.n0.out" && grep -q "cp.0 group (2 ranks): gloo" "$MH_LOG/cp.n0.out" &&
        grep -q "tp.0 group (2 ranks): shm" "$MH_LOG/cp.n0.out"; then
        t_ok "context parallel C 2 across hosts: each CP group spans the hosts (gloo), TP inside a host (shm)"
    else t_fail "context parallel across hosts: layout and backends" "$(grep -E "layout| group \(" "$MH_LOG/cp.n0.out" | head -5)"; fi
    t_check "context parallel C 2 across hosts (T 2, C 2): losses within 1e-5 of one process" \
        $PY "$CMP" losses "$D/ref.jsonl" "$D/cp.jsonl" 1e-5
else t_fail "context parallel C 2 across hosts runs" "rc $(cat "$D/cp.rc"); $(tails cp.n0 cp.n1)"; fi

# ---- host 1 lost mid-run; one restart resumes from the last checkpoint ----
LONG=(--steps 120 --micro-batch 2 --hybrid-shard-degree 2 --ckpt-every 20 --rdzv-timeout 10s)
if two full "${LONG[@]}" --ckpt-dir "$D/ck-full"; then t_ok "uninterrupted 2 x 2 run of 120 steps"
else t_fail "uninterrupted 2 x 2 run" "rc $(cat "$D/full.rc"); $(tails full.n0 full.n1)"; fi

PORT=$((PORT + 2))
K=("${LONG[@]}" --ckpt-dir "$D/ck-kill" --max-restarts 1)
launch kill.n1 1 "${K[@]}"
launch kill.n0 0 "${K[@]}" --log-json "$D/kill.jsonl"
for _ in $(seq 1 900); do
    [ -d "$D/ck-kill/step-00000040" ] && break
    kill -0 "${MH_PID[kill.n0]}" 2>/dev/null || break
    sleep 0.1
done
mh_kill_host 1
mh_wait kill.n1 30
killed_at=$(jl_get "$D/kill.jsonl" step 2>/dev/null | tail -n 1)
for _ in $(seq 1 300); do
    grep -q "node 1 .*lost" "$MH_LOG/kill.n0.out" && break
    sleep 0.1
done
if line=$(grep -m1 "node 1 .*lost" "$MH_LOG/kill.n0.out"); then
    secs=$(sed -nE 's/.*heartbeat stopped ([0-9.]+) s ago.*/\1/p' <<< "$line")
    if [ -n "$secs" ] && awk -v s="$secs" 'BEGIN { exit !(s <= 10) }'; then
        t_ok "host 1 killed after step ${killed_at:-?}: host 0's launcher names node 1 lost ($secs s without a heartbeat, --rdzv-timeout 10s)"
    else t_fail "lost node named within --rdzv-timeout" "$line"; fi
else t_fail "host 0's launcher names the lost node 1" "$(tail -n 5 "$MH_LOG/kill.n0.out")"; fi
launch kill.n1b 1 "${K[@]}"
mh_wait kill.n0 160; rc0=$?
mh_wait kill.n1b 160; rc1=$?
if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q "restart 1 of 1" "$MH_LOG/kill.n0.out" &&
    grep -q "restart 1 of 1" "$MH_LOG/kill.n1b.out"; then
    t_ok "--max-restarts 1: both launchers run attempt 1 to the end"
else t_fail "restart after the lost host" "rc $rc0 $rc1; $(tails kill.n0 kill.n1b)"; fi
from=$(sed -nE 's/.*resumed from .*step-0*([0-9]+) .*/\1/p' "$MH_LOG/kill.n0.out" | tail -n 1)
if [ -n "$from" ] && [ "$from" -ge 40 ]; then
    t_ok "attempt 1 resumed from the newest complete checkpoint (step $from)"
    n=$((120 - from))
    after() { jl_get "$D/kill.jsonl" --from $((from + 1)) step loss | tail -n $n; }
    if [ "$(after | head -n 1 | cut -d' ' -f1)" = $((from + 1)) ] &&
        cmp -s <(after) <(jl_get "$D/full.jsonl" --from $((from + 1)) step loss); then
        t_ok "steps $((from + 1))..120 after the restart: the uninterrupted run's losses, bit for bit ($n steps)"
    else t_fail "losses after the restart equal the uninterrupted run's" \
        "$(diff <(after) <(jl_get "$D/full.jsonl" --from $((from + 1)) step loss) | head -5)"
    fi
else t_fail "attempt 1 resumed from a checkpoint" "$(grep -E "resum|restart" "$MH_LOG/kill.n0.out" | head -5)"; fi

# ---- optimizer offload to a ballastd on host 2, remote mode ----
mh_bg 2 bd "$BIN/ballastd" --socket /run/bd.sock --port-file "$D/bd.ports" --pool-bytes 64M --spill-dir /tmp/spill \
    --spill-bytes 64M --spill-file-bytes 16M --no-mlock --listen 0.0.0.0:0
for _ in $(seq 1 200); do [ -s "$D/bd.ports" ] && break; sleep 0.05; done
if read -r RP _ < "$D/bd.ports" 2>/dev/null && [ -n "$RP" ]; then
    if two remote --steps 10 --micro-batch 2 --optimizer-offload host --offload-remote "$(mh_ip 2):$RP" \
        --offload-job mn-remote && grep -q "remote mode" "$MH_LOG/remote.n0.out"; then
        t_check "2 hosts x 2 ranks, optimizer offload to host 2's ballastd (--offload-remote): losses within 1e-5 of one process" \
            $PY "$CMP" losses "$D/ref.jsonl" "$D/remote.jsonl" 1e-5
    else t_fail "2 x 2 with --offload-remote runs" "$(tails remote.n0 remote.n1)"; fi
else t_fail "ballastd on host 2 starts" "$(tail -n 3 "$MH_LOG/bd.out")"; fi

# ---- each host its own --ckpt-dir: the same path, in each host's own /tmp ----
two unshared --steps 10 --micro-batch 2 --ckpt-dir /tmp/ck
read -r rc0 rc1 < "$D/unshared.rc"
if [ "$rc0" -ne 0 ] && [ "$rc1" -ne 0 ] &&
    grep -q "rank 2 (node 1, host mh1.*): --ckpt-dir /tmp/ck is not the directory rank 0 writes" "$MH_LOG/unshared.n1.out" &&
    grep -q "ReadWriteMany volume" "$MH_LOG/unshared.n1.out" && ! grep -q "^step " "$MH_LOG/unshared.n0.out"; then
    t_ok "each host its own --ckpt-dir: both launchers fail at step 0, node 1's rank naming the directory and the fix"
else t_fail "unshared --ckpt-dir refused at start" "rc $rc0 $rc1; $(grep -h -- "--ckpt-dir" "$MH_LOG/unshared.n1.out" | head -3)"; fi
t_done
