#!/usr/bin/env bash
# train_run_errors.sh: the errors a user meets in a normal run, each message
# checked for its cause and its fix (flag or command), and a non-zero exit
# (t_expect_fail fails on a crash):
#   - missing data (one process and two ranks), a path that matches nothing;
#   - ballastd unreachable (the client library's message);
#   - out of pool memory: ballastd's RESOURCE_EXHAUSTED through the client,
#     for a full pool and for a session quota, and a blob above the pool;
#   - rank timeout: rank 1 never starts; rank 0 names it within --rdzv-timeout;
#   - NaN loss in a 2-rank run: stops at that step naming it; with
#     --skip-nonfinite the step is skipped and logged as skipped.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
W=$BIN/ballast-worker
B=$BIN/ballast
BD=$BIN/ballastd
[ -x "$W" ] && [ -x "$B" ] || { t_fail "ballast and ballast-worker built" "missing under $BIN"; t_done; exit 1; }
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
D=$(t_tmpdir)
"$B" data synth --out "$D/c.bin" --tokens 20000 --vocab 256 --seed 3 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
RUN=(--model tiny --micro-batch 2 --seq-len 16 --threads 1 --rdzv-timeout 30s)

# ---- missing data ----
t_expect_fail "no --data: names the flag and how to make a corpus" \
    "--data is required.*ballast data synth" "$W" "${RUN[@]}" --steps 1
t_expect_fail "no --data in a 2-rank run: the rank's message" \
    "(rank [01] pid [0-9]+\\] error|error on ranks 0-1): --data is required.*ballast data synth" \
    timeout 60 "$B" train --nproc 2 "${RUN[@]}" --steps 1
t_expect_fail "no --data in a 2-rank run: the launcher names the failed rank" \
    "ballast train: rank [01] \\(pid [0-9]+\\) failed with exit status 1" \
    timeout 60 "$B" train --nproc 2 "${RUN[@]}" --steps 1
t_expect_fail "a --data file that does not exist: the path, the cause and the fix" \
    "$D/nothere.bin: cannot open token shard: No such file or directory; check the path given as --data" \
    timeout 60 "$B" train --nproc 2 "${RUN[@]}" --data "$D/nothere.bin" --steps 1
t_expect_fail "a --data glob that matches nothing" "shard_\\*.bin: no file matches this glob; check the path and quote" \
    "$W" "${RUN[@]}" --data "$D/shard_*.bin" --steps 1

# ---- ballastd unreachable ----
if "$W" --help 2>&1 | grep -q -- "--offload-socket"; then
    t_expect_fail "worker with --offload-socket at a dead socket: is ballastd running, how to start it" \
        "ballastd at unix:$D/dead.sock.*is ballastd running\\? start it with .ballastd --socket PATH." \
        timeout 60 "$W" "${RUN[@]}" --data "$D/c.bin" --steps 1 --activation-offload --offload-socket "unix:$D/dead.sock"
else
    t_skip "worker --offload-socket at a dead socket" "this build's worker has no --offload-socket flag yet"
fi
echo "some bytes" > "$D/small"
t_expect_fail "ballast store at a dead socket: the address, the cause and how to start ballastd" \
    "ballastd at unix:$D/dead.sock: OpenSession failed: .*UNAVAILABLE.*is ballastd running\\? start it with .ballastd --socket PATH." \
    "$B" store put --socket "$D/dead.sock" --job j --file "$D/small"

