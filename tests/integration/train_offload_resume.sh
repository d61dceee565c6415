#!/usr/bin/env bash
# train_offload_resume.sh: the launcher and ballastd across a crash, and
# optimizer offload through a pool smaller than the optimizer state.
#
# Runs 1-3 resume from the service, so their optimizer state must be
# durable: --optimizer-offload nvme is (--optimizer-offload-durable auto).
#
# 1. `ballast train --nproc 2` (replicas 1, S 2) with --activation-offload
#    and --optimizer-offload nvme and nothing on the offload socket starts a
#    ballastd for the run (spill directory under the run directory), trains
#    30 steps and stops it: the uninterrupted reference.
# 2. The same run again, copying through staging buffers in backend memory
#    as GPU ranks do (BALLAST_TEST_BACKEND=staged: every asynchronous copy runs
#    as late as a copy stream could, so a blob committed before its copy
#    ran reaches the spill directory stale); kill -9 of rank 1 once a few
#    steps are done: the launcher exits non-zero naming rank 1, stops rank
#    0 and its ballastd.
# 3. The same command with --resume-from-service, staged too: a new
#    ballastd on the same spill directory recovers the persistent state,
#    the workers continue after the last step complete on both ranks, with
#    no checkpoint file, and every step's loss equals the reference (in
#    place) bit for bit.
# 4. --optimizer-offload nvme against a ballastd whose pool (1M, its least)
#    is smaller than one copy of the optimizer state (1.25M for an 8-layer
#    variant: 3 x 109,088 floats), staged: the same losses as a roomy pool
#    in place, and `ballast status --json` shows spilled bytes and
#    evictions; the same not durable, in place (--optimizer-offload-durable
#    no: nothing persistent, only evictions write to the spill tier): the
#    same losses, spill writes and no persistent blob. (In place holds
#    three blobs of up to 200K at once, staged four: in a 1M pool a
#    contiguous free extent for the next one is less assured.)
# 5. A staged optimizer-offload run (2 ranks, S 2) saving checkpoints at
#    steps 5 and 10, then --resume from step 5, staged: the moments and
#    master come back from ballastd for each checkpoint; every loss and the
#    final parameters (--dump-params, which brings the master back too)
#    equal an in-place run's bit for bit.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/ballastd.lib"
BALLAST=$TBIN/ballast   # the test build: BALLAST_TEST_BACKEND=staged runs the staged CPU double
source "$(dirname "$0")/fsdp.lib"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
W=$TBIN/ballast-worker
PY=/usr/bin/python3
D=$(t_tmpdir)
[ -x "$W" ] && [ -x "$BALLASTD" ] || { t_fail "binaries built" "missing $W or $BALLASTD"; t_done; exit 1; }

offload_tiny "$D" 12
STEPS=30
COMMON=(--model "$D/cfg.json" --init-seed 5 --data "$D/c.bin" --data-order shuffled --data-seed 6 --seq-len 16
        --grad-accum 2 --steps $STEPS --lr 3e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1
        --rdzv-timeout 60s)
SAVERS=(--activation-offload --activation-loading-horizon 1 --optimizer-offload nvme --offload-pool 64M
        --offload-spill-bytes 64M)

# same REF RUN [FIRST]: every step from FIRST on is in RUN (its last record of
# the step) with the same loss as in REF, bit for bit
same() {
    $PY - "$@" <<'EOF'
import sys
import jsonlog
ref, run = jsonlog.by_step(sys.argv[1], "loss"), jsonlog.by_step(sys.argv[2], "loss")
first = int(sys.argv[3]) if len(sys.argv) > 3 else 1
want = [s for s in sorted(ref) if s >= first]
if not want or any(s not in run for s in want):
    sys.exit("steps missing: want %s..%s, have %s" % (want[:1], want[-1:], sorted(run)))
bad = [(s, ref[s], run[s]) for s in want if run[s] != ref[s]]
if bad:
    sys.exit("%d steps differ, first: %s" % (len(bad), bad[0]))
print("%d steps identical" % len(want))
EOF
}

bd_pid_of() { sed -nE 's/.*started ballastd \(pid ([0-9]+)\).*/\1/p' "$1" | tail -1; }

# 1. the uninterrupted reference, ballastd started by the launcher
mkdir -p "$D/full"
if timeout 120 "$BALLAST" train --nproc 2 "${COMMON[@]}" "${SAVERS[@]}" --micro-batch 2 --hybrid-shard-degree 2 \
    --offload-socket "$D/full/bd.sock" --log-json "$D/full/log.jsonl" > "$D/full.out" 2>&1; then
    t_ok "2 ranks with offload, no ballastd running: the run finishes"
