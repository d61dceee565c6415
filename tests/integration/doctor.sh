#!/usr/bin/env bash
# doctor.sh: `ballast doctor` against a real ballastd (Unix socket and
# remote mode with a token) and a real rendezvous server started here. Each
# check's verdict is compared with an independent probe of the same thing
# (statvfs, ulimit, the io_uring_setup syscall, an O_DIRECT write, dlopen of
# the NVIDIA libraries), and the verdicts must flip when the thing is taken
# away: ballastd stopped, the rendezvous stopped, a tiny `ulimit -l`, a
# /dev/shm smaller than asked for, a spill directory that does not exist, a
# wrong token, --backend cuda without a GPU. Exit status: 0 exactly when no
# required check is missing.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/ballastd.lib"
D=$(t_tmpdir)
# the remote-mode token travels over plaintext loopback TCP here
export BALLAST_ALLOW_INSECURE_TOKEN=1
PY=/usr/bin/python3
RDZV=$BIN/ballast-rdzv
for p in "$BALLAST" "$BALLASTD" "$RDZV"; do
    [ -x "$p" ] || { t_fail "built: $(basename "$p")" "missing $p"; t_done; exit 1; }
done
"$BALLAST" doctor --help 2>&1 | grep -q 'not in this build' && { t_fail "ballast doctor is in this build" "it is not"; t_done; exit 1; }

# A clean environment: no MASTER_ADDR or BALLAST_* from the caller.
unset MASTER_ADDR MASTER_PORT BALLAST_OFFLOAD_SOCKET BALLAST_OFFLOAD_REMOTE BALLAST_SPILL_DIR BALLAST_BACKEND BALLAST_SKIP

# Bad flags: exit 2 with the flag named.
"$BALLAST" doctor --skip nonsense > "$D/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "unknown check 'nonsense'" "$D/o" && t_ok "--skip of an unknown check: exit 2 naming it" ||
    t_fail "--skip of an unknown check: exit 2" "rc $rc: $(cat "$D/o")"
"$BALLAST" doctor --min-shm lots > "$D/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q -- '--min-shm' "$D/o" && t_ok "bad --min-shm: exit 2 naming the flag" ||
    t_fail "bad --min-shm: exit 2" "rc $rc: $(cat "$D/o")"

# The services the doctor looks for.
echo "doctor-secret-$RANDOM$RANDOM" > "$D/token"
bd_start local "$D" --pool-bytes 8M --mlock=false || { t_fail "ballastd starts" "see above"; t_done; exit 1; }
bd_start remote "$D" --pool-bytes 8M --mlock=false --listen 127.0.0.1:0 --token-file "$D/token" --allow-insecure-token ||
    { t_fail "ballastd (remote mode) starts" "see above"; t_done; exit 1; }
"$RDZV" --listen 127.0.0.1:0 --port-file "$D/rdzv.port" > "$D/rdzv.log" 2>&1 &
RPID=$!
bd_track $RPID
for _ in $(seq 1 100); do [ -s "$D/rdzv.port" ] && break; sleep 0.05; done
RPORT=$(cat "$D/rdzv.port" 2> /dev/null)
[ -n "$RPORT" ] || { t_fail "ballast-rdzv starts" "$(tail -3 "$D/rdzv.log")"; t_done; exit 1; }
SOCK=$(bd_sock local)
mkdir -p "$D/spill"