# ---- out of pool memory ----
if [ -x "$BD" ]; then
    head -c $((3 << 20)) /dev/urandom > "$D/blob3m"
    head -c $((5 << 20)) /dev/urandom > "$D/blob5m"
    "$BD" --socket "$D/d.sock" --pool-bytes 4M --evict-wait 200ms --session-quota 0 > "$D/d.log" 2>&1 &
    DPID=$!
    "$BD" --socket "$D/q.sock" --pool-bytes 4M --session-quota 1M > "$D/q.log" 2>&1 &
    QPID=$!
    for _ in $(seq 1 100); do [ -S "$D/d.sock" ] && [ -S "$D/q.sock" ] && break; sleep 0.05; done
    if "$B" store put --socket "$D/d.sock" --job j --index 1 --file "$D/blob3m" > "$D/p1.out" 2>&1; then
        t_ok "a 3 MiB blob fits the 4 MiB pool"
    else
        t_fail "a 3 MiB blob fits the 4 MiB pool" "$(cat "$D/p1.out")"
    fi
    t_expect_fail "the next one does not: RESOURCE_EXHAUSTED, pool full, and the fixes (--pool-bytes, --spill-dir)" \
        "RESOURCE_EXHAUSTED: pool full.*out of pool memory.*free blobs.*--pool-bytes.*--spill-dir" \
        "$B" store put --socket "$D/d.sock" --job j --index 2 --file "$D/blob3m"
    t_expect_fail "a blob larger than the pool: its length, the limit and the fix" \
        "blob length 5242880 must be in \\[1, 4194304\\] bytes.*--pool-bytes" \
        "$B" store put --socket "$D/d.sock" --job j --index 3 --file "$D/blob5m"
    t_expect_fail "over the session quota: RESOURCE_EXHAUSTED naming the quota and the fix" \
        "RESOURCE_EXHAUSTED: session quota exceeded.*--session-quota" \
        "$B" store put --socket "$D/q.sock" --job j --index 1 --file "$D/blob3m"
    kill -TERM $DPID $QPID 2>/dev/null
    wait $DPID $QPID 2>/dev/null
else
    t_skip "out of pool memory" "no ballastd in this build"
fi

# ---- rank timeout ----
MP=$((30000 + RANDOM % 20000))
t_expect_fail "rank 1 never starts: rank 0 names rank 1 within --rdzv-timeout and what to check" \
    "rank 1 did not arrive within 2.0 s.*check that it is running" \
    timeout 60 "$W" "${RUN[@]}" --data "$D/c.bin" --steps 1 --rank 0 --world-size 2 --master-port $MP --rdzv-timeout 2s

# ---- NaN loss in a 2-rank run ----
"$W" "${RUN[@]}" --data "$D/c.bin" --steps 1 --ckpt-dir "$D/ck" > "$D/ck.out" 2>&1 &&
"$B" ckpt export --from "$D/ck" --out "$D/hf" > "$D/e.out" 2>&1 ||
    { t_fail "checkpoint for the NaN test" "$(tail -2 "$D/ck.out" "$D/e.out")"; t_done; exit 1; }
$PY - "$D/hf/model.safetensors" <<'EOF'
import json, struct, sys
p = sys.argv[1]
raw = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
t = h["model.norm.weight"]
off = 8 + n + t["data_offsets"][0] + 4 * 7
raw[off:off + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(raw)
EOF
t_expect_fail "2 ranks: a NaN loss stops the run at step 1 with the cause and the fix" \
    "step 1: the loss is NaN; stopping the run at this step.*--lr.*--skip-nonfinite" \
    timeout 60 "$B" train --nproc 2 "${RUN[@]}" --data "$D/c.bin" --init-from "$D/hf" --steps 4 --log-json "$D/nan.jsonl"
t_expect_fail "2 ranks, --skip-nonfinite: stopped after 10 in a row" \
    "step 10: the loss is NaN, 10 steps in a row; stopping" \
    timeout 60 "$B" train --nproc 2 "${RUN[@]}" --data "$D/c.bin" --init-from "$D/hf" --steps 30 --skip-nonfinite \
    --log-json "$D/skip.jsonl"
timeout 60 "$B" train --nproc 2 "${RUN[@]}" --data "$D/c.bin" --init-from "$D/hf" --steps 30 --skip-nonfinite \
    > "$D/skip.out" 2>&1
t_check "2 ranks, --skip-nonfinite: each skipped step named once (rank 0), the other rank says why it stops" bash -c \
    "[ \$(grep -c 'rank 0 pid [0-9]*\\] warn: step [0-9]*: the loss is NaN; skipping this step.s update' '$D/skip.out') = 9 ] &&
     [ \$(grep -c 'warn: step [0-9]*: the loss is NaN; skipping' '$D/skip.out') = 9 ] &&
     grep -q 'rank 1 pid [0-9]*\\] error: rank 1: stopping at step 10 with the others: the loss is not finite' '$D/skip.out'"
t_check "2 ranks: the skipped steps are logged once (rank 0), as skipped with a null loss" $PY - "$D/skip.jsonl" <<'EOF'
import sys
import jsonlog
steps = jsonlog.steps(sys.argv[1])
assert [r["step"] for r in steps] == list(range(1, 10)), [r["step"] for r in steps]
assert all(r["skipped"] is True and r["loss"] is None for r in steps)
EOF
t_done
