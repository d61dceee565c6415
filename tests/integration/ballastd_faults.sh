#!/usr/bin/env bash
# ballastd_faults.sh: bad input and faults against the real binaries:
# bad ring entries and bad RPCs (each fails alone), quota, kill -9 of a
# client (memory back at lease end, others untouched), kill -9 of ballastd
# during persistent puts (acked blobs exact after restart, the rest missing),
# a second instance on the same socket, SIGTERM drain, health, token,
# `ballast status --json` figures and `ballast store` round trips.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/ballastd.lib"

for b in "$BALLASTD" "$BALLAST" "$STRESS"; do
    [ -x "$b" ] || { t_skip "ballastd faults" "$b not built"; t_done; exit 0; }
done
D=$(t_tmpdir)
mkdir -p "$D/spill" "$D/spill2"
POOL=64M
COMMON=(--pool-bytes $POOL --spill-dir "$D/spill" --spill-bytes 512M --spill-file-bytes 64M --lease 1s
        --session-quota 32M --io-backend auto --health-port 0)

if ! bd_start A "$D" "${COMMON[@]}"; then
    t_fail "ballastd starts" "see $D/A.log"; t_done; exit 1
fi
t_ok "ballastd starts (pid $(bd_pid A))"
SA=$(bd_sock A)

# ---- health ----
t_check "health port answers SERVING" "$STRESS" health --addr "127.0.0.1:$BD_HEALTH_A"

# ---- bad ring entries and bad RPCs ----
t_check "bad ring entries each fail with their status; sessions keep working" "$STRESS" badring --addr "unix:$SA"
t_check "bad RPCs each fail with their status; the service keeps serving" "$STRESS" badrpc --addr "unix:$SA" --quota 32M

# ---- quota ----
t_check "over quota: RESOURCE_EXHAUSTED for that session only" "$STRESS" quota --addr "unix:$SA" --quota 1M
n=$(bd_json A 'd["quota_refusals"]')
[ "$n" -ge 1 ] && t_ok "status counts quota refusals ($n)" || t_fail "status counts quota refusals" "got $n"

# ---- second instance on the same socket ----
t_expect_fail "a second ballastd on the same socket refuses to start" "already serves|another ballastd" \
    "$BALLASTD" --socket "$SA" --pool-bytes 8M --port-file "$D/second.ports"
t_check "the first instance still serves after that" "$BALLAST" status --socket "$SA"

# ---- kill -9 of a client ----
base=$(bd_json A 'd["pool_used_bytes"]')
"$STRESS" hold --addr "unix:$SA" --bytes 16M --seed 1 > "$D/holdA.out" 2>&1 &
HA=$!; bd_track $HA
"$STRESS" hold --addr "unix:$SA" --bytes 8M --seed 2 --job other > "$D/holdB.out" 2>&1 &
HB=$!; bd_track $HB
for i in $(seq 1 100); do grep -q held "$D/holdA.out" && grep -q held "$D/holdB.out" && break; sleep 0.05; done
if grep -q held "$D/holdA.out" && grep -q held "$D/holdB.out"; then
    used=$(bd_json A 'd["pool_used_bytes"]')
    exp=$(bd_json A 'd["pool_used_bytes"] - '"$base"' >= 24*2**20')
    [ "$exp" = True ] && t_ok "two holders hold 24 MiB in the pool ($used bytes used)" || t_fail "holders hold memory" "used $used, base $base"
    expired0=$(bd_json A 'd["sessions_expired"]')
    kill -9 $HA; bd_wait $HA
    if bd_wait_json A 'd["sessions_expired"] > '"$expired0"' and d["pool_used_bytes"] - '"$base"' < 9*2**20' 10; then
        t_ok "kill -9 of a client: its 16 MiB return to the pool when its lease ends"
    else
        t_fail "kill -9 of a client returns memory" "$(bd_json A 'd["pool_used_bytes"], d["sessions_expired"]')"
    fi
    # the other holder's session is untouched: still open, still charged 8 MiB
    r=$(bd_json A '[s["used_bytes"] for s in d["sessions"] if s["job"] == "other"] == [8*2**20]')
    [ "$r" = True ] && t_ok "the other session is untouched (8 MiB, still open)" || t_fail "other session untouched" "$(bd_json A 'd["sessions"]')"
else
    t_fail "holders start" "$(cat "$D/holdA.out" "$D/holdB.out")"
fi
kill -9 $HB 2>/dev/null; bd_wait $HB

