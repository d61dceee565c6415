#!/usr/bin/env bash
# plan_cli.sh: `ballast plan` end to end: table and JSON output, the node
# sweep, the fit printout, --calibrate FILE, --explain, GPU names,
# config.json models, and bad flags.
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
    assert x["S"] * x["T"] * x["C"] * x["R"] == d["cluster"]["nodes"] * d["cluster"]["gpus_per_node"]
    ts = x["time_s"]
    assert abs(ts["gemm"] + ts["attention_fwd"] + ts["attention_bwd"] + ts["elementwise"] - ts["compute"]) < 1e-4 * ts["compute"]
    assert abs(ts["compute"] + ts["tp_comm"] + ts["cp_exposed"] + ts["optimizer"] + ts["exposed"] - ts["step"]) < 1e-4 * ts["step"]
    assert all(v >= -1e-9 for v in ts.values()), ts
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

# ---- fit: fitted and held-out rows ----
cal=$($B plan --fit 2>&1)
n=$(echo "$cal" | grep -cE '^llama2-(7b|13b) ')
if [ "$n" = 8 ]; then t_ok "fit prints the 8 published rows"; else t_fail "fit prints the 8 published rows" "$cal"; fi
nf=$(echo "$cal" | grep -c ' fitted ')
nh=$(echo "$cal" | grep -c ' held-out ')
if [ "$nf $nh" = "4 4" ]; then t_ok "fit: 4 fitted and 4 held-out rows"; else t_fail "fit: 4 fitted and 4 held-out rows" "$nf fitted, $nh held out"; fi
# (the errors themselves: plan_accept.sh checks them against docs/plan.md)

# ---- --explain prints every term ----
ex=$($B plan --model llama2-7b --nodes 4 --seq-len 8192 --global-batch-tokens 1M --explain 2>&1)
miss=
for term in gemm attention_fwd attention_bwd elementwise tp_comm cp_comm cp_exposed shard_comm replica_comm offload \
            interference fill optimizer exposed step 'attention working set' 'ballast train'; do
    echo "$ex" | grep -q -- "$term" || miss="$miss $term"
done
if [ -z "$miss" ]; then t_ok "--explain lists every term"; else t_fail "--explain lists every term" "missing:$miss"; fi

