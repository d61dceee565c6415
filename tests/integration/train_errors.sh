#!/usr/bin/env bash
# train_errors.sh: bad input to ballast-worker and `ballast ckpt` gives a
# message naming the file (or flag) and the problem, and a non-zero exit,
# never a crash (t_expect_fail fails on a signal).
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
W=$BIN/ballast-worker
B=$BIN/ballast
D=$(t_tmpdir)
PY=/usr/bin/python3
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }

"$B" data synth --out "$D/good.bin" --tokens 20000 --vocab 256 --seed 1 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
RUN=(--micro-batch 2 --seq-len 16 --steps 1 --threads 1)

# ---- flags and configs ----
t_expect_fail "missing --data" "--data is required" "$W" --model tiny "${RUN[@]}"
t_expect_fail "no model at all" "no model: give --model" "$W" --data "$D/good.bin" "${RUN[@]}"
t_expect_fail "unknown preset" "'nosuch' is neither a preset" "$W" --model nosuch --data "$D/good.bin" "${RUN[@]}"
t_expect_fail "bad flag value" "micro-batch" "$W" --model tiny --data "$D/good.bin" --micro-batch 0
t_expect_fail "seq-len over max_position_embeddings" "seq-len 300 exceeds .* 256" \
    "$W" --model tiny --data "$D/good.bin" --seq-len 300 --steps 1
t_expect_fail "global batch not a multiple of B*T" "global-batch-tokens 100 is not a multiple" \
    "$W" --model tiny --data "$D/good.bin" "${RUN[@]}" --global-batch-tokens 100
t_expect_fail "--grad-accum conflicting with --global-batch-tokens" "grad-accum 3 conflicts" \
    "$W" --model tiny --data "$D/good.bin" "${RUN[@]}" --grad-accum 3 --global-batch-tokens 64
t_expect_fail "a model too large for this machine's memory" "llama2-70b .* needs about .* of memory; this machine has" \
    "$W" --model llama2-70b --data "$D/good.bin" "${RUN[@]}"
t_expect_fail "--resume without --ckpt-dir" "--resume [a-z]* *needs --ckpt-dir" "$W" --model tiny --data "$D/good.bin" "${RUN[@]}" --resume

cat > "$D/heads.json" <<'EOF'
{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
 "num_key_value_heads": 3, "intermediate_size": 96, "vocab_size": 256}
EOF
t_expect_fail "config with inconsistent head counts" "heads.json.*(key_value|kv)" \
    "$W" --model "$D/heads.json" --data "$D/good.bin" "${RUN[@]}"
mkdir -p "$D/hfheads" && cp "$D/heads.json" "$D/hfheads/config.json"
t_expect_fail "--init-from with inconsistent head counts" "hfheads/config.json" \
    "$W" --init-from "$D/hfheads" --data "$D/good.bin" "${RUN[@]}"
echo '{"hidden_size": 64,' > "$D/broken.json"
t_expect_fail "config that is not JSON" "broken.json: not valid JSON" "$W" --model "$D/broken.json" --data "$D/good.bin" "${RUN[@]}"

# ---- token shards ----
"$PY" - "$D" <<'EOF'
import struct, sys
d = sys.argv[1]
def shard(path, toks, magic=20240520, version=1, count=None, cut=0):
    hdr = [magic, version, len(toks) if count is None else count] + [0] * 253
    raw = struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks)
    open(path, "wb").write(raw[:len(raw) - cut])
toks = [i % 200 for i in range(5000)]
shard(d + "/bigtok.bin", toks[:4000] + [300] + toks[4001:])
shard(d + "/magic.bin", toks, magic=12345)
shard(d + "/trunc.bin", toks, cut=1000)
EOF
t_expect_fail "token id >= vocab" "bigtok.bin.*(300|vocab)" "$W" --model tiny --data "$D/bigtok.bin" "${RUN[@]}"
t_expect_fail "wrong magic" "magic.bin.*magic" "$W" --model tiny --data "$D/magic.bin" "${RUN[@]}"
t_expect_fail "truncated shard" "trunc.bin" "$W" --model tiny --data "$D/trunc.bin" "${RUN[@]}"
t_expect_fail "missing shard" "nothere.bin" "$W" --model tiny --data "$D/nothere.bin" "${RUN[@]}"

# ---- safetensors that lie ----
"$W" --model tiny --data "$D/good.bin" "${RUN[@]}" --ckpt-dir "$D/ck" > /dev/null 2>&1
"$B" ckpt export --from "$D/ck" --out "$D/hf" > /dev/null 2>&1 || t_fail "export for the safetensors cases" "export failed"
"$PY" - "$D" <<'EOF'
import json, os, shutil, struct, sys
d = sys.argv[1]
raw = open(d + "/hf/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); body = raw[8 + n:]
def write(name, h, body=body):
    os.makedirs(d + "/" + name, exist_ok=True)
    shutil.copy(d + "/hf/config.json", d + "/" + name + "/config.json")
    hb = json.dumps(h).encode(); hb += b" " * ((8 - len(hb) % 8) % 8)
    open(d + "/" + name + "/model.safetensors", "wb").write(struct.pack("<Q", len(hb)) + hb + body)
h = json.loads(json.dumps(hdr)); t = h["model.norm.weight"]; t["data_offsets"][1] += 10**9
write("offsets", h)
h = json.loads(json.dumps(hdr)); h["model.embed_tokens.weight"]["shape"] = [256, 65]
write("shape", h)
write("wrongshape", hdr)   # valid file; its config then claims another MLP width
c = json.load(open(d + "/wrongshape/config.json")); c["intermediate_size"] = 160
json.dump(c, open(d + "/wrongshape/config.json", "w"))
os.makedirs(d + "/hugehdr", exist_ok=True); shutil.copy(d + "/hf/config.json", d + "/hugehdr/config.json")
open(d + "/hugehdr/model.safetensors", "wb").write(struct.pack("<Q", 1 << 40) + b"{}")
EOF
t_expect_fail "safetensors offsets past the end" "offsets/model.safetensors" \
    "$W" --init-from "$D/offsets" --data "$D/good.bin" "${RUN[@]}"
t_expect_fail "safetensors shape disagrees with its bytes" "shape/model.safetensors" \
    "$W" --init-from "$D/shape" --data "$D/good.bin" "${RUN[@]}"
t_expect_fail "safetensors tensor of the wrong shape for the config" "wrongshape.*gate_proj" \
    "$W" --init-from "$D/wrongshape" --data "$D/good.bin" "${RUN[@]}"
t_expect_fail "safetensors header length beyond the file" "hugehdr/model.safetensors" \
    "$W" --init-from "$D/hugehdr" --data "$D/good.bin" "${RUN[@]}"

# ---- checkpoints ----
ck=$(ls -d "$D"/ck/step-* | head -1)
printf 'X' | dd of="$ck/shard-00000-of-00001.safetensors" bs=1 seek=5000 conv=notrunc 2>/dev/null
t_expect_fail "damaged checkpoint shard on resume" "shard-00000-of-00001.safetensors.*crc32" \
    "$W" --model tiny --data "$D/good.bin" "${RUN[@]}" --steps 2 --ckpt-dir "$D/ck" --resume
t_expect_fail "ckpt info reports the damage" "DAMAGED" "$B" ckpt info "$D/ck"
t_expect_fail "ckpt export of a non-checkpoint" "no manifest.json" "$B" ckpt export --from "$D" --out "$D/x"
t_expect_fail "ckpt export without --out" "--out DIR are required" "$B" ckpt export --from "$D/ck"
t_done
