#!/usr/bin/env bash
# tests/demo.sh: what `make run` does. Generates the synthetic corpus (whose
# per-token entropy is known) and trains a small Llama on it with 2 worker
# processes on the CPU backend: hybrid sharding (each rank holds half of the
# weights, gradients and AdamW state), activation offload and optimizer
# offload through a ballastd that `ballast train` starts for the run and
# stops at the end (docs/offload.md). The loss falls from ~ln(256) = 5.5
# towards the printed entropy floor. The last 100K tokens of the corpus are
# held out: after training, `ballast eval` measures the checkpoint's loss on
# them and `ballast generate` continues a prompt taken from them (token ids:
# the synthetic corpus has no tokenizer). A closing summary gives the final
# and validation losses against the floor, throughput, offload traffic, the
# sample and where everything is.
#
# BALLAST_DEMO_DIR (default runs/demo) and BALLAST_DEMO_STEPS (default 200)
# change where and how long.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/bin
OUT=${BALLAST_DEMO_DIR:-runs/demo}
STEPS=${BALLAST_DEMO_STEPS:-200}
NPROC=2
mkdir -p "$OUT"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [ ! -f "$OUT/corpus.bin" ]; then
    "$BIN/ballast" data synth --out "$OUT/corpus.bin" --tokens 2000000 --vocab 256 --seed 1
fi
floor=$(sed -nE 's/.*"entropy_nats": ([0-9.e+-]+).*/\1/p' "$OUT/corpus.bin.json")
# held-out split: train.bin is all but the last 100K tokens, val.bin those
/usr/bin/python3 - "$OUT" <<'EOF'
import struct, sys
out = sys.argv[1]
raw = open(out + "/corpus.bin", "rb").read()
hdr = list(struct.unpack("<256i", raw[:1024]))
n, hold = hdr[2], 100000
toks = raw[1024:1024 + 2 * n]
for name, part in (("train.bin", toks[:2 * (n - hold)]), ("val.bin", toks[2 * (n - hold):])):
    h = hdr[:]
    h[2] = len(part) // 2
    with open(out + "/" + name, "wb") as f:
        f.write(struct.pack("<256i", *h) + part)
EOF
echo "demo: corpus $OUT/corpus.bin, entropy floor $floor nats/token"
echo "demo: training $STEPS steps with $NPROC ranks (hybrid shard degree $NPROC), activation and optimizer offload"
cat > "$OUT/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "intermediate_size": 344, "vocab_size": 256, "max_position_embeddings": 512,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
rm -f "$OUT/log.jsonl" "$OUT/train.out"
rc=0
"$BIN/ballast" train --nproc $NPROC --hybrid-shard-degree $NPROC \
    --model "$OUT/config.json" --data "$OUT/train.bin" \
    --steps "$STEPS" --micro-batch 8 --seq-len 128 --lr 3e-3 --warmup-steps 20 --min-lr 3e-4 \
    --lr-schedule cosine --grad-clip 1.0 --log-every 10 --log-json "$OUT/log.jsonl" \
    --ckpt-dir "$OUT/ckpt" --ckpt-every 100 \
    --activation-offload --activation-loading-horizon 0 --optimizer-offload nvme \
    --offload-socket "$OUT/ballastd.sock" --offload-job demo --offload-pool 256M --offload-spill-bytes 512M 2>&1 | tee "$OUT/train.out" || rc=$?
[ "${PIPESTATUS[0]}" = 0 ] && [ $rc = 0 ] || { echo "demo: training failed (see $OUT/train.out)" >&2; exit 1; }

# the held-out loss of the final checkpoint, and a sample continuing a held-out prompt
"$BIN/ballast" eval --from "$OUT/ckpt" --data "$OUT/val.bin" --seq-len 128 --micro-batch 8 --batches 16 --json \
    > "$OUT/eval.json"
prompt=$(/usr/bin/python3 -c 'import struct,sys; r=open(sys.argv[1],"rb").read(); print(",".join(str(x) for x in struct.unpack("<16H", r[1024:1056])))' "$OUT/val.bin")
"$BIN/ballast" generate --from "$OUT/ckpt" --prompt-ids "$prompt" --max-new-tokens 24 --temperature 0.8 --top-k 20 \
    --seed 1 --ids > "$OUT/sample.txt"
echo "$prompt" > "$OUT/prompt.txt"

"$BIN/ballast" report "$OUT/log.jsonl" --out "$OUT/report.html" --entropy "$floor" \
    --title "ballast demo: $STEPS steps, $NPROC ranks, hybrid sharding and offload, synthetic corpus"

# ---- closing summary ----
/usr/bin/python3 - "$OUT" "$floor" "$STEPS" <<'EOF'
import json, re, sys
out, floor, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
recs = {}
for line in open(out + "/log.jsonl"):
    j = json.loads(line)
    if "step" in j and "loss" in j:
        recs[j["step"]] = j
first, last = recs[min(recs)], recs[max(recs)]
tail = [recs[s] for s in sorted(recs)[len(recs) // 2:]]
tps = sum(r["tokens_per_s"] for r in tail) / len(tail)
text = open(out + "/train.out").read()
traffic = re.findall(r"^offload: .* to ballastd, .* back .*$", text, re.M)
bd = re.findall(r"started ballastd \(pid \d+\) on (\S+): .*log (\S+)", text)
print("")
print("demo summary")
print("  loss        %.4f at step 1 -> %.4f at step %d; entropy floor %.4f (gap %.4f nats/token)"
      % (first["loss"], last["loss"], max(recs), floor, last["loss"] - floor))
ev = json.load(open(out + "/eval.json"))
print("  validation  loss %.4f (perplexity %.2f) on %d held-out tokens, %.4f above the floor"
      % (ev["loss"], ev["perplexity"], ev["tokens"], ev["loss"] - floor))
print("  sample      prompt %s -> %s (token ids; temperature 0.8, top-k 20)"
      % (open(out + "/prompt.txt").read().strip().replace(",", " "), open(out + "/sample.txt").read().strip()))
print("  throughput  %.0f tokens/s over the second half (%d ranks, %d tokens in all)"
      % (tps, 2, last.get("tokens", 0)))
print("  offload     " + (traffic[-1][len("offload: "):] if traffic else "(no traffic line)"))
if bd:
    print("  ballastd    started on %s for the run, stopped at the end; log %s" % bd[-1])
print("  log         %s/log.jsonl (console: %s/train.out)" % (out, out))
print("  report      %s/report.html (loss against the floor, throughput, memory, step time)" % out)
print("  checkpoints %s/ckpt (sharded; export: ballast ckpt export --from %s/ckpt/step-%08d --out %s/hf)"
      % (out, out, max(recs), out))
if last["loss"] >= first["loss"]:
    sys.exit("demo: the loss did not fall")
EOF
