#!/usr/bin/env bash
# cli_errors.sh: messages that name the real cause and the fix.
#   - the launcher prints a message that every rank sent once, with the ranks;
#   - an unknown flag gets the nearest known one ("did you mean --steps?")
#     in the worker, the launcher (its own flags too) and the other programs;
#     a launcher flag given to ballast-worker says whose flag it is;
#   - a glob in a missing directory names the directory;
#   - --backend cuda without an NVIDIA driver says so (not "insufficient");
#   - --init-from a directory without config.json, or a ballast checkpoint,
#     says what it is and suggests --resume / `ballast ckpt export`;
#   - --seq-len beyond the model's positions is named before any memory
#     estimate; --log-json into a missing directory fails at once, before
#     the rendezvous, with the errno text;
#   - a rank whose rank 0 never comes hears "nothing listens at HOST:PORT";
#   - the topology error advises `ballast train --nnodes`, not a worker flag.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
W=$BIN/ballast-worker
B=$BIN/ballast
D=$(t_tmpdir)
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }
"$B" data synth --out "$D/c.bin" --tokens 20000 --vocab 256 --seed 3 > /dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
RUN=(--model tiny --data "$D/c.bin" --micro-batch 2 --seq-len 16 --steps 1 --threads 1)
# a port nothing listens on (bound and closed a moment ago)
PORT=$("$T_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# ---- did you mean ----
t_expect_fail "ballast-worker --stpes: did you mean --steps?" "unknown option '--stpes': did you mean --steps\?" \
    "$W" "${RUN[@]}" --stpes 3
t_expect_fail "ballast train --nproc-per-nod: did you mean --nproc-per-node?" \
    "ballast train: unknown option '--nproc-per-nod': did you mean --nproc-per-node\?" "$B" train "${RUN[@]}" --nproc-per-nod 2
t_expect_fail "ballast-worker --nproc-per-node: a flag of the launcher" "--nproc-per-node is a flag of the launcher: run .ballast train" \
    "$W" "${RUN[@]}" --nproc-per-node 2
t_expect_fail "ballastd --pool-byte: did you mean --pool-bytes?" "did you mean --pool-bytes\?" "$BIN/ballastd" --pool-byte 1G
t_expect_fail "ballast plan --seq-lenn: did you mean --seq-len?" "did you mean --seq-len\?" "$B" plan --seq-lenn 4096
t_expect_fail "no suggestion for a name far from every flag" "unknown option '--zzzzqqqq' \(see --help" "$W" "${RUN[@]}" --zzzzqqqq 1

out=$(timeout 60 "$B" train --nproc 2 "${RUN[@]}" --stpes 3 2>&1)
if [ "$(echo "$out" | grep -c "unknown option '--stpes'")" = 1 ] &&
   echo "$out" | grep -q "^ballast train: on ranks 0-1: unknown option '--stpes': did you mean --steps?" &&
   ! echo "$out" | grep -q "ballast-worker"; then t_ok "the launcher prints a message of every rank once, with the ranks"
else t_fail "one message for every rank" "$(echo "$out" | head -4)"; fi

# ---- the real cause ----
t_expect_fail "a glob in a missing directory names the directory" \
    "the directory $D/nodir/sub does not exist \(No such file or directory\)" "$W" "${RUN[@]}" --data "$D/nodir/sub/*.bin"
if [ -e /proc/driver/nvidia/version ]; then t_skip "--backend cuda without a driver" "this machine has an NVIDIA driver"
else t_expect_fail "--backend cuda without a driver says so" "--backend cuda: no NVIDIA driver on this machine.*--backend cpu" \
    "$W" "${RUN[@]}" --backend cuda; fi
mkdir -p "$D/empty"
t_expect_fail "--init-from a directory without config.json" "--init-from $D/empty: no config.json there: not a Hugging Face model directory" \
    "$W" --init-from "$D/empty" --data "$D/c.bin" --steps 1
"$W" "${RUN[@]}" --ckpt-dir "$D/ck" > /dev/null 2>&1 || t_fail "a checkpoint for --init-from" "the 1-step run failed"
t_expect_fail "--init-from a ballast checkpoint directory suggests --resume and ckpt export" \
    "is a ballast checkpoint directory, not a Hugging Face model directory: continue that run with --ckpt-dir $D/ck --resume.*ballast ckpt export" \
    "$W" --init-from "$D/ck" --data "$D/c.bin" --steps 1
t_expect_fail "--init-from one checkpoint step suggests --resume PATH and ckpt export" \
    "step-00000001 is a ballast checkpoint, not a Hugging Face.*--resume PATH.*ballast ckpt export --from" \
    "$W" --init-from "$D/ck/step-00000001" --data "$D/c.bin" --steps 1
out=$("$W" "${RUN[@]}" --seq-len 100000 2>&1)
if echo "$out" | grep -q -- "--seq-len 100000 exceeds the model's max_position_embeddings 256 (model tiny): give --seq-len 256 or less" &&
   ! echo "$out" | grep -q "of memory"; then t_ok "--seq-len beyond the positions is named before any memory estimate"
else t_fail "--seq-len beyond the positions" "$(echo "$out" | tail -2)"; fi
t_expect_fail "--log-json into a missing directory: errno text, before the rendezvous" \
    "--log-json $D/nodir/run.jsonl: cannot write in $D/nodir: No such file or directory" \
    env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT timeout 30 "$W" "${RUN[@]}" --rdzv-timeout 120s --log-json "$D/nodir/run.jsonl"
t_expect_fail "a missing rank 0: nothing listens at HOST:PORT" "nothing listens at 127.0.0.1:$PORT.*start rank 0" \
    env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT timeout 60 "$W" "${RUN[@]}" --rdzv-timeout 2s
t_expect_fail "the topology error advises ballast train --nnodes" "must be less than .*ballast train --nnodes N" \
    env PET_NNODES=2 PET_NODE_RANK=2 PET_NPROC_PER_NODE=1 "$W" "${RUN[@]}"
t_done
