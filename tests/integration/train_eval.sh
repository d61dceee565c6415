#!/usr/bin/env bash
# train_eval.sh: what a run reports and keeps beyond the training loss.
#   - --val-data with --eval-every: the validation loss in the JSON log at
#     exactly the evaluation steps and after the last, on the progress
#     line, in /metrics (ballast_train_val_loss) and in `ballast report`;
#     equal to `ballast eval` of the final checkpoint on the same windows;
#     the same in a world of 2 (S 2, and T 2) up to reduction order;
#   - --lr-schedule linear and wsd: the logged lr of every step against the
#     formula of docs/training.md, computed here; --min-lr-ratio;
#   - --ckpt-keep 2: only the two newest complete checkpoints stay, a
#     step-N.tmp directory is left alone;
#   - `ballast ckpt export --dtype bf16`: torch_dtype bfloat16, and with a
#     recorded --tokenizer the tokenizer files beside the weights;
#   - bad flags named: --eval-every without --val-data, --min-lr with
#     --min-lr-ratio, --ckpt-keep without --ckpt-dir, a validation shard
#     too small, a rope_scaling type that is not supported.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
W=$BIN/ballast-worker
B=$BIN/ballast
D=$(t_tmpdir)
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }
"$B" data synth --out "$D/train.bin" --tokens 40000 --vocab 256 --seed 3 >/dev/null 2>&1 &&
"$B" data synth --out "$D/val.bin" --tokens 3000 --vocab 256 --seed 4 >/dev/null 2>&1 ||
    { t_fail "synth corpora" "ballast data synth failed"; t_done; exit 1; }
COMMON=(--model tiny --data "$D/train.bin" --micro-batch 4 --seq-len 32 --lr 3e-3 --threads 2)

# ---- validation loss ----
"$W" "${COMMON[@]}" --steps 6 --val-data "$D/val.bin" --eval-every 2 --eval-batches 3 --ckpt-dir "$D/ck" \
    --log-json "$D/v.jsonl" > "$D/v.out" 2>&1 || t_fail "run with --val-data" "$(tail -3 "$D/v.out")"
vsteps=$(/usr/bin/python3 -c 'import sys, jsonlog; print(" ".join(str(r["step"]) for r in jsonlog.steps(sys.argv[1]) if r.get("val_loss") is not None))' "$D/v.jsonl")
if [ "$vsteps" = "2 4 6" ]; then t_ok "val_loss logged at steps 2, 4, 6 (--eval-every 2) and nowhere else"
else t_fail "val_loss logged at the evaluation steps" "steps with val_loss: '$vsteps'"; fi
if grep -Eq '^step +2/6 \| loss [0-9.]+ \| val loss [0-9.]+ \|' "$D/v.out" && grep -q '^validation: 3 micro-batches' "$D/v.out"; then
    t_ok "progress line shows the validation loss; the start-up says what is evaluated"
else t_fail "progress line shows the validation loss" "$(grep -E '^(step|validation)' "$D/v.out" | head -4)"; fi
# /metrics of a long run: the gauge is the last logged val_loss
PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$W" "${COMMON[@]}" --steps 1000000 --lr-schedule constant --val-data "$D/val.bin" --eval-every 2 --eval-batches 1 \
    --log-every 1000 --log-json "$D/long.jsonl" --metrics-port "$PORT" --metrics-bind 127.0.0.1 > "$D/long.out" 2>&1 &
WPID=$!
for _ in $(seq 1 300); do n=$(jl_count "$D/long.jsonl" 2>/dev/null); [ "${n:-0}" -ge 4 ] && break; sleep 0.1; done
m=$(curl -s --max-time 10 "http://127.0.0.1:$PORT/metrics" 2>/dev/null | grep -E '^ballast_train_val_loss[{ ]' || true)
sleep 0.3
if [ -n "$m" ] && /usr/bin/python3 - "$D/long.jsonl" "${m##* }" <<'PY'
import sys, jsonlog
v = [r["val_loss"] for r in jsonlog.steps(sys.argv[1]) if r.get("val_loss") is not None]
sys.exit(0 if any(abs(x - float(sys.argv[2])) <= 1e-6 * abs(x) for x in v) else 1)
PY
then t_ok "/metrics: $m, a logged val_loss"
else t_fail "/metrics has ballast_train_val_loss" "scraped '$m'; $(tail -2 "$D/long.out")"; fi
kill -TERM $WPID 2>/dev/null; wait $WPID 2>/dev/null
last=$(jl_get "$D/v.jsonl" --step 6 val_loss)
ev=$("$B" eval --from "$D/ck" --data "$D/val.bin" --seq-len 32 --micro-batch 4 --batches 3 --json --threads 2 2>&1)
evl=$(echo "$ev" | /usr/bin/python3 -c 'import json,sys; print(repr(json.load(sys.stdin)["loss"]))' 2>/dev/null)
if [ -n "$evl" ] && /usr/bin/python3 -c "import sys; a,b=$last,$evl; sys.exit(0 if abs(a-b)<=1e-6*abs(b) else 1)"; then
    t_ok "ballast eval of the final checkpoint equals the last val_loss ($evl vs $last)"
