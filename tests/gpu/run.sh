#!/usr/bin/env bash
# tests/gpu/run.sh: every GPU check and the GPU benchmark, in one go, on a
# machine with an NVIDIA GPU (made for one H200; under 8 minutes there).
#
#   tests/gpu/run.sh            build, checks, end to end, benchmark, table
#   tests/gpu/run.sh --quick    build, checks and end to end only
#   tests/gpu/run.sh [--bench LIST] [--no-checks] [--budget SECONDS]
#       --bench LIST   comma-separated benchmark groups (default all):
#                      ours (gpu_train bf16, 1B and 7B), fp8 (gpu_train FP8,
#                      1B and 7B), actoff, optoff, largest (ballast-worker,
#                      below), torch (the PyTorch baseline), all, none
#       --no-checks    build, then only the benchmarks (steps 2, 3, 3b skipped)
#       --budget S     seconds after the start past which phases and
#                      benchmarks are skipped (GPU_RUN_BUDGET, default 450)
#   GPU_BENCH_DRYRUN=1 tests/gpu/run.sh ...   (no GPU needed) builds nothing
#                      and runs no check: every benchmark's command line
#                      runs on the CPU with a small model (ballast-worker
#                      --backend cpu through ballastd), gpu_train's flags
#                      are parsed by the Makefile build's gpu_train; what
#                      tests/integration/gpu_bench.sh runs under make test
#
# It needs no Makefile and none of the project's Debian packages: it finds
# nvcc and the CUDA libraries on the machine (the toolkit under
# $CUDA_HOME or /usr/local/cuda, else the pip nvidia-* wheels of python3),
# builds into build/gpu/ with nvcc and gcc, and links jansson statically
# from a system install or from the Debian packages carried in .deb/
# (see docs/cuda.md, "Running on a GPU machine"). Steps:
#   1. build the CUDA backend, the CPU oracle and the programs
#   2. tests/gpu/check_* : every op family against the CPU oracle; FP8
#                           GEMMs against bf16 (check_fp8); NCCL with one
#                           rank per communicator (check_nccl); the
#                           offload pool registered for DMA and its copy
#                           bandwidth vs cudaHostAlloc and the link's peak
#                           (check_pool; with ballastd when the Makefile
#                           build in build/ runs here, else on a memfd)
#   3. gpu_train check    : 20 training steps, GPU losses vs CPU losses
#                           (then again with activation checkpointing)
#   3b. tests/gpu/ranks.sh: 4 ranks on one GPU (staged shm collectives),
#                           (S, T) in (4,1) (2,2) (1,4), losses vs one GPU
#                           process (needs build/bin/ballast-worker from make)
#   4. benchmark          : ballast vs PyTorch (tests/gpu/torch_baseline.py)
#                           on llama3.2-1b and llama2-7b (activation
#                           checkpointing) at seq 4096, and per-op times;
#                           ballast FP8 vs bf16 on llama3.2-1b and llama2-7b
#   4b. ballast-worker    : (the Makefile build in build/, with ballastd;
#                           tests/gpu/bench_lib.sh says what fits where)
#                           actoff: llama2-7b, seq 4096, checkpointing,
#                             --activation-offload on vs off (goal: on < 3%
#                             slower), then on with every block input
#                             resident (the loop without the copies)
#                           optoff: --optimizer-offload host
#                             --optimizer-offload-durable no on vs off on
#                             the largest of llama3.2-3b, llama3.2-1b where
#                             both fit
#                           largest: the first of llama2-13b, llama2-7b,
#                             llama3.2-3b, llama3.2-1b that fits with
#                             --optimizer-offload nvme
#                             --optimizer-offload-durable no (pool what the
#                             host has, spill the rest), its tokens/s
#                           2 warm-up + 3 timed steps each, step times from
#                           the worker's --log-json records
#   5. a short table, last
# Results: build/gpu/results.jsonl, logs in build/gpu/log/; all of it is
# copied to $OUT when that is set. Exit status 0 only when every check and
# the end-to-end run passed (the benchmark never fails the run).
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
QUICK=0 CHECKS=1
BENCH=all
BUDGET=${GPU_RUN_BUDGET:-450}   # seconds; later phases are skipped past it
DRY=${GPU_BENCH_DRYRUN:-0}
BENCH_GROUPS="ours fp8 actoff optoff largest torch"
usage() { sed -n '2,/^set -u/p' "$0" | sed -n '/^#   tests\/gpu\/run.sh/,/^#$/p' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
    --quick) QUICK=1 ;;
    --no-checks) CHECKS=0 ;;
    --bench) [ $# -ge 2 ] || { echo "run.sh: --bench needs a list (one or more of: $BENCH_GROUPS, all, none)" >&2; exit 2; }
             BENCH=$2; shift ;;
    --bench=*) BENCH=${1#--bench=} ;;
    --budget) [ $# -ge 2 ] || { echo "run.sh: --budget needs a number of seconds" >&2; exit 2; }
              BUDGET=$2; shift ;;
    --budget=*) BUDGET=${1#--budget=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done
case $BUDGET in ''|*[!0-9]*) echo "run.sh: --budget '$BUDGET': expected whole seconds, e.g. 450" >&2; exit 2 ;; esac
case $DRY in 0|1) ;; *) echo "run.sh: GPU_BENCH_DRYRUN='$DRY': expected 0 or 1" >&2; exit 2 ;; esac
SEL=" "
for g in $(echo "$BENCH" | tr ',' ' '); do
    case " $BENCH_GROUPS all none " in
    *" $g "*) ;;
    *) echo "run.sh: --bench: unknown group '$g' (one or more of: $BENCH_GROUPS, all, none; comma-separated)" >&2; exit 2 ;;
    esac
    [ "$g" = all ] && g=$BENCH_GROUPS
    SEL="$SEL$g "
