#!/usr/bin/env bash
# train_exact.sh: runs that must give bit-identical results.
#   - --resume from a checkpoint logs exactly the losses (and lr, grad norm)
#     of an uninterrupted run;
#   - --activation-checkpointing gives the same gradients and losses;
#   - the thread count does not change a bit;
#   - `ballast train --nproc 1` is the worker, --nproc 2 starts two ranks;
#   - `ballast ckpt info` verifies shards and `ballast ckpt export` writes
#     the checkpoint's weights under Hugging Face names, which --init-from
#     loads back.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
W=$BIN/ballast-worker
B=$BIN/ballast
D=$(t_tmpdir)
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }

"$B" data synth --out "$D/c.bin" --tokens 60000 --vocab 256 --seed 3 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
COMMON=(--model tiny --data "$D/c.bin" --micro-batch 4 --seq-len 32 --steps 8
        --lr 3e-3 --warmup-steps 2 --lr-schedule cosine --min-lr 1e-4 --grad-clip 0.5 --threads 2)
ARGS=("${COMMON[@]}" --grad-accum 2)

# The fields that must match bit for bit (elapsed and tokens/s may not).
# The first line of a log is the settings record (docs/observability.md).
fields() { jl_get "$1" step loss lr grad_norm; }

"$W" "${ARGS[@]}" --log-json "$D/full.jsonl" > "$D/full.out" 2>&1 || t_fail "uninterrupted run" "$(tail -3 "$D/full.out")"
if [ "$(jl_count "$D/full.jsonl")" -eq 8 ] && jl_get "$D/full.jsonl" tokens_per_s > /dev/null; then t_ok "JSON log: one line per step with tokens_per_s"
else t_fail "JSON log: one line per step" "$(cat "$D/full.jsonl")"; fi
if grep -q '^settings: .*--warmup-steps 2 .*(every one: --print-settings)' "$D/full.out" && grep -Eq '^step +8/8 \| loss [0-9.]+ \| lr .* \| grad norm .* tok/s \| .* s$' "$D/full.out"; then
    t_ok "settings line (those not at their defaults) and per-step lines printed"
else t_fail "settings line (those not at their defaults) and per-step lines printed" "$(tail -3 "$D/full.out")"; fi
first=$(fields "$D/full.jsonl" | head -1 | cut -d' ' -f2); last=$(fields "$D/full.jsonl" | tail -1 | cut -d' ' -f2)
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then t_ok "loss falls over 8 steps ($first -> $last)"
else t_fail "loss falls over 8 steps" "$first -> $last"; fi

# checkpoint at 4 and 8, forget 8, resume from 4
"$W" "${ARGS[@]}" --ckpt-dir "$D/ck" --ckpt-every 4 --log-json "$D/a.jsonl" > "$D/a.out" 2>&1 ||
    t_fail "run with checkpoints" "$(tail -3 "$D/a.out")"
if [ -f "$D/ck/step-00000004/manifest.json" ] && [ -f "$D/ck/step-00000008/shard-00000-of-00001.safetensors" ]; then
    t_ok "checkpoints step-00000004 and step-00000008 written"
else t_fail "checkpoints written" "$(ls -R "$D/ck" 2>&1 | head)"; fi
if cmp -s <(fields "$D/a.jsonl") <(fields "$D/full.jsonl"); then t_ok "checkpointing does not change the run"
else t_fail "checkpointing does not change the run" "logs differ"; fi
rm -rf "$D/ck/step-00000008"
"$W" "${ARGS[@]}" --ckpt-dir "$D/ck" --resume --log-json "$D/r.jsonl" > "$D/r.out" 2>&1 ||
    t_fail "resumed run" "$(tail -3 "$D/r.out")"
if grep -q 'resumed from .*step-00000004' "$D/r.out" && [ "$(fields "$D/r.jsonl" | head -1 | cut -d' ' -f1)" = 5 ] &&
   cmp -s <(fields "$D/r.jsonl") <(fields "$D/full.jsonl" | tail -4); then
    t_ok "resume from step 4 logs steps 5-8 bit-identical to the uninterrupted run"
else
    t_fail "resume is bit-exact" "$(diff <(fields "$D/r.jsonl") <(fields "$D/full.jsonl" | tail -4) | head -6)"
fi
t_expect_fail "resume with another micro-batch is refused" "micro-batch 4 = 8 rows per step.*--grad-accum x --micro-batch = 8" \
    "$W" "${ARGS[@]}" --micro-batch 2 --ckpt-dir "$D/ck" --resume

# activation checkpointing and threads: identical gradients and losses
"$W" "${ARGS[@]}" --steps 1 --dump-grads "$D/g0.st" > /dev/null 2>&1
"$W" "${ARGS[@]}" --steps 1 --dump-grads "$D/g1.st" --activation-checkpointing > /dev/null 2>&1
"$W" "${ARGS[@]}" --steps 1 --dump-grads "$D/g2.st" --threads 1 > /dev/null 2>&1
if [ -s "$D/g0.st" ] && cmp -s "$D/g0.st" "$D/g1.st"; then t_ok "activation checkpointing: identical logits and gradients"
else t_fail "activation checkpointing: identical gradients" "dumps differ or missing"; fi
if [ -s "$D/g0.st" ] && cmp -s "$D/g0.st" "$D/g2.st"; then t_ok "1 and 2 threads: identical logits and gradients"
else t_fail "threads: identical gradients" "dumps differ or missing"; fi
"$W" "${ARGS[@]}" --activation-checkpointing --log-json "$D/ac.jsonl" > /dev/null 2>&1
if cmp -s <(fields "$D/ac.jsonl") <(fields "$D/full.jsonl"); then t_ok "activation checkpointing: identical 8-step losses"
else t_fail "activation checkpointing: identical losses" "$(diff <(fields "$D/ac.jsonl") <(fields "$D/full.jsonl") | head -4)"; fi

