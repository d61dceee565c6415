#!/usr/bin/env bash
# tests/bench/offload.sh: ballastd against its baselines, side by side in one
# run on this machine:
#   1. put+get through the shared pool vs memcpy of the same bytes
#      (bench_offload; 64 MiB and 1 MiB blobs)                  target >= 0.9
#   2. spill write and read-back through the NVMe tier (bench_spill) vs fio
#      (io_uring engine, O_DIRECT, same block size, depth, size, directory)
#                                                                target >= 0.9
#   3. ring round-trip latency (NOP) and control RPC latency (Heartbeat over
#      the Unix socket), p50 and p99
# Settings: BALLAST_BENCH_DIR (spill directory, default /tmp: put it on the
# NVMe to measure), BALLAST_BENCH_SPILL_BYTES (1G), BALLAST_BENCH_BLOCK (1M),
# BALLAST_BENCH_DEPTH (32), BALLAST_BENCH_ROUNDS (2). Exit status is 0 when everything ran (missing
# targets are reported, not fatal: the numbers depend on the machine).
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
BIN=$BUILD/bin
BALLASTD=$BIN/ballastd
BO=$BUILD/tests/bench/bench_offload
BS=$BUILD/tests/bench/bench_spill
DIR=${BALLAST_BENCH_DIR:-/tmp}
SIZE=${BALLAST_BENCH_SPILL_BYTES:-1G}
BLOCK=${BALLAST_BENCH_BLOCK:-1M}
DEPTH=${BALLAST_BENCH_DEPTH:-32}
for b in "$BALLASTD" "$BO" "$BS"; do [ -x "$b" ] || { echo "offload bench: $b not built (run make)"; exit 1; }; done
W=$(mktemp -d "$DIR/ballast-bench.XXXXXX")
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT

kv() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
ratio() { /usr/bin/python3 -c "a,b=float('$1'),float('$2'); print('%.3f' % (a/b) if b > 0 else 'n/a')"; }
verdict() { /usr/bin/python3 -c "r='$1'; print('n/a' if r=='n/a' else ('ok' if float(r) >= $2 else 'BELOW TARGET'))"; }

# ---- 1 + 3: shared pool and latency ----
"$BALLASTD" --socket "$W/b.sock" --pool-bytes 512M --port-file "$W/ports" --log-level warn > "$W/ballastd.log" 2>&1 &
PID=$!
for i in $(seq 1 100); do [ -s "$W/ports" ] && break; sleep 0.05; done
[ -s "$W/ports" ] || { echo "ballastd did not start:"; cat "$W/ballastd.log"; exit 1; }
out64=$("$BO" --addr "unix:$W/b.sock" --blob 64M --iters 10 --lat-iters 5000) || { echo "$out64"; exit 1; }
out1=$("$BO" --addr "unix:$W/b.sock" --blob 1M --iters 200 --lat-iters 10) || { echo "$out1"; exit 1; }
echo "$out64" | grep -v '^RESULT'
echo "$out1" | grep -v '^RESULT\|round trip\|control RPC'
kill -TERM $PID; wait $PID; PID=
r64=$(echo "$out64" | grep '^RESULT bench_offload ')
r1=$(echo "$out1" | grep '^RESULT bench_offload ')
lat=$(echo "$out64" | grep '^RESULT bench_offload_lat')