else t_fail "ballast eval of the final checkpoint equals the last val_loss" "eval '$ev' vs logged '$last'"; fi
txt=$("$B" eval --from "$D/ck" --data "$D/val.bin" --threads 2 2>&1)
if echo "$txt" | grep -Eq 'loss [0-9.]+, perplexity [0-9.]+ \([0-9]+ tokens'; then t_ok "ballast eval prints loss and perplexity: $txt"
else t_fail "ballast eval prints loss and perplexity" "$txt"; fi
"$B" report "$D/v.jsonl" --out "$D/r.html" > /dev/null 2>&1
if grep -q 'data-series="val_loss"' "$D/r.html" 2>/dev/null && grep -q 'validation loss' "$D/r.html"; then
    t_ok "ballast report plots val_loss and names the last one"
else t_fail "ballast report shows the validation loss" "$(ls -la "$D/r.html" 2>&1)"; fi
"$W" "${COMMON[@]}" --micro-batch 4 --steps 6 --val-data "$D/val.bin" --eval-every 3 --eval-batches 3 \
    --data-order sequential --log-json "$D/v1.jsonl" > "$D/v1.out" 2>&1
"$B" train --nproc 2 --hybrid-shard-degree 2 "${COMMON[@]}" --micro-batch 2 --steps 6 --val-data "$D/val.bin" \
    --eval-every 3 --eval-batches 3 --data-order sequential --log-json "$D/v2.jsonl" > "$D/v2.out" 2>&1
"$B" train --nproc 2 --tensor-parallel-degree 2 "${COMMON[@]}" --micro-batch 4 --steps 6 --val-data "$D/val.bin" \
    --eval-every 3 --eval-batches 3 --data-order sequential --log-json "$D/vt.jsonl" > "$D/vt.out" 2>&1
for v in v2 vt; do
if /usr/bin/python3 - "$D/v1.jsonl" "$D/$v.jsonl" <<'PY'
import sys, jsonlog
a = {r["step"]: r.get("val_loss") for r in jsonlog.steps(sys.argv[1])}
b = {r["step"]: r.get("val_loss") for r in jsonlog.steps(sys.argv[2])}
ok = a[3] and b[3] and a[6] and b[6] and all(abs(a[s] - b[s]) <= 1e-5 * abs(a[s]) for s in (3, 6))
print(a[3], b[3], a[6], b[6])
sys.exit(0 if ok else 1)
PY
then t_ok "world 2 ($([ $v = v2 ] && echo "S 2, micro-batch 2 each" || echo "T 2")) gives one process's val_loss within 1e-5"
else t_fail "world 2 ($v) gives one process's val_loss" "$(tail -2 "$D/$v.out")"; fi
done

# ---- schedules ----
for sch in linear wsd; do
    "$W" "${COMMON[@]}" --steps 20 --warmup-steps 3 --lr-schedule $sch --decay-fraction 0.3 --min-lr-ratio 0.1 \
        --log-json "$D/$sch.jsonl" > "$D/$sch.out" 2>&1 || t_fail "--lr-schedule $sch" "$(tail -3 "$D/$sch.out")"
    if /usr/bin/python3 - "$D/$sch.jsonl" $sch <<'PY'
import sys, jsonlog
recs = jsonlog.steps(sys.argv[1]); sch = sys.argv[2]
lr, lo, W, S, f = 3e-3, 3e-4, 3, 20, 0.3
bad = []
for r in recs:
    k = r["step"] - 1
    if k < W: want = lr * (k + 1) / W
    elif sch == "linear": want = lo + (lr - lo) * (1 - min(1, (k - W) / max(1, S - W)))
    else:
        dd = min(S - W, int(f * S + 0.5)); k0 = S - dd
        want = lr if k < k0 else lo + (lr - lo) * (1 - min(1, (k - k0) / max(1, dd)))
    if abs(r["lr"] - want) > 1e-9 * lr: bad.append((r["step"], r["lr"], want))
