#!/usr/bin/env python3
"""PyTorch reference for tests/optim/test_adamw_torch.cpp.

Runs torch.optim.AdamW (betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on one group and 0.0 on
the no-decay group, foreach=False) on float64 tensors the test wrote, and writes the results back.

usage: adamw_torch_reference.py INPUT OUTPUT

INPUT, little-endian:
  int64 n_tensors, int64 n_steps
  n_tensors x (int64 numel, int64 decay)      tensors in flat-buffer order
  float64 lr[n_steps]
  float64 params[total]
  float64 grads[n_steps][total]
OUTPUT, float64: params[total], exp_avg[total], exp_avg_sq[total] (flat order), then step count.

Exits with status 3 when torch (or numpy) cannot be imported, so the test can skip.
"""
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # the C++ test turns status 3 into GTEST_SKIP
    print(f"torch unavailable: {e}", file=sys.stderr)
    sys.exit(3)


def main(input_path, output_path):
    with open(input_path, "rb") as f:
        data = f.read()
    n_tensors, n_steps = struct.unpack_from("<qq", data, 0)
    offset = 16
    layout = []
    for _ in range(n_tensors):
        numel, decay = struct.unpack_from("<qq", data, offset)
        offset += 16
        layout.append((numel, bool(decay)))
    total = sum(numel for numel, _ in layout)

    values = np.frombuffer(data, dtype="<f8", offset=offset).copy()
    assert values.size == n_steps + total + n_steps * total, "input size does not match header"
    lrs = values[:n_steps]
    params = values[n_steps:n_steps + total]
    grads = values[n_steps + total:].reshape(n_steps, total)

    tensors, starts = [], []
    start = 0
    for numel, _ in layout:
        tensors.append(torch.nn.Parameter(torch.from_numpy(params[start:start + numel].copy())))
        starts.append(start)
        start += numel
    decay = [t for t, (_, d) in zip(tensors, layout) if d]
    no_decay = [t for t, (_, d) in zip(tensors, layout) if not d]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=float(lrs[0]), betas=(0.9, 0.95), eps=1e-8, foreach=False)

    for s in range(n_steps):
        for group in opt.param_groups:
            group["lr"] = float(lrs[s])
        for t, begin, (numel, _) in zip(tensors, starts, layout):
            t.grad = torch.from_numpy(grads[s, begin:begin + numel].copy())
        opt.step()

    out = []
    for key in ("param", "exp_avg", "exp_avg_sq"):
        for t in tensors:
            out.append((t if key == "param" else opt.state[t][key]).detach().numpy())
    steps = float(opt.state[tensors[0]]["step"])
    with open(output_path, "wb") as f:
        f.write(np.concatenate(out + [np.array([steps])]).astype("<f8").tobytes())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2])
