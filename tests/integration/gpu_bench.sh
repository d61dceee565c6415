#!/usr/bin/env bash
# gpu_bench.sh: the benchmark machinery of tests/gpu/run.sh without a GPU.
#
# - run.sh's arguments: bad ones are refused with a message before anything
#   is built; --help lists them.
# - tests/gpu/bench_lib.sh: the parameter counts it plans with equal
#   `ballast plan`'s (the worker's own count) for every preset; the step
#   statistics of a --log-json file (mean ms/step and tokens/s over the
#   steps after the warm-up) equal an independent computation on seeded
#   random records, and unusable files are refused.
# - GPU_BENCH_DRYRUN=1 run.sh: every benchmark's command line runs on the
#   CPU (ballast-worker --backend cpu with a small model, through ballastd
#   with the pools the plan gives; gpu_train's flags through the Makefile
#   build's gpu_train), on the figures of the H200 machine (140 GiB GPU,
#   128 GiB host memory; 60 GB of free disk): activation offload moves
#   bytes only when on, the resident variant none; optimizer offload (not
#   durable: one version, 12 B/param, in the pool, nothing on disk) runs on
#   llama3.2-3b; the largest-model plan skips llama2-13b (its 156 GB
#   version needs a 73 GB spill tier beside the 83 GB pool the host allows;
#   60 GB of disk) with the figures and trains llama2-7b; the records' ms/step
#   equal the mean of the copied JSON logs.
# - A GPU too small, a spent budget and a failing worker are reported as
#   skipped, and run.sh still exits 0.
source "$(dirname "$0")/../lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
PY=/usr/bin/python3
RUN=$ROOT/tests/gpu/run.sh
D=$(t_tmpdir)

t_check "run.sh parses (bash -n)" bash -n "$RUN"
t_check "bench_lib.sh parses (bash -n)" bash -n "$ROOT/tests/gpu/bench_lib.sh"

