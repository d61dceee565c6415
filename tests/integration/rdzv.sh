#!/usr/bin/env bash
# rdzv.sh: the rendezvous store end to end: ballast-rdzv plus clients (KV
# round trip with arbitrary bytes, Wait released by a later Set, a barrier of
# 4 ranks, a missing rank named in every other rank's error, job and world
# checks), then the in-process library variant served by rank 0.
source "$(dirname "$0")/../lib.sh"
TOOL=$ROOT/$BUILD/tests/integration/rdzv_tool
RDZV=$BIN/ballast-rdzv
if [ ! -x "$TOOL" ] || [ ! -x "$RDZV" ]; then t_fail "rdzv binaries" "build first: $TOOL $RDZV"; t_done; exit; fi
D=$(t_tmpdir)

# ---- flags ----
t_check "ballast-rdzv --help lists its flags" bash -c "'$RDZV' --help | grep -q -- --listen && '$RDZV' --help | grep -q -- --world-size && '$RDZV' --help | grep -q -- --idle-timeout"
t_expect_fail "a bad flag is named" "world" "$RDZV" --world=-3
t_expect_fail "an unusable address is an error" "listen|address|bind|resolve" "$RDZV" --listen=999.1.1.1:1 --timeout=2s

# ---- standalone server ----
"$RDZV" --listen=127.0.0.1:0 --port-file="$D/port" --world=4 --job-id=j1 --timeout=60s >"$D/server.log" 2>&1 &
SRV=$!
stop_server() { kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null; }
trap 'stop_server; t_cleanup' EXIT
for _ in $(seq 100); do [ -s "$D/port" ] && break; sleep 0.05; done
if [ ! -s "$D/port" ]; then t_fail "ballast-rdzv starts" "no port file: $(cat "$D/server.log")"; t_done; exit; fi
A=127.0.0.1:$(cat "$D/port")
t_ok "ballast-rdzv serves on $A"

# KV round trip with bytes that are not text (NUL, 0xff, newline)
VAL=$(head -c 300 /dev/urandom | od -An -tx1 | tr -d ' \n')00ff0a00
t_check "set a 304-byte binary value" "$TOOL" "$A" j1 4 set nccl-id "$VAL"
GOT=$("$TOOL" "$A" j1 4 get nccl-id 2>&1)
if [ "$GOT" = "$VAL" ]; then t_ok "get returns the same bytes"; else t_fail "get returns the same bytes" "got ${GOT:0:80}..."; fi
t_expect_fail "get of a missing key says so" "not set" "$TOOL" "$A" j1 4 get nope
t_expect_fail "a call from another job is refused" "job \"j1\".*\"j2\"" "$TOOL" "$A" j2 4 get nccl-id
t_expect_fail "a call with another world is refused" "4 ranks.*expects 5" "$TOOL" "$A" j1 5 get nccl-id

# Wait released by a later Set
"$TOOL" "$A" j1 4 wait later 10 >"$D/wait.out" 2>&1 &
W=$!
sleep 0.5
"$TOOL" "$A" j1 4 set later 6c61746572
wait $W; rc=$?
if [ $rc -eq 0 ] && [ "$(cat "$D/wait.out")" = 6c61746572 ]; then t_ok "wait returns once the key is set"; else t_fail "wait returns once the key is set" "rc $rc: $(cat "$D/wait.out")"; fi
t_expect_fail "wait times out naming the key" "key never.*not set within" "$TOOL" "$A" j1 4 wait never 0.5

# Barrier of 4, twice with the same name (rounds)
barrier4() { # name timeout -> per-rank outputs in $D/b.<rank>; returns failures
    local pids=() fails=0
    for r in 0 1 2 3; do "$TOOL" "$A" j1 4 barrier "$1" $r "$2" >"$D/b.$r" 2>&1 & pids+=($!); done
    for p in "${pids[@]}"; do wait "$p" || fails=$((fails+1)); done
    return $fails
}
START=$(date +%s%N)
if barrier4 init 10; then t_ok "barrier with world 4"; else t_fail "barrier with world 4" "$(cat "$D"/b.*)"; fi
if barrier4 init 10; then t_ok "the same barrier name completes a second round"; else t_fail "second round" "$(cat "$D"/b.*)"; fi
ELAPSED_MS=$(( ($(date +%s%N) - START) / 1000000 ))
t_check "two barrier rounds of 4 ranks take under 5 s (took $ELAPSED_MS ms)" test "$ELAPSED_MS" -lt 5000

# A missing rank: ranks 0, 1, 2 arrive, rank 3 never does
pids=()
for r in 0 1 2; do "$TOOL" "$A" j1 4 barrier lost $r 1.5 >"$D/m.$r" 2>&1 & pids+=($!); done
i=0
for p in "${pids[@]}"; do
    if wait "$p"; then t_fail "rank $i fails when rank 3 is missing" "exit 0"
    elif grep -q "rank 3 did not arrive" "$D/m.$i"; then t_ok "rank $i's error names missing rank 3"
    else t_fail "rank $i's error names missing rank 3" "$(cat "$D/m.$i")"; fi
    i=$((i+1))
done
t_expect_fail "a late rank gets the same verdict" "rank 3 did not arrive" "$TOOL" "$A" j1 4 barrier lost 3 5
t_expect_fail "a rank out of range is refused" "out of range" "$TOOL" "$A" j1 4 barrier init 4 5

stop_server
t_check "the server logs its counters at exit" grep -q "rounds completed" "$D/server.log"

