#!/usr/bin/env bash
# ballastd keeps jobs apart: a hostile second job (uid 65534 on the Unix
# socket, and a TCP client over TLS), with and without the token, tries
# every RPC and an fd-socket attach on the first job's session, keys and
# job; none may succeed. A hostile job's client maps every fd it is handed
# (attach, and every segment id it can guess), finds none of the first
# job's bytes, writes garbage over all of it and punches holes in every fd;
# the first job's blobs stay byte-exact. Also:
# socket files 0660 with --socket-group, a token refused over plaintext
# TCP, the job table reusing released slots while ListKeys registers
# nothing, and --metrics-bind defaulting to 127.0.0.1.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/ballastd.lib"
TRUST=$ROOT/$BUILD/tests/integration/offload_trust
D=$(t_tmpdir)
chmod 755 "$D" "$(dirname "$D")"

# a hostile uid: runs as 65534 when we are root (CI), else as ourselves
as_other() {
    if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
        setpriv --reuid 65534 --regid 65534 --clear-groups -- "$@"
    else
        "$@"
    fi
}
OTHER_UID=yes
[ "$(id -u)" = 0 ] && command -v setpriv >/dev/null || OTHER_UID=

SEED=$(( (RANDOM << 16) ^ RANDOM ^ $$ ))
TOKEN="tok-$SEED-$RANDOM"
echo "$TOKEN" > "$D/token"
chmod 644 "$D/token"

# ---- plaintext TCP and the token ----
t_expect_fail "--token-file with a plaintext --listen is refused, naming the fix" "allow-insecure-token" \
    timeout 20 "$BALLASTD" --socket "$D/pt.sock" --pool-bytes 8M --mlock=false --listen 127.0.0.1:0 --token-file "$D/token"
"$BALLASTD" --help 2>&1 | grep -E -- "--metrics-bind" | grep -q "(default: 127.0.0.1)" &&
    t_ok "--metrics-bind defaults to 127.0.0.1" || t_fail "--metrics-bind default" "$("$BALLASTD" --help 2>&1 | grep metrics-bind)"

# ---- TLS certificate for the remote port ----
TLS=
if command -v openssl >/dev/null &&
   openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=localhost" \
       -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
       -keyout "$D/key.pem" -out "$D/cert.pem" >/dev/null 2>&1; then
    chmod 644 "$D/cert.pem"
    TLS=(--listen 127.0.0.1:0 --tls-cert "$D/cert.pem" --tls-key "$D/key.pem")
else
    t_skip "remote mode over TLS" "openssl cannot make a test certificate here"
fi

