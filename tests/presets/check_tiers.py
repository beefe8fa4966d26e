#!/usr/bin/env python3
"""Checks the labels the test presets select by (CMakePresets.json, tests/common/tier.h).

  check_tiers.py <CMakePresets.json> <build dir> <test preset> [<test preset> ...]

Every test of the build must carry exactly one tier label (quick, sanitizer or full) beside its
area, and may carry both as area:tier (every GoogleTest test does). For each named preset, the
tests it would select from this build (its label filter, include less exclude, less
the areas its configure preset does not build) must still run each strategy, composition and
backend: a family below with no selected test fails the check, naming it, so marking its last
case `full` cannot leave a sanitizer run without it. The labels are the same in every build, so
the release build checks the sanitizer presets' selections too. Families this build has no test
of (a backend it lacks) are skipped.
"""
import json
import re
import subprocess
import sys

TIERS = {"quick", "sanitizer", "full"}

# name regex -> what it stands for. Each must match a test the preset runs.
FAMILIES = {
    r"^DataParallel/Equivalence\..*/DP_": "plain data parallelism",
    r"^DataParallel/Equivalence\..*/ZeRO1_": "ZeRO-1",
    r"^DataParallel/Equivalence\..*/ZeRO2_": "ZeRO-2",
    r"^DataParallel/Equivalence\..*/ZeRO3_dp": "ZeRO-3 (reshard after forward)",
    r"^DataParallel/Equivalence\..*/ZeRO3_keep": "ZeRO-3 keeping parameters",
    r"^DataParallel/Equivalence\..*/HSDP_": "HSDP",
    r"^Equivalence\.RingReductions": "ring reductions",
    r"^TensorParallel/TensorParallelEquivalence\.": "tensor parallelism",
    r"^TensorParallel/.*replicated_kv": "replicated key/value heads",
    r"^Composed/PipelineEquivalence\..*/gpipe_": "the GPipe schedule",
    r"^Composed/PipelineEquivalence\..*/interleaved_": "the interleaved schedule",
    r"^Composed/PipelineEquivalence\..*/.*zb_h1_": "the zero-bubble schedule",
    r"^ContextParallel/ContextParallelEquivalence\..*ring": "ring attention",
    r"^ContextParallelEquivalence\.Fp32": "all-gather attention",
    r"^FourD/FourDEquivalence\.": "4D parallelism",
    r"^Bf16": "bf16 mixed precision across ranks",
    r"^ExpertParallel\.Ep": "expert parallelism",
    r"^Algorithms/Collectives\..*/ordered$": "the virtual backend's ordered collectives",
    r"^Algorithms/Collectives\..*/ring$": "the virtual backend's ring collectives",
    r"^comm_collectives_mpi_np4$": "the MPI backend",
    r"^Rendezvous\.|^Store\.": "the rendezvous store",
    r"^Reshard\.": "checkpoints written by several ranks",
    r"^Cli\..*Parallel": "a parallel run through the command line",
}


def labels_of(test):
    for prop in test.get("properties", []):
        if prop["name"] == "LABELS":
            return prop["value"]
    return []


def main():
    presets_file, build, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    doc = json.load(open(presets_file, encoding="utf-8"))
    configure = {p["name"]: p for p in doc["configurePresets"]}
    presets = {p["name"]: p for p in doc["testPresets"]}
    listing = json.loads(subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], check=True,
                                        capture_output=True, text=True).stdout)
    tests = [(t["name"], labels_of(t)) for t in listing["tests"]]
    bad = []
    for name, labels in tests:
        tiers = [l for l in labels if l in TIERS]
        areas = [l for l in labels if l not in TIERS and ":" not in l]
        pairs = [l for l in labels if ":" in l]
        if len(tiers) != 1 or len(areas) != 1 or pairs not in ([], [f"{areas[0]}:{tiers[0]}"]):
            bad.append(f"{name}: labels {labels}, want an area, one of {sorted(TIERS)}, and at most area:tier")
    for preset in names:
        if preset not in presets:
            bad.append(f"no test preset {preset!r} in {presets_file}")
            continue
        include = presets[preset].get("filter", {}).get("include", {}).get("label")
        exclude = presets[preset].get("filter", {}).get("exclude", {}).get("label")
        skipped = configure[presets[preset]["configurePreset"]].get("cacheVariables", {}).get(
            "LLAMA4D_SKIP_TEST_AREAS", "").split(";")
        built = [(n, l) for n, l in tests if not set(l) & set(skipped)]
        selected = [n for n, l in built if (include is None or any(re.search(include, x) for x in l))
                    and not (exclude and any(re.search(exclude, x) for x in l))]
        for regex, what in FAMILIES.items():
            if any(re.search(regex, n) for n, _ in built) and not any(re.search(regex, n) for n in selected):
                bad.append(f"preset {preset} runs no test of {what} ({regex})")
        print(f"preset {preset}: {len(selected)} of the {len(built)} tests it builds")
    for b in bad:
        print(b)
    print(f"{len(tests)} tests, {len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