else t_fail "reference run" "$(tail -5 "$D/full.out")"; fi
bp=$(bd_pid_of "$D/full.out")
if [ -n "$bp" ] && [ -d "$D/full/ballastd" ] && ! kill -0 "$bp" 2>/dev/null; then
    t_ok "the launcher started ballastd (pid $bp, spill dir in the run directory) and stopped it at the end"
else t_fail "launcher-managed ballastd" "pid '$bp': $(grep -E 'ballastd' "$D/full.out" | head -3)"; fi

# 2. kill -9 of rank 1 mid-run
mkdir -p "$D/run"
RUN=("$BALLAST" train --nproc 2 "${COMMON[@]}" "${SAVERS[@]}" --micro-batch 2 --hybrid-shard-degree 2
     --offload-socket "$D/run/bd.sock" --log-json "$D/run/log.jsonl")
BALLAST_TEST_BACKEND=staged "${RUN[@]}" > "$D/kill.out" 2>&1 &
LP=$!
for _ in $(seq 600); do
    [ "$(jl_count "$D/run/log.jsonl" 2>/dev/null || echo 0)" -ge 8 ] && break
    sleep 0.05
done
victim=""
for p in $(pgrep -P $LP); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'RANK=1'; then victim=$p; fi
done
if [ -n "$victim" ]; then
    kill -9 "$victim"
    rc=0; wait $LP || rc=$?
    bp=$(bd_pid_of "$D/kill.out")
    left=$(pgrep -P $LP 2>/dev/null | wc -l)
    if [ $rc -ne 0 ] && [ "$left" -eq 0 ] && grep -q "rank 1 (pid $victim) was killed by signal 9" "$D/kill.out" &&
       [ -n "$bp" ] && ! kill -0 "$bp" 2>/dev/null; then
        t_ok "kill -9 of rank 1: the launcher exits $rc naming it; rank 0 and ballastd are stopped"
    else t_fail "kill -9 of rank 1" "rc $rc, $left left, ballastd '$bp': $(tail -3 "$D/kill.out")"; fi
else
    kill $LP 2>/dev/null; wait $LP 2>/dev/null
    t_fail "kill -9 of rank 1" "rank 1 not found among the launcher's children: $(tail -3 "$D/kill.out")"
fi
done_before=$(jl_count "$D/run/log.jsonl" 2>/dev/null || echo 0)

# 3. resume from the state ballastd kept
if BALLAST_TEST_BACKEND=staged timeout 120 "${RUN[@]}" --resume-from-service > "$D/resume.out" 2>&1; then
    at=$(sed -nE 's/.*resumed from ballastd \(job [^)]*\) after step ([0-9]+).*/\1/p' "$D/resume.out")
    rec=$(sed -nE 's/.* ([0-9]+) persistent blob\(s\) recovered.*/\1/p' "$D/run/ballastd.log" | tail -1)
    if [ -n "$at" ] && [ "$at" -ge 6 ] && [ "$at" -lt $STEPS ] && [ "$at" -ge $((done_before - 2)) ]; then
        t_ok "--resume-from-service continues after step $at ($done_before steps were logged before the kill)"
    else t_fail "resume point" "after step '$at', $done_before logged: $(grep -iE 'resum|error' "$D/resume.out" | head -3)"; fi
    if ! ls "$D/run"/step-* >/dev/null 2>&1 && [ "${rec:-0}" -gt 0 ]; then
        t_ok "no checkpoint file involved; the new ballastd recovered $rec persistent blobs from the spill directory"
    else t_fail "state from ballastd only" "$(ls "$D/run"), recovered lines $rec"; fi
    if grep -q "offload copies staged through backend memory" "$D/resume.out" &&
       grep -q "offload copies staged through backend memory" "$D/kill.out"; then
        t_ok "the killed and the resumed run copy through backend memory (BALLAST_TEST_BACKEND=staged)"
    else t_fail "staged resumed run" "no staging line: $(grep -m2 offload "$D/resume.out")"; fi
    t_check "resumed run: every step's loss equals the uninterrupted run's, bit for bit" same "$D/full/log.jsonl" "$D/run/log.jsonl"
else t_fail "--resume-from-service runs" "$(tail -5 "$D/resume.out")"; fi

# 4. a pool smaller than the optimizer state
sed 's/"num_hidden_layers": 4/"num_hidden_layers": 8/' "$D/cfg.json" > "$D/cfg8.json"
bd_start small "$D" --pool-bytes 1M --spill-dir "$D/spill-small" --spill-bytes 64M --spill-file-bytes 16M --no-mlock ||
    { t_fail "small ballastd starts" "$(tail -3 "$D/small.log")"; t_done; exit 1; }
bd_start big "$D" --pool-bytes 64M --spill-dir "$D/spill-big" --spill-bytes 64M --spill-file-bytes 16M --no-mlock ||
    { t_fail "big ballastd starts" "$(tail -3 "$D/big.log")"; t_done; exit 1; }
