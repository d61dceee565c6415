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
# BALLAST_BENCH_DEPTH (32), BALLAST_BENCH_ROUNDS (6: paired spill rounds;
# keep it even so that each side goes first as often).
# Exit status is 0 when everything ran (missing targets are reported, not
# fatal: the numbers depend on the machine).
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
# The disk is shared with whatever else runs on the machine and its speed
# drifts from second to second, so the two sides are measured in pairs,
# phase by phase: in each round both write a fresh, preallocated file of
# $SIZE in the same directory (ours through the tier, fio with
# --fallocate=native), then both read their file back; the side that goes
# first alternates from round to round (the phase after another one's
# writes is the slower one on a virtual disk, so an even number of rounds
# gives each side the same share). Each written file is fsynced after its
# timed write and the removed files' discards are synced away between
# rounds, none of it timed. Each round gives one ratio per
# direction; the figure is the median over the rounds, with the lowest and
# highest as the spread. Both sides use io_uring with O_DIRECT (so nothing
# comes from the page cache; the device's own counters around every read
# phase are printed to show the bytes really came off the disk), the same
# block size and queue depth, and no timed figure includes a sync.
ROUNDS=${BALLAST_BENCH_ROUNDS:-6}
have_fio=0; command -v fio >/dev/null && have_fio=1
# stats V... -> "median min max" (n/a entries dropped)
stats() { /usr/bin/python3 -c "
import statistics, sys
v = [float(x) for x in sys.argv[1:] if x != 'n/a']
f = '%.1f' if max(v or [0]) > 10 else '%.3f'
print(' '.join(f % x for x in (statistics.median(v), min(v), max(v))) if v else 'n/a n/a n/a')" "$@"; }
# dev_read -> bytes read so far by the block device under $W (-1: none)
dev_read() { /usr/bin/python3 -c "
import os, sys
d = os.stat(sys.argv[1]).st_dev
try: print(int(open('/sys/dev/block/%d:%d/stat' % (os.major(d), os.minor(d))).read().split()[2]) * 512)
except Exception: print(-1)" "$W"; }
# fio_phase rw file: sets X=(MB/s device_MB) (10^6 bytes; n/a, -1 when unknown)
fio_phase() {
    local r0 r1 out
    r0=$(dev_read)
    out=$(fio --name=bench --filename="$2" --ioengine=io_uring --direct=1 --rw="$1" --bs="$BLOCK" \
        --iodepth="$DEPTH" --size="$SIZE" --fallocate=native --end_fsync=0 ${FIO_EXTRA:-} --output-format=json 2> "$W/fio.err" |
        /usr/bin/python3 -c "
import json, sys
j = json.load(sys.stdin)['jobs'][0]
print('%.1f' % (j['$1']['bw_bytes'] / 1e6))" 2>/dev/null) || out=n/a
    r1=$(dev_read)
    [ "$out" = n/a ] && { echo "fio failed:"; tail -3 "$W/fio.err"; }
    # Untimed, as bench_spill's fdatasync after its writes: neither side
    # leaves dirty data behind for the next phase to pay for.
    [ "$1" = write ] && sync "$2"
    X=("$out" "$([ "$r0" -ge 0 ] && echo $(( (r1 - r0) / 1000000 )) || echo -1)")
}
# ours_phase write|read dir: sets O=(MB/s device_MB), backend, direct
ours_phase() {
    local o
    if ! o=$("$BS" --spill-dir "$2" --phase "$1" --bytes "$SIZE" --block "$BLOCK" --depth "$DEPTH" \
             --io-backend auto 2>&1); then
        echo "bench_spill failed: $o"; exit 1
    fi
    [ -z "$spill_head" ] && spill_head=$(echo "$o" | head -1) && echo "$spill_head"
    o=$(echo "$o" | grep '^RESULT bench_spill phase=')
    backend=$(kv "$o" backend); direct=$(kv "$o" direct)
    O=("$(kv "$o" mbps)" "$(kv "$o" dev_mb)")
}
pair() { # phase dir file round: both sides, in the round's order
    if [ $(($4 % 2)) = 1 ]; then
        ours_phase "$1" "$2"; X=(n/a -1); [ $have_fio = 1 ] && fio_phase "$1" "$3"
    else
        X=(n/a -1); [ $have_fio = 1 ] && fio_phase "$1" "$3"; ours_phase "$1" "$2"
    fi
}
ratio_or_na() { if [ "$1" = n/a ] || [ "$2" = n/a ]; then echo n/a; else ratio "$1" "$2"; fi; }
size_mb=$(( $(numfmt --from=iec "$SIZE") / 1000000 ))
qws=(); qrs=(); sws=(); srs=(); fws=(); frs=(); fxs=(); backend=?; direct=?; spill_head=; cache_note=
for round in $(seq 1 "$ROUNDS"); do
    d="$W/spill-$round"; f="$W/fio-$round.dat"
    pair write "$d" "$f" "$round"; ow=("${O[@]}"); xw=("${X[@]}")
    pair read "$d" "$f" "$round"; or=("${O[@]}"); xr=("${X[@]}")
    # Reference only (no target): fio with registered buffers, as the tier
    # registers the pool, reading the same file once more.
    if [ $have_fio = 1 ]; then FIO_EXTRA=--fixedbufs fio_phase read "$f"; fxs+=("${X[0]}"); fi
    rm -rf "$d" "$f"
    sync -f "$W" # the discards of the removed files happen here, not in the next round
    sws+=("${ow[0]}"); srs+=("${or[0]}"); fws+=("${xw[0]}"); frs+=("${xr[0]}")
    qws+=("$(ratio_or_na "${ow[0]}" "${xw[0]}")"); qrs+=("$(ratio_or_na "${or[0]}" "${xr[0]}")")
    for v in "${or[1]}" "${xr[1]}"; do
        [ "$v" -ge 0 ] && [ "$v" -lt $((size_mb * 9 / 10)) ] &&
            cache_note="note: a read phase moved less than $SIZE off the device (some of it came from a cache)"
    done
    echo "round $round ($([ $((round % 2)) = 1 ] && echo "ours first" || echo "fio first")):" \
         "write ours ${ow[0]} fio ${xw[0]} MB/s (${qws[-1]}); read ours ${or[0]} fio ${xr[0]} MB/s (${qrs[-1]});" \
         "device read ours ${or[1]} fio ${xr[1]} MB; fio --fixedbufs read ${fxs[-1]:-n/a} MB/s"
done
[ -n "$cache_note" ] && echo "$cache_note"
read -r qw qw_lo qw_hi <<< "$(stats "${qws[@]}")"
read -r qr qr_lo qr_hi <<< "$(stats "${qrs[@]}")"
read -r sw _ _ <<< "$(stats "${sws[@]}")"; read -r sr _ _ <<< "$(stats "${srs[@]}")"
read -r fio_w _ _ <<< "$(stats "${fws[@]}")"; read -r fio_r _ _ <<< "$(stats "${frs[@]}")"
read -r fio_rx fio_rx_lo fio_rx_hi <<< "$(stats "${fxs[@]:-n/a}")"

# ---- table ----
m64=$(kv "$r64" memcpy_gbps); p64=$(kv "$r64" pool_gbps); q64=$(kv "$r64" ratio)
m1=$(kv "$r1" memcpy_gbps); p1=$(kv "$r1" pool_gbps); q1=$(kv "$r1" ratio)
echo
echo "ballastd benchmark ($(nproc) CPUs; spill dir $DIR, $SIZE, block $BLOCK, depth $DEPTH; tier backend $backend, O_DIRECT $direct;"
echo "  spill: median of $ROUNDS paired rounds, MB/s medians, ratio median [lowest, highest])"
printf '  %-40s %14s %14s %8s  %s\n' "measure" "ballastd" "baseline" "ratio" "target >= 0.9"
printf '  %-40s %11s GB/s %9s GB/s %8s  %s\n' "put+get 64 MiB blob vs memcpy" "$p64" "$m64" "$q64" "$(verdict "$q64" 0.9)"
printf '  %-40s %11s GB/s %9s GB/s %8s  %s\n' "put+get 1 MiB blob vs memcpy" "$p1" "$m1" "$q1" "(small blobs: 4 ring trips)"
printf '  %-40s %11s MB/s %9s MB/s %8s  %s [%s, %s]\n' "spill write vs fio (io_uring, direct)" "$sw" "$fio_w" "$qw" "$(verdict "$qw" 0.9)" "$qw_lo" "$qw_hi"
printf '  %-40s %11s MB/s %9s MB/s %8s  %s [%s, %s]\n' "spill read-back vs fio (io_uring, direct)" "$sr" "$fio_r" "$qr" "$(verdict "$qr" 0.9)" "$qr_lo" "$qr_hi"
printf '  %-40s %11s MB/s %9s MB/s %8s  %s\n' "  reference: fio --fixedbufs read" "$sr" "$fio_rx" "$(ratio_or_na "$sr" "$fio_rx")" "(no target; fio runs $fio_rx_lo..$fio_rx_hi)"
printf '  %-40s p50 %7s us   p99 %7s us\n' "ring round trip (NOP)" "$(kv "$lat" ring_p50_us)" "$(kv "$lat" ring_p99_us)"
printf '  %-40s p50 %7s us   p99 %7s us\n' "control RPC (Heartbeat, unix socket)" "$(kv "$lat" rpc_p50_us)" "$(kv "$lat" rpc_p99_us)"
echo "RATIO put+get 64 MiB through the shared pool / memcpy $q64 (target 0.9; $p64 vs $m64 GB/s)"
echo "RATIO put+get 1 MiB through the shared pool / memcpy $q1 ($p1 vs $m1 GB/s)"
echo "RATIO spill write ballastd/fio $qw median of $ROUNDS paired rounds, spread $qw_lo..$qw_hi (target 0.9; medians $sw vs $fio_w MB/s, io_uring O_DIRECT bs $BLOCK depth $DEPTH size $SIZE)"
echo "RATIO spill read-back ballastd/fio $qr median of $ROUNDS paired rounds, spread $qr_lo..$qr_hi (target 0.9; medians $sr vs $fio_r MB/s)"
echo "RATIO ring round trip p50 $(kv "$lat" ring_p50_us) us p99 $(kv "$lat" ring_p99_us) us; control RPC p50 $(kv "$lat" rpc_p50_us) us p99 $(kv "$lat" rpc_p99_us) us (latency, no baseline)"
