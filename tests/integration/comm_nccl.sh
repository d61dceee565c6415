#!/usr/bin/env bash
# comm_nccl.sh: the NCCL backend. Its NCCL/CUDA declarations are checked
# against the real nccl.h and cuda_runtime.h when the CUDA toolkit is
# installed; its collectives run on GPUs when libnccl loads and a GPU is
# visible (skipped, saying why, otherwise).
source "$(dirname "$0")/../lib.sh"
cd "$ROOT"
CUDA_INC=""
for d in ${CUDA_HOME:+$CUDA_HOME/include} /usr/local/cuda/include /usr/include; do
    [ -f "$d/nccl.h" ] && [ -f "$d/cuda_runtime.h" ] && { CUDA_INC=$d; break; }
done
if [ -z "$CUDA_INC" ]; then
    t_skip "NCCL declarations match nccl.h" "no nccl.h and cuda_runtime.h found (CUDA toolkit with NCCL not installed)"
else
    t_check "NCCL declarations match $CUDA_INC/nccl.h" \
        gcc -std=c11 -D_GNU_SOURCE -DCOMM_NCCL_ABI_CHECK -I. -Icommon -I"$BUILD/gen" -I"$CUDA_INC" \
            $(pkg-config --cflags grpc libprotobuf-c) -Wall -Wextra -Werror -fsyntax-only workers/comm/nccl.c
fi
# Where the toolkit keeps libnccl outside the loader's path, point at it.
for d in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/lib; do
    [ -e "$d/libnccl.so.2" ] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
out=$("$BUILD/tests/integration/comm_nccl_run" 2>&1); rc=$?
if [ $rc -eq 77 ]; then t_skip "NCCL collectives on GPUs" "$(echo "$out" | sed -n 's/^SKIP //p' | head -1)"
elif [ $rc -eq 0 ]; then t_ok "NCCL collectives on GPUs: $(echo "$out" | tail -1)"
else t_fail "NCCL collectives on GPUs" "$(echo "$out" | tail -5)"; fi
t_done