if bd_start V "$D" --pool-bytes 32M --mlock=false --spill-dir "$D/spillv" --spill-bytes 64M --spill-file-bytes 16M --socket-group nogroup --token-file "$D/token" ${TLS:+"${TLS[@]}"}; then
    SV=$(bd_sock V)
    mode=$(stat -c '%a %G' "$SV"); fmode=$(stat -c '%a %G' "$SV.fd")
    [ "$mode" = "660 nogroup" ] && [ "$fmode" = "660 nogroup" ] &&
        t_ok "socket files are 0660 with --socket-group (control: $mode, fd: $fmode)" ||
        t_fail "socket file modes" "control $mode, fd $fmode"

    "$TRUST" victim --addr "unix:$SV" --job victim --count 24 --seed "$SEED" --token "$TOKEN" \
        --state "$D/v.state" > "$D/victim.out" 2>&1 &
    VPID=$!
    bd_track $VPID
    for _ in $(seq 1 300); do [ -s "$D/v.state" ] && break; sleep 0.1; done
    chmod 644 "$D/v.state" 2>/dev/null
    if [ -s "$D/v.state" ]; then
        "$TRUST" stats --addr "unix:$SV" --state "$D/v.state" --job victim &&
            t_ok "positive control: ballastd's own uid sees the victim's session in Stats" ||
            t_fail "Stats as the service's uid" "victim session not shown"
        run_attack() {  # NAME ADDR TOKEN [as_other]
            local name=$1 addr=$2 tok=$3 wrap=${4:-}
            local rc=0
            BALLAST_TLS_CA="$D/cert.pem" $wrap "$TRUST" attack --addr "$addr" --state "$D/v.state" \
                --job victim --seed "$SEED" --token "$tok" --fd-socket "$SV.fd" > "$D/attack-$name.out" 2>&1 || rc=$?
            local tried
            tried=$(grep -cE '^(refused|SUCCEEDED) ' "$D/attack-$name.out")
            if [ $rc -eq 0 ] && [ "$tried" -ge 80 ]; then
                t_ok "hostile job $name: 0 of $tried attempts succeeded"
            else
                t_fail "hostile job $name" "rc $rc, $tried attempts; $(grep -E '^SUCCEEDED' "$D/attack-$name.out" | head -5) $(tail -2 "$D/attack-$name.out")"
            fi
        }
        if [ -n "$OTHER_UID" ]; then
            run_attack "uid-65534-unix-no-token" "unix:$SV" "" as_other
            run_attack "uid-65534-unix-with-token" "unix:$SV" "$TOKEN" as_other
        else
            t_skip "hostile job as another uid" "needs root and setpriv to run as uid 65534"
        fi
        if [ -n "$TLS" ]; then
            run_attack "tcp-tls-no-token" "127.0.0.1:$BD_LISTEN_V" ""
            run_attack "tcp-tls-with-token" "127.0.0.1:$BD_LISTEN_V" "$TOKEN"
        fi
        # ---- memory: a hostile job maps every fd it is handed ----
        run_memory() {  # NAME [as_other]
            local name=$1 wrap=${2:-}
            local rc=0 t0=$SECONDS
            $wrap "$TRUST" memory --addr "unix:$SV" --state "$D/v.state" --fd-socket "$SV.fd" --job "intruder-$name" \
                --count 24 --seed "$SEED" --token "$TOKEN" > "$D/memory-$name.out" 2>&1 || rc=$?
            if [ $rc -eq 0 ]; then
                t_ok "hostile job's memory ($name, $((SECONDS - t0)) s): $(grep -o 'attached with.*' "$D/memory-$name.out")"
            else
                t_fail "hostile job's memory ($name)" "rc $rc: $(grep -E '^SUCCEEDED' "$D/memory-$name.out" | head -3) $(tail -2 "$D/memory-$name.out")"
            fi
        }
        if [ -n "$OTHER_UID" ]; then run_memory uid-65534 as_other; else run_memory same-uid; fi
        touch "$D/v.state.go"
        rc=0; wait $VPID || rc=$?
        [ $rc -eq 0 ] && t_ok "the victim's 24 blobs are byte-exact after the attacks" ||
            t_fail "victim blobs" "rc $rc: $(tail -3 "$D/victim.out")"
        kill -0 "$(bd_pid V)" 2>/dev/null && t_ok "ballastd is still serving (Drain was refused)" ||
            t_fail "ballastd alive" "$(tail -3 "$D/V.log")"
    else
        t_fail "victim ready" "$(tail -3 "$D/victim.out")"
    fi
    kill -TERM "$(bd_pid V)"; bd_wait "$(bd_pid V)"
fi

# ---- job table: released slots are reused, ListKeys registers nothing ----
if bd_start J "$D" --pool-bytes 16M --mlock=false; then
    t_check "4200 jobs opened, used and released, 4200 unknown jobs listed (table of 4096)" \
        "$TRUST" jobs --addr "unix:$(bd_sock J)" --state "$D/j.state" --count 4200 --seed "$SEED"
    kill -TERM "$(bd_pid J)"; bd_wait "$(bd_pid J)"
fi
# with a manifest: released jobs are not registered again by a restart
if bd_start K "$D" --pool-bytes 16M --mlock=false --spill-dir "$D/spillk" --spill-bytes 64M --spill-file-bytes 16M; then
    "$TRUST" jobs --addr "unix:$(bd_sock K)" --state "$D/k.state" --count 200 --seed "$SEED" >/dev/null
    kill -TERM "$(bd_pid K)"; bd_wait "$(bd_pid K)"
    if bd_start K "$D" --pool-bytes 16M --mlock=false --spill-dir "$D/spillk" --spill-bytes 64M --spill-file-bytes 16M; then
        t_check "after a restart new jobs open and release (released jobs hold no slot)" \
            "$TRUST" jobs --addr "unix:$(bd_sock K)" --state "$D/k.state" --count 20 --seed "$((SEED + 1))"
        kill -TERM "$(bd_pid K)"; bd_wait "$(bd_pid K)"
    fi
