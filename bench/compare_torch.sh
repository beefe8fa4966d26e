#!/usr/bin/env bash
# Times a full training step of a preset (`small` by default: batch 8 x 256 tokens, 2 threads)
# in llama4d and in PyTorch on the same config and prints both and their ratio (target: llama4d
# >= 1.5x PyTorch).
#   bench/compare_torch.sh [path/to/llama4d]
# Environment: THREADS (default 2) for both; PRESET (default small); PYTHON (default Debian's
# /usr/bin/python3; point it at another interpreter to compare with a current PyTorch); ATTENTION
# (default eager; sdpa, PyTorch 2's scaled_dot_product_attention, needs PyTorch 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/release/bin/llama4d}
threads=${THREADS:-2}
preset=${PRESET:-small}
python=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The preset's config.json, written the way every checkpoint is.
"$bin" train --preset "$preset" --steps 1 --batch-size 1 --eval-every 0 --out "$tmp/run" > /dev/null 2>&1
ours=$("$bin" bench --preset "$preset" --threads "$threads" --json)
theirs=$("$python" bench/torch_train_step.py "$tmp/run/checkpoint/config.json" --threads "$threads" \
  --attention "${ATTENTION:-eager}" --json)
/usr/bin/python3 - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"llama4d: {ours['tokens_per_s']:8.0f} tokens/s  ({ours['step_seconds_median']*1e3:.0f} ms/step, "
      f"{100*ours['fraction_of_peak']:.0f}% of measured peak GEMM {ours['peak_gemm_flops_per_s']/1e9:.1f} GFLOP/s)")
print(f"pytorch: {theirs['tokens_per_s']:8.0f} tokens/s  ({theirs['step_seconds_median']*1e3:.0f} ms/step, torch {theirs['torch']})")
print(f"ratio:   {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x")
print(json.dumps({"llama4d": ours, "pytorch": theirs, "ratio": ours["tokens_per_s"] / theirs["tokens_per_s"]}))
PY
