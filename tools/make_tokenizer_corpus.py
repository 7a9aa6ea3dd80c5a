#!/usr/bin/env python3
"""The tokenizer benchmark corpus, shared by tools/bench_tokenizer_hf.py (HF side) and
tools/bench_tokenizer.c (moeserve side, which reads the file this writes).

Deterministic, >= 10 MB: documents mixed from the golden strings with a seeded RNG,
joined by blank lines ("\\n\\n" never occurs inside a document). Needs only the
standard library: when `tokenizers`/`transformers` are absent (they are only needed to
*make* goldens), stand-ins are registered so make_tokenizer_golden's module top imports.

Usage: python3 tools/make_tokenizer_corpus.py OUT.txt
"""
import os
import random
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
for _mod in ("tokenizers", "transformers"):
    try:
        __import__(_mod)
    except ImportError:  # golden_strings() itself uses neither
        _stub = types.ModuleType(_mod)
        _stub.Tokenizer = _stub.PreTrainedTokenizerFast = None
        sys.modules[_mod] = _stub
from make_tokenizer_golden import golden_strings  # noqa: E402

TARGET = 10 * 1024 * 1024


def build_corpus():
    pieces = golden_strings(["<|im_start|>", "<|endoftext|>"])
    pieces = [p for p in pieces if p.strip()]
    rng = random.Random(7)
    out, size = [], 0
    while size < TARGET:
        doc = []
        for _ in range(rng.randint(5, 40)):
            doc.append(rng.choice(pieces))
            doc.append(rng.choice([" ", " ", "\n", ". ", ", "]))
        d = "".join(doc).replace("\n\n", "\n")
        out.append(d)
        size += len(d.encode("utf-8")) + 2
    return "\n\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1], "w", encoding="utf-8", newline="") as f:
        f.write(build_corpus())
