#!/usr/bin/env bash
# probe.sh: ballast-probe, the images' health probe. Exit 2 on bad flags,
# 1 with the address in the message when nothing answers, 0 against a
# running ballastd on its Unix socket and on its TCP health port, and 1
# again once ballastd has drained and exited.
source "$(dirname "$0")/../lib.sh"
P=$BIN/ballast-probe
D=$(t_tmpdir)
[ -x "$P" ] || { t_fail "ballast-probe built" "missing $P"; t_done; exit 1; }
"$P" --timeout nonsense > "$D/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q -- '--timeout' "$D/o" && t_ok "bad --timeout: exit 2 naming the flag" ||
    t_fail "bad --timeout: exit 2" "rc $rc: $(cat "$D/o")"
t_expect_fail "nothing listening: exit 1 naming the address" "$D/none.sock.*not healthy" \
    "$P" --addr "unix:$D/none.sock" --timeout 1s
if [ ! -x "$BIN/ballastd" ]; then
    t_skip "probe a running ballastd" "ballastd is not built in this tree yet"; t_done; exit 0
fi
S=$D/ballastd.sock
"$BIN/ballastd" --socket "$S" --pool-bytes 8M --mlock=false --health-port 0 --port-file "$D/ports" \
    > "$D/ballastd.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ -s "$D/ports" ] && break; sleep 0.1; done
if [ ! -s "$D/ports" ]; then
    t_fail "ballastd starts" "$(tail -3 "$D/ballastd.log")"; kill $pid 2> /dev/null; wait; t_done; exit 1
fi
hport=$(awk '{ print $2 }' "$D/ports")
t_check "SERVING on the Unix socket" "$P" --addr "unix:$S" --timeout 3s
t_check "SERVING on the TCP health port $hport" "$P" --addr "127.0.0.1:$hport" --timeout 3s
out=$("$P" --addr "unix:$S" --quiet 2>&1); [ -z "$out" ] && t_ok "--quiet prints nothing" || t_fail "--quiet prints nothing" "$out"
kill -TERM $pid; wait $pid; rc=$?
[ $rc = 0 ] && t_ok "ballastd drains and exits 0" || t_fail "ballastd drains and exits 0" "exit $rc"
t_expect_fail "after ballastd exited: exit 1" "not healthy" "$P" --addr "127.0.0.1:$hport" --timeout 1s
t_done
