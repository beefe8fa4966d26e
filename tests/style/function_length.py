#!/usr/bin/env python3
"""No function in the code a learner reads top to bottom is longer than the limit.

  function_length.py <source root> <max lines> <dir> [<dir> ...]

Lines are lizard's `length` of a function (from its signature to its closing brace). Prints every
function over the limit with its file and line, and exits 1 if there is one.
"""
import sys

import lizard


def main():
    root, limit, dirs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    paths = [f"{root}/{d}" for d in dirs]
    long = []
    count = 0
    for info in lizard.analyze(paths, exts=lizard.get_extensions([])):
        for f in info.function_list:
            count += 1
            if f.length > limit:
                long.append(f"{info.filename}:{f.start_line}: {f.name} is {f.length} lines (limit {limit})")
    for line in long:
        print(line)
    print(f"{count} functions read, {len(long)} over {limit} lines")
    return 1 if long or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
