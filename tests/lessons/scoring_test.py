#!/usr/bin/env python3
"""Predict, then see, scored: every lesson's right answers score "exact", and wrong ones do not.

For one lesson program:
  1. a run with --json lists the questions it asks ("asked") and, per exercise, the answer a
     prediction is scored against ("scored_against": value, unit, whose);
  2. every question asked must have an exercise with an answer, and the question must name the
     rank and the unit that answer is of (a question about "rank 1" scored against rank 0, or one
     in microseconds scored in nanoseconds, fails here);
  3. a run with --predict giving every answer must score each one "exact";
  4. runs with every answer doubled, and in a wrong unit (bytes as KiB, microseconds as
     nanoseconds, ...), must score none of them "exact".

  scoring_test.py lesson05 BIN
"""
import argparse
import json
import os
import re
import subprocess
import sys

# The cheapest run of each lesson that asks all of its questions.
FLAGS = {
    "lesson01": ["--steps", "1"],
    "lesson02": ["--zero", "3", "--steps", "1"],
    "lesson03": ["--preset", "tiny", "--gemm-seconds", "0.05"],
    "lesson04": ["--steps", "1"],
    "lesson05": ["--steps", "1"],
    "lesson06": ["--steps", "1"],
    "lesson07": ["--steps", "1"],
    "lesson08": ["--steps", "1", "--gpu", "off"],
    "lesson09": ["--steps", "1"],
    "lesson10": [],
    "lesson11": [],
}

# A unit the question names, and the same number in a unit a learner might confuse it with.
WRONG_UNIT = {
    "bytes": ("bytes", lambda v: v / 1024),          # KiB
    "us": ("microseconds", lambda v: v * 1000),      # ns
    "ns": ("(ns)", lambda v: v / 1000),              # us
    "per mille": ("per mille", lambda v: v / 1000),  # a ratio
    "of the step": ("share", lambda v: v * 100),     # percent
    "x": ("times", lambda v: v * 100),               # percent
}
MIN_QUESTIONS = 3


def run(binary, flags, predictions=None):
    argv = [binary] + flags + ["--json"]
    if predictions:
        argv += ["--predict"] + [f"{k}={v!r}" for k, v in predictions.items()]
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit code {p.returncode}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


def check_questions(j, bad):
    """The answers of the questions asked, {id: answer}, after checking each names its rank and unit."""
    exercises = {e["id"]: e for e in j["exercises"]}
    answers = {}
    if len(j["asked"]) < MIN_QUESTIONS:
        bad.append(f"asks {len(j['asked'])} questions, fewer than {MIN_QUESTIONS}")
    for q in j["asked"]:
        qid, text = q["id"], q["question"]
        e = exercises.get(qid)
        if e is None or "scored_against" not in e:
            bad.append(f"{qid}: asked ('{text}') but no exercise scores it")
            continue
        a = e["scored_against"]
        rank = re.fullmatch(r"rank (\d+)", a["of"])
        if rank and not re.search(rf"\brank {rank.group(1)}\b", text):
            bad.append(f"{qid}: scored against {a['of']}, but the question does not name it: '{text}'")
        if a["unit"] in WRONG_UNIT and WRONG_UNIT[a["unit"]][0] not in text:
            bad.append(f"{qid}: scored in {a['unit']}, but the question does not say '{WRONG_UNIT[a['unit']][0]}'")
        answers[qid] = a
    return answers


def unit_of(answer, question):
    """The (word, wrong-unit planting) of the unit an answer is in: its own, else the one its question names."""
    if answer["unit"] in WRONG_UNIT:
        return WRONG_UNIT[answer["unit"]]
    for word, plant in WRONG_UNIT.values():
        if word in question:
            return word, plant
    return None


def verdicts(j):
    return {e["id"]: e.get("verdict") for e in j["exercises"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lesson", choices=sorted(FLAGS))
    ap.add_argument("binary")
    a = ap.parse_args()
    flags, bad = FLAGS[a.lesson], []

    first = run(a.binary, flags)
    answers = check_questions(first, bad)
    questions = {q["id"]: q["question"] for q in first["asked"]}
    right = {k: v["value"] for k, v in answers.items()}
    for qid, verdict in verdicts(run(a.binary, flags, right)).items():
        if qid in right and verdict != "exact":
            bad.append(f"{qid}: the program's own answer {right[qid]!r} scored '{verdict}', not 'exact'")

    doubled = {k: 2 * v for k, v in right.items() if v != 0}
    wrong_unit = {k: unit_of(answers[k], questions[k])[1](v) for k, v in right.items()
                  if v != 0 and unit_of(answers[k], questions[k])}
    for what, planted in (("twice the answer", doubled), ("the answer in a wrong unit", wrong_unit)):
        if not planted:
            continue
        for qid, verdict in verdicts(run(a.binary, flags, planted)).items():
            if qid in planted and verdict == "exact":
                bad.append(f"{qid}: {what} ({planted[qid]!r}, answer {right[qid]!r}) scored 'exact'")

    if bad:
        print("\n".join("FAILED: " + b for b in bad))
        return 1
    print(f"{a.lesson}: {len(right)} questions; right answers exact, {len(doubled)} doubled and "
          f"{len(wrong_unit)} in a wrong unit scored wrong")
    return 0


if __name__ == "__main__":
    sys.exit(main())
