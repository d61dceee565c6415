#!/usr/bin/env bash
# tests/gpu/run.sh: every GPU check and the GPU benchmark, in one go, on a
# machine with an NVIDIA GPU (made for one H200 in one 10-minute call of the
# device tool).
#
#   tests/gpu/run.sh            build, checks, end to end, benchmark, table
#   tests/gpu/run.sh --quick    build, checks and end to end only
#   tests/gpu/run.sh --dry-run  here, before a GPU call (no GPU needed):
#                      gather the bundle (tests/gpu/bundle.sh), build the
#                      programs the way the GPU machine will (gcc, with the
#                      .cu objects of the Makefile build instead of nvcc),
#                      check every carried and built program's libraries
#                      and the size of what travels; one line per problem,
#                      exit 1 on any, 77 when the bundle cannot be gathered
#   tests/gpu/run.sh [--bench LIST] [--no-checks] [--budget SECONDS]
#       --bench LIST   comma-separated benchmark groups (default all):
#                      ours (gpu_train bf16, 1B and 7B), fp8 (gpu_train FP8,
#                      1B and 7B), actoff, optoff, largest (ballast-worker,
#                      below), torch (the PyTorch baseline), all, none
#       --no-checks    build, then only the benchmarks (steps 2, 3, 3b skipped)
#       --budget S     seconds after the start past which phases and
#                      benchmarks are skipped (GPU_RUN_BUDGET, default 450);
#                      each check and benchmark also has a time limit of its
#                      own (GPU_CHECK_TIMEOUT 120, GPU_E2E_TIMEOUT 180,
#                      GPU_RANKS_TIMEOUT 240) and gets at most what is left
#   GPU_BENCH_DRYRUN=1 tests/gpu/run.sh ...   (no GPU needed) builds nothing
#                      and runs no check: every benchmark's command line
#                      runs on the CPU with a small model (ballast-worker
#                      --backend cpu through ballastd), gpu_train's flags
#                      are parsed by the Makefile build's gpu_train; what
#                      tests/integration/gpu_bench.sh runs under make test
#
# The GPU call (device tool), after `tests/gpu/run.sh --dry-run` here:
#   run(command="tests/gpu/run.sh", timeout_s=600,
#       carry=[".deb", "build/bin", "build/tests/gpu/check_pool"])
# (the dry run prints the carry list of this checkout).
#
# It needs no Makefile and none of the project's Debian packages: it finds
# nvcc and the CUDA libraries on the machine (the toolkit under
# $CUDA_HOME or /usr/local/cuda, else the pip nvidia-* wheels of python3),
# builds into build/gpu/ with nvcc and gcc, and links jansson statically
# from the bundle .deb/ (tests/gpu/bundle.sh) or a system install. Our
# programs, and only they, run with LD_LIBRARY_PATH set to the bundle's
# libraries and the CUDA and NCCL directories (and BALLAST_NCCL_LIB to the
# libnccl found: $BALLAST_NCCL_LIB, PyTorch's nvidia.nccl, the toolkit);
# python3 and the system's tools keep the machine's own. Steps:
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
#   4. benchmark, first   : ballast (gpu_train bench) vs PyTorch
#                           (tests/gpu/torch_baseline.py) on llama3.2-1b
#                           at seq 4096, and per-op times
#   4a. the rest          : the same on llama2-7b (activation
#                           checkpointing); ballast FP8 vs bf16 on
#                           llama3.2-1b and llama2-7b
#   4b. ballast-worker    : (the Makefile build in build/, with ballastd;
#                           tests/gpu/bench_lib.sh says what fits where,
#                           from the host memory /proc/meminfo gives, or
#                           GPU_HOST_BYTES)
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
# Results: build/gpu/results.jsonl (a record as each result comes),
# checks.txt, run.log (all of this output), logs in build/gpu/log/. With
# $OUT set, after every phase, check and benchmark they are copied there,
# the logs as one archive: $OUT/gpu-run.tar.gz, results.jsonl, checks.txt,
# table.txt, run.log (5 files), so a run killed on its way still returns
# what it did. Exit status 0 only when every check and the end-to-end run
# passed (the benchmark never fails the run).
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
QUICK=0 CHECKS=1 PREP=0
BENCH=all
BUDGET=${GPU_RUN_BUDGET:-450}   # seconds; later phases are skipped past it
DRY=${GPU_BENCH_DRYRUN:-0}
BENCH_GROUPS="ours fp8 actoff optoff largest torch"
usage() { sed -n '2,/^set -u/p' "$0" | sed -n '/^#   tests\/gpu\/run.sh/,/^#$/p' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
    --quick) QUICK=1 ;;
    --no-checks) CHECKS=0 ;;
    --dry-run) PREP=1 ;;
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
[ "$PREP" = 1 ] && [ "$DRY" = 1 ] && { echo "run.sh: --dry-run (the bundle and the build) and GPU_BENCH_DRYRUN=1 (the benchmarks' command lines) are two dry runs: ask for one" >&2; exit 2; }
CHECK_T=${GPU_CHECK_TIMEOUT:-120} E2E_T=${GPU_E2E_TIMEOUT:-180} RANKS_T=${GPU_RANKS_TIMEOUT:-240}
for v in GPU_CHECK_TIMEOUT GPU_E2E_TIMEOUT GPU_RANKS_TIMEOUT; do
    case ${!v-1} in ''|*[!0-9]*|0) echo "run.sh: $v='${!v}': expected whole seconds above 0" >&2; exit 2 ;; esac
