# comm_shm.sh: shared-memory all-reduce and all-gather bandwidth of 4 ranks
# next to memcpy bandwidth in the same run (tests/bench/comm_shm.c).
set -eu
"${BUILD:-build}/tests/bench/comm_shm" 4 16 1024
