#!/usr/bin/env bash
# ballastd_stress.sh: 4 client processes push 2 GiB of blobs through a
# 256 MiB pool (live data well above the pool, so blobs spill to the NVMe
# tier and come back), random put/get/prefetch/free/pin, every byte checked.
# Then the same client test in remote mode over TCP on loopback (bytes in
# gRPC messages), same volume. BALLAST_STRESS_BYTES and
# BALLAST_STRESS_REMOTE_BYTES override the volumes (under sanitizers the
# defaults drop to 512M and 256M).
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/ballastd.lib"

for b in "$BALLASTD" "$BALLAST" "$STRESS"; do
    [ -x "$b" ] || { t_skip "ballastd stress" "$b not built"; t_done; exit 0; }
done
D=$(t_tmpdir)
mkdir -p "$D/spill"
TOTAL=${BALLAST_STRESS_BYTES:-2G}
RTOTAL=${BALLAST_STRESS_REMOTE_BYTES:-2G}
if [ -n "${BALLAST_SAN:-}" ]; then # sanitizer builds run 5-20x slower: same test, smaller volume
    TOTAL=${BALLAST_STRESS_BYTES:-512M}; RTOTAL=${BALLAST_STRESS_REMOTE_BYTES:-256M}
fi
if ! bd_start A "$D" --pool-bytes 256M --spill-dir "$D/spill" --spill-bytes 3G --spill-file-bytes 256M \
        --lease 20s --listen 127.0.0.1:0 --evict-wait 20s; then
    t_fail "ballastd starts" "$(tail -5 "$D/A.log")"; t_done; exit 1
fi
SA=$(bd_sock A)
t_ok "ballastd: 256 MiB pool, spill in $D/spill, TCP port $BD_LISTEN_A"

start=$(date +%s)
if "$STRESS" stress --addr "unix:$SA" --clients 4 --total-bytes "$TOTAL" --live-bytes 128M --max-blob 4M --seed 11 > "$D/shm.out" 2>&1; then
    t_ok "shared memory: 4 clients pushed $TOTAL through the 256 MiB pool, every byte verified ($(( $(date +%s) - start ))s)"
else
    t_fail "shared-memory stress" "$(tail -8 "$D/shm.out")"
fi
sed 's/^/# /' "$D/shm.out"
r=$(bd_json A 'd["evictions"] > 0 and d["spill_writes"] > 0 and d["spill_reads"] > 0')
[ "$r" = True ] && t_ok "blobs spilled and came back ($(bd_json A '"%d evictions, %d spill writes, %d reads" % (d["evictions"], d["spill_writes"], d["spill_reads"])'))" \
    || t_fail "spill happened" "$(bd_json A 'd')"
r=$(bd_json A 'd["blobs"] == 0 and d["pool_used_bytes"] == 0 and d["sessions_open"] == 0')
[ "$r" = True ] && t_ok "afterwards the pool is empty and no session is left" || t_fail "pool empty" "$(bd_json A 'd')"

start=$(date +%s)
if "$STRESS" stress --addr "127.0.0.1:$BD_LISTEN_A" --remote --clients 4 --total-bytes "$RTOTAL" --live-bytes 128M --max-blob 4M --seed 12 > "$D/remote.out" 2>&1; then
    t_ok "remote mode over TCP loopback: 4 clients pushed $RTOTAL, every byte verified ($(( $(date +%s) - start ))s)"
else
    t_fail "remote-mode stress" "$(tail -8 "$D/remote.out")"
fi
sed 's/^/# /' "$D/remote.out"
r=$(bd_json A 'd["blobs"] == 0 and d["pool_used_bytes"] == 0')
[ "$r" = True ] && t_ok "afterwards the pool is empty again" || t_fail "pool empty after remote" "$(bd_json A 'd')"

kill -TERM "$(bd_pid A)"; rc=0; bd_wait "$(bd_pid A)" || rc=$?
[ $rc -eq 0 ] && t_ok "ballastd exits 0 on SIGTERM" || t_fail "SIGTERM exit" "rc $rc"

# the pread/pwrite fallback backend (what runs where io_uring is refused)
mkdir -p "$D/spill-t"
if bd_start T "$D" --pool-bytes 64M --spill-dir "$D/spill-t" --spill-bytes 1G --spill-file-bytes 128M \
        --io-backend threads --lease 20s --evict-wait 20s; then
    if "$STRESS" stress --addr "unix:$(bd_sock T)" --clients 2 --total-bytes 256M --live-bytes 64M --seed 13 > "$D/threads.out" 2>&1 &&
       [ "$(bd_json T 'd["io_backend"] == "threads" and d["evictions"] > 0 and d["spill_reads"] > 0')" = True ]; then
        t_ok "thread-pool spill backend: 256 MiB through a 64 MiB pool, every byte verified"
    else
        t_fail "threads backend stress" "$(tail -5 "$D/threads.out"; bd_json T 'd')"
    fi
    kill -TERM "$(bd_pid T)"; bd_wait "$(bd_pid T)"
else
    t_fail "ballastd with --io-backend threads starts" "$(tail -3 "$D/T.log")"
fi
t_done
