#!/usr/bin/env bash
# report.sh: `ballast report` end to end. A synthetic JSON log (seeded random
# losses, gaps in some fields, a settings record, a cut-short last line) is
# rendered; python3 parses the SVG polylines back out of the HTML and checks
# every point against the logged value under the scaling documented in
# workers/cli/report.h (3-decimal coordinates: within 0.0005 units). Also: the
# page is self-contained, missing fields are named, --entropy and --title
# work, resumed runs replace re-logged steps, and bad input is rejected with
# a message naming the file and line.
source "$(dirname "$0")/../lib.sh"
B=$BIN/ballast
[ -x "$B" ] || { t_fail "ballast binary" "missing $B (run make)"; t_done; exit 1; }
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
TMP=$(t_tmpdir)

# ---- a synthetic log ----
$PY - "$TMP/run.jsonl" <<'EOF'
import json, math, random, sys
random.seed(20261130)
out = open(sys.argv[1], "w")
out.write(json.dumps({"kind": "settings", "settings": {"lr": "0.0003", "steps": "300", "data": "synth/*.bin"},
                      "model": "tiny", "params": 108800, "n_gpus": 2, "device": "cpu", "peak_tflops": None,
                      "entropy_nats": 1.3862943611198906}) + "\n")
for s in range(1, 301):
    r = {"step": s, "loss": 1.4 + 4.0 * math.exp(-s / 60) + 0.3 * random.random(),
         "lr": 3e-4, "grad_norm": random.random(),
         "tokens_per_s": 9000 + 2000 * random.random(), "tokens_per_s_per_gpu": 5000.0,
         "mfu": 0.3 + 0.1 * random.random() if s % 50 != 7 else None,           # gaps
         "step_s": 0.2 + 0.05 * random.random(), "compute_s": 0.15, "comm_s": 0.02 * random.random(),
         "offload_wait_s": 0.0, "data_s": 0.001,
         "offload_to_host_bytes": random.randint(1 << 20, 1 << 30), "offload_to_device_bytes": random.randint(0, 1 << 30)}
    if s >= 40:
        r["mem_gpu_bytes"] = random.randint(30 << 30, 40 << 30)             # known only from step 40
    out.write(json.dumps(r) + "\n")
out.write('{"step": 301, "loss": 1.52, "tokens_per')                      # cut short, no newline
EOF

if out=$($B report "$TMP/run.jsonl" --out "$TMP/run.html" 2>"$TMP/err"); then
    t_ok "report renders a log with a cut-short last line"
else
    t_fail "report renders a log with a cut-short last line" "$out $(cat "$TMP/err")"
fi
t_check "the cut-short line is reported as ignored" grep -q "line 302 is cut short" "$TMP/err"
t_check "stdout names the plots and the missing fields" bash -c "echo '$out' | grep -q 'plots: loss, lr, grad_norm, throughput, mfu, memory, offload, time' && echo '$out' | grep -q 'not in the log: mem_gpu_peak_bytes, mem_host_bytes'"

