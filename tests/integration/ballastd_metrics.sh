#!/usr/bin/env bash
# ballastd_metrics.sh: /metrics of a real ballastd (--metrics-port on
# 127.0.0.1, a free port): the service's families with their types
# (services/offload/svc_metrics.h), the pool capacity equal to --pool-bytes,
# 404 elsewhere; the byte counters moving with real traffic (puts and gets
# through `ballast store`, shared-memory and remote mode, more than the pool
# holds so that blobs spill and are read back):
# ballast_offload_bytes_total{direction="to_host"|"to_device"} equal to the
# bytes put and got, ballast_spill_bytes_total and
# ballast_spill_read_bytes_total rising; the pool's segment bytes and how
# many of them are on 2 MiB pages, as the ready line says the pool's pages
# are; and a clean exit on SIGTERM with the endpoint closed.
# Skipped when this build has no ballastd or its ballastd has no
# --metrics-port.
source "$(dirname "$0")/../lib.sh"
BD=$BIN/ballastd
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
if [ ! -x "$BD" ]; then t_skip "ballastd /metrics" "no $BD in this build"; t_done; exit 0; fi
if ! "$BD" --help 2>/dev/null | grep -q -- '--metrics-port'; then
    t_skip "ballastd /metrics" "this ballastd has no --metrics-port"; t_done; exit 0
fi
D=$(t_tmpdir)
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BD" --socket "$D/b.sock" --pool-bytes 48M --mlock=false --metrics-port "$PORT" --metrics-bind 127.0.0.1 \
    --spill-dir "$D/spill" --spill-bytes 256M --spill-file-bytes 64M \
    > "$D/out" 2>&1 &
BPID=$!
for _ in $(seq 1 100); do grep -q "metrics: http://127.0.0.1:$PORT/metrics" "$D/out" && break; sleep 0.1; done
if out=$($PY - "$PORT" <<'EOF'
import re, sys, urllib.request, urllib.error
base = "http://127.0.0.1:%s" % sys.argv[1]
t = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", t, re.M))
want = {"ballast_pool_used_bytes": "gauge", "ballast_pool_capacity_bytes": "gauge", "ballast_spill_used_bytes": "gauge",
        "ballast_pool_segment_bytes": "gauge", "ballast_pool_huge_page_bytes": "gauge",
        "ballast_blobs": "gauge", "ballast_sessions": "gauge", "ballast_offload_bytes_total": "counter",
        "ballast_spill_bytes_total": "counter", "ballast_spill_read_bytes_total": "counter",
        "ballast_evictions_total": "counter", "ballast_spill_ahead_writes_total": "counter", "ballast_crc_errors_total": "counter",
        "ballast_quota_refusals_total": "counter", "ballast_build_info": "gauge"}
bad = {k: types.get(k) for k, v in want.items() if types.get(k) != v}
assert not bad, bad
assert re.search(r"^ballast_pool_capacity_bytes 50331648$", t, re.M), "pool capacity is not --pool-bytes 48M"
assert re.search(r"^ballast_sessions 0$", t, re.M)
try:
    urllib.request.urlopen(base + "/", timeout=10); code = 200
except urllib.error.HTTPError as e:
    code = e.code
assert code == 404, code
print("%d families" % len(types))
EOF
); then t_ok "ballastd /metrics: families, types, pool capacity, 404 ($out)"; else t_fail "ballastd /metrics" "$out $(tail -3 "$D/out")"; fi

# ---- the byte counters move with traffic ----
# scrape NAME -> the sample's value (bare name or name{labels}); "none" if absent
scrape() { $PY - "$PORT" "$1" <<'EOF'
import re, sys, urllib.request
t = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
m = re.search(r"^%s (\S+)$" % re.escape(sys.argv[2]), t, re.M)
print(int(float(m.group(1))) if m else "none")
EOF
}
TO_HOST='ballast_offload_bytes_total{direction="to_host"}'
TO_DEV='ballast_offload_bytes_total{direction="to_device"}'
BALLAST=$BIN/ballast
h0=$(scrape "$TO_HOST"); d0=$(scrape "$TO_DEV"); sw0=$(scrape ballast_spill_bytes_total); sr0=$(scrape ballast_spill_read_bytes_total)
if [ "$h0" = 0 ] && [ "$d0" = 0 ] && [ "$sw0" = 0 ] && [ "$sr0" = 0 ]; then
    t_ok "byte counters present and 0 before any traffic"
else
    t_fail "byte counters before traffic" "to_host=$h0 to_device=$d0 spill=$sw0 spill_read=$sr0"
