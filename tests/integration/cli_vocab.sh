#!/usr/bin/env bash
# cli_vocab.sh: one vocabulary and one environment prefix per program.
#   - ballast plan takes the trainer's names (--tensor-parallel-degree,
#     --activation-checkpointing, --activation-offload, --optimizer-offload),
#     the old spellings as hidden aliases; its ranking column is "#";
#   - status/store take --offload-socket (unix:PATH, a bare path) and
#     --offload-remote; ballastd --socket takes unix:PATH too;
#   - the trainer takes --global-batch-tokens with a size suffix (1K);
#   - ballast-rdzv: --world-size, --idle-timeout (old --world, --timeout kept);
#   - the start banner is one line of the settings not at their defaults
#     (the table with --print-settings); `ballast ckpt --help` lists options;
#   - BALLAST_LOG_JSON=FILE, BALLAST_METRICS_PORT and BALLAST_THREADS set for
#     `ballast train --optimizer-offload host` reach the trainer only: the
#     launcher's ballastd (BALLASTD_ prefix) starts, rank 0 binds the metrics
#     port; that ballastd lives in the run's directory, with no spill tier,
#     and leaves nothing in the working directory.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
B=$BIN/ballast
D=$(t_tmpdir)
[ -x "$B" ] || { t_fail "ballast built" "missing $B"; t_done; exit 1; }
"$B" data synth --out "$D/c.bin" --tokens 20000 --vocab 256 --seed 5 > /dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
RUN=(--model tiny --data "$D/c.bin" --micro-batch 2 --seq-len 16 --threads 1)

# ---- plan ----
P=(plan --model llama2-7b --nodes 2 --top 1)
t_check "plan takes the trainer's names" "$B" "${P[@]}" --tensor-parallel-degree 2 --activation-checkpointing on \
    --activation-offload on --optimizer-offload off
t_check "plan keeps the old spellings as aliases" "$B" "${P[@]}" --tp 2 --ckpt on --act-offload on --opt-offload off
if "$B" plan --help | grep -q -- "--tensor-parallel-degree" && ! "$B" plan --help | grep -Eq -- "--(tp|ckpt|act-offload|opt-offload) "; then
    t_ok "plan --help lists the new names only"
else t_fail "plan --help" "$("$B" plan --help | grep -E -- '--(tp|tensor|ckpt|act|opt)')"; fi
t_expect_fail "plan's messages use the new names" "--tensor-parallel-degree must be" "$B" "${P[@]}" --tensor-parallel-degree 3
if "$B" "${P[@]}" | grep -Eq '^ *# +S +T ' && ! "$B" "${P[@]}" | grep -Eq '^ *rank +S '; then
    t_ok "plan's ranking column is '#', not 'rank'"
else t_fail "plan's column" "$("$B" "${P[@]}" | head -3)"; fi

# ---- the trainer: sizes ----
out=$("$B" train "${RUN[@]}" --steps 1 --global-batch-tokens 1K 2>&1)
if echo "$out" | grep -q "batch: 32 micro-steps x 2 rows x 16 tokens = 1024 tokens per step"; then
    t_ok "--global-batch-tokens 1K (1024 tokens: 32 micro-steps of 2 x 16)"
else t_fail "--global-batch-tokens 1K" "$(echo "$out" | tail -2)"; fi
if echo "$out" | grep -q '^settings: --model tiny .*--global-batch-tokens 1K.* (every one: --print-settings)$' &&
   ! echo "$out" | grep -q '^+---'; then t_ok "the start banner: one line of the settings not at their defaults"
else t_fail "start banner" "$(echo "$out" | head -3)"; fi
t_check "--print-settings prints the full table" bash -c "'$B' train ${RUN[*]} --steps 1 --print-settings 2>&1 | grep -q '| lr-schedule  *| cosine'"
t_check "ballast ckpt --help lists export's options" bash -c "'$B' ckpt --help | grep -q -- '--dtype f32|bf16' && '$B' ckpt --help | grep -q -- '--tokenizer PATH'"

# ---- sockets: unix:PATH, a bare path ----
S=$D/bd.sock
"$BIN/ballastd" --socket "unix:$S" --pool-bytes 32M --port-file "$D/bd.ports" > "$D/bd.log" 2>&1 &
BD=$!
for _ in $(seq 1 200); do [ -s "$D/bd.ports" ] && break; sleep 0.05; done
t_check "ballastd --socket unix:PATH, ballast status --offload-socket unix:PATH" "$B" status --offload-socket "unix:$S"
t_check "ballast status --offload-socket with a bare path" "$B" status --offload-socket "$S"
t_check "ballast store ls --offload-socket, the old --socket still taken" bash -c "'$B' store ls --offload-socket '$S' && '$B' store ls --socket '$S'"
kill -TERM $BD 2> /dev/null; wait $BD 2> /dev/null
t_expect_fail "a missing ballastd is named as given (no unix:unix:)" "at unix:$D/none.sock[^:]" "$B" status --offload-socket "unix:$D/none.sock" --timeout 1s

# ---- ballast-rdzv ----
t_check "ballast-rdzv --world-size --idle-timeout (and BALLAST_RDZV_TIMEOUT, the trainer's, ignored)" \
    env BALLAST_RDZV_TIMEOUT=600s timeout 30 "$BIN/ballast-rdzv" --listen 127.0.0.1:0 --world-size 2 --idle-timeout 0.3s
t_check "ballast-rdzv keeps --world and --timeout as aliases" timeout 30 "$BIN/ballast-rdzv" --listen 127.0.0.1:0 --world 2 --timeout 0.3s

# ---- environment: the trainer's variables stay the trainer's ----
PORT=$("$T_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$D/cwd" "$D/run"
if (cd "$D/cwd" && BALLAST_LOG_JSON="$D/run/run.jsonl" BALLAST_METRICS_PORT=$PORT BALLAST_METRICS_BIND=127.0.0.1 BALLAST_THREADS=1 \
        timeout 120 "$B" train "${RUN[@]}" --steps 2 --optimizer-offload host --offload-socket "unix:$D/run/t.sock") \
        > "$D/env.out" 2>&1 && [ "$(jl_count "$D/run/run.jsonl")" = 2 ]; then
    t_ok "BALLAST_LOG_JSON=FILE ballast train --optimizer-offload host trains (the launcher's ballastd started)"
else t_fail "BALLAST_LOG_JSON with the launcher's ballastd" "$(tail -4 "$D/env.out")"; fi
t_check "rank 0 binds BALLAST_METRICS_PORT (ballastd did not take it)" grep -q "metrics: http://127.0.0.1:$PORT/metrics" "$D/env.out"
t_check "host-only offload: no spill tier" grep -q "no spill tier" "$D/env.out"
left=$(ls -A "$D/cwd"; ls -A "$D/run" | grep -v -x -e run.jsonl -e ballastd.log)
if [ -z "$left" ] && [ -f "$D/run/ballastd.log" ]; then t_ok "ballastd lived in the run's directory and left only its log"
else t_fail "ballastd's leftovers" "cwd/run hold: $left"; fi
t_done
