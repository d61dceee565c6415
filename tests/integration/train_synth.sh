#!/usr/bin/env bash
# train_synth.sh: a small Llama trained on the synthetic corpus reaches
# within 10% of the generator's entropy (the best achievable mean loss),
# and does not go clearly below it (which would mean the model sees the
# targets, e.g. through a broken causal mask).
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
W=$BIN/ballast-worker
B=$BIN/ballast
D=$(t_tmpdir)
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }
"$B" data synth --out "$D/c.bin" --tokens 1000000 --vocab 256 --seed 7 > "$D/synth.out" 2>&1 ||
    { t_fail "synth corpus" "$(cat "$D/synth.out")"; t_done; exit 1; }
H=$(sed -nE 's/.*"entropy_nats": ([0-9.e+-]+).*/\1/p' "$D/c.bin.json")
cat > "$D/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
 "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 256,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
start=$(date +%s)
"$W" --model "$D/config.json" --data "$D/c.bin" --steps 200 --micro-batch 16 --seq-len 64 --lr 1e-2 \
    --warmup-steps 10 --min-lr 1e-3 --log-every 50 --log-json "$D/log.jsonl" > "$D/train.out" 2>&1 ||
    { t_fail "training run" "$(tail -5 "$D/train.out")"; t_done; exit 1; }
secs=$(( $(date +%s) - start ))
mean=$(jl_get "$D/log.jsonl" --last 20 loss | awk '{ s += $1 } END { printf "%.6f", s / NR }')
first=$(jl_get "$D/log.jsonl" --first 1 loss)
echo "# entropy $H nats/token; loss $first -> mean of the last 20 steps $mean; ${secs}s"
if awk -v m="$mean" -v h="$H" 'BEGIN { exit !(h > 0 && m <= 1.10 * h) }'; then
    t_ok "mean loss of the last 20 steps $mean is within 10% of the entropy $H"
else t_fail "within 10% of the entropy" "mean loss $mean, entropy $H (limit $(awk -v h="$H" 'BEGIN{print 1.1*h}'))"; fi
if awk -v m="$mean" -v h="$H" 'BEGIN { exit !(m >= 0.95 * h) }'; then
    t_ok "the loss stays above 95% of the entropy (no peeking at targets)"
else t_fail "the loss stays above the entropy" "mean loss $mean < 0.95 x $H"; fi
t_done
