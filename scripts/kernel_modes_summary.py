#!/usr/bin/env python3
"""One JSON object of every figure scripts/gpu_session.sh's `kernels` part measured (issue 50).

    scripts/kernel_modes_summary.py DIR

DIR holds bench_<shape>_<mode>.json (whose --profile rows of the attention ops are also reported
under "attention": cuDNN's in fast mode, the exact kernels' otherwise), torch_<shape>.json, train_<run>/metrics.jsonl (runs exact,
fast, fast_again) and verify_<plan>_<mode>.json. A file a step did not write is reported as null,
never guessed. The fast mode's bounds are what this measures: fast against exact is reported as
the largest relative difference of the loss and of the gradient norm over the steps; fast run to
run must repeat every bit (JSON numbers are printed with all the digits a double needs).
"""
import glob
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def metrics(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return None


def attention_ops(bench):
    """The attention ops' rows of a bench --profile (per step: calls, seconds, FLOP/s), or null."""
    try:
        rows = bench["profile"]["by_op"]
    except (TypeError, KeyError):
        return None
    return {r["op"]: {k: r.get(k) for k in ("calls_per_step", "seconds_per_step", "share_of_step", "flops_per_s")}
            for r in rows if isinstance(r, dict) and str(r.get("op", "")).startswith("attention")}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    d = sys.argv[1]
    out = {"bench": {}, "attention": {}, "torch_eager": {}, "train_124m": {}, "verify": {}}
    for shape in ("124m", "1.5b"):
        for mode in ("exact", "fast"):
            b = load(os.path.join(d, f"bench_{shape}_{mode}.json"))
            out["bench"][f"{shape}_{mode}"] = None if b is None else {
                k: b.get(k) for k in ("kernels", "tokens_per_s", "mfu", "peak_gemm_flops_per_s", "peak_memory", "gemm",
                                      "profile")}
            out["attention"][f"{shape}_{mode}"] = attention_ops(b)
        t = load(os.path.join(d, f"torch_{shape}.json"))
        out["torch_eager"][shape] = t
    runs = {r: metrics(os.path.join(d, f"train_{r}", "metrics.jsonl")) for r in ("exact", "fast", "fast_again")}
    out["train_124m"]["runs"] = runs
    if all(runs[r] for r in runs) and len({len(runs[r]) for r in runs}) == 1:
        steps = zip(runs["exact"], runs["fast"], runs["fast_again"])
        worst = {"loss": 0.0, "grad_norm": 0.0}
        repeat = True
        for e, f, g in steps:
            for key in worst:
                worst[key] = max(worst[key], rel(f[key], e[key]))
                repeat = repeat and f[key] == g[key]
        out["train_124m"]["fast_vs_exact_max_relative"] = worst
        out["train_124m"]["fast_repeats_bit_for_bit"] = repeat
    for path in sorted(glob.glob(os.path.join(d, "verify_*.json"))):
        out["verify"][os.path.basename(path)[len("verify_"):-len(".json")]] = load(path)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
