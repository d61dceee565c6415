#!/usr/bin/env bash
# cli_env_moved.sh: ballastd and ballast-rdzv read only their own prefixes
# (BALLASTD_, BALLAST_RDZV_); a variable under the old BALLAST_ name gets one
# warning naming the variable they read instead, and `ballast train` passes
# the ballastd it starts none of the trainer's BALLAST_* variables (so the
# trainer's BALLAST_LOG_JSON=FILE neither reaches nor warns it).
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
D=$(t_tmpdir)
BD=$BIN/ballastd RZ=$BIN/ballast-rdzv B=$BIN/ballast
[ -x "$BD" ] && [ -x "$RZ" ] || { t_fail "binaries built" "missing under $BIN"; t_done; exit 1; }
# a random option of each (name from its --help), its old and its new variable
# pick PROG: "NAME VALUE" of a random option, VALUE its default as --help shows it (else x), so it parses
pick() {
    "$1" --help | sed -nE 's/^  --([a-z][a-z0-9-]*) .*\(default: ([^ ]*)\)$/\1 \2/p' | grep -v '^help ' |
        sed -E 's/ (unset|""|)$/ x/' | shuf -n 1
}
var() { echo "$1$(echo "$2" | tr 'a-z-' 'A-Z_')"; }
for prog in ballastd ballast-rdzv; do
    exe=$BIN/$prog; pre=BALLASTD_; [ $prog = ballast-rdzv ] && pre=BALLAST_RDZV_
    read -r o val <<< "$(pick "$exe")"
    old=$(var BALLAST_ "$o"); new=$(var $pre "$o")
    out=$(env "$old=$val" "$exe" --help 2>&1 >/dev/null)
    if [ "$(echo "$out" | grep -c warning)" = 1 ] &&
       echo "$out" | grep -qx "$prog: warning: $old is not read by $prog; it reads $new"; then
        t_ok "$prog with $old set: one warning naming $new"
    else t_fail "$prog warns about $old" "got: $out"; fi
    out=$(env "$new=$val" "$exe" --help 2>&1 >/dev/null)
    if [ -z "$out" ]; then t_ok "$prog with $new set: no warning"
    else t_fail "$prog quiet with its own variable" "got: $out"; fi
done
# an older spelling's old variable (ballast-rdzv --world, now --world-size)
out=$(BALLAST_WORLD=2 "$RZ" --help 2>&1 >/dev/null)
if echo "$out" | grep -qx "ballast-rdzv: warning: BALLAST_WORLD is not read by ballast-rdzv; it reads BALLAST_RDZV_WORLD_SIZE"; then
    t_ok "an older spelling's variable (BALLAST_WORLD) names BALLAST_RDZV_WORLD_SIZE"
else t_fail "BALLAST_WORLD warning" "got: $out"; fi

# the launcher's ballastd: none of the trainer's variables, no warning in its log
"$B" data synth --out "$D/c.bin" --tokens 20000 --vocab 256 --seed 4 > /dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
mkdir -p "$D/run"
if BALLAST_LOG_JSON="$D/run/log.jsonl" BALLAST_THREADS=1 BALLAST_POOL_BYTES=1G timeout 120 "$B" train --model tiny \
       --data "$D/c.bin" --micro-batch 2 --seq-len 16 --steps 1 --optimizer-offload host --offload-pool 64M \
       --offload-socket "$D/run/bd.sock" --run-dir "$D/run" > "$D/train.out" 2>&1; then
    if [ -s "$D/run/log.jsonl" ] && [ -f "$D/run/ballastd.log" ] && ! grep -q "BALLAST_" "$D/run/ballastd.log"; then
        t_ok "ballast train with BALLAST_LOG_JSON=FILE: the trainer logs there, its ballastd sees no BALLAST_* variable"
    else t_fail "the launcher's ballastd gets no trainer variable" "$(grep BALLAST_ "$D/run/ballastd.log" | head -3)"; fi
else t_fail "ballast train with offload and BALLAST_* set" "$(tail -3 "$D/train.out")"; fi

# BALLAST_LOG_JSON is the step records' FILE: a boolean there (the old "log
# lines as JSON") is refused naming BALLAST_LOG_FORMAT, and nothing is
# written to a file named after it; BALLAST_LOG_FORMAT=json gives JSON lines
b=$(shuf -n 1 -e 1 true TRUE yes on 0 false)
mkdir -p "$D/lj" && (cd "$D/lj" && BALLAST_LOG_JSON=$b t_expect_fail "BALLAST_LOG_JSON=$b is refused, naming BALLAST_LOG_FORMAT" \
    "looks like a boolean.*BALLAST_LOG_FORMAT=json" "$B" train --model tiny --data "$D/c.bin" --micro-batch 2 --seq-len 16 --steps 1)
if [ -e "$D/lj/$b" ]; then t_fail "no file named $b" "$(ls "$D/lj")"; else t_ok "no step-record file named '$b'"; fi
out=$(BALLAST_LOG_FORMAT=json "$B" train --model tiny --data "$D/c.bin" --micro-batch 2 --seq-len 16 --steps 1 \
      --log-json "$D/no-such-dir/r.jsonl" 2>&1)
if echo "$out" | grep -q '^{.*"level": *"error".*no-such-dir'; then t_ok "BALLAST_LOG_FORMAT=json: the error is a JSON line"
else t_fail "BALLAST_LOG_FORMAT=json" "$(echo "$out" | tail -2)"; fi
bad=$(shuf -n 1 -e xml yaml 1 JSONL)
out=$(BALLAST_LOG_FORMAT=$bad "$BD" --help 2>&1 >/dev/null)
if [ "$(echo "$out" | grep -c "BALLAST_LOG_FORMAT='$bad' is not text or json")" = 1 ]; then
    t_ok "BALLAST_LOG_FORMAT=$bad: one warning naming the accepted values"
else t_fail "BALLAST_LOG_FORMAT=$bad warns once" "got: $out"; fi
t_done
