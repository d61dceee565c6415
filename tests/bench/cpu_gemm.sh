#!/usr/bin/env bash
# cpu_gemm: the CPU backend's matmuls (OpenBLAS sgemm on fixed tiles, spread
# over the backend's OpenMP threads) against one OpenBLAS sgemm call threaded
# by OpenBLAS, on the GEMMs of the two train_vs_torch models, 1 and 2
# threads, alternated rounds, medians with min-max. ROUNDS=n (default 5).
set -eu
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
"${BUILD:-build}/tests/bench/bench_cpu_gemm" "${ROUNDS:-5}"
