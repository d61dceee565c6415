#!/usr/bin/env bash
# fsdp_ckpt_scrambled.sh: sharded checkpoints through the GPU ranks' paths,
# on the CPU. BALLAST_TEST_BACKEND=scrambled gives every rank the CPU
# backend with its memory scrambled (every byte XOR 0x5A; to_host and
# from_host undo it: tests/lib/backend_scrambled.h) and puts its collectives
# behind host staging, as on GPU ranks that share a GPU; code that treats
# backend memory as host memory then gets wrong bits. World 4 at (S 2, T 2):
#   - the scrambled run's losses, grad norms and final parameters are the
#     plain CPU run's, bit for bit, and every rank reports the backend;
#   - its step-4 checkpoint is the plain run's, file by file;
#   - --resume from step 4 on the scrambled backend logs the uninterrupted
#     run's losses, lr and grad norms bit for bit and ends with its
#     parameters;
#   - resharding: that checkpoint resumes at (S 4, T 1) on the scrambled
#     backend with the next losses of the uninterrupted run (within 1e-5);
#   - with --optimizer-offload host (the moments live in ballastd and come
#     back into backend memory for each checkpoint) at (S 2, T 1): the
#     scrambled run's step-4 checkpoint is the plain run's, file by file, and
#     a scrambled --resume from it logs the plain run's losses bit for bit.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/ballastd.lib"
source "$(dirname "$0")/fsdp.lib"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
B=$TBIN/ballast
PY=/usr/bin/python3
D=$(t_tmpdir)
[ -x "$TBIN/ballast-worker" ] || { t_fail "ballast-worker built" "missing"; t_done; exit 1; }
fsdp_tiny "$D" 4
CMP="$ROOT/tests/integration/fsdp_cmp.py"
ARGS=(--model "$D/m.json" --init-seed 3 --data "$D/c.bin" --seq-len 32 --micro-batch 2 --grad-accum 2 --steps 8
      --lr 3e-3 --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1 --rdzv-timeout 60s)
fields() { jl_get "$1" step loss lr grad_norm; }
train4() { timeout 180 "$B" train --nproc 4 "${ARGS[@]}" "$@"; }
scr4() { BALLAST_TEST_BACKEND=scrambled train4 "$@"; }
L=(--hybrid-shard-degree 2 --tensor-parallel-degree 2)

train4 "${L[@]}" --log-json "$D/plain.jsonl" --dump-params "$D/plain.st" --ckpt-dir "$D/ckp" --ckpt-every 4 \
    > "$D/plain.out" 2>&1 || { t_fail "plain CPU run" "$(tail -3 "$D/plain.out")"; t_done; exit 1; }
if scr4 "${L[@]}" --log-json "$D/scr.jsonl" --dump-params "$D/scr.st" --ckpt-dir "$D/cks" --ckpt-every 4 \
    > "$D/scr.out" 2>&1 && [ "$(grep -c 'scrambled backend, collectives shm+stage' "$D/scr.out")" = 4 ]; then
    t_ok "scrambled backend: 4 ranks train and checkpoint, each on the scrambled backend with staged collectives"
else t_fail "scrambled run" "$(tail -3 "$D/scr.out")"; fi
if [ "$(fields "$D/plain.jsonl" | wc -l)" = 8 ] && cmp -s <(fields "$D/plain.jsonl") <(fields "$D/scr.jsonl") &&
   cmp -s "$D/plain.st" "$D/scr.st"; then
    t_ok "scrambled backend: losses, lr, grad norms and final parameters are the CPU backend's, bit for bit"
else t_fail "scrambled = plain" "$(diff <(fields "$D/plain.jsonl") <(fields "$D/scr.jsonl") | head -4)"; fi

