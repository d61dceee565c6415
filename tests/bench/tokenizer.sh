#!/usr/bin/env bash
# tokenizer: tokens/s of our encoder (workers/data/tokenizer.c, one thread)
# against the reference (transformers.js, tests/tokenizer-ref) on the same
# text (tests/tokenizer-ref/corpus.py, seed 1), same machine, same run, for
# the Llama 3 (byte-level) and Llama 2 (SentencePiece) vocabularies; then
# `ballast data tokenize` on all cores. TOK_BENCH_BYTES sets the text size.
set -u
cd "$(dirname "$0")/../.."
B=${BUILD:-build}
REF=tests/tokenizer-ref
M=$REF/node_modules/@lenml
if ! command -v node > /dev/null || [ ! -f "$M/tokenizer-llama3/models/tokenizer.json" ]; then
    echo "tokenizer bench skipped: reference not installed ($(cat $REF/.install-status 2>/dev/null || echo 'run make deps'))"
    exit 0
fi
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
python3 $REF/corpus.py "$D" 1 "${TOK_BENCH_BYTES:-2000000}"
for fam in llama3 llama2; do
    js=$(cd $REF && node encode.js $fam "$D/valid.docs" "$D/$fam.ref")
    ours=$("$B/tests/integration/tok_tool" encode "$M/tokenizer-$fam/models" "$D/valid.docs" "$D/$fam.ours" "$D/$fam.ref")
    echo "$fam reference: $js"
    echo "$fam ours:      $ours"
    a=$(echo "$ours" | sed -E 's/.*tokens_per_s=([0-9]+).*/\1/'); b=$(echo "$js" | sed -E 's/.*tokens_per_s=([0-9]+).*/\1/')
    echo "RATIO $fam encode tokens/s, ours (1 thread) / transformers.js: $a / $b = $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.1f", a/b}')x"
done
mkdir -p "$D/txt"
python3 - "$D" <<'PY'
import struct, sys
d = sys.argv[1]; raw = open(d + "/valid.docs", "rb").read(); o = i = 0
while o < len(raw):
    n = struct.unpack_from("<I", raw, o)[0]; open(f"{d}/txt/{i:05d}.txt", "wb").write(raw[o + 4:o + 4 + n]); o += 4 + n; i += 1
PY
"$B/bin/ballast" data tokenize --tokenizer "$M/tokenizer-llama3/models" --out "$D/shards" "$D"/txt/*.txt 2>/dev/null | tail -1
