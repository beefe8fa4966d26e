#!/usr/bin/env bash
# The tests' Python: a virtual environment with exactly tests/requirements.txt, made with
# `python3 -m venv` (Debian's python3-venv) and pip from PyPI. Prints the path of its python on
# stdout (everything else goes to stderr), so:
#   cmake --preset release -DLLAMA4D_TEST_PYTHON="$(scripts/python_env.sh)"
# Another requirements file as the argument makes a separate environment beside it, named after
# the file's directory: scripts/python_env.sh tests/transformers/requirements.txt makes
# .../llama4d/venv-transformers (PyTorch and transformers, 2.2 GB: kept out of the default one).
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

# Two directives a requirements file may carry, each a line of its own:
#   "# python_env.sh: --no-deps"  the file pins every package; pip installs exactly those.
#   "# python_env.sh: cuda-toolkit-libraries"  the packages load NVIDIA libraries the CUDA
#      toolkit has (${CUDA_HOME:-/usr/local/cuda}/lib64): the printed python is a wrapper,
#      bin/python-cuda, that puts that folder on LD_LIBRARY_PATH. A toolkit without libcudart
#      is exit 2 naming the folder.
pip_options=()
grep -qx '# python_env.sh: --no-deps' "$req" && pip_options+=(--no-deps)
python=$venv/bin/python
cuda_lib=""
if grep -qx '# python_env.sh: cuda-toolkit-libraries' "$req"; then
  cuda_lib=${CUDA_HOME:-/usr/local/cuda}/lib64
  if ! compgen -G "$cuda_lib/libcudart.so.*" >/dev/null; then
    echo "python_env: $req needs the CUDA toolkit's libraries, and $cuda_lib has no libcudart.so (install the CUDA 13 toolkit or set CUDA_HOME)" >&2
    exit 2
  fi
  python=$venv/bin/python-cuda
  want=$(printf '%s %s' "$want" "$cuda_lib" | sha256sum | cut -d' ' -f1)
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ ! -x "$python" ] || [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "python_env: making $venv from $req" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${pip_options[@]}" -r "$req" >&2
  if [ -n "$cuda_lib" ]; then
    cat >"$python" <<WRAPPER
#!/bin/sh
# $venv's python with the CUDA toolkit's libraries on the loader's path (scripts/python_env.sh).
LD_LIBRARY_PATH=$cuda_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec "$venv/bin/python" "\$@"
WRAPPER
    chmod +x "$python"
    "$python" -c 'import torch, transformers' >&2 ||
      { echo "python_env: $venv was installed from $req, but torch or transformers does not import (above)" >&2; exit 1; }
  fi
  echo "$want" >"$stamp"  # written last: an interrupted install is redone next time
fi
echo "$python"
