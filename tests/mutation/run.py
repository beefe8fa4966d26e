#!/usr/bin/python3
"""Mutation testing for llama4d: plants known bugs and checks that the tests notice.

Each mutant in mutants.json is one exact search-and-replace on one source file. For every
selected mutant this tool, working in a scratch copy of the repository (never in your tree):
  1. checks that `find` occurs exactly once in `file` (else: "invalid"),
  2. applies the replacement and rebuilds incrementally (a compile failure: "build-error"),
  3. runs `ctest --preset release -R <tests>` and each `llama4d verify <args>` listed;
     any failure "kills" the mutant, otherwise it "survived",
  4. writes the original bytes back and moves on.
Before any mutant it runs every selected test regex and verify command once on the unmutated
copy (the baseline): a check that already fails cannot kill anything, so the run stops.

Standard library only; run it with /usr/bin/python3. See tests/mutation/README.md.

Exit status: 0 kill rate >= 0.95; 1 below (or no mutant was killed or survived);
2 bad arguments or a malformed mutants file; 3 the scratch copy does not build or the
baseline fails.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MUTANTS = Path(__file__).resolve().with_name("mutants.json")
DEFAULT_SCRATCH = Path("/tmp/llama4d-mutants")
MARKER = ".llama4d-mutants"            # marks a directory this tool may overwrite
EXCLUDE_TOP = {"build", "runs", ".git", MARKER}  # not copied (and never deleted) at the top level
EXCLUDE_ANY = {"__pycache__", ".ipynb_checkpoints"}
BUILD_DIR = Path("build") / "release"  # the `release` preset's binary dir
KILL_RATE_GOAL = 0.95
STATUSES = ("killed", "survived", "invalid", "build-error")


class UsageError(Exception):
    """Bad arguments or mutants file: exit 2."""


class SetupError(Exception):
    """The scratch copy does not build or the baseline fails: exit 3."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- mutants file ----------------------------------------------------------------------

def load_mutants(path: Path) -> list[dict]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read mutants file {path}: {e}")
    mutants = doc.get("mutants") if isinstance(doc, dict) else doc
    if not isinstance(mutants, list) or not mutants:
        raise UsageError(f"{path}: expected {{\"mutants\": [...]}} with at least one mutant")
    seen: set[str] = set()
    for i, m in enumerate(mutants):
        where = f"{path}: mutant #{i}"
        if not isinstance(m, dict):
            raise UsageError(f"{where} is not an object")
        for key in ("id", "file", "find", "replace", "why", "tests"):
            if not isinstance(m.get(key), str):
                raise UsageError(f"{where} ({m.get('id', '?')}): '{key}' must be a string")
        where = f"{path}: mutant '{m['id']}'"
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", m["id"]):
            raise UsageError(f"{where}: ids are lower-case words joined by '-'")
        if m["id"] in seen:
            raise UsageError(f"{where}: id used twice")
        seen.add(m["id"])
        f = Path(m["file"])
        if f.is_absolute() or ".." in f.parts or not f.parts or f.parts[0] in EXCLUDE_TOP:
            raise UsageError(f"{where}: 'file' must be a path inside the repository, got {m['file']!r}")
        if not m["find"] or m["find"] == m["replace"]:
            raise UsageError(f"{where}: 'find' must be non-empty and differ from 'replace'")
        if not m["tests"].strip():
            raise UsageError(f"{where}: 'tests' (a ctest -R regex) must not be empty")
        try:
            re.compile(m["tests"])
        except re.error as e:
            raise UsageError(f"{where}: 'tests' is not a regex: {e}")
        verify = m.setdefault("verify", [])
        if not isinstance(verify, list) or not all(
                isinstance(v, list) and all(isinstance(a, str) for a in v) for v in verify):
            raise UsageError(f"{where}: 'verify' must be a list of argument lists, e.g. [[\"--mesh\", \"dp=4\"]]")
    return mutants


