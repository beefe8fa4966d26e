#!/usr/bin/env python3
"""Checks that an executed notebook produced its figures: fails (exit 1) unless

* the executed .ipynb holds no error output and at least --images image/png outputs, each a PNG;
* every FILE given exists and is a PNG.

Usage: check_figures.py --images K EXECUTED.ipynb [FILE.png ...]
Standard library only (the test suite runs it with /usr/bin/python3 after jupyter-nbconvert --execute).
"""
import argparse
import base64
import json
import sys
from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIN_BYTES = 1000  # a blank or truncated image is smaller than any real figure


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, required=True, help="image/png outputs the notebook must hold, at least")
    ap.add_argument("notebook", type=Path)
    ap.add_argument("files", type=Path, nargs="*", help="figure files the notebook must have saved")
    args = ap.parse_args()

    problems = []
    nb = json.loads(args.notebook.read_text())
    pngs = 0
    for i, cell in enumerate(nb.get("cells", [])):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {i}: error output {out.get('ename')}: {out.get('evalue')}")
            data = out.get("data", {}).get("image/png")
            if data is None:
                continue
            raw = base64.b64decode("".join(data) if isinstance(data, list) else data)
            if not raw.startswith(PNG_MAGIC) or len(raw) < MIN_BYTES:
                problems.append(f"cell {i}: image/png output is not a PNG figure ({len(raw)} bytes)")
            else:
                pngs += 1
    if pngs < args.images:
        problems.append(f"{args.notebook}: {pngs} image/png output(s), expected at least {args.images} "
                        "(a non-inline backend such as Agg shows nothing)")
    for f in args.files:
        if not f.is_file():
            problems.append(f"{f}: figure not saved")
            continue
        head = f.read_bytes()
        if not head.startswith(PNG_MAGIC) or len(head) < MIN_BYTES:
            problems.append(f"{f}: not a PNG figure ({len(head)} bytes)")

    for p in problems:
        print("check_figures: FAIL:", p, file=sys.stderr)
    if problems:
        return 1
    print(f"check_figures: {args.notebook.name}: {pngs} inline figure(s); {len(args.files)} file(s) saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
