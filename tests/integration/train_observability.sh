#!/usr/bin/env bash
# train_observability.sh: what a real ballast-worker run shows.
#   - the JSON log starts with the settings record (entropy floor of the
#     synthetic corpus included), then the layout record (world 1), then one
#     record per step with the fields of docs/observability.md, and `ballast
#     report` plots exactly those losses;
#   - /metrics of a running worker (127.0.0.1, a free port): counters move
#     between two scrapes, tokens_total = steps x tokens per step;
#   - a NaN loss (weights loaded from a checkpoint with a NaN in them) stops
#     the run at step 1 naming the step, the cause and the fix;
#     --skip-nonfinite skips such steps and stops after 10 in a row.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
W=$BIN/ballast-worker
B=$BIN/ballast
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
D=$(t_tmpdir)

"$B" data synth --out "$D/c.bin" --tokens 40000 --vocab 256 --seed 5 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
COMMON=(--model tiny --data "$D/c.bin" --micro-batch 4 --seq-len 32 --lr 3e-3 --threads 2)

# ---- JSON log and report ----
if "$W" "${COMMON[@]}" --steps 12 --log-every 4 --log-json "$D/run.jsonl" > "$D/run.out" 2>&1; then
    t_ok "worker run with --log-json"
else
    t_fail "worker run with --log-json" "$(tail -3 "$D/run.out")"
fi
t_check "plain progress lines at --log-every (steps 1, 4, 8, 12)" bash -c \
    "[ \"\$(grep -Eo '^step +[0-9]+/12' '$D/run.out' | awk '{print \$2}' | tr '\n' ' ')\" = '1/12 4/12 8/12 12/12 ' ]"
t_check "log: settings record, then 12 steps with the documented fields" $PY - "$D/run.jsonl" "$D/c.bin.json" <<'EOF'
import json, sys
import jsonlog
lines = jsonlog.records(sys.argv[1])
h, lay, steps = lines[0], lines[1], lines[2:]
assert h["kind"] == "settings", h
# then the layout record: one process is world 1 = 1 x 1 x 1, the whole model's state on it
assert lay["kind"] == "layout" and (lay["world"], lay["replicas"], lay["shard_degree"], lay["tensor_parallel_degree"]) == (1, 1, 1, 1), lay
assert lay["state_bytes_per_rank"] == lay["model_state_bytes"] and lay["offload_staging_bytes"] == 0, lay
assert h["settings"]["steps"] == "12" and h["settings"]["micro-batch"] == "4", h["settings"]
assert h["entropy_nats"] == json.load(open(sys.argv[2]))["entropy_nats"], "entropy floor from the corpus side file"
assert h["n_gpus"] == 1 and h["device"] == "cpu" and h["peak_tflops"] is None and h["tokens_per_step"] == 128
assert [r["step"] for r in steps] == list(range(1, 13))
for r in steps:
    for k in ("loss", "lr", "grad_norm", "tokens", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
              "step_s", "compute_s", "comm_s", "offload_wait_s", "data_s", "elapsed_s", "eta_s",
              "offload_to_host_bytes", "offload_to_device_bytes", "mem_host_bytes"):
        assert k in r, (k, r)
    assert r["mfu"] is None, "no peak for the CPU: MFU is null"
    assert r["tokens"] == 128 * r["step"]
    assert abs(r["tokens_per_s"] - 128 / r["step_s"]) <= 1e-9 * r["tokens_per_s"]
    # tflops = flops_per_token x tokens / s / 1e12, flops_per_token as the header says
    assert abs(r["tflops_per_gpu"] - h["flops_per_token"] * 128 / r["step_s"] / 1e12) <= 1e-9 * r["tflops_per_gpu"]
    assert abs(r["compute_s"] + r["data_s"] - r["step_s"]) <= 1e-12 + 1e-9 * r["step_s"]
    assert 0 < r["data_s"] < r["step_s"] and r["mem_host_bytes"] > 1 << 20
EOF
if out=$("$B" report "$D/run.jsonl" --out "$D/run.html" 2>&1); then t_ok "ballast report on the worker's log"
else t_fail "ballast report on the worker's log" "$out"; fi
t_check "the report plots the logged losses and the floor" $PY - "$D/run.jsonl" "$D/run.html" <<'EOF'
import re, sys
import jsonlog
recs = jsonlog.records(sys.argv[1])
floor, steps = recs[0]["entropy_nats"], [r for r in recs[1:] if "step" in r]
h = open(sys.argv[2]).read()
svg = re.search(r'<svg [^>]*data-plot="loss"[^>]*>(.*?)</svg>', h, re.S).group(1)
pts = [tuple(map(float, p.split(","))) for p in
       re.search(r'data-series="loss"[^>]*points="([^"]*)"', svg).group(1).split()]
vals = [r["loss"] for r in steps] + [floor]
lo, hi = min(vals), max(vals)
ymin, ymax = lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)
ymin = 0.0 if lo >= 0 and ymin < 0 else ymin
assert len(pts) == len(steps), (len(pts), len(steps))
for (x, y), r in zip(pts, steps):
    ex = 70 + 620 * (r["step"] - 1) / 11
    ey = 20 + 200 * (ymax - r["loss"]) / (ymax - ymin)
    assert abs(x - ex) <= 0.0005 + 1e-9 and abs(y - ey) <= 0.0005 + 1e-9, (r["step"], x, y, ex, ey)
