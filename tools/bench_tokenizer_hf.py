#!/usr/bin/env python3
"""Tokenizer encode throughput of Hugging Face `tokenizers`, single thread (GPU machine's CPU).

Builds a deterministic mixed corpus (>= 10 MB: prose, code, CJK, other scripts,
emoji, numbers, whitespace; from the golden string generator and a seeded
mixer), splits it into documents at blank lines, and times encode() per
document with add_special_tokens=False. Writes the corpus and, per tokenizer,
the number of ids and a checksum of all ids, so moeserve's encoder can be timed
on the same documents and checked against the same output.

Usage: RAYON_NUM_THREADS=1 python3 tools/bench_tokenizer_hf.py TOKDIR OUTDIR
"""
import hashlib
import json
import os
import sys
import time

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_golden import NAMES  # noqa: E402
from make_tokenizer_corpus import build_corpus  # noqa: E402  (shared with tools/bench_tokenizer.c)


def main():
    tokdir, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    corpus = build_corpus()
    with open(os.path.join(outdir, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(corpus)
    docs = corpus.split("\n\n")
    nbytes = len(corpus.encode("utf-8"))
    results = {}
    for name in NAMES:
        tk = Tokenizer.from_file(os.path.join(tokdir, name, "tokenizer.json"))
        tk.encode(docs[0], add_special_tokens=False)
        best = None
        for _ in range(3):
            t0 = time.perf_counter()
            all_ids = [tk.encode(d, add_special_tokens=False).ids for d in docs]
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        h = hashlib.sha256()
        n = 0
        for ids in all_ids:
            for i in ids:
                h.update(int(i).to_bytes(4, "little"))
            n += len(ids)
        results[name] = dict(mb_per_s=nbytes / best / 1e6, seconds=best, n_ids=n, sha256_ids=h.hexdigest())
        print(name, json.dumps(results[name]))
    meta = dict(corpus_bytes=nbytes, documents=len(docs), results=results,
                threads=os.environ.get("RAYON_NUM_THREADS"))
    json.dump(meta, open(os.path.join(outdir, "hf_bench.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