def find_count(root: Path, m: dict) -> tuple[int, str]:
    """How often `find` occurs in the mutant's file under root (-1: no such file)."""
    path = root / m["file"]
    try:
        data = path.read_bytes()
    except OSError as e:
        return -1, f"cannot read {m['file']}: {e.strerror}"
    n = data.count(m["find"].encode("utf-8"))
    if n == 1:
        return 1, ""
    return n, f"'find' occurs {n} times in {m['file']} (must be exactly once)"


def syntax_check(root: Path, m: dict, commands: dict[str, dict], nice: int) -> tuple[bool, str]:
    """Compiles the mutated file (-fsyntax-only, from stdin) with its command from a
    compile_commands.json; nothing is written. (ok, message)."""
    entry = commands.get(str((root / m["file"]).resolve()))
    if entry is None:
        return True, "not compiled on its own (a header?): checked only by a full run"
    argv = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a == entry["file"] or a.endswith(m["file"]):
            continue
        out.append(a)
    src = (root / m["file"]).read_bytes().replace(m["find"].encode(), m["replace"].encode(), 1)
    cmd = out + ["-iquote", str((root / m["file"]).parent), "-fsyntax-only", "-x", "c++", "-"]
    if nice > 0 and shutil.which("nice"):
        cmd = ["nice", "-n", str(nice)] + cmd
    r = subprocess.run(cmd, cwd=entry["directory"], input=src, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode == 0:
        return True, ""
    errors = [l for l in r.stdout.decode(errors="replace").splitlines() if "error" in l]
    return False, "does not compile: " + (errors[0].strip() if errors else f"compiler exit {r.returncode}")


def load_compile_commands(source: Path, scratch: Path) -> tuple[dict[str, dict], Path | None]:
    for build in (source / BUILD_DIR, scratch / BUILD_DIR):
        path = build / "compile_commands.json"
        if path.exists():
            entries = json.loads(path.read_text())
            commands: dict[str, dict] = {}
            for e in entries:
                f = Path(e["file"])
                f = f if f.is_absolute() else Path(e["directory"]) / f
                # A scratch build compiles the scratch's files: map them back onto `root`.
                try:
                    rel = f.resolve().relative_to(build.parent.parent.resolve())
                except ValueError:
                    continue
                commands.setdefault(str((source / rel).resolve()), e)
            return commands, path
    return {}, None


# ---- scratch copy ----------------------------------------------------------------------

def prepare_scratch(scratch: Path, source: Path) -> None:
    scratch = scratch.resolve()
    if scratch == source or source in scratch.parents or scratch in source.parents:
        raise UsageError(f"--scratch {scratch} must lie outside the source tree {source}")
    if scratch.exists():
        if not scratch.is_dir():
            raise UsageError(f"--scratch {scratch} exists and is not a directory")
        if any(scratch.iterdir()) and not (scratch / MARKER).exists():
            raise UsageError(f"--scratch {scratch} is not empty and was not made by this tool "
                             f"(no {MARKER} file); refusing to overwrite it")
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / MARKER).write_text(f"scratch copy of {source} for tests/mutation/run.py\n")


def same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = a.lstat(), b.lstat()
    except OSError:
        return False
    if sa.st_size != sb.st_size or (sa.st_mode & 0o111) != (sb.st_mode & 0o111):  # size, executable bits
        return False
    return a.read_bytes() == b.read_bytes()


def sync_tree(src: Path, dst: Path) -> int:
    """Makes dst's files equal src's (excluding build/, runs/, .git/). Changed files get a fresh
    mtime, so the incremental build picks them up; unchanged files are left alone."""
    copied = 0
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        top = rel == Path(".")
        dirnames[:] = sorted(d for d in dirnames
                             if d not in EXCLUDE_ANY and not (top and d in EXCLUDE_TOP))
        out_dir = dst / rel
        if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
            remove(out_dir)  # a file where the source now has a directory
        out_dir.mkdir(parents=True, exist_ok=True)
        wanted = set(dirnames)
        for name in filenames:
            if name in EXCLUDE_ANY or (top and name in EXCLUDE_TOP):
                continue
            wanted.add(name)
            s, d = Path(dirpath) / name, out_dir / name
            if s.is_symlink():
                if d.is_symlink() and os.readlink(d) == os.readlink(s):
                    continue
                if d.exists() or d.is_symlink():
                    remove(d)
                os.symlink(os.readlink(s), d)
                copied += 1
            elif not same_file(s, d):
                if d.is_symlink() or d.is_dir():
                    remove(d)
                shutil.copy(s, d)  # contents + mode, mtime = now
                copied += 1
        for name in os.listdir(out_dir):  # delete what the source no longer has
            if name in wanted or (top and name in EXCLUDE_TOP):
                continue
            remove(out_dir / name)
    return copied


def remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()


# ---- running things --------------------------------------------------------------------

def run_logged(cmd: list[str], cwd: Path, log_path: Path, timeout: float | None = None) -> tuple[int, bool]:
    """Runs cmd with stdout+stderr into log_path. Returns (exit code, timed out)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole session we started, nothing else
            proc.wait()
            return 124, True
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


def other_builds_running() -> bool:
    if not shutil.which("pgrep"):
        return False
    r = subprocess.run(["pgrep", "-f", "ninja|cmake --build"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return bool(r.stdout.strip())


class Runner:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.scratch: Path = args.scratch.resolve()
        self.logs = self.scratch / BUILD_DIR / "mutation-logs"
        self.cli = self.scratch / BUILD_DIR / "bin" / "llama4d"

    def nice(self, cmd: list[str]) -> list[str]:
        if self.args.nice > 0 and shutil.which("nice"):
            return ["nice", "-n", str(self.args.nice)] + cmd
        return cmd

    def build(self, log_name: str) -> bool:
        if self.args.wait_for_builds:
            waited = False
            while other_builds_running():
                if not waited:
                    log("    waiting for another build on this machine to finish ...")
                    waited = True
                time.sleep(10)
            if waited:
                log("    ... done waiting; building")
        if not (self.scratch / BUILD_DIR / "CMakeCache.txt").exists():
            log(f"    configuring a fresh build dir in {self.scratch / BUILD_DIR}")
            rc, _ = run_logged(["cmake", "--preset", "release", "-G", "Ninja"], self.scratch,
                               self.logs / f"{log_name}.configure.log")
            if rc != 0:
                return False
        rc, _ = run_logged(self.nice(["cmake", "--build", "--preset", "release", "-j", str(self.args.jobs)]),
                           self.scratch, self.logs / f"{log_name}.build.log")
        return rc == 0

    def ctest_cmd(self, regex: str, stop_on_failure: bool) -> list[str]:
        cmd = ["ctest", "--preset", "release", "-R", regex, "--timeout", str(self.args.timeout),
               "--no-tests=error", "-j", str(self.args.ctest_jobs)]
        if stop_on_failure:
            cmd.append("--stop-on-failure")
        return cmd

    def ctest(self, regex: str, log_name: str, stop_on_failure: bool = True) -> tuple[bool, list[str]]:
        """(passed, names of failed tests)."""
        path = self.logs / f"{log_name}.ctest.log"
        rc, _ = run_logged(self.ctest_cmd(regex, stop_on_failure), self.scratch, path)  # ctest's own --timeout
        if rc == 0:
            return True, []
        return False, failed_tests(path) or ["(see " + str(path) + ")"]

    def count_tests(self, regex: str) -> int:
        r = subprocess.run(["ctest", "--preset", "release", "-N", "-R", regex], cwd=self.scratch,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        m = re.search(r"Total Tests:\s*(\d+)", r.stdout)
        return int(m.group(1)) if m else 0

    def verify(self, argv: list[str], log_name: str) -> tuple[bool, str]:
        path = self.logs / f"{log_name}.log"
        rc, timed_out = run_logged([str(self.cli), "verify", *argv], self.scratch, path, timeout=self.args.timeout)
        if rc == 0:
            return True, ""
        return False, ("timed out" if timed_out else f"exit {rc}")


def failed_tests(log_path: Path) -> list[str]:
    text = log_path.read_text(errors="replace")
    names: list[str] = []
    tail = text.split("The following tests FAILED:", 1)
    if len(tail) == 2:
        for line in tail[1].splitlines():
            m = re.match(r"\s*\d+\s+-\s+(.+?)\s+\(([^)]*)\)\s*$", line)
            if m:
                names.append(f"{m.group(1)} ({m.group(2)})")
    if not names:  # e.g. --stop-on-failure cut the summary short
        for line in text.splitlines():
            m = re.search(r"Test\s+#\d+:\s+(\S+)\s+\.*\**\s*(Failed|Timeout|Exception|SEGFAULT|Subprocess aborted|"
                          r"Child aborted|\*\*\*\S+)", line)
            if m:
                names.append(f"{m.group(1)} ({m.group(2).strip('*')})")
    return names


def verify_label(argv: list[str]) -> str:
    return "verify " + " ".join(argv) if argv else "verify"


# ---- the run -----------------------------------------------------------------------------

def baseline(runner: Runner, mutants: list[dict]) -> float:
    t0 = time.monotonic()
    regexes = sorted({m["tests"] for m in mutants})
    verifies: list[list[str]] = []
    for m in mutants:
        for v in m["verify"]:
            if v not in verifies:
                verifies.append(v)
    log(f"baseline: {len(regexes)} test regexes, {len(verifies)} verify commands on the unmutated copy")
    empty = [r for r in regexes if runner.count_tests(r) == 0]
    if empty:
        raise SetupError("baseline: these 'tests' regexes match no test, so they could never kill a mutant: "
                         + ", ".join(repr(r) for r in empty))
    # CMake's regex engine allows few groups: flatten the alternatives into one list.
    alternatives = sorted({a for r in regexes for a in r.split("|")})
    union = "|".join(alternatives)
    ok, failed = runner.ctest(union, "baseline", stop_on_failure=False)
    if not ok:
        raise SetupError("baseline: tests fail WITHOUT any mutation, so they cannot kill a mutant; fix them or "
                         "drop them from the mutants' regexes: " + "; ".join(failed)
                         + f" (log: {runner.logs / 'baseline.ctest.log'})")
    for i, v in enumerate(verifies):
        ok, why = runner.verify(v, f"baseline.verify-{i}")
        if not ok:
            raise SetupError(f"baseline: `llama4d {verify_label(v)}` fails without any mutation ({why}; log: "
                             f"{runner.logs / f'baseline.verify-{i}.log'})")
    dt = time.monotonic() - t0
    log(f"baseline: all checks pass ({dt:.0f} s)")
    return dt


def run_mutant(runner: Runner, m: dict, all_checks: bool) -> dict:
    t0 = time.monotonic()
    res = {"id": m["id"], "status": None, "killed_by": None, "seconds": 0.0, "detail": None}
    n, why = find_count(runner.scratch, m)
    if n != 1:
        res.update(status="invalid", detail=why)
        res["seconds"] = round(time.monotonic() - t0, 1)
        return res
    path = runner.scratch / m["file"]
    original = path.read_bytes()
    try:
        path.write_bytes(original.replace(m["find"].encode("utf-8"), m["replace"].encode("utf-8"), 1))
        if not runner.build(m["id"]):
            res.update(status="build-error", detail=f"log: {runner.logs / (m['id'] + '.build.log')}")
        else:
            killers: list[str] = []
            ok, failed = runner.ctest(m["tests"], m["id"], stop_on_failure=not all_checks)
            if not ok:
                killers.append("ctest: " + ", ".join(failed[:3]) + (" ..." if len(failed) > 3 else ""))
            for i, v in enumerate(m["verify"]):
                if killers and not all_checks:
                    break
                ok, why = runner.verify(v, f"{m['id']}.verify-{i}")
                if not ok:
                    killers.append(f"{verify_label(v)} ({why})")
            if killers:
                res.update(status="killed", killed_by="; ".join(killers))
            else:
                res["status"] = "survived"
    finally:
        path.write_bytes(original)  # exactly the original bytes; fresh mtime => rebuilt next time
        os.utime(path, None)
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def summary(results: list[dict]) -> dict:
    count = {s: sum(1 for r in results if r["status"] == s) for s in STATUSES}
    k, s = count["killed"], count["survived"]
    return {"mutants": results, "killed": k, "survived": s, "invalid": count["invalid"],
            "build_errors": count["build-error"], "kill_rate": (round(k / (k + s), 4) if k + s else None)}


def select(mutants: list[dict], only: str | None) -> list[dict]:
    if not only:
        return mutants
    wanted = [x.strip() for x in only.split(",") if x.strip()]
    known = {m["id"] for m in mutants}
    unknown = [x for x in wanted if x not in known]
    if unknown or not wanted:
        raise UsageError("--only: unknown mutant id(s): " + ", ".join(unknown) + " (see --list)" if unknown
                         else "--only: no ids given")
    return [m for m in mutants if m["id"] in set(wanted)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tests/mutation/run.py",
        description="Plant the bugs of mutants.json one at a time in a scratch copy and check that the tests "
                    "and `llama4d verify` catch each (slow: a rebuild per mutant; not for CI).")
    p.add_argument("--only", metavar="ID,ID", help="run only these mutants (comma-separated ids)")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--check", action="store_true",
                   help="check every mutant's 'find' occurs exactly once in the working tree, without building")
    p.add_argument("--compile", action="store_true",
                   help="with --check: also compile each mutated file (-fsyntax-only) with its command from "
                        "build/release/compile_commands.json (the repository's, else the scratch copy's)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout (progress: stderr)")
    p.add_argument("--keep-going", action=argparse.BooleanOptionalAction, default=True,
                   help="go on after a surviving mutant (default); --no-keep-going stops at the first survivor")
    p.add_argument("--all-checks", action="store_true",
                   help="run every check of a mutant even after one killed it (killed_by lists them all)")
    p.add_argument("--scratch", type=Path, default=DEFAULT_SCRATCH, metavar="DIR",
                   help=f"scratch copy of the repository, kept between runs (default {DEFAULT_SCRATCH})")
    p.add_argument("--source", type=Path, default=REPO, metavar="DIR",
                   help="tree to copy and mutate (default: this repository's working tree, "
                        "uncommitted changes included)")
    p.add_argument("--mutants", type=Path, default=DEFAULT_MUTANTS, metavar="FILE", help="mutants file")
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="parallel compile jobs (default 2)")
    p.add_argument("--ctest-jobs", type=int, default=None, metavar="N", help="parallel tests (default: --jobs)")
    p.add_argument("--timeout", type=int, default=300, metavar="S",
                   help="seconds per test and per verify command (default 300)")
    p.add_argument("--nice", type=int, default=10, metavar="N", help="niceness of the builds (default 10; 0: off)")
    p.add_argument("--wait-for-builds", action="store_true",
                   help="before each build, wait while another ninja / cmake --build runs on this machine")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the baseline check (only if you just ran it on this very tree)")

    args = p.parse_args(argv)  # argparse prints the message and exits 2 on bad arguments
    if args.jobs < 1 or args.timeout < 1 or args.nice < 0 or (args.ctest_jobs is not None and args.ctest_jobs < 1):
        p.error("--jobs, --ctest-jobs and --timeout must be >= 1, --nice >= 0")
    if args.list and args.check:
        p.error("--list and --check exclude each other")
    if args.compile and not args.check:
        p.error("--compile goes with --check")
    if args.ctest_jobs is None:
        args.ctest_jobs = args.jobs
    args.source = args.source.resolve()
    if not (args.source / "CMakePresets.json").is_file():
        p.error(f"--source {args.source} is not an llama4d source tree (no CMakePresets.json)")
    return args


def emit(obj: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, indent=2))
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `run.py --list | head` ends quietly
    args = parse_args(argv)
    try:
        mutants = select(load_mutants(args.mutants), args.only)
    except UsageError as e:
        print(f"run.py: error: {e}", file=sys.stderr)
        return 2

    if args.list:
        if args.json:
            emit({"mutants": [{k: m[k] for k in ("id", "file", "why", "tests", "verify")} for m in mutants]}, True)
        else:
            width = max(len(m["id"]) for m in mutants)
            for m in mutants:
                print(f"{m['id']:<{width}}  {m['file']}: {m['why']}")
        return 0

    if args.check:
        commands: dict[str, dict] = {}
        if args.compile:
            commands, cc_path = load_compile_commands(args.source, args.scratch.resolve())
            if cc_path is None:
                print("run.py: error: --compile needs a configured build (build/release/compile_commands.json)",
                      file=sys.stderr)
                return 2
            log(f"compile commands from {cc_path}")
        rows, bad = [], 0
        for m in mutants:
            n, why = find_count(args.source, m)
            ok = n == 1
            if ok and args.compile:
                ok, why = syntax_check(args.source, m, commands, args.nice)
            rows.append({"id": m["id"], "status": "ok" if ok else "invalid", "detail": why or None})
            bad += not ok
            log(f"{'ok     ' if ok else 'INVALID'} {m['id']}" + (f": {why}" if why else ""))
        log(f"{len(mutants) - bad} of {len(mutants)} mutants apply cleanly to {args.source}"
            + (" and compile" if args.compile else ""))
        emit({"mutants": rows, "valid": len(mutants) - bad, "invalid": bad}, args.json)
        return 0 if bad == 0 else 1

    runner = Runner(args)
    results: list[dict] = []
    try:
        prepare_scratch(args.scratch, args.source)
        t0 = time.monotonic()
        n = sync_tree(args.source, runner.scratch)
        log(f"scratch copy {runner.scratch}: {n} files updated from {args.source} ({time.monotonic() - t0:.1f} s)")
        fresh = not (runner.scratch / BUILD_DIR / "CMakeCache.txt").exists()
        log("building the unmutated scratch copy" + (" (a fresh build dir: a full build, several minutes)" if fresh
                                                     else " (incremental)") + " ...")
        t0 = time.monotonic()
        if not runner.build("baseline"):
            raise SetupError(f"the unmutated scratch copy does not build; log: {runner.logs / 'baseline.build.log'}")
        log(f"built in {time.monotonic() - t0:.0f} s")
        if not args.no_baseline:
            baseline(runner, mutants)
        for i, m in enumerate(mutants, 1):
            log(f"[{i}/{len(mutants)}] {m['id']} ({m['file']}) ...")
            r = run_mutant(runner, m, args.all_checks)
            results.append(r)
            extra = r["killed_by"] or r["detail"] or ""
            log(f"[{i}/{len(mutants)}] {m['id']}: {r['status'].upper()}" + (f" by {extra}" if r["status"] == "killed"
                else (f": {extra}" if extra else "")) + f" ({r['seconds']:.0f} s)")
            if r["status"] == "survived" and not args.keep_going:
                log("stopping at the first survivor (--no-keep-going)")
                break
    except UsageError as e:
        print(f"run.py: error: {e}", file=sys.stderr)
        return 2
    except SetupError as e:
        log(f"run.py: error: {e}")
        out = summary(results)
        out["error"] = str(e)
        emit(out, args.json)
        return 3
    except KeyboardInterrupt:
        log("interrupted; the scratch file was restored")
        return 130

    out = summary(results)
    log(f"killed {out['killed']}, survived {out['survived']}, invalid {out['invalid']}, "
        f"build errors {out['build_errors']}; kill rate "
        + ("n/a" if out["kill_rate"] is None else f"{out['kill_rate']:.1%}"))
    survivors = [r["id"] for r in results if r["status"] == "survived"]
    if survivors:
        log("survivors (a test gap, or an equivalent mutant): " + ", ".join(survivors))
    if out["invalid"] or out["build_errors"]:
        log("note: invalid / build-error mutants need their 'find' or 'replace' updated in mutants.json")
    emit(out, args.json)
    return 0 if out["kill_rate"] is not None and out["kill_rate"] >= KILL_RATE_GOAL else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
