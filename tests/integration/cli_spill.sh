#!/usr/bin/env bash
# cli_spill.sh: the spill tier of the ballastd that `ballast train` starts
# is sized to what the run writes there, not to the pool.
#   - two model sizes with --optimizer-offload nvme (durable): the spill
#     files the launcher's ballastd preallocates add up to the figure the
#     launcher prints, at least the two versions of optimizer state (24 bytes
#     a float of the shard, counted here from the config) and at most that
#     plus its stated headroom (a quarter, one spill file, rounding to files);
#     the larger model gets the larger tier, in proportion;
#   - --offload-spill-bytes overrides it, and a bad value is refused.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
B=$BIN/ballast
D=$(t_tmpdir)
[ -x "$BIN/ballastd" ] && [ -x "$BIN/ballast-worker" ] || { t_fail "binaries built" "missing under $BIN"; t_done; exit 1; }
"$B" data synth --out "$D/c.bin" --tokens 20000 --vocab 256 --seed 7 > /dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
# random shapes, the second about four times the first
DIM=$(( (RANDOM % 3 + 4) * 32 ))   # 128, 160 or 192
LAYERS=$(( RANDOM % 2 + 2 ))
FFN=$(( DIM * 11 / 4 ))
cfg() {  # FILE DIM: a Llama config
    cat > "$1" <<JSON
{"model_type": "llama", "hidden_size": $2, "num_hidden_layers": $LAYERS, "num_attention_heads": 4,
 "num_key_value_heads": 2, "intermediate_size": $3, "vocab_size": 256, "max_position_embeddings": 64,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
}
cfg "$D/small.json" $DIM $FFN
cfg "$D/big.json" $((DIM * 2)) $((FFN * 2))
RUN=(--data "$D/c.bin" --micro-batch 2 --seq-len 16 --steps 1 --threads 1 --optimizer-offload nvme --offload-pool 128M --rdzv-timeout 60s)

# train NAME [ARGS]: one step, the launcher's ballastd in $D/NAME; the printed spill bytes to stdout
train() {
    local n=$1; shift
    mkdir -p "$D/$n"
    timeout 120 "$B" train "${RUN[@]}" --offload-socket "$D/$n/bd.sock" --ckpt-dir "$D/$n" "$@" > "$D/$n.out" 2>&1 ||
        { echo "FAILED"; return; }
    sed -nE 's/.*started ballastd .* spill [^ ]+ \(([0-9]+) bytes.*/\1/p' "$D/$n.out" | head -1
}
files_bytes() { find "$D/$1/ballastd" -name 'spill-*' -type f -printf '%s\n' 2>/dev/null | awk '{s += $1} END {print s + 0}'; }

# check NAME CFG PRINTED: files match the figure, within [need, need + headroom]
check() {
    local n=$1 cfgf=$2 got=$3 files
    files=$(files_bytes "$n")
    "$T_PY" - "$cfgf" "$got" "$files" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
got, files = int(sys.argv[2]), int(sys.argv[3])
D, L, F, V = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
hd = D // c["num_attention_heads"]
block = D * D + 2 * D * c["num_key_value_heads"] * hd + D * D + 3 * D * F + 2 * D
rest = V * D * 2 + D
need = 24 * (L * block + rest) + 64 * 1024    # one rank, S = T = 1: two versions of 12 bytes a float, a record
largest = 12 * max(block, rest)
file = max(min(need // 4, 1 << 30), largest)
if files != got:
    sys.exit("spill files hold %d bytes, the launcher said %d" % (files, got))
if not need <= got <= need + need // 4 + 2 * file + (1 << 20):
    sys.exit("spill %d bytes for %d bytes of state: outside [need, need + 1/4 + 2 files]" % (got, need))
print(need)
PY
}
small=$(train small --model "$D/small.json")
big=$(train big --model "$D/big.json")
if [ "$small" = FAILED ] || [ "$big" = FAILED ] || [ -z "$small" ] || [ -z "$big" ]; then
    t_fail "two runs with the launcher's ballastd" "$(tail -3 "$D/small.out" "$D/big.out")"
else
    ns= nb=
    if ns=$(check small "$D/small.json" "$small" 2>&1) && nb=$(check big "$D/big.json" "$big" 2>&1); then
        t_ok "the spill files add up to the printed size, which covers two versions of the optimizer state plus the stated headroom (dim $DIM: $small bytes for $ns, dim $((DIM * 2)): $big for $nb)"
        if "$T_PY" -c "import sys; r = $big / $small; w = $nb / $ns; sys.exit(0 if abs(r / w - 1) < 0.3 else 1)"; then
            t_ok "the spill tier grows with the model ($((big / small))x for $((nb / ns))x the state)"
        else t_fail "spill in proportion to the model" "small $small, big $big bytes; state $ns vs $nb"; fi
    else t_fail "spill files sized to the run" "$ns $nb"; fi
    if grep -q "sized for 1 local rank: optimizer state .*two versions, durable" "$D/big.out"; then
        t_ok "the launcher says what the spill tier is sized for"
    else t_fail "the spill line says its sizing" "$(grep 'started ballastd' "$D/big.out")"; fi
fi

# the override, and a bad one
ov=$(train over --model "$D/small.json" --offload-spill-bytes 72M)
if [ "$ov" = $((72 << 20)) ] && [ "$(files_bytes over)" -ge $((72 << 20)) ] && grep -q "bytes; --offload-spill-bytes)" "$D/over.out"; then
    t_ok "--offload-spill-bytes 72M overrides the estimate"
else t_fail "--offload-spill-bytes override" "printed '$ov', files $(files_bytes over)"; fi
t_expect_fail "--offload-spill-bytes 12Q is refused" "--offload-spill-bytes '12Q': expected a size from 1M" \
    "$B" train "${RUN[@]}" --model "$D/small.json" --offload-socket "$D/bad.sock" --ckpt-dir "$D/bad" --offload-spill-bytes 12Q
t_done
