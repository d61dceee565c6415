#!/usr/bin/env python3
"""fp8_emulate.py: the tolerance of tests/gpu/check_fp8.c, tried on the CPU.

Emulates E4M3 / E5M2 quantization (round to nearest even, subnormals,
saturation at the largest finite value) with per-tensor scales
FMAX / amax, and bf16 rounding, in numpy; runs the forward, dx and dw
products of check_fp8's shapes and magnitudes in FP8 and in bf16; applies
check_fp8's criteria (per element |fp8 - bf16| <= 6 sigma + rel |bf16|,
and L2 error <= 1.1 x the L2 of the sigmas). Exit 0 when the right formats
pass every criterion and a wrong one (an E4M3 operand quantized as E5M2)
fails the L2 criterion: the check is neither too tight for correct FP8 nor
blind to a format mistake. Prints one line per product."""
import sys

import numpy as np

E4M3 = (3, -6, 448.0)     # mantissa bits, smallest normal exponent, largest finite
E5M2 = (2, -14, 57344.0)
U = {E4M3: 2.0 ** -4, E5M2: 2.0 ** -3}    # relative rounding bound
SUB = {E4M3: 2.0 ** -10, E5M2: 2.0 ** -17}  # half the subnormal step (scaled domain)


def round_fmt(v, fmt):
    m, emin, fmax = fmt
    a = np.abs(v)
    e = np.maximum(np.floor(np.log2(np.where(a > 0, a, 1.0))), emin)
    step = 2.0 ** (e - m)
    return np.clip(np.round(v / step) * step, -fmax, fmax)  # np.round: half to even


def bf16(v):
    b = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def quant(x, fmt):
    s = fmt[2] / np.abs(x).max()
    return round_fmt(x * s, fmt) / s


def qvar(x, fmt):
    a = SUB[fmt] * np.abs(x).max() / fmt[2]
    return (x * x * U[fmt] ** 2 + a * a) / 3


def criteria(got, ref, sig2, rel):
    e = np.abs(got - ref)
    tol = 6 * np.sqrt(sig2) + rel * np.abs(ref) + 1e-30
    l2, l2e = np.sqrt((e ** 2).sum()), np.sqrt((sig2 + 2 * (rel / 2) ** 2 * ref ** 2 / 3).sum())
    return float(np.max(e / tol)), int(np.sum(e > tol)), float(l2 / l2e)


def products(x, w, g, fx, fw, fg):
    """(name, fp8 result, bf16 result, sigma^2, rel) for y, dx, dw."""
    xq, wq, gq = quant(x, fx), quant(w, fw), quant(g, fg)
    yield ("y", bf16(xq @ wq.T), bf16(x @ w.T),
           qvar(x, fx) @ (w ** 2).T + (x ** 2) @ qvar(w, fw).T, 2.0 ** -8)
    yield ("dx", bf16(gq @ wq), bf16(g @ w), qvar(g, fg) @ (w ** 2) + (g ** 2) @ qvar(w, fw), 2.0 ** -8)
    f32 = lambda a: a.astype(np.float32).astype(np.float64)
    yield ("dw", f32(gq.T @ xq), f32(g.T @ x), qvar(g, fg).T @ (x ** 2) + (g ** 2).T @ qvar(x, fx), 1e-6)


def main():
    rng = np.random.default_rng(7)
    ok = True
    for (N, I, O, mx, mw, mg) in [(256, 512, 384, 30, 0.02, 1e-4), (128, 1024, 768, 2, 0.05, 3e-3),
                                  (64, 2048, 128, 0.5, 1, 1e-6)]:
        x = bf16(rng.uniform(-mx, mx, (N, I)))
        w = bf16(rng.uniform(-mw, mw, (O, I)))
        g = bf16(rng.uniform(-mg, mg, (N, O)))
        for name, got, ref, sig2, rel in products(x, w, g, E4M3, E4M3, E5M2):
            worst, bad, l2 = criteria(got, ref, sig2, rel)
            good = bad == 0 and l2 <= 1.1
            ok &= good
            print(f"{'ok' if good else 'FAIL'} {N}x{I}x{O} {name}: worst |err|/tol {worst:.3f}, "
                  f"{bad} out of tolerance, L2 ratio {l2:.3f}")
        if N == 256:  # x quantized as E5M2 while the tolerance assumes E4M3
            x5 = quant(x, E5M2)
            got = bf16(x5 @ quant(w, E4M3).T)
            sig2 = qvar(x, E4M3) @ (w ** 2).T + (x ** 2) @ qvar(w, E4M3).T
            worst, bad, l2 = criteria(got, bf16(x @ w.T), sig2, 2.0 ** -8)
            caught = bad > 0 or l2 > 1.1
            ok &= caught
            print(f"{'ok' if caught else 'FAIL'} wrong format caught (x as e5m2): L2 ratio {l2:.3f}, {bad} out of tolerance")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
