#!/usr/bin/env bash
# tests/bench/offload.sh: ballastd against its baselines, side by side in one
# run on this machine:
#   1. put+get through the shared pool vs memcpy of the same bytes
#      (bench_offload: 1, 16 and 64 MiB blobs, median of A B B A rounds
#      with the lowest and highest), with ballastd pinned to the client's CPU
#      and to another CPU (taskset), both reported       target >= 0.9 at 16
#      and 64 MiB, >= 0.7 at 1 MiB across CPUs
#   2. spill write and read-back through the NVMe tier alone (bench_spill)
#      vs fio (io_uring engine, O_DIRECT, same block size, depth, size,
#      directory); the end-to-end spill through ballastd is offload_spill.sh
#                                                                target >= 0.9
#   3. ring round trip (NOP) vs a bare eventfd ping-pong and the control RPC
#      (Heartbeat over the Unix socket) vs a bare gRPC C-core unary call
#      (tests/lib/bare_peers.c, the peers pinned where ballastd runs), taking
#      turns call by call inside bench_offload, p50 and p99; each launch's
#      ratio is the median of the p50 ratios of 8 blocks, and the figure is
#      the median over 7 launches, with the lowest and highest
#                                                         target p50 <= 1.1x
# Settings: BALLAST_BENCH_DIR (spill directory, default /tmp: put it on the
# NVMe to measure), BALLAST_BENCH_SPILL_BYTES (256M), BALLAST_BENCH_BLOCK (1M),
# BALLAST_BENCH_DEPTH (32), BALLAST_BENCH_ROUNDS (4: paired spill rounds;
# keep it even so that each side goes first as often), BALLAST_BENCH_POOL_ROUNDS
# (9), BALLAST_BENCH_LAT_ITERS (3000), BALLAST_BENCH_LAT_LAUNCHES (7: fresh
# launches of ballastd and the bare peers for the latency figures).
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
SIZE=${BALLAST_BENCH_SPILL_BYTES:-256M}
BLOCK=${BALLAST_BENCH_BLOCK:-1M}
DEPTH=${BALLAST_BENCH_DEPTH:-32}
PROUNDS=${BALLAST_BENCH_POOL_ROUNDS:-9}
LATN=${BALLAST_BENCH_LAT_ITERS:-3000}
LATL=${BALLAST_BENCH_LAT_LAUNCHES:-7}
for b in "$BALLASTD" "$BO" "$BS"; do [ -x "$b" ] || { echo "offload bench: $b not built (run make)"; exit 1; }; done
W=$(mktemp -d "$DIR/ballast-bench.XXXXXX")
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT

kv() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
ratio() { /usr/bin/python3 -c "a,b=float('$1'),float('$2'); print('%.3f' % (a/b) if b > 0 else 'n/a')"; }
verdict() { /usr/bin/python3 -c "r='$1'; print('n/a' if r=='n/a' else ('ok' if float(r) >= $2 else 'BELOW TARGET'))"; }

# ---- 1 + 3: shared pool and latency, per CPU placement ----
# The client runs on CPU 0; ballastd (and the baselines' peer) on CPU 0
# ("same") and on CPU 1 ("cross"). One CPU: only "same" (taskset is not
# used when it is missing).
ncpu=$(nproc)
places=(same); [ "$ncpu" -ge 2 ] && places+=(cross)
command -v taskset >/dev/null || { places=(unpinned); echo "note: taskset missing, nothing pinned"; }
declare -A P
start_bd() { # start ballastd pinned to CPU $1 (-1: not pinned); sets PID
    local pre=(); [ "$1" -ge 0 ] && pre=(taskset -c "$1")
    rm -f "$W/ports"
    "${pre[@]}" "$BALLASTD" --socket "$W/b.sock" --pool-bytes 512M --port-file "$W/ports" --log-level warn > "$W/ballastd.log" 2>&1 &
    PID=$!
    for i in $(seq 1 100); do [ -s "$W/ports" ] && break; sleep 0.05; done
    [ -s "$W/ports" ] || { echo "ballastd did not start:"; cat "$W/ballastd.log"; exit 1; }
}
stop_bd() { kill -TERM $PID; wait $PID; PID=; }
for place in "${places[@]}"; do
    case $place in same) scpu=0 ;; cross) scpu=1 ;; *) scpu=-1 ;; esac
    ccpu=$([ "$scpu" -ge 0 ] && echo 0 || echo -1)
    start_bd "$scpu"
    for blob in 1M 16M 64M; do
        o=$("$BO" --addr "unix:$W/b.sock" --blob $blob --rounds "$PROUNDS" --lat-iters 0 --cpu "$ccpu" \
            --peer-cpu "$scpu") || { echo "$o"; exit 1; }
        echo "[$place] $(echo "$o" | grep -v '^RESULT' | tr '\n' ' ')"
        P[$place,$blob]=$(echo "$o" | grep '^RESULT bench_offload ')
    done
    stop_bd
