#!/usr/bin/env bash
# safetensors_torch.sh: our safetensors bytes against PyTorch. Python parses
# the files by hand (no safetensors package here) and uses torch's own
# float32 -> bfloat16/float16 conversions as the oracle, both ways:
#   1. a file we write: header layout, offsets, and every stored element equal
#      to torch's rounding of the fp32 source (NaN only checked as NaN);
#   2. a file Python writes: what st_read_f32 returns equals torch's .float().
source "$(dirname "$0")/../lib.sh"
PY=/usr/bin/python3
TOOL=$ROOT/$BUILD/tests/integration/st_tool
if ! [ -x "$PY" ] || ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    t_skip "safetensors vs torch" "no /usr/bin/python3 with torch and numpy"; t_done; exit 0
fi
[ -x "$TOOL" ] || { t_fail "st_tool" "missing $TOOL; run make"; t_done; exit 1; }
D=$(t_tmpdir)

for seed in 1 2; do
    "$TOOL" write "$D/ours.safetensors" $seed || { t_fail "write (seed $seed)" "st_tool failed"; continue; }
    if out=$("$PY" - "$D/ours.safetensors" 2>&1 <<'PYEOF'
import json, struct, sys
import numpy as np, torch
path = sys.argv[1]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
assert n % 8 == 0, "header length %d not a multiple of 8" % n
text = raw[8:8 + n].decode("utf-8")
body = text.rstrip(" ")
assert body.startswith("{") and body.endswith("}") and len(text) - len(body) < 8, "header padding"
hdr = json.loads(text)
assert hdr.pop("__metadata__") == {"format": "pt"}
buf = raw[8 + n:]
src = np.fromfile(path + ".src", dtype="<f4")
names = ["a.f32", "b.bf16", "c.f16", "d.bf16", "e.f16"]
assert sorted(hdr) == sorted(names), hdr.keys()
tdt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
pos, cover, checked = 0, 0, 0
for name in names:
    e = hdr[name]
    b, en = e["data_offsets"]
    assert b == cover, "%s not back to back" % name
    cover = en
    cnt = int(np.prod(e["shape"])) if e["shape"] else 1
    x = torch.from_numpy(src[pos:pos + cnt].copy()).reshape(e["shape"])
    pos += cnt
    dt = tdt[e["dtype"]]
    got = torch.frombuffer(bytearray(buf[b:en]), dtype=dt).reshape(e["shape"])
    want = x.to(dt)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), name + ": NaN positions differ"
    isz = 4 if dt == torch.float32 else 2
    iv = torch.int32 if isz == 4 else torch.int16
    gb, wb = got[~nan].view(iv), want[~nan].view(iv)
    bad = (gb != wb).nonzero()
    assert len(bad) == 0, "%s: %d elements differ, first: src %r ours %r torch %r" % (
        name, len(bad), x[~nan][bad[0]].item(), got[~nan][bad[0]].item(), want[~nan][bad[0]].item())
    checked += cnt
assert cover == len(buf), "buffer not fully covered"
assert pos == len(src)
print("checked", checked, "elements")
PYEOF
); then t_ok "our file read by torch (seed $seed): $out"; else t_fail "our file read by torch (seed $seed)" "$out"; fi
done

# Python writes, we read.
if out=$("$PY" - "$D/theirs.safetensors" "$D/want.f32" 2>&1 <<'PYEOF'
import json, struct, sys
import numpy as np, torch
torch.manual_seed(3)
ts = {
    "model.embed_tokens.weight": (torch.randn(37, 12) * 3).to(torch.bfloat16),
    "model.layers.0.mlp.up_proj.weight": (torch.randn(5, 9) * 100).to(torch.float16),
    "model.norm.weight": torch.randn(12),
    "lm_head.weight": (torch.randn(37, 12) * 1e-6).to(torch.float16),
}
names = ["model.layers.0.mlp.up_proj.weight", "lm_head.weight", "model.norm.weight", "model.embed_tokens.weight"]
hdr, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
name_dt = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
for k in names:
    t = ts[k].contiguous()
    b = t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy().tobytes()
    hdr[k] = {"dtype": name_dt[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h)
    for b in blobs: f.write(b)
with open(sys.argv[2], "wb") as f:
    for k in sorted(names): f.write(ts[k].float().numpy().astype("<f4").tobytes())
PYEOF
); then
    if "$TOOL" read "$D/theirs.safetensors" "$D/got.f32" >/dev/null && cmp -s "$D/got.f32" "$D/want.f32"; then
        t_ok "torch-written file read by us, bit-exact"
    else
        t_fail "torch-written file read by us, bit-exact" "values differ or read failed"
    fi
else
    t_fail "write with torch" "$out"
fi
t_done
