#!/usr/bin/python3
"""PyTorch baseline for `llama4d bench`: the same model, config and batch, one full training
step (forward, cross-entropy, backward, gradient clipping, AdamW) timed the same way.

The model is the independent PyTorch Llama of the test suite (tests/torch/torch_llama.py), built
from a Hugging Face config.json. Run by Debian's /usr/bin/python3; install libopenblas0-pthread
first, or PyTorch falls back to a very slow reference BLAS. On a GPU (--device cuda) it is the
usual PyTorch recipe for bf16 training: fp32 weights under bf16
autocast (--dtype bf16), scaled_dot_product_attention (--attention sdpa; grouped kv heads read
in place on PyTorch 2.5+), fused AdamW, and optionally torch.compile (--compile); the step is
timed after torch.cuda.synchronize. The RoPE tables are made once, on the device, before timing.

Usage: torch_train_step.py CONFIG_JSON [--batch-size 8] [--seq-len 256] [--threads 2]
                           [--device cpu|cuda] [--dtype f32|bf16] [--attention eager|sdpa]
                           [--compile] [--warmup 2] [--iters 5] [--json]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "torch"))
from torch_llama import LlamaForCausalLM  # noqa: E402


def fail(msg):
    """Bad input: a message naming it, exit 2."""
    sys.stderr.write("torch_train_step.py: " + msg + "\n")
    sys.exit(2)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="bf16: autocast over fp32 weights")
    p.add_argument("--attention", choices=["eager", "sdpa"], default="eager")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but torch sees no GPU")
    if a.attention == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        fail(f"--attention sdpa needs PyTorch 2.0 or later (this is {torch.__version__})")
    device = torch.device(a.device)
    with open(a.config) as f:
        cfg = json.load(f)
    model = LlamaForCausalLM(cfg, torch.float32, a.attention, rope_positions=a.seq_len).to(device)
    with torch.no_grad():
        for name, w in model.named_parameters():
            if w.dim() == 1:
                w.fill_(1.0)
            else:
                w.normal_(0.0, 0.02)
    decay = [w for w in model.parameters() if w.dim() > 1]
    no_decay = [w for w in model.parameters() if w.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if a.device == "cuda" else {}))
    V = cfg["vocab_size"]
    tokens = torch.randint(0, min(V, 256), (a.batch_size, a.seq_len), device=device)
    targets = torch.randint(0, min(V, 256), (a.batch_size, a.seq_len), device=device)
    forward = torch.compile(model) if a.compile else model

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    def step():
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = forward(tokens)
            loss = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        return time.perf_counter() - t0

    for _ in range(a.warmup):
        step()
    times = sorted(step() for _ in range(a.iters))
    median = times[len(times) // 2]
    result = {"tokens_per_s": a.batch_size * a.seq_len / median, "step_seconds_median": median,
              "step_seconds": times, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "blas": torch.__config__.show().count("BLAS"), "device": a.device, "dtype": a.dtype,
              "attention": a.attention, "compile": a.compile,
              "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None}
    if a.json:
        print(json.dumps(result))
    else:
        where = result["gpu"] if a.device == "cuda" else f"{a.threads} threads"
        print(f"pytorch {torch.__version__}, {where}, {a.dtype}, {a.attention}{', compiled' if a.compile else ''}: "
              f"step {median*1e3:.1f} ms, {result['tokens_per_s']:.0f} tokens/s")


if __name__ == "__main__":
    main()
