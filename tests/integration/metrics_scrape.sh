#!/usr/bin/env bash
# metrics_scrape.sh: scrape /metrics of a running program (metrics_demo: the
# training metrics of workers/train/progress.c plus ballastd's gauges) with
# python3 urllib, before and after three training steps. Checks the format
# (HELP and TYPE before each family, sample syntax, histogram series), the
# naming rules (ballast_ prefix, counters end in _total, no step label), the
# expected names and types, and that the counters moved by exactly what the
# steps added. Binds 127.0.0.1 on a port the kernel picks.
source "$(dirname "$0")/../lib.sh"
DEMO=$ROOT/$BUILD/tests/integration/metrics_demo
[ -x "$DEMO" ] || { t_fail "metrics_demo binary" "missing $DEMO (run make)"; t_done; exit 1; }
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
TMP=$(t_tmpdir)

# The python driver prints TAP lines itself.
timeout 60 $PY - "$DEMO" <<'EOF'
import json, re, subprocess, sys, urllib.request, urllib.error

demo = sys.argv[1]
fails = 0
def check(name, cond, why=""):
    global fails
    if cond:
        print("ok - " + name)
    else:
        fails += 1
        print("not ok - " + name)
        print("  # " + str(why)[:2000])

p = subprocess.Popen([demo, "--metrics-bind", "127.0.0.1", "--metrics-port", "0", "--rank", "3", "--gpus", "4"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
try:
    info = json.loads(p.stdout.readline())
    port = info["port"]
    check("server reports a bound port", port > 0, info)
    base = "http://127.0.0.1:%d" % port

    def scrape():
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()

    SAMPLE = re.compile(r'^([a-zA-Z_][a-zA-Z0-9_]*)(\{([^}]*)\})? (\S+)$')
    LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')

    def parse(text):
        """{family: {"type", "help", "samples": {(name, labels-tuple): value}}}; raises on bad syntax."""
        fams, cur = {}, None
        for n, line in enumerate(text.split("\n")):
            if line == "":
                continue
            if line.startswith("# HELP "):
                name = line.split(" ")[2]
                assert name not in fams, "family %s twice" % name
                fams[name] = {"help": line.split(" ", 3)[3], "type": None, "samples": {}}
                cur = name
                continue
            if line.startswith("# TYPE "):
                _, _, name, typ = line.split(" ")
                assert name == cur, "TYPE %s not right after its HELP" % name
                assert typ in ("counter", "gauge", "histogram"), typ
                fams[name]["type"] = typ
                continue
            m = SAMPLE.match(line)
            assert m, "line %d is not a sample: %r" % (n + 1, line)
            name, labels = m.group(1), m.group(3) or ""
            lab = tuple((k, v) for k, v, _ in LABEL.findall(labels))
            assert ",".join('%s="%s"' % kv for kv in lab) == labels, "bad labels %r" % labels
            fam = cur
            t = fams[fam]["type"]
            if t == "histogram":
                assert name in (fam + "_bucket", fam + "_sum", fam + "_count"), (name, fam)
            else:
                assert name == fam, "sample %s under family %s" % (name, fam)
            fams[fam]["samples"][(name, lab)] = float(m.group(4))
        return fams

    st, ctype, t1 = scrape()
    check("GET /metrics is 200", st == 200, st)
    check("content type is text format 0.0.4", ctype and ctype.startswith("text/plain; version=0.0.4"), ctype)
    try:
        f1 = parse(t1); ok = True; why = ""
    except AssertionError as e:
        f1 = {}; ok = False; why = e
    check("exposition parses (HELP, TYPE, samples)", ok, why)

    bad = [n for n in f1 if not n.startswith("ballast_")]
    check("every name starts with ballast_", not bad, bad)
    bad = [n for n, f in f1.items() if (f["type"] == "counter") != n.endswith("_total")]
    check("counters and only counters end in _total", not bad, bad)
    bad = [(n, k) for n, f in f1.items() for (_, lab) in f["samples"] for k, _ in lab if k == "step"]
    check("no step label anywhere", not bad, bad)

    want = {
        "ballast_build_info": "gauge", "ballast_train_tokens_total": "counter",
        "ballast_train_step_duration_seconds": "histogram", "ballast_train_loss": "gauge",
        "ballast_mfu_ratio": "gauge", "ballast_offload_bytes_total": "counter",
        "ballast_spill_bytes_total": "counter", "ballast_pool_used_bytes": "gauge", "ballast_sessions": "gauge",
        "ballast_train_steps_total": "counter", "ballast_train_time_seconds_total": "counter", "ballast_offload_wait_seconds_total": "counter",
    }
    for n, typ in want.items():
        check("%s is a %s" % (n, typ), n in f1 and f1[n]["type"] == typ, f1.get(n, {}).get("type"))
    bi = [(lab, v) for (_, lab), v in f1.get("ballast_build_info", {"samples": {}})["samples"].items()]
    check("build_info has version, git_sha, cuda and value 1",
          len(bi) == 1 and [k for k, _ in bi[0][0]] == ["rank", "version", "git_sha", "cuda"] and bi[0][1] == 1, bi)
    bad = [(n, lab) for n, f in f1.items() for (_, lab) in f["samples"] if ("rank", "3") not in lab]
    check("every series carries the rank label (the registry's constant label)", not bad, bad[:3])

    # three steps, then scrape again
    for i in range(3):
        p.stdin.write("step\n"); p.stdin.flush()
        r = p.stdout.readline().strip()
        check("step %d acknowledged" % (i + 1), r == "ok %d" % (i + 1), r)
    st, _, t2 = scrape()
    f2 = parse(t2)

    def val(f, fam, name=None, **labels):
        lab = tuple(sorted(labels.items()))
        for (n, l), v in f.get(fam, {"samples": {}})["samples"].items():
            if n == (name or fam) and tuple(sorted(l)) == lab:
                return v
        return None

    R = "3"
    def moved(name, fam, want_delta, sample=None, **lab):
        a = val(f1, fam, sample, **lab) or 0.0
        b = val(f2, fam, sample, **lab)
        check(name, b is not None and b - a == want_delta, "before %s after %s, want +%s" % (a, b, want_delta))

    moved("tokens_total moved by 3 steps x tokens per rank", "ballast_train_tokens_total",
          3 * info["tokens_per_rank_step"], rank=R)
    moved("steps_total moved by 3", "ballast_train_steps_total", 3, rank=R)
    moved("offload to_host bytes moved", "ballast_offload_bytes_total", 3 * info["to_host_bytes_per_step"],
          rank=R, direction="to_service")
    moved("offload to_device bytes moved", "ballast_offload_bytes_total", 3 * info["to_device_bytes_per_step"],
          rank=R, direction="from_service")
    moved("spill bytes moved", "ballast_spill_bytes_total", 3 * info["spill_bytes_per_step"], rank=R)
    moved("step duration histogram counted 3", "ballast_train_step_duration_seconds", 3,
          "ballast_train_step_duration_seconds_count", rank=R)
    inf = val(f2, "ballast_train_step_duration_seconds", "ballast_train_step_duration_seconds_bucket", rank=R, le="+Inf")
    check("+Inf bucket equals _count", inf == 3, inf)
    # buckets cumulative
    bk = sorted(((float(dict(l)["le"]), v) for (n, l), v in f2["ballast_train_step_duration_seconds"]["samples"].items()
                 if n.endswith("_bucket")))
    check("buckets cumulative", all(bk[i][1] <= bk[i + 1][1] for i in range(len(bk) - 1)), bk)
    for fam, f in f2.items():
        if f["type"] != "counter":
            continue
        for k, v in f["samples"].items():
            if k in f1.get(fam, {"samples": {}})["samples"] and v < f1[fam]["samples"][k]:
                check("counter %s %s never goes down" % (fam, k), False, (f1[fam]["samples"][k], v))
    check("loss gauge set", val(f2, "ballast_train_loss", rank=R) is not None)
    check("pool gauge mirrors the service at scrape time", val(f2, "ballast_pool_used_bytes", rank=R) == 3 * info["to_host_bytes_per_step"],
          val(f2, "ballast_pool_used_bytes", rank=R))
    check("sessions gauge", val(f2, "ballast_sessions", rank=R) == 4, val(f2, "ballast_sessions", rank=R))
    mfu = val(f2, "ballast_mfu_ratio", rank=R)
    check("mfu ratio in (0, 1)", mfu is not None and 0 < mfu < 1, mfu)
    check("gpu memory gauge appears once known", val(f2, "ballast_gpu_memory_used_bytes", rank=R) == float(40 << 30))

    try:
        urllib.request.urlopen(base + "/", timeout=10); code = 200
    except urllib.error.HTTPError as e:
        code = e.code
    check("other paths answer 404", code == 404, code)
finally:
    try:
        p.stdin.write("quit\n"); p.stdin.flush()
    except Exception:
        pass
    try:
        rc = p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill(); rc = "killed"
    check("demo exits cleanly", rc == 0, rc)
sys.exit(1 if fails else 0)
EOF
rc=$?
[ $rc -eq 124 ] && t_fail "metrics scrape" "timed out"
T_COUNT=1   # the python driver printed the TAP lines
[ $rc -eq 0 ] || T_FAILED=1

# a taken port: a clear message naming the flag
if command -v $PY >/dev/null; then
    PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    $PY -c "import socket,time,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1',$PORT)); s.listen(); open('$TMP/ready','w').close(); time.sleep(20)" &
    HOLD=$!
    for _ in $(seq 50); do [ -f "$TMP/ready" ] && break; sleep 0.1; done
    t_expect_fail "port in use names --metrics-port" "in use.*--metrics-port" bash -c "echo quit | $DEMO --metrics-port $PORT"
    kill $HOLD 2>/dev/null; wait $HOLD 2>/dev/null
fi
t_done
