#!/usr/bin/env bash
# harness.sh: the namespace hosts of hosts.lib are isolated the way real
# hosts are: each has its own /tmp, /dev/shm, /run, hostname and process
# table, reaches the others over the bridge only, shares only the directory
# it is given, and its addresses exist nowhere outside the test; one host's
# processes can be killed all at once; a job that runs over its bound is
# killed and reported.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/hosts.lib"
SH=$(t_tmpdir)
if ! mh_up 3 "$SH"; then t_skip "namespace hosts" "$MH_WHY"; t_done; exit 0; fi
t_ok "3 namespace hosts up"

tok=$RANDOM$RANDOM
mh_exec 0 bash -c "echo $tok > /tmp/x; echo $tok > /dev/shm/x; echo $tok > /run/x; echo $tok > $SH/x"
for d in /tmp /dev/shm /run; do
    if [ "$(mh_exec 0 cat $d/x 2>/dev/null)" = "$tok" ] && ! mh_exec 1 test -e $d/x && [ "$(cat $d/x 2>/dev/null)" != "$tok" ]; then
        t_ok "$d is private to each host"
    else t_fail "$d private" "host 1 or the test sees host 0's $d/x"; fi
done
if [ "$(mh_exec 2 cat "$SH/x")" = "$tok" ] && [ "$(cat "$SH/x")" = "$tok" ]; then
    t_ok "the shared directory is the same on every host and outside"
else t_fail "shared directory" "host 2 reads '$(mh_exec 2 cat "$SH/x" 2>&1)'"; fi
if [ "$(mh_exec 1 hostname)" = mh1 ] && [ "$(hostname)" != mh1 ]; then t_ok "each host has its own hostname"
else t_fail "hostname" "$(mh_exec 1 hostname)"; fi
# TCP across the bridge: host 0 listens, host 2 connects (bounded retries)
mh_bg 0 listen /usr/bin/python3 -c 'import socket,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 7411)); s.listen(1)
s.settimeout(20); c,_=s.accept(); c.sendall(sys.argv[1].encode())' "$tok"
got=$(mh_exec 2 /usr/bin/python3 -c 'import socket,sys,time
for i in range(100):
    try:
        c=socket.create_connection((sys.argv[1], 7411), timeout=2); print(c.recv(64).decode()); break
    except OSError: time.sleep(0.1)' "$(mh_ip 0)")
mh_wait listen 20
if [ "$got" = "$tok" ] && ! ip -br addr | grep -q "$(mh_ip 0)/"; then
    t_ok "host 2 reaches host 0 over TCP at $(mh_ip 0), an address that does not exist outside"
else t_fail "network" "host 2 read '$got' from $(mh_ip 0)"; fi
if [ "$(mh_exec 1 ip -br link | wc -l)" -eq 2 ] && mh_exec 1 ip -br link | grep -q '^eth0@'; then
    t_ok "a host has one link besides lo: its eth0"
else t_fail "links" "$(mh_exec 1 ip -br link)"; fi

# processes: host 0's are invisible to host 1 and die together
mh_bg 0 s1 sleep 300
mh_bg 0 s2 bash -c 'sleep 300 & sleep 300'
for _ in $(seq 50); do [ "$(mh_nprocs 0)" -ge 4 ] && break; sleep 0.1; done
n0=$(mh_nprocs 0) n1=$(mh_nprocs 1)
if [ "$n0" -ge 4 ] && [ "$n1" -eq 0 ]; then t_ok "host 0 runs $n0 processes that host 1 does not see"
else t_fail "PID namespaces" "host 0 runs $n0, host 1 sees $n1"; fi
mh_kill_host 0
rc1=0; mh_wait s1 20 || rc1=$?
rc2=0; mh_wait s2 20 || rc2=$?
if [ $rc1 -eq 137 ] && [ $rc2 -eq 137 ] && [ "$(mh_nprocs 0)" -eq 0 ] && mh_exec 0 true; then
    t_ok "mh_kill_host 0 kills every process of host 0 (exit 137), the host stays up"
else t_fail "mh_kill_host" "exit $rc1 $rc2, $(mh_nprocs 0) left"; fi

mh_bg 2 slow sleep 300
rc=0; mh_wait slow 1 || rc=$?
if [ $rc -eq 124 ]; then t_ok "a job that runs over its bound is killed, status 124"
else t_fail "bounded wait" "status $rc"; fi

held=("${MH_HOLDER[@]}" "$MH_BRIDGE")
mh_down
alive=0
for p in "${held[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
if [ $alive -eq 0 ] && [ "$MH_N" -eq 0 ]; then t_ok "mh_down ends every host and the bridge (${#held[@]} holders)"
else t_fail "mh_down" "holders left"; fi
t_done
