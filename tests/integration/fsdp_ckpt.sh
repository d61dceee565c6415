#!/usr/bin/env bash
# fsdp_ckpt.sh: sharded checkpoints of hybrid-sharded, tensor-parallel runs
# (world 4).
#   - every 4 steps a step directory with one shard file per (shard, TP
#     rank) and a manifest whose layout is (4, S, T) and whose parts, mapped
#     through their TP split onto the full tensors, cover every element
#     exactly once (the replicated norms once per TP rank);
#   - --resume from step 4 in the same layout logs exactly the losses, lr and
#     grad norms of an uninterrupted run (bit for bit) and leaves the same
#     final parameters;
#   - resharding: a checkpoint of (1, 4, 1) resumes at (2, 1, 2) and in one
#     process, one of
#     (1, 1, 4) at (4, 1, 1), with the next losses of the uninterrupted run
#     (relative difference <= 1e-5, the sums run in another order) when the
#     global batch (grad-accum x dp x micro-batch) stays the same; another
#     global batch is refused;
#   - `ballast ckpt info` verifies the shard files; `ballast ckpt export` of
#     a tensor-parallel checkpoint gives the run's final weights bit for bit;
#   - one process, or a damaged shard, are refused with a message naming
#     the problem.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/fsdp.lib"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
B=$BIN/ballast
W=$BIN/ballast-worker
PY=/usr/bin/python3
D=$(t_tmpdir)
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }

fsdp_tiny "$D" 4
CMP="$ROOT/tests/integration/fsdp_cmp.py"
ARGS=(--model "$D/m.json" --init-seed 3 --data "$D/c.bin" --seq-len 32 --micro-batch 2 --grad-accum 2 --steps 8
      --lr 3e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1 --rdzv-timeout 60s)
# step records only (the log starts with a settings record; a resumed run appends another)
fields() { jl_get "$1" step loss lr grad_norm; }
train4() { timeout 120 "$B" train --nproc 4 "${ARGS[@]}" "$@"; }

train4 --hybrid-shard-degree 2 --log-json "$D/full.jsonl" --dump-params "$D/full.st" > "$D/full.out" 2>&1 ||
    t_fail "uninterrupted run" "$(tail -3 "$D/full.out")"
if train4 --hybrid-shard-degree 2 --ckpt-dir "$D/ck" --ckpt-every 4 --log-json "$D/a.jsonl" > "$D/a.out" 2>&1 &&
   [ -f "$D/ck/step-00000004/shard-00000-of-00002.safetensors" ] && [ -f "$D/ck/step-00000004/shard-00001-of-00002.safetensors" ] &&
   [ -f "$D/ck/step-00000008/manifest.json" ] && ! ls "$D/ck/step-00000004/" | grep -q 'shard-0000[2-9]'; then
    t_ok "S 2: a step directory every 4 steps with 2 shard files"
else t_fail "sharded checkpoints written" "$(tail -3 "$D/a.out"; ls -R "$D/ck" 2>&1 | head)"; fi

# the manifest: layout and ranges that tile every tensor exactly once
if $PY - "$D/ck/step-00000004/manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
lay = m["layout"]
assert (lay["world"], lay["shard_degree"], lay["tensor_parallel_degree"]) == (4, 2, 1), lay
assert m["step"] == 4 and len(m["shards"]) == 2
parts = {}
for sh in m["shards"]:
    for t in sh["tensors"]:
        n = 1
        for d in t["shape"]: n *= d
        parts.setdefault(t["name"], (n, []))[1].append(tuple(t["range"]))
assert len(parts) == 21, len(parts)   # tiny: embed, 2 x 9 block tensors, norm, lm_head
for name, (n, rs) in parts.items():
    rs.sort()
    pos = 0
    for a, b in rs:
        assert a == pos and b > a, (name, rs)
        pos = b
    assert pos == n, (name, pos, n)
PYEOF
then t_ok "manifest: layout (4, 2, 1), shard ranges tile every tensor exactly once"
else t_fail "manifest layout and ranges" "see above"; fi

# resume from step 4: the same bits as the uninterrupted run
rm -rf "$D/ck/step-00000008"
# every record up to step 4 (the settings and layout records come first)
jl_raw "$D/a.jsonl" --upto 4 > "$D/b.jsonl"
if train4 --hybrid-shard-degree 2 --ckpt-dir "$D/ck" --resume --log-json "$D/b.jsonl" --dump-params "$D/b.st" > "$D/b.out" 2>&1 &&
   grep -q "resumed from .*step-00000004 (step 4)" "$D/b.out" &&
   cmp -s <(fields "$D/full.jsonl") <(fields "$D/b.jsonl") && cmp -s "$D/full.st" "$D/b.st"; then
    t_ok "--resume from step 4: losses, lr, grad norms and final parameters bit-identical to an uninterrupted run"
