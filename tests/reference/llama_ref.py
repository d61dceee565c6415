#!/usr/bin/python3
"""llama_ref.py: an independent PyTorch Llama (float64) that checks
ballast-worker's loss, logits, gradients and AdamW training curve.

For each test config it
  1. draws random weights and tokens (numpy, seeded), writes a Hugging Face
     directory (config.json + model.safetensors, written here by hand: the
     format is an 8-byte little-endian header length, a JSON header, raw
     data) and an llm.c token shard;
  2. runs ballast-worker --init-from that directory with --dump-grads and
     compares loss, logits and every parameter gradient;
  3. runs 20 AdamW steps with clipping and a warmup+cosine schedule in both
     and compares the loss curves.
Relative error of a tensor: ||ours - ref||_2 / ||ref||_2 (Frobenius norm over
the whole tensor); of a scalar: |ours - ref| / |ref|. Tolerance 1e-4.

Usage: llama_ref.py WORKER_BINARY TMPDIR    (prints TAP lines)
       llama_ref.py --bench CONFIG.json B T STEPS THREADS   (median training tokens/s, float32)
"""
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import torch

TOL = 1e-4
torch.set_default_dtype(torch.float64)

# ---- safetensors, by hand ----

DT = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "F16": np.float16}


def to_bf16_bits(a):
    """float32 -> bfloat16 bits, round to nearest even"""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_round(a):
    return (to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def st_write(path, tensors, dtype="F32"):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        a = np.ascontiguousarray(arr, dtype=np.float32)
        if dtype == "BF16":
            b = to_bf16_bits(a).tobytes()
        elif dtype == "F16":
            b = a.astype(np.float16).tobytes()
        else:
            b = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def st_read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        if info["dtype"] == "BF16":
            u = np.frombuffer(raw[base + s:base + e], dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw[base + s:base + e], dtype=DT[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).astype(np.float64)
    return out


# ---- the model, written from the Hugging Face definition ----

def rms_norm(x, w, eps):
    var = (x * x).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def inv_freq(cfg):
    """Frequencies of the rotary pairs: rope_theta^(-2i/Dh), then rope_scaling as
    transformers defines it. linear: all divided by factor. llama3: with
    wavelength w = 2 pi / f and C = original_max_position_embeddings, a pair whose
    w is longer than C / low_freq_factor is divided by factor, one shorter than
    C / high_freq_factor is kept, and in between it is interpolated between the
    two, with weight s = (C / w - low) / (high - low) on the kept frequency."""
    Dh, theta = cfg["head_dim"], cfg["rope_theta"]
    base = [theta ** (-(2.0 * i) / Dh) for i in range(Dh // 2)]
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    out = []
    for f in base:
        if kind == "linear":
            f = f / rs["factor"]
        elif kind == "llama3":
            C, lo, hi, fac = (rs["original_max_position_embeddings"], rs["low_freq_factor"], rs["high_freq_factor"],
                              rs["factor"])
            w = 2 * math.pi / f
            if w > C / lo:
                f = f / fac
            elif w >= C / hi:
                s = (C / w - lo) / (hi - lo)
                f = s * f + (1 - s) * f / fac
        out.append(f)
    return torch.tensor(out, dtype=torch.get_default_dtype())


def rope_cos_sin(T, cfg, pos0=0):
    f = torch.outer(torch.arange(pos0, pos0 + T, dtype=torch.get_default_dtype()), inv_freq(cfg))
    emb = torch.cat((f, f), dim=-1)
    return emb.cos(), emb.sin()


def forward(P, cfg, tokens):
    """tokens (B, T) long -> logits (B, T, V)"""
    B, T = tokens.shape
    D, H, Hkv, Dh = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    cos, sin = rope_cos_sin(T, cfg)
    x = P["model.embed_tokens.weight"][tokens]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(cfg["num_hidden_layers"]):
        p = lambda n: P["model.layers.%d.%s" % (l, n)]
        h = rms_norm(x, p("input_layernorm.weight"), eps)
        q = (h @ p("self_attn.q_proj.weight").T).view(B, T, H, Dh).transpose(1, 2)
        k = (h @ p("self_attn.k_proj.weight").T).view(B, T, Hkv, Dh).transpose(1, 2)
        v = (h @ p("self_attn.v_proj.weight").T).view(B, T, Hkv, Dh).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = H // Hkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(Dh) + mask
        a = torch.softmax(s, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, H * Dh)
        x = x + a @ p("self_attn.o_proj.weight").T
        h = rms_norm(x, p("post_attention_layernorm.weight"), eps)
        g = h @ p("mlp.gate_proj.weight").T
        u = h @ p("mlp.up_proj.weight").T
        x = x + (torch.nn.functional.silu(g) * u) @ p("mlp.down_proj.weight").T
    x = rms_norm(x, P["model.norm.weight"], eps)
    W = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    return x @ W.T


def param_shapes(cfg):
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    qd = cfg["num_attention_heads"] * cfg["head_dim"]
    kvd = cfg["num_key_value_heads"] * cfg["head_dim"]
    s = {"model.embed_tokens.weight": (V, D)}
    for l in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % l
        s.update({pre + "self_attn.q_proj.weight": (qd, D), pre + "self_attn.k_proj.weight": (kvd, D),
                  pre + "self_attn.v_proj.weight": (kvd, D), pre + "self_attn.o_proj.weight": (D, qd),
                  pre + "mlp.gate_proj.weight": (F, D), pre + "mlp.up_proj.weight": (F, D),
                  pre + "mlp.down_proj.weight": (D, F), pre + "input_layernorm.weight": (D,),
                  pre + "post_attention_layernorm.weight": (D,)})
    s["model.norm.weight"] = (D,)
    if not cfg["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, D)
    return s


# ---- data ----

def write_shard(path, toks):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.asarray(toks, dtype=np.uint16).tobytes())


def batch(toks, k, a, A, B, T):
    """sequential order: step k, micro-step a, one rank"""
    start = (k * A + a) * B * T
    x = np.stack([toks[start + b * T:start + b * T + T] for b in range(B)])
    y = np.stack([toks[start + b * T + 1:start + b * T + T + 1] for b in range(B)])
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


# ---- checks ----

N_TESTS = 0
N_FAIL = 0


def tap(ok, name, why=""):
    global N_TESTS, N_FAIL
    N_TESTS += 1
    if not ok:
        N_FAIL += 1
    print(("ok - " if ok else "not ok - ") + name + ("" if ok else "  # " + why))
    sys.stdout.flush()


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b.ravel())
    return np.linalg.norm((a - b).ravel()) / (nb if nb > 0 else 1.0)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stdout[-2000:]))
    return r.stdout


def write_hf(d, cfg, W, dtype, nfiles):
    """config.json plus one model.safetensors, or nfiles files and an index"""
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(cfg, model_type="llama", architectures=["LlamaForCausalLM"]), f)
    if nfiles == 1:
        st_write(os.path.join(d, "model.safetensors"), W, dtype)
        return
    names = list(W)
    wmap = {}
    for i in range(nfiles):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, nfiles)
        part = {n: W[n] for n in names[i::nfiles]}
        st_write(os.path.join(d, fn), part, dtype)
        wmap.update({n: fn for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f)


def check_config(worker, tmp, name, cfg, B, T, A, seed, dtype, nfiles):
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    shapes = param_shapes(cfg)
    W = {}
    for n, s in shapes.items():
        if len(s) == 1:
            W[n] = (1.0 + 0.1 * rng.standard_normal(s)).astype(np.float32)
        else:
            W[n] = (0.05 * rng.standard_normal(s)).astype(np.float32)
    # both sides then start from the same representable weights
    if dtype == "BF16":
        W = {n: bf16_round(w) for n, w in W.items()}
    elif dtype == "F16":
        W = {n: w.astype(np.float16).astype(np.float32) for n, w in W.items()}
    write_hf(d, cfg, W, dtype, nfiles)
    steps = 20
    toks = rng.integers(0, cfg["vocab_size"], size=steps * A * B * T + 1 + 7).astype(np.int64)
    shard = os.path.join(d, "tokens.bin")
    write_shard(shard, toks)

    common = [worker, "--init-from", d, "--data", shard, "--data-order", "sequential", "--micro-batch", str(B),
              "--seq-len", str(T), "--grad-accum", str(A), "--threads", "1"]

    # 1. one step: loss, logits, gradients
    dump = os.path.join(d, "dump.safetensors")
    run(common + ["--steps", "1", "--lr", "0", "--dump-grads", dump])
    ours = st_read(dump)
    P = {n: torch.tensor(w.astype(np.float64), requires_grad=True) for n, w in W.items()}
    total = 0.0
    logits0 = None
    for a in range(A):
        x, y = batch(toks, 0, a, A, B, T)
        logits = forward(P, cfg, x)
        if a == 0:
            logits0 = logits.detach().reshape(B * T, -1).numpy()
        loss = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), y.reshape(-1)) / A
        loss.backward()
        total += loss.item()
    e = abs(float(ours["loss"][0]) - total) / abs(total)
    tap(e <= TOL, "%s: loss %.6f vs torch %.6f (rel %.2e)" % (name, ours["loss"][0], total, e), "rel %.3e" % e)
    e = rel(ours["logits"], logits0)
    tap(e <= TOL, "%s: logits of micro-batch 0 (rel %.2e)" % (name, e), "rel %.3e" % e)
    worst, wname, bad = 0.0, "", []
    for n in shapes:
        if n not in ours:
            bad.append(n + " missing")
            continue
        e = rel(ours[n], P[n].grad.numpy())
        if e > worst:
            worst, wname = e, n
        if not e <= TOL:
            bad.append("%s rel %.3e" % (n, e))
    tap(not bad, "%s: all %d parameter gradients (worst rel %.2e: %s)" % (name, len(shapes), worst, wname),
        "; ".join(bad[:5]))

    # 2. twenty AdamW steps with clipping, warmup and cosine decay
    hp = dict(lr=1e-2, min_lr=1e-3, warmup=3, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1, clip=0.3)
    log = os.path.join(d, "log.jsonl")
    run(common + ["--steps", str(steps), "--lr", str(hp["lr"]), "--min-lr", str(hp["min_lr"]),
                  "--lr-schedule", "cosine", "--warmup-steps", str(hp["warmup"]), "--beta1", str(hp["beta1"]),
                  "--beta2", str(hp["beta2"]), "--adam-eps", str(hp["eps"]), "--weight-decay", str(hp["wd"]),
                  "--grad-clip", str(hp["clip"]), "--log-json", log])
    with open(log) as f:
        ours_curve = [r for r in (json.loads(line) for line in f if line.strip()) if "step" in r]  # not the settings record
    P = {n: torch.tensor(w.astype(np.float64), requires_grad=True) for n, w in W.items()}
    decay = [P[n] for n in shapes if len(shapes[n]) >= 2]
    nodecay = [P[n] for n in shapes if len(shapes[n]) < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["wd"]}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    ref_curve, ref_norm = [], []
    for k in range(steps):
        if k < hp["warmup"]:
            lr = hp["lr"] * (k + 1) / hp["warmup"]
        else:
            p = min(1.0, (k - hp["warmup"]) / max(1, steps - hp["warmup"]))
            lr = hp["min_lr"] + (hp["lr"] - hp["min_lr"]) * 0.5 * (1 + math.cos(math.pi * p))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        tot = 0.0
        for a in range(A):
            x, y = batch(toks, k, a, A, B, T)
            loss = torch.nn.functional.cross_entropy(forward(P, cfg, x).reshape(B * T, -1), y.reshape(-1)) / A
            loss.backward()
            tot += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(list(P.values()), hp["clip"])
        ref_norm.append(float(norm))
        opt.step()
        ref_curve.append(tot)
    if len(ours_curve) != steps:
        tap(False, "%s: 20-step loss curve" % name, "worker logged %d steps" % len(ours_curve))
        return
    errs = [abs(o["loss"] - r) / abs(r) for o, r in zip(ours_curve, ref_curve)]
    nerrs = [abs(o["grad_norm"] - r) / abs(r) for o, r in zip(ours_curve, ref_norm)]
    clipped = sum(1 for r in ref_norm if r > hp["clip"])
    tap(max(errs) <= TOL, "%s: 20 AdamW steps, loss %.4f -> %.4f, max rel diff %.2e (%d steps clipped)"
        % (name, ref_curve[0], ref_curve[-1], max(errs), clipped), "per-step rel %s" % ["%.1e" % x for x in errs])
    tap(max(nerrs) <= TOL, "%s: 20 steps of grad norm, max rel diff %.2e" % (name, max(nerrs)),
        "per-step rel %s" % ["%.1e" % x for x in nerrs])
    tap(clipped > 0 and ref_curve[-1] < ref_curve[0], "%s: clipping was active and the loss fell" % name,
        "clipped %d, loss %.4f -> %.4f" % (clipped, ref_curve[0], ref_curve[-1]))


