#!/usr/bin/env python3
"""Writes Hugging Face `tokenizers`' answers for the C++ tokenizer tests to compare against.

    python make_reference.py --source <repository root> --out <directory>

Into --out:
  llama3/tokenizer.json      a tokenizer in Llama 3's exact format written here: a byte-level
                             BPE trained on a multilingual corpus generated here, then rebuilt the
                             way Llama 3's tokenizer.json was made from Meta's tiktoken ranks
                             (every split of a token into two tokens is a merge, ordered by the
                             token's rank; merges written as "a b" strings), with Llama 3's
                             pre-tokenizer, ignore_merges, 256 specials after the BPE ids,
                             post-processor and decoder;
  llama3/tokenizer.model     the same vocabulary as Meta's tiktoken file (base64 token, rank),
  llama3/tokenizer_config.json  its special tokens (added_tokens_decoder);
  retrained/tokenizer.json   data/tokenizer/train_tokenizer.py run again (the committed file must
                             be the same bytes);
  project.json, llama3.json  for each test string: its bytes (hex) and Hugging Face's ids with and
                             without recognising special tokens (encode_special_tokens False /
                             True), each with and without add_special_tokens (the BOS); invalid
                             byte strings with the ids of their U+FFFD-replaced text; random id
                             sequences with Hugging Face's decode, skipping specials or not.

Deterministic: every random choice comes from random.Random with a fixed seed.
"""
import argparse
import base64
import json
import os
import random
import sys
import unicodedata

from tokenizers import Tokenizer


def load_trainer(source):
    sys.path.insert(0, os.path.join(source, "data", "tokenizer"))
    import train_tokenizer  # noqa: E402
    return train_tokenizer


# --- text -------------------------------------------------------------------------------------

SCRIPTS = {
    "cjk": "我们的模型在多台机器上训练数据并行张量流水线上下文长序列注意力梯度优化器检查点东京大阪日本語のテキストです한국어텍스트입니다",
    "arabic": "تدريب النماذج الكبيرة على عدة أجهزة يتطلب توازي البيانات والموترات",
    "devanagari": "बड़े मॉडलों का प्रशिक्षण कई मशीनों पर होता है नमस्ते दुनिया",
    "cyrillic": "Обучение больших моделей на многих машинах требует параллелизма",
    "greek": "Η εκπαίδευση μεγάλων μοντέλων απαιτεί παραλληλισμό δεδομένων",
    "hebrew": "אימון מודלים גדולים דורש מקביליות",
    "thai": "การฝึกโมเดลขนาดใหญ่ต้องใช้หลายเครื่อง",
    "latin": "Ça coûte très cher: naïve façade, Übergröße, smörgåsbord, Đặng Việt Nam, Łódź, İstanbul",
}
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "1️⃣", "❤️", "🏳️‍🌈", "🧑🏿‍💻", "🤖", "✨", "🙈🙉🙊"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\r\r\n", " \n ", "\u00a0", "\u2003",
          "\u3000", "\u0085", "\u2028", "\u2029", "\u180e", "\u200b", "\ufeff", "\u000b", "\u000c", "\u1680", "\u202f"]
DIGITS = "0123456789"
WORLD_DIGITS = "٠١٢٣٤٥٦٧٨٩०१२३४५६७८९０１２３４５６７８９²³½Ⅻ"
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'ſ", "'x"]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|reserved_special_token_99|>", "<|eom_id|>", "<|python_tag|>", "<|eot_id", "<|", "|>", "<|unknown|>"]
WORDS = ("the model trains on many machines with data tensor pipeline and context parallelism while the "
         "optimizer keeps its state sharded across ranks and every step checks the gradients agree").split()


def assigned_code_point(rng):
    """A random code point that Python's Unicode (14.0 on Python 3.11) assigns, not a surrogate."""
    while True:
        plane = rng.choice([0, 0, 0, 1, 2, 14])
        cp = plane * 0x10000 + rng.randrange(0x10000)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if unicodedata.category(chr(cp)) != "Cn":
            return chr(cp)


