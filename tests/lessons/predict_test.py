#!/usr/bin/env python3
"""Predict, then see: a lesson run with --step on a pseudo-terminal, as a learner runs it.

The lesson's stdin is the slave side of a pty (so it is a terminal and the lesson waits); this
script answers every prompt: a scripted number, a non-number, or Enter. It checks that
  - each exercise's question is asked once, in order, and before the first table that shows
    its measured value;
  - a number is set beside the measurement in the exercise report ("exact", "6.2% low", ...),
    a non-number is asked again, Enter skips;
  - every phase names code to read, and every file it names exists;
  - with stdin not a terminal the same run asks but never waits.

  predict_test.py --source DIR lesson01 BIN
  predict_test.py --source DIR lesson02 BIN
  predict_test.py --source DIR lesson05 BIN
  predict_test.py --source DIR lesson06 BIN
  predict_test.py --source DIR lesson08 BIN
  predict_test.py --source DIR lesson10 BIN
  predict_test.py --source DIR lesson11 BIN
"""
import argparse
import os
import pty
import re
import select
import subprocess
import sys
import termios
import time

PROMPT = re.compile(r"\(Enter to skip\): |-- press Enter to continue --")
QUESTION = re.compile(r"Predict (\w+): ")

# Per lesson: the flags, the answers to give (a list per exercise: one line per prompt, in order),
# the questions expected in order, and, per exercise, a string of the run's output that reveals
# the answer and so must come after the question.
CASES = {
    "lesson01": {
        "flags": ["--preset", "tiny", "--ranks", "4", "--micro-batches", "2", "--steps", "1", "--step"],
        "answers": {"E1": ["15"], "E2": ["lots", "2,020,352"], "E4": ["4"]},
        "asked": ["E1", "E2", "E3", "E4", "E5", "E6", "E7"],
        "revealed_by": {"E1": "B = W x M x b", "E2": "2,020,352", "E5": "757,664"},
        "verdicts": {
            "E1": "you predicted 15; the answer (every rank) is 16: 6.2% low",
            "E2": "you predicted 2,020,352; the answer (every rank) is 2,020,352: exact",
            "E4": "you predicted 4; the answer (every rank) is 4: exact",
        },
    },
    "lesson02": {
        "flags": ["--preset", "tiny", "--zero", "3", "--ranks", "4", "--steps", "1", "--step"],
        "answers": {"Z1": ["32768"], "Z6": ["1"], "Z11": ["2e6"]},
        "asked": ["Z1", "Z2", "Z3", "Z4", "Z5", "Z6", "Z7", "Z9", "Z10", "Z11", "Z12", "Z13"],
        "revealed_by": {"Z1": "shard total", "Z4": "comm buffers", "Z11": "bytes sent"},
        "verdicts": {
            # Rank 0's shard, which the question names, not the mean over ranks (31,568).
            "Z1": "you predicted 32,768; the answer (rank 0) is 32,768: exact",
            "Z6": "you predicted 1; the answer (rank 0) is ",
            "Z11": "you predicted 2,000,000; the answer (rank 0) is ",
        },
        "verdict_ends": {"Z6": "low", "Z11": "high"},
    },
    "lesson06": {
        "flags": ["--steps", "1", "--step"],
        "answers": {"A1": ["2064"], "A3": ["1500"], "M1": ["lots", "2,416,640"]},
        "asked": ["A1", "A3", "G1", "R3", "Q1", "M1", "K1", "D1"],
        "revealed_by": {"A1": "pairs/head/row", "G1": "Bytes SENT by each rank", "R3": "scratch peak",
                        "Q1": "with nkv = nh", "M1": "one device, S = ", "D1": "params at rest"},
        "verdicts": {
            "A1": "you predicted 2,064; the answer (every rank) is 2,064: exact",
            "A3": "you predicted 1,500; the answer is 1,744: 14.0% low",
            "M1": "you predicted 2,416,640; the answer (every rank) is 2,416,640: exact",
        },
    },
    "lesson08": {
        "flags": ["--steps", "1", "--gpu", "off", "--step"],
        "answers": {"P1": ["0.0039"], "W1": ["6e5"]},
        "asked": ["P1", "S2", "W1"],
        "revealed_by": {"P1": "largest 0.00389", "W1": "Bytes all ranks sent in the last step"},
        "verdicts": {
            # P1 is one number, not per rank: 0.0039 against 0.00388843 is 0.3% high.
            "P1": "you predicted 0.0039; the answer is 0.00389: 0.3% high",
            "W1": "you predicted 600,000 bytes; the answer (rank 0) is ",
        },
        "verdict_ends": {"W1": "high"},
    },
    # Each question scored against the rank and unit it names (P1 rank 0, T1 rank 1, B2 in
    # microseconds), and P1 asked before the table of every rank's bytes.
    "lesson05": {
        "flags": ["--steps", "1", "--step"],
        "answers": {"P1": ["252,416"], "B2": ["108"], "M2": ["4"], "T1": ["262144"]},
        "asked": ["P1", "B2", "M2", "T1", "L2", "D2"],
        "revealed_by": {"P1": "bytes (fp32)", "B2": "Share of the step: measured", "M2": "in flight / activations",
                        "T1": "activations sent"},
        "verdicts": {
            "P1": "you predicted 252,416 bytes; the answer (rank 0) is 252,416 bytes: exact",
            "B2": "you predicted 108 us; the answer (every rank) is 108 us: exact",
            "M2": "you predicted 4 micro-batches; the answer (rank 0) is 4 micro-batches: exact",
            "T1": "you predicted 262,144 bytes; the answer (rank 1) is 262,144 bytes: exact",
        },
    },
    # The failure model's numbers asked before the commands that print them; the restart steps
    # before the runs; each scored in its own unit against "the job" or "the run".
    "lesson10": {
        "flags": ["--step"],
        "answers": {"E1": ["8"], "E2": ["lots", "0.409"], "L1": ["3"], "Y1": ["817"]},
        "asked": ["E1", "E2", "K1", "L1", "L2", "Y1", "G1", "B1"],
        "revealed_by": {"E1": "interruptions a day", "K1": "-- crash:", "L1": "restarts after step", "Y1": "Young: ",
                        "B1": "bytes differ"},
        "verdicts": {
            "E1": "you predicted 8 interruptions; the answer (the job) is 7.76 interruptions: 3.1% high",
            "E2": "you predicted 0.409 interruptions; the answer (the run) is 0.409 interruptions: exact",
            "L1": "you predicted 3 steps; the answer (the run) is 3 steps: exact",
            "Y1": "you predicted 817 seconds; the answer (the job) is 817.38 seconds: exact",
        },
    },
    "lesson11": {
        "flags": ["--step"],
        "answers": {"P1": ["1024"], "P2": ["lots", "3"], "R1": ["4545792"]},
        "asked": ["P1", "P2", "T1", "R1", "R4", "F1", "D1", "B1"],
        "revealed_by": {"P1": "sequences a step", "R1": "bytes moved   by hand", "F1": "FLOPs/token",
                        "B1": "bytes differ"},
        "verdicts": {
            "P1": "you predicted 1,024 sequences; the answer (the batch) is 1,024 sequences: exact",
            "P2": "you predicted 3 steps; the answer (the annealing) is 2.50 steps: 20.0% high",
            "R1": "you predicted 4,545,792",
        },
        "verdict_ends": {"P2": "high", "R1": "exact"},
    },
}


