#!/usr/bin/python3
"""An independent PyTorch Llama, the golden reference for llama4d's hand-written model.

Follows Hugging Face transformers' LlamaForCausalLM semantics (written from its documented
architecture, not copied): token embedding; per layer RMSNorm -> q/k/v projections ->
rotate-half RoPE -> grouped-query causal attention (kv heads repeated) -> o_proj -> residual;
RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; lm_head (or the tied embedding); mean
cross-entropy over targets that are not ignored.

Usage: torch_llama.py DIR [DIR ...]
Each DIR holds what llama4d wrote:
  config.json          Hugging Face LlamaConfig keys; the model's shape is built from it
  model.safetensors    parameters under HF names; their stored dtype (F32 or F64) is the
                       precision the reference computes in
  batch.safetensors    "tokens" and "targets", I32 [B, T]; a target of -1 is ignored
and receives torch_reference.safetensors:
  "loss" [1]              mean cross-entropy over counted targets
  "logits" [B, T, V]
  "grad.<name>"           d(loss)/d(parameter) for every parameter in model.safetensors
Exits non-zero with a one-line message on any inconsistency (missing config key, unknown
tensor, shape mismatch), so the C++ driver reports it.

Targets are next-token targets already aligned with the tokens (targets[b, t] is what
position t predicts). transformers' LlamaForCausalLM instead takes `labels` equal to the
tokens and shifts them by one inside its loss; here the shift has been done by the caller, so
logits[b, t] is scored against targets[b, t] directly.

Deliberate differences from transformers, all about precision, not semantics: RoPE angles
and RMSNorm statistics are computed in the run's dtype (transformers computes them in fp32,
which would cap an fp64 comparison at fp32 accuracy), and the llama3 frequency scaling is done
in fp64 before casting.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(2)

# ---- safetensors: [u64 LE header length N][N bytes JSON header][raw little-endian data] -------

_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
       "U8": np.uint8}
_NAME = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.int32): "I32",
         np.dtype(np.int64): "I64"}


def fail(msg):
    sys.stderr.write("torch_llama.py: " + msg + "\n")
    sys.exit(1)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        fail(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        fail(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out, dtypes = {}, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        chunk = data[begin:end]
        if dt == "BF16":  # the top half of an IEEE float
            bits = np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif dt in _NP:
            arr = np.frombuffer(chunk, dtype=np.dtype(_NP[dt]).newbyteorder("<"))
        else:
            fail(f"{path}: tensor {name} has unsupported dtype {dt}")
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            fail(f"{path}: tensor {name} holds {arr.size} elements, shape {list(shape)} needs more/less")
        out[name] = arr.reshape(shape).copy()
        dtypes[name] = dt
    return out, dtypes


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        b = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _NAME[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)  # keep the data 8-byte aligned, as the reference writer does
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ---- the model ---------------------------------------------------------------------------------

def need(cfg, key):
    if key not in cfg:
        fail(f"config.json lacks key '{key}' that transformers' LlamaConfig needs")
    return cfg[key]


def inverse_frequencies(cfg, hd):
    """inv_freq[i] = theta^(-2i/hd), then Llama 3.1 'llama3' rope_scaling if configured."""
    theta = float(need(cfg, "rope_theta"))
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = cfg.get("rope_scaling")
    if rs is None:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return inv
    if kind != "llama3":
        fail(f"rope_scaling type {kind!r} is not modelled here")
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_len = float(rs["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    # Long wavelengths are slowed down by `factor`, short ones kept as they are ...
    scaled = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    # ... and the band in between is a blend of the two, weighted by old_len / wavelen.
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps, dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n, dtype=dtype))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def linear(n_in, n_out, dtype):
    return torch.nn.Linear(n_in, n_out, bias=False, dtype=dtype)


# Whether scaled_dot_product_attention reads grouped kv heads itself (enable_gqa, PyTorch 2.5+).
SDPA_GROUPS_HEADS = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


class Attention(torch.nn.Module):
    # attention: "eager" (the scores written out, softmax, weighted sum: the reference's) or
    # "sdpa" (torch's scaled_dot_product_attention, for benchmarks; it reads the grouped kv heads
    # without copies where the PyTorch is recent enough).
    def __init__(self, C, nh, nkv, hd, dtype, attention="eager"):
        super().__init__()
        self.nh, self.nkv, self.hd, self.attention = nh, nkv, hd, attention
        self.q_proj = linear(C, nh * hd, dtype)
        self.k_proj = linear(C, nkv * hd, dtype)
        self.v_proj = linear(C, nkv * hd, dtype)
        self.o_proj = linear(nh * hd, C, dtype)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)   # [B, nh, T, hd]
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA: query head h reads kv head h // (nh / nkv); repeat each kv head that many times.
        rep = self.nh // self.nkv
        if self.attention == "sdpa" and SDPA_GROUPS_HEADS:
            return self.o_proj(self.sdpa(q, k, v, enable_gqa=rep > 1))
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if self.attention == "sdpa":
            return self.o_proj(self.sdpa(q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.hd)             # [B, nh, T, T]
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=scores.device), diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v                           # [B, nh, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))

    def sdpa(self, q, k, v, **kwargs):
        """torch's fused causal attention, [B, nh, T, hd] back to [B, T, nh * hd]."""
        B, _, T, _ = q.shape
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
        return out.transpose(1, 2).reshape(B, T, self.nh * self.hd)