# ---- plotted points against the log ----
CHECK_POINTS=$(cat <<'EOF'
# usage: PAGE FLOOR|- LOG...   (FLOOR: the --entropy given, - for the first log's)
import html, json, math, re, sys
page, floor_arg, logs = sys.argv[1], sys.argv[2], sys.argv[3:]
X0, Y0, W, H = 70.0, 20.0, 620.0, 200.0          # workers/cli/report.h
PLOTS = {"loss": ["loss"], "lr": ["lr"], "grad_norm": ["grad_norm"], "throughput": ["tokens_per_s"], "mfu": ["mfu"],
         "memory": ["mem_gpu_bytes", "mem_gpu_peak_bytes", "mem_host_bytes"],
         "offload": ["offload_to_host_bytes", "offload_to_device_bytes"],
         "time": ["step_s", "compute_s", "comm_s", "offload_wait_s", "data_s"]}
def read(log):
    recs, settings = {}, None
    for line in open(log):
        try:
            o = json.loads(line)
        except ValueError:
            continue                                  # the cut-short line
        if o.get("kind") == "settings":
            settings = settings or o
        elif "step" in o:
            for k in [k for k in recs if k >= o["step"]]:
                del recs[k]                           # a re-logged step replaces what followed
            recs[o["step"]] = o
    return recs, settings
runs = [read(l) for l in logs]
floor = float(floor_arg) if floor_arg != "-" else (runs[0][1] or {}).get("entropy_nats")
h = open(page).read()
svgs = dict(re.findall(r'<svg [^>]*data-plot="(\w+)"[^>]*>(.*?)</svg>', h, re.S))
bad, npts = [], 0
def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
for plot, fields in PLOTS.items():
    have = sorted({s for recs, _ in runs for s in recs if any(num(recs[s].get(f)) for f in fields)})
    vals = [recs[s][f] for recs, _ in runs for s in recs for f in fields if num(recs[s].get(f))]
    if not have or not any(vals):
        if plot in svgs: bad.append("%s drawn without data (or with zeros only)" % plot)
        continue
    if plot not in svgs:
        bad.append("%s not drawn" % plot); continue
    if plot == "loss" and floor is not None: vals.append(floor)
    lo, hi = min(vals), max(vals)
    pad = 0.05 * (hi - lo) if hi > lo else 0.05 * abs(lo)
    ymin, ymax = lo - pad, hi + pad
    if lo >= 0 and ymin < 0:
        ymin = 0.0                                # a non-negative range stays at or above 0
    smin, smax = have[0], have[-1]
    body = svgs[plot]
    for r, (recs, _) in enumerate(runs):
        steps = sorted(recs)
        for f in fields:
            want = [(s, recs[s][f]) for s in steps if num(recs[s].get(f))]
            segs = re.findall(r'<polyline class="series" data-series="%s" data-run="%d"[^>]*points="([^"]*)"' % (f, r), body)
            pts = [tuple(map(float, p.split(","))) for seg in segs for p in seg.split()]
            if len(pts) != len(want):
                bad.append("%s/%s run %d: %d points for %d logged values" % (plot, f, r, len(pts), len(want))); continue
            for (x, y), (s, v) in zip(pts, want):
                ex = X0 + W * (s - smin) / (smax - smin) if smax > smin else X0 + W / 2
                ey = Y0 + H * (ymax - v) / (ymax - ymin)
                if abs(x - ex) > 0.0005 + 1e-9 or abs(y - ey) > 0.0005 + 1e-9:
                    bad.append("%s/%s run %d step %s: (%s,%s) expected (%.4f,%.4f)" % (plot, f, r, s, x, y, ex, ey))
                # and back: the value read off the plot within the rounding of the coordinates
                back = ymax - (y - Y0) / H * (ymax - ymin)
                if abs(back - v) > 0.0005 / H * (ymax - ymin) + 1e-12 * abs(v):
                    bad.append("%s/%s step %s: read back %r, logged %r" % (plot, f, s, back, v))
                npts += 1
            # a gap in the field splits the line: as many segments as runs of values
            nruns, prev = 0, False
            for s in steps:
                cur = num(recs[s].get(f))
                nruns += cur and not prev
                prev = cur
            if len(segs) != nruns:
                bad.append("%s/%s: %d line segments for %d runs of values" % (plot, f, len(segs), nruns))
if floor is not None:
    m = re.search(r'<line class="floor" data-value="([^"]+)"[^>]*y1="([^"]+)"', svgs.get("loss", ""))
    if not m or float(m.group(1)) != floor:
        bad.append("no floor line at %r" % floor)
print("checked %d points" % npts)
if bad:
    print("\n".join(bad[:20])); sys.exit(1)
EOF
)
if out=$($PY -c "$CHECK_POINTS" "$TMP/run.html" - "$TMP/run.jsonl" 2>&1); then
    t_ok "every plotted point matches the log ($(echo "$out" | tail -1))"
else
    t_fail "every plotted point matches the log" "$out"
fi

# ---- self-contained, settings, notes ----
t_check "no scripts, external links, fonts or images" $PY - "$TMP/run.html" <<'EOF'
import re, sys
h = open(sys.argv[1]).read()
assert "<script" not in h.lower()
for pat in [r'\bsrc=', r'\bhref=', r'@import', r'url\(', r'<link', r'@font-face']:
    assert not re.search(pat, h, re.I), pat
urls = set(re.findall(r'https?://[^"\s<]+', h))
assert urls <= {"http://www.w3.org/2000/svg"}, urls
EOF
t_check "settings table from the settings record" bash -c "grep -q '<th>--lr</th><td>0.0003</td>' $TMP/run.html && grep -q '<th>model</th><td>tiny</td>' $TMP/run.html"
t_check "memory plot names the absent series" grep -q "mem_host_bytes</code> (not in the log)" "$TMP/run.html"