def run_on_pty(argv, answers, timeout):
    """Runs argv with a pty as stdin, answering prompts. Returns (exit code, output, [(id, line)])."""
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~termios.ECHO  # the answers are not part of the output under test
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    p = subprocess.Popen(argv, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    os.close(slave)
    out, answered, given = b"", 0, []
    pending = {k: list(v) for k, v in answers.items()}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([p.stdout], [], [], 1.0)
            if not ready:
                if p.poll() is not None:
                    break
                continue
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
            text = out.decode(errors="replace")
            prompts = list(PROMPT.finditer(text))
            for m in prompts[answered:]:
                line = ""
                if m.group(0).startswith("(Enter"):
                    ids = QUESTION.findall(text[:m.start()])
                    ex = ids[-1] if ids else "?"
                    line = pending.get(ex, [""]).pop(0) if pending.get(ex) else ""
                    given.append((ex, line))
                os.write(master, (line + "\n").encode())
                answered += 1
        else:
            p.kill()
            raise SystemExit(f"timed out after {timeout} s; output so far:\n{out.decode(errors='replace')[-3000:]}")
        code = p.wait(timeout=60)
    finally:
        os.close(master)
    return code, out.decode(errors="replace"), given


def check_reads(text, source, bad):
    """Every phase names code to read, and every file it names exists."""
    banners = list(re.finditer(r"^== phase \d+: .* ==\n\n(read: (.*)\n)?", text, re.M))
    if not banners:
        bad.append("no phase banners")
    for b in banners:
        if not b.group(1):
            bad.append(f"phase without a 'read:' line: {b.group(0).splitlines()[0]}")
            continue
        for path in re.findall(r"([\w./-]+\.(?:cpp|h))\b", b.group(2)):
            if not os.path.isfile(os.path.join(source, path)):
                bad.append(f"'read:' names {path}, which does not exist")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="repository root")
    ap.add_argument("--timeout", type=float, default=500)
    ap.add_argument("lesson", choices=sorted(CASES))
    ap.add_argument("binary")
    a = ap.parse_args()
    case = CASES[a.lesson]
    argv = [a.binary] + case["flags"]
    bad = []

    code, text, given = run_on_pty(argv, case["answers"], a.timeout)
    if code != 0:
        bad.append(f"exit code {code}")
    asked = []
    for ex, _ in given:
        if not asked or asked[-1] != ex:
            asked.append(ex)
    if asked != case["asked"]:
        bad.append(f"asked {asked}, expected {case['asked']}")
    for ex, lines in case["answers"].items():
        got = [line for e, line in given if e == ex]
        if got != lines:
            bad.append(f"{ex}: answered {got}, meant to answer {lines} (a non-number must be asked again)")
    if "not a number" not in text and any(not re.match(r"^[\d,._e+-]*$", x) for v in case["answers"].values() for x in v):
        bad.append("a non-number was not refused")
    for ex, reveal in case["revealed_by"].items():
        q, r = text.find(f"Predict {ex}: "), text.find(reveal)
        if q < 0 or r < 0 or q > r:
            bad.append(f"{ex}: the question (at {q}) must come before '{reveal}' (at {r})")
    for ex, verdict in case["verdicts"].items():
        block = re.search(rf"^\[PASS\] {ex}\. .*?(?=^\[(?:PASS|FAIL)\]|^\d+ of \d+ exercises)", text, re.M | re.S)
        if not block:
            bad.append(f"{ex}: no PASS block in the exercise report")
            continue
        line = next((x.strip() for x in block.group(0).splitlines() if x.strip().startswith("you predicted")), "")
        end = case.get("verdict_ends", {}).get(ex)
        if not line.startswith(verdict) or (end and not line.endswith(end)):
            bad.append(f"{ex}: verdict '{line}', expected '{verdict}...{end or ''}'")
    n_verdicts = text.count("you predicted")
    if n_verdicts != len(case["verdicts"]):
        bad.append(f"{n_verdicts} verdicts for {len(case['verdicts'])} predictions (a skipped question has none)")
    check_reads(text, a.source, bad)

    # Not a terminal: the questions are printed, nothing is read, nothing waits.
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=a.timeout,
                       env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    if p.returncode != 0:
        bad.append(f"stdin not a terminal: exit code {p.returncode}")
    if "Predict " + case["asked"][0] not in p.stdout or "neither waits nor reads predictions" not in p.stdout:
        bad.append("stdin not a terminal: the questions or the note are missing")
    if "you predicted" in p.stdout or "Enter to skip" in p.stdout:
        bad.append("stdin not a terminal: a prediction was asked for or read")

    if bad:
        print(text[-4000:])
        print("\n".join("FAILED: " + b for b in bad))
        return 1
    print(f"{a.lesson}: {len(given)} questions answered, {n_verdicts} predictions set beside the measurements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