ONE=("$W" "${COMMON[@]}" --model "$D/cfg8.json" --steps 10 --micro-batch 4 --optimizer-offload nvme)
if timeout 120 "${ONE[@]}" --offload-socket "$(bd_sock big)" --log-json "$D/big.jsonl" > "$D/big.out" 2>&1 &&
   BALLAST_TEST_BACKEND=staged timeout 120 "${ONE[@]}" --offload-socket "$(bd_sock small)" --log-json "$D/small.jsonl" \
       > "$D/small.out" 2>&1; then
    t_check "pool 1M < optimizer state 1.25M, staged: the same losses as a 64M pool in place" same "$D/big.jsonl" "$D/small.jsonl"
    sp=$(bd_json small 'd["spilled_bytes"]') ev=$(bd_json small 'd["evictions"]')
    if [ "${sp:-0}" -gt 0 ] && [ "${ev:-0}" -gt 0 ]; then
        t_ok "ballast status --json: spilled_bytes $sp, evictions $ev"
    else t_fail "spill shown in status" "spilled_bytes '$sp', evictions '$ev'"; fi
else t_fail "small-pool runs" "$(tail -n 3 "$D/small.out" "$D/big.out")"; fi
if bd_start small2 "$D" --pool-bytes 1M --spill-dir "$D/spill-small2" --spill-bytes 64M --spill-file-bytes 16M --no-mlock &&
   timeout 120 "${ONE[@]}" --optimizer-offload-durable no --offload-socket "$(bd_sock small2)" \
       --log-json "$D/small2.jsonl" > "$D/small2.out" 2>&1; then
    t_check "pool 1M, not durable, in place: the same losses as a 64M pool" same "$D/big.jsonl" "$D/small2.jsonl"
    got=$(bd_json small2 '"%d %d %d" % (d["persistent_blobs"], d["spill_writes"] > 0, d["evictions"] > 0)')
    [ "$got" = "0 1 1" ] && t_ok "not durable through a small pool: evictions write to the spill tier, no persistent blob" ||
        t_fail "not durable, small pool, status" "persistent_blobs, spill writes > 0, evictions > 0 = $got"
else t_fail "small-pool run, not durable" "$(tail -n 3 "$D/small2.out" "$D/small2.log" 2>&1)"; fi

# 5. checkpoints of a staged optimizer-offload run, and --resume from one
CK=("$BALLAST" train --nproc 2 "${COMMON[@]}" --steps 10 --micro-batch 2 --hybrid-shard-degree 2
    --optimizer-offload host --offload-pool 32M)
if timeout 120 "${CK[@]}" --offload-socket "$D/ck-ref.sock" --offload-job ck-ref --log-json "$D/ck-ref.jsonl" \
       --dump-params "$D/ck-ref.st" > "$D/ck-ref.out" 2>&1 &&
   BALLAST_TEST_BACKEND=staged timeout 120 "${CK[@]}" --offload-socket "$D/ck-a.sock" --offload-job ck-a \
       --log-json "$D/ck-a.jsonl" --ckpt-dir "$D/ck" --ckpt-every 5 > "$D/ck-a.out" 2>&1 &&
   [ -d "$D/ck/step-00000005" ] && [ -d "$D/ck/step-00000010" ] && rm -rf "$D/ck/step-00000010" &&
   BALLAST_TEST_BACKEND=staged timeout 120 "${CK[@]}" --offload-socket "$D/ck-b.sock" --offload-job ck-b \
       --log-json "$D/ck-b.jsonl" --ckpt-dir "$D/ck" --resume --dump-params "$D/ck-b.st" > "$D/ck-b.out" 2>&1; then
    t_check "staged optimizer offload with checkpoints at 5 and 10: every loss equals the in-place run's" \
        same "$D/ck-ref.jsonl" "$D/ck-a.jsonl"
    if grep -q "resumed from .*step-00000005 (step 5)" "$D/ck-b.out" &&
       grep -q "offload copies staged through backend memory" "$D/ck-b.out"; then
        t_check "--resume from step 5, staged: steps 6..10 equal the in-place run's" same "$D/ck-ref.jsonl" "$D/ck-b.jsonl" 6
        t_check "--resume from step 5, staged: the final parameters equal the in-place run's bit for bit" \
            $PY "$(dirname "$0")/fsdp_cmp.py" params "$D/ck-ref.st" "$D/ck-b.st" 0
    else t_fail "staged --resume from step 5" "$(grep -iE 'resum|staged|error' "$D/ck-b.out" | head -3)"; fi
else t_fail "staged optimizer-offload runs with checkpoints" "$(tail -n 3 "$D/ck-ref.out" "$D/ck-a.out" "$D/ck-b.out" 2>&1)"; fi
t_done
