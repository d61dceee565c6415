#!/usr/bin/env bash
# train_vs_torch.sh: training tokens/s of ballast-worker's CPU backend and of
# the independent PyTorch model (tests/reference/llama_ref.py, float32,
# AdamW, clipping) on the same config and batch, at 1 and 2 threads.
# ROUNDS rounds per case, alternating which side runs first; a round's
# figure is the median tokens/s of its steps after the first; each side is
# reported as the median over the rounds with the min-max, and the ratio is
# of the medians.
#
#   tests/bench/train_vs_torch.sh                       the two models below
#   tests/bench/train_vs_torch.sh MODEL B T [THREADS]   one case (MODEL: a preset or a config.json)
#   ROUNDS=n (default 3), STEPS=n steps per run (default 4)
#
# The models: dim 256, 4 layers (8 heads, 4 kv heads, MLP 688), batch 8 x 256;
# dim 512, 8 layers (8 heads, 4 kv heads, MLP 1376), batch 4 x 512; vocab 512.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-3}; STEPS=${STEPS:-4}
W=$BUILD/bin/ballast-worker
[ -x "$W" ] || { echo "train_vs_torch: build first (make): $W missing" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "train_vs_torch: SKIP: python3-torch missing"; exit 0; }
case "$ROUNDS$STEPS" in *[!0-9]*) echo "train_vs_torch: ROUNDS and STEPS must be whole numbers" >&2; exit 2 ;; esac
[ "$ROUNDS" -ge 1 ] && [ "$STEPS" -ge 2 ] || { echo "train_vs_torch: ROUNDS >= 1 and STEPS >= 2 needed" >&2; exit 2; }
D=$(mktemp -d /tmp/ballast-bench.XXXXXX)
trap 'rm -rf "$D"' EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

model() {  # name dim layers heads kv mlp: writes D/name.json
    printf '{"model_type": "llama", "hidden_size": %d, "num_hidden_layers": %d, "num_attention_heads": %d, "num_key_value_heads": %d, "intermediate_size": %d, "vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": false}\n' \
        "$2" "$3" "$4" "$5" "$6" > "$D/$1.json"
}
resolve() {  # MODEL -> D/name.json (a config.json as given, or a preset through a checkpoint export)
    if [ -f "$1" ]; then cp "$1" "$D/one.json"; return; fi
    "$BUILD/bin/ballast" data synth --out "$D/p.bin" --tokens 20000 --vocab 256 >/dev/null 2>&1
    "$W" --model "$1" --data "$D/p.bin" --micro-batch 1 --seq-len 8 --steps 1 --lr 0 --ckpt-dir "$D/ck" >/dev/null 2>&1 &&
    "$BUILD/bin/ballast" ckpt export --from "$D/ck" --out "$D/hf" >/dev/null 2>&1 && cp "$D/hf/config.json" "$D/one.json" ||
        { echo "train_vs_torch: cannot resolve model $1 (a preset whose vocab is over 256 needs a config.json)" >&2; exit 1; }
}
median_minmax() {  # numbers on stdin -> "median min max"
    sort -g | awk '{ a[NR] = $1 } END { m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; print m, a[1], a[NR] }'
}
ours() {  # cfg B T threads -> tokens/s (median of the steps after the first)
    "$W" --model "$1" --data "$D/c.bin" --micro-batch "$2" --seq-len "$3" --steps "$STEPS" --threads "$4" --lr 1e-4 \
        --log-json "$D/log.jsonl" > "$D/w.out" 2>&1 || { echo "train_vs_torch: worker failed: $(tail -3 "$D/w.out")" >&2; return 1; }
    grep '"step": ' "$D/log.jsonl" | tail -n +2 | sed -E 's/.*"tokens_per_s": ([0-9.]+).*/\1/' | median_minmax | cut -d' ' -f1
}
torch() {  # cfg B T threads
    /usr/bin/python3 tests/reference/llama_ref.py --bench "$1" "$2" "$3" "$STEPS" "$4"
}
bench_case() {  # label cfg B T threads
    local label=$1 cfg=$2 B=$3 T=$4 th=$5 r a b
    local V
    V=$(tr -d '\n' < "$cfg" | sed -nE 's/.*"vocab_size": *([0-9]+).*/\1/p')
    "$BUILD/bin/ballast" data synth --out "$D/c.bin" --tokens $((B * T * (STEPS + 2) + 1000)) --vocab "$V" >/dev/null 2>&1 ||
        { echo "train_vs_torch: ballast data synth failed" >&2; return 1; }
    : > "$D/a"; : > "$D/b"
    for ((r = 0; r < ROUNDS; r++)); do
        if [ $((r % 2)) -eq 0 ]; then a=$(ours "$cfg" "$B" "$T" "$th") && b=$(torch "$cfg" "$B" "$T" "$th") || return 1
        else b=$(torch "$cfg" "$B" "$T" "$th") && a=$(ours "$cfg" "$B" "$T" "$th") || return 1; fi
        [ -n "$a" ] && [ -n "$b" ] || { echo "train_vs_torch: a run gave no figure" >&2; return 1; }
        echo "$a" >> "$D/a"; echo "$b" >> "$D/b"
    done
    read -r am alo ahi < <(median_minmax < "$D/a")
    read -r bm blo bhi < <(median_minmax < "$D/b")
    printf 'train_vs_torch: %s, batch %d x %d, %d thread(s), %d rounds of %d steps\n' "$label" "$B" "$T" "$th" "$ROUNDS" "$STEPS"
    printf 'train_vs_torch:   ballast cpu %9.1f tokens/s [%.1f-%.1f]\n' "$am" "$alo" "$ahi"
    printf 'train_vs_torch:   pytorch     %9.1f tokens/s [%.1f-%.1f]\n' "$bm" "$blo" "$bhi"
    awk -v a="$am" -v b="$bm" -v l="$label" -v B="$B" -v T="$T" -v th="$th" 'BEGIN {
        printf "train_vs_torch:   ratio %.2f\n", a / b
        printf "RATIO CPU training tokens/s ballast/pytorch %s %dx%d %d thread(s) %.2f (%.1f vs %.1f tok/s, medians)\n", l, B, T, th, a / b, a, b }'
}

status=0
if [ $# -ge 3 ]; then
    resolve "$1"
    for th in ${4:-1 2}; do bench_case "$1" "$D/one.json" "$2" "$3" "$th" || status=1; done
else
    model d256 256 4 8 4 688
    model d512 512 8 8 4 1376
    for th in 1 2; do
        bench_case "dim 256, 4 layers" "$D/d256.json" 8 256 "$th" || status=1
        bench_case "dim 512, 8 layers" "$D/d512.json" 4 512 "$th" || status=1
    done
fi
# Debian's torch does its matmuls through the system libblas.so.3: the
# netlib reference BLAS unless an optimised one (libopenblas0) is installed.
blas=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null)
echo "train_vs_torch: pytorch's BLAS: ${blas:-unknown}"
exit $status