# ---- ballast store round trip and status figures on a fresh instance ----
if bd_start S "$D" --pool-bytes 64M --lease 5s; then
    SS=$(bd_sock S)
    head -c 3000001 /dev/urandom > "$D/blob.in"
    t_check "ballast store put" "$BALLAST" store put --socket "$SS" --job files --rank 2 --kind param --index 5 --step 9 --file "$D/blob.in"
    head -c 5000 /dev/urandom > "$D/small.in"
    t_check "ballast store put (remote mode)" "$BALLAST" store put --socket "$SS" --remote --job files --index 6 --file "$D/small.in"
    ls_out=$("$BALLAST" store ls --socket "$SS" --job files 2>&1)
    if echo "$ls_out" | grep -Eq '^files +2 +param +5 +9 +3000001 ' && echo "$ls_out" | grep -Eq '^files +0 +other +6 +0 +5000 '; then
        t_ok "ballast store ls lists both blobs with their keys and sizes"
    else
        t_fail "ballast store ls" "$ls_out"
    fi
    "$BALLAST" store get --socket "$SS" --job files --rank 2 --kind param --index 5 --step 9 --file "$D/blob.out" 2> "$D/get.err"
    cmp -s "$D/blob.in" "$D/blob.out" && t_ok "ballast store get returns the file byte-exact" || t_fail "store get" "$(cat "$D/get.err")"
    "$BALLAST" store get --socket "$SS" --remote --job files --index 6 > "$D/small.out" 2> "$D/get2.err"
    cmp -s "$D/small.in" "$D/small.out" && t_ok "ballast store get to stdout (remote mode) byte-exact" || t_fail "store get stdout" "$(cat "$D/get2.err")"
    # status --json: pool size, used = 4 KiB-rounded sizes, 2 blobs, no open session
    want_used=$(( (3000001 + 4095) / 4096 * 4096 + 8192 ))
    r=$(bd_json S 'd["pool_bytes"] == 64*2**20 and d["pool_used_bytes"] == '"$want_used"' and d["pool_free_bytes"] == 64*2**20 - '"$want_used"' and d["blobs"] == 2 and d["sessions_open"] == 0 and d["persistent_blobs"] == 0 and d["io_backend"] in ("io_uring", "threads", "none")')
    [ "$r" = True ] && t_ok "ballast status --json shows pool 64M, used $want_used, 2 blobs, 0 open sessions" \
        || t_fail "status --json figures" "$("$BALLAST" status --socket "$SS" --json)"
    "$BALLAST" status --socket "$SS" | grep -q "pool .* used" && t_ok "ballast status prints a table" || t_fail "status table" "no pool line"
    t_check "ballast store rm" "$BALLAST" store rm --socket "$SS" --job files --rank 2 --kind param --index 5 --step 9
    t_expect_fail "a removed blob is NOT_FOUND" "NOT_FOUND" "$BALLAST" store get --socket "$SS" --job files --rank 2 --kind param --index 5 --step 9 --file "$D/x"
    t_check "ballast store rm --all releases the job" "$BALLAST" store rm --socket "$SS" --job files --all
    r=$(bd_json S 'd["blobs"] == 0 and d["pool_used_bytes"] == 0')
    [ "$r" = True ] && t_ok "after rm the pool is empty" || t_fail "pool empty after rm" "$(bd_json S 'd')"
    t_expect_fail "ballast store with a bad job name" "invalid" "$BALLAST" store put --socket "$SS" --job 'a b' --file "$D/small.in"
    kill -TERM "$(bd_pid S)"; bd_wait "$(bd_pid S)"
else
    t_fail "second instance for store tests starts" "$(tail -3 "$D/S.log")"
fi
t_expect_fail "ballast status names the socket and suggests starting ballastd when none runs" "is ballastd running" \
    "$BALLAST" status --socket "$D/nothing.sock"

# ---- kill -9 of ballastd during persistent puts ----
rm -f "$D/persist.log"
"$STRESS" persist-writer --addr "unix:$SA" --job ckpt --log "$D/persist.log" --count 400 --seed 7 > "$D/writer.out" 2>&1 &
W=$!; bd_track $W
for i in $(seq 1 200); do [ "$(cat "$D/persist.log" 2>/dev/null | grep -c '^ack')" -ge 25 ] && break; sleep 0.05; done
kill -9 "$(bd_pid A)"; bd_wait "$(bd_pid A)"
bd_wait $W; acks=$(grep -c '^ack' "$D/persist.log")
t_ok "killed ballastd -9 after $acks acknowledged persistent puts"
if grep -q "ballastd at unix:$SA" "$D/writer.out" && grep -Eq "is gone|start it" "$D/writer.out"; then
    t_ok "the client whose ballastd died says so, naming the socket and how to start one"
else
    t_fail "client error when ballastd dies" "$(cat "$D/writer.out")"
fi
if bd_start A "$D" "${COMMON[@]}"; then
    SA=$(bd_sock A)
    t_check "after restart every acknowledged blob is byte-exact, the in-flight one missing or exact" \
        "$STRESS" persist-check --addr "unix:$SA" --job ckpt --log "$D/persist.log" --seed 7
    n=$(bd_json A 'd["persistent_blobs"]')
    [ "$n" -ge "$acks" ] && t_ok "restart recovered $n persistent blobs" || t_fail "persistent blobs recovered" "$n < $acks"
