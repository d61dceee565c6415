#!/usr/bin/env bash
# fsdp_losses.sh: the central test of hybrid sharding and tensor
# parallelism. The same model, seed and global batch (10 steps, a tiny
# model whose heads, kv heads, MLP width and vocabulary divide by 4, AdamW
# with warmup, cosine and active clipping, 2 micro-steps per step) give the
# same losses for one process (micro-batch 8: the layout (1, 1, 1)) and for
# `ballast train --nproc 4` at (replicas, S, T) = (1, 4, 1), (4, 1, 1),
# (2, 2, 1), (1, 2, 2), (2, 1, 2), (1, 1, 4) (micro-batch 8 / dp per rank,
# dp = 4 / T), with and without activation checkpointing; and so does a
# tied-embedding model whose vocabulary (254) needs padding at T = 4.
#
# Tolerances, and why they are not zero: one process computes each weight
# gradient as one GEMM over 8 rows, the sharded runs as GEMMs over fewer
# rows whose results are added (reduce-scatter, then all-reduce, in rank
# order); with T > 1 the row-parallel matmuls' outputs, the norm gradients
# and the cross-entropy's sums are added over the TP group; the loss and the
# gradient norm are sums in another order too. So the runs differ only by
# fp32 rounding (about 1e-7 relative per gradient element), which 10 AdamW
# steps carry into the weights. Losses: relative difference <= 1e-5 per
# step (the issue's acceptance figure; about 1e-8 here). Parameters after 10
# steps: ||run - ref|| / ||ref|| <= 1e-4 per tensor: AdamW divides each
# gradient element by its own RMS, so an element whose gradient is near zero
# can turn a rounding-level change into an lr-sized one (seen: 3e-6 here;
# 1.3e-5 with another corpus and order, from one embedding element that
# moved 3.7e-5).
# The sharded runs themselves are deterministic: the same layout twice gives
# the same bits.
#
# Also: data-parallel ranks read disjoint rows that together are the
# reference's batch, the TP ranks of one group the same rows; per-rank state
# (the layout record, first in --log-json) is 1/(S*T) of the model's up to
# padding and the replicated norms, exactly as counted from the config;
# S = 0 resolves to world / T; degrees that do not divide the kv heads, the
# tokens of a micro-batch or the world are refused with a message; a rank
# that never starts is named; a worker killed with SIGKILL makes the
# launcher stop the others and name it.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/fsdp.lib"
fsdp_numpy_setup "$BIN" "fsdp losses"

# heads 8 / kv 4 (grouped-query), MLP 128, vocab 256: every count divides by 4
fsdp_tiny "$D" 5
"$B" data synth --out "$D/c254.bin" --tokens 60000 --vocab 254 --seed 6 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
# tied embeddings, vocab 254: at T 4 rank 3 holds 62 real rows and 2 of padding
printf '%s\n' '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,' \
    ' "num_key_value_heads": 4, "intermediate_size": 96, "vocab_size": 254, "max_position_embeddings": 128,' \
    ' "rms_norm_eps": 1e-5, "tie_word_embeddings": true}' > "$D/tied.json"
STEPS=10 GB=8 SEQ=32 ACC=2 NP=4
RUN=(--init-seed 7 --data-order shuffled --data-seed 9 --seq-len $SEQ --grad-accum $ACC --steps $STEPS --lr 3e-3
     --warmup-steps 2 --min-lr 1e-4 --grad-clip 0.5 --threads 1 --rdzv-timeout 60s)
COMMON=(--model "$D/m.json" --data "$D/c.bin" "${RUN[@]}")
TIED=(--model "$D/tied.json" --data "$D/c254.bin" "${RUN[@]}")

# the reference, (1, 1, 1): one process reading the whole global batch
ref() {  # name ckpt model-args...
    local name=$1 ck=$2 flag=()
    shift 2
    [ "$ck" = on ] && flag=(--activation-checkpointing)
    mkdir -p "$D/$name"
    if "$W" "$@" "${flag[@]}" --micro-batch $GB --log-json "$D/$name.jsonl" \
        --dump-params "$D/$name.st" --dump-batches "$D/$name" > "$D/$name.out" 2>&1; then
        t_ok "reference (1, 1, 1), one process: $name"
    else t_fail "reference run ($name)" "$(tail -3 "$D/$name.out")"; fi
}
ref ref-off off "${COMMON[@]}"
ref ref-on on "${COMMON[@]}"
ref ref-tied off "${TIED[@]}"

