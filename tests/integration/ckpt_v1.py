#!/usr/bin/env python3
"""ckpt_v1.py: checkpoints in the form one-process runs wrote before the
single training loop (numpy only), for ckpt_compat.sh.

  write SRC DST   DST (a step directory) = the checkpoint SRC (a step
                  directory of layout (1, 1, 1)) as the earlier
                  one-process writer laid it out: one shard file whose
                  tensors have their full shapes, in the model's table order
                  (every weight, then every NAME.exp_avg, then every
                  NAME.exp_avg_sq), its metadata {format, step, rank}, and a
                  manifest whose one shard entry lists whole tensors (name,
                  shape, range [0, numel), decay) without TP fields
  check DIR       exits 1 unless DIR is in that form
  same A B        exits 1 unless two step directories hold the same
                  weights and moments, bit for bit, whatever their form

The bytes follow safetensors as workers/ckpt/safetensors.c writes it: an
8-byte little-endian header length, the compact JSON header (metadata first,
then the tensors in order) padded with spaces to a multiple of 8, the
data."""
import json, os, shutil, struct, sys, zlib
import numpy as np


def read_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    out = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32", (k, v["dtype"])
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(v["shape"])
    return meta, out


def write_st(path, meta, tensors):
    hdr, off = {"__metadata__": meta}, 0
    for name, a in tensors:
        hdr[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hb = json.dumps(hdr, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a, dtype=np.float32).tobytes())


def full_state(step_dir):
    """{name: full array} for NAME, NAME.exp_avg, NAME.exp_avg_sq of a checkpoint of any form whose
    parts are whole tensors (layout (1, 1, 1)); the manifest's tensor list in order."""
    man = json.load(open(os.path.join(step_dir, "manifest.json")))
    assert len(man["shards"]) == 1, "one shard file expected"
    sh = man["shards"][0]
    _, st = read_st(os.path.join(step_dir, sh["file"]))
    order, out = [], {}
    for t in sh["tensors"]:
        n = int(np.prod(t["shape"]))
        assert t["range"] == [0, n], (t["name"], t["range"])
        order.append(t)
        for suf in ("", ".exp_avg", ".exp_avg_sq"):
            out[t["name"] + suf] = st[t["name"] + suf].reshape(t["shape"])
    return man, order, out


def write(src, dst):
    man, order, state = full_state(src)
    lay = man["layout"]
    assert (lay["world"], lay["shard_degree"], lay["tensor_parallel_degree"]) == (1, 1, 1), lay
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))
    shard = "shard-00000-of-00001.safetensors"
    tensors = [(t["name"] + suf, state[t["name"] + suf]) for suf in ("", ".exp_avg", ".exp_avg_sq") for t in order]
    write_st(os.path.join(dst, shard), {"format": "ballast-checkpoint-shard", "step": str(man["step"]), "rank": "0"},
             tensors)
    raw = open(os.path.join(dst, shard), "rb").read()
    man["shards"] = [{"file": shard, "rank": 0, "bytes": len(raw), "crc32": zlib.crc32(raw) & 0xFFFFFFFF,
                      "contents": ["weights NAME (fp32)", "exp_avg NAME.exp_avg", "exp_avg_sq NAME.exp_avg_sq"],
                      "tensors": [{"name": t["name"], "shape": t["shape"], "range": [0, int(np.prod(t["shape"]))],
                                   "decay": t["decay"]} for t in order]}]
    json.dump(man, open(os.path.join(dst, "manifest.json"), "w"), indent=2)


def check(d):
    man = json.load(open(os.path.join(d, "manifest.json")))
    sh = man["shards"]
    assert len(sh) == 1 and set(sh[0]) == {"file", "rank", "bytes", "crc32", "contents", "tensors"}, sh[0].keys()
    for t in sh[0]["tensors"]:
        assert set(t) == {"name", "shape", "range", "decay"}, t
    meta, st = read_st(os.path.join(d, sh[0]["file"]))
    assert meta == {"format": "ballast-checkpoint-shard", "step": str(man["step"]), "rank": "0"}, meta
    assert any(a.ndim == 2 for a in st.values()), "no 2-D tensor: not the whole-tensor form"
    for t in sh[0]["tensors"]:
        assert list(st[t["name"]].shape) == t["shape"], t["name"]


def same(a, b):
    _, _, x = full_state(a)
    _, _, y = full_state(b)
    assert set(x) == set(y), sorted(set(x) ^ set(y))
    for k in x:
        assert x[k].shape == y[k].shape and x[k].tobytes() == y[k].tobytes(), k


if __name__ == "__main__":
    cmd = sys.argv[1]
    try:
        if cmd == "write":
            write(sys.argv[2], sys.argv[3])
        elif cmd == "check":
            check(sys.argv[2])
        elif cmd == "same":
            same(sys.argv[2], sys.argv[3])
        else:
            sys.exit("usage: ckpt_v1.py write SRC DST | check DIR | same A B")
    except AssertionError as e:
        print("ckpt_v1.py %s: %s" % (cmd, e))
        sys.exit(1)
