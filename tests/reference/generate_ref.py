#!/usr/bin/python3
"""generate_ref.py: `ballast generate` and `ballast eval` against the
independent float64 PyTorch Llama of llama_ref.py.

For three random small models (grouped-query and untied; Llama 3.2-like:
tied with rope_scaling llama3; linear rope_scaling) written as Hugging Face
directories with float32 weights:
  1. greedy continuations of a random prompt (--prompt-ids): ours, with its
     KV cache, against argmax of the full PyTorch forward over the growing
     sequence, token for token (the smallest gap between the two largest
     reference logits is printed: a gap under fp32 rounding would make a
     mismatch a tie, not a bug);
  2. sampling: the same seed gives the same tokens, --top-k 1 gives the
     greedy tokens;
and for one of them a short training run with --val-data and a checkpoint:
  3. `ballast eval --from CKPT` equals a PyTorch evaluation of the exported
     weights on the same windows to 1e-5 relative, and the training log's
     last val_loss equals it too;
  4. `ballast generate --from CKPT` (a checkpoint, not a model directory)
     equals the PyTorch greedy continuation;
  5. with a byte-level BPE tokenizer.json written here (the 256 GPT-2 byte
     symbols, no merges, one special end token): --prompt TEXT streams the
     bytes of PyTorch's greedy continuation of the prompt's UTF-8 bytes,
     stopping at the end token; `ballast ckpt export --tokenizer` copies the
     tokenizer files and names its end token in config.json.

Usage: generate_ref.py BIN_DIR TMPDIR    (prints TAP lines)
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as R  # noqa: E402

torch.set_default_dtype(torch.float64)
EVAL_TOL = 1e-5

MODELS = [
    ("gqa", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=96, vocab_size=96, max_position_embeddings=128, rms_norm_eps=1e-5,
                 rope_theta=10000.0, tie_word_embeddings=False)),
    ("llama3.2", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                      intermediate_size=128, vocab_size=160, max_position_embeddings=2048, rms_norm_eps=1e-5,
                      rope_theta=500000.0, tie_word_embeddings=True,
                      rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=16))),
    ("linear", dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1, head_dim=16,
                    intermediate_size=80, vocab_size=112, max_position_embeddings=256, rms_norm_eps=1e-6,
                    rope_theta=10000.0, tie_word_embeddings=False,
                    rope_scaling=dict(type="linear", factor=4.0))),
]
NEW = 24


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, (r.stderr or r.stdout)[-1500:]))
    return r.stdout


def random_weights(cfg, rng):
    W = {}
    for n, s in R.param_shapes(cfg).items():
        if len(s) == 1:
            W[n] = (1.0 + 0.1 * rng.standard_normal(s)).astype(np.float32)
        else:
            # larger than an initialisation, so that the logits are well apart
            W[n] = (0.15 * rng.standard_normal(s)).astype(np.float32)
    return W


def greedy_ref(P, cfg, prompt, n):
    """argmax continuation by the full forward over the growing sequence;
    also the smallest top-2 logit gap seen"""
    seq, gap = list(prompt), float("inf")
    with torch.no_grad():
        for _ in range(n):
            logits = R.forward(P, cfg, torch.tensor([seq]))[0, -1]
            top = torch.topk(logits, 2).values
            gap = min(gap, float(top[0] - top[1]))
            seq.append(int(torch.argmax(logits)))
    return seq[len(prompt):], gap


def ids_of(out):
    return [int(x) for x in out.split()]


def main():
    bindir, tmp = sys.argv[1], sys.argv[2]
    ballast, worker = os.path.join(bindir, "ballast"), os.path.join(bindir, "ballast-worker")
    env_threads = ["--threads", "1"]
    for i, (name, cfg) in enumerate(MODELS):
        try:
            rng = np.random.default_rng(300 + i)
            d = os.path.join(tmp, name)
            os.makedirs(d, exist_ok=True)
            W = random_weights(cfg, rng)
            R.write_hf(d, cfg, W, "F32", 1)
            P = {k: torch.tensor(w.astype(np.float64)) for k, w in W.items()}
            prompt = [int(x) for x in rng.integers(0, cfg["vocab_size"], size=int(rng.integers(5, 10)))]
            pids = ",".join(map(str, prompt))
            gen = [ballast, "generate", "--from", d, "--prompt-ids", pids, "--max-new-tokens", str(NEW), "--ids"] + env_threads
            ours = ids_of(run(gen))
            ref, gap = greedy_ref(P, cfg, prompt, NEW)
            first = next((k for k, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
            R.tap(ours == ref, "%s: greedy, %d-token prompt, %d new tokens equal PyTorch's token for token "
                  "(smallest top-2 logit gap %.3g)" % (name, len(prompt), NEW, gap),
                  "ours %s vs torch %s (first difference at %s)" % (ours, ref, first))
            samp = gen + ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", "7"]
            a, b = ids_of(run(samp)), ids_of(run(samp))
            c = ids_of(run(gen[:-2] + ["--temperature", "0.9", "--seed", "8"] + env_threads))
            R.tap(a == b and len(a) == NEW and a != ref and c != a,
                  "%s: sampling with seed 7 is reproducible and differs from greedy and from seed 8" % name,
                  "seed 7 %s / %s, seed 8 %s, greedy %s" % (a, b, c, ref))
            k1 = ids_of(run(gen + ["--temperature", "1.5", "--top-k", "1", "--seed", "3"]))
            R.tap(k1 == ours, "%s: --top-k 1 equals greedy" % name, "top-k 1 %s vs greedy %s" % (k1, ours))
        except Exception as ex:  # a crash of either side is a failed check
            R.tap(False, "%s: generation run" % name, str(ex).replace("\n", " | ")[:1500])

    # 3, 4: a checkpoint of a short run with validation, then eval and generate from it
    name, cfg = MODELS[1]
    try:
        d = os.path.join(tmp, name)
        rng = np.random.default_rng(400)
        B, T, K, steps = 2, 16, 3, 4
        train, val = os.path.join(d, "train.bin"), os.path.join(d, "val.bin")
        R.write_shard(train, rng.integers(0, cfg["vocab_size"], size=steps * B * T + 1 + 5))
        vt = rng.integers(0, cfg["vocab_size"], size=K * B * T + 1 + 11).astype(np.int64)
        R.write_shard(val, vt)
        ck, log = os.path.join(d, "ckpt"), os.path.join(d, "log.jsonl")
        run([worker, "--init-from", d, "--data", train, "--data-order", "sequential", "--micro-batch", str(B),
             "--seq-len", str(T), "--steps", str(steps), "--lr", "3e-3", "--val-data", val, "--eval-every", "2",
             "--eval-batches", str(K), "--ckpt-dir", ck, "--log-json", log] + env_threads)
        out = json.loads(run([ballast, "eval", "--from", ck, "--data", val, "--seq-len", str(T), "--micro-batch",
                              str(B), "--batches", str(K), "--json"] + env_threads))
        hf = os.path.join(d, "export")
        run([ballast, "ckpt", "export", "--from", ck, "--out", hf])
        P = {k: torch.tensor(v) for k, v in R.st_read(os.path.join(hf, "model.safetensors")).items()}
        with open(os.path.join(hf, "config.json")) as f:
            ecfg = json.load(f)
        tot = 0.0
        with torch.no_grad():
            for j in range(K):
                x, y = R.batch(vt, j, 0, 1, B, T)
                tot += float(torch.nn.functional.cross_entropy(R.forward(P, ecfg, x).reshape(B * T, -1),
                                                               y.reshape(-1), reduction="sum"))
        ref = tot / (K * B * T)
        e = abs(out["loss"] - ref) / abs(ref)
        R.tap(e <= EVAL_TOL and out["tokens"] == K * B * T,
              "ballast eval of a checkpoint: loss %.7f vs PyTorch %.7f on the exported weights (rel %.2e), "
              "perplexity %.3f" % (out["loss"], ref, e, out["perplexity"]), "rel %.3e, %s" % (e, out))
        with open(log) as f:
            recs = [r for r in (json.loads(line) for line in f if line.strip()) if "step" in r]
        vals = [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]
        e2 = abs(vals[-1][1] - out["loss"]) / abs(out["loss"]) if vals else float("inf")
        R.tap([s for s, _ in vals] == [2, 4] and e2 <= 1e-6,
              "training's --val-data: val_loss at steps %s, the last equal to ballast eval (rel %.1e)"
              % ([s for s, _ in vals], e2), "val records %s" % vals)
        prompt = [int(x) for x in rng.integers(0, cfg["vocab_size"], size=6)]
        ours = ids_of(run([ballast, "generate", "--from", ck, "--prompt-ids", ",".join(map(str, prompt)),
                           "--max-new-tokens", "16", "--ids"] + env_threads))
        refg, gap = greedy_ref(P, ecfg, prompt, 16)
        R.tap(ours == refg, "ballast generate --from a checkpoint equals PyTorch greedy on its export "
              "(smallest gap %.3g)" % gap, "ours %s vs torch %s" % (ours, refg))
    except Exception as ex:
        R.tap(False, "eval and generate from a checkpoint", str(ex).replace("\n", " | ")[:1500])
    try:
        text_checks(ballast, worker, tmp, env_threads)
    except Exception as ex:
        R.tap(False, "generation from text with a tokenizer", str(ex).replace("\n", " | ")[:1500])
    return 0 if R.N_FAIL == 0 and R.N_TESTS > 0 else 1


def byte_symbols():
    """GPT-2's printable stand-ins for the 256 bytes"""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    sym, extra = {}, 0
    for b in range(256):
        if b in keep:
            sym[b] = chr(b)
        else:
            sym[b] = chr(256 + extra)
            extra += 1
    return sym


