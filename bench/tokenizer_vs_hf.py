#!/usr/bin/env python3
"""Encoding speed: llama4d's BPE tokenizer (build/release/bin/tokenizer_bench) beside Hugging
Face's `tokenizers` on the same tokenizer.json and the same documents. A benchmark, not a test.

    $(scripts/python_env.sh) bench/tokenizer_vs_hf.py [--build build/release] [--rounds 5]

Three inputs, each a list of documents:
  corpus        the shipped corpus (data/corpus, 91 documents, 140 KB of English);
  multilingual  about 2 MB of mixed scripts, emoji, digits and whitespace (tests/tokenizer's
                generator), in 2 KB documents;
  large         the corpus and the multilingual text repeated to about 24 MB, in 4 KB documents,
                for the thread scaling.
Rates are MB/s of UTF-8 text (10^6 bytes per second) after one untimed pass on both sides (HF
keeps a word cache too). HF's single-thread figure is `encode` in a loop with
RAYON_NUM_THREADS=1; its batch figure is `encode_batch` on all cores. Rounds alternate ours and
HF's (A B A B ...) so a slow spell of a shared machine falls on both; medians are reported. The
two must also give the same number of tokens.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)

HF_WORKER = r"""
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
tok.encode_special_tokens = True  # special-token text is plain text, as in our default encode
docs = open(sys.argv[2], encoding="utf-8", newline="").read().split("\0")  # newline="": keep \r as it is
batch = sys.argv[3] == "batch"
nbytes = sum(len(d.encode("utf-8")) for d in docs)
def run():
    if batch:
        return sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
    return sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
tokens = run()
t0 = time.perf_counter(); run(); s = time.perf_counter() - t0
print(json.dumps({"tokens": tokens, "mb_s": nbytes / s / 1e6}))
"""


def write_docs(path, docs):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("\0".join(docs))


def chunks(text, size):
    out, at = [], 0
    while at < len(text):
        end = min(len(text), at + size)
        while end < len(text) and not text[end].isspace():  # cut at a space
            end += 1
        out.append(text[at:end])
        at = end
    return [d for d in out if d]


def inputs(tmp):
    sys.path.insert(0, os.path.join(SOURCE, "tests", "tokenizer"))
    sys.path.insert(0, os.path.join(SOURCE, "data", "tokenizer"))
    import make_reference  # noqa: E402
    corpus = make_reference.load_trainer(SOURCE).read_corpus(os.path.join(SOURCE, "data", "corpus"))
    rng = random.Random(1)
    multi = "".join(make_reference.piece(rng) for _ in range(330000))
    multi = multi.encode("utf-8")[:2_000_000].decode("utf-8", "ignore").replace("\0", " ")  # NUL separates documents
    files = {}
    for name, docs in (("corpus", corpus), ("multilingual", chunks(multi, 2000)),
                       ("large", chunks(("\n\n".join(corpus) + "\n\n" + multi) * 11, 4000))):
        files[name] = os.path.join(tmp, name + ".docs")
        write_docs(files[name], docs)
    return files


def ours(bench, tokenizer, docs, threads):
    out = subprocess.run([bench, "--tokenizer", tokenizer, "--docs", docs, "--threads", ",".join(map(str, threads)),
                          "--passes", "1"], check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines()]


def hf(tokenizer, docs, batch, threads=None):
    env = dict(os.environ)
    if threads:
        env["RAYON_NUM_THREADS"] = str(threads)
    out = subprocess.run([sys.executable, "-c", HF_WORKER, tokenizer, docs, "batch" if batch else "single"], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SOURCE, "build", "release"))
    ap.add_argument("--tokenizer", default=os.path.join(SOURCE, "data", "tokenizer", "tokenizer.json"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    bench = os.path.join(args.build, "bin", "tokenizer_bench")
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        files = inputs(tmp)
        for name in ("corpus", "multilingual"):
            a, b, c = [], [], []
            for _ in range(args.rounds):
                r = ours(bench, args.tokenizer, files[name], [1])[0]
                a.append(r["median_mb_s"])
                h = hf(args.tokenizer, files[name], batch=False, threads=1)
                b.append(h["mb_s"])
                c.append(hf(args.tokenizer, files[name], batch=True)["mb_s"])
                if r["tokens"] != h["tokens"]:
                    sys.exit(f"{name}: {r['tokens']} tokens ours, {h['tokens']} Hugging Face's")
            print(f"{name:13s} {r['bytes'] / 1e6:6.2f} MB  one thread: ours {statistics.median(a):7.1f} MB/s, "
                  f"HF encode {statistics.median(b):6.1f} MB/s ({statistics.median(a) / statistics.median(b):.1f}x); "
                  f"HF encode_batch on {cores} cores {statistics.median(c):6.1f} MB/s")
        threads = sorted({1, 2, cores} | ({4} if cores >= 4 else set()))
        rates = {t: [] for t in threads}
        hb = []
        for _ in range(max(1, args.rounds // 2)):
            for r in ours(bench, args.tokenizer, files["large"], threads):
                rates[r["threads"]].append(r["median_mb_s"])
            hb.append(hf(args.tokenizer, files["large"], batch=True)["mb_s"])
        line = ", ".join(f"{t} threads {statistics.median(v):.1f}" for t, v in rates.items())
        print(f"large         {r['bytes'] / 1e6:6.2f} MB  ours: {line} MB/s; HF encode_batch on {cores} cores "
              f"{statistics.median(hb):.1f} MB/s")


if __name__ == "__main__":
    main()