run4() {  # name S T ckpt model-args... -> D/name.{jsonl,st,out}, D/name/ token dumps
    local name=$1 S=$2 T=$3 ck=$4 flag=()
    shift 4
    [ "$ck" = on ] && flag=(--activation-checkpointing)
    mkdir -p "$D/$name"
    timeout 120 "$B" train --nproc $NP "$@" "${flag[@]}" --micro-batch $((GB * T / NP)) --hybrid-shard-degree "$S" \
        --tensor-parallel-degree "$T" --log-json "$D/$name.jsonl" --dump-params "$D/$name.st" \
        --dump-batches "$D/$name" > "$D/$name.out" 2>&1
}

check4() {  # name R S T ckpt reference
    local name=$1 R=$2 S=$3 T=$4 rf=$6 what="(replicas $2, S $3, T $4), checkpointing $5"
    if grep -q "layout: world 4 = $R replicas x hybrid shard degree $S x tensor-parallel degree $T" "$D/$name.out"; then
        t_ok "$what: layout reported"
    else t_fail "layout reported ($name)" "$(grep layout "$D/$name.out")"; fi
    t_check "$what: losses within 1e-5 of one process" $PY "$CMP" losses "$D/$rf.jsonl" "$D/$name.jsonl" 1e-5
    t_check "$what: parameters after $STEPS steps within 1e-4" $PY "$CMP" params "$D/$rf.st" "$D/$name.st" 1e-4
    t_check "$what: data-parallel ranks read disjoint rows, together the global batch; TP ranks the same rows" \
        $PY "$CMP" batches "$D/$rf" "$D/$name" $((NP / T)) $((GB * T / NP)) $SEQ $ACC $STEPS $T
}

for ck in off on; do
    for lay in "1 4 1" "4 1 1" "2 2 1" "1 2 2" "2 1 2" "1 1 4"; do
        set -- $lay
        R=$1 S=$2 T=$3 name="w4-r$1-s$2-t$3-$ck"
        if ! run4 "$name" $S $T $ck "${COMMON[@]}"; then
            t_fail "world 4 (replicas $R, S $S, T $T), checkpointing $ck runs" "$(tail -5 "$D/$name.out")"
            continue
        fi
        check4 "$name" $R $S $T $ck ref-$ck
    done
done
for lay in "1 1 4" "1 2 2"; do
    set -- $lay
    name="tied-r$1-s$2-t$3"
    if run4 "$name" $2 $3 off "${TIED[@]}"; then check4 "$name" $1 $2 $3 off ref-tied
    else t_fail "tied embeddings, vocab 254 (replicas $1, S $2, T $3) runs" "$(tail -5 "$D/$name.out")"; fi
done

# per-rank state falls as 1/(S*T): the layout record against a count from the config
for lay in "4 1 1" "2 2 1" "1 4 1" "2 1 2" "1 2 2" "1 1 4"; do
    set -- $lay
    t_check "per-rank weights + gradient + moments at S $2, T $3: 1/(S*T) of the model's, up to padding" \
        $PY "$CMP" memory "$D/w4-r$1-s$2-t$3-off.jsonl" "$D/m.json" $2 $3
done
t_check "per-rank state with tied embeddings and vocab padding (S 1, T 4)" \
    $PY "$CMP" memory "$D/tied-r1-s1-t4.jsonl" "$D/tied.json" 1 4
t_check "per-rank state with tied embeddings and vocab padding (S 2, T 2)" \
    $PY "$CMP" memory "$D/tied-r1-s2-t2.jsonl" "$D/tied.json" 2 2
# the human-readable line says the same
mem() { sed -nE 's/^memory: .*\(([0-9]+) bytes\).*/\1/p' "$D/$1.out"; }
m1=$(mem w4-r4-s1-t1-off) m2=$(mem w4-r2-s2-t1-off) m4=$(mem w4-r1-s4-t1-off) t4=$(mem w4-r1-s1-t4-off)
if [ -n "$m1" ] && [ -n "$m2" ] && [ -n "$m4" ] && [ -n "$t4" ] &&
   awk -v a="$m1" -v b="$m2" -v c="$m4" -v d="$t4" \
       'BEGIN { exit !(2*b >= a && 2*b < a*1.05 && 4*c >= a && 4*c < a*1.1 && 4*d >= a && 4*d < a*1.1) }'; then
    t_ok "memory line: S 1, 2, 4 and T 4 give $m1, $m2, $m4, $t4 bytes per rank (1, 1/2, 1/4, 1/4)"
else t_fail "memory line falls as 1/(S*T)" "S 1: $m1, S 2: $m2, S 4: $m4, T 4: $t4 bytes"; fi

