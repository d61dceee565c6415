#!/usr/bin/env bash
# ckpt_compat.sh: one process writes the checkpoint format of every layout
# (layout (1, 1, 1), one shard file of 1-D parts), and the checkpoints that
# one-process runs wrote before there was a single training loop (whole
# tensors with their full shapes, a manifest without TP fields) still load.
# ckpt_v1.py writes that earlier form from a new checkpoint, as the earlier
# writer laid it out (the same bytes for the same tensors). Then:
#   - one process writes layout (1, 1, 1) with TP fields and 1-D parts;
#   - the earlier form is read by `ballast ckpt info` (shard verified),
#     `ballast ckpt export` (the same weights, bit for bit, as the export of
#     the new checkpoint it was made from);
#   - --resume from it in one process logs steps 5-8 bit-identical to the
#     uninterrupted run and ends with its parameters, bit for bit;
#   - --resume from it in a sharded run (world 2, S 2; and the same for
#     the new form) continues the run: steps 5-8 within 1e-5 (the sums run
#     in another order), parameters within 1e-4;
#   - a damaged shard of the earlier form is named on --resume.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/fsdp.lib"
fsdp_numpy_setup "$BIN" "checkpoint forms"
V1="$ROOT/tests/integration/ckpt_v1.py"
fsdp_tiny "$D" 8
ARGS=(--model "$D/m.json" --init-seed 5 --data "$D/c.bin" --seq-len 32 --grad-accum 2 --steps 8 --lr 3e-3
      --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1 --rdzv-timeout 60s)
fields() { jl_get "$1" step loss lr grad_norm; }

# one process, 8 steps, checkpoints at 4 and 8
if "$W" "${ARGS[@]}" --micro-batch 4 --ckpt-dir "$D/ck" --ckpt-every 4 --log-json "$D/full.jsonl" \
        --dump-params "$D/full.st" > "$D/full.out" 2>&1; then
    t_ok "one process: 8 steps with checkpoints at 4 and 8"
else t_fail "one process with checkpoints" "$(tail -3 "$D/full.out")"; t_done; exit 1; fi
fields "$D/full.jsonl" | tail -4 > "$D/tail.txt"
grep '^{"step"' "$D/full.jsonl" | tail -4 > "$D/full-tail.jsonl"
if $PY - "$D/ck/step-00000004/manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
lay = m["layout"]
assert (lay["world"], lay["shard_degree"], lay["tensor_parallel_degree"]) == (1, 1, 1), lay
assert len(m["shards"]) == 1 and m["shards"][0]["file"] == "shard-00000-of-00001.safetensors"
assert all(t["tp_size"] == 1 and t["tp_rank"] == 0 for t in m["shards"][0]["tensors"])
PYEOF
then t_ok "one process writes layout (1, 1, 1): one shard file, parts with TP fields"
else t_fail "one-process checkpoint layout" "see above"; fi
t_expect_fail "ckpt_v1.py check tells the new form from the earlier one" "ckpt_v1.py check" \
    $PY "$V1" check "$D/ck/step-00000004"

# the earlier form of step 4
mkdir -p "$D/old"
if $PY "$V1" write "$D/ck/step-00000004" "$D/old/step-00000004" && $PY "$V1" check "$D/old/step-00000004" &&
   $PY "$V1" same "$D/ck/step-00000004" "$D/old/step-00000004"; then
    t_ok "the earlier one-process form of step 4 written: whole 2-D tensors, no TP fields, the same state"
else t_fail "earlier form written" "see above"; t_done; exit 1; fi
t_check "ballast ckpt info reads the earlier form and verifies its shard" bash -c \
    "'$B' ckpt info '$D/old/step-00000004' | grep -q 'shard-00000-of-00001.safetensors: .*crc32 [0-9a-f]*, 21 tensors x 3 states: ok'"
if "$B" ckpt export --from "$D/old/step-00000004" --out "$D/hf-old" > "$D/e1.out" 2>&1 &&
   "$B" ckpt export --from "$D/ck/step-00000004" --out "$D/hf-new" > "$D/e2.out" 2>&1; then
    t_check "ballast ckpt export of the earlier form: the weights of the new form's export, bit for bit" \
        cmp "$D/hf-old/model.safetensors" "$D/hf-new/model.safetensors"
else t_fail "ckpt export of both forms" "$(tail -2 "$D/e1.out" "$D/e2.out")"; fi

# --resume from the earlier form: one process, then a sharded run
awk '{print} /^\{"step"/ && ++n == 4 {exit}' "$D/full.jsonl" > "$D/r1.jsonl"
if "$W" "${ARGS[@]}" --micro-batch 4 --ckpt-dir "$D/old" --resume --log-json "$D/r1.jsonl" --dump-params "$D/r1.st" \
        > "$D/r1.out" 2>&1 && grep -q "resumed from .*old/step-00000004 (step 4)" "$D/r1.out"; then
    if cmp -s <(fields "$D/full.jsonl") <(fields "$D/r1.jsonl") && cmp -s "$D/full.st" "$D/r1.st"; then
        t_ok "one process resumes the earlier form: steps 5-8 and final parameters bit-identical to the uninterrupted run"
    else t_fail "resume from the earlier form is bit-exact" "$(diff <(fields "$D/full.jsonl") <(fields "$D/r1.jsonl") | head -4)"; fi
else t_fail "one process resumes the earlier form" "$(tail -3 "$D/r1.out")"; fi
for form in old ck; do
    mkdir -p "$D/$form-2" && cp -r "$D/$form/step-00000004" "$D/$form-2/"
    name="world 2 (S 2) resumes the $( [ $form = old ] && echo earlier || echo new ) one-process form"
    if timeout 120 "$B" train --nproc 2 "${ARGS[@]}" --micro-batch 2 --hybrid-shard-degree 2 --ckpt-dir "$D/$form-2" \
            --resume --log-json "$D/$form-2.jsonl" --dump-params "$D/$form-2.st" > "$D/$form-2.out" 2>&1 &&
       grep -q "resumed from .*step-00000004 (step 4)" "$D/$form-2.out"; then
        t_check "$name: steps 5-8 within 1e-5 of one process" $PY "$CMP" losses "$D/full-tail.jsonl" "$D/$form-2.jsonl" 1e-5
        t_check "$name: final parameters within 1e-4 of one process" $PY "$CMP" params "$D/full.st" "$D/$form-2.st" 1e-4
    else t_fail "$name" "$(tail -3 "$D/$form-2.out")"; fi
done

# a damaged shard of the earlier form
mkdir -p "$D/bad" && cp -r "$D/old/step-00000004" "$D/bad/"
printf 'X' | dd of="$D/bad/step-00000004/shard-00000-of-00001.safetensors" bs=1 seek=9000 conv=notrunc 2>/dev/null
t_expect_fail "a damaged shard of the earlier form is named on --resume" \
    "shard-00000-of-00001.safetensors: size .* crc32 .*damaged" \
    "$W" "${ARGS[@]}" --micro-batch 4 --ckpt-dir "$D/bad" --resume
t_done
