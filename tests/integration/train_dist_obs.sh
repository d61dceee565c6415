#!/usr/bin/env bash
# train_dist_obs.sh: what a 2-rank `ballast train --nproc 2` run shows.
#   - rank 0 alone prints the progress lines and writes the JSON log, with
#     the same settings record and step fields as one process; the figures
#     are those of the whole job (tokens/s in total and per rank, TFLOP/s per
#     rank = total / world) and the time split adds up to the step time;
#   - `ballast report` plots that log's time split and offload traffic;
#   - in a terminal, rank 0 draws the live line;
#   - every rank serves /metrics on --metrics-port + its local rank, with
#     rank="N" on every series; two scrapes of each show the counters move
#     and tokens_total = steps x global tokens per step / world.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
B=$BIN/ballast
[ -x "$B" ] || { t_fail "ballast built" "missing $B"; t_done; exit 1; }
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
D=$(t_tmpdir)
"$B" data synth --out "$D/c.bin" --tokens 40000 --vocab 256 --seed 11 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
COMMON=(--model tiny --data "$D/c.bin" --micro-batch 2 --seq-len 32 --lr 3e-3 --threads 1 --rdzv-timeout 60s)

# ---- JSON log of rank 0 ----
if timeout 120 "$B" train --nproc 2 "${COMMON[@]}" --steps 8 --log-every 4 --log-json "$D/run.jsonl" > "$D/run.out" 2>&1
then t_ok "2-rank run with --log-json"; else t_fail "2-rank run with --log-json" "$(tail -3 "$D/run.out")"; fi
t_check "one set of progress lines (rank 0 only) at --log-every: steps 1, 4, 8" bash -c \
    "[ \"\$(grep -Eo '^step +[0-9]+/8 \\| loss' '$D/run.out' | awk '{print \$2}' | tr '\n' ' ')\" = '1/8 4/8 8/8 ' ]"
t_check "progress lines carry tok/s, tok/s/rank, TFLOP/s/rank (CPU ranks), MFU and ETA" \
    grep -Eq '^step +8/8 \| loss [0-9.]+ \| lr .* \| \S+ tok/s \| \S+ tok/s/rank \| [0-9.]+ TFLOP/s/rank \| MFU n/a \| [0-9.]+ s/step \| ETA' "$D/run.out"
t_check "log: settings record and 8 step records with the single-process fields" $PY - "$D/run.jsonl" <<'EOF'
import sys
import jsonlog
lines = jsonlog.records(sys.argv[1])
h, steps = lines[0], [r for r in lines[1:] if "step" in r]
lay = [r for r in lines[1:] if r.get("kind") == "layout"]
assert len(lay) == 1 and lay[0]["world"] == 2 and len(lines) == 2 + len(steps), lines[1:3]
assert h["kind"] == "settings" and h["n_gpus"] == 2 and h["device"] == "cpu", h
T = 2 * 2 * 32                       # dp ranks x micro-batch x seq-len
assert h["tokens_per_step"] == T, h["tokens_per_step"]
assert h["settings"]["steps"] == "8" and h["flops_per_token"] > 0
assert [r["step"] for r in steps] == list(range(1, 9)), [r["step"] for r in steps]
for r in steps:
    for k in ("loss", "lr", "grad_norm", "tokens", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
              "step_s", "compute_s", "comm_s", "offload_wait_s", "data_s", "elapsed_s", "eta_s",
              "offload_to_host_bytes", "offload_to_device_bytes", "mem_host_bytes"):
        assert k in r, (k, r)
    assert r["tokens"] == T * r["step"]
    assert abs(r["tokens_per_s"] - T / r["step_s"]) <= 1e-9 * r["tokens_per_s"]
    assert abs(r["tokens_per_s_per_gpu"] - r["tokens_per_s"] / 2) <= 1e-9 * r["tokens_per_s"]
    # model FLOPs of the whole job split over the 2 ranks
    assert abs(r["tflops_per_gpu"] - h["flops_per_token"] * T / r["step_s"] / 2 / 1e12) <= 1e-9 * r["tflops_per_gpu"]
    parts = r["compute_s"] + r["comm_s"] + r["offload_wait_s"] + r["data_s"]
    assert abs(parts - r["step_s"]) <= 1e-12 + 1e-9 * r["step_s"], (parts, r["step_s"])
    assert r["comm_s"] > 0, "two ranks wait on collectives every step"
    assert r["comm_s"] < r["step_s"] and 0 < r["data_s"] < r["step_s"] and r["compute_s"] > 0
    assert r["mfu"] is None and r["offload_wait_s"] == 0 and r["offload_to_host_bytes"] == 0