CONFIGS = [
    # (name, stored dtype, safetensors files, config, B, T, grad-accum)
    # grouped-query heads (4 query heads over 2 key/value heads), untied output, bf16 weights
    ("gqa", "BF16", 1, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=96, vocab_size=128, max_position_embeddings=64, rms_norm_eps=1e-5,
                 rope_theta=10000.0, tie_word_embeddings=False), 2, 32, 2),
    # odd sizes: dim 72, seq 23, vocab 131, ffn 100, 3 heads of 24; tied output, other eps and theta;
    # f16 weights split over two files with an index
    ("odd", "F16", 2, dict(hidden_size=72, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3, head_dim=24,
                 intermediate_size=100, vocab_size=131, max_position_embeddings=64, rms_norm_eps=1e-6,
                 rope_theta=500000.0, tie_word_embeddings=True), 3, 23, 1),
    # Llama 3.2 in miniature: grouped-query heads (8 over 2), tied embeddings, rope_theta 5e5 and
    # rope_scaling llama3 with original_max_position_embeddings 64, so that at head_dim 16 the pairs
    # fall in all three bands (kept, interpolated, divided by factor 32) within 32 positions
    ("llama3.2", "BF16", 1, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128, vocab_size=160, max_position_embeddings=2048, rms_norm_eps=1e-5,
                 rope_theta=500000.0, tie_word_embeddings=True,
                 rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position_embeddings=64)), 2, 32, 1),
]