def piece(rng):
    k = rng.randrange(12)
    if k == 0:
        return rng.choice(WORDS) + rng.choice(CONTRACTIONS)
    if k == 1:
        return "".join(rng.choice(DIGITS) for _ in range(rng.randint(1, 10)))
    if k == 2:
        return rng.choice(SPACES) * rng.randint(1, 3)
    if k == 3:
        s = rng.choice(list(SCRIPTS.values()))
        a = rng.randrange(len(s))
        return s[a:a + rng.randint(1, 12)]
    if k == 4:
        return rng.choice(EMOJI)
    if k == 5:
        return rng.choice(SPECIALS)
    if k == 6:
        return rng.choice("!?.,;:-_()[]{}<>\"'`~@#$%^&*+=/\\|")*rng.randint(1, 3)
    if k == 7:
        return "".join(assigned_code_point(rng) for _ in range(rng.randint(1, 4)))
    if k == 8:
        return "".join(rng.choice(WORLD_DIGITS) for _ in range(rng.randint(1, 5)))
    if k == 9:
        w = rng.choice(WORDS)
        return w.upper() if rng.random() < 0.5 else w.capitalize()
    if k == 10:
        return unicodedata.normalize(rng.choice(["NFC", "NFD"]), rng.choice(["é", "ñ", "Ångström", "Việt", "ü"]))
    return " " + rng.choice(WORDS)


def test_strings(source):
    rng = random.Random(20240722)
    out = ["", " ", "  ", "\n", "a", "Hello world", "Hello, world!", "I'm", "I'M", "it's", "IT'S", "we'll've",
           "don't", "DON'T", "it'ſ", "'s", "'S'S", "x 's", "12", "123", "1234", "12345678901", "3.14159",
           "a  b", "a   b", "a\tb", "a\r\nb", "a\rb", "a\n\nb", "a \n b", "trailing   ", "   leading",
           "\r\n\r\n", "  \n\n  ", "a\u0085\u0085b", "a\u00a0\u00a0b", "x\u3000\u3000y", "e\u0301", "\u00e9",
           "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "<|eot_id|>", "hello<|begin_of_text|>world", "<|eot_id|><|eot_id|>",
           " <|eot_id|> ", "<|eot_id", "<|begin_of_text|>\n", "<|reserved_special_token_99|>x"]
    out += [chr(c) for c in range(128)]  # every single ASCII character
    out += [chr(c) * 3 for c in range(32, 127)]
    for name in sorted(SCRIPTS):
        out.append(SCRIPTS[name])
    out += [" " * n + "x" for n in range(1, 9)] + ["x" + " " * n for n in range(1, 9)]
    out += ["".join(rng.choice(DIGITS) for _ in range(n)) for n in range(1, 11)]
    # Lines of the shipped corpus.
    corpus = os.path.join(source, "data", "corpus")
    lines = []
    for n in sorted(os.listdir(corpus)):
        if n.endswith(".txt"):
            with open(os.path.join(corpus, n), encoding="utf-8") as f:
                lines += [l for l in f.read().split("\n") if l]
    out += rng.sample(lines, 300)
    # Mixes of every kind of piece.
    for _ in range(1400):
        out.append("".join(piece(rng) for _ in range(rng.randint(1, 12))))
    # Random code points, and random bytes made valid.
    for _ in range(150):
        out.append("".join(assigned_code_point(rng) for _ in range(rng.randint(1, 20))))
    for _ in range(150):
        out.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))).decode("utf-8", "replace"))
    # Long inputs.
    out.append("".join(piece(rng) for _ in range(12000))[:50000])
    out.append("a" * 50000)
    out.append("".join(rng.choice("abcdefghij") for _ in range(30000)))
    out.append("7" * 20000)
    out.append(" " * 30000 + "x")
    out.append("😀" * 5000)
    out.append("\n" * 10000)
    out.append("我们" * 10000)
    return out


def invalid_byte_strings():
    rng = random.Random(7)
    cases = [b"\xff", b"abc\x80def", b"\xe2\x82", b"\xe2\x82 euro", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf0\x9f\x98",
             b"\xf0\x9f\x98a", b"\xf4\x90\x80\x80", b"\xf5", b"caf\xe9", b"\xc3", b"x\xc3\xc3y"]
    for _ in range(100):
        cases.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 30))))
    return cases


