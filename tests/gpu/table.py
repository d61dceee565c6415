"""tests/gpu/table.py: the closing table of tests/gpu/run.sh, from its checks.txt
(one "family passed failed skipped exit" line per check program) and
results.jsonl (one JSON record per result: e2e, bench, pool_bw,
worker_bench, ratio, largest, dryrun, skip). run.sh prints it at the end
and writes it into every snapshot it leaves in $OUT, so a run cut short
still has the table of what it measured.

    python3 tests/gpu/table.py CHECKS_TXT RESULTS_JSONL
"""
import json, sys
checks = [line.split() for line in open(sys.argv[1]) if line.strip()]
if checks:
    print("\n== checks (tests/gpu/check_*, gpu_train check) ==")
    print(f"{'family':<12} {'passed':>6} {'failed':>6} {'skipped':>7}")
for f in checks:
    print(f"{f[0]:<12} {f[1]:>6} {f[2]:>6} {f[3]:>7}")
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
for r in rows:
    if r.get("kind") == "e2e":
        print(f"e2e {r['model']}: {r['steps']} steps, worst relative loss difference {r['worst_rel']:.2e}, {'ok' if r['ok'] else 'FAILED'}")
b = [r for r in rows if r.get("kind") == "bench"]
if b:
    print("\n== benchmark: seq 4096, one GPU, MFU against 989 TFLOP/s (6 N + 12 L H Dh T FLOPs per token) ==")
    print(f"{'model':<12} {'impl':<15} {'ckpt':<9} {'s/step':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6}")
    for r in sorted(b, key=lambda r: (r["model"], r["impl"])):
        print(f"{r['model']:<12} {r['impl']:<15} {r.get('ckpt_mode', 'full' if r['act_ckpt'] else 'none'):<9} {r['s_per_step']:>8.3f} "
              f"{r['tokens_per_s']:>10.0f} {r['tflops']:>8.1f} {100 * r['mfu']:>5.1f}%")
p = [r for r in rows if r.get("kind") == "pool_bw"]
if p:
    print("\n== device<->pool copies (check_pool): GB/s, best of 5; target pool >= 0.95 x cudaHostAlloc ==")
    peak = max(r["link_peak_gbs"] for r in p)
    print(f"link peak: {peak:.1f} GB/s per direction" if peak > 0 else "link peak: unknown")
    print(f"{'source':<14} {'dir':<4} {'MiB':>6} {'GB/s':>8} {'ratio':>6} {'of peak':>8}")
    for r in p:
        of = f"{r['gbs'] / peak:.2f}" if peak > 0 else "-"
        ratio = f"{r['ratio']:.3f}" if r["source"].endswith("-pool") else "-"
        print(f"{r['source']:<14} {r['dir']:<4} {r['bytes'] >> 20:>6} {r['gbs']:>8.2f} {ratio:>6} {of:>8}")
for model in ("llama3.2-1b", "llama2-7b"):
    f8 = {r["impl"]: r for r in b if r["model"] == model and r["impl"] in ("ballast", "ballast-fp8")}
    if len(f8) == 2:
        print(f"\nFP8 vs bf16, {model} seq 4096: {f8['ballast-fp8']['tokens_per_s']:.0f} vs {f8['ballast']['tokens_per_s']:.0f} "
              f"tokens/s ({f8['ballast-fp8']['tokens_per_s'] / f8['ballast']['tokens_per_s']:.2f}x)")
w = [r for r in rows if r.get("kind") == "worker_bench"]
if w:
    dry = any(r["dry_run"] for r in w)
    print("\n== ballast-worker on one GPU, seq 4096, micro-batch 1, activation checkpointing; mean of the timed steps ==")
    if dry:
        print("   DRY RUN: each row ran the model in 'ran' on the CPU at seq 64; the figures say nothing about a GPU")
    print(f"{'run':<20} {'model':<12} {'ran':<12} {'ms/step':>9} {'tokens/s':>9} {'offl. wait':>10} {'MB/step out':>11} {'peak GPU GB':>11}")
    for r in w:
        wait = r.get("offload_wait_ms")
        peak = r.get("mem_gpu_peak_bytes")
        print(f"{r['name']:<20} {r['model']:<12} {r['ran_model']:<12} {r['ms_per_step']:>9.1f} {r['tokens_per_s']:>9.0f} "
              f"{'-' if wait is None else f'{wait:.1f} ms':>10} {(r.get('offload_to_host_bytes') or 0) / 1e6:>11.1f} "
              f"{'-' if peak is None else f'{peak / 1e9:.1f}':>11}")
for r in rows:
    if r.get("kind") == "ratio":
        goal = f", goal < {r['goal']:.2f}: {'met' if r['met'] else 'NOT met'}" if r.get("goal") and not r.get("dry_run") else ""
        print(f"{r['what'].replace('_', ' ')} on vs off ({r['model']}): {r['on_ms']:.1f} vs {r['off_ms']:.1f} ms/step, "
              f"ratio {r['ratio']:.3f}{goal}{' (dry run)' if r.get('dry_run') else ''}")
    if r.get("kind") == "largest":
        src = {x["name"]: x for x in w}.get(r["from"])
        if src:
            print(f"largest model trained with optimizer offload on one GPU: {r['model']}, {src['tokens_per_s']:.0f} tokens/s"
                  f"{' (dry run)' if src['dry_run'] else ''}")
    if r.get("kind") == "dryrun":
        print(f"dry run of {r['what']}: gpu_train {'accepted' if r['ok'] else 'REFUSED'} the flags")
for r in rows:
    if r.get("kind") == "skip":
        print(f"skipped: {r['what']} ({r['why']})")