EOF
if out=$("$B" report "$D/run.jsonl" --out "$D/run.html" 2>&1); then t_ok "ballast report on the 2-rank log"
else t_fail "ballast report on the 2-rank log" "$out"; fi
t_check "the report's time plot has the logged split of every step" $PY - "$D/run.jsonl" "$D/run.html" <<'EOF'
import re, sys
import jsonlog
steps = jsonlog.steps(sys.argv[1])
h = open(sys.argv[2]).read()
svg = re.search(r'<svg [^>]*data-plot="time"[^>]*>(.*?)</svg>', h, re.S).group(1)
fields = ["step_s", "compute_s", "comm_s", "offload_wait_s", "data_s"]
vals = [r[f] for r in steps for f in fields]
lo, hi = min(vals), max(vals)
ymin, ymax = lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)
ymin = 0.0 if lo >= 0 and ymin < 0 else ymin     # non-negative values: the axis starts at 0 at the lowest
for f in fields:
    pts = [tuple(map(float, p.split(","))) for p in
           re.search(r'data-series="%s"[^>]*points="([^"]*)"' % f, svg).group(1).split()]
    assert len(pts) == len(steps), (f, len(pts))
    for (x, y), r in zip(pts, steps):
        ex, ey = 70 + 620 * (r["step"] - 1) / 7, 20 + 200 * (ymax - r[f]) / (ymax - ymin)
        assert abs(x - ex) <= 0.0005 + 1e-9 and abs(y - ey) <= 0.0005 + 1e-9, (f, r["step"], x, y, ex, ey)
assert 'data-plot="offload"' not in h and 'data-none="offload"' in h, "no offload: a sentence, not a plot of zeros"
EOF

# ---- the live line in a terminal: rank 0's, one line rewritten in place ----
if command -v script >/dev/null; then
    timeout 120 script -qec "'$B' train --nproc 2 --model tiny --data '$D/c.bin' --micro-batch 2 --seq-len 32 --threads 1 --steps 20 --log-every 5" \
        /dev/null > "$D/tty.out" 2>&1
    t_check "2 ranks in a terminal: rank 0's live line, the last step drawn, no plain lines" $PY - "$D/tty.out" <<'EOF'
import re, sys
t = open(sys.argv[1], "rb").read().decode()
live = re.findall(r"\rstep (\d+)/20 \| loss [0-9.]+ \| \S+ tok/s \| MFU n/a \| [0-9.]+ s/step \| ETA \S+\x1b\[K", t)
assert live and live[-1] == "20", live
assert not re.search(r"(^|\n)step +\d+/20 \| loss [0-9.]+ \| lr", t), "plain lines in a terminal"
EOF
else
    t_skip "2 ranks: live line in a terminal" "script(1) (util-linux) is not installed"
fi

# ---- /metrics of both ranks ----
PORT=$($PY -c 'import socket
for _ in range(50):
    a, b = socket.socket(), socket.socket()
    try:
        a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]; b.bind(("127.0.0.1", p + 1)); print(p); break
    except OSError: pass
    finally: a.close(); b.close()')
