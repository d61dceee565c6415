#!/usr/bin/env bash
# cpu_gemm: the CPU backend's matmuls (OpenBLAS sgemm on fixed tiles, spread
# over the backend's OpenMP threads) against one OpenBLAS sgemm call threaded
# by OpenBLAS, on the GEMMs of the two train_vs_torch models, 1 and 2
# threads, alternated rounds, medians with min-max. ROUNDS=n (default 5).
#
# Both sides' idle threads sleep at once: the backend's OpenMP team with
# OMP_WAIT_POLICY=passive, OpenBLAS's own threads with
# OPENBLAS_THREAD_TIMEOUT=4 (2^4 cycles of polling; its default, 2^28,
# keeps them spinning for about 0.1 s after each call). The two sides take
# turns in one process, so a side whose threads still spin takes a core
# from the other: with OpenBLAS's default the backend's 2-thread figure
# came out 0.57-0.80 of OpenBLAS, with OMP_WAIT_POLICY=active 1.4-1.6;
# with both sleeping, 0.91 in repeated runs.
set -eu
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-4}
"${BUILD:-build}/tests/bench/bench_cpu_gemm" "${ROUNDS:-5}"