else t_fail "--resume bit-exact" "$(tail -3 "$D/b.out"; diff <(fields "$D/full.jsonl") <(fields "$D/b.jsonl") | head -4)"; fi

t_check "ballast ckpt info verifies both shard files" bash -c \
    "'$B' ckpt info '$D/ck/step-00000004' | grep -c 'of-00002.safetensors: .*: ok' | grep -qx 2"

# resharding: the uninterrupted runs, then a checkpoint at step 4 resumed in another layout
reshard() {  # name from-S from-T from-MB to-S to-T to-MB
    local n=$1
    train4 --hybrid-shard-degree $2 --tensor-parallel-degree $3 --micro-batch $4 --log-json "$D/$n-full.jsonl" \
        --dump-params "$D/$n-full.st" --ckpt-dir "$D/$n-ck" --ckpt-every 4 > "$D/$n-full.out" 2>&1 ||
        { t_fail "$n: uninterrupted run at S $2, T $3" "$(tail -3 "$D/$n-full.out")"; return; }
    mv "$D/$n-ck/step-00000008" "$D/$n-final"
    if train4 --hybrid-shard-degree $5 --tensor-parallel-degree $6 --micro-batch $7 --ckpt-dir "$D/$n-ck" --resume \
        --log-json "$D/$n-res.jsonl" --dump-params "$D/$n-res.st" > "$D/$n-res.out" 2>&1 &&
       grep -q "resumed from .*step-00000004 (step 4)" "$D/$n-res.out" && [ "$(fields "$D/$n-res.jsonl" | wc -l)" -eq 4 ]; then
        t_ok "$n: a checkpoint of (S $2, T $3) resumes at (S $5, T $6)"
    else t_fail "$n: resume at (S $5, T $6)" "$(tail -3 "$D/$n-res.out")"; return; fi
    jl_raw "$D/$n-full.jsonl" --last 4 > "$D/$n-full-tail.jsonl"
    t_check "$n: steps 5-8 after resharding: losses within 1e-5 of the uninterrupted run" \
        $PY "$CMP" losses "$D/$n-full-tail.jsonl" "$D/$n-res.jsonl" 1e-5
    t_check "$n: final parameters within 1e-4 of the uninterrupted run" \
        $PY "$CMP" params "$D/$n-full.st" "$D/$n-res.st" 1e-4
}
# (1, 4, 1) -> (2, 1, 2): dp 4 -> 2, micro-batch 2 -> 4 keeps 2 x dp x B = 16 rows per step
reshard s4-to-r2t2 4 1 2 1 2 4
# (1, 1, 4) -> (4, 1, 1): dp 1 -> 4, micro-batch 8 -> 2
reshard t4-to-r4 1 4 8 1 1 2

# the manifest of a tensor-parallel checkpoint: TP splits and ranges rebuild every tensor
if $PY - "$D/t4-to-r4-ck/step-00000004/manifest.json" <<'PYEOF'
import json, sys
import numpy as np
m = json.load(open(sys.argv[1]))
lay = m["layout"]
assert (lay["world"], lay["shard_degree"], lay["tensor_parallel_degree"]) == (4, 1, 4), lay
assert len(m["shards"]) == 4 and [s["tp_rank"] for s in m["shards"]] == [0, 1, 2, 3]
count, tpdim = {}, {}
for sh in m["shards"]:
    for t in sh["tensors"]:
        shape = t["shape"] + [1] * (2 - len(t["shape"]))
        ls = t["local_shape"] + [1] * (2 - len(t["local_shape"]))
        c = count.setdefault(t["name"], np.zeros(shape, dtype=np.int64))
        tpdim[t["name"]] = t["tp_dim"]
        assert t["tp_size"] == 4 and t["tp_rank"] == sh["tp_rank"], t
        for j in range(*t["range"]):
            r, col = divmod(j, ls[1])
            if t["tp_dim"] == 0: r += t["tp_rank"] * ls[0]
            if t["tp_dim"] == 1: col += t["tp_rank"] * ls[1]
            c[r, col] += 1
assert len(count) == 21, len(count)
for name, c in count.items():
    want = 4 if tpdim[name] < 0 else 1
    assert (c == want).all(), (name, c.min(), c.max())