done
for v in GPU_HOST_BYTES GPU_DEVICE_BYTES GPU_DISK_BYTES; do
    case ${!v-unset} in unset) ;; ''|*[!0-9]*) echo "run.sh: $v='${!v}': expected whole bytes, e.g. 137438953472" >&2; exit 2 ;; esac
done
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
# the Makefile build (BUILD, relative to the tree or absolute) and the bundle
MK_BUILD=${BUILD:-build}
case $MK_BUILD in /*) ;; *) MK_BUILD=$ROOT/$MK_BUILD ;; esac
BUNDLE=${GPU_BUNDLE:-.deb}
case $BUNDLE in /*) ;; *) BUNDLE=$ROOT/$BUNDLE ;; esac
B=${GPU_BUILD:-build/gpu}
LOG=$B/log
RES=$B/results.jsonl
SUM=$B/checks.txt
rm -rf "$LOG" "$B/obj" "$B/bin"
mkdir -p "$LOG" "$B/obj" "$B/bin"
: > "$RES"; : > "$SUM"
# everything printed goes to run.log too (for $OUT); at exit, the last
# snapshot, then tee is let finish
exec > >(tee "$B/run.log") 2>&1
TEE_PID=$!
T0=$(date +%s)
say() { echo "[gpu +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# limit SECONDS: a step's time limit: SECONDS, or what is left of the budget when less (0: spent)
limit() { local l; l=$(left); [ "$l" -lt 0 ] && l=0; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
FAILED=0
PY=${PYTHON:-python3}

# ---- results in $OUT as they come ----
# snap: the table so far and one archive of the logs, rewritten in $OUT
# after every step (5 files; the device tool returns at most 8, 16 MiB
# each, and what is in $OUT when a call is killed)
snap() {
    [ -n "${OUT:-}" ] || return 0
    mkdir -p "$OUT" 2>/dev/null || return 0
    "$PY" tests/gpu/table.py "$SUM" "$RES" > "$B/table.txt" 2>&1
    local tgz=$B/gpu-run.tar.gz
    tar -czf "$tgz.tmp" -C "$B" log results.jsonl checks.txt table.txt run.log 2>/dev/null
    if [ "$(stat -c %s "$tgz.tmp" 2>/dev/null || echo 0)" -gt $((15 << 20)) ]; then
        # over the device tool's 16 MiB a file: the logs over 1 MiB stay out, named in BIG.txt
        find "$LOG" -type f -size +1M > "$B/BIG.txt"
        tar -czf "$tgz.tmp" -C "$B" --exclude-from=<(sed "s|^$B/||" "$B/BIG.txt") log results.jsonl checks.txt \
            table.txt run.log BIG.txt 2>/dev/null
    fi
    mv -f "$tgz.tmp" "$tgz" && cp "$tgz" "$RES" "$SUM" "$B/table.txt" "$B/run.log" "$OUT"/ 2>/dev/null
}
on_exit() {
    local rc=$?
    declare -F gb_ballastd_stop > /dev/null && gb_ballastd_stop   # a ballastd of an interrupted run goes too
    snap
    exec 1>&- 2>&-
    wait "$TEE_PID" 2> /dev/null
    exit $rc
}
trap on_exit EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# ---- the libraries our programs load, and nothing else's ----
# OUR_LD: the bundle's libraries, then the CUDA and NCCL directories (set
# below), then what the machine had; OURS prefixes every command that runs
# one of our programs. python3 and the system's tools never see it: the
# bundle's libraries are Debian's, and glibc and the gcc runtime are never
# in it (tests/gpu/bundle.sh).
OUR_LD=""
[ -d "$BUNDLE/lib" ] && OUR_LD=$BUNDLE/lib
ours_env() {   # set OURS from OUR_LD and NCCL_LIB
    local ld=$OUR_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    OURS=(env ${ld:+"LD_LIBRARY_PATH=$ld"} ${NCCL_LIB:+"BALLAST_NCCL_LIB=$NCCL_LIB"} ${CUDNN_LIB:+"BALLAST_CUDNN_LIB=$CUDNN_LIB"})
}
NCCL_LIB=""
CUDNN_LIB=${BALLAST_CUDNN_LIB:-}
ours_env

# ---- 1. toolchain ----
# find_toolchain: nvcc, the C compiler, libcudart, libcublasLt, libnccl,
# jansson; sets NVCC_BIN CUDA_ROOT CC_BIN CUDART CUBLASLT CUDA_LINK CUDA_INC
# NCCL_LIB JANSSON_CFLAGS JANSSON_LIB and extends OUR_LD. Exits 1 on what
# the build cannot do without.
find_toolchain() {
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
    # One library file by name: the toolkit first, then the pip wheels.
    PIP_LIBDIRS=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)):
        print(d)
EOF
)
    CUDART=$(find_lib libcudart) || { echo "run.sh: libcudart not found"; exit 1; }
    CUBLASLT=$(find_lib libcublasLt) || { echo "run.sh: libcublasLt not found"; exit 1; }
    say "libcudart $CUDART"
    say "libcublasLt $CUBLASLT"
    CUDA_LINK="$CUDART $CUBLASLT -Wl,-rpath,$(dirname "$CUDART") -Wl,-rpath,$(dirname "$CUBLASLT") -lstdc++"
    # libcublasLt needs libcublas' neighbours at run time in the wheel layout
    OUR_LD=$OUR_LD${OUR_LD:+:}$(dirname "$CUBLASLT"):$(dirname "$CUDART")
    # libnccl, loaded at run time by workers/comm/nccl.c (which is told
    # where through BALLAST_NCCL_LIB): the one asked for, PyTorch's
    # nvidia-nccl wheel, the toolkit's; without it check_nccl skips
    local why
    if [ -n "${BALLAST_NCCL_LIB:-}" ]; then NCCL_LIB=$BALLAST_NCCL_LIB why="BALLAST_NCCL_LIB"
    elif d=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null) &&
         [ -e "$d/libnccl.so.2" ]; then NCCL_LIB=$d/libnccl.so.2 why="python3's nvidia.nccl"
    elif NCCL_LIB=$(find_lib libnccl); then why="found by name"
    else NCCL_LIB=""; fi
    if [ -n "$NCCL_LIB" ]; then
        say "libnccl $NCCL_LIB ($why)"
        local nd=$NCCL_LIB
        [ -d "$nd" ] || nd=$(dirname "$nd")
        OUR_LD=$OUR_LD:$nd
    else
        say "libnccl not found (no BALLAST_NCCL_LIB, no nvidia.nccl for $PY, none in the toolkit): check_nccl will report SKIP"
    fi
    # libcudnn.so.9 (--attention cudnn|auto, opened at run time by
    # attention_cudnn.cu): BALLAST_CUDNN_LIB, else PyTorch's nvidia-cudnn
    # wheel; its headers for the build, from the toolkit or that wheel.
    # Without them the attention runs our kernels and says why.
    if [ -z "$CUDNN_LIB" ] && d=$("$PY" -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null) &&
       [ -e "$d/libcudnn.so.9" ]; then CUDNN_LIB=$d; fi
    say "libcudnn.so.9: ${CUDNN_LIB:-not found here (BALLAST_CUDNN_LIB, nvidia.cudnn for $PY); attention_cudnn.cu searches itself}"
    CUDNN_INC=""
    for d in "$CUDA_ROOT/include" "$CUDA_ROOT/targets/x86_64-linux/include" ${CUDNN_LIB:+"$(dirname "$CUDNN_LIB")/include"} \
             $(for l in $PIP_LIBDIRS; do echo "$(dirname "$l")/include"; done); do
        [ -f "$d/cudnn_backend.h" ] && { CUDNN_INC="-I$d"; break; }
    done
    [ -n "$CUDNN_INC" ] && say "cudnn_backend.h: ${CUDNN_INC#-I}" ||
        say "cudnn_backend.h not found: attention_cudnn.cu builds without cuDNN (--attention auto runs our kernels)"
    # cuda_runtime.h for the checks that call the runtime directly
    CUDA_INC=""
    for d in "$CUDA_ROOT/include" "$CUDA_ROOT/targets/x86_64-linux/include" $(for l in $PIP_LIBDIRS; do echo "$(dirname "$l")/include"; done); do
        [ -f "$d/cuda_runtime.h" ] && { CUDA_INC="-I$d"; break; }
    done
    # jansson (config.json and safetensors headers), static: the bundle's
    # (unpacked from its .debs when needed), else the system's
    JANSSON_CFLAGS="" JANSSON_LIB=""
    local jr=$BUNDLE/root
    if [ ! -f "$jr/usr/include/jansson.h" ] && command -v dpkg >/dev/null; then
        for d in "$BUNDLE"/pkgs/libjansson*.deb "$BUNDLE"/libjansson*.deb; do [ -f "$d" ] && mkdir -p "$jr" && dpkg -x "$d" "$jr"; done
    fi
    if [ -f "$jr/usr/include/jansson.h" ] && [ -f "$jr/usr/lib/x86_64-linux-gnu/libjansson.a" ]; then
        JANSSON_CFLAGS="-I$jr/usr/include"
        JANSSON_LIB="$jr/usr/lib/x86_64-linux-gnu/libjansson.a"
    elif [ -f /usr/include/jansson.h ] && [ -f /usr/lib/x86_64-linux-gnu/libjansson.a ]; then
        JANSSON_LIB="/usr/lib/x86_64-linux-gnu/libjansson.a"
    elif [ -f /usr/include/jansson.h ] && ls /usr/lib/x86_64-linux-gnu/libjansson.so* > /dev/null 2>&1; then
        JANSSON_LIB="-ljansson"
    fi
    [ -n "$JANSSON_LIB" ] && say "jansson: ${JANSSON_LIB}$(case $JANSSON_LIB in *.a) echo " (static)" ;; esac)" || say "jansson: MISSING (carry .deb/ from tests/gpu/bundle.sh, docs/cuda.md): end-to-end and benchmark of ours will be skipped"
    ours_env
}
find_lib() {   # find_lib libcublasLt -> path of libcublasLt.so[.N]
    local d f
    for d in "$CUDA_ROOT/lib64" "$CUDA_ROOT/targets/x86_64-linux/lib" "$CUDA_ROOT/lib" $PIP_LIBDIRS /usr/lib/x86_64-linux-gnu; do
        for f in "$d/$1.so" $(ls "$d/$1".so.* 2>/dev/null | sort -V | tail -1); do
            [ -f "$f" ] && { echo "$f"; return 0; }
        done
    done
    return 1
}

# ---- build ----
# build_programs CU_FROM: the CUDA backend, the CPU oracle, every check
# program and gpu_train into $B (only what the checks and gpu_train need:
# the ballast-worker benchmarks use the Makefile build). CU_FROM "" compiles
# the .cu files with nvcc; a directory takes NAME.o of each NAME.cu from
# there instead (the dry run: the Makefile build's objects, same sources).
# Returns 1 with a message when a step fails.
build_programs() {
    local cu_from=$1 ARCH cc h
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
    NVFLAGS="-O2 -std=c++17 $ARCH -Xcompiler -fPIC,-Wall -I. -Icommon $CUBLAS_INC ${CUDNN_INC:-}"
    CFLAGS="-std=c11 -D_GNU_SOURCE -DGPU_STANDALONE -O2 -g -Wall -Wno-unused-parameter -Wno-missing-field-initializers -fopenmp -pthread -I. -Icommon $CUDA_INC $JANSSON_CFLAGS"
    JOBS=$(nproc 2>/dev/null || echo 4)
    export NVCC_BIN NVFLAGS CC_BIN CFLAGS B
    if [ -z "$cu_from" ]; then
        say "building ($ARCH, $JOBS jobs)"
        ls workers/backend/cuda/*.cu | xargs -P "$JOBS" -I{} sh -c \
            'o=$B/obj/$(basename {} .cu).cu.o; $NVCC_BIN $NVFLAGS -c {} -o $o > $o.log 2>&1 || { cat $o.log; echo "BUILD FAILED: {}"; exit 255; }' \
            || { say "CUDA build failed"; return 1; }
    else
        # the same sources compiled by make: nvcc is only asked whether it takes these flags
        local cu o stale=""
        for cu in workers/backend/cuda/*.cu; do
            o=$cu_from/$(basename "$cu" .cu).o
            [ -f "$o" ] || { say "dry run: no $o (make with nvcc builds it)"; return 2; }
            [ "$o" -nt "$cu" ] || stale="$stale $(basename "$cu")"
            ln -sf "$o" "$B/obj/$(basename "$cu" .cu).cu.o"
        done
        [ -n "$stale" ] && say "dry run: the Makefile's objects of$stale are older than their sources (run make): linked anyway"
        if ! "$NVCC_BIN" $NVFLAGS --dryrun -c workers/backend/cuda/adamw.cu -o "$B/obj/nvcc-dryrun.o" > "$LOG/nvcc-dryrun.log" 2>&1; then
            echo "PROBLEM: nvcc refuses run.sh's flags ($NVFLAGS): $(tail -2 "$LOG/nvcc-dryrun.log" | tr '\n' ' ')"
            return 1
        fi
        say "dry run: building with gcc ($JOBS jobs), the .cu objects from $cu_from (nvcc --dryrun accepts: $ARCH)"
    fi
    # the CPU backend opens OpenBLAS when the machine has it (the GPU machine
    # does not: its GEMMs run on the backend's own kernel), hence -ldl
    C_ORACLE="common/log.c common/errbuf.c common/clock.c workers/backend/cpu.c workers/backend/cpu_gemm.c workers/backend/cpu_attention.c workers/backend/cpu_ring.c"
    # model.c reaches tp.c (and tp.c the comm API) for tensor parallelism only:
    # one process links tp.c with tests/gpu/lib/no_comm.c in place of the collectives
    C_TRAIN="common/options.c workers/model/model.c workers/model/tp.c tests/gpu/lib/no_comm.c workers/model/optim.c workers/model/config.c workers/ckpt/safetensors.c workers/model/generate.c"
    # Gloo is not on the GPU machine: tests/gpu/lib/no_gloo.c stands in for it
    C_COMM="workers/comm/comm.c workers/comm/open.c workers/comm/shm.c workers/comm/nccl.c tests/gpu/lib/no_gloo.c common/shm.c"
    local CSRC="$C_ORACLE $C_COMM" f
    [ -n "$JANSSON_LIB" ] && CSRC="$CSRC $C_TRAIN"
    for f in $CSRC tests/gpu/*.c; do echo "$f"; done | { [ -n "$JANSSON_LIB" ] && cat || grep -v gpu_train; } | xargs -P "$JOBS" -I{} sh -c \
        'o=$B/obj/$(echo {} | tr / _).o; $CC_BIN $CFLAGS -c {} -o $o > $o.log 2>&1 || { cat $o.log; echo "BUILD FAILED: {}"; exit 255; }' \
        || { say "C build failed"; return 1; }
    local CUOBJ ORACLE_OBJ src n extra
    CUOBJ=$(ls $B/obj/*.cu.o)
    ORACLE_OBJ="$B/obj/common_log.c.o $B/obj/common_errbuf.c.o $B/obj/common_clock.c.o $B/obj/workers_backend_cpu.c.o $B/obj/workers_backend_cpu_gemm.c.o $B/obj/workers_backend_cpu_attention.c.o $B/obj/workers_backend_cpu_ring.c.o"
    obj() { for f in "$@"; do echo "$B/obj/$(echo $f | tr / _).o"; done; }
    for src in tests/gpu/check_*.c; do
        n=$(basename "$src" .c)
        case $n in
        check_nccl) extra=$(obj $C_COMM) ;;          # its rendezvous shims stand in for gRPC
        check_pool) extra=$(obj common/shm.c) ;;
        check_decode)                                # generation runs the model: gpu_train's sources
            if [ -z "$JANSSON_LIB" ]; then say "check_decode: not built (it needs the model's sources, which need jansson)"; continue; fi
            extra="$(obj $C_TRAIN) $JANSSON_LIB" ;;
        *) extra="" ;;
        esac
        $CC_BIN -fopenmp -pthread -o "$B/bin/$n" "$B/obj/tests_gpu_$n.c.o" $extra $ORACLE_OBJ $CUOBJ $CUDA_LINK -lm -ldl \
            || { say "link of $n failed"; return 1; }
    done
    if [ -n "$JANSSON_LIB" ]; then
        local TRAIN_OBJ
        TRAIN_OBJ=$(obj $C_TRAIN)
        $CC_BIN -fopenmp -pthread -o "$B/bin/gpu_train" "$B/obj/tests_gpu_gpu_train.c.o" $TRAIN_OBJ $ORACLE_OBJ $CUOBJ \
            $JANSSON_LIB $CUDA_LINK -lm -ldl || { say "link of gpu_train failed"; return 1; }
    fi
    say "built: $(ls $B/bin | tr '\n' ' ')"
}

# ---- the dry run of a GPU call (--dry-run) ----
if [ "$PREP" = 1 ]; then
    say "dry run of a GPU call: the bundle $BUNDLE, the build into $B, libraries and sizes"
    tests/gpu/bundle.sh --dir "$BUNDLE" --gather-only; rc=$?
    if [ $rc -eq 77 ]; then say "dry run: SKIP: the bundle cannot be gathered here (above)"; exit 77; fi
    [ $rc -ne 0 ] && { say "dry run: gathering the bundle failed"; exit 1; }
    OUR_LD=$BUNDLE/lib
    find_toolchain
    build_programs "$MK_BUILD/cuobj/workers/backend/cuda"; rc=$?
    if [ $rc -eq 2 ]; then
        say "dry run: run.sh's own programs not linked (no CUDA objects of the Makefile build); the carried ones are checked"
        BUILT=()
    elif [ $rc -ne 0 ]; then
        echo "PROBLEM: run.sh's build (as the GPU machine runs it) failed: see above"
        exit 1
    else
        BUILT=("$B"/bin/*)
    fi
    tests/gpu/bundle.sh --dir "$BUNDLE" --check-only "${BUILT[@]}"; rc=$?
    if [ $rc -eq 0 ]; then say "dry run: ok: a GPU call can carry what the bundle line above lists"
    else say "dry run: the problems above would break the GPU run"; fi
    exit $rc
fi

if [ "$DRY" = 0 ]; then   # ---- steps 1 to 3b need the GPU ----
find_toolchain
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 | sed 's/^/[gpu] /'
else
    say "nvidia-smi not found: no GPU driver here, every check will report SKIP"
fi
fi
# host memory (and GPU memory and disk) for the plans, as the machine has it
GPU_BENCH_WORK=${GPU_BENCH_WORK:-$(cd "$B" && pwd)/bench}
GB_LIBPATH=$OUR_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}   # our programs' LD_LIBRARY_PATH in bench_lib.sh
BUILD=$MK_BUILD source tests/gpu/bench_lib.sh
gb_capacity
say "benchmarks:${SEL% }; budget ${BUDGET}s$([ "$DRY" = 1 ] && echo '; DRY RUN on the CPU: no build, no checks')"
say "machine: GPU $([ "$GB_DEV_BYTES" -gt 0 ] && gb_human $GB_DEV_BYTES || echo none), host memory $(gb_human $GB_HOST_BYTES) ($GB_HOST_WHAT), disk free $(gb_human $GB_DISK_BYTES) under $GB_SPILL_ROOT"
if [ "$DRY" = 0 ]; then
if [ $CHECKS = 0 ] && ! want ours && ! want fp8; then
    say "build: skipped (no check and no gpu_train benchmark selected)"
else
    build_programs "" || exit 1
fi
snap

# run_tap FAMILY LOGNAME SECONDS SHOW CMD...: one TAP-printing check under
# `timeout` SECONDS, or what is left of the budget when less; skipped when
# not even a quarter of SECONDS is left. Its counts go into checks.txt;
# SHOW all prints its TAP lines, fail only the failing ones
run_tap() {
    local fam=$1 name=$2 nominal=$3 show=$4 t rc ok bad sk
    shift 4
    t=$(limit "$nominal")
    if [ "$t" -lt $(( nominal / 4 )) ] || [ "$t" -le 0 ]; then
        say "$name: skipped (time budget: $(left)s of ${BUDGET}s left, it needs up to ${nominal}s)"
        printf '%s %d %d %d %d\n' "$fam" 0 0 1 0 >> "$SUM"
        echo "{\"kind\":\"skip\",\"what\":\"$name\",\"why\":\"time budget\"}" >> "$RES"
        snap; return
    fi
    timeout "$t" "$@" > "$LOG/$name.tap" 2>&1
    rc=$?
    ok=$(grep -E '^ok ' "$LOG/$name.tap" | grep -vc '# SKIP')
    sk=$(grep -c '# SKIP' "$LOG/$name.tap")
    bad=$(grep -c '^not ok' "$LOG/$name.tap")
    [ $rc -ne 0 ] && [ "$bad" -eq 0 ] && bad=1
    [ "$bad" -gt 0 ] && FAILED=1
    printf '%s %d %d %d %d\n' "$fam" "$ok" "$bad" "$sk" "$rc" >> "$SUM"
    say "$name: $ok passed, $bad failed, $sk skipped (exit $rc$([ $rc -eq 124 ] && echo ": timed out after ${t}s"))"
    if [ "$show" = all ]; then grep -E '^(ok|not ok)|^# ' "$LOG/$name.tap" | sed 's/^/    /'
    else grep -E -A3 '^not ok' "$LOG/$name.tap" | head -20 | sed 's/^/    /'; fi
    snap
}

if [ $CHECKS = 0 ]; then
    say "checks, end to end and GPU ranks: skipped (--no-checks)"
else
# ---- 2. kernel checks ----
# check_pool with ballastd: the Makefile build of this tree (build/), when
# it was carried here and its libraries load; otherwise only the memfd one
POOL_MK=""
if [ -x "$MK_BUILD/tests/gpu/check_pool" ] && [ -x "$MK_BUILD/bin/ballastd" ] && \
   ! "${OURS[@]}" ldd "$MK_BUILD/tests/gpu/check_pool" "$MK_BUILD/bin/ballastd" 2>&1 | grep -q 'not found'; then
    POOL_MK="$MK_BUILD/tests/gpu/check_pool"
    ln -sf "$POOL_MK" "$B/bin/check_pool_ballastd"
    say "check_pool_ballastd: the Makefile build with ballastd ($POOL_MK)"
else
    say "check_pool_ballastd: skipped (no runnable $MK_BUILD/tests/gpu/check_pool and $MK_BUILD/bin/ballastd here: carry build/bin and build/tests/gpu/check_pool with the bundle, tests/gpu/bundle.sh); check_pool measures a sealed memfd instead"
    echo "{\"kind\":\"skip\",\"what\":\"check_pool_ballastd\",\"why\":\"no runnable Makefile build of ballastd here\"}" >> "$RES"
fi
for p in $B/bin/check_*; do
    n=$(basename "$p")
    args=()
    case $n in
    check_pool) args=(--json "$RES") ;;
    check_pool_ballastd) args=(--json "$RES" --ballastd "$MK_BUILD/bin/ballastd") ;;
    esac
    run_tap "${n#check_}" "$n" "$CHECK_T" fail "${OURS[@]}" "$p" "${args[@]}"
done

# ---- 3. end to end ----
if [ -x "$B/bin/gpu_train" ]; then
    say "end to end: demo model, 20 steps, CPU vs GPU"
    run_tap e2e e2e "$E2E_T" all "${OURS[@]}" "$B/bin/gpu_train" check --model demo --seq-len 128 --micro-batch 4 \
        --steps 20 --json "$RES" --dir "$B"
    say "end to end with activation checkpointing on the GPU"
    run_tap e2e_ckpt e2e_ckpt "$E2E_T" all "${OURS[@]}" "$B/bin/gpu_train" check --model demo --seq-len 128 \
        --micro-batch 4 --steps 20 --activation-checkpointing --dir "$B"
else
    printf '%s %d %d %d %d\n' "e2e" 0 0 1 0 >> "$SUM"
fi

# ---- 3b. GPU ranks: 4 ranks on one GPU vs one GPU process (tests/gpu/ranks.sh) ----
# needs build/bin/ballast-worker from `make` with nvcc (the whole worker);
# ranks.sh says SKIP when it is not there
say "GPU ranks: 4 ranks on one GPU with staged shm collectives, (S, T) in (4,1) (2,2) (1,4)"
run_tap ranks ranks "$RANKS_T" all env BALLAST_BIN="$MK_BUILD/bin" GPU_LD_PATH="$OUR_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    ${NCCL_LIB:+"BALLAST_NCCL_LIB=$NCCL_LIB"} tests/gpu/ranks.sh "$LOG"
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
        echo "{\"kind\":\"skip\",\"what\":\"$name\",\"why\":\"time budget\"}" >> "$RES"; snap; return
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
    snap
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
    if [ "$DRY" = 0 ]; then bench "$name" "$t" "${OURS[@]}" "$GPU_TRAIN" "$@"; return; fi
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
    "${OURS[@]}" "$GPU_TRAIN" "${a[@]}" > "$LOG/$name.log" 2>&1
    local rc=$?
    if [ $rc -eq 2 ] && grep -q 'no usable GPU' "$LOG/$name.log"; then
        say "$name: dry run: gpu_train accepted ${a[*]}"
        echo "{\"kind\":\"dryrun\",\"what\":\"$name\",\"ok\":true}" >> "$RES"
    else
        say "$name: dry run: gpu_train refused its flags (exit $rc): $(tail -1 "$LOG/$name.log")"
        echo "{\"kind\":\"dryrun\",\"what\":\"$name\",\"ok\":false}" >> "$RES"
    fi
}
torch_run() {   # torch_run NAME SECONDS torch_baseline.py-ARGS...: python3 with the machine's own libraries
    local name=$1 t=$2; shift 2
    [ "$DRY" = 1 ] && return   # the PyTorch baseline needs the GPU: one skip line below
    bench "$name" "$t" "$PY" tests/gpu/torch_baseline.py "$@"
}
ONE_B=(--model llama3.2-1b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 2)
SEVEN_B=(--model llama2-7b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 1 --activation-checkpointing)
# PyTorch's selective checkpointing (torch_baseline.py keeps the attention op's outputs)
TORCH_7B_SEL=(--model llama2-7b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 1 --activation-checkpointing selective)
# selective checkpointing where gpu_train takes it (its --help names the value)
SEVEN_B_SEL=()
if [ -x "$GPU_TRAIN" ] && "${OURS[@]}" "$GPU_TRAIN" --help 2>&1 | grep -- '--activation-checkpointing' | grep -q selective; then
    SEVEN_B_SEL=(--model llama2-7b --seq-len 4096 --micro-batch 1 --steps 3 --warmup 1 --activation-checkpointing selective)
fi
# ours runs twice: our kernels (--attention own, impl "ballast") and cuDNN's
# fused attention (--attention cudnn, impl "ballast-cudnn"; where cuDNN does
# not load or fails its self-check, gpu_train says why and exits 2, which is
# reported as a skip). Order: the 1B comparison, then 7B.
# 4. first the 1B comparison: ours against PyTorch
if want ours; then gtrain ours-1b 150 bench "${ONE_B[@]}" --attention own --json "$RES"
elif want fp8; then gtrain ours-1b 150 bench "${ONE_B[@]}" --attention own --no-profile --json "$RES"; fi
want ours && gtrain ours-1b-cudnn 150 bench "${ONE_B[@]}" --attention cudnn --json "$RES"
want torch && torch_run torch-1b 170 "${ONE_B[@]}" --json "$RES"
# 4a. then the rest of gpu_train's
if want fp8; then
    gtrain ours-1b-fp8 120 bench "${ONE_B[@]}" --precision fp8 --no-profile --json "$RES"
fi
if want ours; then gtrain ours-7b 180 bench "${SEVEN_B[@]}" --attention own --json "$RES"
elif want fp8; then gtrain ours-7b 180 bench "${SEVEN_B[@]}" --attention own --no-profile --json "$RES"; fi
want ours && gtrain ours-7b-cudnn 180 bench "${SEVEN_B[@]}" --attention cudnn --no-profile --json "$RES"
if want ours && [ ${#SEVEN_B_SEL[@]} -gt 0 ]; then
    gtrain ours-7b-sel 180 bench "${SEVEN_B_SEL[@]}" --attention own --no-profile --json "$RES"
    gtrain ours-7b-sel-cudnn 180 bench "${SEVEN_B_SEL[@]}" --attention cudnn --no-profile --json "$RES"
elif want ours; then
    say "ours-7b-sel: skipped (gpu_train does not take --activation-checkpointing selective)"
    echo '{"kind":"skip","what":"ours-7b-sel","why":"no --activation-checkpointing selective"}' >> "$RES"
fi
want fp8 && gtrain ours-7b-fp8 180 bench "${SEVEN_B[@]}" --precision fp8 --no-profile --json "$RES"

# ---- 4b. ballast-worker: offload and scale (tests/gpu/bench_lib.sh) ----
if want actoff; then
    # the goal: --activation-offload costs < 3% of the step on llama2-7b, seq 4096, checkpointing
    gb_worker_bench act-off-7b plain llama2-7b 150; snap
    gb_worker_bench act-on-7b actoff llama2-7b 150 --activation-offload; snap
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
        gb_worker_bench opt-off plain "$OPT_MODEL" 150; snap
        gb_worker_bench opt-on optoff "$OPT_MODEL" 200 --optimizer-offload host --optimizer-offload-durable no; snap
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
    snap
fi
if want torch; then
    if [ "$DRY" = 1 ]; then
        say "torch-1b, torch-7b, torch-7b-sel: skipped (dry run: the PyTorch baseline needs the GPU)"
        echo '{"kind":"skip","what":"torch","why":"dry run"}' >> "$RES"
    else
        torch_run torch-7b 170 "${SEVEN_B[@]}" --json "$RES"
        torch_run torch-7b-sel 170 "${TORCH_7B_SEL[@]}" --json "$RES"   # beside ours-7b-sel
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
"$PY" tests/gpu/table.py "$SUM" "$RES"
exit $FAILED