# ---- --entropy, --title, default output name ----
cp "$TMP/run.jsonl" "$TMP/second.log.jsonl"
t_check "--entropy and --title" $B report "$TMP/second.log.jsonl" --entropy 2.5 --title "run <7> & co"
t_check "default --out is the log name with .html" test -f "$TMP/second.log.html"
if out=$($PY -c "$CHECK_POINTS" "$TMP/second.log.html" 2.5 "$TMP/second.log.jsonl" 2>&1); then
    t_ok "--entropy moves the floor and the scaling"
else
    t_fail "--entropy moves the floor and the scaling" "$out"
fi
t_check "title escaped" grep -q "<h1>run &lt;7&gt; &amp; co</h1>" "$TMP/second.log.html"

# ---- fields missing, resumed run ----
$PY - "$TMP/sparse.jsonl" <<'EOF'
import json, random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    for s in list(range(1, 11)) + list(range(6, 13)):   # resumed from step 5
        f.write(json.dumps({"step": s, "loss": 3 + random.random(), "lr": 1e-3}) + "\n")
EOF
if out=$($B report "$TMP/sparse.jsonl" --out "$TMP/sparse.html" 2>"$TMP/err"); then
    t_ok "a log with only step and loss renders"
else
    t_fail "a log with only step and loss renders" "$(cat "$TMP/err")"
fi
t_check "missing fields named" bash -c "echo '$out' | grep -q 'plots: loss, lr;' && echo '$out' | grep -q 'not in the log: grad_norm, tokens_per_s, mfu'"
t_check "no settings record said" grep -q "no settings record" "$TMP/sparse.html"
t_check "no entropy floor said" grep -q "entropy floor unknown" "$TMP/sparse.html"
t_check "re-logged steps noted" grep -q "step 6 logged again" "$TMP/err"
if out=$($PY -c "$CHECK_POINTS" "$TMP/sparse.html" - "$TMP/sparse.jsonl" 2>&1); then
    t_ok "resumed run: the later records are plotted (12 points)"
else
    t_fail "resumed run: the later records are plotted" "$out"
fi

# ---- round ticks, no negative axis for non-negative values ----
CHECK_TICKS=$(cat <<'EOF'
# usage: PAGE: every value label of every plot is a multiple of a 1-2-5 step,
# printed with no more digits than the step needs; a plot of non-negative
# values has no label and no range below 0; step labels are whole round steps
import math, re, sys
h = open(sys.argv[1]).read()
bad, n = [], 0
for attrs, body in re.findall(r'<svg ([^>]*data-plot="\w+"[^>]*)>(.*?)</svg>', h, re.S):
    plot = re.search(r'data-plot="(\w+)"', attrs).group(1)
    ymin = float(re.search(r'data-ymin="([^"]+)"', attrs).group(1))
    nonneg = 'data-nonneg="1"' in attrs
    if nonneg and ymin < 0: bad.append("%s: non-negative values, range from %r" % (plot, ymin))
    labs = re.findall(r'<text class="ylab" data-value="([^"]+)" data-tick="([^"]+)" data-tick-step="([^"]+)"[^>]*>([^<]*)</text>', body)
    if len(labs) < 2: bad.append("%s: %d value labels" % (plot, len(labs)))
    for value, tick, step, text in labs:
        st = float(step)
        mant = st / 10 ** math.floor(math.log10(st) + 1e-9)
        if min(abs(mant - m) for m in (1, 2, 5)) > 1e-9: bad.append("%s: step %s is not 1, 2 or 5 x 10^k" % (plot, step))
        k = float(tick) / st
        if abs(k - round(k)) > 1e-6: bad.append("%s: label %s is not a multiple of %s" % (plot, tick, step))
        decimals = max(0, -math.floor(math.log10(st) + 1e-9))
        if not text.startswith(tick) or len(tick.split(".")[1] if "." in tick else "") != decimals:
            bad.append("%s: label %r for tick %s (step %s)" % (plot, text, tick, step))
        if re.match(r"-0(\.0*)?\D*$", text): bad.append("%s: label %r" % (plot, text))
        if nonneg and float(value) < 0: bad.append("%s: negative label %r" % (plot, text))
        n += 1
    xs = [int(x) for x in re.findall(r'<text class="xlab" data-tick="(-?\d+)"', body)]
    if not xs: bad.append("%s: no step labels" % plot)
    d = {b - a for a, b in zip(xs, xs[1:])}
    if len(d) > 1: bad.append("%s: step labels %s, not evenly spaced" % (plot, xs))
    elif d:
        st = d.pop()
        mant = st / 10 ** math.floor(math.log10(st) + 1e-9)
        if st > 1 and min(abs(mant - m) for m in (1, 2, 5)) > 1e-9: bad.append("%s: step labels %s" % (plot, xs))
        if any(x % st for x in xs): bad.append("%s: step labels %s, not multiples of %d" % (plot, xs, st))
print("checked %d value labels" % n)
if bad: print("\n".join(bad[:20])); sys.exit(1)
EOF
)
if out=$($PY -c "$CHECK_TICKS" "$TMP/run.html" 2>&1); then t_ok "round tick values, no negative axis ($(echo "$out" | tail -1))"
else t_fail "round tick values, no negative axis" "$out"; fi

