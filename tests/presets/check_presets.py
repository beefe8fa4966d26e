#!/usr/bin/env python3
"""Checks that the test presets' filters in CMakePresets.json can work.

CTest compiles a filter's name regex with CMake's own engine, which takes at most 9 parenthesised
groups: a regex with more is dropped without a word, and the preset then excludes nothing (the
sanitizer runs would silently grow past the CI budget). Each exclude regex must also compile and
use only what that engine knows (no lookaround, no non-greedy or counted repetition, no \\d).

  check_presets.py CMakePresets.json
"""
import json
import re
import sys

MAX_GROUPS = 9


def problems(name, regex):
    out = []
    groups = len(re.findall(r"(?<!\\)\(", regex))
    if groups > MAX_GROUPS:
        out.append(f"{name}: {groups} groups, CMake's regex engine takes at most {MAX_GROUPS}")
    for construct in ("(?", "*?", "+?", "{", "\\d", "\\w", "\\s"):
        if construct in regex:
            out.append(f"{name}: uses {construct!r}, which CMake's regex engine does not know")
    try:
        re.compile(regex)
    except re.error as e:
        out.append(f"{name}: does not compile: {e}")
    return out


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        presets = json.load(f)
    bad, checked = [], 0
    for p in presets.get("testPresets", []):
        for kind in ("include", "exclude"):
            flt = p.get("filter", {}).get(kind, {})
            for key in ("name", "label"):
                if key in flt:
                    checked += 1
                    bad += problems(f"testPresets {p['name']} filter.{kind}.{key}", flt[key])
    for b in bad:
        print(b)
    print(f"{checked} filter regexes checked, {len(bad)} problems")
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