fi
# Three blobs of random sizes (not multiples of 4 KiB) that together exceed
# the 48 MiB pool, so the oldest is spilled when the last one goes in.
SEED=$(( $$ % 100000 + 1 ))
sizes=$($PY -c "import random; r = random.Random($SEED); print(' '.join(str(r.randrange(18 << 20, 22 << 20) | 1) for _ in range(3)))")
total=0; i=0; put_ok=1
for n in $sizes; do
    head -c "$n" /dev/urandom > "$D/blob$i"
    mode=; [ $i = 1 ] && mode=--remote # one through the gRPC Put (remote mode), two through the ring
    "$BALLAST" store put --socket "$D/b.sock" $mode --job metrics --index $i --file "$D/blob$i" 2> "$D/put$i.err" ||
        { put_ok=0; t_fail "ballast store put $i ($n bytes)" "$(cat "$D/put$i.err")"; }
    total=$((total + n)); i=$((i + 1))
done
h1=$(scrape "$TO_HOST"); sw1=$(scrape ballast_spill_bytes_total)
if [ $put_ok = 1 ] && [ "$h1" = "$total" ]; then
    t_ok "to_host counts the bytes put ($h1 = $sizes summed; seed $SEED)"
else
    t_fail "to_host after puts" "to_host=$h1, put $total bytes ($sizes; seed $SEED)"
fi
first=${sizes%% *}
# The segments made for the puts, and how much of them is on 2 MiB pages:
# the ready line says which pages the pool is on (--huge-pages thp, the
# default: transparent ones where the kernel gives them).
seg=$(scrape ballast_pool_segment_bytes); hp=$(scrape ballast_pool_huge_page_bytes)
pages=$(sed -n 's/.*ready: .* pool [^ ]* on \(.*\) in [0-9]* segment.*/\1/p' "$D/out")
case $pages in
    "transparent huge pages"|"2 MiB huge pages")
        # every segment's whole 2 MiB blocks; its tail under 2 MiB stays on 4 KiB pages
        if [ "$seg" != none ] && [ "$seg" -gt 0 ] && [ $((hp % (2 << 20))) = 0 ] && [ "$hp" -le "$seg" ] &&
            [ $((hp * 2)) -gt "$seg" ]; then
            t_ok "pool on $pages: $hp of $seg segment bytes on 2 MiB pages"
        else
            t_fail "ballast_pool_huge_page_bytes on $pages" "huge $hp of $seg segment bytes"
        fi ;;
    "4 KiB pages")
        if [ "$seg" != none ] && [ "$seg" -gt 0 ] && [ "$hp" = 0 ]; then
            t_ok "pool on 4 KiB pages (the kernel refused: $(grep -m1 'stays on 4 KiB' "$D/out" | sed 's/.*pages: //')): none of $seg segment bytes on 2 MiB pages"
        else
            t_fail "ballast_pool_huge_page_bytes on 4 KiB pages" "huge $hp of $seg segment bytes"
        fi ;;
    *) t_fail "ballastd's ready line names the pool's pages" "got '$pages': $(grep 'ready:' "$D/out")" ;;
esac
if [ "$sw1" != none ] && [ "$sw1" -ge "$first" ] && [ $((sw1 % 4096)) = 0 ]; then
    t_ok "ballast_spill_bytes_total rose to $sw1 when the pool overflowed"
else
    t_fail "ballast_spill_bytes_total after overflowing the pool" "got $sw1, want >= $first in 4 KiB units"
fi
# Get the first blob back (spilled: read back from NVMe) and the third (remote mode).
got=0; get_ok=1
for i in 0 2; do
    mode=; [ $i = 2 ] && mode=--remote
    if "$BALLAST" store get --socket "$D/b.sock" $mode --job metrics --index $i --file "$D/out$i" 2> "$D/get$i.err" &&
        cmp -s "$D/blob$i" "$D/out$i"; then
        got=$((got + $(stat -c %s "$D/blob$i")))
    else
        get_ok=0; t_fail "ballast store get $i byte-exact" "$(cat "$D/get$i.err")"
    fi
done
h2=$(scrape "$TO_HOST"); d2=$(scrape "$TO_DEV"); sr2=$(scrape ballast_spill_read_bytes_total)
if [ $get_ok = 1 ] && [ "$d2" = "$got" ] && [ "$h2" = "$total" ]; then
    t_ok "to_device counts the bytes got ($d2), to_host unchanged"
else
    t_fail "to_device after gets" "to_device=$d2 (got $got bytes), to_host=$h2 (put $total)"
fi
if [ "$sr2" != none ] && [ "$sr2" -ge "$first" ]; then
    t_ok "ballast_spill_read_bytes_total rose to $sr2 reading the spilled blob back"
else
    t_fail "ballast_spill_read_bytes_total after a get of a spilled blob" "got $sr2, want >= $first"
fi
kill -TERM $BPID 2>/dev/null
wait $BPID
rc=$?
if [ $rc -eq 0 ]; then t_ok "ballastd drains and exits 0 on SIGTERM"; else t_fail "ballastd exit on SIGTERM" "exit $rc: $(tail -3 "$D/out")"; fi
if $PY -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/metrics', timeout=3)" 2>/dev/null; then
    t_fail "endpoint closed after exit" "port $PORT still answers"
else
    t_ok "endpoint closed after exit"
fi
t_done
