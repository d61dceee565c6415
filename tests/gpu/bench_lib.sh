# tests/gpu/bench_lib.sh: the ballast-worker benchmarks of tests/gpu/run.sh
# (issue 7: activation offload on vs off, optimizer offload on vs off, the
# largest model that trains with optimizer offload). Sourced by run.sh and
# by tests/integration/gpu_bench.sh, which runs the same code on the CPU;
# not a test itself (no .sh of tests/integration, no check_ prefix).
#
# The caller sets before sourcing:
#   ROOT  the repository root        RES  results.jsonl to append to
#   LOG   a directory for the logs   PY   python3
# and may set GPU_BENCH_DRYRUN=1 (below), BUILD (the Makefile build,
# relative to ROOT or absolute) and GB_LIBPATH: the LD_LIBRARY_PATH our
# programs (ballastd, ballast, ballast-worker) run with, and nothing else
# (run.sh: the bundle's libraries and CUDA's). The functions, all prefixed gb_:
#
#   gb_model_dims MODEL      "PARAMS LAYERS DIM VOCAB UNIT" of a preset
#                            (PARAMS: the worker's own count,
#                            llama_total_params; UNIT: floats of the largest
#                            unit, a block or the embedding/head unit)
#   gb_step_stats FILE WARM  one JSON object from a --log-json file: mean
#                            ms/step and tokens/s over the steps after the
#                            first WARM, exposed offload wait, bytes moved,
#                            peak GPU memory; exit 1 with a message when
#                            there is no usable timed step
#   gb_capacity              GB_DEV_BYTES, GB_HOST_BYTES, GB_DISK_BYTES:
#                            what the benchmarks may use (measured, or the
#                            GPU_DEVICE_BYTES / GPU_HOST_BYTES /
#                            GPU_DISK_BYTES overrides); GB_HOST_WHAT says
#                            where the host figure came from
#   gb_host_memory           GB_HOST_BYTES and GB_HOST_WHAT alone: what the
#                            machine has (/proc/meminfo's MemAvailable, or
#                            MemFree + Buffers + Cached where a kernel or
#                            sandbox gives no MemAvailable, MemTotal last;
#                            no more than a cgroup memory limit leaves), or
#                            GPU_HOST_BYTES
#   gb_need KIND MODEL       GB_NEED_DEV, GB_NEED_HOST, GB_NEED_DISK,
#                            GB_POOL, GB_SPILL for a run of KIND (plain,
#                            actoff, optoff = --optimizer-offload host,
#                            optnvme = --optimizer-offload nvme, both with
#                            --optimizer-offload-durable no) at seq 4096,
#                            micro-batch 1
#   gb_fits KIND MODEL       exit 0 when gb_need fits gb_capacity, else
#                            prints why not (one line) and exits 1
#   gb_worker_bench NAME KIND MODEL LIMIT_S [worker flags...]
#                            plan, start ballastd when KIND needs one, run
#                            the worker (--steps GB_WARMUP + GB_TIMED),
#                            append a "worker_bench" record to RES (or a
#                            "skip" record with the reason); exit 0 when
#                            it measured
#   gb_ratio WHAT ON OFF GOAL  a "ratio" record from two worker_bench
#                            records of RES (by name)
#
# ---- What fits on the GPU machine (one H200: about 140 GiB of GPU memory,
# 16 cores, 128 GiB host memory, 64 GiB disk) ----
# P = parameters, U = floats of the largest unit (for these presets the
# embedding/head unit). One process trains the whole model (world 1):
# - device without optimizer offload (plain, actoff): bf16 working weights
#   (2 B/P), the fp32 master (4), gradients (4) and AdamW moments (8) =
#   18 B/P (the sharded loop that offload runs go through no longer holds
#   the model twice at start-up). Plus activations (checkpointed block
#   inputs, one block's internals, the logits) and ~2 GiB of workspaces.
#   llama3.2-1b 30 GB, llama3.2-3b 66 GB, llama2-7b 127 GB (fits),
#   llama2-13b 241 GB (does not fit).
# - device with optimizer offload: the bf16 working copy (2 B/P) and the
#   fp32 gradient (4) = 6 B/P; the master and the moments stay in ballastd
#   and stream through two staging sets of the largest unit (24 bytes a
#   float of it, both sets). Plus activations. llama2-7b 52 GB, llama2-13b
#   93 GB: both fit on the H200.
# - host, the worker: the random initial weights are made on the host and
#   copied once more for the sharded state: 8 B/P for a moment, gone before
#   the first optimizer version enters ballastd's pool; a host copy of the
#   master (4 B/P) may be held while that version is written. So with
#   optimizer offload the host needs max(8 B/P, 4 B/P + pool) + 2 GiB
#   (ballastd's pool pages are touched only when blobs are written).
# - ballastd with --optimizer-offload: m, v and the master, 12 B/P per
#   version. The benchmarks run it with --optimizer-offload-durable no (no
#   resume from the service needed): plain blobs, nothing written to NVMe
#   unless the pool is full, and each unit's old version freed once its new
#   one is in, so one version lives: a pool of 12 B/P + 2 GiB of slack and
#   a fixed 1 GiB spill tier (never used). llama3.2-1b 17 GB of pool,
#   llama3.2-3b 41 GB, llama2-7b 83 GB: fits the 128 GiB machine.
#   llama2-13b needs 156 GB of pool: more than the host memory, so the
#   largest-model run uses --optimizer-offload nvme (optnvme): the pool gets
#   what the host has left (host - 4 B/P - 2 GiB, about 83 GB) and the spill
#   tier must hold the rest of the version (about 76 GB, written and read
#   back every step): more than the 64 GiB disk, so 13B is skipped there
#   with these figures; it needs ~93 GB of GPU memory and 156 GB of pool
#   and spill tier together. (A durable run, the default of nvme, would
#   write every version through to NVMe: 24 B/P of spill.)
# - ballastd with --activation-offload only: the offloaded block inputs of
#   a micro-step, (L + 1 - K) x T x D x 2 bytes (K = horizon + 2 resident),
#   twice, plus 1 GiB: about 3 GB for llama2-7b; a 1 GiB spill tier that is
#   never used (ballastd preallocates whatever --spill-bytes says).
# Every estimate is checked before a run against what the machine has;
# a run that does not fit is skipped with the figures.
#
# GPU_BENCH_DRYRUN=1: the same plans (on the real models' sizes, against
# the machine's figures or the overrides), but every run uses the model
# GPU_BENCH_DRY_MODEL (default small), seq 64, --backend cpu and 1 thread,
# with pools sized for that model: the command lines, ballastd's flags and
# the parsing of the worker's JSON are exercised without a GPU.