# the step-4 checkpoint, file by file
n=0 bad=""
for f in "$D"/ckp/step-00000004/*; do
    n=$((n+1))
    cmp -s "$f" "$D/cks/step-00000004/$(basename "$f")" || bad="$bad $(basename "$f")"
done
if [ "$n" = 6 ] && [ -z "$bad" ]; then t_ok "step-4 checkpoint (manifest, config, 4 shard files) byte-identical to the CPU backend's"
else t_fail "checkpoint files identical" "$n files, differing:$bad"; fi

# resume from step 4 on the scrambled backend
rm -rf "$D/cks/step-00000008"
cp -r "$D/cks" "$D/cks2"
jl_raw "$D/scr.jsonl" --upto 4 > "$D/res.jsonl"
if scr4 "${L[@]}" --ckpt-dir "$D/cks" --resume --log-json "$D/res.jsonl" --dump-params "$D/res.st" > "$D/res.out" 2>&1 &&
   grep -q "resumed from .*step-00000004 (step 4)" "$D/res.out" &&
   cmp -s <(fields "$D/plain.jsonl") <(fields "$D/res.jsonl") && cmp -s "$D/plain.st" "$D/res.st"; then
    t_ok "scrambled --resume from step 4: losses, lr, grad norms and final parameters bit-identical to the uninterrupted run"
else t_fail "scrambled --resume bit-exact" "$(tail -3 "$D/res.out"; diff <(fields "$D/plain.jsonl") <(fields "$D/res.jsonl") | head -4)"; fi

# resharding (S 2, T 2) -> (S 4, T 1): same global batch (2 x dp 2 x 2 rows = 2 x dp 4 x 1 row)
if scr4 --hybrid-shard-degree 4 --micro-batch 1 --ckpt-dir "$D/cks2" --resume --log-json "$D/rs.jsonl" \
        > "$D/rs.out" 2>&1 && grep -q "resumed from .*step-00000004 (step 4)" "$D/rs.out"; then
    jl_raw "$D/plain.jsonl" --last 4 > "$D/plain-tail.jsonl"
    t_check "scrambled resharding (S 2, T 2) -> (S 4, T 1): steps 5-8 within 1e-5 of the uninterrupted run" \
        $PY "$CMP" losses "$D/plain-tail.jsonl" "$D/rs.jsonl" 1e-5
else t_fail "scrambled resharding resume" "$(tail -3 "$D/rs.out")"; fi

# the optimizer offload saver: moments brought back from ballastd for each checkpoint
if [ ! -x "$BALLASTD" ]; then
    t_skip "optimizer offload checkpoints on the scrambled backend" "no $BALLASTD"
    t_done; exit
fi
bd_start main "$D" --pool-bytes 64M --spill-dir "$D/spill" --spill-bytes 64M --spill-file-bytes 16M --no-mlock \
    --listen 127.0.0.1:0 || { t_fail "ballastd starts" "$(tail -3 "$D/main.log")"; t_done; exit 1; }
O=(--hybrid-shard-degree 2 --optimizer-offload host --offload-socket "$(bd_sock main)")
if train4 "${O[@]}" --offload-job p --ckpt-dir "$D/op" --ckpt-every 4 --log-json "$D/op.jsonl" > "$D/op.out" 2>&1 &&
   scr4 "${O[@]}" --offload-job s --ckpt-dir "$D/os" --ckpt-every 4 --log-json "$D/os.jsonl" > "$D/os.out" 2>&1; then
    n=0 bad=""
    for f in "$D"/op/step-00000004/*; do
        n=$((n+1))
        cmp -s "$f" "$D/os/step-00000004/$(basename "$f")" || bad="$bad $(basename "$f")"
    done
    if [ "$n" = 4 ] && [ -z "$bad" ] && cmp -s <(fields "$D/op.jsonl") <(fields "$D/os.jsonl"); then
        t_ok "--optimizer-offload host: the scrambled run's losses and step-4 checkpoint are the CPU backend's, bit for bit"
    else t_fail "offload checkpoints identical" "$n files, differing:$bad"; fi
    rm -rf "$D/os/step-00000008"
    jl_raw "$D/os.jsonl" --upto 4 > "$D/or.jsonl"
    if scr4 "${O[@]}" --offload-job r --ckpt-dir "$D/os" --resume --log-json "$D/or.jsonl" > "$D/or.out" 2>&1 &&
       grep -q "resumed from .*step-00000004 (step 4)" "$D/or.out" && cmp -s <(fields "$D/op.jsonl") <(fields "$D/or.jsonl"); then
        t_ok "--optimizer-offload host: scrambled --resume from step 4 logs the uninterrupted run's losses bit for bit"
    else t_fail "offload --resume on the scrambled backend" "$(tail -3 "$D/or.out"; diff <(fields "$D/op.jsonl") <(fields "$D/or.jsonl") | head -4)"; fi
else t_fail "optimizer offload runs with checkpoints" "$(tail -3 "$D/op.out"; tail -3 "$D/os.out")"; fi
t_done
