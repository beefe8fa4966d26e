#!/usr/bin/env bash
# The tests' Python: a virtual environment with exactly tests/requirements.txt, made with
# `python3 -m venv` (Debian's python3-venv) and pip from PyPI. Prints the path of its python on
# stdout (everything else goes to stderr), so:
#   cmake --preset release -DLLAMA4D_TEST_PYTHON="$(scripts/python_env.sh)"
# Another requirements file as the argument makes a separate environment beside it, named after
# the file's directory: scripts/python_env.sh tests/transformers/requirements.txt makes
# .../llama4d/venv-transformers (PyTorch and transformers, 5.6 GB: kept out of the default one).
# Idempotent: the environment lives in ${XDG_CACHE_HOME:-$HOME/.cache}/llama4d/venv
# (LLAMA4D_VENV overrides the place) and is made again only when requirements.txt has changed
# since (its sha256 is kept inside) or a previous install did not finish. A lock keeps two
# builds from installing into it at once.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req=$root/tests/requirements.txt
name=venv
if [ $# -gt 0 ]; then
  req=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  [ "$req" = "$root/tests/requirements.txt" ] || name=venv-$(basename "$(dirname "$req")")
fi
[ -f "$req" ] || { echo "python_env: no requirements file $req" >&2; exit 2; }
venv=${LLAMA4D_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/llama4d/$name}
want=$(sha256sum "$req" | cut -d' ' -f1)
stamp=$venv/.llama4d-requirements-sha256

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "python_env: making $venv from $req" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req" >&2
  echo "$want" >"$stamp"  # written last: an interrupted install is redone next time
fi
echo "$venv/bin/python"