"$B" train --nproc 2 "${COMMON[@]}" --steps 1000000 --lr-schedule constant --log-every 1000 \
    --log-json "$D/long.jsonl" --metrics-port "$PORT" --metrics-bind 127.0.0.1 > "$D/long.out" 2>&1 &
LPID=$!
for _ in $(seq 1 300); do n=$(jl_count "$D/long.jsonl" 2>/dev/null); [ "${n:-0}" -ge 3 ] && break; sleep 0.1; done
if out=$($PY - "$PORT" <<'EOF'
import re, sys, time, urllib.request
port = int(sys.argv[1])
def scrape(p):
    t = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % p, timeout=10).read().decode()
    v, types = {}, {}
    for line in t.splitlines():
        m = re.match(r'^# TYPE (\w+) (\w+)$', line)
        if m: types[m.group(1)] = m.group(2)
        m = re.match(r'^(\w+)(\{[^}]*\})? (\S+)$', line)
        if m: v[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return t, v, types
first = {r: scrape(port + r) for r in (0, 1)}
time.sleep(0.7)
second = {r: scrape(port + r) for r in (0, 1)}
want = {"ballast_train_tokens_total": "counter", "ballast_train_step_duration_seconds": "histogram",
        "ballast_train_loss": "gauge", "ballast_offload_bytes_total": "counter",
        "ballast_offload_wait_seconds_total": "counter", "ballast_train_time_seconds_total": "counter",
        "ballast_build_info": "gauge", "ballast_train_steps_total": "counter"}
msg = []
for r in (0, 1):
    t, a, ty = first[r]
    _, b, _ = second[r]
    for n, typ in want.items():
        assert ty.get(n) == typ, (r, n, ty.get(n))
    samples = [l for l in t.splitlines() if l and not l.startswith("#")]
    bad = [l for l in samples if 'rank="%d"' % r not in l]
    assert not bad, ("series without rank=%d" % r, bad[:3])
    for part in ("compute", "comm", "offload", "data"):
        assert 'ballast_train_time_seconds_total{rank="%d",part="%s"}' % (r, part) in a, part
    for d in ("to_service", "from_service"):
        assert 'ballast_offload_bytes_total{rank="%d",direction="%s"}' % (r, d) in a, d
    k = 'ballast_train_steps_total{rank="%d"}' % r
    assert b[k] > a[k] > 0, (r, a.get(k), b.get(k))
    tk = 'ballast_train_tokens_total{rank="%d"}' % r
    assert b[tk] in (64 * b[k], 64 * (b[k] + 1), 64 * (b[k] - 1)), (r, b[tk], b[k])   # 128 global / 2 ranks
    c = 'ballast_train_time_seconds_total{rank="%d",part="comm"}' % r
    assert b[c] > a[c] > 0, (r, "comm time moves", a[c], b[c])
    h = 'ballast_train_step_duration_seconds_count{rank="%d"}' % r
    assert b[h] > a[h], (r, h)
    assert 'ballast_train_loss{rank="%d"}' % r in b
    msg.append("rank %d: steps %d -> %d" % (r, a[k], b[k]))
print("; ".join(msg))
EOF
); then t_ok "both ranks' /metrics: names, types, rank labels, counters move ($out)"
else t_fail "both ranks' /metrics" "$out"; fi
t_check "each rank logged its endpoint (port + local rank)" bash -c \
    "grep -q 'rank 0: metrics: http://127.0.0.1:$PORT/metrics' '$D/long.out' && grep -q 'rank 1: metrics: http://127.0.0.1:$((PORT + 1))/metrics' '$D/long.out'"
kill -INT $LPID 2>/dev/null
rc=0; timeout 30 tail --pid=$LPID -f /dev/null || true; wait $LPID || rc=$?
if [ $rc -eq 130 ]; then t_ok "SIGINT stops the 2-rank run (exit 130)"; else t_fail "SIGINT stops the 2-rank run" "exit $rc: $(tail -3 "$D/long.out")"; fi
t_done