def write_tokenizer(d, eos_id):
    sym = byte_symbols()
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": eos_id, "content": "<|end|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": {sym[b]: b for b in range(256)}, "merges": []}}
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|end|>", "add_bos_token": False, "add_eos_token": False}, f)


def text_checks(ballast, worker, tmp, env_threads):
    name, cfg = MODELS[0]
    cfg = dict(cfg, vocab_size=257)
    d = os.path.join(tmp, "text")
    tk = os.path.join(tmp, "tok")
    write_tokenizer(tk, 256)
    rng = np.random.default_rng(500)
    W = random_weights(cfg, rng)
    os.makedirs(d, exist_ok=True)
    R.write_hf(d, cfg, W, "F32", 1)
    P = {k: torch.tensor(w.astype(np.float64)) for k, w in W.items()}
    prompt = "h\u00e9llo, w\u00f6rld \u2014 "
    pids = list(prompt.encode("utf-8"))
    ref, _ = greedy_ref(P, cfg, pids, 40)
    if 256 in ref:
        ref = ref[:ref.index(256)]
    r = subprocess.run([ballast, "generate", "--from", d, "--tokenizer", tk, "--prompt", prompt, "--max-new-tokens", "40"]
                       + env_threads, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    want = bytes(ref) + b"\n"
    R.tap(r.returncode == 0 and r.stdout == want,
          "--prompt with a byte-level tokenizer: the streamed bytes are PyTorch's greedy continuation (%d bytes)"
          % len(ref), "exit %d, ours %r vs %r; %s" % (r.returncode, r.stdout[:80], want[:80], r.stderr[-300:]))
    out = os.path.join(tmp, "text-export")
    ck = os.path.join(tmp, "text-ckpt")
    shard = os.path.join(tmp, "text.bin")
    R.write_shard(shard, rng.integers(0, 256, size=4 * 16 + 1))
    run([worker, "--init-from", d, "--data", shard, "--micro-batch", "2", "--seq-len", "16", "--steps", "1",
         "--lr", "0", "--tokenizer", tk, "--ckpt-dir", ck] + env_threads)
    run([ballast, "ckpt", "export", "--from", ck, "--out", out])
    with open(os.path.join(out, "config.json")) as f:
        ec = json.load(f)
    same = all(open(os.path.join(tk, n), "rb").read() == open(os.path.join(out, n), "rb").read()
               for n in ("tokenizer.json", "tokenizer_config.json"))
    R.tap(same and ec.get("eos_token_id") == 256 and ec.get("bos_token_id") is None,
          "export of a run with --tokenizer: tokenizer.json and tokenizer_config.json beside the weights, "
          "eos_token_id 256", "copied %s, config %s" % (same, {k: ec.get(k) for k in ("bos_token_id", "eos_token_id")}))
    r = subprocess.run([ballast, "generate", "--from", out, "--prompt", prompt, "--max-new-tokens", "40"] + env_threads,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    R.tap(r.returncode == 0 and r.stdout == want, "the exported directory generates the same text with its own tokenizer",
          "exit %d, %r; %s" % (r.returncode, r.stdout[:80], r.stderr[-300:]))


if __name__ == "__main__":
    sys.exit(main())