# Independent measurements.
SHM_BYTES=$($PY -c 'import os; v = os.statvfs("/dev/shm"); print(v.f_blocks * v.f_frsize)' 2> /dev/null || echo 0)
ML=$(ulimit -l)                     # KiB or "unlimited"
[ "$ML" = unlimited ] && MINML=1M || MINML=${ML}K
probe_uring() {   # io_uring_setup(8, params) through the raw syscall (425 on every Linux arch)
    $PY -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
p = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 8, p)
print("ok" if fd >= 0 else "fail")
if fd >= 0: os.close(fd)'
}
probe_odirect() {   # a page-aligned 4 KiB O_DIRECT write and read-back
    $PY - "$1" <<'PY'
import mmap, os, sys
path = os.path.join(sys.argv[1], ".probe-odirect")
try:
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    try:
        buf = mmap.mmap(-1, 4096)
        buf.write(bytes((i * 7 + 3) & 255 for i in range(4096)))
        ok = os.pwrite(fd, buf, 0) == 4096
        back = mmap.mmap(-1, 4096)
        ok = ok and os.preadv(fd, [back], 0) == 4096 and back[:] == buf[:]
    finally:
        os.close(fd)
        os.unlink(path)
    print("ok" if ok else "fail")
except OSError:
    print("fail")
PY
}
probe_lib() { $PY -c "import ctypes, sys
try: ctypes.CDLL('$1'); print('ok')
except OSError: print('missing')"; }
URING=$(probe_uring)
CUDA_LIB=$(probe_lib libcuda.so.1)
NCCL_LIB=$(probe_lib libnccl.so.2)
echo "# here: /dev/shm $SHM_BYTES bytes, ulimit -l $ML, io_uring $URING, libcuda $CUDA_LIB, libnccl $NCCL_LIB"

# doctor ARGS...: runs `ballast doctor --json` with the test's services;
# leaves the JSON in $D/doc.json and the exit status in $RC.
doctor() {
    "$BALLAST" doctor --json --offload-socket "unix:$SOCK" --master-addr 127.0.0.1 --master-port "$RPORT" \
        --spill-dir "$D/spill" --min-free 1M --min-memlock "$MINML" --min-shm 1M --timeout 2s "$@" \
        > "$D/doc.json" 2> "$D/doc.err"
    RC=$?
}
# st NAME: that check's status in the last run
st() { $PY -c "import json,sys; d=json.load(open('$D/doc.json')); print([c['status'] for c in d['checks'] if c['name']=='$1'][0])" 2> /dev/null || echo "no-json"; }
field() { $PY -c "import json,sys; d=json.load(open('$D/doc.json')); print([c['$2'] for c in d['checks'] if c['name']=='$1'][0])" 2> /dev/null; }
expect() {   # expect NAME STATUS WHAT
    local got; got=$(st "$1")
    [ "$got" = "$2" ] && t_ok "$3: $1 is $2" || t_fail "$3: $1 is $2" "got $got: $(field "$1" detail) $(cat "$D/doc.err")"
}
expect_rc() {   # expect_rc RC WHAT
    [ "$RC" = "$1" ] && t_ok "$2: exit $1" || t_fail "$2: exit $1" "exit $RC: $(head -c 600 "$D/doc.json") $(cat "$D/doc.err")"
}

opened0=$(bd_json local 'd["sessions_opened"]')
doctor
expect_rc 0 "everything present"
$PY - "$D/doc.json" <<'PY' && t_ok "--json: one object, 11 checks of {name, status, required, detail, fix}" || t_fail "--json shape" "$(head -c 400 "$D/doc.json")"
import json, sys
d = json.load(open(sys.argv[1]))
names = [c["name"] for c in d["checks"]]
assert names == ["shm", "memlock", "io_uring", "spill_odirect", "spill_free", "hugepages", "gpu", "nccl",
                 "host_register", "ballastd", "rendezvous"], names
for c in d["checks"]:
    assert set(c) == {"name", "status", "required", "detail", "fix"}, c
    assert c["status"] in ("ok", "missing", "warn", "skipped"), c
    assert c["detail"], c
    if c["status"] == "ok": assert c["fix"] == "", c              # a fix whenever something is wrong
    if c["status"] in ("missing", "warn"): assert c["fix"], c
assert d["ok"] is True and d["missing_required"] == 0
req = {c["name"]: c["required"] for c in d["checks"]}
assert req["shm"] and req["memlock"] and req["ballastd"] and req["rendezvous"], req
assert not req["io_uring"] and not req["spill_odirect"] and not req["gpu"], req     # --backend auto
PY
for c in shm memlock ballastd rendezvous spill_free; do expect $c ok "everything present"; done
opened1=$(bd_json local 'd["sessions_opened"]')
[ "$opened1" = $((opened0 + 1)) ] && t_ok "the ballastd check opened one real session ($opened0 -> $opened1 in ballast status)" ||
    t_fail "the ballastd check opened a session" "sessions_opened $opened0 -> $opened1"
field ballastd detail | grep -q 'shared-memory session' && t_ok "the session used shared memory (fd hand-over)" ||
    t_fail "the session used shared memory" "$(field ballastd detail)"
[ "$URING" = ok ] && want=ok || want=warn
expect io_uring $want "io_uring_setup here says $URING"
[ "$(probe_odirect "$D/spill")" = ok ] && want=ok || want=warn
expect spill_odirect $want "O_DIRECT probe of $D/spill"
[ "$CUDA_LIB" = ok ] || { expect gpu missing "no libcuda.so.1 here"; expect host_register skipped "no GPU here"; }
[ "$NCCL_LIB" = ok ] && expect nccl ok "libnccl.so.2 loads here" || expect nccl missing "no libnccl.so.2 here"

# The text form: one line per check plus the verdict.
"$BALLAST" doctor --offload-socket "unix:$SOCK" --master-addr 127.0.0.1 --master-port "$RPORT" --spill-dir "$D/spill" \
    --min-free 1M --min-memlock "$MINML" --min-shm 1M > "$D/text" 2>&1
n=$(grep -cE '^(ok|missing|warn|skipped) +[a-z_]+ +(required|advisory) ' "$D/text")
[ "$n" = 11 ] && tail -1 "$D/text" | grep -q 'nothing required is missing' && t_ok "text: 11 check lines and the verdict" ||
    t_fail "text: 11 check lines and the verdict" "$(cat "$D/text")"

# /dev/shm smaller than asked for.
if [ "$SHM_BYTES" -gt 0 ]; then
    doctor --min-shm $((SHM_BYTES + 1))
    expect shm missing "--min-shm one byte above /dev/shm's size"; expect_rc 1 "/dev/shm too small"
    field shm fix | grep -q 'shm-size' && t_ok "the shm fix names --shm-size" || t_fail "the shm fix names --shm-size" "$(field shm fix)"
    doctor --min-shm "$SHM_BYTES"
    expect shm ok "--min-shm exactly /dev/shm's size"
else
    t_skip "/dev/shm size flips" "no /dev/shm here"
fi

# A tiny memlock limit.
(ulimit -l 64 && "$BALLAST" doctor --json --skip ballastd,rendezvous --spill-dir "$D/spill" --min-free 1M --min-shm 1M \
    --min-memlock 1M > "$D/doc.json" 2> "$D/doc.err"); RC=$?
expect memlock missing "ulimit -l 64"; expect_rc 1 "ulimit -l 64"
field memlock detail | grep -q 'RLIMIT_MEMLOCK 64K' && t_ok "the memlock detail says 64K" || t_fail "the memlock detail says 64K" "$(field memlock detail)"

# Spill directories: /dev/shm (a tmpfs: O_DIRECT is refused by kernels before
# 6.6 and accepted since; the doctor must agree with the probe), a missing one.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    [ "$(probe_odirect /dev/shm)" = ok ] && want=ok || want=warn
    doctor --spill-dir /dev/shm
    expect spill_odirect $want "O_DIRECT on the tmpfs /dev/shm (probe: $want)"
    [ "$RC" = 0 ] && t_ok "spill_odirect is advisory: exit 0" || t_fail "spill_odirect is advisory: exit 0" "exit $RC"
fi
doctor --spill-dir "$D/no-such-dir"
expect spill_odirect warn "a spill directory that does not exist"; expect spill_free warn "a spill directory that does not exist"
field spill_odirect detail | grep -q 'No such file' && t_ok "the spill detail names the missing directory" ||
    t_fail "the spill detail names the missing directory" "$(field spill_odirect detail)"
doctor --min-free 1P
expect spill_free warn "--min-free 1P"

# Skips and the backend.
doctor --skip rendezvous,ballastd
expect rendezvous skipped "--skip rendezvous,ballastd"; expect ballastd skipped "--skip rendezvous,ballastd"
doctor --backend cpu
for c in gpu nccl host_register; do expect $c skipped "--backend cpu"; done
if [ "$CUDA_LIB" != ok ]; then
    doctor --backend cuda
    expect gpu missing "--backend cuda without a GPU"; expect_rc 1 "--backend cuda without a GPU"
    [ "$(field gpu required)" = True ] && t_ok "--backend cuda makes gpu required" || t_fail "--backend cuda makes gpu required" "$(field gpu required)"
else
    t_skip "--backend cuda without a GPU" "this machine has libcuda.so.1"
fi
# The address from the environment, as the compose file and the ConfigMap set it.
BALLAST_OFFLOAD_SOCKET="unix:$D/elsewhere.sock" "$BALLAST" doctor --json --skip rendezvous --spill-dir "$D/spill" --min-free 1M \
    --min-memlock "$MINML" --min-shm 1M > "$D/doc.json" 2> "$D/doc.err"; RC=$?
expect ballastd missing "BALLAST_OFFLOAD_SOCKET pointing elsewhere"
MASTER_ADDR=127.0.0.1 MASTER_PORT=$RPORT "$BALLAST" doctor --json --skip ballastd --spill-dir "$D/spill" --min-free 1M \
    --min-memlock "$MINML" --min-shm 1M > "$D/doc.json" 2> "$D/doc.err"; RC=$?
expect rendezvous ok "MASTER_ADDR/MASTER_PORT from the environment"

# Remote mode: health only without a token, a session with the right one,
# refused with a wrong one.
RADDR=127.0.0.1:$BD_LISTEN_remote
doctor --offload-remote "$RADDR"
expect ballastd ok "remote mode without a token"
doctor --offload-remote "$RADDR" --offload-token-file "$D/token"
expect ballastd ok "remote mode with the token"
field ballastd detail | grep -q 'remote session' && t_ok "remote mode: a remote session opened" || t_fail "remote mode: a remote session opened" "$(field ballastd detail)"
echo wrong > "$D/badtoken"
doctor --offload-remote "$RADDR" --offload-token-file "$D/badtoken"
expect ballastd missing "remote mode with a wrong token"; expect_rc 1 "wrong token"

# Take the services away.
kill -TERM "$(bd_pid local)"; bd_wait "$(bd_pid local)"
doctor
expect ballastd missing "ballastd stopped"; expect_rc 1 "ballastd stopped"
field ballastd fix | grep -q 'start ballastd' && t_ok "the ballastd fix says how to start it" || t_fail "the ballastd fix says how to start it" "$(field ballastd fix)"
kill -TERM $RPID; bd_wait $RPID
doctor --skip ballastd
expect rendezvous missing "rendezvous stopped"; expect_rc 1 "rendezvous stopped"

# --wait: an init container that starts before ballastd is ready.
t0=$(date +%s)
"$BALLAST" doctor --json --skip rendezvous --offload-socket "unix:$D/late.sock" --spill-dir "$D/spill" --min-free 1M \
    --min-memlock "$MINML" --min-shm 1M --wait 30s > "$D/doc.json" 2> "$D/wait.err" &
DPID=$!
bd_track $DPID
sleep 2
kill -0 $DPID 2> /dev/null && t_ok "--wait: still waiting while ballastd is absent" || t_fail "--wait: still waiting while ballastd is absent" "exited: $(cat "$D/wait.err")"
bd_start late "$D" --pool-bytes 8M --mlock=false || t_fail "ballastd (late) starts" "see above"
bd_wait $DPID; RC=$?
t1=$(date +%s)
expect_rc 0 "--wait: ballastd came up after $((t1 - t0))s"
expect ballastd ok "--wait"
grep -q 'waiting.*ballastd missing' "$D/wait.err" && t_ok "--wait says what it waits for" || t_fail "--wait says what it waits for" "$(cat "$D/wait.err")"
# hugepages: ok when the pool can get 2 MiB pages of either kind, as the
# detail says; --need-huge-pages (ballastd --huge-pages 2M) warns without
# free reserved ones
HFREE=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
hd=$(field hugepages detail); hs=$(st hugepages)
case "$hd" in *"collapses into transparent huge pages"*) thp=1 ;; *"no transparent huge pages"*|*"no 2 MiB memfd"*) thp=0 ;; *) thp=? ;; esac
if [ "$thp" != "?" ] && { { [ "$thp" = 1 ] || [ "${HFREE:-0}" -gt 0 ]; } && [ "$hs" = ok ] ||
                          { [ "$thp" = 0 ] && [ "${HFREE:-0}" = 0 ] && [ "$hs" = skipped ]; }; }; then
    t_ok "hugepages is $hs: $hd"
else
    t_fail "hugepages status agrees with its detail" "status $hs, HugePages_Free ${HFREE:-none}: $hd"
fi
if [ "${HFREE:-0}" = 0 ]; then
    doctor --need-huge-pages
    if [ "$(st hugepages)" = warn ] && field hugepages fix | grep -q 'vm.nr_hugepages'; then
        t_ok "--need-huge-pages without free reserved huge pages warns, naming vm.nr_hugepages"
    else
        t_fail "--need-huge-pages without free reserved huge pages" "$(st hugepages): $(field hugepages fix)"
    fi
else
    t_skip "--need-huge-pages warning" "$HFREE reserved huge pages are free here"
fi
t_done
