#!/usr/bin/env bash
# report_browser.sh: a `ballast report` page of two runs (one resumed, one
# without offload) loaded in headless Chromium (Debian's chromium). The page
# gets tests/integration/report_browser.js appended, which checks what the
# browser rendered: one line per series and run inside the data area, round
# value labels and none below 0 on non-negative plots, a legend entry per
# run in every plot, the plots without data, the resume marks, and that no
# script error occurred. Skipped when chromium is not installed.
source "$(dirname "$0")/../lib.sh"
B=$BIN/ballast
[ -x "$B" ] || { t_fail "ballast binary" "missing $B (run make)"; t_done; exit 1; }
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
    t_skip "report in headless Chromium" "chromium is not installed (make deps installs Debian's chromium)"
    t_done; exit 0
fi
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
TMP=$(t_tmpdir)

# two random runs: a resumed from step 31 after a kill at 40, b shorter, without offload
$PY - "$TMP/a.jsonl" "$TMP/b.jsonl" <<'PYEOF'
import json, math, random, sys
random.seed()
def run(path, steps, resume, offload, k):
    el = 0.0
    with open(path, "w") as f:
        f.write(json.dumps({"kind": "settings", "settings": {"lr": "0.0006"}, "entropy_nats": 1.2 + random.random()}) + "\n")
        order = list(range(1, steps + 1))
        if resume: order = list(range(1, resume[1] + 1)) + list(range(resume[0], steps + 1))
        for i, s in enumerate(order):
            if resume and i == resume[1]: el = 0.0
            st = k * (0.1 + 0.05 * random.random()); el += st
            r = {"step": s, "loss": 2.5 + k * 3 * math.exp(-s / 30) + 0.3 * random.random(), "lr": 6e-4 * min(1, s / 10),
                 "grad_norm": 3 * random.random(), "tokens_per_s": 1e4 / k + 3000 * random.random(), "step_s": st,
                 "compute_s": 0.8 * st, "comm_s": 0.1 * st * random.random(), "offload_wait_s": 0.0, "data_s": 0.01 * st,
                 "elapsed_s": el, "mem_gpu_bytes": random.randint(1 << 30, 3 << 30),
                 "offload_to_host_bytes": random.randint(1 << 20, 1 << 29) if offload else 0, "offload_to_device_bytes": 0}
            if s % 20 == 0: r["val_loss"] = r["loss"] + 0.1
            if s % 37 == 5: r["grad_norm"] = None                    # a gap
            f.write(json.dumps(r) + "\n")
run(sys.argv[1], 120, (31, 40), True, 1.0)
run(sys.argv[2], 80, None, False, 1.5)
PYEOF
if out=$($B report "$TMP/a.jsonl" "$TMP/b.jsonl" --out "$TMP/report.html" 2>&1); then t_ok "report of two runs written"
else t_fail "report of two runs written" "$out"; t_done; exit 1; fi

# what the page must show, from the logs; then the page with the checks appended
$PY - "$TMP/report.html" "$TMP/test.html" "$(dirname "$0")/report_browser.js" "$TMP/a.jsonl" "$TMP/b.jsonl" <<'PYEOF'
import json, math, os, sys
page, test, js, logs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
PLOTS = [("loss", ["loss", "val_loss"]), ("lr", ["lr"]), ("grad_norm", ["grad_norm"]), ("throughput", ["tokens_per_s"]),
         ("mfu", ["mfu"]), ("memory", ["mem_gpu_bytes", "mem_gpu_peak_bytes", "mem_host_bytes"]),
         ("offload", ["offload_to_host_bytes", "offload_to_device_bytes"]),
         ("time", ["step_s", "compute_s", "comm_s", "offload_wait_s", "data_s"])]
runs, resumes = [], 0
for log in logs:
    recs, last = {}, 0
    for line in open(log):
        o = json.loads(line)
        if "step" not in o: continue
        if o["step"] <= last: resumes += 1
        for k in [k for k in recs if k >= o["step"]]: del recs[k]
        recs[o["step"]] = o; last = o["step"]
    runs.append([recs[s] for s in sorted(recs)])
num = lambda v: isinstance(v, (int, float)) and math.isfinite(v)
plots, none = {}, []
for pid, fields in PLOTS:
    vals = [r[f] for rs in runs for r in rs for f in fields if num(r.get(f))]
    if not vals: continue
    if not any(vals): none.append(pid); continue
    exp = []
    for i, rs in enumerate(runs):
        for f in fields:
            segs, prev = 0, False
            for r in rs:
                cur = num(r.get(f)); segs += cur and not prev; prev = cur
            if f == "val_loss": segs = min(segs, 1)           # one line through the evaluations
            if segs: exp.append({"series": f, "run": i, "segments": segs})
    plots[pid] = exp
expect = {"plots": plots, "none": none, "names": [os.path.basename(l) for l in logs], "resumes": resumes}
h = open(page).read()
hook = "<script>window.__report_errors=[];window.addEventListener('error',function(e){window.__report_errors.push(String(e.message))});</script>"
h = h.replace("<head>", "<head>\n" + hook, 1)
h = h.replace("</body>", "<script>window.REPORT_EXPECT=%s;</script>\n<script>%s</script>\n</body>" % (json.dumps(expect), open(js).read()), 1)
open(test, "w").write(h)
PYEOF

# --no-sandbox: the tests run as root in a container; a private profile, nothing fetched
timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$TMP/profile" \
    --virtual-time-budget=3000 --dump-dom "file://$TMP/test.html" > "$TMP/dom.html" 2> "$TMP/chromium.err"
rc=$?
checks=$($PY -c 'import html, re, sys
m = re.search(r"<pre id=\"report-checks\">(.*?)</pre>", open(sys.argv[1]).read(), re.S)
print(html.unescape(m.group(1)) if m else "")' "$TMP/dom.html")
if [ -z "$checks" ]; then
    t_fail "the page's checks ran in Chromium" "exit $rc, no results in the DOM: $(tail -5 "$TMP/chromium.err")"
else
    while IFS='|' read -r res name detail; do
        if [ "$res" = PASS ]; then t_ok "chromium: $name"; else t_fail "chromium: $name" "$detail"; fi
    done <<< "$checks"
fi
t_done
