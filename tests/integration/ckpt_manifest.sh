#!/usr/bin/env bash
# ckpt_manifest.sh: a checkpoint whose manifest lies is refused, by
# `ballast ckpt info` and by --resume alike, with a message naming what is
# wrong (docs/training.md, "Checkpoints"). A sharded run (world 2, S 2)
# writes step 2; each case below is a copy of it with one lie:
#   version 99; a step that disagrees with the optimizer's, the data
#   position's or the directory's; two equal-length part ranges of a tensor
#   swapped between the shards (which would permute its weights on
#   reshard); a part missing (a gap) or listed twice (an overlap); shard
#   file names with "..", an absolute path or a NUL; a shard file or
#   config.json that is a symlink out of the directory; a layout that
#   disagrees with the shard list, a shard entry that names another chunk,
#   a part with another TP split; a non-integer size; a duplicated key; the
#   two shard files swapped on disk.
# For every case `ballast ckpt info` exits 1 naming the problem and a
# one-process --resume (which reshards) exits 1 with the same message; the
# swap and the step lie are also resumed in the writing layout (each rank
# its own file). The intact copy passes both.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/fsdp.lib"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
B=$BIN/ballast
W=$BIN/ballast-worker
PY=/usr/bin/python3
D=$(t_tmpdir)
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }
SEED=${CKPT_MANIFEST_SEED:-$RANDOM}
echo "# seed $SEED"
fsdp_tiny "$D" "$SEED"
ARGS=(--model "$D/m.json" --init-seed "$SEED" --data "$D/c.bin" --seq-len 16 --threads 1 --rdzv-timeout 60s)
if ! timeout 120 "$B" train --nproc 2 "${ARGS[@]}" --micro-batch 2 --steps 2 --hybrid-shard-degree 2 --ckpt-dir "$D/ck" \
        --ckpt-every 2 > "$D/w.out" 2>&1 || [ ! -f "$D/ck/step-00000002/manifest.json" ]; then
    t_fail "world 2 (S 2) writes a checkpoint at step 2" "$(tail -3 "$D/w.out")"; t_done; exit 1
fi
mkdir -p "$D/outside"

