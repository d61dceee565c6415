#!/usr/bin/env python3
"""torch_baseline.py: the PyTorch baseline of the GPU benchmark.

The same Llama model as ballast's (Hugging Face LlamaForCausalLM's
architecture: RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU,
tied or untied head) trained in plain PyTorch the usual mixed-precision
way: fp32 parameters and AdamW state, bf16 autocast, SDPA attention
(PyTorch picks its flash kernel for causal bf16; GQA via enable_gqa), optional per-block activation checkpointing,
torch.compile when it works (falls back to eager and says so).

Checkpointing: `full` (the flag alone) recomputes each block from its input,
as ballast's full mode does. `selective` is PyTorch's selective activation
checkpointing (torch.utils.checkpoint with a context_fn from
create_selective_checkpoint_contexts, PyTorch 2.4 and later): the outputs of
the SDPA attention op (its output and log-sum-exp) are saved and everything
else in the block is recomputed, which is what ballast's selective mode
keeps.

Throughput is counted as ballast counts it (workers/model/config.c,
llama_flops_per_token): 6 x (matmul parameters + V x D) + 12 L H Dh T FLOPs
per token. Prints one line and, with --json FILE, appends one JSON line.

  python3 tests/gpu/torch_baseline.py --model llama3.2-1b --seq-len 4096
  python3 tests/gpu/torch_baseline.py --model llama2-7b --activation-checkpointing
  python3 tests/gpu/torch_baseline.py --model llama2-7b --activation-checkpointing selective
"""
import argparse
import functools
import json
import sys
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F

# name: (dim, layers, heads, kv_heads, head_dim, ffn, vocab, rms_eps, rope_theta, tied)
# the same numbers as workers/model/config.c's presets
PRESETS = {
    "llama2-7b": (4096, 32, 32, 32, 128, 11008, 32000, 1e-5, 10000.0, False),
    "llama3-8b": (4096, 32, 32, 8, 128, 14336, 128256, 1e-5, 500000.0, False),
    "llama3.2-1b": (2048, 16, 32, 8, 64, 8192, 128256, 1e-5, 500000.0, True),
    "llama3.2-3b": (3072, 28, 24, 8, 128, 8192, 128256, 1e-5, 500000.0, True),
    "demo": (384, 6, 6, 2, 64, 1024, 512, 1e-5, 10000.0, False),
}


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, H, Hkv, Dh, Fd, eps = c["dim"], c["heads"], c["kv_heads"], c["head_dim"], c["ffn"], c["eps"]
        self.H, self.Hkv, self.Dh = H, Hkv, Dh
        self.attn_norm = RMSNorm(D, eps)
        self.q = nn.Linear(D, H * Dh, bias=False)
        self.k = nn.Linear(D, Hkv * Dh, bias=False)
        self.v = nn.Linear(D, Hkv * Dh, bias=False)
        self.o = nn.Linear(H * Dh, D, bias=False)
        self.ffn_norm = RMSNorm(D, eps)
        self.gate = nn.Linear(D, Fd, bias=False)
        self.up = nn.Linear(D, Fd, bias=False)
        self.down = nn.Linear(Fd, D, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(B, T, self.H, self.Dh).transpose(1, 2)
        k = self.k(h).view(B, T, self.Hkv, self.Dh).transpose(1, 2)
        v = self.v(h).view(B, T, self.Hkv, self.Dh).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.H != self.Hkv)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, self.H * self.Dh))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


# The SDPA kernels whose outputs selective checkpointing saves; whichever of
# them this PyTorch has (the one SDPA picks is among them).
SDPA_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention")


def selective_context_fn():
    """context_fn for torch.utils.checkpoint that saves the attention op's
    outputs and recomputes the rest; None with the reason when this PyTorch
    has no selective checkpointing."""
    try:
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    except ImportError:
        return None, f"PyTorch {torch.__version__} has no selective activation checkpointing (2.4 or later has)"
    keep = {getattr(torch.ops.aten, n).default for n in SDPA_OPS if hasattr(torch.ops.aten, n)}
    if not keep:
        return None, f"PyTorch {torch.__version__} has none of the SDPA ops {', '.join(SDPA_OPS)}"

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy), ""