done
[ $QUICK = 1 ] && SEL=" none "
want() { case "$SEL" in *" $1 "*) return 0 ;; esac; return 1; }
B=${GPU_BUILD:-build/gpu}
LOG=$B/log
RES=$B/results.jsonl
SUM=$B/checks.txt
rm -rf "$LOG" "$B/obj" "$B/bin"
mkdir -p "$LOG" "$B/obj" "$B/bin"
: > "$RES"; : > "$SUM"
T0=$(date +%s)
say() { echo "[gpu +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
FAILED=0
PY=${PYTHON:-python3}
MK_BUILD=${BUILD:-build}
say "benchmarks:${SEL% }; budget ${BUDGET}s$([ "$DRY" = 1 ] && echo '; DRY RUN on the CPU: no build, no checks')"
if [ "$DRY" = 0 ]; then   # ---- steps 1 to 3b need the GPU ----

# ---- 1. toolchain ----
NVCC_BIN=""
for c in "${NVCC:-}" "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc "$(command -v nvcc 2>/dev/null)"; do
    [ -n "$c" ] && [ -x "$c" ] && { NVCC_BIN=$c; break; }
done
[ -n "$NVCC_BIN" ] || { echo "run.sh: no nvcc found (set NVCC or CUDA_HOME)"; exit 1; }
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC_BIN")")")
CC_BIN=${CC:-gcc}
command -v "$CC_BIN" >/dev/null || CC_BIN=cc
command -v "$CC_BIN" >/dev/null || { echo "run.sh: no C compiler (gcc or cc)"; exit 1; }
say "nvcc $NVCC_BIN ($("$NVCC_BIN" --version | grep -o 'release [0-9.]*')), C compiler $CC_BIN"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 | sed 's/^/[gpu] /'
else
    say "nvidia-smi not found: no GPU driver here, every check will report SKIP"
fi

# One library file by name: the toolkit first, then the pip wheels.
PIP_LIBDIRS=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)):
        print(d)
EOF
)
find_lib() {   # find_lib libcublasLt -> path of libcublasLt.so[.N]
    local d f
    for d in "$CUDA_ROOT/lib64" "$CUDA_ROOT/targets/x86_64-linux/lib" "$CUDA_ROOT/lib" $PIP_LIBDIRS /usr/lib/x86_64-linux-gnu; do
        for f in "$d/$1.so" $(ls "$d/$1".so.* 2>/dev/null | sort -V | tail -1); do
            [ -f "$f" ] && { echo "$f"; return 0; }
        done
    done
    return 1
}
CUDART=$(find_lib libcudart) || { echo "run.sh: libcudart not found"; exit 1; }
CUBLASLT=$(find_lib libcublasLt) || { echo "run.sh: libcublasLt not found"; exit 1; }
say "libcudart $CUDART"
say "libcublasLt $CUBLASLT"
CUDA_LINK="$CUDART $CUBLASLT -Wl,-rpath,$(dirname "$CUDART") -Wl,-rpath,$(dirname "$CUBLASLT") -lstdc++"
# libcublasLt needs libcublas' neighbours at run time in the wheel layout
export LD_LIBRARY_PATH="$(dirname "$CUBLASLT"):$(dirname "$CUDART")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# libnccl is loaded at run time (workers/comm/nccl.c); without it check_nccl skips
if NCCL_LIB=$(find_lib libnccl); then
    say "libnccl $NCCL_LIB"
    export LD_LIBRARY_PATH="$(dirname "$NCCL_LIB"):$LD_LIBRARY_PATH"
