#!/usr/bin/env bash
# train_selective.sh: --activation-checkpointing selective on the CPU
# backend (the oracle). Selective checkpointing keeps each block's
# attention output and log-sum-exp rows and recomputes the rest of the
# block from its input; full recomputes the attention too. Both run the
# same ops in the same order on the same operands as no checkpointing, so
# in every layout (one process, S 2, T 2) the three give the same losses,
# learning rates and gradient norms to the bit, and the first step's
# gradients byte for byte; the activation bytes a rank reports order as
# full < selective < none. A misspelt value is refused with a suggestion.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
W=$BIN/ballast-worker
B=$BIN/ballast
D=$(t_tmpdir)
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }
"$B" data synth --out "$D/c.bin" --tokens 40000 --vocab 256 --seed 5 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
# random initial weights and batches (seeded from the clock, printed on failure)
SEED=$(( $(date +%s%N) % 100000 + 1 ))
COMMON=(--model tiny --data "$D/c.bin" --seq-len 32 --steps 4 --lr 3e-3 --grad-clip 0.5 --threads 1
        --init-seed "$SEED" --data-seed "$SEED" --rdzv-timeout 60s)
fields() { jl_get "$1" step loss lr grad_norm; }
run() {  # NAME NPROC CKPT [flags]: train, log to NAME.jsonl, console to NAME.out
    local name=$1 np=$2 ck=$3; shift 3
    timeout 300 "$B" train --nproc "$np" "${COMMON[@]}" --activation-checkpointing "$ck" \
        --log-json "$D/$name.jsonl" "$@" > "$D/$name.out" 2>&1
}
act_bytes() { sed -n 's/^activations: .* (\([0-9]*\) bytes) per rank.*/\1/p' "$D/$1.out" | head -1; }

# layout name, processes, flags
LAYOUTS=("one 1 --micro-batch 4" "s2 2 --micro-batch 2 --hybrid-shard-degree 2"
         "t2 2 --micro-batch 4 --tensor-parallel-degree 2")
for lay in "${LAYOUTS[@]}"; do
    read -r name np flags <<< "$lay"
    ok=1
    for ck in false full selective; do
        # shellcheck disable=SC2086
        run "$name-$ck" "$np" "$ck" $flags || { ok=0; t_fail "$name: --activation-checkpointing $ck trains" \
            "seed $SEED: $(tail -3 "$D/$name-$ck.out")"; }
    done
    [ $ok = 1 ] || continue
    if [ "$(jl_count "$D/$name-false.jsonl")" -eq 4 ] && cmp -s <(fields "$D/$name-selective.jsonl") <(fields "$D/$name-false.jsonl") &&
       cmp -s <(fields "$D/$name-full.jsonl") <(fields "$D/$name-false.jsonl"); then
        t_ok "$name: selective, full and no checkpointing: identical losses, lr and grad norms over 4 steps"
    else
        t_fail "$name: selective = full = none, to the bit" "seed $SEED: $(diff <(fields "$D/$name-selective.jsonl") \
            <(fields "$D/$name-false.jsonl") | head -4 | tr '\n' ' ')"
    fi
    n=$(act_bytes "$name-false") f=$(act_bytes "$name-full") s=$(act_bytes "$name-selective")
    if [ -n "$n" ] && [ -n "$f" ] && [ -n "$s" ] && [ "$f" -lt "$s" ] && [ "$s" -lt "$n" ]; then
        t_ok "$name: activation bytes per rank full $f < selective $s < none $n"
    else
        t_fail "$name: activation bytes per rank full < selective < none" "full '$f' selective '$s' none '$n'"
    fi
done

# the first step's logits and gradients, byte for byte (one process)
"$B" train --nproc 1 "${COMMON[@]}" --micro-batch 4 --steps 1 --dump-grads "$D/g-none.st" > /dev/null 2>&1
"$B" train --nproc 1 "${COMMON[@]}" --micro-batch 4 --steps 1 --dump-grads "$D/g-sel.st" \
    --activation-checkpointing selective > /dev/null 2>&1
if [ -s "$D/g-none.st" ] && cmp -s "$D/g-none.st" "$D/g-sel.st"; then
    t_ok "selective checkpointing: identical logits and gradients after one step"
else t_fail "selective checkpointing: identical gradients" "seed $SEED: dumps differ or missing"; fi

# the spellings: the flag alone is full; a slip is named with its fix
"$W" "${COMMON[@]}" --micro-batch 4 --steps 1 --activation-checkpointing --log-json "$D/bare.jsonl" > "$D/bare.out" 2>&1
if grep -q '"activation-checkpointing": "full"' "$D/bare.jsonl" && grep -q 'checkpointed$' "$D/bare.out"; then
    t_ok "--activation-checkpointing alone means full"
else t_fail "--activation-checkpointing alone means full" "$(grep -o '"activation-checkpointing": "[a-z]*"' "$D/bare.jsonl")"; fi
t_expect_fail "a misspelt --activation-checkpointing value is refused, naming the nearest" \
    "invalid value for --activation-checkpointing .*'selectve' is not one of .*did you mean selective" \
    "$W" "${COMMON[@]}" --micro-batch 4 --activation-checkpointing selectve
t_done