class Llama(nn.Module):
    def __init__(self, c, act_ckpt, context_fn=None):
        super().__init__()
        self.c = c
        self.act_ckpt = act_ckpt
        self.context_fn = context_fn
        self.embed = nn.Embedding(c["vocab"], c["dim"])
        self.blocks = nn.ModuleList([Block(c) for _ in range(c["layers"])])
        self.norm = RMSNorm(c["dim"], c["eps"])
        self.head = None if c["tied"] else nn.Linear(c["dim"], c["vocab"], bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def rope(self, T, device):
        Dh = self.c["head_dim"]
        inv = 1.0 / (self.c["theta"] ** (torch.arange(0, Dh, 2, device=device, dtype=torch.float64) / Dh))
        ang = torch.outer(torch.arange(T, device=device, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        return ang.cos().float(), ang.sin().float()

    def forward(self, tokens, targets, cos, sin):
        x = self.embed(tokens)
        for b in self.blocks:
            if self.act_ckpt != "none" and self.training:
                kw = {"context_fn": self.context_fn} if self.context_fn else {}
                x = torch.utils.checkpoint.checkpoint(b, x, cos, sin, use_reentrant=False, **kw)
            else:
                x = b(x, cos, sin)
        x = self.norm(x)
        w = self.embed.weight if self.head is None else self.head.weight
        logits = F.linear(x, w)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def flops_per_token(c, T):
    D, L, H, Hkv, Dh, Fd, V = c["dim"], c["layers"], c["heads"], c["kv_heads"], c["head_dim"], c["ffn"], c["vocab"]
    block = D * H * Dh + 2 * D * Hkv * Dh + H * Dh * D + 3 * D * Fd + 2 * D  # llama_block_params, norms included
    n = block * L + V * D
    return 6.0 * n + 12.0 * L * H * Dh * T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama3.2-1b", choices=sorted(PRESETS))
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation happens here)")
    ap.add_argument("--activation-checkpointing", nargs="?", const="full", default="none",
                    choices=("none", "full", "selective"),
                    help="full (the flag alone): recompute each block from its input; selective: keep the "
                         "attention op's outputs, recompute the rest (PyTorch 2.4+)")
    ap.add_argument("--no-compile", action="store_true", help="eager mode only")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json", help="append one JSON line of results to this file")
    a = ap.parse_args()

    context_fn = None
    if a.activation_checkpointing == "selective":
        context_fn, why = selective_context_fn()
        if context_fn is None:
            print(f"torch_baseline: --activation-checkpointing selective: {why}; use full or none", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("torch_baseline: no GPU visible to PyTorch", file=sys.stderr)
        return 2
    D, L, H, Hkv, Dh, Fd, V, eps, theta, tied = PRESETS[a.model]
    c = dict(dim=D, layers=L, heads=H, kv_heads=Hkv, head_dim=Dh, ffn=Fd, vocab=V, eps=eps, theta=theta, tied=tied)
    dev = torch.device("cuda")
    torch.manual_seed(1)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = Llama(c, a.activation_checkpointing, context_fn).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    B, T = a.micro_batch, a.seq_len
    cos, sin = model.rope(T, dev)
    # bf16 like the activations, so RoPE's products stay bf16 and SDPA gets
    # bf16 inputs (its flash kernel)
    cos, sin = cos.to(torch.bfloat16), sin.to(torch.bfloat16)

    def step(fn):
        tok = torch.randint(0, V, (B, T), device=dev)
        tgt = torch.randint(0, V, (B, T), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(tok, tgt, cos, sin)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    mode = "eager"
    fn = model
    if not a.no_compile:
        try:
            fn = torch.compile(model)
            t0 = time.perf_counter()
            step(fn)
            torch.cuda.synchronize()
            mode = "compiled"
            print(f"torch_baseline: torch.compile took {time.perf_counter() - t0:.1f} s (first step)", flush=True)
        except Exception as e:  # compile problems are reported, then eager runs
            print(f"torch_baseline: torch.compile failed ({type(e).__name__}: {str(e)[:200]}); running eager", flush=True)
            torch._dynamo.reset()
            opt.zero_grad(set_to_none=True)
            fn = model
    for _ in range(a.warmup):
        step(fn)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step(fn)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / a.steps
    tps = B * T / dt
    tflops = flops_per_token(c, T) * B * T / dt / 1e12
    mem = torch.cuda.max_memory_allocated() / 2**30
    print(f"torch_baseline: {a.model} ({nparams / 1e9:.2f}B params) B={B} T={T} {mode}"
          f"{'' if a.activation_checkpointing == 'none' else ' +act-ckpt ' + a.activation_checkpointing}: {dt:.3f} s/step, {tps:.0f} tokens/s, "
          f"{tflops:.1f} TFLOP/s, MFU {100 * tflops / a.peak_tflops:.1f}%, peak memory {mem:.1f} GiB, loss {loss.item():.3f}")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(dict(kind="bench", impl=f"torch-{mode}", model=a.model, seq=T, batch=B,
                                    act_ckpt=a.activation_checkpointing != "none",
                                    ckpt_mode=a.activation_checkpointing, s_per_step=round(dt, 4),
                                    tokens_per_s=round(tps, 1), tflops=round(tflops, 2),
                                    mfu=round(tflops / a.peak_tflops, 4), peak_gib=round(mem, 1))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
