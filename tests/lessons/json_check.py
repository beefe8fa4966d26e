#!/usr/bin/env python3
"""A lesson's --json run, checked: stdout must be exactly one JSON object for which CHECK holds.

  json_check.py --check EXPR BIN ARG...

Runs BIN ARG... --json with stdin /dev/null (so --step never waits). EXPR is a Python expression
over `j` (the object), `ids` (the set of its exercises' ids) and `ok` (the run passed and every
exercise with it); it must be true. On failure, prints what was read and the expression.
"""
import argparse
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", required=True)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    p = subprocess.run([*a.command, "--json"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(f"exit {p.returncode}\n{p.stderr[-4000:]}")
        return 1
    try:
        j = json.loads(p.stdout)  # one object and nothing else: json.loads refuses trailing text
    except json.JSONDecodeError as e:
        print(f"stdout is not one JSON object: {e}\n{p.stdout[:2000]}")
        return 1
    if not isinstance(j, dict):
        print(f"stdout is JSON but not an object: {p.stdout[:200]}")
        return 1
    ids = {e["id"] for e in j.get("exercises", [])}
    ok = bool(j.get("passed")) and all(e["pass"] for e in j.get("exercises", []))
    if not eval(a.check, {}, {"j": j, "ids": ids, "ok": ok}):
        failed = [e["id"] for e in j.get("exercises", []) if not e["pass"]]
        print(f"check failed: {a.check}\npassed: {j.get('passed')}; exercises failed: {failed}; ids: {sorted(ids)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
