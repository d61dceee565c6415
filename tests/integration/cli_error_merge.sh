#!/usr/bin/env bash
# cli_error_merge.sh: the launcher prints a message that several ranks send
# once, with their ranks, however late a rank's copy comes: it holds the
# ranks' errors until every rank that has not sent one has exited (or the
# hold bound passes), not for a fixed time. Rank 1 is made late on purpose:
# a stand-in ballast-worker next to a copy of `ballast` delays rank 1 by 3 s
# (ignoring the launcher's SIGTERM meanwhile, as a rank busy in a step
# does) before it runs the real worker, which then fails like rank 0.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
D=$(t_tmpdir)
[ -x "$BIN/ballast-worker" ] || { t_fail "ballast-worker built" "missing under $BIN"; t_done; exit 1; }
mkdir -p "$D/bin"
cp "$BIN/ballast" "$D/bin/ballast"
cat > "$D/bin/ballast-worker" <<SH
#!/bin/sh
if [ "\$RANK" = 1 ]; then trap '' TERM; sleep \${SLOW_RANK_S:-3}; fi
exec "$BIN/ballast-worker" "\$@"
SH
chmod +x "$D/bin/ballast-worker"
"$BIN/ballast" data synth --out "$D/c.bin" --tokens 20000 --vocab 256 --seed 5 > /dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
RUN=(--model tiny --data "$D/c.bin" --micro-batch 2 --seq-len 16 --steps 1 --threads 1)

out=$(timeout 60 "$D/bin/ballast" train --nproc 2 "${RUN[@]}" --stpes 3 2>&1); rc=$?
n=$(echo "$out" | grep -c "unknown option '--stpes'")
if [ "$rc" -ne 0 ] && [ "$n" = 1 ] &&
   echo "$out" | grep -q "^ballast train: on ranks 0-1: unknown option '--stpes': did you mean --steps?"; then
    t_ok "rank 1's copy 3 s late: the message once, on ranks 0-1 (exit $rc)"
else t_fail "one message for both ranks, one of them late" "exit $rc, $n copies: $(echo "$out" | head -5)"; fi
# the launcher's own line comes after the ranks' message it refers to
first=$(echo "$out" | grep -n "unknown option" | head -1 | cut -d: -f1)
note=$(echo "$out" | grep -n "failed with exit status" | head -1 | cut -d: -f1)
if [ -n "$first" ] && [ -n "$note" ] && [ "$first" -lt "$note" ]; then
    t_ok "the launcher's 'its message is above' line follows that message"
else t_fail "order of the ranks' message and the launcher's line" "$(echo "$out" | head -5)"; fi
t_done
