#!/usr/bin/env bash
# The GPU benchmark: `llama4d bench --device cuda --dtype bf16` against PyTorch on the same GPU,
# model and batch, for two Llama shapes, a small one and one of 1.5B parameters:
#   124m: hidden 768, 12 layers, 12 heads / 4 KV heads, FFN 2048, vocab 32000, seq 1024, batch 16
#   1.5b: hidden 2048, 16 layers, 32 heads / 8 KV heads, FFN 8192, vocab 128256, seq 2048, batch 4
# PyTorch runs the usual recipe (fp32 weights under bf16 autocast, scaled_dot_product_attention,
# fused AdamW), eager and with torch.compile (bench/torch_train_step.py). Each side's MFU uses
# llama4d's FLOPs per token (core/model/flops.h) against the peak llama4d's bench measured: the
# better of its own bf16 GEMM and cuBLAS's on 8192^3 products. llama4d's step queues its ops on
# the GPU's stream; on the small shape it also runs with every op waiting (--wait-every-op).
#   bench/gpu_benchmark.sh [path/to/llama4d]
# Environment: PYTHON (default python3: an interpreter whose PyTorch sees the GPU); SHAPES (default
# "124m 1.5b"); COMPILE=0 skips torch.compile; OUT (default a temporary directory) keeps each
# run's JSON; CONFIGS_ONLY=1 writes each shape's config.json to OUT ($OUT/<shape>.json) and stops.
# Prints a table, then one JSON object as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/release/bin/llama4d}
python=${PYTHON:-python3}
read -ra shapes <<< "${SHAPES:-124m 1.5b}"
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"

# config.json of a shape, in Hugging Face's Llama format: name hidden layers heads kv_heads ffn vocab.
write_config() {
  cat > "$out/$1.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
 "attention_bias": false, "mlp_bias": false, "tie_word_embeddings": false,
 "hidden_size": $2, "num_hidden_layers": $3, "num_attention_heads": $4, "num_key_value_heads": $5,
 "head_dim": $(( $2 / $4 )), "intermediate_size": $6, "vocab_size": $7,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
 "bos_token_id": 1, "eos_token_id": 2}
EOF
}

for shape in "${shapes[@]}"; do
  case "$shape" in
    124m) write_config 124m 768 12 12 4 2048 32000; batch=16 seq=1024 ;;
    1.5b) write_config 1.5b 2048 16 32 8 8192 128256; batch=4 seq=2048 ;;
    *) echo "gpu_benchmark.sh: unknown shape '$shape' (124m, 1.5b)" >&2; exit 2 ;;
  esac
  cfg="$out/$shape.json"
  [ "${CONFIGS_ONLY:-0}" = 1 ] && continue
  rm -f "$out/$shape".*.json  # no result of an earlier run is reported as this one's
  "$bin" bench --device cuda --dtype bf16 --config "$cfg" --batch-size "$batch" --seq-len "$seq" --json \
    > "$out/$shape.llama4d.json"
  # What the per-op wait of training costs: the same step with every op waiting (small shape only).
  if [ "$shape" = 124m ]; then
    "$bin" bench --device cuda --dtype bf16 --config "$cfg" --batch-size "$batch" --seq-len "$seq" --wait-every-op \
      --json > "$out/$shape.llama4d_wait_every_op.json"
  fi
  "$python" bench/torch_train_step.py "$cfg" --device cuda --dtype bf16 --attention sdpa \
    --batch-size "$batch" --seq-len "$seq" --json > "$out/$shape.torch_eager.json"
  if [ "${COMPILE:-1}" != 0 ]; then
    "$python" bench/torch_train_step.py "$cfg" --device cuda --dtype bf16 --attention sdpa --compile \
      --batch-size "$batch" --seq-len "$seq" --json > "$out/$shape.torch_compiled.json"
  fi
done

[ "${CONFIGS_ONLY:-0}" = 1 ] && exit 0

# The table, by the same interpreter (any Python 3 reads JSON).
"$python" - "$out" "${shapes[@]}" <<'PY'
import json, os, sys
out, shapes = sys.argv[1], sys.argv[2:]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
rows = {}
print(f"{'shape':6} {'run':21} {'tokens/s':>10} {'MFU':>6}  llama4d / run")
for shape in shapes:
    ours = load(f"{shape}.llama4d.json")
    peak, flops = ours["peak_gemm_flops_per_s"], ours["flops_per_token"]
    rows[shape] = {"llama4d": ours, "peak_gemm_flops_per_s": peak, "gemm": ours["gemm"]}
    for run in ("llama4d", "llama4d_wait_every_op", "torch_eager", "torch_compiled"):
        r = load(f"{shape}.{run}.json")
        if r is None:
            continue
        tps = r["tokens_per_s"]
        rows[shape][run] = r
        rows[shape][run + "_mfu"] = tps * flops / peak
        ratio = ours["tokens_per_s"] / tps
        print(f"{shape:6} {run:21} {tps:10.0f} {100 * tps * flops / peak:5.1f}%  {ratio:.2f}x")
    g = ours["gemm"]
    print(f"{shape:6} peak {peak / 1e12:.0f} TFLOP/s: llama4d's GEMM {g['llama4d_flops_per_s'] / 1e12:.0f}, "
          f"reference {(g['reference_flops_per_s'] or 0) / 1e12:.0f}")
print(json.dumps(rows))
PY