else
    say "libnccl not found: check_nccl will report SKIP"
fi
# cuda_runtime.h for the checks that call the runtime directly
CUDA_INC=""
for d in "$CUDA_ROOT/include" "$CUDA_ROOT/targets/x86_64-linux/include" $(for l in $PIP_LIBDIRS; do echo "$(dirname "$l")/include"; done); do
    [ -f "$d/cuda_runtime.h" ] && { CUDA_INC="-I$d"; break; }
done

# jansson (config.json and safetensors headers): system, carried root, or carried .debs
JANSSON_CFLAGS="" JANSSON_LIB=""
if [ -f /usr/include/jansson.h ] && ls /usr/lib/x86_64-linux-gnu/libjansson.* >/dev/null 2>&1; then
    JANSSON_LIB="-ljansson"
else
    if [ ! -f .deb/root/usr/include/jansson.h ] && ls .deb/libjansson*.deb >/dev/null 2>&1 && command -v dpkg >/dev/null; then
        mkdir -p .deb/root && for d in .deb/libjansson*.deb; do dpkg -x "$d" .deb/root; done
    fi
    if [ -f .deb/root/usr/include/jansson.h ] && [ -f .deb/root/usr/lib/x86_64-linux-gnu/libjansson.a ]; then
        JANSSON_CFLAGS="-I$ROOT/.deb/root/usr/include"
        JANSSON_LIB="$ROOT/.deb/root/usr/lib/x86_64-linux-gnu/libjansson.a"
    fi
fi
[ -n "$JANSSON_LIB" ] && say "jansson: ${JANSSON_LIB}" || say "jansson: MISSING (carry .deb/ as docs/cuda.md says): end-to-end and benchmark of ours will be skipped"

# ---- build ---- (only what the checks and gpu_train need: the
# ballast-worker benchmarks use the Makefile build)
if [ $CHECKS = 0 ] && ! want ours && ! want fp8; then
    say "build: skipped (no check and no gpu_train benchmark selected)"
else
ARCH=${CUDA_ARCHS:-}
if [ -z "$ARCH" ]; then
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    case "$cc" in
    90) ARCH="-gencode arch=compute_90a,code=sm_90a" ;;
    80) ARCH="-gencode arch=compute_80,code=sm_80" ;;
    "") ARCH="-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80" ;;
    *) ARCH="-gencode arch=compute_$cc,code=sm_$cc" ;;
    esac
fi
# cublasLt.h: the toolkit's, else the one of the pip wheel that holds the library
CUBLAS_INC=""
if [ ! -f "$CUDA_ROOT/include/cublasLt.h" ] && [ ! -f "$CUDA_ROOT/targets/x86_64-linux/include/cublasLt.h" ]; then
    h=$(dirname "$(dirname "$CUBLASLT")")/include
    [ -f "$h/cublasLt.h" ] && CUBLAS_INC="-I$h" || say "cublasLt.h not found next to $CUBLASLT; the build may fail"
