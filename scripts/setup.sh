#!/usr/bin/env bash
# Installs what llama4d needs from Debian's apt, idempotently: packages already present are
# not touched, and apt-get runs only when something is missing. Works as root or through sudo.
#   scripts/setup.sh          what the build, the CLI and scripts/main.sh need (compilers, the
#                             libraries, Open MPI for mpirun, OpenBLAS as bench's yardstick)
#   scripts/setup.sh test     that, and what only the test suite uses: PyTorch (the reference
#                             model and bench/compare_torch.sh), the notebooks' tools, venv
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libcli11-dev libgtest-dev nlohmann-json3-dev libpcre2-dev libtomlplusplus-dev
  libopenmpi-dev openmpi-bin
  libopenblas0-pthread
)
case "${1:-}" in
  "") ;;
  test) packages+=(python3-torch python3-numpy python3-matplotlib jupyter-nbconvert python3-ipykernel python3-venv) ;;
  *) echo "setup: unknown argument '$1' (none, or test)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "setup: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