# ---- 16 ranks on a server with 2 threads: at most one call is held at a
# time, the others are answered at once and poll again ----
"$RDZV" --listen=127.0.0.1:0 --port-file="$D/port16" --world=16 --threads=2 --timeout=30s >"$D/server16.log" 2>&1 &
SRV=$!
for _ in $(seq 100); do [ -s "$D/port16" ] && break; sleep 0.05; done
A16=127.0.0.1:$(cat "$D/port16")
pids=()
for r in $(seq 0 15); do "$TOOL" "$A16" "" 16 barrier wide $r 20 >"$D/w.$r" 2>&1 & pids+=($!); done
fails=0
for p in "${pids[@]}"; do wait "$p" || fails=$((fails+1)); done
if [ $fails -eq 0 ]; then t_ok "barrier of 16 ranks on a 2-thread server"; else t_fail "barrier of 16 ranks on a 2-thread server" "$fails failed: $(cat "$D"/w.* | head -5)"; fi
stop_server

# ---- in-process library variant: rank 0 serves ----
S="unix:$D/rdzv.sock"
pids=()
for r in 3 2 1 0; do "$TOOL" "$S" job 4 rank $r 20 >"$D/r.$r" 2>&1 & pids+=($!); sleep 0.1; done
fails=0
for p in "${pids[@]}"; do wait "$p" || fails=$((fails+1)); done
if [ $fails -eq 0 ] && [ "$(cat "$D"/r.* | grep -c ok)" = 4 ]; then t_ok "4 ranks bootstrap through rank 0's in-process store (clients started first)"
else t_fail "in-process store" "$fails failed: $(cat "$D"/r.*)"; fi

# the same with rank 2 missing: every other rank names it
S="unix:$D/rdzv2.sock"
pids=()
for r in 0 1 3; do "$TOOL" "$S" job 4 rank $r 2 >"$D/x.$r" 2>&1 & pids+=($!); done
for r in 0 1 3; do
    p=${pids[0]}; pids=("${pids[@]:1}")
    if wait "$p"; then t_fail "in-process: rank $r fails when rank 2 is missing" "exit 0"
    elif grep -Eq "rank 2 did not arrive|still missing at the last answer: 2$" "$D/x.$r"; then t_ok "in-process: rank $r's error names missing rank 2"
    else t_fail "in-process: rank $r's error names missing rank 2" "$(cat "$D/x.$r")"; fi
done
# ---- bounds: barrier size, value size, bytes held ----
"$RDZV" --listen=127.0.0.1:0 --port-file="$D/portb" --max-value=4K --max-bytes=64K --timeout=30s >"$D/serverb.log" 2>&1 &
SRV=$!
for _ in $(seq 100); do [ -s "$D/portb" ] && break; sleep 0.05; done
AB=127.0.0.1:$(cat "$D/portb")
# 4K values + 64K of headroom: (4096 + 65536 - 4096) / 5 ranks fit a reply
LIM=$(( (4096 + 65536 - 4096) / 5 ))
W=$(( LIM + 1 + RANDOM % 200000 ))
t_expect_fail "a barrier of $W ranks is INVALID_ARGUMENT naming the limit of $LIM" \
    "INVALID_ARGUMENT: barrier huge: world $W is over the limit of $LIM ranks" "$TOOL" "$AB" "" $W barrier huge 0 1
# at the limit, the reply that lists every missing rank fits the message limit
t_expect_fail "a barrier of exactly $LIM ranks answers (its deadline, naming the missing ranks)" \
    "did not arrive" "$TOOL" "$AB" "" $LIM barrier atlimit 0 0.5
BIG=$(head -c 4097 /dev/urandom | od -An -tx1 | tr -d ' \n')
t_expect_fail "a 4097-byte value is INVALID_ARGUMENT naming --max-value" "INVALID_ARGUMENT: .*over the limit of 4096.*--max-value" \
    "$TOOL" "$AB" "" 1 set big "$BIG"
t_expect_fail "a 257-byte key is INVALID_ARGUMENT" "INVALID_ARGUMENT: (rendezvous )?key must be 1..256" \
    "$TOOL" "$AB" "" 1 set "$(head -c 257 /dev/zero | tr '\0' k)" 00
V=$(head -c 4000 /dev/urandom | od -An -tx1 | tr -d ' \n')
n=0
while [ $n -lt 40 ] && "$TOOL" "$AB" "" 1 set "k$n" "$V" 2>"$D/full.err"; do n=$((n+1)); done
# $LIM's arrival table and its barrier took some of the 64K too
if [ $n -ge 8 ] && [ $n -lt 16 ] && grep -q "RESOURCE_EXHAUSTED: .*64K\|RESOURCE_EXHAUSTED: .*65536-byte limit.*--max-bytes" "$D/full.err"; then
    t_ok "keys stop at the --max-bytes total ($n values of 4000 bytes), RESOURCE_EXHAUSTED naming it"
else
    t_fail "--max-bytes bounds what the keys hold" "$n keys; $(cat "$D/full.err")"
fi
# less than one 4000-byte value is left: a barrier of 8000 ranks does not fit
t_expect_fail "a new barrier over the --max-bytes total is refused naming it" "RESOURCE_EXHAUSTED: barrier late.*--max-bytes" \
    "$TOOL" "$AB" "" 8000 barrier late 0 1
t_check "an existing key can still be read" "$TOOL" "$AB" "" 1 get k0
stop_server
t_done
