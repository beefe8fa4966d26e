#!/usr/bin/env python3
"""Runs every command the READMEs show, and checks that it does what its comment says.

Commands are the lines of the ```sh blocks of README.md, lessons/README.md and
lessons/*/README.md, run in file order with bash from a repository root (a variable assigned on
one line, `b=...`, is used by the next ones). Each must exit 0; where its comment makes a claim
that can be read off the output ("bit for bit", "rounding-level", "one JSON object", a file it
writes), the claim is checked too.

  readme_commands.py --source DIR --build DIR          CI: long runs shortened (see shorten())
  readme_commands.py --source DIR --as-written         verbatim; also fails if a command whose
                                                       comment does not say "minute(s)" takes a
                                                       minute or more

Both run in a scratch root (links to DIR's entries, build/release -> the build, its own runs/).

The shortening only lowers step counts and sizes (--steps, --iters, --max-bytes, evaluation
windows; the lessons run on the tiny preset, which their own tests complement with small); every
other flag, path and the order stay as written. A few commands are not run (skip()): they
build or test the project itself, which is what CI runs around this test, or need a GPU that
the machine does not have.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

READMES = ["README.md", "lessons/README.md", "lessons/01-data-parallelism/README.md",
           "lessons/02-zero-fsdp-hsdp/README.md", "lessons/03-activation-checkpointing/README.md",
           "lessons/04-tensor-parallelism/README.md", "lessons/05-pipeline-parallelism/README.md",
           "lessons/08-graduating-to-gpus/README.md", "lessons/09-a-real-llama/README.md",
           "lessons/10-fault-tolerance/README.md"]
MINUTE = 60.0


def commands(path):
    """(line number, command, comment) of every line of the file's ```sh blocks."""
    out, in_sh = [], False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            s = line.strip()
            if s.startswith("```"):
                in_sh = not in_sh and s == "```sh"
                continue
            if not in_sh or not s:
                continue
            # A comment starts at " #" outside quotes; no command here quotes a '#'.
            m = re.match(r'^((?:[^"#]|"[^"]*")*?)\s*(?:#\s*(.*))?$', s)
            out.append((n, m.group(1).strip(), (m.group(2) or "").strip()))
    return out


def gpus_present():
    """The GPUs the driver shows (/dev/nvidia0, /dev/nvidia1, ...)."""
    return sum(1 for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n)) if os.path.isdir("/dev") else 0


def gpus_needed(argv):
    """One GPU per process: mpirun's -np or torchrun's --nproc-per-node (1 without a launcher)."""
    for flag in ("-np", "-n", "--nproc-per-node", "--nproc_per_node"):
        if flag in argv[:-1]:
            return int(argv[argv.index(flag) + 1])
    return 1


def skip(argv, as_written):
    """Why a command is not run, or None."""
    prog = argv[0]
    if prog in ("scripts/test.sh", "ctest"):
        return "runs the test suite, of which this test is part (CI runs it)"
    if prog in ("scripts/main.sh", "scripts/build.sh"):
        return "builds the project in the repository itself, not in a scratch root (CI builds it first)"
    gpu_only = ("--device", "cuda") in zip(argv, argv[1:]) or ("--backend", "nccl") in zip(argv, argv[1:])
    if gpu_only and not os.path.exists("/dev/nvidia0"):
        return "needs a CUDA GPU, and this machine has none (tests/cuda, tests/nccl and CliArgs cover it)"
    if gpu_only and gpus_needed(argv) > gpus_present():
        return f"needs {gpus_needed(argv)} GPUs, and this machine has {gpus_present()}"
    if prog == "bench/compare_torch.sh" and not as_written:
        return "minutes: times PyTorch's training step against ours; run with --as-written"
    return None


def set_flag(argv, flag, value):
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]


