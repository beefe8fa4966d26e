#!/usr/bin/env bash
# The main job: installs and builds what it needs, trains the `small` Llama on 4 virtual GPUs
# with ZeRO-3 (FSDP) on the shipped corpus, evaluates and samples the result, and ends with the
# equivalence report: the same strategy against one device, tensor by tensor, bit for bit.
#   scripts/main.sh [extra flags for `llama4d train`, e.g. --steps 100]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release
bin=build/release/bin/llama4d
out=runs/main
rm -rf "$out"
mkdir -p "$out"

echo "=== train: small on 4 virtual GPUs, ZeRO-3"
"$bin" train --preset small --mesh dp=4 --zero 3 --steps 300 --eval-every 100 --out "$out" --trace "$out/trace.json" "$@"

echo "=== eval: first 64 windows of the corpus (training text; the held-out loss is val_loss above)"
"$bin" eval --checkpoint "$out/checkpoint" --max-windows 64

echo "=== sample"
"$bin" generate --checkpoint "$out/checkpoint" --prompt "Data parallelism " --max-new-tokens 160 \
  --temperature 0.8 --top-p 0.95 --seed 1

echo "=== equivalence: ZeRO-3 on 4 virtual GPUs vs one device"
"$bin" verify --preset small --mesh dp=4 --zero 3 --steps 3 --seq-len 128
