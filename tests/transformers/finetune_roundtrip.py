#!/usr/bin/env python3
"""Fine-tune round trip: llama4d trains a transformers-written model directory, transformers
loads what llama4d saved and computes the same loss.

    python finetune_roundtrip.py --llama4d BIN --models DIR --source SRC --work DIR

1. `llama4d train --init DIR/llama3_1 --data SRC/data/corpus` for a few steps on Llama 3's 4D
   plan on 16 virtual GPUs (tp=2,cp=2,pp=2,dp=2, ZeRO-3; the model's own tokenizer,
   data/tokenizer's, encodes the corpus);
2. `llama4d eval --json` of the saved checkpoint on one corpus document, all windows;
3. transformers loads the checkpoint (AutoModelForCausalLM, AutoTokenizer: the tokenizer files
   llama4d saved beside the weights) and computes the mean next-token cross-entropy over the same
   windows as llama4d's eval (core/data/batch_sampler.cpp eval_windows: window w holds tokens
   [w*T, w*T + T) and predicts each one's successor inside the document).
Exits 1 unless the token counts are equal and the losses agree within 1e-5 relative (fp32).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(2)
SEQ = 32


def llama4d(binary, *args):
    out = subprocess.run([binary, *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def transformers_loss(ckpt, text):
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, SEQ):
            window = ids[start:start + SEQ + 1]
            logits = model(torch.tensor([window[:-1]])).logits[0]
            total += F.cross_entropy(logits[:len(window) - 1], torch.tensor(window[1:]), reduction="sum").item()
            count += len(window) - 1
    return total / count, count


def main():
    ap = argparse.ArgumentParser()
    for a in ("--llama4d", "--models", "--source", "--work"):
        ap.add_argument(a, required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    # The corpus copied into --work: the token caches llama4d writes beside the data stay out of
    # the source tree.
    corpus = os.path.join(a.work, "corpus")
    shutil.copytree(os.path.join(a.source, "data", "corpus"), corpus)
    llama4d(a.llama4d, "train", "--init", os.path.join(a.models, "llama3_1"), "--data", corpus, "--seq-len", str(SEQ), "--batch-size", "4", "--steps", "3",
            "--lr", "1e-3", "--mesh", "tp=2,cp=2,pp=2,dp=2", "--zero", "3", "--eval-every", "0", "--out", a.work)
    ckpt = os.path.join(a.work, "checkpoint")
    doc = os.path.join(corpus, "part-01-01.txt")
    ours = llama4d(a.llama4d, "eval", "--checkpoint", ckpt, "--data", doc, "--seq-len", str(SEQ))
    with open(doc, encoding="utf-8") as f:
        theirs, count = transformers_loss(ckpt, f.read())
    print(f"llama4d eval: {ours['loss']:.8f} over {ours['tokens']} tokens; transformers: {theirs:.8f} over {count}")
    if ours["tokens"] != count or abs(ours["loss"] - theirs) > 1e-5 * abs(theirs):
        print("fine-tune round trip: llama4d's and transformers' losses differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
