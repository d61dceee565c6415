#!/usr/bin/env bash
# jemalloc.sh: jemalloc is the malloc of the running ballastd and
# ballast-worker, and its figures reach their /metrics and `ballast status`
# (common/jemalloc_stats.h).
#   - the binaries name libjemalloc before libc (the dynamic linker then
#     binds malloc to it); ballast, ballast-probe and ballast-rdzv do not;
#   - ballastd /metrics: the ballast_jemalloc_* gauges, ballast_jemalloc_info
#     (present only when the process checked that its malloc is jemalloc's)
#     and the fragmentation equal to active / allocated - 1 of the same
#     scrape;
#   - `ballast status` (table and --json) shows the same allocator, checked
#     in ballastd itself, with consistent figures;
#   - a training worker's /metrics: the same families with rank="0", and at
#     least 16 bytes allocated per parameter (fp32 weights, gradients and
#     both AdamW moments live on that heap).
# Sanitizer builds leave jemalloc out (the sanitizer owns malloc): skipped.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
BD=$BIN/ballastd
W=$BIN/ballast-worker
B=$BIN/ballast
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
if [ -n "${BALLAST_SAN:-}" ]; then
    t_skip "jemalloc in ballastd and ballast-worker" "sanitizer build ($BALLAST_SAN): jemalloc is left out"; t_done; exit 0
fi
for p in "$BD" "$W" "$B"; do [ -x "$p" ] || { t_fail "built: $p" "missing"; t_done; exit 1; }; done
D=$(t_tmpdir)
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---- link order ----
needed() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' '; }
for p in "$BD" "$W"; do
    n=$(needed "$p")
    if [[ "$n" == *libjemalloc.so* ]] && [[ "${n%%libc.so*}" == *libjemalloc.so* ]]; then
        t_ok "$(basename "$p") needs libjemalloc before libc"
    else
        t_fail "$(basename "$p") needs libjemalloc before libc" "NEEDED: $n"
    fi
done
for p in "$B" "$BIN/ballast-probe" "$BIN/ballast-rdzv"; do
    [ -x "$p" ] || continue
    n=$(needed "$p")
    if [[ "$n" != *libjemalloc* ]]; then t_ok "$(basename "$p") keeps glibc's malloc"
    else t_fail "$(basename "$p") keeps glibc's malloc" "NEEDED: $n"; fi
done

# The ballast_jemalloc_* samples of one scrape, checked, as "key=value"
# lines. $1 port, $2 the label prefix of every series ('' or 'rank="0"').
check_scrape() { $PY - "$1" "$2" <<'EOF'
import re, sys, urllib.request
port, const = sys.argv[1], sys.argv[2]
t = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10).read().decode()
types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", t, re.M))
names = ["allocated_bytes", "active_bytes", "resident_bytes", "mapped_bytes", "retained_bytes", "metadata_bytes",
         "fragmentation_ratio", "info"]
bad = [n for n in names if types.get("ballast_jemalloc_" + n) != "gauge"]
assert not bad, "not gauges or missing: %s" % bad
v = {}
for n in names[:-1]:
    sel = "{%s}" % const if const else ""
    m = re.search(r"^ballast_jemalloc_%s%s (\S+)$" % (n, re.escape(sel)), t, re.M)
    assert m, "no sample ballast_jemalloc_%s%s" % (n, sel)
    v[n] = float(m.group(1))
info = re.findall(r'^ballast_jemalloc_info\{%sversion="([^"]+)"\} 1$' % (re.escape(const + ",") if const else ""), t, re.M)
assert len(info) == 1 and info[0].startswith("5."), "ballast_jemalloc_info: %s" % info
al, ac = v["allocated_bytes"], v["active_bytes"]
assert al > 0 and v["resident_bytes"] > 0 and v["mapped_bytes"] > 0 and v["metadata_bytes"] > 0, v
# one snapshot per scrape: the ratio is that of the two gauges next to it
want = ac / al - 1 if ac > al else 0.0
assert v["fragmentation_ratio"] == want, (v["fragmentation_ratio"], want)
print("version=%s" % info[0])
for k, x in v.items(): print("%s=%r" % (k, x))
EOF
}