fi
# ---- the fd socket serves connections concurrently ----
# 10 clients connect to the fd socket and send nothing; an attach right after
# must not wait behind them (served one at a time, each idle one held the
# acceptor for its 2 s deadline, and the attach timed out).
if bd_start F "$D" --pool-bytes 16M --mlock=false; then
    SF=$(bd_sock F)
    /usr/bin/python3 -c '
import socket, sys, time
held = []
for _ in range(10):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sys.argv[1])
    held.append(s)
open(sys.argv[2], "w").write("held\n")
time.sleep(60)
' "$SF.fd" "$D/idle.ready" &
    IDLE=$!; bd_track $IDLE
    for _ in $(seq 1 200); do [ -s "$D/idle.ready" ] && break; sleep 0.05; done
    head -c $(( 50000 + RANDOM * 4 )) /dev/urandom > "$D/att.in"
    t0=$(date +%s)
    rc=0
    timeout 15 "$BALLAST" store put --socket "$SF" --job attach --index 3 --file "$D/att.in" > "$D/att.log" 2>&1 &&
        timeout 15 "$BALLAST" store get --socket "$SF" --job attach --index 3 --file "$D/att.out" >> "$D/att.log" 2>&1 || rc=$?
    took=$(( $(date +%s) - t0 ))
    if [ -s "$D/idle.ready" ] && [ $rc -eq 0 ] && cmp -s "$D/att.in" "$D/att.out"; then
        t_ok "with 10 idle fd-socket connections held, a put and a get attach and round-trip the bytes (${took} s, bound 15 s each)"
    else
        t_fail "attach behind 10 idle fd-socket connections" "rc $rc after ${took} s: $(tail -3 "$D/att.log")"
    fi
    kill -9 $IDLE 2>/dev/null; bd_wait $IDLE
    kill -TERM "$(bd_pid F)"; bd_wait "$(bd_pid F)"
fi
# ---- --job-quota: cycling sessions does not get around it ----
# every `ballast store put` opens a session, puts and closes it; persistent
# blobs stay charged to their job after their session is gone
if bd_start Q "$D" --pool-bytes 16M --mlock=false --spill-dir "$D/spillq" --spill-bytes 32M --spill-file-bytes 16M \
        --session-quota 1M --job-quota 1M; then
    SQ=$(bd_sock Q)
    sz=$(( 270000 + RANDOM % 30000 ))   # 3 fit in 1 MiB (rounded to 4 KiB), a 4th does not
    head -c $sz /dev/urandom > "$D/q.in"
    n=0
    for i in 1 2 3 4 5 6; do
        # remote mode: its error carries the service's text (a ring completion carries a code)
        "$BALLAST" store put --socket "$SQ" --remote --job cycler --index $i --persistent --file "$D/q.in" 2> "$D/q.err" || break
        n=$((n+1))
    done
    if [ $n -eq 3 ] && grep -q "job cycler quota exceeded.*--job-quota" "$D/q.err"; then
        t_ok "--job-quota 1M: 3 persistent blobs of $sz bytes from 3 sessions, the 4th session's put refused naming it"
    else
        t_fail "--job-quota across sessions" "$n puts; $(cat "$D/q.err")"
    fi
    # shared-memory mode: the ring's refusal names the job quota, not the session's
    if "$BALLAST" store put --socket "$SQ" --job cycler --index 7 --file "$D/q.in" 2> "$D/q.ring.err"; then
        t_fail "--job-quota over the ring" "a 4th blob of the job was taken"
    elif grep -q -- "--job-quota" "$D/q.ring.err" && ! grep -q "session quota" "$D/q.ring.err"; then
        t_ok "--job-quota over the ring: refused naming --job-quota ($(grep -o 'job quota exceeded[^;]*' "$D/q.ring.err" | head -1))"
    else
        t_fail "--job-quota over the ring" "$(cat "$D/q.ring.err")"
    fi
    t_check "another job is not charged for it" "$BALLAST" store put --socket "$SQ" --job bystander --persistent --file "$D/q.in"
    t_check "a removed blob gives its share back" bash -c "'$BALLAST' store rm --socket '$SQ' --job cycler --index 1 &&
        '$BALLAST' store put --socket '$SQ' --job cycler --index 9 --persistent --file '$D/q.in'"
    kill -TERM "$(bd_pid Q)"; bd_wait "$(bd_pid Q)"
fi
t_done
