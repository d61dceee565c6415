#!/usr/bin/env bash
# tests/reference/train_vs_torch.sh: ballast-worker against an independent
# float64 PyTorch Llama (llama_ref.py): loss, logits and every gradient of
# one step, and 20 AdamW steps with clipping, for a grouped-query config and
# an odd-sized tied config. Tolerance: relative error <= 1e-4.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
    t_skip "pytorch reference" "python3-torch or numpy missing (make deps installs them)"
    t_done; exit
fi
[ -x "$BIN/ballast-worker" ] || { t_fail "ballast-worker built" "missing $BIN/ballast-worker"; t_done; exit; }
tmp=$(t_tmpdir)
# llama_ref.py prints its own TAP lines; count them into this script's result.
out=$(/usr/bin/python3 "$ROOT/tests/reference/llama_ref.py" "$BIN/ballast-worker" "$tmp" 2>&1); rc=$?
while IFS= read -r line; do
    case "$line" in
    "ok - "*) t_ok "${line#ok - }" ;;
    "not ok - "*) t_fail "${line#not ok - }" "see above" ;;
    *) echo "# $line" ;;
    esac
done <<< "$out"
[ $rc -eq 0 ] || t_fail "llama_ref.py exit status" "exited $rc"
t_done