def shorten(argv, comment, env):
    """The CI form of a command: fewer steps, iterations and tokens, nothing else changed."""
    argv = list(argv)
    inner = argv
    if argv[0] == "mpirun":
        inner = argv[argv.index("-np") + 2:]
    prog = os.path.basename(inner[0])
    sub = inner[1:3]
    if prog == "llama4d" and sub[:1] == ["train"] and "tiny" not in inner:
        # stop-at < steps keeps the "stops, then resumes" pair meaningful.
        if "--recipe" in inner:
            set_flag(inner, "--stop-at", "2")  # a recipe gives its stages' steps: stop early in the first
        elif "--stop-at" in inner:
            set_flag(inner, "--steps", "4")
            set_flag(inner, "--stop-at", "2")
        elif "--resume" not in inner:
            set_flag(inner, "--steps", "2")
        set_flag(inner, "--eval-windows", "4")
    elif prog == "llama4d" and sub[:1] == ["eval"]:
        set_flag(inner, "--max-windows", "4")
    elif prog == "llama4d" and sub == ["bench", "comm"]:
        set_flag(inner, "--max-bytes", "1048576")
    elif prog == "llama4d" and sub[:1] == ["bench"]:
        for f, v in (("--iters", "1"), ("--warmup", "0"), ("--gemm-seconds", "0.05"), ("--gemm-n", "256"),
                     ("--seq-len", "64")):
            set_flag(inner, f, v)
    elif prog in ("lesson02_zero", "lesson03_checkpointing"):
        set_flag(inner, "--preset", "tiny")  # the lessons' own tests cover small; this checks the flags
        if "--seq-len" in inner and int(inner[inner.index("--seq-len") + 1]) > 64:
            set_flag(inner, "--seq-len", "64")  # within tiny's 128 positions
        if prog == "lesson03_checkpointing":
            set_flag(inner, "--timing-steps", "1")
            set_flag(inner, "--gemm-seconds", "0.05")
    elif prog == "mpi_vs_virtual.sh":
        env.update(PRESET="tiny", SEQ_LEN="64", STEPS="2", REPEATS="1")
    if argv[0] == "mpirun":
        argv = argv[:argv.index("-np") + 2] + inner
    return argv


def mpirun_flags():
    """What the README says to add after mpirun on this machine."""
    flags = ["--oversubscribe"] if (os.cpu_count() or 1) < 4 else []
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    return flags


def table_bounds(readme_text):
    """The rows "| step 1 | ..." and "| later steps | ..." of a README's bounds table, as floats."""
    rows = {}
    for line in readme_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in ("step 1", "later steps"):
            rows[cells[0]] = [float(c) for c in cells[1:]]
    return rows


