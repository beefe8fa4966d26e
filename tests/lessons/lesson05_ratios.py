#!/usr/bin/env python3
"""Lesson 05's bubble against the ideal time, as printed, equals the README's formulas.

For each schedule drawn on uniform stages (F = I = W, each action 1/v of a stage for the
interleaved schedule) the ideal time is every micro-batch through every chunk of a rank,
m (F + B) of a whole stage, so the idle time over it is
  GPipe, 1F1B    (p-1)/m
  interleaved    (p-1)/(v m)
  ZB-H1          (p-1)(F+I-W) / (m (F+I+W)) = (p-1)/(3m)      (m >= p)
The program prints "relative to the ideal time m(F+B): X" per schedule and writes the same in
its JSON ("idle_over_ideal"); both must match to the 4 decimals printed.

  lesson05_ratios.py BIN [flags...]
"""
import json
import os
import re
import subprocess
import sys


def expected(schedule, p, m, v):
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / m
    if schedule == "interleaved":
        return (p - 1) / (v * m)
    return (p - 1) / (3 * m)


def main():
    binary, flags = sys.argv[1], sys.argv[2:]
    proc = subprocess.run([binary, "--steps", "1", "--json"] + flags, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        return 1
    j = json.loads(proc.stdout)
    pl = j["pipeline"]
    p, m = pl["pp"], pl["micro_batches"]
    v = 2 if "--pp-chunks" not in flags else int(flags[flags.index("--pp-chunks") + 1])
    # The drawings' lines, not their copies in the exercise report.
    drawings = proc.stderr.split("exercises: formula vs measured")[0]
    printed = [float(x) for x in re.findall(r"relative to the ideal time m\(F\+B\): (\d+\.\d+)", drawings)]
    # In the order the program draws them (a JSON object's keys come sorted).
    drawn = [(n, j["schedules_modelled"][n]) for n in ("gpipe", "1f1b", "interleaved", "zb-h1")
             if n in j["schedules_modelled"]]
    bad = []
    if len(printed) != len(drawn):
        bad.append(f"{len(printed)} printed ratios for {len(drawn)} schedules drawn")
    for i, (name, d) in enumerate(drawn):
        if name == "zb-h1" and m < p:
            continue
        want = expected(name, p, m, v)
        if i < len(printed) and f"{printed[i]:.4f}" != f"{want:.4f}":
            bad.append(f"{name}: printed {printed[i]:.4f}, the README's formula gives {want:.4f}")
        if abs(d.get("idle_over_ideal", float("nan")) - want) > 1e-12:
            bad.append(f"{name}: JSON idle_over_ideal {d.get('idle_over_ideal')}, the formula gives {want}")
    if bad:
        print("\n".join("FAILED: " + b for b in bad))
        return 1
    print(f"p = {p}, m = {m}, v = {v}: {len(drawn)} schedules' bubble over the ideal time on their formulas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
