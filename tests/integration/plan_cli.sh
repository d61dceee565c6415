#!/usr/bin/env bash
# plan_cli.sh: `ballast plan` end to end: table and JSON output, the node
# sweep, the calibration printout, config.json models, and bad flags.
source "$(dirname "$0")/../lib.sh"
B=$BIN/ballast
[ -x "$B" ] || { t_fail "ballast binary" "missing $B (run make)"; t_done; exit 1; }
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
TMP=$(t_tmpdir)

# ---- listing ----
t_check "table lists layouts" bash -c "$B plan --model llama2-7b --nodes 16 --gpus-per-node 8 --gpu a100-40gb \
    --net-gbps 400 --seq-len 4096 --global-batch-tokens 4M --top 5 | grep -q 'TFLOP/s'"

if $B plan --model llama2-13b --nodes 16 --json --show-excluded --top 0 > "$TMP/list.json" 2> "$TMP/list.err"; then
    t_ok "plan --json exits 0"
else
    t_fail "plan --json exits 0" "$(cat "$TMP/list.err")"
fi
t_check "JSON parses" bash -c "$PY -c 'import json,sys; json.load(sys.stdin)' < $TMP/list.json"
# best first, every listed layout fits, every excluded one has a reason,
# memory parts add up to the total
t_check "JSON layouts sorted, fit, excluded have reasons" $PY - "$TMP/list.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
L = d["layouts"]; X = d["excluded"]
assert len(L) == d["n_feasible"] > 0, (len(L), d["n_feasible"])
assert len(X) == d["n_excluded"] > 0
t = [x["tflops_per_gpu"] for x in L]
assert t == sorted(t, reverse=True), "not best first"
for x in L:
    m = x["memory_gib"]
    parts = m["params"] + m["grads"] + m["optimizer"] + m["activations"] + m["comm_buffers"] + m["overhead"]
    assert abs(parts - m["total"]) < 1e-3 * m["total"], (parts, m["total"])
    assert m["total"] <= m["capacity"]
    assert x["S"] * x["T"] * x["R"] == d["cluster"]["nodes"] * d["cluster"]["gpus_per_node"]
    assert 0 < x["tflops_per_gpu"] < 312
    assert not x["act_offload"] or x["ckpt"]
for x in X:
    assert x["reason"], x
assert any("does not fit" in x["reason"] for x in X)
EOF

t_check "--top limits the rows" bash -c "[ \$($B plan --model llama2-7b --nodes 4 --json --top 3 | $PY -c 'import json,sys; print(len(json.load(sys.stdin)[\"layouts\"]))') = 3 ]"

# a Hugging Face config.json works as --model
cat > "$TMP/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
 "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
 "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
EOF
t_check "config.json model" bash -c "$B plan --model $TMP/config.json --nodes 2 --seq-len 2048 --global-batch-tokens 1M --json | $PY -c 'import json,sys; d=json.load(sys.stdin); assert d[\"layouts\"]'"

# TP that does not divide the heads is excluded with that reason (demo: 6 heads)
t_check "heads not divisible by T excluded" bash -c "$B plan --model demo --nodes 1 --seq-len 1024 --global-batch-tokens 64K --show-excluded | grep -q 'heads (6) do not divide by T=4'"

# nothing fits: a clear message and a non-zero exit
t_expect_fail "70B on one 40GB node does not fit" "nothing fits" $B plan --model llama2-70b --nodes 1

# ---- sweep ----
out=$($B plan --model llama2-13b --sweep-nodes 16,32,64,128 --published-grid 2>&1)
rows=$(echo "$out" | grep -cE '^ +(16|32|64|128) ')
if [ "$rows" = 4 ]; then t_ok "sweep prints one row per node count"; else t_fail "sweep prints one row per node count" "$rows rows: $out"; fi
t_check "sweep starts at 100% scaling" bash -c "echo '$out' | grep -E '^ +16 ' | grep -q '100.0%'"
t_check "sweep JSON" bash -c "$B plan --model llama3-8b --sweep-nodes 2,4,8 --json | $PY -c '
import json,sys
d = json.load(sys.stdin); s = d[\"sweep\"]
assert [r[\"nodes\"] for r in s] == [2, 4, 8], s
assert abs(s[0][\"scaling_efficiency\"] - 1) < 1e-9
assert all(0 < r[\"scaling_efficiency\"] <= 1.05 for r in s)'"

# ---- calibration ----
cal=$($B plan --calibrate 2>&1)
n=$(echo "$cal" | grep -cE '^llama2-(7b|13b) ')
if [ "$n" = 8 ]; then t_ok "calibrate prints the 8 published rows"; else t_fail "calibrate prints the 8 published rows" "$cal"; fi
t_check "calibrate JSON: residuals within 10%, ranks <= 3" bash -c "$B plan --calibrate --json | $PY -c '
import json,sys
d = json.load(sys.stdin)
assert len(d[\"rows\"]) == 8
for r in d[\"rows\"]:
    assert abs(r[\"residual\"]) < 0.10 and 1 <= r[\"rank\"] <= 3, r'"

# ---- bad flags ----
t_expect_fail "unknown GPU" "unknown GPU 'v100'" $B plan --model llama2-7b --gpu v100
t_expect_fail "zero nodes" "--nodes must be" $B plan --model llama2-7b --nodes 0
t_expect_fail "zero GPUs per node" "--gpus-per-node must be" $B plan --model llama2-7b --gpus-per-node 0
t_expect_fail "non-positive seq len" "--seq-len must be positive" $B plan --model llama2-7b --seq-len -5
t_expect_fail "batch below one sequence" "smaller than one sequence" $B plan --model llama2-7b --seq-len 4096 --global-batch-tokens 1000
t_expect_fail "bad sweep list" "sweep-nodes" $B plan --model llama2-7b --sweep-nodes 16,,x
t_expect_fail "missing model" "--model is required" $B plan --nodes 2
t_expect_fail "unknown model" "neither a preset" $B plan --model llama9-1t
t_expect_fail "bad tp" "--tp must be" $B plan --model llama2-7b --tp 3
t_expect_fail "offload without checkpointing" "needs checkpointing" $B plan --model llama2-7b --ckpt off --act-offload on
t_expect_fail "unknown flag" "unknown option" $B plan --model llama2-7b --frobnicate
t_check "--help lists every flag" bash -c "$B plan --help | grep -q -- '--sweep-nodes' && $B plan --help | grep -q -- '--show-excluded'"

t_done
