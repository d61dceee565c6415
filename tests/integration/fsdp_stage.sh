#!/usr/bin/env bash
# fsdp_stage.sh: the host-staged collectives (workers/comm/stage.h, what GPU
# ranks sharing a GPU use) inside real sharded training, on the CPU.
#
# BALLAST_TEST_BACKEND=staged (the test build's CPU backend whose memory the
# host may not touch) puts every communicator of a CPU job behind the
# staging wrapper. The CPU backend's copies are memcpy, so a staged run must
# give the same bits as the direct one: for 4 ranks at (S, T) = (2, 2) and
# (1, 4) (the TP row gathers and reduce-scatters, the vocab-parallel
# cross-entropy, the shard gathers and reduce-scatters, the fp64 loss and
# norm sums all go through it), 6 steps each: identical per-step losses and
# gradient norms and byte-identical parameters after the run; each rank
# must report the "shm+stage" collectives, so the hook cannot be a no-op.
# Also: GPU ranks without a GPU are refused with the reason, and sharded
# checkpoints on GPU ranks are no longer refused (they go through the
# backend's copies: tests/integration/fsdp_ckpt_scrambled.sh).
source "$(dirname "$0")/../lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
B=$TBIN/ballast
D=$(t_tmpdir)
[ -x "$TBIN/ballast-worker" ] || { t_fail "ballast-worker built" "missing"; t_done; exit 1; }
"$B" data synth --out "$D/c.bin" --tokens 40000 --vocab 254 --seed 3 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
printf '%s\n' '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,' \
    ' "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 254, "max_position_embeddings": 64,' \
    ' "rms_norm_eps": 1e-5}' > "$D/m.json"
RUN=(--model "$D/m.json" --data "$D/c.bin" --init-seed 11 --data-order shuffled --data-seed 4 --seq-len 32
     --grad-accum 2 --steps 6 --lr 3e-3 --warmup-steps 1 --grad-clip 0.5 --threads 1 --rdzv-timeout 60s)

stats() { jl_get "$1" loss grad_norm; }  # one line a step

for lay in "2 2" "1 4"; do
    set -- $lay
    S=$1 T=$2 what="4 ranks (S $1, T $2)"
    for mode in direct staged; do
        env=()
        [ $mode = staged ] && env=(BALLAST_TEST_BACKEND=staged)
        if ! env "${env[@]}" timeout 120 "$B" train --nproc 4 "${RUN[@]}" --micro-batch $((4 * T / 4)) \
            --hybrid-shard-degree $S --tensor-parallel-degree $T --log-json "$D/$mode-$S$T.jsonl" \
            --dump-params "$D/$mode-$S$T.st" > "$D/$mode-$S$T.out" 2>&1; then
            t_fail "$what, $mode collectives: runs" "$(tail -5 "$D/$mode-$S$T.out")"
            continue 2
        fi
    done
    n=$(grep -c 'collectives shm+stage' "$D/staged-$S$T.out")
    if [ "$n" = 4 ] && ! grep -q 'shm+stage' "$D/direct-$S$T.out"; then t_ok "$what: all 4 ranks staged, none in the direct run"
    else t_fail "$what: staged ranks reported" "$n of 4 ranks report shm+stage"; fi
    if [ "$(stats "$D/direct-$S$T.jsonl" | wc -l)" -ge 6 ] &&
        diff <(stats "$D/direct-$S$T.jsonl") <(stats "$D/staged-$S$T.jsonl") > "$D/diff-$S$T" 2>&1; then
        t_ok "$what: staged losses and gradient norms are the direct run's, bit for bit (6 steps)"
    else t_fail "$what: staged losses and norms equal the direct run's" "$(head -5 "$D/diff-$S$T")"; fi
    t_check "$what: parameters after 6 steps byte-identical staged vs direct" cmp "$D/direct-$S$T.st" "$D/staged-$S$T.st"
done

# GPU ranks without a usable GPU are refused with the reason (this machine
# may have the CUDA toolkit but no GPU); --ckpt-dir is not what is refused
if nvidia-smi -L >/dev/null 2>&1; then
    t_skip "--backend cuda without a GPU is refused" "a GPU is here"
else
    t_expect_fail "--backend cuda with 2 ranks and no usable GPU: refused, naming why" \
        'built without CUDA|no usable GPU|no NVIDIA driver' timeout 60 "$B" train --nproc 2 "${RUN[@]}" --backend cuda --micro-batch 2
fi
if nvidia-smi -L >/dev/null 2>&1; then
    t_skip "--backend cuda with --ckpt-dir is not refused for the checkpoints" "a GPU is here (tests/gpu covers it)"
else
    out=$(timeout 60 "$B" train --nproc 2 "${RUN[@]}" --backend cuda --micro-batch 2 --ckpt-dir "$D/ck" 2>&1)
    if echo "$out" | grep -Eq 'built without CUDA|no usable GPU|no NVIDIA driver' && ! echo "$out" | grep -q -- '--ckpt-dir'; then
        t_ok "--backend cuda with 2 ranks and --ckpt-dir: refused only for the missing GPU, not the checkpoints"
    else t_fail "--backend cuda with --ckpt-dir" "$(echo "$out" | tail -3)"; fi
fi
t_done
