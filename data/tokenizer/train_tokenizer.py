#!/usr/bin/env python3
"""Trains llama4d's own small tokenizer: a byte-level BPE laid out like Llama 3's.

    python train_tokenizer.py [--corpus data/corpus] [--out data/tokenizer] [--vocab 4096]

with the Python of scripts/python_env.sh (Hugging Face `tokenizers`, the version pinned in
tests/requirements.txt). Writes tokenizer.json and tokenizer_config.json into --out.

The layout is Llama 3's, scaled down: ids 0 .. vocab-257 are the BPE tokens (the 256 single
bytes, then one token per merge, in merge order), and the last 256 ids are Llama 3's special
tokens in Llama 3's order, the way Llama 3 puts its 256 specials after its 128,000 BPE tokens
(<|begin_of_text|> is vocab-256 here, 128000 there). The pipeline is Llama 3's tokenizer.json
exactly: no normalizer; pre-tokenizer Split(Llama 3's regex, Isolated) then ByteLevel (no prefix
space, no regex of its own); BPE with ignore_merges; post-processor ByteLevel then a template
that puts <|begin_of_text|> first; decoder ByteLevel.

Deterministic: the trainer's merge order depends only on the corpus (ties between equally
frequent pairs are broken by the pair, not by thread timing), and the corpus is read in file
name order. Running it again gives the same bytes (tests/tokenizer checks the committed file
against a fresh run).

The functions here are also what tests/tokenizer/make_reference.py uses to write a
Llama-3-format tokenizer.json of its own.
"""
import argparse
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# Llama 3's pre-tokenization pattern: Meta's tokenizer.py `pat_str`, and the Split of its
# tokenizer.json.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

BOS = "<|begin_of_text|>"


def llama3_special_tokens():
    """The 256 special tokens of Hugging Face's Llama 3.1 / 3.2 tokenizer.json, in id order
    (Meta-Llama-3.2-1B-Instruct: 128000 <|begin_of_text|> ... 128255)."""
    named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
             "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    return named + [f"<|reserved_special_token_{i}|>" for i in range(3, 3 + 256 - len(named))]


def llama3_pipeline(tok):
    """Sets Llama 3's normalizer, pre-tokenizer and decoder on `tok` (the model is the caller's)."""
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)


def add_llama3_specials(tok):
    """Appends the 256 specials after the BPE ids and sets Llama 3's post-processor."""
    tok.add_special_tokens(llama3_special_tokens())
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]),
    ])


def with_ignore_merges(tok):
    """`tok` with model.ignore_merges = true, as Llama 3's tokenizer.json has (the trainer's
    model does not carry the flag, so it is set in the JSON)."""
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(spec))


def train(texts, vocab):
    """A Llama-3-format tokenizer of `vocab` ids trained on `texts` (a list of str)."""
    n_bpe = vocab - 256
    tok = Tokenizer(models.BPE())
    llama3_pipeline(tok)
    trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=1, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != n_bpe:
        sys.exit(f"train_tokenizer: the corpus gave {tok.get_vocab_size()} BPE tokens, not {n_bpe}; "
                 "use a smaller --vocab or a larger corpus")
    add_llama3_specials(tok)
    tok = with_ignore_merges(tok)
    assert tok.get_vocab_size() == vocab
    return tok


def tokenizer_config(tok, chat_template):
    """tokenizer_config.json as transformers reads it, with Llama 3.2 Instruct's fields."""
    added = {}
    for name in llama3_special_tokens():
        added[str(tok.token_to_id(name))] = {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                                             "single_word": False, "special": True}
    return {
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "chat_template": chat_template,
        # Meta's files say true, which makes transformers' decode drop the space before
        # punctuation ("a ." -> "a."); false keeps decode the inverse of encode.
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def read_corpus(corpus):
    names = sorted(n for n in os.listdir(corpus) if n.endswith(".txt") and not n.startswith("."))
    texts = []
    for n in names:
        with open(os.path.join(corpus, n), "rb") as f:
            texts.append(f.read().decode("utf-8"))
    return texts


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=os.path.join(here, "..", "corpus"))
    ap.add_argument("--out", default=here)
    ap.add_argument("--vocab", type=int, default=4096)
    args = ap.parse_args()
    tok = train(read_corpus(args.corpus), args.vocab)
    with open(os.path.join(here, "chat_template.jinja"), encoding="utf-8") as f:
        chat_template = f.read()
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"), pretty=True)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tok, chat_template), f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(f"train_tokenizer: {tok.get_vocab_size()} ids ({args.vocab - 256} BPE + 256 special) -> {args.out}")


if __name__ == "__main__":
    main()
