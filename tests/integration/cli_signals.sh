#!/usr/bin/env bash
# cli_signals.sh: no lost work on Ctrl-C or a resume that would change the run.
#   - `ballast train ... | tee log` with Ctrl-C reaching the whole pipeline
#     (tee dies with it): training is not killed by SIGPIPE, it finishes the
#     step in progress, saves the checkpoint and exits 130, with one process
#     (the launcher replaced by the worker) and with two ranks under the
#     launcher; the first signal is acknowledged on stderr before the stop;
#   - a second signal aborts at once, naming the steps that are lost;
#   - --resume with --steps at or below the checkpoint's step says there is
#     nothing to train and exits non-zero;
#   - --resume with another --steps or --lr is refused naming the field,
#     unless --allow-schedule-change.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
B=$BIN/ballast
D=$(t_tmpdir)
[ -x "$B" ] || { t_fail "ballast built" "missing $B"; t_done; exit 1; }
"$B" data synth --out "$D/c.bin" --tokens 30000 --vocab 256 --seed 7 > /dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
RUN=(--model tiny --data "$D/c.bin" --micro-batch 2 --seq-len 32 --threads 1 --lr-schedule constant)

# Wait (bounded) until FILE holds at least N lines.
wait_lines() { for _ in $(seq 1 600); do [ -s "$1" ] && [ "$(wc -l < "$1")" -ge "$2" ] && return 0; sleep 0.1; done; return 1; }

# A pipeline `ballast train ARGS | tee` in a session of its own; SIGINT to
# the whole process group once the run logged two steps, as a Ctrl-C does.
# Leaves the train's exit status in $1/rc, its stderr in $1/err.
pipe_ctrl_c() {
    local d=$1; shift
    mkdir -p "$d"
    # a background job of a script starts with SIGINT ignored, and SIGPIPE may be: back to the defaults of a terminal
    setsid "$T_PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); signal.signal(signal.SIGPIPE, signal.SIG_DFL); os.execvp("bash", sys.argv[1:])' \
        bash -c '"$@" 2> "$0/err" | tee "$0/tee.log" > /dev/null; echo "${PIPESTATUS[0]}" > "$0/rc"' \
        "$d" "$B" train "$@" --ckpt-dir "$d/ck" --log-json "$d/run.jsonl" &
    local sp=$!
    wait_lines "$d/run.jsonl" 3 || true
    local pg
    pg=$(ps -o pgid= -p $sp | tr -d ' ')
    [ -n "$pg" ] && kill -INT -- "-$pg" 2> /dev/null
    for _ in $(seq 1 600); do [ -s "$d/rc" ] && break; sleep 0.1; done
    wait $sp 2> /dev/null
}

# Pass when the run in $1 stopped with 130 after a step it checkpointed, and
# its stderr holds the acknowledgement $2 before the stop.
check_stopped() {
    local d=$1 ack=$2 name=$3 rc last
    rc=$(cat "$d/rc" 2> /dev/null)
    last=$(jl_get "$d/run.jsonl" --last 1 step 2> /dev/null)
    if [ "$rc" = 130 ] && [ -n "$last" ] && [ -f "$d/ck/$(printf 'step-%08d' "$last")/manifest.json" ] &&
       grep -n -- "$ack" "$d/err" | head -1 | cut -d: -f1 | {
           read -r a; s=$(grep -n "stopping after step $last on a signal (checkpoint saved)" "$d/err" | head -1 | cut -d: -f1)
           [ -n "$a" ] && [ -n "$s" ] && [ "$a" -lt "$s" ]; }; then
        t_ok "$name: exit 130, checkpoint of step $last, the signal acknowledged before the stop"
    else t_fail "$name" "rc '$rc', last step '$last': $(tail -4 "$d/err")"; fi
}

pipe_ctrl_c "$D/one" "${RUN[@]}" --micro-batch 8 --seq-len 64 --nproc 1 --steps 100000
check_stopped "$D/one" "ballast train: signal received: stopping after the step in progress and saving a checkpoint" \
    "Ctrl-C under | tee, one process"
pipe_ctrl_c "$D/two" "${RUN[@]}" --micro-batch 8 --seq-len 64 --nproc 2 --steps 100000
check_stopped "$D/two" "ballast train: Interrupt: the ranks finish the step in progress, save a checkpoint" \
    "Ctrl-C under | tee, two ranks under the launcher"
