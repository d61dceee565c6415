#!/usr/bin/env bash
# tests/reference/generate_vs_torch.sh: `ballast generate` (greedy token for
# token, seeded sampling, top-k 1) and `ballast eval` (to 1e-5 relative)
# against the independent float64 PyTorch Llama, for untied, tied with
# llama3 rope scaling, and linear rope scaling models (generate_ref.py).
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
    t_skip "generation and evaluation against pytorch" "python3-torch or numpy missing (make deps installs them)"
    t_done; exit
fi
for b in ballast ballast-worker; do
    [ -x "$BIN/$b" ] || { t_fail "$b built" "missing $BIN/$b"; t_done; exit; }
done
tmp=$(t_tmpdir)
out=$(timeout 600 /usr/bin/python3 "$ROOT/tests/reference/generate_ref.py" "$BIN" "$tmp" 2>&1); rc=$?
while IFS= read -r line; do
    case "$line" in
    "ok - "*) t_ok "${line#ok - }" ;;
    "not ok - "*) t_fail "${line#not ok - }" "see above" ;;
    *) echo "# $line" ;;
    esac
done <<< "$out"
[ $rc -eq 0 ] || t_fail "generate_ref.py exit status" "exited $rc"
t_done