# ---- ballastd ----
PORT=$(free_port)
"$BD" --socket "$D/b.sock" --pool-bytes 32M --mlock=false --metrics-port "$PORT" --metrics-bind 127.0.0.1 \
    > "$D/bd.out" 2>&1 &
BPID=$!
for _ in $(seq 1 100); do grep -q "metrics: http://127.0.0.1:$PORT/metrics" "$D/bd.out" && break; sleep 0.1; done
if out=$(check_scrape "$PORT" ""); then
    t_ok "ballastd /metrics: the jemalloc gauges, its version, fragmentation = active/allocated - 1"
    ver=$(echo "$out" | sed -n 's/^version=//p')
else
    t_fail "ballastd /metrics: jemalloc gauges" "$out $(tail -3 "$D/bd.out")"; ver=none
fi
if "$B" status --socket "$D/b.sock" > "$D/st.txt" 2>&1 &&
    grep -Eq "^  allocator jemalloc $ver: [0-9.]+[KMG]? allocated, [0-9.]+[KMG]? active \(fragmentation [0-9.]+\), .* resident, .* mapped, .* retained, .* metadata$" "$D/st.txt"; then
    t_ok "ballast status shows ballastd's allocator line (jemalloc $ver)"
else
    t_fail "ballast status allocator line" "$(cat "$D/st.txt")"
fi
if "$B" status --socket "$D/b.sock" --json > "$D/st.json" 2>&1 && out=$($PY - "$D/st.json" "$ver" <<'EOF'
import json, sys
a = json.load(open(sys.argv[1]))["allocator"]
assert a["name"] == "jemalloc " + sys.argv[2], a["name"]
assert a["is_malloc"] is True and a["why_not"] == "", a
al, ac = a["allocated_bytes"], a["active_bytes"]
assert al > 0 and a["resident_bytes"] > 0 and a["mapped_bytes"] > 0 and a["metadata_bytes"] > 0, a
assert abs(a["fragmentation_ratio"] - (ac / al - 1 if ac > al else 0.0)) <= 1e-12, a
print("allocated %d, active %d" % (al, ac))
EOF
); then
    t_ok "ballast status --json: allocator jemalloc, checked in ballastd to serve its malloc ($out)"
else
    t_fail "ballast status --json allocator" "$out $(cat "$D/st.json")"
fi
kill -TERM $BPID 2>/dev/null
wait $BPID || t_fail "ballastd exit on SIGTERM" "$(tail -3 "$D/bd.out")"

# ---- a training worker ----
"$B" data synth --out "$D/c.bin" --tokens 40000 --vocab 256 --seed 9 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
PORT=$(free_port)
"$W" --model tiny --data "$D/c.bin" --micro-batch 4 --seq-len 32 --threads 2 --steps 1000000 --lr-schedule constant \
    --log-every 1000 --log-json "$D/w.jsonl" --metrics-port "$PORT" --metrics-bind 127.0.0.1 > "$D/w.out" 2>&1 &
WPID=$!
for _ in $(seq 1 300); do n=$(jl_count "$D/w.jsonl" 2>/dev/null); [ "${n:-0}" -ge 2 ] && break; sleep 0.1; done
params=$(jl_get "$D/w.jsonl" --kind settings params 2>/dev/null)
if out=$(check_scrape "$PORT" 'rank="0"'); then
    t_ok "worker /metrics: the jemalloc gauges with rank=\"0\", fragmentation = active/allocated - 1"
    al=$(echo "$out" | sed -n 's/^allocated_bytes=//p')
    if $PY -c "import sys; sys.exit(0 if float('$al') >= 16 * int('$params') else 1)" 2>/dev/null; then
        t_ok "the worker's model lives on jemalloc: $al bytes allocated >= 16 x $params parameters"
    else
        t_fail "the worker's heap holds the model" "allocated $al, params ${params:-?}"
    fi
else
    t_fail "worker /metrics: jemalloc gauges" "$out $(tail -3 "$D/w.out")"
fi
kill -INT $WPID 2>/dev/null
wait $WPID
t_done