else
    t_fail "ballastd restarts on the same spill dir" "$(tail -5 "$D/A.log")"
fi

# ---- SIGTERM drains and exits 0; persisted blobs survive it ----
rm -f "$D/persist2.log"
"$STRESS" persist-writer --addr "unix:$SA" --job ckpt2 --log "$D/persist2.log" --count 400 --seed 8 > "$D/writer2.out" 2>&1 &
W=$!; bd_track $W
for i in $(seq 1 200); do [ "$(cat "$D/persist2.log" 2>/dev/null | grep -c '^ack')" -ge 10 ] && break; sleep 0.05; done
kill -TERM "$(bd_pid A)"
rc=0; bd_wait "$(bd_pid A)" || rc=$?
[ $rc -eq 0 ] && t_ok "SIGTERM: ballastd drains and exits 0" || t_fail "SIGTERM exit status" "rc $rc; $(tail -5 "$D/A.log")"
grep -q "drained" "$D/A.log" && t_ok "the log says it drained" || t_fail "drain logged" "$(tail -3 "$D/A.log")"
bd_wait $W
acks2=$(grep -c '^ack' "$D/persist2.log")
if bd_start A "$D" "${COMMON[@]}"; then
    SA=$(bd_sock A)
    t_check "after SIGTERM and restart every acknowledged blob is byte-exact" \
        "$STRESS" persist-check --addr "unix:$SA" --job ckpt2 --log "$D/persist2.log" --seed 8
    t_check "Release drops a job's persistent blobs" "$BALLAST" store rm --socket "$SA" --job ckpt --all
    left=$("$BALLAST" store ls --socket "$SA" --job ckpt | tail -n +2 | wc -l)
    kept=$("$BALLAST" store ls --socket "$SA" --job ckpt2 | tail -n +2 | wc -l)
    n=$(bd_json A 'd["persistent_blobs"]')
    if [ "$left" -eq 0 ] && [ "$kept" -ge "$acks2" ] && [ "$n" -eq "$kept" ]; then
        t_ok "after Release(ckpt): no ckpt blob left, the $kept ckpt2 blobs stay"
    else
        t_fail "Release(ckpt)" "left $left, ckpt2 $kept (acked $acks2), persistent $n"
    fi
    kill -INT "$(bd_pid A)"; rc=0; bd_wait "$(bd_pid A)" || rc=$?
    [ $rc -eq 0 ] && t_ok "SIGINT also drains and exits 0" || t_fail "SIGINT exit" "rc $rc"
fi

# ---- the Drain RPC ----
if bd_start DR "$D" --pool-bytes 16M --spill-dir "$D/spill2" --spill-bytes 64M --spill-file-bytes 16M; then
    SD=$(bd_sock DR)
    t_check "persistent put before Drain" "$BALLAST" store put --socket "$SD" --job dj --persistent --file "$D/small.in"
    t_check "Drain RPC" "$STRESS" drain --addr "unix:$SD"
    # Drain finishes: no SIGTERM needed, the service exits 0 by itself and frees its lock
    for _ in $(seq 1 300); do kill -0 "$(bd_pid DR)" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$(bd_pid DR)" 2>/dev/null && kill -9 "$(bd_pid DR)"
    rc=0; bd_wait "$(bd_pid DR)" || rc=$?
    [ $rc -eq 0 ] && t_ok "after the Drain RPC ballastd exits 0 by itself" || t_fail "exit after Drain" "rc $rc; $(tail -3 "$D/DR.log")"
    grep -q "Drain RPC: draining" "$D/DR.log" && grep -q "drained, exiting" "$D/DR.log" &&
        t_ok "the log says the Drain RPC drained it" || t_fail "drain logged" "$(tail -3 "$D/DR.log")"
    if bd_start DR "$D" --pool-bytes 16M --spill-dir "$D/spill2" --spill-bytes 64M --spill-file-bytes 16M; then
        "$BALLAST" store get --socket "$(bd_sock DR)" --job dj --file "$D/dj.out" 2> "$D/dj.err"
        cmp -s "$D/small.in" "$D/dj.out" && t_ok "the persistent blob survives Drain and restart" || t_fail "blob after Drain" "$(cat "$D/dj.err")"
        kill -TERM "$(bd_pid DR)"; bd_wait "$(bd_pid DR)"
    fi
fi

# ---- token ----
echo "s3cret-token" > "$D/token"
if bd_start T "$D" --pool-bytes 16M --token-file "$D/token"; then
    t_check "with --token-file: wrong token -> UNAUTHENTICATED, right token works" \
        "$STRESS" badrpc --addr "unix:$(bd_sock T)" --token s3cret-token
    t_expect_fail "a client without the token is refused with a clear message" "token" \
        "$BALLAST" store put --socket "$(bd_sock T)" --job j --file "$D/small.in"
    kill -TERM "$(bd_pid T)"; bd_wait "$(bd_pid T)"
fi
t_done
