#!/usr/bin/env bash
# ballastd_metrics.sh: /metrics of a real ballastd (--metrics-port on
# 127.0.0.1, a free port): the service's families with their types
# (services/offload/svc_metrics.h), the pool capacity equal to --pool-bytes,
# 404 elsewhere, and a clean exit on SIGTERM with the endpoint closed.
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
    > "$D/out" 2>&1 &
BPID=$!
for _ in $(seq 1 100); do grep -q "metrics: http://127.0.0.1:$PORT/metrics" "$D/out" && break; sleep 0.1; done
if out=$($PY - "$PORT" <<'EOF'
import re, sys, urllib.request, urllib.error
base = "http://127.0.0.1:%s" % sys.argv[1]
t = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", t, re.M))
want = {"ballast_pool_used_bytes": "gauge", "ballast_pool_capacity_bytes": "gauge", "ballast_spill_used_bytes": "gauge",
        "ballast_blobs": "gauge", "ballast_sessions": "gauge", "ballast_offload_bytes_total": "counter",
        "ballast_spill_bytes_total": "counter", "ballast_spill_read_bytes_total": "counter",
        "ballast_evictions_total": "counter", "ballast_crc_errors_total": "counter",
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
