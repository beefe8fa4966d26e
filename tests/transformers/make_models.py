#!/usr/bin/env python3
"""Tiny random Llama 3.x models written by Hugging Face transformers, with transformers' answers,
for the C++ tests to compare llama4d against (transformers_reference_test.cpp).

    python make_models.py --source <repository root> --out <directory>

Into --out, one directory per case, each a model directory as transformers' save_pretrained
writes it (config.json, safetensors, generation_config.json), with the project's tokenizer
(data/tokenizer: tokenizer.json and tokenizer_config.json) beside it:
  llama3_0       Llama 3.0's shape: no RoPE scaling, untied, fp32
  llama3_1       rope_scaling "llama3" (factor 8, as 3.1 and 3.3), untied, fp32
  llama3_2_tied  tie_word_embeddings (as 3.2 1B and 3B), rope_scaling factor 32, fp32
  bf16           as llama3_1, weights stored as bfloat16
  sharded        as llama3_1, in several safetensors files with model.safetensors.index.json
and in each, reference.safetensors:
  input_ids [T]  I32, the prompt (with <|begin_of_text|>)
  logits [T, V]  F32, transformers' logits of the prompt, computed in fp32
  greedy [32]    I32, transformers' generate(do_sample=False) continuation, no stopping
Plus chat.json: conversations and apply_chat_template(add_generation_prompt=True)'s ids, for
Llama 3.2's template (the project's) with a fixed date, for Llama 3.0's template, and for Llama
3.1's (tests/tokenizer/llama3.1_chat_template.jinja) with no date given: its own "26 Jul 2024".

Deterministic: weights from torch.manual_seed; the models are moved away from transformers'
N(0, 0.02) initialisation (norm gains around 1, larger matrices) so that logits are spread and
greedy choices are not near-ties.
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

torch.set_num_threads(2)

BOS, EOT_ID, END_OF_TEXT, EOM = 3840, 3849, 3841, 3848
PROMPT = "Pipeline parallelism cuts the layers into stages; each stage"
LLAMA3_0_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def config(**overrides):
    base = dict(vocab_size=4096, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=BOS,
                eos_token_id=[END_OF_TEXT, EOM, EOT_ID], attention_bias=False, mlp_bias=False)
    base.update(overrides)
    return LlamaConfig(**base)


def scaling(factor):
    # original_max_position_embeddings small enough that the scaled band covers some of the
    # head's 8 frequencies: with theta 5e5 and hd 16 the wavelengths run from 6 to ~5e5.
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}


CASES = {
    "llama3_0": dict(cfg=dict(), dtype=torch.float32, shard=None),
    "llama3_1": dict(cfg=dict(rope_scaling=scaling(8.0)), dtype=torch.float32, shard=None),
    "llama3_2_tied": dict(cfg=dict(rope_scaling=scaling(32.0), tie_word_embeddings=True), dtype=torch.float32, shard=None),
    "bf16": dict(cfg=dict(rope_scaling=scaling(8.0)), dtype=torch.bfloat16, shard=None),
    "sharded": dict(cfg=dict(rope_scaling=scaling(8.0)), dtype=torch.float32, shard="300KB"),
}


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def write_case(name, case, seed, source, out, tokenizer):
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    model = LlamaForCausalLM(config(**case["cfg"])).eval()
    randomise(model, seed)
    stored = model.to(case["dtype"])
    kwargs = {"max_shard_size": case["shard"]} if case["shard"] else {}
    stored.save_pretrained(d, safe_serialization=True, **kwargs)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(source, "data", "tokenizer", f), d)
    # The reference computes in fp32 from the stored (possibly bf16-rounded) weights.
    model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = tokenizer(PROMPT)["input_ids"]
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0].float()
        gen = model.generate(x, max_new_tokens=32, min_new_tokens=32, do_sample=False, eos_token_id=None,
                             pad_token_id=0, attention_mask=torch.ones_like(x))
    greedy = gen[0, len(ids):]
    assert greedy.numel() == 32, greedy.shape
    save_file({"input_ids": torch.tensor(ids, dtype=torch.int32), "logits": logits.contiguous(),
               "greedy": greedy.to(torch.int32).contiguous()}, os.path.join(d, "reference.safetensors"))


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is ZeRO-3?"}],
    [{"role": "system", "content": "  Answer briefly.\n"}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": " Hello, how can I help? "}, {"role": "user", "content": "Explain FSDP.\n\n"}],
    [{"role": "user", "content": "Deux questions : l'une, l'autre ?"},
     {"role": "assistant", "content": "Oui.\u3000"}, {"role": "user", "content": "\u00a0数据并行 😀 tabs\tand\r\nCRLF"}],
    [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"},
     {"role": "user", "content": "third"}, {"role": "assistant", "content": "fourth"}, {"role": "user", "content": "fifth"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "An empty system message."}],
]


def write_chat(source, out, tokenizer):
    cases = []
    with open(os.path.join(source, "tests", "tokenizer", "llama3.1_chat_template.jinja"), encoding="utf-8") as f:
        llama3_1_template = f.read()
    for template_name, template in (("llama3.2", None), ("llama3.0", LLAMA3_0_TEMPLATE), ("llama3.1", llama3_1_template)):
        for messages in CONVERSATIONS:
            kwargs = {"chat_template": template} if template else {"date_string": "26 Jul 2024"}
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
            # llama3.1: no date_string, so the template's own date; "" tells encode_chat the same.
            date = "" if template_name == "llama3.1" else "26 Jul 2024"
            cases.append({"format": template_name, "date": date, "messages": messages, "ids": list(ids)})
    with open(os.path.join(out, "chat.json"), "w", encoding="utf-8") as f:
        json.dump({"llama3_0_template": LLAMA3_0_TEMPLATE, "llama3_1_template": llama3_1_template, "cases": cases}, f,
                  ensure_ascii=False, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(a.source, "data", "tokenizer"))
    for seed, (name, case) in enumerate(CASES.items()):
        write_case(name, case, 1000 + seed, a.source, a.out, tokenizer)
    write_chat(a.source, a.out, tokenizer)


if __name__ == "__main__":
    main()