# every case: DIR/step-00000002, a copy of the checkpoint with one lie
CASES=(
 version    "manifest version 99"                          'manifest version'
 step       "step 3 while the optimizer's step is 2"       'step 3, but optimizer.step says'
 optstep    "optimizer.step 7 while the step is 2"         'step 2, but optimizer.step says'
 dirstep    "step 9 everywhere in directory step-00000002" 'step 9, but the directory is step-00000002'
 swap       "two equal-length ranges of a tensor swapped"  '\(TP rank 0\): shard [01] holds .*out of shard order'
 gap        "a part missing"                               'a gap|are in no shard'
 overlap    "a part listed in both shards"                 'overlapping ranges'
 dotdot     "a shard file ../../../etc/passwd"             'shard 0 must be the file shard-00000-of-00002.safetensors'
 absolute   "a shard file /etc/hostname"                   'shard 1 must be the file shard-00001-of-00002.safetensors'
 nul        "a shard file name with a NUL"                 'NUL'
 symlink    "a shard file that is a symlink out"           'outside the checkpoint directory'
 cfglink    "config.json a symlink out"                    'outside the checkpoint directory'
 layout     "shard_degree 1 with 2 shard files"            'needs 1 shard files, the manifest lists 2'
 chunk      "shard entry 0 claiming chunk 1"               'shard 0 .* must be chunk 0'
 tpsplit    "a part with tp_size 2 in a T 1 layout"        'tensor-parallel split|TP rank'
 bytes      "bytes given as a string"                      'needs integer bytes and crc32'
 dupkey     "a duplicated key"                             'duplicate object key'
 swapfiles  "the two shard files swapped on disk"          'damaged|DAMAGED|another checkpoint'
)
$PY - "$D/ck/step-00000002" "$D" "${CASES[@]}" <<'PYEOF' || { t_fail "broken copies written" "python failed"; t_done; exit 1; }
import json, os, shutil, sys
src, d, cases = sys.argv[1], sys.argv[2], sys.argv[3::3]
for case in cases:
    dst = os.path.join(d, case, "step-00000002")
    shutil.copytree(src, dst)
    man = os.path.join(dst, "manifest.json")
    m = json.load(open(man))
    sh = m["shards"]
    text = None
    if case == "version": m["version"] = 99
    elif case == "step": m["step"] = 3
    elif case == "optstep": m["optimizer"]["step"] = 7
    elif case == "dirstep": m["step"] = m["optimizer"]["step"] = m["data"]["next_step"] = 9
    elif case == "swap":
        # a tensor with parts of the same length in both shards
        a = {t["name"]: t for t in sh[0]["tensors"]}
        pair = [(a[t["name"]], t) for t in sh[1]["tensors"] if t["name"] in a and
                a[t["name"]]["range"][1] - a[t["name"]]["range"][0] == t["range"][1] - t["range"][0]]
        assert pair, "no tensor with equal-length parts in both shards"
        p0, p1 = pair[0]
        p0["range"], p1["range"] = p1["range"], p0["range"]
    elif case == "gap": del sh[1]["tensors"][len(sh[1]["tensors"]) // 2]
    elif case == "overlap": sh[1]["tensors"].append(dict(sh[0]["tensors"][0]))
    elif case == "dotdot": sh[0]["file"] = "../../../etc/passwd"
    elif case == "absolute": sh[1]["file"] = "/etc/hostname"
    elif case == "nul": sh[0]["file"] = "shard-00000-of-00002.safetensors\u0000x"
    elif case == "symlink":
        f = os.path.join(dst, sh[0]["file"]); out = os.path.join(d, "outside", "shard0")
        shutil.move(f, out); os.symlink(out, f)
    elif case == "cfglink":
        f = os.path.join(dst, "config.json"); out = os.path.join(d, "outside", "config.json")
        shutil.move(f, out); os.symlink(out, f)
    elif case == "layout": m["layout"]["shard_degree"] = 1
    elif case == "chunk": sh[0]["shard"] = 1
    elif case == "tpsplit": sh[0]["tensors"][0]["tp_size"] = 2
    elif case == "bytes": sh[1]["bytes"] = str(sh[1]["bytes"])
    elif case == "dupkey": text = json.dumps(m)[:-1] + ', "step": 2}'
    elif case == "swapfiles":
        f0, f1 = (os.path.join(dst, s["file"]) for s in sh)
        os.rename(f0, f0 + ".x"); os.rename(f1, f0); os.rename(f0 + ".x", f1)
    open(man, "w").write(text if text else json.dumps(m, indent=2))
PYEOF

t_check "the intact checkpoint: ballast ckpt info verifies it" "$B" ckpt info "$D/ck/step-00000002"
# one step more than the checkpoint: a longer cosine schedule, allowed (the
# manifest checks are under test here, not the schedule guard)
resume1() { "$W" "${ARGS[@]}" --micro-batch 4 --steps 3 --allow-schedule-change --ckpt-dir "$1" --resume; }
if out=$(resume1 "$D/ck" 2>&1) && echo "$out" | grep -q "resumed from .*step-00000002 (step 2)"; then
    t_ok "the intact checkpoint: one process resumes it (resharded) and trains step 3"
else t_fail "one-process resume of the intact checkpoint" "$(echo "$out" | tail -3)"; fi
for ((i = 0; i < ${#CASES[@]}; i += 3)); do
    c=${CASES[i]} what=${CASES[i + 1]} pat=${CASES[i + 2]}
    t_expect_fail "ckpt info refuses $what" "$pat" "$B" ckpt info "$D/$c/step-00000002"
    t_expect_fail "--resume refuses $what" "$pat" resume1 "$D/$c"
done
for c in swap step; do
    t_expect_fail "--resume in the writing layout (world 2, S 2) refuses the $c case" \
        "$(for ((i = 0; i < ${#CASES[@]}; i += 3)); do [ "${CASES[i]}" = $c ] && echo "${CASES[i + 2]}"; done)" \
        timeout 120 "$B" train --nproc 2 "${ARGS[@]}" --micro-batch 2 --steps 3 --hybrid-shard-degree 2 \
        --ckpt-dir "$D/$c" --resume
done
t_done