# ---- arguments: refused before anything runs (no build directory is made) ----
export GPU_BUILD=$D/never
t_expect_fail "run.sh --bench with an unknown group" "unknown group 'bogus'.*actoff" "$RUN" --bench ours,bogus
t_expect_fail "run.sh --bench without a list" "--bench needs a list" "$RUN" --bench
t_expect_fail "run.sh --budget that is not seconds" "--budget '12x': expected whole seconds" "$RUN" --budget 12x
t_expect_fail "run.sh with an unknown argument" "unknown argument '--frob'" "$RUN" --frob
t_expect_fail "GPU_BENCH_DRYRUN other than 0/1" "GPU_BENCH_DRYRUN='yes'" env GPU_BENCH_DRYRUN=yes "$RUN"
if [ -e "$D/never" ]; then t_fail "bad arguments stop run.sh before it builds" "$D/never was created"
else t_ok "bad arguments stop run.sh before it builds"; fi
out=$("$RUN" --help 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q -- '--bench LIST' && echo "$out" | grep -q 'GPU_BENCH_DRYRUN=1'; then
    t_ok "run.sh --help lists --bench and the dry run"
else
    t_fail "run.sh --help lists --bench and the dry run" "exit $rc: $(echo "$out" | head -3)"
fi
unset GPU_BUILD

if [ ! -x "$BIN/ballast-worker" ] || [ ! -x "$BIN/ballastd" ] || [ ! -x "$BIN/ballast" ]; then
    t_fail "binaries built" "missing $BIN/ballast-worker, ballastd or ballast"; t_done; exit 1
fi

# ---- bench_lib.sh: sizes and step statistics ----
lib() {   # run a snippet with bench_lib.sh sourced
    ( ROOT=$ROOT RES=$D/lib.res LOG=$D/liblog PY=$PY GPU_BENCH_WORK=$D/libwork BUILD=$BUILD
      mkdir -p "$D/liblog"; source "$ROOT/tests/gpu/bench_lib.sh"; eval "$1" )
}
bad=""
for m in tiny small demo llama3.2-1b llama3.2-3b llama2-7b llama2-13b llama2-70b llama3-8b; do
    want=$("$BIN/ballast" plan --model "$m" --json --top 1 2>/dev/null | $PY -c 'import json,sys; print(json.load(sys.stdin)["cluster"]["params"])')
    got=$(lib "gb_model_dims $m" | cut -d' ' -f1)
    [ -n "$want" ] && [ "$want" = "$got" ] || bad="$bad $m: plan $want, bench_lib $got;"
done
if [ -z "$bad" ]; then t_ok "bench_lib parameter counts equal ballast plan's for every preset"
else t_fail "bench_lib parameter counts equal ballast plan's for every preset" "$bad"; fi

# random step records: the expected figures computed here, independently
$PY - "$D" <<'EOF'
import json, random, sys
d = sys.argv[1]
rng = random.Random(20261130)
for case in range(3):
    warm, n = rng.randint(0, 3), rng.randint(4, 9)
    tps = rng.choice([4096, 8192, 64])
    recs = [{"kind": "settings", "tokens_per_step": tps, "params": 123}, {"kind": "layout", "world": 1}]
    for s in range(1, n + 1):
        recs.append({"step": s, "loss": rng.uniform(2, 9), "step_s": rng.uniform(0.05, 3.0),
                     "offload_wait_s": rng.uniform(0, 0.01), "comm_s": rng.uniform(0, 0.02),
                     "offload_to_host_bytes": rng.randint(0, 1 << 30), "offload_to_device_bytes": rng.randint(0, 1 << 30),
                     "mem_gpu_peak_bytes": rng.randint(1 << 30, 1 << 37)})
    with open(f"{d}/rec{case}.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    t = [r for r in recs[2:] if r["step"] > warm]
    sec = sum(r["step_s"] for r in t)
    exp = {"warm": warm, "ms": 1e3 * sec / len(t), "tps": tps * len(t) / sec, "n": len(t),
           "wait": 1e3 * sum(r["offload_wait_s"] for r in t) / len(t),
           "out": sum(r["offload_to_host_bytes"] for r in t) / len(t),
           "peak": max(r["mem_gpu_peak_bytes"] for r in t)}
    json.dump(exp, open(f"{d}/exp{case}.json", "w"))
EOF
bad=""
for c in 0 1 2; do
    warm=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["warm"])' "$D/exp$c.json")
    got=$(lib "gb_step_stats $D/rec$c.jsonl $warm" 2>&1) || { bad="$bad case $c: $got;"; continue; }
    msg=$($PY - "$got" "$D/exp$c.json" <<'EOF'
import json, sys
g, e = json.loads(sys.argv[1]), json.load(open(sys.argv[2]))
pairs = [("ms_per_step", "ms"), ("tokens_per_s", "tps"), ("offload_wait_ms", "wait"), ("offload_to_host_bytes", "out"),
         ("mem_gpu_peak_bytes", "peak"), ("steps_timed", "n")]
bad = [f"{k} {g[k]} != {e[x]}" for k, x in pairs if abs(g[k] - e[x]) > 1e-9 * max(1.0, abs(e[x]))]
print("; ".join(bad))
EOF
)
    [ -n "$msg" ] && bad="$bad case $c: $msg;"
done
if [ -z "$bad" ]; then t_ok "gb_step_stats: mean ms/step, tokens/s, waits, bytes and peak of the timed steps (3 random logs)"
else t_fail "gb_step_stats: mean ms/step, tokens/s, waits, bytes and peak of the timed steps" "$bad"; fi
grep -v '"settings"' "$D/rec0.jsonl" > "$D/nosettings.jsonl"
t_expect_fail "gb_step_stats refuses a log without its settings record" "no settings record" \
    bash -c "$(declare -f lib); ROOT=$ROOT D=$D PY=$PY BUILD=$BUILD lib 'gb_step_stats $D/nosettings.jsonl 0'"
t_expect_fail "gb_step_stats refuses a log with no step after the warm-up" "none after the 50 warm-up steps" \
    bash -c "$(declare -f lib); ROOT=$ROOT D=$D PY=$PY BUILD=$BUILD lib 'gb_step_stats $D/rec0.jsonl 50'"
$PY -c '
import json, sys
import jsonlog
rows = jsonlog.records(sys.argv[1])
for r in rows:
    if r.get("step") == 3: r["step_s"] = None
print("\n".join(json.dumps(r) for r in rows))' "$D/rec1.jsonl" > "$D/nan.jsonl"
t_expect_fail "gb_step_stats refuses a non-finite step time" "step 3 has step_s None" \
    bash -c "$(declare -f lib); ROOT=$ROOT D=$D PY=$PY BUILD=$BUILD lib 'gb_step_stats $D/nan.jsonl 0'"

# ---- the dry run: every benchmark command line on the CPU ----
H200=(GPU_DEVICE_BYTES=$((143771 * 1048576)) GPU_HOST_BYTES=137438953472 GPU_DISK_BYTES=60000000000)
dry() {   # dry NAME [run.sh args]: run it into $D/NAME
    local n=$1; shift
    env GPU_BENCH_DRYRUN=1 GPU_BUILD="$D/$n" GPU_BENCH_WORK="$D/$n/bench" GPU_BENCH_WARMUP=1 GPU_BENCH_TIMED=2 \
        "${H200[@]}" "${DRY_ENV[@]}" "$RUN" "$@" > "$D/$n.out" 2>&1
}
DRY_ENV=()
dry full --bench all; rc=$?
R=$D/full/results.jsonl
if [ $rc -eq 0 ] && [ -s "$R" ]; then t_ok "dry run of every benchmark exits 0"
else t_fail "dry run of every benchmark exits 0" "exit $rc: $(tail -5 "$D/full.out")"; fi
msg=$($PY - "$R" "$D/full/log" <<'EOF'
import json, sys
import jsonlog
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
w = {r["name"]: r for r in rows if r.get("kind") == "worker_bench"}
skip = {r["what"]: r["why"] for r in rows if r.get("kind") == "skip"}
bad = []
for n in ("act-off-7b", "act-on-7b", "act-res-7b", "opt-off", "opt-on"):
    if n not in w: bad.append(f"no record of {n} (skip: {skip.get(n)})")
if bad: print("; ".join(bad)); sys.exit()
if not all(r["dry_run"] and r["ran_model"] == "small" and r["steps_timed"] == 2 for r in w.values()):
    bad.append("records not marked as a dry run of small with 2 timed steps")
if not (w["act-on-7b"]["offload_to_host_bytes"] > 0 and w["act-off-7b"]["offload_to_host_bytes"] == 0
        and w["act-res-7b"]["offload_to_host_bytes"] == 0):
    bad.append("activation bytes: on %s, off %s, resident %s" % tuple(w[n]["offload_to_host_bytes"] for n in ("act-on-7b", "act-off-7b", "act-res-7b")))
if "--activation-offload" not in w["act-on-7b"]["command"] or "--activation-offload" in w["act-off-7b"]["command"]:
    bad.append("act-on/off command lines")
if "--activation-loading-horizon 3" not in w["act-res-7b"]["command"]:
    bad.append("act-res horizon is not L - 1 = 3 for small: " + w["act-res-7b"]["command"])
if (w["opt-on"]["model"] != "llama3.2-3b" or "--optimizer-offload host" not in w["opt-on"]["command"]
        or "--optimizer-offload-durable no" not in w["opt-on"]["command"]):
    bad.append(f"opt-on: model {w['opt-on']['model']}, {w['opt-on']['command']}")
if not w["opt-on"]["offload_to_host_bytes"] > 0:
    bad.append("opt-on moved no bytes")
if not any(r.get("kind") == "largest" and r["model"] == "llama2-7b" and r["from"] == "largest-llama2-7b" for r in rows):
    bad.append("no largest record for llama2-7b")
elif ("largest-llama2-7b" not in w or "--optimizer-offload nvme --optimizer-offload-durable no" not in w["largest-llama2-7b"]["command"]
        or w["largest-llama2-7b"]["bench"] != "optnvme"):
    bad.append("largest-llama2-7b: " + str(w.get("largest-llama2-7b", {}).get("command")))
# 13B (13,015,864,320 parameters): 12 B/param = 156.2 GB a version; the pool gets the host's 128 GiB
# - 4 B/param - 2 GiB = 83.2 GB, the spill tier the rest of the version plus the pool's 2 slacks and its own
# (a dry run's slack: 32 MiB) = 73.1 GB > 60 GB of disk; its GPU memory (93 GB) fits
P13, GiB, slack = 13015864320, 1 << 30, 32 << 20
room = 137438953472 - 4 * P13 - 2 * GiB
spill = "%.1f GB" % ((12 * P13 + 2 * slack - room + slack) / 1e9)
s13 = skip.get("largest-llama2-13b", "")
if ("disk: ballastd's spill tier needs " + spill not in s13 or "156.2 GB at 12 B/param" not in s13
        or "pool of %.1f GB" % (room / 1e9) not in s13 or "GPU memory" in s13):
    bad.append("13b skip: " + str(s13))
if "largest-llama2-7b" in skip:
    bad.append("7b skipped: " + skip["largest-llama2-7b"])
ratios = {r["what"]: r for r in rows if r.get("kind") == "ratio"}
if set(ratios) != {"activation_offload", "optimizer_offload"}:
    bad.append(f"ratios {sorted(ratios)}")
else:
    a = ratios["activation_offload"]
    if abs(a["ratio"] - w["act-on-7b"]["ms_per_step"] / w["act-off-7b"]["ms_per_step"]) > 1e-12:
        bad.append("activation ratio")
# the records against the worker's own JSON logs, copied into the log directory
for n, r in w.items():
    steps = [s for s in jsonlog.steps(f"{sys.argv[2]}/{n}.jsonl") if "step_s" in s]
    t = [s["step_s"] for s in steps if s["step"] > 1]
    if len(t) != 2 or abs(r["ms_per_step"] - 1e3 * sum(t) / len(t)) > 1e-9 * r["ms_per_step"]:
        bad.append(f"{n}: ms/step {r['ms_per_step']} vs log {t}")
print("; ".join(bad))
EOF
)
if [ -z "$msg" ]; then t_ok "dry run: offload on/off/resident, optimizer offload (not durable) on 3B, largest plan (7B; 13B skipped for disk), ratios, figures from the logs"
else t_fail "dry run: offload on/off/resident, optimizer offload (not durable) on 3B, largest plan, ratios, figures from the logs" "$msg"; fi
if [ -x "$ROOT/$BUILD/tests/gpu/gpu_train" ]; then
    n=$(grep -c '"kind":"dryrun","what":"ours-[17]b\(-fp8\)\?","ok":true' "$R")
    if [ "$n" = 4 ]; then t_ok "dry run: gpu_train accepts the flags of ours-1b, ours-7b and both FP8 runs"
    else t_fail "dry run: gpu_train accepts the flags of the four gpu_train benchmarks" "$n of 4: $(grep dryrun "$R")"; fi
else
    t_skip "dry run of gpu_train's flags" "no $BUILD/tests/gpu/gpu_train (CUDA parts not built)"
fi
if grep -q 'activation offload on vs off (llama2-7b):' "$D/full.out" && grep -q 'DRY RUN' "$D/full.out" &&
   grep -q 'largest model trained with optimizer offload on one GPU: llama2-7b' "$D/full.out"; then
    t_ok "dry run: the table names the ratios, the largest model and that it was a dry run"
else
    t_fail "dry run: the table names the ratios, the largest model and that it was a dry run" "$(tail -15 "$D/full.out")"
fi
if ls "$D"/full/bench/*/spill 2>/dev/null | grep -q .; then t_fail "spill tiers removed after each run" "$(ls -d "$D"/full/bench/*/spill)"
else t_ok "spill tiers removed after each run"; fi