done
# Latency: each launch of ballastd and of the bare peers lays their code out
# anew (ASLR), and with client and server on one CPU that alone moves the
# ratio from run to run while each run is tight in itself. So the latency
# runs on $LATL fresh launches per placement; the figure is the median of
# the launches' ratios, with the lowest and highest.
for place in "${places[@]}"; do
    case $place in same) scpu=0 ;; cross) scpu=1 ;; *) scpu=-1 ;; esac
    ccpu=$([ "$scpu" -ge 0 ] && echo 0 || echo -1)
    for launch in $(seq 1 "$LATL"); do
        start_bd "$scpu"
        o=$("$BO" --addr "unix:$W/b.sock" --rounds 0 --lat-iters "$LATN" --cpu "$ccpu" --peer-cpu "$scpu" \
            --lat-dir "$W") || { echo "$o"; exit 1; }
        stop_bd
        l=$(echo "$o" | grep '^RESULT bench_offload_lat')
        echo "[$place] launch $launch: ring $(kv "$l" ring_p50_us) vs $(kv "$l" efd_p50_us) us ($(kv "$l" ring_ratio));" \
             "Heartbeat $(kv "$l" rpc_p50_us) vs $(kv "$l" bare_p50_us) us ($(kv "$l" rpc_ratio)) [p50s, ratio over 8 blocks]"
        for k in ring_p50_us ring_p99_us efd_p50_us efd_p99_us ring_ratio rpc_p50_us rpc_p99_us bare_p50_us bare_p99_us rpc_ratio; do
            P[$place,$k]="${P[$place,$k]:-} $(kv "$l" $k)"
        done
    done
done

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
ROUNDS=${BALLAST_BENCH_ROUNDS:-4}
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
echo
echo "ballastd benchmark ($ncpu CPUs; spill dir $DIR, $SIZE, block $BLOCK, depth $DEPTH; tier backend $backend, O_DIRECT $direct;"
echo "  put+get: median of $PROUNDS A B B A rounds [lowest, highest]; spill: median of $ROUNDS paired rounds)"
printf '  %-46s %12s %12s %8s  %s\n' "measure" "ballastd" "baseline" "ratio" "[spread] target"
for place in "${places[@]}"; do
    for blob in 1M 16M 64M; do
        r=${P[$place,$blob]}
        tgt=0.9; [ $blob = 1M ] && tgt=0.7
        printf '  %-46s %7s GB/s %7s GB/s %8s  [%s, %s] %s\n' "put+get $blob, ballastd on $place CPU, vs memcpy" \
            "$(kv "$r" pool_gbps)" "$(kv "$r" memcpy_gbps)" "$(kv "$r" ratio)" "$(kv "$r" lo)" "$(kv "$r" hi)" \
            "$([ $place = cross ] || [ $blob != 1M ] && verdict "$(kv "$r" ratio)" $tgt || echo '(target across CPUs)')"
    done