def bench(cfg_path, B, T, steps, threads):
    """Training tokens/s of this model in float32 with AdamW (for tests/bench)."""
    import time
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(threads)
    cfg = dict(json.load(open(cfg_path)))
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    cfg.setdefault("rms_norm_eps", 1e-6)
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("tie_word_embeddings", False)
    g = torch.Generator().manual_seed(0)
    P = {n: (torch.randn(s, generator=g) * 0.02 if len(s) == 2 else torch.ones(s)).requires_grad_()
         for n, s in param_shapes(cfg).items()}
    opt = torch.optim.AdamW(list(P.values()), lr=1e-4)
    rates = []
    for k in range(steps):
        x = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
        y = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(forward(P, cfg, x).reshape(B * T, -1), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        opt.step()
        rates.append(B * T / (time.perf_counter() - t0))
    rates = sorted(rates[1:] if len(rates) > 1 else rates)
    print("%.1f" % rates[len(rates) // 2])
    return 0


def main():
    if sys.argv[1] == "--bench":
        return bench(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    worker, tmp = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    for i, (name, dtype, nfiles, cfg, B, T, A) in enumerate(CONFIGS):
        try:
            check_config(worker, tmp, name, cfg, B, T, A, 100 + i, dtype, nfiles)
        except Exception as ex:  # a crash of either side is a failed check, not a silent pass
            tap(False, "%s: reference run" % name, str(ex).replace("\n", " | ")[:1500])
    return 0 if N_FAIL == 0 and N_TESTS > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