class MLP(torch.nn.Module):
    def __init__(self, C, I, dtype):
        super().__init__()
        self.gate_proj = linear(C, I, dtype)
        self.up_proj = linear(C, I, dtype)
        self.down_proj = linear(I, C, dtype)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(torch.nn.Module):
    def __init__(self, C, I, nh, nkv, hd, eps, dtype, attention="eager"):
        super().__init__()
        self.input_layernorm = RMSNorm(C, eps, dtype)
        self.self_attn = Attention(C, nh, nkv, hd, dtype, attention)
        self.post_attention_layernorm = RMSNorm(C, eps, dtype)
        self.mlp = MLP(C, I, dtype)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(torch.nn.Module):
    """Named `model` inside LlamaForCausalLM, so parameter names match HF's."""

    def __init__(self, cfg, dtype, attention="eager"):
        super().__init__()
        V, C = need(cfg, "vocab_size"), need(cfg, "hidden_size")
        nh = need(cfg, "num_attention_heads")
        nkv = cfg.get("num_key_value_heads") or nh
        hd = cfg.get("head_dim") or C // nh
        I, L = need(cfg, "intermediate_size"), need(cfg, "num_hidden_layers")
        eps = float(need(cfg, "rms_norm_eps"))
        if nh % nkv:
            fail(f"num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}")
        self.embed_tokens = torch.nn.Embedding(V, C, dtype=dtype)
        self.layers = torch.nn.ModuleList(DecoderLayer(C, I, nh, nkv, hd, eps, dtype, attention) for _ in range(L))
        self.norm = RMSNorm(C, eps, dtype)
        self.hd = hd

    def forward(self, tokens, cos, sin):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LlamaForCausalLM(torch.nn.Module):
    # rope_positions: the RoPE tables for that many positions are made once, as buffers that move
    # with the model (what a benchmark wants: no host work per step); otherwise every forward
    # makes them for its own length.
    def __init__(self, cfg, dtype, attention="eager", rope_positions=None):
        super().__init__()
        for key, want in (("model_type", "llama"), ("hidden_act", "silu"), ("attention_bias", False),
                          ("mlp_bias", False)):
            if cfg.get(key, want) != want:
                fail(f"config.json {key}={cfg.get(key)!r}, this reference models only {want!r}")
        self.cfg = cfg
        self.dtype = dtype
        self.model = Backbone(cfg, dtype, attention)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = linear(need(cfg, "hidden_size"), need(cfg, "vocab_size"), dtype)
        self.max_pos = need(cfg, "max_position_embeddings")
        cos = sin = None
        if rope_positions is not None:
            if rope_positions > self.max_pos:
                fail(f"{rope_positions} positions exceed max_position_embeddings {self.max_pos}")
            cos, sin = self.rope_tables(rope_positions)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rope_tables(self, T):
        """cos and sin [T, hd] of the rotary angles, computed in fp64 and rounded to the model's dtype."""
        inv = inverse_frequencies(self.cfg, self.model.hd)
        angles = torch.outer(torch.arange(T, dtype=torch.float64), inv)     # [T, hd/2]
        emb = torch.cat((angles, angles), dim=-1)                            # [T, hd]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def forward(self, tokens):
        T = tokens.shape[1]
        if T > self.max_pos:
            fail(f"sequence of {T} tokens exceeds max_position_embeddings {self.max_pos}")
        if self.rope_cos is not None and T <= self.rope_cos.shape[0]:
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        else:
            cos, sin = (t.to(tokens.device) for t in self.rope_tables(T))
        n = self.model(tokens, cos, sin)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return n @ w.t()                                                     # [B, T, V]


def run(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    weights, stored = read_safetensors(os.path.join(d, "model.safetensors"))
    kinds = set(stored.values())
    if kinds not in ({"F32"}, {"F64"}):
        fail(f"{d}: expected all weights in F32 or all in F64, found {sorted(kinds)}")
    dtype = torch.float64 if kinds == {"F64"} else torch.float32

    model = LlamaForCausalLM(cfg, dtype)
    params = dict(model.named_parameters())  # a tied lm_head is not a separate parameter
    if set(params) != set(weights):
        fail(f"{d}: parameter names differ; missing {sorted(set(params) - set(weights))}, "
             f"unexpected {sorted(set(weights) - set(params))}")
    with torch.no_grad():
        for name, p in params.items():
            if tuple(p.shape) != weights[name].shape:
                fail(f"{d}: {name} has shape {list(weights[name].shape)}, config implies {list(p.shape)}")
            p.copy_(torch.from_numpy(weights[name]))

    batch, _ = read_safetensors(os.path.join(d, "batch.safetensors"))
    tokens = torch.from_numpy(batch["tokens"].astype(np.int64))
    targets = torch.from_numpy(batch["targets"].astype(np.int64))
    targets = torch.where(targets < 0, torch.full_like(targets, -100), targets)  # HF's ignore_index

    logits = model(tokens)
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100, reduction="mean")
    loss.backward()

    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    out = {"loss": np.array([loss.item()], dtype=np_dtype), "logits": logits.detach().numpy().astype(np_dtype)}
    for name, p in params.items():
        out["grad." + name] = p.grad.numpy().astype(np_dtype)
    write_safetensors(os.path.join(d, "torch_reference.safetensors"), out)
    print(f"{d}: {str(dtype)} loss {loss.item():.12g}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        fail("usage: torch_llama.py DIR [DIR ...]")
    for directory in sys.argv[1:]:
        run(directory)