GB_SEQ=4096
GB_MB=1
GB_WARMUP=${GPU_BENCH_WARMUP:-2}
GB_TIMED=${GPU_BENCH_TIMED:-3}
GB_DRY=${GPU_BENCH_DRYRUN:-0}
GB_DRY_MODEL=${GPU_BENCH_DRY_MODEL:-small}
GB_BUILD=${BUILD:-build}
case $GB_BUILD in /*) ;; *) GB_BUILD=$ROOT/$GB_BUILD ;; esac
GB_BIN=${BALLAST_BIN:-$GB_BUILD/bin}
GB_WORK=${GPU_BENCH_WORK:-$ROOT/build/gpu/bench}   # token files, ballastd sockets and spill tiers
GB_SPILL_ROOT=$GB_WORK
GiB=$((1 << 30))
GB_SLACK=$GiB          # headroom added to pools and spill tiers (a dry run's pools are small)
[ "$GB_DRY" = 1 ] && GB_SLACK=$((32 << 20))
mkdir -p "$GB_WORK"

# seconds left of the caller's budget (run.sh defines left)
gb_left() { if declare -F left > /dev/null; then left; else echo 999999; fi; }

gb_say() { echo "[bench] $*"; }

# gb_ours CMD...: run one of our programs with GB_LIBPATH as LD_LIBRARY_PATH
gb_ours() { if [ -n "${GB_LIBPATH:-}" ]; then env LD_LIBRARY_PATH="$GB_LIBPATH" "$@"; else "$@"; fi; }

# JSON string escaping for the few free-text fields we write
gb_jstr() { "$PY" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }

gb_skip() {   # gb_skip WHAT WHY
    gb_say "$1: skipped ($2)"
    echo "{\"kind\": \"skip\", \"what\": $(gb_jstr "$1"), \"why\": $(gb_jstr "$2")}" >> "$RES"
}

gb_model_dims() {
    # name D L H KV Dh F V tied, as workers/model/config.c's presets
    awk -v m="$1" '
        $1 == m { D = $2; L = $3; H = $4; KV = $5; Dh = $6; F = $7; V = $8; tie = $9
                  blk = D * H * Dh + 2 * D * KV * Dh + H * Dh * D + 3 * D * F + 2 * D
                  rest = V * D * (tie ? 1 : 2) + D
                  p = blk * L + rest
                  printf "%.0f %d %d %d %.0f\n", p, L, D, V, (blk > rest ? blk : rest); found = 1 }
        END { exit !found }' <<'EOF'
llama2-7b   4096 32 32 32 128 11008 32000  0
llama2-13b  5120 40 40 40 128 13824 32000  0
llama2-70b  8192 80 64 8  128 28672 32000  0
llama3-8b   4096 32 32 8  128 14336 128256 0
llama3.2-1b 2048 16 32 8  64  8192  128256 1
llama3.2-3b 3072 28 24 8  128 8192  128256 1
tiny        64   2  4  2  16  176   256    0
small       256  4  8  4  32  688   512    0
demo        384  6  6  2  64  1024  512    0
EOF
}

gb_step_stats() {   # FILE WARMUP
    "$PY" - "$1" "$2" <<'EOF'
import json, math, sys
path, warm = sys.argv[1], int(sys.argv[2])
tps, steps = None, []
for n, line in enumerate(open(path), 1):
    line = line.strip()
    if not line:
        continue
    try:
        r = json.loads(line)
    except ValueError as e:
        sys.exit(f"{path}:{n}: not JSON ({e})")
    if r.get("kind") == "settings":
        tps = r.get("tokens_per_step")
    elif "step" in r and "step_s" in r:
        steps.append(r)
if tps is None:
    sys.exit(f"{path}: no settings record (tokens_per_step)")
timed = [r for r in steps if r["step"] > warm]
if not timed:
    sys.exit(f"{path}: {len(steps)} steps logged, none after the {warm} warm-up steps")
for r in timed:
    if not isinstance(r["step_s"], (int, float)) or not math.isfinite(r["step_s"]) or r["step_s"] <= 0:
        sys.exit(f"{path}: step {r['step']} has step_s {r['step_s']!r}")
n = len(timed)
sec = sum(r["step_s"] for r in timed)
def mean(k):
    v = [r.get(k) for r in timed]
    v = [x for x in v if isinstance(x, (int, float))]
    return sum(v) / len(v) if v else None
peak = [r["mem_gpu_peak_bytes"] for r in timed if isinstance(r.get("mem_gpu_peak_bytes"), int)]
out = {
    "steps_timed": n, "first_timed_step": timed[0]["step"], "ms_per_step": 1e3 * sec / n,
    "tokens_per_s": tps * n / sec, "tokens_per_step": tps,
    "offload_wait_ms": 1e3 * mean("offload_wait_s") if mean("offload_wait_s") is not None else None,
    "comm_ms": 1e3 * mean("comm_s") if mean("comm_s") is not None else None,
    "offload_to_host_bytes": mean("offload_to_host_bytes"),
    "offload_to_device_bytes": mean("offload_to_device_bytes"),
    "mem_gpu_peak_bytes": max(peak) if peak else None,
    "loss_last": timed[-1].get("loss"),
}
print(json.dumps(out))
EOF
}

gb_capacity() {
    local m
    if [ -n "${GPU_DEVICE_BYTES:-}" ]; then GB_DEV_BYTES=$GPU_DEVICE_BYTES
    elif m=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc 0-9) && [ -n "$m" ]; then
        GB_DEV_BYTES=$((m * 1048576))
    elif [ "$GB_DRY" = 1 ]; then GB_DEV_BYTES=$((143771 * 1048576))   # an H200's, for the plans of a dry run
    else GB_DEV_BYTES=0; fi
    gb_host_memory
    if [ -n "${GPU_DISK_BYTES:-}" ]; then GB_DISK_BYTES=$GPU_DISK_BYTES
    else GB_DISK_BYTES=$(df -B1 --output=avail "$GB_SPILL_ROOT" 2>/dev/null | tail -1 | tr -dc 0-9); fi
    : "${GB_HOST_BYTES:=0}" "${GB_DISK_BYTES:=0}"
}

gb_host_memory() {
    local line room lim cur
    if [ -n "${GPU_HOST_BYTES:-}" ]; then GB_HOST_BYTES=$GPU_HOST_BYTES GB_HOST_WHAT="GPU_HOST_BYTES"; return 0; fi
    line=$(awk '{ v[$1] = $2 * 1024 }
        END { t = sprintf("MemTotal %.1f GB", v["MemTotal:"] / 1e9)
              if ("MemAvailable:" in v) printf "%.0f MemAvailable of /proc/meminfo, %s\n", v["MemAvailable:"], t
              else if ("MemFree:" in v) printf "%.0f MemFree + Buffers + Cached of /proc/meminfo (no MemAvailable), %s\n", v["MemFree:"] + v["Buffers:"] + v["Cached:"], t
              else if ("MemTotal:" in v) printf "%.0f MemTotal of /proc/meminfo (no MemAvailable or MemFree)\n", v["MemTotal:"]
              else print "0 no /proc/meminfo: set GPU_HOST_BYTES" }' /proc/meminfo 2>/dev/null)
    GB_HOST_BYTES=${line%% *} GB_HOST_WHAT=${line#* }
    [ -n "$GB_HOST_BYTES" ] || GB_HOST_BYTES=0 GB_HOST_WHAT="no /proc/meminfo: set GPU_HOST_BYTES"
    # a container's memory limit (cgroup v2, else v1) may leave less
    if [ -r /sys/fs/cgroup/memory.max ]; then
        lim=$(cat /sys/fs/cgroup/memory.max) cur=$(cat /sys/fs/cgroup/memory.current 2>/dev/null || echo 0)
    elif [ -r /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
        lim=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes) cur=$(cat /sys/fs/cgroup/memory/memory.usage_in_bytes 2>/dev/null || echo 0)
    else lim=max cur=0; fi
    case $lim$cur in *[!0-9]*) return 0 ;; esac   # "max": no limit
    room=$(( lim - cur ))
    if [ "$room" -lt "$GB_HOST_BYTES" ]; then
        GB_HOST_WHAT="the cgroup's memory limit $(gb_human "$lim") less $(gb_human "$cur") in use; $GB_HOST_WHAT gave $(gb_human "$GB_HOST_BYTES")"
        GB_HOST_BYTES=$(( room > 0 ? room : 0 ))
    fi
}

gb_human() { awk -v b="$1" 'BEGIN { if (b >= 1e9) printf "%.1f GB", b / 1e9; else printf "%.0f MB", b / 1e6 }'; }

# Sizes of one run at seq SEQ (default GB_SEQ), micro-batch GB_MB,
# activation checkpointing on (every worker benchmark uses it).
gb_need() {   # KIND MODEL [SEQ]
    local kind=$1 seq=${3:-$GB_SEQ} dims P L D V U act off room
    dims=$(gb_model_dims "$2") || return 1
    read -r P L D V U <<< "$dims"
    # checkpointed block inputs, one block's internals (generous), logits and their gradient, workspaces
    act=$(( (L + 1) * seq * GB_MB * D * 2 + 40 * seq * GB_MB * D * 2 + seq * GB_MB * V * 8 + 2 * GiB ))
    GB_NEED_DEV=$(( 18 * P + act ))
    GB_DEV_WHAT="18 B/param + activations"
    GB_NEED_HOST=$(( 8 * P + 2 * GiB ))
    GB_NEED_DISK=0 GB_POOL=0 GB_SPILL=0 GB_DISK_WHAT=""
    case $kind in
    plain) ;;
    actoff)
        off=$(( L - 3 > 0 ? L - 3 : 1 ))   # L + 1 - K block inputs leave per micro-step, K = 2 + 2 (horizon 2)
        GB_POOL=$(( 2 * off * seq * GB_MB * D * 2 + GB_SLACK ))
        GB_SPILL=$GB_SLACK
        GB_NEED_HOST=$(( GB_NEED_HOST + GB_POOL )) ;;
    optoff|optnvme)
        # --optimizer-offload-durable no: one version (12 B/P) in the pool
        GB_NEED_DEV=$(( 6 * P + 24 * U + act ))
        GB_DEV_WHAT="6 B/param + 2 staging sets of the largest unit + activations"
        GB_POOL=$(( 12 * P + 2 * GB_SLACK ))
        GB_SPILL=$GB_SLACK
        if [ "$kind" = optnvme ]; then
            # the pool gets what the host has left, the spill tier the rest of the version
            room=$(( ${GB_HOST_BYTES:-0} - 4 * P - 2 * GiB ))
            [ "$room" -lt $(( 2 * GB_SLACK )) ] && room=$(( 2 * GB_SLACK ))
            if [ "$GB_POOL" -gt "$room" ]; then
                GB_SPILL=$(( GB_POOL - room + GB_SLACK ))
                GB_DISK_WHAT=" (one version of m, v and master is $(gb_human $(( 12 * P ))) at 12 B/param; the host leaves room for a pool of $(gb_human $room), the spill tier holds the rest)"
                GB_POOL=$room
            fi
        fi
        GB_NEED_HOST=$(( 4 * P + GB_POOL ))
        [ "$GB_NEED_HOST" -lt $(( 8 * P )) ] && GB_NEED_HOST=$(( 8 * P ))
        GB_NEED_HOST=$(( GB_NEED_HOST + 2 * GiB )) ;;
    *) echo "gb_need: unknown kind $kind" >&2; return 1 ;;
    esac
    GB_NEED_DISK=$GB_SPILL
}

gb_fits() {   # KIND MODEL
    gb_need "$1" "$2" || { echo "no size model for $2 (not a preset)"; return 1; }
    local why=""
    if [ "$GB_DEV_BYTES" -le 0 ]; then
        why="no GPU found (nvidia-smi; GPU_DEVICE_BYTES overrides)"
    elif [ "$GB_NEED_DEV" -gt "$GB_DEV_BYTES" ]; then
        why="GPU memory: needs ~$(gb_human $GB_NEED_DEV) ($GB_DEV_WHAT), the GPU has $(gb_human $GB_DEV_BYTES)"
    fi
    if [ "$GB_NEED_HOST" -gt "$GB_HOST_BYTES" ]; then
        why="${why:+$why; }host memory: needs ~$(gb_human $GB_NEED_HOST) (ballastd pool $(gb_human $GB_POOL)$(case $1 in optoff|optnvme) echo ': 12 B/param, one version of m, v and master';; esac) + the worker's start-up), $(gb_human $GB_HOST_BYTES) available"
    fi
    if [ "$GB_NEED_DISK" -gt "$GB_DISK_BYTES" ]; then
        why="${why:+$why; }disk: ballastd's spill tier needs $(gb_human $GB_NEED_DISK)$GB_DISK_WHAT, $(gb_human $GB_DISK_BYTES) free under $GB_SPILL_ROOT"
    fi
    [ -z "$why" ] && return 0
    echo "$why"
    return 1
}

GB_BD_PID=""
gb_ballastd_start() {   # DIR SOCKDIR POOL_BYTES SPILL_BYTES
    local d=$1 sd=$2 pool=$3 spill=$4 file i
    file=$(( spill / 4 < GiB ? spill / 4 : GiB ))
    [ "$file" -lt 1048576 ] && file=1048576
    mkdir -p "$d/spill"
    rm -f "$d/bd.ports"
    # not through gb_ours: a function in the background is a subshell, and
    # $! would be that subshell's PID, not ballastd's (stop would orphan it)
    local envp=()
    [ -n "${GB_LIBPATH:-}" ] && envp=(env LD_LIBRARY_PATH="$GB_LIBPATH")
    "${envp[@]}" "$GB_BIN/ballastd" --socket "$sd/bd.sock" --port-file "$d/bd.ports" --pool-bytes "$pool" --spill-dir "$d/spill" \
        --spill-bytes "$spill" --spill-file-bytes "$file" --no-mlock --evict-wait 30s > "$d/ballastd.log" 2>&1 &
    GB_BD_PID=$!
    for i in $(seq 1 600); do
        [ -s "$d/bd.ports" ] && return 0
        kill -0 "$GB_BD_PID" 2>/dev/null || { GB_BD_PID=""; return 1; }
        sleep 0.1
    done
    return 1
}
gb_ballastd_stop() {
    [ -n "$GB_BD_PID" ] || return 0
    local i
    kill -TERM "$GB_BD_PID" 2>/dev/null
    for i in $(seq 1 150); do kill -0 "$GB_BD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$GB_BD_PID" 2>/dev/null
    wait "$GB_BD_PID" 2>/dev/null
    GB_BD_PID=""
}

# The token file: a synthetic corpus per vocabulary, made once.
gb_data() {   # VOCAB -> path
    local f=$GB_WORK/tokens-$1.bin
    if [ ! -s "$f" ]; then
        gb_ours "$GB_BIN/ballast" data synth --out "$f" --tokens 2000000 --vocab "$1" --seed 5 > "$f.out" 2>&1 || { cat "$f.out" >&2; return 1; }
    fi
    echo "$f"
}

gb_worker_bench() {   # NAME KIND MODEL LIMIT_S [flags...]
    local name=$1 kind=$2 model=$3 limit=$4; shift 4
    local why run_model seq dims P L D V data d rc stats left msg
    local -a backend off
    if [ ! -x "$GB_BIN/ballast-worker" ] || [ ! -x "$GB_BIN/ballastd" ] || [ ! -x "$GB_BIN/ballast" ]; then
        gb_skip "$name" "no $GB_BIN/ballast-worker, ballastd and ballast: carry build/ from a Debian 12 machine that ran make with nvcc"
        return 1
    fi
    if [ "$GB_DRY" != 1 ]; then
        why=$(gb_ours ldd "$GB_BIN/ballast-worker" "$GB_BIN/ballastd" 2>&1 | awk '/not found/ { print $1 }' | sort -u | tr '\n' ' ')
        [ -n "$why" ] && { gb_skip "$name" "the Makefile build does not load here, missing: ${why% } (carry the bundle: tests/gpu/bundle.sh, docs/cuda.md)"; return 1; }
        if ! gb_ours "$GB_BIN/ballast-worker" --help 2>&1 | grep -q -- '--backend cpu|cuda'; then
            gb_skip "$name" "$GB_BIN/ballast-worker has no --backend cuda"; return 1
        fi
    fi
    why=$(gb_fits "$kind" "$model") || { gb_skip "$name" "$model does not fit: $why"; return 1; }
    left=$(gb_left)   # start with half the limit left at least; get at most what is left
    if [ "$left" -lt $(( limit / 2 )) ]; then gb_skip "$name" "time budget: ${left}s left, the run needs up to ${limit}s"; return 1; fi
    [ "$limit" -gt "$left" ] && limit=$left
    run_model=$model seq=$GB_SEQ backend=(--backend cuda)
    if [ "$GB_DRY" = 1 ]; then
        run_model=$GB_DRY_MODEL seq=64 backend=(--backend cpu --threads 1)
        gb_need "$kind" "$run_model" "$seq"   # pools sized for the model that runs
    fi
    dims=$(gb_model_dims "$run_model")
    read -r P L D V _ <<< "$dims"
    data=$(gb_data "$V") || { gb_skip "$name" "ballast data synth failed"; return 1; }
    d=$GB_WORK/$name
    rm -rf "$d"; mkdir -p "$d"
    # the socket in a short directory of its own (a Unix socket path has 107 bytes at most)
    local sd
    sd=$(mktemp -d /tmp/ballast-gb.XXXXXX) || { gb_skip "$name" "cannot make a directory under /tmp"; return 1; }
    echo "$sd" > "$d/sockdir" # for whoever cleans up after a kill
    off=()
    if [ "$kind" != plain ]; then
        if ! gb_ballastd_start "$d" "$sd" "$GB_POOL" "$GB_SPILL"; then
            gb_skip "$name" "ballastd did not start (pool $(gb_human $GB_POOL), spill $(gb_human $GB_SPILL)): $(tail -2 "$d/ballastd.log" | tr '\n' ' ')"
            cp "$d/ballastd.log" "$LOG/$name.ballastd.log" 2>/dev/null
            gb_ballastd_stop
            rm -rf "$d/spill" "$sd"
            return 1
        fi
        off=(--offload-socket "unix:$sd/bd.sock" --offload-job "$name")
    fi
    local cmd=("$GB_BIN/ballast-worker" "${backend[@]}" --model "$run_model" --data "$data" --init-seed 7 --data-seed 9
               --seq-len "$seq" --micro-batch $GB_MB --steps $((GB_WARMUP + GB_TIMED)) --lr 1e-4 --lr-schedule constant
               --activation-checkpointing --log-every 1 --log-json "$d/steps.jsonl" "${off[@]}" "$@")
    gb_say "$name: $model$([ "$GB_DRY" = 1 ] && echo " (dry run: $run_model, seq $seq, CPU)")$([ "$kind" != plain ] && echo ", ballastd pool $(gb_human $GB_POOL) spill $(gb_human $GB_SPILL)") (limit ${limit}s)"
    echo "${cmd[*]}" > "$d/cmd"
    timeout "$limit" $([ -n "${GB_LIBPATH:-}" ] && echo env) ${GB_LIBPATH:+"LD_LIBRARY_PATH=$GB_LIBPATH"} "${cmd[@]}" > "$d/worker.out" 2>&1
    rc=$?
    gb_ballastd_stop
    rm -rf "$d/spill" "$sd"   # a spill tier is as large as the run needed: give the disk back
    cp "$d/worker.out" "$LOG/$name.log" 2>/dev/null
    [ -f "$d/ballastd.log" ] && cp "$d/ballastd.log" "$LOG/$name.ballastd.log" 2>/dev/null
    [ -f "$d/steps.jsonl" ] && cp "$d/steps.jsonl" "$LOG/$name.jsonl" 2>/dev/null
    grep -E '^(offload|memory|layout):' "$d/worker.out" | sed 's/^/    /'
    if [ $rc -ne 0 ]; then
        why="exit $rc"
        [ $rc -eq 124 ] && why="timed out after ${limit}s"
        grep -qi 'out of memory' "$d/worker.out" && why="$why: out of memory"
        # the error line, else the last line that is not a step's progress line
        msg=$(grep -E 'error|fatal' "$d/worker.out" | tail -1)
        [ -z "$msg" ] && msg=$(grep -v '^step ' "$d/worker.out" | grep . | tail -1)
        gb_skip "$name" "$why: $(echo "$msg" | cut -c1-300)"
        tail -5 "$d/worker.out" | sed 's/^/    /'
        return 1
    fi
    if ! stats=$(gb_step_stats "$d/steps.jsonl" "$GB_WARMUP" 2>&1); then
        gb_skip "$name" "no timed steps: $stats"; return 1
    fi
    "$PY" - "$stats" "$name" "$kind" "$model" "$run_model" "$GB_DRY" "$(cat "$d/cmd")" >> "$RES" <<'EOF'
import json, sys
s = json.loads(sys.argv[1])
s.update({"kind": "worker_bench", "name": sys.argv[2], "bench": sys.argv[3], "model": sys.argv[4],
          "ran_model": sys.argv[5], "dry_run": sys.argv[6] == "1", "command": sys.argv[7]})
print(json.dumps(s))
EOF
    "$PY" - "$stats" "$name" <<'EOF'
import json, sys
s = json.loads(sys.argv[1])
print(f"[bench] {sys.argv[2]}: {s['ms_per_step']:.1f} ms/step, {s['tokens_per_s']:.0f} tokens/s, exposed offload wait "
      f"{s['offload_wait_ms'] or 0:.1f} ms/step, {(s['offload_to_host_bytes'] or 0) / 1e6:.1f} MB/step to ballastd")
EOF
    return 0
}

gb_ratio() {   # WHAT ON OFF GOAL
    "$PY" - "$RES" "$1" "$2" "$3" "$4" >> "$RES" <<'EOF'
import json, sys
res, what, on, off, goal = sys.argv[1:6]
rows = {r["name"]: r for r in map(json.loads, filter(str.strip, open(res))) if r.get("kind") == "worker_bench"}
if on in rows and off in rows:
    a, b = rows[on], rows[off]
    ratio = a["ms_per_step"] / b["ms_per_step"]
    print(json.dumps({"kind": "ratio", "what": what, "model": a["model"], "on": on, "off": off,
                      "on_ms": a["ms_per_step"], "off_ms": b["ms_per_step"], "ratio": ratio,
                      "goal": float(goal) if goal else None, "met": ratio < float(goal) if goal else None,
                      "dry_run": a["dry_run"]}))
EOF
}