# ---- 2: spill vs fio ----
# Two rounds, alternating ours and fio, best of each: the disk is shared
# with whatever else runs on the machine.
ROUNDS=${BALLAST_BENCH_ROUNDS:-2}
have_fio=0; command -v fio >/dev/null && have_fio=1
best() { /usr/bin/python3 -c "import sys; v=[float(x) for x in sys.argv[1:] if x != 'n/a']; print('%.1f' % max(v) if v else 'n/a')" "$@"; }
fio_mbps() { # rw -> MB/s (10^6 bytes/s)
    fio --name=bench --filename="$W/fio.dat" --ioengine=io_uring --direct=1 --rw="$1" --bs="$BLOCK" \
        --iodepth="$DEPTH" --size="$SIZE" --output-format=json 2> "$W/fio.err" | /usr/bin/python3 -c "
import json, sys
j = json.load(sys.stdin)['jobs'][0]
k = 'write' if '$1' == 'write' else 'read'
print('%.1f' % (j[k]['bw_bytes'] / 1e6))" 2>/dev/null || echo n/a
}
sws=(); srs=(); fws=(); frs=(); backend=?; direct=?
for round in $(seq 1 "$ROUNDS"); do
    spill=$("$BS" --dir "$W" --bytes "$SIZE" --block "$BLOCK" --depth "$DEPTH" --io-backend auto 2>&1) || { echo "$spill"; exit 1; }
    [ "$round" = 1 ] && echo "$spill" | grep -v '^RESULT'
    rs=$(echo "$spill" | grep '^RESULT bench_spill')
    sws+=("$(kv "$rs" write_mbps)"); srs+=("$(kv "$rs" read_mbps)")
    backend=$(kv "$rs" backend); direct=$(kv "$rs" direct)
    if [ $have_fio = 1 ]; then
        fws+=("$(fio_mbps write)"); frs+=("$(fio_mbps read)")
        rm -f "$W/fio.dat"
        [ "${fws[-1]}" = n/a ] && { echo "fio failed:"; tail -3 "$W/fio.err"; }
    fi
    echo "round $round: spill write ${sws[-1]} read ${srs[-1]} MB/s; fio write ${fws[-1]:-n/a} read ${frs[-1]:-n/a} MB/s"
done
sw=$(best "${sws[@]}"); sr=$(best "${srs[@]}")
fio_w=$(best "${fws[@]:-n/a}"); fio_r=$(best "${frs[@]:-n/a}")

# ---- table ----
m64=$(kv "$r64" memcpy_gbps); p64=$(kv "$r64" pool_gbps); q64=$(kv "$r64" ratio)
m1=$(kv "$r1" memcpy_gbps); p1=$(kv "$r1" pool_gbps); q1=$(kv "$r1" ratio)
qw=n/a; qr=n/a
[ "$fio_w" != n/a ] && qw=$(ratio "$sw" "$fio_w")
[ "$fio_r" != n/a ] && qr=$(ratio "$sr" "$fio_r")
echo
echo "ballastd benchmark ($(nproc) CPUs; spill dir $DIR, $SIZE, block $BLOCK, depth $DEPTH; tier backend $backend, O_DIRECT $direct)"
printf '  %-40s %14s %14s %8s  %s\n' "measure" "ballastd" "baseline" "ratio" "target >= 0.9"
printf '  %-40s %11s GB/s %9s GB/s %8s  %s\n' "put+get 64 MiB blob vs memcpy" "$p64" "$m64" "$q64" "$(verdict "$q64" 0.9)"
printf '  %-40s %11s GB/s %9s GB/s %8s  %s\n' "put+get 1 MiB blob vs memcpy" "$p1" "$m1" "$q1" "(small blobs: 4 ring trips)"
printf '  %-40s %11s MB/s %9s MB/s %8s  %s\n' "spill write vs fio (io_uring, direct)" "$sw" "$fio_w" "$qw" "$(verdict "$qw" 0.9)"
printf '  %-40s %11s MB/s %9s MB/s %8s  %s\n' "spill read-back vs fio (io_uring, direct)" "$sr" "$fio_r" "$qr" "$(verdict "$qr" 0.9)"
printf '  %-40s p50 %7s us   p99 %7s us\n' "ring round trip (NOP)" "$(kv "$lat" ring_p50_us)" "$(kv "$lat" ring_p99_us)"
printf '  %-40s p50 %7s us   p99 %7s us\n' "control RPC (Heartbeat, unix socket)" "$(kv "$lat" rpc_p50_us)" "$(kv "$lat" rpc_p99_us)"
echo "RATIO put+get 64 MiB through the shared pool / memcpy $q64 (target 0.9; $p64 vs $m64 GB/s)"
echo "RATIO put+get 1 MiB through the shared pool / memcpy $q1 ($p1 vs $m1 GB/s)"
echo "RATIO spill write ballastd/fio $qw (target 0.9; $sw vs $fio_w MB/s, io_uring O_DIRECT bs $BLOCK depth $DEPTH)"
echo "RATIO spill read-back ballastd/fio $qr (target 0.9; $sr vs $fio_r MB/s)"
echo "RATIO ring round trip p50 $(kv "$lat" ring_p50_us) us p99 $(kv "$lat" ring_p99_us) us; control RPC p50 $(kv "$lat" rpc_p50_us) us p99 $(kv "$lat" rpc_p99_us) us (latency, no baseline)"