def check_claims(cmd, argv, comment, out, err, root, readme_text=""):
    """The comment's claims that can be read off the run. Returns a list of failures."""
    bad = []
    text = out + err

    def need(cond, what):
        if not cond:
            bad.append(what)

    if "bit for bit" in comment:
        need("bitwise identical to one device" in text, "claims bit for bit, the report does not say bitwise")
    if "rounding-level" in comment:
        need("within its bound" in text and "bitwise identical" not in text,
             "claims a rounding-level difference, the report says bitwise (or failed)")
    if "within 1e-12 of the plain trainer" in comment:
        need(re.search(r"plain single-device trainer.*<= 1\.00e-12", text), "no plain-trainer comparison at 1e-12")
    if "--json" in argv:
        try:
            json.loads(out)
        except ValueError:
            bad.append("--json: stdout is not exactly one JSON object")
    if "--threads-sweep" in argv:
        j = json.loads(out)
        counts = [row["threads"] for row in j["threads_sweep"]]
        need(counts[0] == 1 and counts == sorted(set(counts)), "the sweep does not start at 1 thread and go up")
        need(j["reference_blas"] is not None, "no reference BLAS (scripts/setup.sh installs OpenBLAS)")
        need(all(row["reference_flops_per_s"] > 0 for row in j["threads_sweep"]), "a reference GEMM rate is missing")
    if "MFU" in comment and "--json" in argv:
        need("mfu" in json.loads(out), "no mfu in the JSON")
    if "HFU" in comment and "--json" in argv:
        j = json.loads(out)
        need(j.get("hfu", 0) > j.get("mfu", 0), "HFU is not above MFU with checkpointing")
    m = re.search(r"metrics in (\S+)", comment)
    if m:
        need(os.path.isfile(os.path.join(root, m.group(1))), m.group(1) + " was not written")
    if "Chrome trace" in comment:
        path = argv[argv.index("--trace") + 1]
        try:
            with open(os.path.join(root, path)) as f:
                need("traceEvents" in json.load(f), path + " has no traceEvents")
        except (OSError, ValueError) as e:
            bad.append(f"trace {path}: {e}")
    if "stops after step" in comment or "continues bitwise" in comment:
        out_dir = argv[argv.index("--out") + 1]
        with open(os.path.join(root, out_dir, "checkpoint", "trainer_state.json")) as f:
            state = json.load(f)
        if "stops after step" in comment:
            want = int(argv[argv.index("--stop-at") + 1])
            need(state["steps_done"] == want, f"steps_done {state['steps_done']}, not the --stop-at {want}")
        else:
            need(state["steps_done"] == state["options"]["steps"] and state["steps_done"] > 0,
                 f"resumed run ended at step {state['steps_done']} of {state['options']['steps']}")
            need("final loss nan" not in text, "the resumed run reports a nan loss")
    if "loss on text" in comment:
        need(json.loads(out)["loss"] > 0, "no loss")
    if "bounds of the table above" in comment:
        # The README's table states what the harness checks: the same numbers, step by step.
        rows, steps = table_bounds(readme_text), json.loads(out)["bounds_per_step"]
        keys = ["loss", "grad_element", "grad_tensor", "param_element", "param_tensor"]
        need(len(steps) >= 2 and set(rows) == {"step 1", "later steps"}, "no bounds table, or fewer than 2 steps")
        for name, step in (("step 1", 0), ("later steps", len(steps) - 1)):
            if name in rows and step < len(steps):
                need(rows[name] == [steps[step][k] for k in keys],
                     f"README's {name} bounds {rows[name]} differ from the harness's {[steps[step][k] for k in keys]}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="repository root")
    ap.add_argument("--build", help="the release build directory (CI mode; default SOURCE/build/release)")
    ap.add_argument("--as-written", action="store_true", help="run verbatim, check the (minutes) marks")
    a = ap.parse_args()
    source = os.path.abspath(a.source)
    # A scratch root: every top-level entry linked, build/release -> the build under test, and a
    # fresh runs/ of its own.
    root = tempfile.mkdtemp(prefix="llama4d_readme_")
    for name in os.listdir(source):
        if name not in ("build", "runs", ".git"):
            os.symlink(os.path.join(source, name), os.path.join(root, name))
    os.makedirs(os.path.join(root, "build"))
    os.symlink(os.path.abspath(a.build or os.path.join(source, "build", "release")),
               os.path.join(root, "build", "release"))
    failures, ran, variables = [], 0, {}
    for readme in READMES:
        variables.clear()  # a variable belongs to its README's blocks
        with open(os.path.join(source, readme), encoding="utf-8") as f:
            readme_text = f.read()
        for line, cmd, comment in commands(os.path.join(source, readme)):
            where = f"{readme}:{line}"
            assign = re.fullmatch(r"(\w+)=(\S+)", cmd)
            if assign:
                variables[assign.group(1)] = assign.group(2)
                continue
            argv = shlex.split(re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), cmd))
            why = skip(argv, a.as_written)
            if why:
                print(f"skip {where}: {cmd}\n     ({why})", flush=True)
                continue
            env = dict(os.environ)
            run = argv if a.as_written else shorten(argv, comment, env)
            if run[0] == "mpirun":
                run = run[:1] + mpirun_flags() + run[1:]
            print(f"run  {where}: {shlex.join(run)}", flush=True)
            t0 = time.monotonic()
            p = subprocess.run(run, cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               errors="replace")
            seconds = time.monotonic() - t0
            ran += 1
            problems = [] if p.returncode == 0 else [f"exit code {p.returncode}"]
            if p.returncode == 0:
                problems += check_claims(cmd, run, comment, p.stdout, p.stderr, root, readme_text)
            if a.as_written and seconds >= MINUTE and "minute" not in comment:
                problems.append(f"took {seconds:.0f} s but is not marked as taking minutes")
            print(f"     {seconds:.1f} s" + ("" if not problems else "  FAILED: " + "; ".join(problems)), flush=True)
            if problems:
                tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
                print("     " + "\n     ".join(tail), flush=True)
                failures.append(f"{where}: {cmd}: {'; '.join(problems)}")
    for name in os.listdir(root):  # the links first: nothing of the source is removed
        if os.path.islink(os.path.join(root, name)):
            os.unlink(os.path.join(root, name))
    os.unlink(os.path.join(root, "build", "release"))
    shutil.rmtree(root)
    print(f"\n{ran} commands run, {len(failures)} failed")
    for f in failures:
        print("FAILED " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