# activation checkpointing changes nothing within one layout
steps() { jl_get "$1" step loss lr grad_norm; }
for lay in "2 2 1" "1 2 2"; do
    set -- $lay
    a="$D/w4-r$1-s$2-t$3-off.jsonl" b="$D/w4-r$1-s$2-t$3-on.jsonl"
    if [ -f "$a" ] && [ -f "$b" ] && [ "$(steps "$a" | wc -l)" -eq $STEPS ] && cmp -s <(steps "$a") <(steps "$b"); then
        t_ok "(replicas $1, S $2, T $3): losses with and without activation checkpointing are bit-identical"
    else t_fail "(replicas $1, S $2, T $3): checkpointing bit-identical" "$(paste "$a" "$b" 2>&1 | head -3)"; fi
done
# the same layout twice: the same bits
if run4 w4-again 2 2 off "${COMMON[@]}" && cmp -s <(steps "$D/w4-r1-s2-t2-off.jsonl") <(steps "$D/w4-again.jsonl") &&
   cmp -s "$D/w4-r1-s2-t2-off.st" "$D/w4-again.st"; then
    t_ok "(1, 2, 2) twice: the same losses and parameters, bit for bit"
else t_fail "(1, 2, 2) twice: deterministic" "$(tail -3 "$D/w4-again.out")"; fi
# S = 0: largest that fits; without a memory figure (CPU) world / T
if run4 w4-s0 0 2 off "${COMMON[@]}" && grep -q "1 replicas x hybrid shard degree 2 x tensor-parallel degree 2" "$D/w4-s0.out"; then
    t_ok "--hybrid-shard-degree 0 on the CPU is world / T = 2 (T 2)"
else t_fail "--hybrid-shard-degree 0" "$(grep -E 'layout|error' "$D/w4-s0.out" | head -3)"; fi

MB=2
t_expect_fail "T that does not divide the kv heads is named" \
    "--tensor-parallel-degree 4 does not divide num_key_value_heads 2" \
    timeout 60 "$B" train --nproc 4 --model tiny --data "$D/c.bin" "${RUN[@]}" --micro-batch $MB --tensor-parallel-degree 4
t_expect_fail "T that does not divide the tokens of a micro-batch is named" \
    "--tensor-parallel-degree 4 does not divide the 1 x 30 = 30 tokens" \
    timeout 60 "$B" train --nproc 4 "${COMMON[@]}" --micro-batch 1 --seq-len 30 --tensor-parallel-degree 4
t_expect_fail "T > 1 in one process is refused" "--tensor-parallel-degree 2 needs 2 or more processes" \
    "$W" "${COMMON[@]}" --micro-batch $MB --tensor-parallel-degree 2
t_expect_fail "T that does not divide the world is named" "not divisible by --tensor-parallel-degree 3" \
    timeout 60 "$B" train --nproc 4 "${COMMON[@]}" --micro-batch 3 --tensor-parallel-degree 3
t_expect_fail "S that does not divide the world is named" "not divisible by --hybrid-shard-degree 3" \
    timeout 60 "$B" train --nproc 4 "${COMMON[@]}" --micro-batch $MB --hybrid-shard-degree 3

# a rank that never starts is named within --rdzv-timeout
t_expect_fail "a missing rank is named within --rdzv-timeout" "rank 1 did not arrive within 2.0 s" \
    timeout 60 "$W" "${COMMON[@]}" --micro-batch $MB --rank 0 --world-size 2 --master-port $((30000 + RANDOM % 20000)) --rdzv-timeout 2s

# kill -9 of one worker: the launcher stops the rest and names the rank
"$B" train --nproc 3 "${COMMON[@]}" --steps 1000000 --micro-batch 1 > "$D/kill.out" 2>&1 &
LP=$!
for _ in $(seq 100); do grep -q '^step' "$D/kill.out" 2>/dev/null && break; sleep 0.1; done
victim=""
for p in $(pgrep -P $LP); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'RANK=1'; then victim=$p; fi
done
if [ -n "$victim" ]; then
    kill -9 "$victim"
    rc=0; timeout 30 tail --pid=$LP -f /dev/null || true; wait $LP || rc=$?
    left=$(pgrep -P $LP 2>/dev/null | wc -l)
    if [ $rc -ne 0 ] && [ "$left" -eq 0 ] && grep -q "rank 1 (pid $victim) was killed by signal 9" "$D/kill.out"; then
        t_ok "kill -9 of rank 1: launcher exits $rc naming it, no worker left"
    else t_fail "kill -9 of rank 1" "rc $rc, $left left: $(tail -3 "$D/kill.out")"; fi
else
    kill $LP 2>/dev/null; wait $LP 2>/dev/null
    t_fail "kill -9 of rank 1" "rank 1 not found among the launcher's children: $(tail -3 "$D/kill.out")"
fi
t_done