print(bad[:3])
sys.exit(0 if len(recs) == 20 and not bad else 1)
PY
    then t_ok "--lr-schedule $sch with --min-lr-ratio 0.1: every step's lr is the formula's"
    else t_fail "--lr-schedule $sch: lr per step" "see the lines above"; fi
done

# ---- checkpoints kept ----
mkdir -p "$D/keep/step-00000001.tmp"
"$W" "${COMMON[@]}" --steps 8 --ckpt-dir "$D/keep" --ckpt-every 2 --ckpt-keep 2 --tokenizer "$D/tok" \
    > "$D/keep.out" 2>&1 && t_fail "--tokenizer of a missing path refused" "the run started"
mkdir -p "$D/tok" && printf '{"model": {"type": "BPE"}}' > "$D/tok/tokenizer.json"
"$W" "${COMMON[@]}" --steps 8 --ckpt-dir "$D/keep" --ckpt-every 2 --ckpt-keep 2 --tokenizer "$D/tok" \
    > "$D/keep.out" 2>&1 || t_fail "run with --ckpt-keep 2" "$(tail -3 "$D/keep.out")"
left=$(cd "$D/keep" && ls -d step-* | tr '\n' ' ')
if [ "$left" = "step-00000001.tmp step-00000006 step-00000008 " ]; then
    t_ok "--ckpt-keep 2 keeps the two newest complete checkpoints and leaves step-N.tmp alone"
else t_fail "--ckpt-keep 2" "left: $left"; fi
if grep -q "\"tokenizer\": \"$D/tok\"" "$D/keep/step-00000008/manifest.json"; then t_ok "the manifest records --tokenizer"
else t_fail "the manifest records --tokenizer" "$(grep tokenizer "$D/keep/step-00000008/manifest.json")"; fi

# ---- export ----
"$B" ckpt export --from "$D/ck" --out "$D/hf16" --dtype bf16 > "$D/e.out" 2>&1 || t_fail "export bf16" "$(cat "$D/e.out")"
if grep -q '"torch_dtype": "bfloat16"' "$D/hf16/config.json" && ! ls "$D/hf16/tokenizer.json" 2>/dev/null; then
    t_ok "export --dtype bf16 writes torch_dtype bfloat16 (no tokenizer recorded: none written)"
else t_fail "export --dtype bf16 writes torch_dtype bfloat16" "$(grep torch_dtype "$D/hf16/config.json")"; fi
"$B" ckpt export --from "$D/ck" --out "$D/hf32" > "$D/e.out" 2>&1
if grep -q '"torch_dtype": "float32"' "$D/hf32/config.json"; then t_ok "export --dtype f32 writes torch_dtype float32"
else t_fail "export f32 torch_dtype" "$(grep torch_dtype "$D/hf32/config.json")"; fi

# ---- refused ----
t_expect_fail "--eval-every without --val-data is refused" "need --val-data" "$W" "${COMMON[@]}" --steps 2 --eval-every 1
t_expect_fail "--min-lr with --min-lr-ratio is refused" "give one of them" "$W" "${COMMON[@]}" --steps 2 --min-lr 1e-4 --min-lr-ratio 0.1
t_expect_fail "--ckpt-keep without --ckpt-dir is refused" "ckpt-keep needs --ckpt-dir" "$W" "${COMMON[@]}" --steps 2 --ckpt-keep 1
"$B" data synth --out "$D/tinyval.bin" --tokens 100 --vocab 256 --seed 5 >/dev/null 2>&1
t_expect_fail "a validation shard smaller than one batch is named" "tinyval.bin: 100 tokens, fewer than one evaluation batch" \
    "$W" "${COMMON[@]}" --steps 2 --val-data "$D/tinyval.bin"
cat > "$D/yarn.json" <<'JSON'
{"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 256,
 "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
JSON
t_expect_fail "a rope_scaling type that is not supported is refused by name" 'rope_scaling type "yarn" is not supported' \
    "$W" --model "$D/yarn.json" --data "$D/train.bin" --steps 1
t_done
