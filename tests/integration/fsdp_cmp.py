#!/usr/bin/env python3
"""fsdp_cmp.py: comparisons for fsdp_losses.sh (numpy only).

  losses REF.jsonl RUN.jsonl TOL      every step's loss: |run - ref| / |ref| <= TOL
  params REF.st RUN.st TOL            every tensor: ||run - ref|| / ||ref|| <= TOL
  batches REFDIR RUNDIR DP B T A STEPS [TP]
        rank r (data-parallel rank d = r // TP) reads rows d*B..d*B+B-1 of
        each micro-step of the reference's (micro-batch DP*B): the TP ranks
        of a group read the same rows, no two data-parallel ranks share one
  memory RUN.jsonl CONFIG.json S T     the layout record's state_bytes_per_rank
        is 16 bytes x sum over units of ceil(TP-local unit floats / S),
        counted here from the config, and S*T times it is within 10% of the
        whole model's (1/(S*T) up to padding and replicated norms)
Prints the largest difference; exits 1 on a failure."""
import json, os, struct, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import jsonlog  # tests/jsonlog.py: the reader of --log-json files


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32", v["dtype"]
        out[k] = np.frombuffer(data[a:b], dtype=np.float32).reshape(v["shape"])
    return out


def step_losses(path):
    """Losses of the step records of a --log-json file (not its settings record)."""
    return jsonlog.values(path, "loss")


def losses(ref, run, tol):
    r = step_losses(ref)
    x = step_losses(run)
    if len(r) != len(x) or not r:
        print(f"step counts differ: {len(r)} vs {len(x)}")
        return 1
    worst = max(abs(a - b) / abs(a) for a, b in zip(r, x))
    print(f"max relative loss difference {worst:.3g} over {len(r)} steps")
    return 0 if worst <= tol else 1


def params(ref, run, tol):
    r, x = read_st(ref), read_st(run)
    if set(r) != set(x):
        print("tensor names differ")
        return 1
    worst, name = 0.0, ""
    for k in r:
        a, b = r[k].astype(np.float64), x[k].astype(np.float64)
        if a.shape != b.shape:
            print(f"{k}: shapes differ")
            return 1
        d = np.linalg.norm(a - b) / np.linalg.norm(a)
        if d > worst:
            worst, name = d, k
    moved = max(np.linalg.norm(r[k]) for k in r)
    print(f"max relative parameter difference {worst:.3g} ({name}) over {len(r)} tensors")
    return 0 if worst <= tol and moved > 0 else 1


def batches(refdir, rundir, dp, B, T, A, steps, tp=1):
    ref = np.fromfile(f"{refdir}/tokens-rank-00000.bin", dtype=np.int32).reshape(steps * A, dp * B, T)
    rows = []
    for r in range(dp * tp):
        d = r // tp
        x = np.fromfile(f"{rundir}/tokens-rank-{r:05d}.bin", dtype=np.int32)
        if x.size != steps * A * B * T:
            print(f"rank {r}: {x.size} tokens, expected {steps * A * B * T}")
            return 1
        x = x.reshape(steps * A, B, T)
        if not np.array_equal(x, ref[:, d * B:(d + 1) * B, :]):
            print(f"rank {r} (data-parallel rank {d}): rows differ from the reference's rows {d * B}..{(d + 1) * B - 1}")
            return 1
        if r % tp == 0:
            rows += [bytes(row) for row in x.reshape(-1, T)]
    if len(set(rows)) != len(rows):
        print(f"{len(rows) - len(set(rows))} rows read by more than one data-parallel rank or twice")
        return 1
    print(f"{len(rows)} rows over {dp} data-parallel ranks x {tp} TP ranks: disjoint, and together the reference's batches")
    return 0


def memory(run, config, S, T):
    rec = jsonlog.first(run, "layout")
    if rec is None:
        print(f"{run} has no layout record")
        return 1
    c = json.load(open(config))
    D, L, H, F, V = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["intermediate_size"], c["vocab_size"]
    Hkv = c.get("num_key_value_heads", H)
    Dh = c.get("head_dim", D // H)
    tied = c.get("tie_word_embeddings", False)
    block = (H * Dh * D + 2 * Hkv * Dh * D + D * H * Dh + 3 * F * D) // T + 2 * D
    Vt = -(-V // T)
    rest = Vt * D * (1 if tied else 2) + D
    want = 16 * (L * -(-block // S) + -(-rest // S))
    got, whole = rec["state_bytes_per_rank"], rec["model_state_bytes"]
    ratio = got * S * T / whole
    print(f"S {S}, T {T}: {got} bytes per rank (expected {want}), x S*T = {ratio:.4f} of the whole model's {whole}")
    return 0 if got == want and 1.0 <= ratio <= 1.1 else 1


if __name__ == "__main__":
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "losses":
        sys.exit(losses(a[0], a[1], float(a[2])))
    if cmd == "params":
        sys.exit(params(a[0], a[1], float(a[2])))
    if cmd == "batches":
        sys.exit(batches(a[0], a[1], *map(int, a[2:])))
    if cmd == "memory":
        sys.exit(memory(a[0], a[1], int(a[2]), int(a[3])))
    sys.exit(f"unknown command {cmd}")