# ---- --calibrate FILE: a measured block time replaces the estimate ----
# the measured figure is the planner's own estimate for that shape times a
# random factor, so every block term must scale by that factor
fac=$((1 + RANDOM % 2)).$((1000 + RANDOM % 9000))   # 1.1 .. 2.9999
seqs=(2048 4096 8192); seq=${seqs[$((RANDOM % 3))]}
P="$B plan --model llama3-8b --gpu h200 --nodes 2 --seq-len $seq --global-batch-tokens 1M --top 1 --cp 1 --tp 1"
$P --json > "$TMP/base.json" 2>/dev/null
read -r mb ck < <($PY -c "
import json; b = json.load(open('$TMP/base.json'))['layouts'][0]
print(b['micro_batch'], 'yes' if b['ckpt'] else 'no')")
write_results() { # ms
    cat > "$TMP/results.md" <<EOF
# GPU results
## Step time per layer (ballast plan --calibrate)

| model | gpu | seq_len | micro_batch | tp | cp | ckpt | ms_per_layer |
|---|---|---|---|---|---|---|---|
| llama2-7b | h100 | 4096 | 1 | 1 | 1 | no | — |
| llama3-8b | H200-141GB | $seq | $mb | 1 | 1 | $ck | $1 |

text after the table
EOF
}
write_results 1.0
line=$($P --calibrate "$TMP/results.md" 2>&1 | grep '^calibrated from')
est=$(echo "$line" | sed -nE 's/.*estimated ([0-9.]+) ms.*/\1/p')
if [ -n "$est" ] && echo "$line" | grep -q 'results.md:7'; then t_ok "--calibrate names the row and the estimate"
else t_fail "--calibrate names the row and the estimate" "$line"; fi
write_results "$($PY -c "print(round($est * $fac, 6))")"
$P --json --calibrate "$TMP/results.md" > "$TMP/cal.json" 2>/dev/null
t_check "--calibrate scales the block compute by measured / estimated (factor $fac)" \
    $PY - "$TMP/base.json" "$TMP/cal.json" "$fac" <<'EOF'
import json, sys
fac = float(sys.argv[3])
a = json.load(open(sys.argv[1]))["layouts"][0]
c = json.load(open(sys.argv[2]))
s = c["block_time_scale"]
assert abs(s - fac) < 2e-3 * fac, (s, fac)
b = c["layouts"][0]
assert b["time_s"]["step"] > a["time_s"]["step"]
if (a["S"], a["micro_batch"], a["ckpt"]) == (b["S"], b["micro_batch"], b["ckpt"]):
    for k in ("attention_fwd", "attention_bwd", "elementwise"):
        assert abs(b["time_s"][k] - fac * a["time_s"][k]) < 3e-3 * fac * a["time_s"][k], (k, a["time_s"][k], b["time_s"][k])
EOF
printf '## Step time per layer\n\n| model | gpu | seq_len | micro_batch | tp | cp | ckpt | ms_per_layer |\n|---|---|---|---|---|---|---|---|\n| llama2-7b | v100 | 4096 | 1 | 1 | 1 | no | 3.5 |\n' > "$TMP/bad-gpu.md"
t_expect_fail "--calibrate: unknown GPU in the file, line named" "bad-gpu.md:5: gpu 'v100' is unknown" \
    $B plan --model llama2-7b --calibrate "$TMP/bad-gpu.md"
printf '## Step time per layer\n\n| model | gpu | seq_len | micro_batch | tp | cp | ckpt | ms_per_layer |\n|---|---|---|---|---|---|---|---|\n| llama2-7b | a100-40gb | 4096 | 1 | 1 | 1 | no | fast |\n' > "$TMP/bad-ms.md"
t_expect_fail "--calibrate: a figure that is not a number" "ms_per_layer 'fast' is not a positive number" \
    $B plan --model llama2-7b --calibrate "$TMP/bad-ms.md"
printf '# results\n| a | b |\n' > "$TMP/no-table.md"
t_expect_fail "--calibrate: no table" "no heading containing 'Step time per layer'" \
    $B plan --model llama2-7b --calibrate "$TMP/no-table.md"
t_expect_fail "--calibrate: no row for this model and GPU" "no measured row for model llama2-13b on h200-141gb" \
    $B plan --model llama2-13b --gpu h200 --calibrate "$TMP/results.md"
t_expect_fail "--calibrate: missing file" "cannot open" $B plan --model llama2-7b --calibrate "$TMP/none.md"

# ---- GPU names ----
for g in H100 h200-141GB B200 l40s A100-80GB; do
    t_check "--gpu $g (any case, short names)" bash -c "$B plan --model llama2-7b --nodes 2 --gpu $g --top 1 >/dev/null"
done
$B plan --model llama2-13b --nodes 4 --gpu a100-80gb --json --top 1 > "$TMP/a100.json" 2>/dev/null
$B plan --model llama2-13b --nodes 4 --gpu b200 --json --top 1 > "$TMP/b200.json" 2>/dev/null
t_check "B200 predicts over twice A100-80GB's tokens/s" $PY -c "
import json
a, b = (json.load(open('$TMP/' + g + '.json'))['layouts'][0]['tokens_per_gpu_s'] for g in ('a100', 'b200'))
assert b > 2 * a, (a, b)"

# ---- bad flags ----
t_expect_fail "unknown GPU" "unknown GPU 'v100'" $B plan --model llama2-7b --gpu v100
t_expect_fail "zero nodes" "--nodes must be" $B plan --model llama2-7b --nodes 0
t_expect_fail "zero GPUs per node" "--gpus-per-node must be" $B plan --model llama2-7b --gpus-per-node 0
t_expect_fail "non-positive seq len" "--seq-len must be positive" $B plan --model llama2-7b --seq-len -5
t_expect_fail "batch below one sequence" "smaller than one sequence" $B plan --model llama2-7b --seq-len 4096 --global-batch-tokens 1000
t_expect_fail "bad sweep list" "sweep-nodes" $B plan --model llama2-7b --sweep-nodes 16,,x
t_expect_fail "missing model" "--model is required" $B plan --nodes 2
t_expect_fail "unknown model" "neither a preset" $B plan --model llama9-1t
t_expect_fail "bad tp" "--tensor-parallel-degree must be" $B plan --model llama2-7b --tp 3
t_expect_fail "bad cp" "--cp must be" $B plan --model llama2-7b --cp 3
t_expect_fail "offload without checkpointing" "needs checkpointing" $B plan --model llama2-7b --ckpt off --act-offload on
t_expect_fail "unknown flag" "unknown option" $B plan --model llama2-7b --frobnicate
# selective checkpointing: listed only when asked for, and its command line is the trainer's
out=$($B plan --model llama2-7b --nodes 2 --gpu h100 --seq-len 4096 --global-batch-tokens 1M --top 0 \
    --activation-checkpointing selective 2>&1)
rows=$(echo "$out" | awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF > 10')
if [ -n "$rows" ] && ! echo "$rows" | awk '{ print $6 }' | grep -qv '^sel$' &&
   echo "$out" | grep -q -- '--activation-checkpointing selective'; then
    t_ok "--activation-checkpointing selective: only selective layouts, the command says selective"
else t_fail "--activation-checkpointing selective" "$(echo "$out" | head -8)"; fi
t_check "--activation-checkpointing any lists no selective layout" bash -c \
    "! $B plan --model llama2-7b --nodes 2 --gpu h100 --top 0 | awk '\$1 ~ /^[0-9]+\$/ && \$2 ~ /^[0-9]+\$/ { print \$6 }' | grep -q sel"
t_expect_fail "a misspelt --activation-checkpointing value is named" "did you mean selective" \
    $B plan --model llama2-7b --activation-checkpointing selectiv
t_check "--help lists every flag" bash -c "$B plan --help | grep -q -- '--sweep-nodes' && $B plan --help | grep -q -- '--show-excluded' && $B plan --help | grep -q -- '--calibrate' && $B plan --help | grep -q -- '--explain'"

t_done
