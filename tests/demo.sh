#!/usr/bin/env bash
# tests/demo.sh: what `make run` does. Generates the synthetic corpus (whose
# per-token entropy is known) and trains the "small" preset on it for a few
# hundred steps on the CPU backend, printing a line per step. The loss should
# fall from ~ln(256) = 5.5 towards the printed entropy floor.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/bin
OUT=${BALLAST_DEMO_DIR:-runs/demo}
STEPS=${BALLAST_DEMO_STEPS:-200}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [ ! -f "$OUT/corpus.bin" ]; then
    "$BIN/ballast" data synth --out "$OUT/corpus.bin" --tokens 2000000 --vocab 256 --seed 1
fi
floor=$(sed -nE 's/.*"entropy_nats": ([0-9.e+-]+).*/\1/p' "$OUT/corpus.bin.json")
echo "demo: corpus $OUT/corpus.bin, entropy floor $floor nats/token; training $STEPS steps"
cat > "$OUT/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "intermediate_size": 344, "vocab_size": 256, "max_position_embeddings": 512,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
"$BIN/ballast" train --nproc 1 --model "$OUT/config.json" --data "$OUT/corpus.bin" \
    --steps "$STEPS" --micro-batch 16 --seq-len 128 --lr 3e-3 --warmup-steps 20 --min-lr 3e-4 \
    --lr-schedule cosine --grad-clip 1.0 --log-every 10 --log-json "$OUT/log.jsonl" \
    --ckpt-dir "$OUT/ckpt" --ckpt-every 100
last=$(tail -1 "$OUT/log.jsonl" | sed -E 's/.*"loss": ([^,]+),.*/\1/')
echo "demo: final loss $last nats/token against the floor $floor; log in $OUT/log.jsonl, checkpoints in $OUT/ckpt"
"$BIN/ballast" report "$OUT/log.jsonl" --out "$OUT/report.html" --title "ballast demo: $STEPS steps on the synthetic corpus"
echo "demo: open $OUT/report.html for the plots (loss against the floor, throughput, memory, step time)"
echo "demo: export to Hugging Face format with: $BIN/ballast ckpt export --from $OUT/ckpt/<step dir> --out $OUT/hf"