# ---- a run without offload, a resumed run's elapsed time ----
$PY - "$TMP/nooff.jsonl" <<'EOF'
import json, random, sys
random.seed(7)
with open(sys.argv[1], "w") as f:
    el = 0.0
    for i, s in enumerate(list(range(1, 21)) + list(range(16, 31))):   # killed after 20, resumed from step 15
        if i == 20: el = 0.0                                # the second process counts from 0 again
        st = 0.5 + random.random()
        el += st
        f.write(json.dumps({"step": s, "loss": 4 - 0.05 * s + 0.1 * random.random(), "lr": 1e-3 * min(1, s / 5),
                            "grad_norm": 0.5 + random.random(), "step_s": st, "compute_s": st * 0.9, "comm_s": 0.0,
                            "offload_wait_s": 0.0, "data_s": st * 0.1, "elapsed_s": el,
                            "offload_to_host_bytes": 0, "offload_to_device_bytes": 0}) + "\n")
EOF
t_check "a run without offload and with a resume renders" $B report "$TMP/nooff.jsonl" --out "$TMP/nooff.html"
t_check "no offload plot, a sentence saying there was none" $PY - "$TMP/nooff.html" <<'EOF'
import re, sys
h = open(sys.argv[1]).read()
assert 'data-plot="offload"' not in h, "an offload plot of zeros"
assert re.search(r'<p class="none" data-none="offload">No offload traffic', h), "no sentence"
assert not re.search(r'>-0(\.0*)?( [KMG]i)?B<', h), "-0 B label"
EOF
if out=$($PY -c "$CHECK_TICKS" "$TMP/nooff.html" 2>&1); then t_ok "time plot with zero series: round ticks from 0 up"
else t_fail "time plot with zero series: round ticks from 0 up" "$out"; fi
t_check "resumed run: total elapsed over both segments, and the resume marked" $PY - "$TMP/nooff.jsonl" "$TMP/nooff.html" <<'EOF'
import json, re, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
first = max(r["elapsed_s"] for r in recs[:20])
second = max(r["elapsed_s"] for r in recs[20:])
h = open(sys.argv[2]).read()
m = re.search(r'<tr data-field="elapsed" data-value="([^"]+)" data-segments="(\d+)">', h)
assert m, "no elapsed row"
assert abs(float(m.group(1)) - (first + second)) <= 1e-9 * (first + second), (m.group(1), first, second)
assert m.group(2) == "2", m.group(2)
marks = re.findall(r'<line class="resume" data-run="0" data-step="(\d+)"', h)
assert marks and set(marks) == {"16"} and len(marks) == h.count("<svg xmlns"), marks
EOF

# ---- several runs overlaid ----
$PY - "$TMP/b.jsonl" <<'EOF'
import json, math, random, sys
random.seed(99)
with open(sys.argv[1], "w") as f:
    for s in range(1, 181):
        f.write(json.dumps({"step": s, "loss": 1.5 + 3.0 * math.exp(-s / 40) + 0.2 * random.random(),
                            "lr": 6e-4 * min(1, s / 20), "grad_norm": 2 * random.random(),
                            "tokens_per_s": 20000 + 5000 * random.random(), "step_s": 0.1 + 0.02 * random.random(),
                            "compute_s": 0.09, "comm_s": 0.005, "offload_wait_s": 0.001, "data_s": 0.002,
                            "offload_to_host_bytes": random.randint(0, 1 << 28), "offload_to_device_bytes": 0}) + "\n")
EOF
if out=$($B report "$TMP/run.jsonl" "$TMP/b.jsonl" --out "$TMP/two.html" 2>"$TMP/err"); then
    t_ok "two logs overlaid: $out"
