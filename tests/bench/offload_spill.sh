#!/usr/bin/env bash
# tests/bench/offload_spill.sh: spilling end to end THROUGH ballastd against
# fio on the same directory, in the same run.
#
# Ours: a fresh ballastd with a small pool and a spill tier in the
# directory; bench_offload --mode spill puts a pool's worth of blobs untimed
# (the pool is full from then on and background eviction runs), then puts
# $SIZE more, timed: the puts go on only as fast as eviction gets bytes to
# the disk. Then it reads those blobs back in order (get, most from the
# disk), timed, and checks every byte.
# fio: the same bytes in blocks of the blob size, io_uring, O_DIRECT, depth
# $DEPTH, write then read, in the same directory.
# Each round measures both, the side that goes first alternating; the
# figure is the median of the per-round ratios with the lowest and highest.
# Blob sizes 1 MiB and 16 MiB; target >= 0.9. Each round also says how
# many spill writes and reads ballastd made (its exit stats): the blobs
# the pool still holds when the read-back starts are served from it, so
# ours reads fewer bytes from the disk than fio. The read-back hints blobs
# ahead of the get with prefetch (oc_prefetch_async; the frees do not wait
# either), as a trainer does for its backward pass: twice fio's depth in
# blobs, at most half the pool. ballastd keeps at most its queue depth, and
# a quarter of the pool, of those reads at the device; the other hints wait
# there and go the moment reads end, while those are checked
# (BALLAST_BENCH_E2E_PREFETCH=0: no hints, each get reads its own blob, one
# request at a time).
# The pool is measured on three backings, each its own RATIO lines:
# 2M (--huge-pages 2M, reserved huge pages), THP (--huge-pages thp, the
# default: 4 KiB pages the kernel collapses into transparent 2 MiB ones)
# and 4K (--huge-pages off). Direct I/O hands the device one segment per
# physically contiguous run of the buffer, and a request holds at most
# max_segments of them (/sys/block/*/queue): on 4K pages that caps a
# request near 1 MiB (254 x 4 KiB on virtio) when the host's free memory
# is fragmented. 2M needs free huge pages for the pool; run as root, the
# bench reserves what is missing in vm.nr_hugepages for the run and puts
# the old value back at exit (set BALLAST_BENCH_RESERVE_HUGE=0 to leave
# the sysctl alone: 2M is then skipped, saying so, unless pages are
# already free). fio's buffer is on huge pages (--mem=shmhuge) against
# the 2M pool, and against THP when huge pages are free for it; otherwise,
# and against 4K, it is fio's default (malloc, 4 KiB pages). Each THP
# round says which pages ballastd's pool got (its ready line).
# Settings: BALLAST_BENCH_DIR (/tmp), BALLAST_BENCH_E2E_BYTES (1G),
# BALLAST_BENCH_E2E_POOL (128M), BALLAST_BENCH_DEPTH (32),
# BALLAST_BENCH_E2E_ROUNDS (6, even), BALLAST_BENCH_E2E_WATERMARK (25),
# BALLAST_BENCH_E2E_PAGES ("2M THP 4K"), BALLAST_BENCH_E2E_BLOBS ("1M 16M"),
# BALLAST_BENCH_RESERVE_HUGE (1), BALLAST_BENCH_E2E_PREFETCH (1).
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
BALLASTD=$BUILD/bin/ballastd
BO=$BUILD/tests/bench/bench_offload
DIR=${BALLAST_BENCH_DIR:-/tmp}
SIZE=${BALLAST_BENCH_E2E_BYTES:-1G}
POOL=${BALLAST_BENCH_E2E_POOL:-128M}
DEPTH=${BALLAST_BENCH_DEPTH:-32}
ROUNDS=${BALLAST_BENCH_E2E_ROUNDS:-6}
WM=${BALLAST_BENCH_E2E_WATERMARK:-25}
PAGES=${BALLAST_BENCH_E2E_PAGES:-2M THP 4K}
BLOBS=${BALLAST_BENCH_E2E_BLOBS:-1M 16M}
RESERVE=${BALLAST_BENCH_RESERVE_HUGE:-1}
AHEAD=${BALLAST_BENCH_E2E_PREFETCH:-1}
case $AHEAD in 0|1) ;; *) echo "BALLAST_BENCH_E2E_PREFETCH=$AHEAD: give 1 (prefetch ahead of the gets) or 0 (none)"; exit 1 ;; esac
for b in "$BALLASTD" "$BO"; do [ -x "$b" ] || { echo "offload_spill bench: $b not built (run make)"; exit 1; }; done
command -v fio >/dev/null || { echo "offload_spill bench: fio missing (make deps installs it): nothing to compare, skipped"; exit 0; }
W=$(mktemp -d "$DIR/ballast-bench-e2e.XXXXXX")
PID=
OLD_NR=
cleanup() {
    [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
    rm -rf "$W"
    [ -n "$OLD_NR" ] && echo "$OLD_NR" > /proc/sys/vm/nr_hugepages
}
trap cleanup EXIT
kv() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
stats() { /usr/bin/python3 -c "
import statistics, sys
v = [float(x) for x in sys.argv[1:] if x != 'n/a']
f = '%.1f' if max(v or [0]) > 10 else '%.3f'
print(' '.join(f % x for x in (statistics.median(v), min(v), max(v))) if v else 'n/a n/a n/a')" "$@"; }
ratio() { /usr/bin/python3 -c "a,b='$1','$2'; print('n/a' if 'n/a' in (a,b) or float(b) <= 0 else '%.3f' % (float(a)/float(b)))"; }

# 2M pages for the pool: free ones, or (root) reserved for this run.
# Prints why not when they cannot be had.
huge_ready() {
    local need free total
    # the pool, and fio's buffer (depth x the largest blob)
    need=$(/usr/bin/python3 -c "
import re, sys
u = {'': 1, 'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
def n(v):
    m = re.fullmatch(r'(\d+)([KMG]?)', v)
    if not m: sys.exit('bad size ' + v)
    return int(m.group(1)) * u[m.group(2)]
pages = lambda b: -(-b // (2 << 20))
print(pages(n(sys.argv[1])) + pages(int(sys.argv[2]) * max(n(b) for b in sys.argv[3:])))" "$POOL" "$DEPTH" $BLOBS) ||
        { echo "offload_spill bench: bad pool or blob size ($POOL; $BLOBS)"; exit 1; }
    free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
    [ "${free:-0}" -ge "$need" ] && return 0
    if [ "$RESERVE" = 1 ] && [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/nr_hugepages ]; then
        total=$(cat /proc/sys/vm/nr_hugepages)
        [ -z "$OLD_NR" ] && OLD_NR=$total
        echo $((total + need - free)) > /proc/sys/vm/nr_hugepages 2>/dev/null
        free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
        if [ "${free:-0}" -ge "$need" ]; then
            echo "  (vm.nr_hugepages raised from $total to $(cat /proc/sys/vm/nr_hugepages) for this run; $OLD_NR again at exit)"
            return 0
        fi
        echo "  2M pool skipped: the kernel gave only ${free:-0} of $need free huge pages (memory too fragmented)"
        return 1
    fi
    echo "  2M pool skipped: $need free 2M huge pages needed, ${free:-0} free (run as root, or sysctl vm.nr_hugepages)"
    return 1
}

# ours blob round pages: sets OW OR (MB/s)
ours() {
    local d="$W/spill-$1-$2" o hp=off
    case $3 in 2M) hp=2M ;; THP) hp=thp ;; esac
    rm -f "$W/ports"
    "$BALLASTD" --socket "$W/b.sock" --pool-bytes "$POOL" --spill-dir "$d" --spill-bytes 2G --queue-depth "$DEPTH" \
        --evict-watermark "$WM" --huge-pages "$hp" --port-file "$W/ports" --log-level info > "$W/ballastd.log" 2>&1 &
    PID=$!
    for i in $(seq 1 100); do [ -s "$W/ports" ] && break; sleep 0.05; done
    [ -s "$W/ports" ] || { echo "ballastd did not start:"; cat "$W/ballastd.log"; exit 1; }
    # prefetch hints ahead of the gets: twice fio's depth in blobs, at most
    # half the pool (ballastd keeps at most the queue depth, and a quarter of
    # the pool, of them at the device; the rest wait there to go the moment
    # reads end, while those are checked)
    local ahead=$(( $(numfmt --from=iec "$1") * DEPTH * 2 )) half=$(( $(numfmt --from=iec "$POOL") / 2 ))
    [ "$ahead" -gt "$half" ] && ahead=$half
    [ "$AHEAD" = 0 ] && ahead=0
    o=$("$BO" --addr "unix:$W/b.sock" --mode spill --blob "$1" --bytes "$SIZE" --fill "$POOL" --prefetch "$ahead" 2>&1) ||
        { echo "bench_offload --mode spill failed: $o"; tail -5 "$W/ballastd.log"; exit 1; }
    kill -TERM $PID; wait $PID; PID=
    OP=$(sed -n 's/.*ready: .* pool [^ ]* on \(.*\) in [0-9]* segment.*/\1/p' "$W/ballastd.log")
    rm -rf "$d"; sync -f "$W"
    o=$(echo "$o" | grep '^RESULT bench_offload_spill')
    OW=$(kv "$o" write_mbps); OR=$(kv "$o" read_mbps)
    # what the disk moved: blobs the pool still held are served from it
    local nb=$(( $(numfmt --from=iec "$SIZE") / $(numfmt --from=iec "$1") )) nf=$(( $(numfmt --from=iec "$POOL") / $(numfmt --from=iec "$1") ))
    OD=$(sed -n "s/.*stats at exit:.* \([0-9]*\) spill writes.* \([0-9]*\) spill reads.*/\1 writes for $((nb + nf)) blobs put, \2 reads for $nb read back/p" "$W/ballastd.log")
}
# free huge pages for fio's buffer (depth x the largest blob), quietly
huge_free() {
    local need free
    need=$(( ( DEPTH * $(for b in $BLOBS; do numfmt --from=iec "$b"; done | sort -n | tail -1) + (2 << 20) - 1 ) / (2 << 20) ))
    free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
    [ "${free:-0}" -ge "$need" ]
}
# fio_rw blob rw mem: sets X (MB/s)
fio_rw() {
    X=$(fio --name=e2e --filename="$W/fio.dat" --ioengine=io_uring --direct=1 --rw="$2" --bs="$1" --mem="$3" \
        --iodepth="$DEPTH" --size="$SIZE" --fallocate=native --end_fsync=0 --output-format=json 2> "$W/fio.err" |
        /usr/bin/python3 -c "
import json, sys
print('%.1f' % (json.load(sys.stdin)['jobs'][0]['$2']['bw_bytes'] / 1e6))" 2>/dev/null) || { X=n/a; tail -3 "$W/fio.err"; }
    [ "$2" = write ] && sync "$W/fio.dat"
}
fio_both() { fio_rw "$1" write "$2"; FW=$X; fio_rw "$1" read "$2"; FR=$X; rm -f "$W/fio.dat"; sync -f "$W"; }

echo "spill end to end through ballastd vs fio: $SIZE per side per round after a $POOL fill, pool $POOL" \
     "on pages ${PAGES// /, }, watermark $WM%, depth $DEPTH, $ROUNDS rounds, dir $DIR"
for pages in $PAGES; do
    case $pages in 2M|THP|4K) ;; *) echo "offload_spill bench: BALLAST_BENCH_E2E_PAGES: '$pages' is not 2M, THP or 4K"; exit 1;; esac
    mem=malloc
    if [ "$pages" = 2M ]; then huge_ready || continue; mem=shmhuge; fi
    if [ "$pages" = THP ]; then
        if huge_free; then mem=shmhuge; else echo "  THP pool: no free huge pages for fio's buffer, fio on 4 KiB pages"; fi
    fi
    for blob in $BLOBS; do
        qw=(); qr=(); ows=(); fws=(); ors=(); frs=()
        for round in $(seq 1 "$ROUNDS"); do
            if [ $((round % 2)) = 1 ]; then ours "$blob" "$round" "$pages"; fio_both "$blob" $mem; first=ours
            else fio_both "$blob" $mem; ours "$blob" "$round" "$pages"; first=fio; fi
            qw+=("$(ratio "$OW" "$FW")"); qr+=("$(ratio "$OR" "$FR")")
            ows+=("$OW"); fws+=("$FW"); ors+=("$OR"); frs+=("$FR")
            echo "  $pages pool, $blob round $round ($first first): write ours $OW fio $FW MB/s (${qw[-1]});" \
                 "read-back ours $OR fio $FR MB/s (${qr[-1]}); ours on disk: ${OD:-?}$([ "$pages" = THP ] && echo "; pool on ${OP:-?}")"
        done
        read -r w w_lo w_hi <<< "$(stats "${qw[@]}")"; read -r r r_lo r_hi <<< "$(stats "${qr[@]}")"
        read -r mow _ _ <<< "$(stats "${ows[@]}")"; read -r mfw _ _ <<< "$(stats "${fws[@]}")"
        read -r mor _ _ <<< "$(stats "${ors[@]}")"; read -r mfr _ _ <<< "$(stats "${frs[@]}")"
        echo "RATIO spill write through ballastd/fio, $blob blobs, $pages pool $w median of $ROUNDS alternated rounds," \
             "spread $w_lo..$w_hi (target 0.9; medians $mow vs $mfw MB/s)"
        echo "RATIO spill read-back through ballastd/fio, $blob blobs, $pages pool $r median, spread $r_lo..$r_hi" \
             "($([ "$AHEAD" = 1 ] && echo "prefetched ahead, target 0.9" || echo "no prefetch, no target"); medians $mor vs $mfr MB/s)"
    done
done