done
printf '  %-46s %7s MB/s %7s MB/s %8s  [%s, %s] %s\n' "spill write (tier alone) vs fio" "$sw" "$fio_w" "$qw" "$qw_lo" "$qw_hi" "$(verdict "$qw" 0.9)"
printf '  %-46s %7s MB/s %7s MB/s %8s  [%s, %s] %s\n' "spill read-back (tier alone) vs fio" "$sr" "$fio_r" "$qr" "$qr_lo" "$qr_hi" "$(verdict "$qr" 0.9)"
printf '  %-46s %7s MB/s %7s MB/s %8s  (no target; fio runs %s..%s)\n' "  reference: fio --fixedbufs read" "$sr" "$fio_rx" "$(ratio_or_na "$sr" "$fio_rx")" "$fio_rx_lo" "$fio_rx_hi"
above() { /usr/bin/python3 -c "print('ok' if float('$1') <= 1.1 else 'ABOVE TARGET 1.1')"; }
# lat place key -> "median min max" over the launches
lat() { stats ${P[$1,$2]}; }
for place in "${places[@]}"; do
    read -r rr rr_lo rr_hi <<< "$(lat $place ring_ratio)"; read -r hr hr_lo hr_hi <<< "$(lat $place rpc_ratio)"
    printf '  %-46s p50 %6s us vs %6s us %6s  [%s, %s] (p99 %s vs %s) %s\n' "ring round trip vs bare eventfd, $place CPU" \
        "$(lat $place ring_p50_us | cut -d' ' -f1)" "$(lat $place efd_p50_us | cut -d' ' -f1)" "$rr" "$rr_lo" "$rr_hi" \
        "$(lat $place ring_p99_us | cut -d' ' -f1)" "$(lat $place efd_p99_us | cut -d' ' -f1)" "$(above "$rr")"
    printf '  %-46s p50 %6s us vs %6s us %6s  [%s, %s] (p99 %s vs %s) %s\n' "Heartbeat RPC vs bare gRPC unary, $place CPU" \
        "$(lat $place rpc_p50_us | cut -d' ' -f1)" "$(lat $place bare_p50_us | cut -d' ' -f1)" "$hr" "$hr_lo" "$hr_hi" \
        "$(lat $place rpc_p99_us | cut -d' ' -f1)" "$(lat $place bare_p99_us | cut -d' ' -f1)" "$(above "$hr")"
done
for place in "${places[@]}"; do
    read -r rr rr_lo rr_hi <<< "$(lat $place ring_ratio)"; read -r hr hr_lo hr_hi <<< "$(lat $place rpc_ratio)"
    echo "RATIO ring round trip p50 / bare eventfd ping-pong, ballastd on $place CPU $rr median of $LATL launches (each the median of 8 interleaved blocks), spread $rr_lo..$rr_hi (target <= 1.1; $(lat $place ring_p50_us | cut -d' ' -f1) vs $(lat $place efd_p50_us | cut -d' ' -f1) us)"
    echo "RATIO Heartbeat p50 / bare gRPC C-core unary call, $place CPU $hr median of $LATL launches (each the median of 8 interleaved blocks), spread $hr_lo..$hr_hi (target <= 1.1; $(lat $place rpc_p50_us | cut -d' ' -f1) vs $(lat $place bare_p50_us | cut -d' ' -f1) us)"
    for blob in 1M 16M 64M; do
        r=${P[$place,$blob]}
        echo "RATIO put+get $blob through the shared pool / memcpy, ballastd on $place CPU $(kv "$r" ratio) median of $PROUNDS A B B A rounds, spread $(kv "$r" lo)..$(kv "$r" hi) (target $([ $blob = 1M ] && echo '0.7 across CPUs' || echo 0.9); $(kv "$r" pool_gbps) vs $(kv "$r" memcpy_gbps) GB/s)"
    done
done
echo "RATIO spill write (tier alone) ballastd/fio $qw median of $ROUNDS paired rounds, spread $qw_lo..$qw_hi (target 0.9; medians $sw vs $fio_w MB/s, io_uring O_DIRECT bs $BLOCK depth $DEPTH size $SIZE)"
echo "RATIO spill read-back (tier alone) ballastd/fio $qr median of $ROUNDS paired rounds, spread $qr_lo..$qr_hi (target 0.9; medians $sr vs $fio_r MB/s)"