else
    t_fail "two logs overlaid" "$out $(cat "$TMP/err")"
fi
if out=$($PY -c "$CHECK_POINTS" "$TMP/two.html" - "$TMP/run.jsonl" "$TMP/b.jsonl" 2>&1); then
    t_ok "every point of both runs on one shared scale ($(echo "$out" | tail -1))"
else
    t_fail "every point of both runs on one shared scale" "$out"
fi
t_check "a legend entry per run in every plot, a summary per run" $PY - "$TMP/two.html" <<'EOF'
import re, sys
h = open(sys.argv[1]).read()
figs = re.findall(r'<svg [^>]*data-plot="(\w+)".*?<div class="legend">(.*?)</div>', h, re.S)
assert len(figs) >= 8, [f for f, _ in figs]
for plot, legend in figs:
    runs = re.findall(r'<span class="run" data-run="(\d)"><i [^>]*></i>([^<]*)</span>', legend)
    assert runs == [("0", "run.jsonl"), ("1", "b.jsonl")], (plot, runs)
assert len(re.findall(r'<h3 data-run="\d">', h)) == 4, "a summary and a settings heading per run"
EOF
if out=$($PY -c "$CHECK_TICKS" "$TMP/two.html" 2>&1); then t_ok "two runs: round ticks"
else t_fail "two runs: round ticks" "$out"; fi

# ---- bad input ----
printf 'step,loss\n1,2.5\n2,2.4\n' > "$TMP/losses.csv"
t_expect_fail "a CSV file is rejected naming file and line" "losses.csv:1: not a JSON object" $B report "$TMP/losses.csv" --out "$TMP/x.html"
head -c 2048 /dev/urandom > "$TMP/shard.bin"
t_expect_fail "a binary file is rejected naming it" "shard.bin:[0-9]+: not a JSON object" $B report "$TMP/shard.bin" --out "$TMP/x.html"
{ head -5 "$TMP/run.jsonl"; echo "loss went up here"; tail -3 "$TMP/run.jsonl"; } > "$TMP/mixed.jsonl"
t_expect_fail "a bad line in the middle names its line number" "mixed.jsonl:6: not a JSON object" $B report "$TMP/mixed.jsonl" --out "$TMP/x.html"
{ head -5 "$TMP/run.jsonl"; echo '{"step": 5, "loss": '; tail -3 "$TMP/run.jsonl"; } > "$TMP/cut.jsonl"
t_expect_fail "a cut record in the middle is an error" "cut.jsonl:6: not a JSON object" $B report "$TMP/cut.jsonl" --out "$TMP/x.html"
echo '[1, 2, 3]' > "$TMP/array.jsonl"
t_expect_fail "a JSON array is not a record" "array.jsonl:1: not a JSON object \(a JSON array" $B report "$TMP/array.jsonl" --out "$TMP/x.html"
printf '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": "2.4"}\n' > "$TMP/strloss.jsonl"
t_expect_fail "a field of the wrong type names file, line and field" 'strloss.jsonl:2: "loss" is a string' $B report "$TMP/strloss.jsonl" --out "$TMP/x.html"
printf '{"step": 1, "loss": 2.5, "step_s": -0.5}\n' > "$TMP/negtime.jsonl"
t_expect_fail "a negative time is refused naming file, line and field" 'negtime.jsonl:1: "step_s" is -0.5' $B report "$TMP/negtime.jsonl" --out "$TMP/x.html"
t_expect_fail "a bad second log is named" 'strloss.jsonl:2' $B report "$TMP/run.jsonl" "$TMP/strloss.jsonl" --out "$TMP/x.html"
echo '{"kind": "settings", "settings": {}}' > "$TMP/nosteps.jsonl"
t_expect_fail "a log without steps is an error" "no step records" $B report "$TMP/nosteps.jsonl" --out "$TMP/x.html"
t_expect_fail "a missing file is named" "nope.jsonl: No such file" $B report "$TMP/nope.jsonl"
t_expect_fail "a negative --entropy is refused" "--entropy -1" $B report "$TMP/run.jsonl" --entropy -1 --out "$TMP/x.html"
t_expect_fail "--out onto the log is refused" "would overwrite the log" $B report "$TMP/run.jsonl" --out "$TMP/run.jsonl"
t_check "no output left behind by the failures" test ! -e "$TMP/x.html"
t_done
