#!/usr/bin/env python3
"""llama4d generate against Hugging Face transformers' generate on the same model directory, on
the CPU: tokens per second of a greedy continuation (prompt prefill + new tokens, the model's
load not counted), both in fp32, and whether the two picked the same tokens.

    bench/generate_vs_transformers.py [--model DIR] [--new-tokens 64] [--threads 2] [--json]

Without --model it writes a Llama-3.2-1B-shaped directory with transformers (hidden 2048, 16
layers, 32/8 heads, FFN 8192, vocab 128256, tied embeddings, rope_scaling llama3 factor 32;
random weights from a fixed seed, away from near-tie logits, stored as bf16: 2.5 GB) with the project's tokenizer
(data/tokenizer: 4,096 ids, a padded embedding as the README allows) under --work. With --model,
any Llama 3.x directory (a download of Llama-3.2-1B, say).

Runs with tests/transformers' environment (transformers 4.57.6, torch 2.15):
    PY=$(scripts/python_env.sh tests/transformers/requirements.txt)
    $PY bench/generate_vs_transformers.py
Each side runs once, cold (no warm-up call): one process for llama4d, one generate() call for
transformers after its load. Both compute in fp32 on --threads threads.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Pipeline parallelism cuts the layers of a model into stages, and each stage"


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_model(out: Path, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = json.load(open(ROOT / "data/tokenizer/tokenizer.json"))
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                      bos_token_id=ids["<|begin_of_text|>"],
                      eos_token_id=[ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]])
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    # Away from transformers' N(0, 0.02) initialisation, whose nearly flat logits make greedy
    # choices near-ties that rounding differences flip: norm gains around 1, wider matrices.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g) if name.endswith("norm.weight")
                    else 0.05 * torch.randn(p.shape, generator=g))
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "data/tokenizer" / f, out / f)


def run_llama4d(binary: str, model: Path, new: int, threads: int):
    cmd = [binary, "generate", "--checkpoint", str(model), "--prompt", PROMPT, "--max-new-tokens", str(new),
           "--threads", str(threads), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llama4d generate failed ({r.returncode}): {r.stderr.strip()}")
    j = json.loads(r.stdout)
    return {"tokens_per_s": j["tokens_per_s"], "tokens": j["tokens"], "prompt_tokens": j["prompt_tokens"],
            "command": " ".join(cmd)}


def run_transformers(model: Path, new: int, threads: int):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    lm.eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    # llama4d emits only ids its tokenizer names (an embedding padded past them has rows no token
    # names): the same rule here, so both pick among the same logits.
    padded = list(range(len(tokenizer), lm.config.vocab_size))
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                          suppress_tokens=padded or None,
                          pad_token_id=tokenizer.convert_tokens_to_ids("<|end_of_text|>"))
        seconds = time.perf_counter() - t0
    tokens = out[0, ids.shape[1]:].tolist()
    return {"tokens_per_s": len(tokens) / seconds, "tokens": tokens, "prompt_tokens": int(ids.shape[1]),
            "torch": torch.__version__, "transformers": transformers.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a Llama 3.x model directory (default: write a 1B-shaped one)")
    ap.add_argument("--work", default="/tmp/llama4d-generate-bench", help="where the written model goes")
    ap.add_argument("--binary", default=str(ROOT / "build/release/bin/llama4d"))
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    if a.new_tokens < 1 or a.threads < 1:
        print("--new-tokens and --threads must be >= 1", file=sys.stderr)
        return 2
    if not os.access(a.binary, os.X_OK):
        print(f"no llama4d binary at {a.binary} (scripts/build.sh release, or --binary)", file=sys.stderr)
        return 2
    model = Path(a.model) if a.model else Path(a.work) / "llama3.2-1b-shape"
    if a.model and not (model / "config.json").is_file():
        print(f"--model {model}: no config.json", file=sys.stderr)
        return 2
    if not a.model and not (model / "config.json").is_file():
        print(f"writing a Llama-3.2-1B-shaped directory to {model} ...", file=sys.stderr)
        write_model(model, a.seed)
    ours = run_llama4d(a.binary, model, a.new_tokens, a.threads)
    theirs = run_transformers(model, a.new_tokens, a.threads)
    same = ours["tokens"] == theirs["tokens"]
    agree = next((i for i, (x, y) in enumerate(zip(ours["tokens"], theirs["tokens"])) if x != y), len(ours["tokens"]))
    result = {"model": str(model), "new_tokens": a.new_tokens, "threads": a.threads, "prompt_tokens": ours["prompt_tokens"],
              "llama4d_tokens_per_s": ours["tokens_per_s"], "transformers_tokens_per_s": theirs["tokens_per_s"],
              "ratio": ours["tokens_per_s"] / theirs["tokens_per_s"], "same_tokens": same, "tokens_agreeing": agree,
              "prompt_tokens_equal": ours["prompt_tokens"] == theirs["prompt_tokens"], "torch": theirs["torch"],
              "transformers": theirs["transformers"], "cpu": cpu_name(), "cores": os.cpu_count(),
              "llama4d_command": ours["command"]}
    if a.json:
        print(json.dumps(result))
    else:
        print(f"llama4d:      {ours['tokens_per_s']:8.2f} tokens/s")
        print(f"transformers: {theirs['tokens_per_s']:8.2f} tokens/s  (torch {theirs['torch']}, "
              f"transformers {theirs['transformers']})")
        print(f"ratio:        {result['ratio']:.2f}x   same greedy tokens: {same} ({agree} of {a.new_tokens} agree)")
        print(f"on {result['cpu']}, {a.threads} threads, {ours['prompt_tokens']} prompt tokens, fp32")
    return 0 if result["prompt_tokens_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
