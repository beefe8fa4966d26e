#!/usr/bin/env python3
"""Every figure a README quotes from a program equals what the program prints now.

A README marks each figure it quotes, invisibly in the rendered page:

  <!-- run L5: build/release/bin/lesson05_pipeline --json -->     a command (once per README); its
                                                                  stdout is one JSON object
  <!--fig L5 exercises.P1.measured.0-->252,416<!--/fig-->         a figure: a path into that JSON ...
  <!--fig L5 100*(1-{balancing.step_us_llama3}/{balancing.step_us_balanced})-->13<!--/fig-->%
                                                                  ... or an expression of paths in {}
  <!--fails lesson05_pipeline "multiple of"-->`--schedule interleaved --micro-batches 6`<!--/fails-->
                                                                  flags a README says are refused:
                                                                  exit code 2, the message on stderr

Mark only what a program prints the same on every run: figures that move with thread timing (a
ZeRO-2/3 gradient peak, a wall-clock time) stay unmarked, and their text says they vary.

A path is dot-separated: a key of an object; a list index; or, in a list of objects, the object
whose "id" is the token, or whose fields match "key=value" (several joined by ",").
A figure matches when the value, rounded to as many decimals as the figure shows, is the figure
(commas, spaces and a trailing % ignored; 3.09e-4 is held to its mantissa's digits). Each command runs once, however many figures read it.

After the check passes, the script changes one digit of each README's first figure and checks
that the changed text fails: a figure edited by hand cannot pass.

  readme_figures.py --source DIR --build DIR
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys

READMES = ["README.md", "lessons/README.md"] + [f"lessons/{d}/README.md" for d in (
    "01-data-parallelism", "02-zero-fsdp-hsdp", "03-activation-checkpointing", "04-tensor-parallelism",
    "05-pipeline-parallelism", "06-context-parallelism", "07-llama3-4d", "08-graduating-to-gpus", "09-a-real-llama",
    "10-fault-tolerance", "11-training-recipe")]

RUN = re.compile(r"<!--\s*run\s+(\w+):\s*(.*?)\s*-->")
FIG = re.compile(r"<!--fig\s+(\w+)\s+(.*?)-->(.*?)<!--/fig-->", re.S)
FAILS = re.compile(r'<!--fails\s+(\S+)\s+"([^"]*)"-->`([^`]*)`<!--/fails-->')


def lookup(j, path):
    for token in path.split("."):
        if isinstance(j, list):
            if re.fullmatch(r"-?\d+", token):
                j = j[int(token)]
                continue
            want = dict(kv.split("=", 1) for kv in token.split(",")) if "=" in token else {"id": token}
            hits = [x for x in j if isinstance(x, dict) and all(str(x.get(k)) == v for k, v in want.items())]
            if len(hits) != 1:
                raise KeyError(f"{len(hits)} elements match '{token}'")
            j = hits[0]
        else:
            j = j[token]
    return j


def evaluate(j, expr):
    if "{" not in expr:
        return lookup(j, expr.strip())
    values = {}

    def sub(m):
        name = f"_v{len(values)}"
        values[name] = lookup(j, m.group(1).strip())
        return name

    return eval(re.sub(r"\{([^}]*)\}", sub, expr), {"__builtins__": {}, "abs": abs, "min": min, "max": max}, values)


def matches(value, text):
    """Whether value, rounded to the decimals text shows, is text."""
    shown = re.sub(r"[,\s%\u2009\u202f]", "", text)
    sci = re.fullmatch(r"(-?\d+(?:\.(\d+))?)e([+-]?\d+)", shown)
    if sci:  # 3.09e-4: the same mantissa digits and exponent
        digits = len(sci.group(2) or "")
        mantissa, exponent = f"{float(value):.{digits}e}".split("e")
        return (mantissa, int(exponent)) == (sci.group(1), int(sci.group(3))), f"{mantissa}e{int(exponent)}"
    if not re.fullmatch(r"-?\d+(\.\d+)?", shown):
        return False, f"'{text}' is not a number"
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    got = f"{float(value):.{decimals}f}"
    return got == shown, got


def check_text(readme, text, outputs, bad):
    """The figures of one README against the commands' outputs; returns how many were checked."""
    n = 0
    for m in FIG.finditer(text):
        name, expr, shown = m.group(1), m.group(2), m.group(3)
        line = text.count("\n", 0, m.start()) + 1
        if name not in outputs:
            bad.append(f"{readme}:{line}: no command '{name}' (a '<!-- run {name}: ... -->' line)")
            continue
        try:
            ok, got = matches(evaluate(outputs[name], expr), shown)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, SyntaxError, NameError) as e:
            bad.append(f"{readme}:{line}: {name} {expr}: {type(e).__name__} {e}")
            continue
        if not ok:
            bad.append(f"{readme}:{line}: says {shown.strip()}, {name} {expr} is {got} now")
        n += 1
    return n


def binary(build, argv):
    prog = argv[0]
    if prog.startswith("build/release/"):
        return [os.path.join(build, prog[len("build/release/"):])] + argv[1:]
    return argv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="repository root")
    ap.add_argument("--build", required=True, help="the release build directory")
    a = ap.parse_args()
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    bad, texts, figures, runs, refusals = [], {}, 0, 0, 0
    for readme in READMES:
        with open(os.path.join(a.source, readme), encoding="utf-8") as f:
            texts[readme] = f.read()
    outputs_of = {}
    for readme, text in texts.items():
        outputs = {}
        for m in RUN.finditer(text):
            name, cmd = m.group(1), m.group(2)
            if "--json" not in shlex.split(cmd):
                bad.append(f"{readme}: run {name}: '{cmd}' has no --json")
                continue
            p = subprocess.run(binary(a.build, shlex.split(cmd)), cwd=a.source, env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=600)
            runs += 1
            try:
                outputs[name] = json.loads(p.stdout)
            except ValueError:
                bad.append(f"{readme}: run {name}: '{cmd}' exited {p.returncode} without one JSON object: "
                           f"{p.stderr.strip()[-300:]}")
        outputs_of[readme] = outputs
        figures += check_text(readme, text, outputs, bad)
        for m in FAILS.finditer(text):
            prog, message, flags = m.group(1), m.group(2), m.group(3)
            p = subprocess.run([os.path.join(a.build, "bin", prog)] + shlex.split(flags), cwd=a.source, env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
            refusals += 1
            if p.returncode != 2 or message not in p.stderr:
                bad.append(f"{readme}: {prog} {flags}: exit code {p.returncode} and '{p.stderr.strip()[-200:]}', "
                           f"where the README says it is refused with '{message}' (exit code 2)")
    if not bad:
        # A figure changed by hand must fail: one digit of each README's first figure.
        for readme, text in texts.items():
            m = FIG.search(text)
            if not m:
                continue
            shown = m.group(3)
            i = max(k for k, c in enumerate(shown) if c.isdigit())
            changed = shown[:i] + str((int(shown[i]) + 1) % 10) + shown[i + 1:]
            tampered = text[:m.start(3)] + changed + text[m.end(3):]
            caught = []
            check_text(readme, tampered, outputs_of[readme], caught)
            if not caught:
                bad.append(f"{readme}: changing its first figure {shown!r} to {changed!r} was not caught")
    if bad:
        print("\n".join("FAILED: " + b for b in bad))
        return 1
    print(f"{figures} figures in {len(READMES)} READMEs match {runs} runs; {refusals} refused commands refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