m = re.search(r'<line class="floor" data-value="([^"]+)"', svg)
assert m and float(m.group(1)) == floor, ("floor line", m and m.group(1), floor)
EOF

# ---- the live line in a terminal (script(1) gives the worker a pty) ----
if command -v script >/dev/null; then
    timeout 60 script -qec "'$W' --model tiny --data '$D/c.bin' --micro-batch 4 --seq-len 32 --steps 30 --threads 2 --log-every 10" \
        /dev/null > "$D/tty.out" 2>&1
    t_check "in a terminal: one line rewritten in place, the last step drawn, no plain lines" $PY - "$D/tty.out" <<'EOF'
import re, sys
t = open(sys.argv[1], "rb").read().decode()
live = re.findall(r"\rstep (\d+)/30 \| loss [0-9.]+ \| \S+ tok/s \| MFU n/a \| [0-9.]+ s/step \| ETA \S+\x1b\[K", t)
assert live and live[-1] == "30", live
assert not re.search(r"(^|\n)step +\d+/30 \| loss [0-9.]+ \| lr", t), "plain lines in a terminal"
EOF
else
    t_skip "live line in a terminal" "script(1) (util-linux) is not installed"
fi

# ---- /metrics of a running worker ----
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$W" "${COMMON[@]}" --steps 1000000 --lr-schedule constant --log-every 1000 --log-json "$D/long.jsonl" \
    --metrics-port "$PORT" --metrics-bind 127.0.0.1 > "$D/long.out" 2>&1 &
WPID=$!
for _ in $(seq 1 300); do n=$(jl_count "$D/long.jsonl" 2>/dev/null); [ "${n:-0}" -ge 3 ] && break; sleep 0.1; done
if out=$($PY - "$PORT" <<'EOF'
import re, sys, time, urllib.request
url = "http://127.0.0.1:%s/metrics" % sys.argv[1]
def scrape():
    t = urllib.request.urlopen(url, timeout=10).read().decode()
    v = {}
    for line in t.splitlines():
        m = re.match(r'^(\w+)(\{[^}]*\})? (\S+)$', line)
        if m: v[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return t, v
t1, a = scrape()
time.sleep(0.5)
t2, b = scrape()
k = 'ballast_train_steps_total{rank="0"}'
assert k in a and b[k] > a[k] > 0, (a.get(k), b.get(k))
tk = 'ballast_train_tokens_total{rank="0"}'
# the two counters are read in one scrape, between two steps or in the middle of one
assert b[tk] in (128 * b[k], 128 * (b[k] + 1), 128 * (b[k] - 1)), (b[tk], b[k])
assert b['ballast_train_step_duration_seconds_count{rank="0"}'] >= b[k] - 1
for name in ("# TYPE ballast_train_loss gauge", "# TYPE ballast_build_info gauge",
             "# TYPE ballast_train_time_seconds_total counter", "# TYPE ballast_offload_wait_seconds_total counter", 'ballast_offload_bytes_total{rank="0",direction="to_service"} 0', 'ballast_host_memory_used_bytes{rank="0"}'):
    assert name in t2, name
assert "ballast_mfu_ratio{" not in t2, "no MFU series without a peak"
print("steps %d -> %d" % (a[k], b[k]))
EOF
); then t_ok "worker /metrics: counters move ($out)"; else t_fail "worker /metrics" "$out"; fi
t_check "the worker logged where it serves" grep -q "metrics: http://127.0.0.1:$PORT/metrics" "$D/long.out"
kill -INT $WPID 2>/dev/null
wait $WPID
rc=$?
if [ $rc -eq 130 ]; then t_ok "SIGINT stops the worker (exit 130)"; else t_fail "SIGINT stops the worker" "exit $rc: $(tail -2 "$D/long.out")"; fi

# ---- non-finite loss ----
"$W" "${COMMON[@]}" --steps 1 --ckpt-dir "$D/ck" > "$D/ck.out" 2>&1 &&
"$B" ckpt export --from "$D/ck" --out "$D/hf" > "$D/e.out" 2>&1 ||
    { t_fail "checkpoint for the NaN test" "$(tail -2 "$D/ck.out" "$D/e.out")"; t_done; exit 1; }
$PY - "$D/hf/model.safetensors" <<'EOF'
import json, struct, sys
p = sys.argv[1]
raw = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
t = h["model.norm.weight"]
assert t["dtype"] == "F32", t
off = 8 + n + t["data_offsets"][0] + 4 * 5
raw[off:off + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(raw)
EOF
t_expect_fail "a NaN loss stops the run at step 1 with the cause and the fix" \
    "step 1: the loss is NaN; stopping the run at this step.*--lr.*--skip-nonfinite" \
    "$W" "${COMMON[@]}" --init-from "$D/hf" --steps 5 --log-json "$D/nan.jsonl"
t_expect_fail "--skip-nonfinite skips, then stops after 10 in a row" \
    "step 10: the loss is NaN, 10 steps in a row; stopping" \
    "$W" "${COMMON[@]}" --init-from "$D/hf" --steps 50 --skip-nonfinite --log-json "$D/skip.jsonl"
t_check "skipped steps are logged as skipped with a null loss" $PY - "$D/skip.jsonl" <<'EOF'
import sys
import jsonlog
steps = jsonlog.steps(sys.argv[1])
assert [r["step"] for r in steps] == list(range(1, 10)), [r["step"] for r in steps]
assert all(r["skipped"] is True and r["loss"] is None for r in steps)
EOF
t_done
