#!/usr/bin/env bash
# train_vs_torch.sh: training tokens/s of ballast-worker's CPU backend and of
# the PyTorch reference model (tests/reference/llama_ref.py, float32, AdamW,
# clipping) on the same config and batch, one after the other, with the
# ratio. Median over the steps after the first.
#
#   tests/bench/train_vs_torch.sh [MODEL] [B] [T] [STEPS] [THREADS]
#   defaults: small 8 128 12 and all cores. MODEL is a preset or config.json.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
MODEL=${1:-small}; B=${2:-8}; T=${3:-128}; STEPS=${4:-12}; THREADS=${5:-$(nproc)}
W=$BUILD/bin/ballast-worker
[ -x "$W" ] || { echo "train_vs_torch: build first (make): $W missing" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "train_vs_torch: SKIP: python3-torch missing"; exit 0; }
D=$(mktemp -d /tmp/ballast-bench.XXXXXX)
trap 'rm -rf "$D"' EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# the config as a file for both sides: a config.json as given, or a preset
# written out through a one-step checkpoint and `ballast ckpt export`
if [ -f "$MODEL" ]; then
    cp "$MODEL" "$D/config.json"
else
    "$BUILD/bin/ballast" data synth --out "$D/p.bin" --tokens 20000 --vocab 256 >/dev/null 2>&1
    "$W" --model "$MODEL" --data "$D/p.bin" --micro-batch 1 --seq-len 8 --steps 1 --lr 0 --ckpt-dir "$D/ck" >/dev/null 2>&1 &&
    "$BUILD/bin/ballast" ckpt export --from "$D/ck" --out "$D/hf" >/dev/null 2>&1 && cp "$D/hf/config.json" "$D/config.json" ||
        { echo "train_vs_torch: cannot resolve model $MODEL (a preset whose vocab is over 256 needs a config.json)" >&2; exit 1; }
fi
V=$(tr -d '\n' < "$D/config.json" | sed -nE 's/.*"vocab_size": *([0-9]+).*/\1/p')
"$BUILD/bin/ballast" data synth --out "$D/c.bin" --tokens $((B * T * (STEPS + 2) + 1000)) --vocab "$V" >/dev/null 2>&1 ||
    { echo "train_vs_torch: ballast data synth failed" >&2; exit 1; }

"$W" --model "$D/config.json" --data "$D/c.bin" --micro-batch "$B" --seq-len "$T" --steps "$STEPS" \
    --threads "$THREADS" --lr 1e-4 --log-json "$D/log.jsonl" > "$D/w.out" 2>&1 ||
    { echo "train_vs_torch: worker failed: $(tail -3 "$D/w.out")" >&2; exit 1; }
ours=$(grep '"step": ' "$D/log.jsonl" | tail -n +2 | sed -E 's/.*"tokens_per_s": ([0-9.]+).*/\1/' | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
torch=$(/usr/bin/python3 tests/reference/llama_ref.py --bench "$D/config.json" "$B" "$T" "$STEPS" "$THREADS") &&
    [ -n "$torch" ] || { echo "train_vs_torch: the PyTorch run failed" >&2; exit 1; }
echo "train_vs_torch: model $MODEL, batch $B x $T, $THREADS threads, median of $((STEPS - 1)) steps"
printf 'train_vs_torch: ballast cpu %10.1f tokens/s\n' "$ours"
printf 'train_vs_torch: pytorch    %10.1f tokens/s\n' "$torch"
awk -v a="$ours" -v b="$torch" 'BEGIN { printf "train_vs_torch: ratio ballast/pytorch %.2f\n", a / b; printf "RATIO CPU training tokens/s ballast/pytorch %.2f (%s vs %s tok/s)\n", a / b, a, b }'
# Debian's torch does its matmuls through the system libblas.so.3: the
# netlib reference BLAS unless an optimised one (libopenblas0) is installed.
blas=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null)
echo "train_vs_torch: pytorch's BLAS: ${blas:-unknown}"
