#!/usr/bin/env python3
"""Peak resident memory of the whole process: `small` on 16 virtual GPUs with ZeRO-3 against
one device, same global batch. Each virtual GPU allocates only what it owns (its shards, the
units it has gathered, the activations of its own rows), so the process should need about
what one device needs, not 16 copies of the model. Measured by the kernel (wait4's ru_maxrss
of each run), not by the library's own accounting.

usage: process_rss.py LLAMA4D_BINARY [max_ratio]
"""
import json
import os
import subprocess
import sys
import tempfile


def peak_rss(cmd):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}")
    return usage.ru_maxrss * 1024, json.loads(out)  # Linux reports KiB


def main():
    binary = sys.argv[1]
    max_ratio = float(sys.argv[2]) if len(sys.argv) > 2 else 1.5
    with tempfile.TemporaryDirectory() as tmp:
        common = [binary, "train", "--preset", "small", "--steps", "2", "--batch-size", "16", "--seq-len", "256",
                  "--eval-every", "0", "--json"]
        one, _ = peak_rss(common + ["--out", os.path.join(tmp, "one")])
        many, j = peak_rss(common + ["--out", os.path.join(tmp, "zero3"), "--mesh", "dp=16", "--zero", "3"])
    tracked = sum(r["total"] for r in j["peak_memory_per_rank"])
    ratio = many / one
    print(json.dumps({"one_device_peak_rss": one, "zero3_dp16_peak_rss": many, "ratio": ratio,
                      "zero3_dp16_sum_of_rank_peaks": tracked, "max_ratio": max_ratio}))
    if ratio > max_ratio:
        sys.exit(f"16 virtual GPUs with ZeRO-3 peak at {ratio:.2f}x one device's resident memory (limit {max_ratio}x)")


if __name__ == "__main__":
    main()