assert tpdim["model.layers.0.self_attn.q_proj.weight"] == 0 and tpdim["model.layers.0.mlp.down_proj.weight"] == 1
PYEOF
then t_ok "manifest (4, 1, 4): parts mapped through their TP split cover every element once (norms once per TP rank)"
else t_fail "TP manifest covers the tensors" "see above"; fi

# export of a TP checkpoint: the run's final weights, bit for bit
if "$B" ckpt export --from "$D/t4-to-r4-final" --out "$D/hf" > "$D/exp.out" 2>&1; then
    t_check "ckpt export of a (1, 1, 4) checkpoint equals the run's --dump-params bit for bit" \
        $PY "$CMP" params "$D/t4-to-r4-full.st" "$D/hf/model.safetensors" 0
else t_fail "ckpt export of a TP checkpoint" "$(tail -3 "$D/exp.out")"; fi
# --init-from on 4 ranks (weights read into host memory, the device never
# holds the whole model) starts from the same weights as one process:
# 2 steps within the usual 1e-5 of one process with --init-from
if "$W" "${ARGS[@]}" --steps 2 --micro-batch 8 --init-from "$D/hf" --log-json "$D/init1.jsonl" > "$D/init1.out" 2>&1 &&
   train4 --steps 2 --tensor-parallel-degree 2 --micro-batch 4 --init-from "$D/hf" --log-json "$D/init4.jsonl" \
       > "$D/init4.out" 2>&1 &&
   "$W" "${ARGS[@]}" --steps 2 --micro-batch 8 --log-json "$D/seed1.jsonl" > "$D/seed1.out" 2>&1; then
    t_check "--init-from on 4 ranks (S 2, T 2): losses within 1e-5 of one process" \
        $PY "$CMP" losses "$D/init1.jsonl" "$D/init4.jsonl" 1e-5
    t_expect_fail "--init-from changes the start (not the --init-seed weights)" "max relative loss difference (0\.0*[1-9]|[1-9])" \
        $PY "$CMP" losses "$D/init1.jsonl" "$D/seed1.jsonl" 0
else t_fail "--init-from on 1 and 4 ranks" "$(tail -3 "$D/init1.out" "$D/init4.out" "$D/seed1.out")"; fi

t_expect_fail "resharding with another global batch is refused" "16 rows per step.*this run has 2 x 2 x 2 = 8 rows" \
    train4 --hybrid-shard-degree 1 --tensor-parallel-degree 2 --micro-batch 2 --ckpt-dir "$D/s4-to-r2t2-ck" --resume
# one process resumes a (1, 4, 1) checkpoint: 2 micro-steps x 8 rows = the 16 rows per step it was written with
mkdir -p "$D/one-ck" && cp -r "$D/s4-to-r2t2-ck/step-00000004" "$D/one-ck/"
if "$W" "${ARGS[@]}" --micro-batch 8 --ckpt-dir "$D/one-ck" --resume --log-json "$D/one.jsonl" \
        --dump-params "$D/one.st" > "$D/one.out" 2>&1 && grep -q "resumed from .*step-00000004 (step 4)" "$D/one.out"; then
    t_check "one process resumes a (1, 4, 1) checkpoint: steps 5-8 within 1e-5 of the uninterrupted run" \
        $PY "$CMP" losses "$D/s4-to-r2t2-full-tail.jsonl" "$D/one.jsonl" 1e-5
    t_check "one process from a (1, 4, 1) checkpoint: final parameters within 1e-4 of the uninterrupted run" \
        $PY "$CMP" params "$D/s4-to-r2t2-full.st" "$D/one.st" 1e-4
else t_fail "one process resumes a sharded checkpoint" "$(tail -3 "$D/one.out")"; fi
t_expect_fail "one process with another global batch is refused" "16 rows per step.*this run has 2 x 4 = 8 rows" \
    "$W" "${ARGS[@]}" --micro-batch 4 --ckpt-dir "$D/one-ck" --resume
cp -r "$D/ck/step-00000004" "$D/bad" && mkdir -p "$D/badck" && mv "$D/bad" "$D/badck/step-00000004"
printf 'X' | dd of="$D/badck/step-00000004/shard-00001-of-00002.safetensors" bs=1 seek=200 conv=notrunc 2>/dev/null
t_expect_fail "a damaged shard file is named" "shard-00001-of-00002.safetensors: size .* crc32 .*damaged" \
    train4 --hybrid-shard-degree 2 --ckpt-dir "$D/badck" --resume
t_done