fi
NVFLAGS="-O2 -std=c++17 $ARCH -Xcompiler -fPIC,-Wall -I. -Icommon $CUBLAS_INC"
CFLAGS="-std=c11 -D_GNU_SOURCE -DGPU_STANDALONE -O2 -g -Wall -Wno-unused-parameter -Wno-missing-field-initializers -fopenmp -pthread -I. -Icommon $CUDA_INC $JANSSON_CFLAGS"
JOBS=$(nproc 2>/dev/null || echo 4)
say "building ($ARCH, $JOBS jobs)"
export NVCC_BIN NVFLAGS CC_BIN CFLAGS B
ls workers/backend/cuda/*.cu | xargs -P "$JOBS" -I{} sh -c \
    'o=$B/obj/$(basename {} .cu).cu.o; $NVCC_BIN $NVFLAGS -c {} -o $o > $o.log 2>&1 || { cat $o.log; echo "BUILD FAILED: {}"; exit 255; }' \
    || { say "CUDA build failed"; exit 1; }
C_ORACLE="common/log.c common/errbuf.c common/clock.c workers/backend/cpu.c"
# model.c reaches tp.c (and tp.c the comm API) for tensor parallelism only:
# one process links tp.c with tests/gpu/lib/no_comm.c in place of the collectives
C_TRAIN="common/options.c workers/model/model.c workers/model/tp.c tests/gpu/lib/no_comm.c workers/model/optim.c workers/model/config.c workers/ckpt/safetensors.c"
C_COMM="workers/comm/comm.c workers/comm/open.c workers/comm/shm.c workers/comm/nccl.c common/shm.c"
CSRC="$C_ORACLE $C_COMM"
[ -n "$JANSSON_LIB" ] && CSRC="$CSRC $C_TRAIN"
for f in $CSRC tests/gpu/*.c; do echo "$f"; done | { [ -n "$JANSSON_LIB" ] && cat || grep -v gpu_train; } | xargs -P "$JOBS" -I{} sh -c \
    'o=$B/obj/$(echo {} | tr / _).o; $CC_BIN $CFLAGS -c {} -o $o > $o.log 2>&1 || { cat $o.log; echo "BUILD FAILED: {}"; exit 255; }' \
    || { say "C build failed"; exit 1; }
CUOBJ=$(ls $B/obj/*.cu.o)
ORACLE_OBJ="$B/obj/common_log.c.o $B/obj/common_errbuf.c.o $B/obj/common_clock.c.o $B/obj/workers_backend_cpu.c.o"
obj() { for f in "$@"; do echo "$B/obj/$(echo $f | tr / _).o"; done; }
for src in tests/gpu/check_*.c; do
    n=$(basename "$src" .c)
    case $n in
    check_nccl) extra=$(obj $C_COMM) ;;          # its rendezvous shims stand in for gRPC
    check_pool) extra=$(obj common/shm.c) ;;
    *) extra="" ;;
    esac
    $CC_BIN -fopenmp -pthread -o "$B/bin/$n" "$B/obj/tests_gpu_$n.c.o" $extra $ORACLE_OBJ $CUOBJ $CUDA_LINK -lm -ldl \
        || { say "link of $n failed"; exit 1; }
done
if [ -n "$JANSSON_LIB" ]; then
    TRAIN_OBJ=$(for f in $C_TRAIN; do echo "$B/obj/$(echo $f | tr / _).o"; done)
    $CC_BIN -fopenmp -pthread -o "$B/bin/gpu_train" "$B/obj/tests_gpu_gpu_train.c.o" $TRAIN_OBJ $ORACLE_OBJ $CUOBJ \
        $JANSSON_LIB $CUDA_LINK -lm || { say "link of gpu_train failed"; exit 1; }
fi
say "built: $(ls $B/bin | tr '\n' ' ')"
fi

# ballastd's and ballast-worker's shared libraries, when carried along
# (docs/cuda.md: .deb/lib)
[ -d .deb/lib ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$ROOT/.deb/lib"
if [ $CHECKS = 0 ]; then
    say "checks, end to end and GPU ranks: skipped (--no-checks)"
else
# ---- 2. kernel checks ----
# check_pool with ballastd: the Makefile build of this tree (build/), when
# it was carried here and its libraries load; otherwise only the memfd one
POOL_MK=""
if [ -x "$MK_BUILD/tests/gpu/check_pool" ] && [ -x "$MK_BUILD/bin/ballastd" ] && \
   ! ldd "$MK_BUILD/tests/gpu/check_pool" "$MK_BUILD/bin/ballastd" 2>&1 | grep -q 'not found'; then
    POOL_MK="$MK_BUILD/tests/gpu/check_pool"
    ln -sf "$ROOT/$POOL_MK" "$B/bin/check_pool_ballastd"
    say "check_pool_ballastd: the Makefile build with ballastd ($POOL_MK)"
else
    say "check_pool_ballastd: skipped (no runnable $MK_BUILD/tests/gpu/check_pool and $MK_BUILD/bin/ballastd here: carry build/ from a Debian 12 machine with the packages); check_pool measures a sealed memfd instead"
    echo "{\"kind\":\"skip\",\"what\":\"check_pool_ballastd\",\"why\":\"no runnable Makefile build of ballastd here\"}" >> "$RES"
fi
for p in $B/bin/check_*; do
    n=$(basename "$p")
    args=""
    case $n in
    check_pool) args="--json $RES" ;;
    check_pool_ballastd) args="--json $RES --ballastd $ROOT/$MK_BUILD/bin/ballastd" ;;
    esac
    timeout 300 "$p" $args > "$LOG/$n.tap" 2>&1
    rc=$?
    ok=$(grep -E '^ok ' "$LOG/$n.tap" | grep -vc '# SKIP')
    sk=$(grep -c '# SKIP' "$LOG/$n.tap")
    bad=$(grep -c '^not ok' "$LOG/$n.tap")
    [ $rc -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    [ "$bad" -gt 0 ] && FAILED=1
    printf '%s %d %d %d %d\n' "${n#check_}" "$ok" "$bad" "$sk" "$rc" >> "$SUM"
    say "$n: $ok passed, $bad failed, $sk skipped (exit $rc)"
    grep -E -A3 '^not ok' "$LOG/$n.tap" | head -20 | sed 's/^/    /'
done

# ---- 3. end to end ----
if [ -x "$B/bin/gpu_train" ]; then
    say "end to end: demo model, 20 steps, CPU vs GPU"
    timeout 300 "$B/bin/gpu_train" check --model demo --seq-len 128 --micro-batch 4 --steps 20 --json "$RES" \
        --dir "$B" > "$LOG/e2e.tap" 2>&1
    rc=$?
    grep -E '^(ok|not ok)|^# ' "$LOG/e2e.tap" | sed 's/^/    /'
    ok=$(grep -E '^ok ' "$LOG/e2e.tap" | grep -vc '# SKIP'); bad=$(grep -c '^not ok' "$LOG/e2e.tap")
    sk=$(grep -c '# SKIP' "$LOG/e2e.tap")
    [ $rc -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    [ "$bad" -gt 0 ] && FAILED=1
    printf '%s %d %d %d %d\n' "e2e" "$ok" "$bad" "$sk" "$rc" >> "$SUM"
    say "end to end with activation checkpointing on the GPU"
    timeout 300 "$B/bin/gpu_train" check --model demo --seq-len 128 --micro-batch 4 --steps 20 --activation-checkpointing \
        --dir "$B" > "$LOG/e2e_ckpt.tap" 2>&1
    rc=$?
    grep -E '^(ok|not ok)' "$LOG/e2e_ckpt.tap" | sed 's/^/    /'
    ok=$(grep -E '^ok ' "$LOG/e2e_ckpt.tap" | grep -vc '# SKIP'); bad=$(grep -c '^not ok' "$LOG/e2e_ckpt.tap")
    sk=$(grep -c '# SKIP' "$LOG/e2e_ckpt.tap")
    [ $rc -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    [ "$bad" -gt 0 ] && FAILED=1
    printf '%s %d %d %d %d\n' "e2e_ckpt" "$ok" "$bad" "$sk" "$rc" >> "$SUM"
else
    printf '%s %d %d %d %d\n' "e2e" 0 0 1 0 >> "$SUM"
fi

# ---- 3b. GPU ranks: 4 ranks on one GPU vs one GPU process (tests/gpu/ranks.sh) ----
# needs build/bin/ballast-worker from `make` with nvcc (the whole worker);
# ranks.sh says SKIP when it is not there
if [ "$(left)" -gt 60 ]; then
    say "GPU ranks: 4 ranks on one GPU with staged shm collectives, (S, T) in (4,1) (2,2) (1,4)"
    timeout "$(left)" tests/gpu/ranks.sh "$LOG" > "$LOG/ranks.tap" 2>&1
    rc=$?
    grep -E '^(ok|not ok)|^# ' "$LOG/ranks.tap" | sed 's/^/    /'
    ok=$(grep -E '^ok ' "$LOG/ranks.tap" | grep -vc '# SKIP'); bad=$(grep -c '^not ok' "$LOG/ranks.tap")
    sk=$(grep -c '# SKIP' "$LOG/ranks.tap")
    [ $rc -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    [ "$bad" -gt 0 ] && FAILED=1
    printf '%s %d %d %d %d\n' "ranks" "$ok" "$bad" "$sk" "$rc" >> "$SUM"
else
    say "GPU ranks: skipped (time budget of ${BUDGET}s spent)"
    printf '%s %d %d %d %d\n' "ranks" 0 0 1 0 >> "$SUM"
fi
fi   # CHECKS
fi   # DRY = 0

# ---- 4. benchmark ----
# A benchmark starts only when at least half its limit is left of the
# budget (and gets at most what is left); otherwise it is skipped with the
# reason in results.jsonl. A failing one is reported, never fatal.
bench() {   # bench NAME SECONDS CMD...
    local name=$1 t=$2; shift 2
    if [ "$(left)" -lt $(( t / 2 )) ]; then
        say "$name: skipped (time budget: $(left)s of ${BUDGET}s left, it needs up to ${t}s)"
        echo "{\"kind\":\"skip\",\"what\":\"$name\",\"why\":\"time budget\"}" >> "$RES"; return
    fi
    [ "$t" -gt "$(left)" ] && t=$(left)
    say "$name (limit ${t}s)"
    timeout "$t" "$@" > "$LOG/$name.log" 2>&1
    local rc=$?
    grep -E '^(bench|torch_baseline)|^[a-z_/]+ +[0-9.]+ +[0-9]+ +[0-9.]+%|^total|^op ' "$LOG/$name.log" | sed 's/^/    /'
    if [ $rc -ne 0 ]; then
        say "$name: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)')"; tail -5 "$LOG/$name.log" | sed 's/^/    /'
        echo "{\"kind\":\"skip\",\"what\":\"$name\",\"why\":\"exit $rc\"}" >> "$RES"
    fi
}
# gpu_train: run.sh's own build; a dry run parses the same flags with the
# Makefile build's gpu_train (model demo, seq 64), which stops at "no usable
# GPU" (exit 2) once they are accepted
GPU_TRAIN=$B/bin/gpu_train
[ "$DRY" = 1 ] && GPU_TRAIN=$MK_BUILD/tests/gpu/gpu_train
gtrain() {   # gtrain NAME SECONDS gpu_train-ARGS...
    local name=$1 t=$2; shift 2
    if [ ! -x "$GPU_TRAIN" ]; then
        say "$name: skipped (no $GPU_TRAIN)"
        echo "{\"kind\":\"skip\",\"what\":\"$name\",\"why\":\"no $GPU_TRAIN\"}" >> "$RES"; return
    fi
    if [ "$DRY" = 0 ]; then bench "$name" "$t" "$GPU_TRAIN" "$@"; return; fi
    local a=() x
    while [ $# -gt 0 ]; do
        x=$1; shift
        case $x in
        --model) a+=(--model demo); shift ;;
        --seq-len) a+=(--seq-len 64); shift ;;
        --json) a+=(--json "$LOG/$name.dry.json"); shift ;;
        *) a+=("$x") ;;
        esac
    done
    "$GPU_TRAIN" "${a[@]}" > "$LOG/$name.log" 2>&1
    local rc=$?
    if [ $rc -eq 2 ] && grep -q 'no usable GPU' "$LOG/$name.log"; then
        say "$name: dry run: gpu_train accepted ${a[*]}"
        echo "{\"kind\":\"dryrun\",\"what\":\"$name\",\"ok\":true}" >> "$RES"
    else
        say "$name: dry run: gpu_train refused its flags (exit $rc): $(tail -1 "$LOG/$name.log")"
        echo "{\"kind\":\"dryrun\",\"what\":\"$name\",\"ok\":false}" >> "$RES"
    fi
}
if want ours; then
    gtrain ours-1b 150 bench --model llama3.2-1b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 2 --json "$RES"
    gtrain ours-7b 180 bench --model llama2-7b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 1 \
        --activation-checkpointing --json "$RES"
fi
if want fp8; then
    want ours || gtrain ours-1b 150 bench --model llama3.2-1b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 2 --no-profile --json "$RES"
    gtrain ours-1b-fp8 120 bench --model llama3.2-1b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 2 \
        --precision fp8 --no-profile --json "$RES"
    want ours || gtrain ours-7b 180 bench --model llama2-7b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 1 \
        --activation-checkpointing --no-profile --json "$RES"
    gtrain ours-7b-fp8 180 bench --model llama2-7b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 1 \
        --activation-checkpointing --precision fp8 --no-profile --json "$RES"
fi

# ---- 4b. ballast-worker: offload and scale (tests/gpu/bench_lib.sh) ----
if want actoff || want optoff || want largest; then
    GPU_BENCH_WORK=${GPU_BENCH_WORK:-$(cd "$B" && pwd)/bench}
    BUILD=$MK_BUILD source tests/gpu/bench_lib.sh
    trap gb_ballastd_stop EXIT   # a ballastd of an interrupted run goes too
    gb_capacity
    say "ballast-worker benchmarks: GPU $([ "$GB_DEV_BYTES" -gt 0 ] && gb_human $GB_DEV_BYTES || echo none), host memory available $(gb_human $GB_HOST_BYTES), disk free $(gb_human $GB_DISK_BYTES) under $GB_SPILL_ROOT"
fi
if want actoff; then
    # the goal: --activation-offload costs < 3% of the step on llama2-7b, seq 4096, checkpointing
    gb_worker_bench act-off-7b plain llama2-7b 150
    gb_worker_bench act-on-7b actoff llama2-7b 150 --activation-offload
    gb_ratio activation_offload act-on-7b act-off-7b 1.03
fi
OPT_MODEL=""
if want optoff; then
    # the largest preset where the run without offload and the one with it both fit
    for m in llama3.2-3b llama3.2-1b; do
        if why=$(gb_fits plain "$m") && why=$(gb_fits optoff "$m"); then OPT_MODEL=$m; break; fi
        gb_say "optimizer offload on vs off: not $m ($why)"
    done
    if [ -n "$OPT_MODEL" ]; then
        gb_worker_bench opt-off plain "$OPT_MODEL" 150
        gb_worker_bench opt-on optoff "$OPT_MODEL" 200 --optimizer-offload host --optimizer-offload-durable no
        gb_ratio optimizer_offload opt-on opt-off ""
    else
        gb_skip opt-off "no preset fits both with and without optimizer offload here"
    fi
fi
if want largest; then
    # the largest model that trains with optimizer offload: the first that fits
    LARGEST=""
    for m in llama2-13b llama2-7b llama3.2-3b llama3.2-1b; do
        if why=$(gb_fits optnvme "$m"); then LARGEST=$m; break; fi
        gb_skip "largest-$m" "$why"
    done
    if [ -z "$LARGEST" ]; then
        gb_skip largest "no preset fits with optimizer offload here"
    elif [ "$LARGEST" = "$OPT_MODEL" ] && grep -q '"name": "opt-on"' "$RES"; then
        gb_say "largest with optimizer offload: $LARGEST, measured above as opt-on"
        "$PY" -c 'import json, sys; print(json.dumps({"kind": "largest", "model": sys.argv[1], "from": "opt-on"}))' "$LARGEST" >> "$RES"
    elif gb_worker_bench "largest-$LARGEST" optnvme "$LARGEST" 240 --optimizer-offload nvme --optimizer-offload-durable no; then
        "$PY" -c 'import json, sys; print(json.dumps({"kind": "largest", "model": sys.argv[1], "from": sys.argv[2]}))' \
            "$LARGEST" "largest-$LARGEST" >> "$RES"
    fi
fi
if want torch; then
    if [ "$DRY" = 1 ]; then
        say "torch-1b, torch-7b: skipped (dry run: the PyTorch baseline needs the GPU)"
        echo '{"kind":"skip","what":"torch","why":"dry run"}' >> "$RES"
    else
        bench torch-1b 170 "$PY" tests/gpu/torch_baseline.py --model llama3.2-1b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 2 --json "$RES"
        bench torch-7b 170 "$PY" tests/gpu/torch_baseline.py --model llama2-7b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 1 \
            --activation-checkpointing --json "$RES"
    fi
fi
if want actoff; then
    # diagnostic, last: the same offload run with every block input resident
    # (horizon L - 1: nothing leaves), i.e. the sharded loop without copies
    gb_worker_bench act-res-7b actoff llama2-7b 150 --activation-offload \
        --activation-loading-horizon $(( $(gb_model_dims $([ "$DRY" = 1 ] && echo "$GB_DRY_MODEL" || echo llama2-7b) | cut -d' ' -f2) - 1 ))
fi

# ---- 5. table ----
say "done"
"$PY" - "$SUM" "$RES" <<'EOF'
import json, sys
checks = [line.split() for line in open(sys.argv[1]) if line.strip()]
if checks:
    print("\n== checks (tests/gpu/check_*, gpu_train check) ==")
    print(f"{'family':<12} {'passed':>6} {'failed':>6} {'skipped':>7}")
for f in checks:
    print(f"{f[0]:<12} {f[1]:>6} {f[2]:>6} {f[3]:>7}")
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
for r in rows:
    if r.get("kind") == "e2e":
        print(f"e2e {r['model']}: {r['steps']} steps, worst relative loss difference {r['worst_rel']:.2e}, {'ok' if r['ok'] else 'FAILED'}")
b = [r for r in rows if r.get("kind") == "bench"]
if b:
    print("\n== benchmark: seq 4096, one GPU, MFU against 989 TFLOP/s (6 N + 12 L H Dh T FLOPs per token) ==")
    print(f"{'model':<12} {'impl':<15} {'ckpt':<5} {'s/step':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6}")
    for r in sorted(b, key=lambda r: (r["model"], r["impl"])):
        print(f"{r['model']:<12} {r['impl']:<15} {'yes' if r['act_ckpt'] else 'no':<5} {r['s_per_step']:>8.3f} "
              f"{r['tokens_per_s']:>10.0f} {r['tflops']:>8.1f} {100 * r['mfu']:>5.1f}%")
p = [r for r in rows if r.get("kind") == "pool_bw"]
if p:
    print("\n== device<->pool copies (check_pool): GB/s, best of 5; target pool >= 0.95 x cudaHostAlloc ==")
    peak = max(r["link_peak_gbs"] for r in p)
    print(f"link peak: {peak:.1f} GB/s per direction" if peak > 0 else "link peak: unknown")
    print(f"{'source':<14} {'dir':<4} {'MiB':>6} {'GB/s':>8} {'ratio':>6} {'of peak':>8}")
    for r in p:
        of = f"{r['gbs'] / peak:.2f}" if peak > 0 else "-"
        ratio = f"{r['ratio']:.3f}" if r["source"].endswith("-pool") else "-"
        print(f"{r['source']:<14} {r['dir']:<4} {r['bytes'] >> 20:>6} {r['gbs']:>8.2f} {ratio:>6} {of:>8}")
for model in ("llama3.2-1b", "llama2-7b"):
    f8 = {r["impl"]: r for r in b if r["model"] == model and r["impl"] in ("ballast", "ballast-fp8")}
    if len(f8) == 2:
        print(f"\nFP8 vs bf16, {model} seq 4096: {f8['ballast-fp8']['tokens_per_s']:.0f} vs {f8['ballast']['tokens_per_s']:.0f} "
              f"tokens/s ({f8['ballast-fp8']['tokens_per_s'] / f8['ballast']['tokens_per_s']:.2f}x)")
w = [r for r in rows if r.get("kind") == "worker_bench"]
if w:
    dry = any(r["dry_run"] for r in w)
    print("\n== ballast-worker on one GPU, seq 4096, micro-batch 1, activation checkpointing; mean of the timed steps ==")
    if dry:
        print("   DRY RUN: each row ran the model in 'ran' on the CPU at seq 64; the figures say nothing about a GPU")
    print(f"{'run':<20} {'model':<12} {'ran':<12} {'ms/step':>9} {'tokens/s':>9} {'offl. wait':>10} {'MB/step out':>11} {'peak GPU GB':>11}")
    for r in w:
        wait = r.get("offload_wait_ms")
        peak = r.get("mem_gpu_peak_bytes")
        print(f"{r['name']:<20} {r['model']:<12} {r['ran_model']:<12} {r['ms_per_step']:>9.1f} {r['tokens_per_s']:>9.0f} "
              f"{'-' if wait is None else f'{wait:.1f} ms':>10} {(r.get('offload_to_host_bytes') or 0) / 1e6:>11.1f} "
              f"{'-' if peak is None else f'{peak / 1e9:.1f}':>11}")
for r in rows:
    if r.get("kind") == "ratio":
        goal = f", goal < {r['goal']:.2f}: {'met' if r['met'] else 'NOT met'}" if r.get("goal") and not r.get("dry_run") else ""
        print(f"{r['what'].replace('_', ' ')} on vs off ({r['model']}): {r['on_ms']:.1f} vs {r['off_ms']:.1f} ms/step, "
              f"ratio {r['ratio']:.3f}{goal}{' (dry run)' if r.get('dry_run') else ''}")
    if r.get("kind") == "largest":
        src = {x["name"]: x for x in w}.get(r["from"])
        if src:
            print(f"largest model trained with optimizer offload on one GPU: {r['model']}, {src['tokens_per_s']:.0f} tokens/s"
                  f"{' (dry run)' if src['dry_run'] else ''}")
    if r.get("kind") == "dryrun":
        print(f"dry run of {r['what']}: gpu_train {'accepted' if r['ok'] else 'REFUSED'} the flags")
for r in rows:
    if r.get("kind") == "skip":
        print(f"skipped: {r['what']} ({r['why']})")
EOF
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp -r "$LOG" "$RES" "$SUM" "$OUT"/ 2>/dev/null; fi
exit $FAILED
