#!/usr/bin/env bash
# The main job: installs and builds what it needs, trains the `small` Llama on the shipped
# corpus, evaluates it on the held-out split and samples from it.
#   scripts/main.sh [extra flags for `llama4d train`]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release
bin=build/release/bin/llama4d
out=runs/main
rm -rf "$out"
"$bin" train --preset small --steps 300 --out "$out" "$@"
"$bin" eval --checkpoint "$out/checkpoint" --max-windows 64
"$bin" generate --checkpoint "$out/checkpoint" --prompt "Data parallelism " --max-new-tokens 160 --temperature 0.8 --top-p 0.95 --seed 1