# ---- skipped, never failed ----
DRY_ENV=(GPU_DEVICE_BYTES=1000000000)
dry smallgpu --bench actoff,optoff,largest; rc=$?
R=$D/smallgpu/results.jsonl
n=$(grep -c '"kind": "skip".*GPU memory: needs' "$R")
if [ $rc -eq 0 ] && ! grep -q worker_bench "$R" && [ "$n" -ge 7 ]; then t_ok "a 1 GB GPU: every worker benchmark skipped for GPU memory, exit 0"
else t_fail "a 1 GB GPU: every worker benchmark skipped for GPU memory, exit 0" "exit $rc, $n GPU-memory skips: $(head -c 600 "$R")"; fi
DRY_ENV=()
dry budget --bench actoff --budget 5; rc=$?
R=$D/budget/results.jsonl
if [ $rc -eq 0 ] && [ "$(grep -c '"why": "time budget: ' "$R")" = 3 ] && ! grep -q worker_bench "$R"; then
    t_ok "a spent budget: the three activation runs skipped for time, exit 0"
else
    t_fail "a spent budget: the three activation runs skipped for time, exit 0" "exit $rc: $(cat "$R")"
fi
DRY_ENV=(BALLAST_DATA_ORDER=bogus)
dry broken --bench actoff; rc=$?
R=$D/broken/results.jsonl
if [ $rc -eq 0 ] && [ "$(grep -c '"kind": "skip", "what": "act-[a-z]*-7b", "why": "exit [12]: [^"]*bogus' "$R")" = 3 ] && ! grep -q '"ratio"' "$R"; then
    t_ok "a failing worker: reported as skipped with its exit status, no ratio, exit 0"
else
    t_fail "a failing worker: reported as skipped with its exit status, no ratio, exit 0" "exit $rc: $(cat "$R")"
fi
t_done