# the launcher
"$B" train --nproc 1 "${ARGS[@]}" --steps 3 --log-json "$D/l.jsonl" > "$D/l.out" 2>&1
if cmp -s <(fields "$D/l.jsonl") <(fields "$D/full.jsonl" | head -3); then t_ok "ballast train --nproc 1 runs the worker"
else t_fail "ballast train --nproc 1" "$(tail -3 "$D/l.out")"; fi
# --global-batch-tokens 256 = grad-accum 2 of 4 x 32
"$W" "${COMMON[@]}" --global-batch-tokens 256 --steps 3 --log-json "$D/g.jsonl" > "$D/g.out" 2>&1
if grep -q "2 micro-steps x 4 rows x 32 tokens" "$D/g.out" && cmp -s <(fields "$D/g.jsonl") <(fields "$D/full.jsonl" | head -3); then
    t_ok "--global-batch-tokens 256 is grad-accum 2"
else t_fail "--global-batch-tokens" "$(grep batch: "$D/g.out"; tail -2 "$D/g.out")"; fi
# several processes: rank 0 alone prints (the losses are checked in fsdp_losses.sh)
if OMP_NUM_THREADS=1 "$B" train --nproc 2 "${ARGS[@]}" --threads 1 > "$D/np2.out" 2>&1 &&
   grep -q "layout: world 2 = 1 replicas x hybrid shard degree 2" "$D/np2.out" &&
   [ "$(grep -c '^step ' "$D/np2.out")" -eq 8 ]; then
    t_ok "ballast train --nproc 2 trains with 2 ranks, rank 0 printing"
else t_fail "ballast train --nproc 2" "$(tail -3 "$D/np2.out")"; fi

# SIGINT: finish the step, write a checkpoint, exit 130
"$W" "${COMMON[@]}" --steps 100000 --lr-schedule constant --ckpt-dir "$D/sig" --log-json "$D/sig.jsonl" > "$D/sig.out" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -s "$D/sig.jsonl" ] && [ "$(wc -l < "$D/sig.jsonl")" -ge 2 ] && break; sleep 0.1; done
kill -INT $pid 2>/dev/null
wait $pid; rc=$?
last=$(jl_get "$D/sig.jsonl" --last 1 step)
if [ $rc -eq 130 ] && grep -q "stopping after step $last on a signal (checkpoint saved)" "$D/sig.out" &&
   [ -f "$D/sig/$(printf 'step-%08d' "$last")/manifest.json" ]; then
    t_ok "SIGINT stops after the current step ($last) with a checkpoint, exit 130"
else t_fail "SIGINT stops cleanly" "rc $rc, last step '$last': $(tail -2 "$D/sig.out")"; fi

# ckpt info and export
t_check "ballast ckpt info verifies the shard" bash -c "'$B' ckpt info '$D/ck' | grep -q 'crc32 [0-9a-f]*, .*: ok'"
if "$B" ckpt export --from "$D/ck/step-00000004" --out "$D/hf" > "$D/e.out" 2>&1 && [ -f "$D/hf/config.json" ] &&
   [ -f "$D/hf/model.safetensors" ]; then t_ok "ckpt export writes config.json and model.safetensors"
else t_fail "ckpt export" "$(cat "$D/e.out")"; fi
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
    out=$(/usr/bin/python3 - "$D/hf/model.safetensors" "$D/ck/step-00000004/shard-00000-of-00001.safetensors" "$D/hf/config.json" <<'EOF'
import json, struct, sys
import numpy as np
def read(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
    return {k: (v["dtype"], v["shape"], np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32))
            for k, v in h.items() if k != "__metadata__"}
hf, ck, cfg = read(sys.argv[1]), read(sys.argv[2]), json.load(open(sys.argv[3]))
L, D, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
want = {"model.embed_tokens.weight": [V, D], "model.norm.weight": [D], "lm_head.weight": [V, D]}
for l in range(L):
    for n in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
              "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]:
        want["model.layers.%d.%s.weight" % (l, n)] = None
assert set(hf) == set(want), "names differ: %s" % sorted(set(hf) ^ set(want))
for k, s in want.items():
    if s: assert hf[k][1] == s, (k, hf[k][1], s)
    assert hf[k][0] == "F32" and np.array_equal(hf[k][2], ck[k][2]), k
    assert k + ".exp_avg" in ck and k + ".exp_avg_sq" in ck, k
assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
print("same")
EOF
    2>&1)
    if [ "$out" = same ]; then t_ok "exported tensors: HF names and shapes, equal to the checkpoint's weights"
    else t_fail "exported tensors" "$out"; fi
else
    t_skip "exported tensors compared" "numpy missing"
fi
"$W" --init-from "$D/hf" --data "$D/c.bin" --micro-batch 4 --seq-len 32 --steps 1 --dump-grads "$D/e.st" > "$D/i.out" 2>&1
if [ $? -eq 0 ] && grep -q "loaded weights from" "$D/i.out"; then t_ok "--init-from loads the exported directory"
else t_fail "--init-from loads the exported directory" "$(tail -3 "$D/i.out")"; fi
t_done