if grep -q "ballast-worker" "$D/two/err"; then t_fail "worker messages under the command typed" "$(grep ballast-worker "$D/two/err" | head -2)"
else t_ok "worker messages under the command typed (ballast train, not ballast-worker)"; fi

# ---- a second signal aborts at once ----
d=$D/abort; mkdir -p "$d"
"$B" train "${RUN[@]}" --micro-batch 16 --seq-len 128 --steps 100000 --ckpt-dir "$d/ck" --ckpt-every 1 \
    --log-json "$d/run.jsonl" > /dev/null 2> "$d/err" &
pid=$!
# step 2 logged: step 1's checkpoint is on disk (the checkpoint is written
# before the next step starts), so the abort has a newest checkpoint to name
wait_lines "$d/run.jsonl" 4 || true
# the second signal once the first is acknowledged (two pending signals would merge into one)
kill -INT $pid 2> /dev/null
for _ in $(seq 1 1000); do grep -q "signal received" "$d/err" && break; sleep 0.01; done
kill -INT $pid 2> /dev/null
rc=0; timeout 60 tail --pid=$pid -f /dev/null || true; wait $pid || rc=$?
if [ $rc -eq 130 ] && grep -Eq "second signal: aborting now; lost: step [0-9]+ \(the newest checkpoint is step [0-9]+\)" "$d/err"; then
    t_ok "a second Ctrl-C aborts at once, naming what is lost ($(grep -o 'lost: .*' "$d/err"))"
else t_fail "second signal aborts" "rc $rc: $(tail -3 "$d/err")"; fi

# ---- resuming: nothing to do, a changed schedule ----
d=$D/res
"$B" train "${RUN[@]}" --lr-schedule cosine --steps 3 --ckpt-dir "$d" > /dev/null 2>&1 ||
    t_fail "a 3-step run to resume" "ballast train failed"
t_expect_fail "--resume with --steps at the checkpoint's step says so" \
    "nothing to train: the run is at step 3 and --steps is 3" "$B" train "${RUN[@]}" --lr-schedule cosine --steps 3 --ckpt-dir "$d" --resume
t_expect_fail "--resume with --steps below the checkpoint's step says so" \
    "nothing to train: the run is at step 3 and --steps is 2" "$B" train "${RUN[@]}" --lr-schedule cosine --steps 2 --ckpt-dir "$d" --resume
t_expect_fail "--resume with another --steps is refused, naming it" \
    "trained with --steps 3 \(now 5\).*--allow-schedule-change" "$B" train "${RUN[@]}" --lr-schedule cosine --steps 5 --ckpt-dir "$d" --resume
t_expect_fail "--resume with another --lr is refused, naming it" \
    "trained with .*--lr 0.0003 \(now 0.001\)" "$B" train "${RUN[@]}" --lr-schedule cosine --steps 4 --lr 1e-3 --ckpt-dir "$d" --resume
if "$B" train "${RUN[@]}" --lr-schedule cosine --steps 4 --ckpt-dir "$d" --resume --allow-schedule-change \
       --log-json "$d/r.jsonl" > "$d/r.out" 2>&1 && [ "$(jl_get "$d/r.jsonl" --last 1 step)" = 4 ]; then
    t_ok "--allow-schedule-change continues on the new schedule (step 4)"
else t_fail "--allow-schedule-change" "$(tail -3 "$d/r.out")"; fi
# a constant schedule does not depend on --steps (its warmup is
# --warmup-steps long): a longer run resumes without the flag
d=$D/res_const
"$B" train "${RUN[@]}" --warmup-steps 2 --steps 3 --ckpt-dir "$d" > /dev/null 2>&1 ||
    t_fail "a 3-step constant-schedule run to resume" "ballast train failed"
if "$B" train "${RUN[@]}" --warmup-steps 2 --steps 4 --ckpt-dir "$d" --resume --log-json "$d/r.jsonl" > "$d/r.out" 2>&1 &&
   [ "$(jl_get "$d/r.jsonl" --last 1 step)" = 4 ]; then
    t_ok "--resume with more --steps on a constant schedule with warmup trains on (step 4)"
else t_fail "--resume with more --steps on a constant schedule" "$(tail -3 "$d/r.out")"; fi
t_done