def training_text(rng):
    """About 400 KB of mixed text to train the Llama-3-format tokenizer on."""
    parts = []
    for _ in range(60000):
        parts.append(piece(rng))
    for s in SCRIPTS.values():
        parts += [s] * 40
    return ["".join(parts[i:i + 200]) for i in range(0, len(parts), 200)]


# --- the Llama-3-format tokenizer --------------------------------------------------------------

def byte_level_decoder_table():
    from tokenizers import pre_tokenizers  # noqa: F401  (the alphabet is GPT-2's byte map)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def llama3_format(tt, trained, out_dir):
    """Rebuilds `trained` as Llama 3's tokenizer.json was built from tiktoken ranks."""
    to_byte = byte_level_decoder_table()
    spec = json.loads(trained.to_str())
    vocab = spec["model"]["vocab"]  # spelling -> id; ids 0..n-1 are the BPE tokens
    n_bpe = len(vocab)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    assert [i for _, i in by_id] == list(range(n_bpe))
    # Merges from ranks: for each token in rank order, every split into two tokens of lower rank.
    merges = []
    for tok, rank in by_id:
        local = []
        for cut in range(1, len(tok)):
            a, b = tok[:cut], tok[cut:]
            if a in vocab and b in vocab and vocab[a] < rank and vocab[b] < rank:
                local.append((vocab[a], vocab[b], a, b))
        local.sort()
        merges += [f"{a} {b}" for _, _, a, b in local]
    spec["model"]["merges"] = merges
    spec["model"]["ignore_merges"] = True
    spec["added_tokens"] = []
    spec["post_processor"] = None
    tok = Tokenizer.from_str(json.dumps(spec))
    tt.add_llama3_specials(tok)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    with open(os.path.join(out_dir, "tokenizer.model"), "w") as f:
        for spelling, rank in by_id:
            raw = bytes(to_byte[c] for c in spelling)
            f.write(f"{base64.b64encode(raw).decode()} {rank}\n")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tt.tokenizer_config(tok, ""), f)
    return Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))


# --- the answers -------------------------------------------------------------------------------

def answers(tok, strings, invalid, rng):
    cases = []
    modes = []
    for special in (True, False):
        tok.encode_special_tokens = not special
        for bos in (False, True):
            modes.append(((special, bos), [e.ids for e in tok.encode_batch(strings, add_special_tokens=bos)]))
    for i, s in enumerate(strings):
        c = {"hex": s.encode("utf-8").hex()}
        for (special, bos), ids in modes:
            c[("special" if special else "plain") + ("_bos" if bos else "")] = ids[i]
        cases.append(c)
    tok.encode_special_tokens = True
    bad = []
    for b in invalid:
        text = b.decode("utf-8", "replace")
        bad.append({"hex": b.hex(), "replaced_hex": text.encode("utf-8").hex(),
                    "plain": tok.encode(text, add_special_tokens=False).ids})
    tok.encode_special_tokens = False
    n = tok.get_vocab_size()
    dec = []
    for _ in range(400):
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 12))]
        dec.append({"ids": ids, "skip": tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex(),
                    "keep": tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex()})
    return {"vocab_size": n, "cases": cases, "invalid": bad, "decode": dec}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tt = load_trainer(args.source)
    os.makedirs(args.out, exist_ok=True)

    # The committed tokenizer made again, to be compared byte for byte.
    retrained = tt.train(tt.read_corpus(os.path.join(args.source, "data", "corpus")), 4096)
    os.makedirs(os.path.join(args.out, "retrained"), exist_ok=True)
    retrained.save(os.path.join(args.out, "retrained", "tokenizer.json"), pretty=True)

    rng = random.Random(99)
    trained = tt.train(training_text(rng), 6000)
    llama3 = llama3_format(tt, trained, os.path.join(args.out, "llama3"))

    strings = test_strings(args.source)
    invalid = invalid_byte_strings()
    project = Tokenizer.from_file(os.path.join(args.source, "data", "tokenizer", "tokenizer.json"))
    for name, tok in (("project", project), ("llama3", llama3)):
        with open(os.path.join(args.out, name + ".json"), "w") as f:
            json.dump(answers(tok, strings, invalid, random.Random(5)), f)
    print(f"make_reference: {len(strings)} strings, {len(invalid)} invalid byte strings -> {args.out}")


if __name__ == "__main__":
    main()
