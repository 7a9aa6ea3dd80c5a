#!/usr/bin/env python3
"""Small hand-made tokenizer.json files covering what the three real tokenizers
do not use, and (where HF `tokenizers` is installed: the GPU machine) their golden
outputs from HF itself.

For each NAME writes tests/golden/tokenizers/synthetic/NAME/tokenizer.json
(deterministic: vocab and merges come from a tiny BPE training on a fixed
corpus) and, with HF present, NAME/encode.jsonl: per string text, ids
(add_special_tokens=False), ids_special (=True), decoded, decoded_skip; then
per seeded random id list: ids, decoded, decoded_skip (no text).

With HF present and TOKDIR given (TOKDIR/<name>/tokenizer.json for the three
real tokenizers), also writes OUTDIR/../<name>/extra.jsonl: the EXTRA strings
(Unicode corners where Oniguruma, PCRE2, utf8proc and Rust may disagree: White_Space
edge chars, (?i) folds, chars newer than our Unicode tables, huge runs) encoded by
the real tokenizers, in the same format.

Usage: python3 tools/make_tokenizer_synth.py [OUTDIR [TOKDIR]]
"""
import collections
import json
import os
import random
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden", "tokenizers", "synthetic")

CORPUS = """the quick brown fox jumps over the lazy dog . hello world ! hello there , how are you ?
tokenizers split text into pieces and merge them back ; the rain in spain stays mainly in the plain .
numbers 123 4567 89 and 2024-11-29 ; e-mail me at someone@example.com . don't , can't , it's fine .
Hello World HELLO THERE caf\u00e9 na\u00efve r\u00e9sum\u00e9 stra\u00dfe \u00fcber schon"""


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train(words, base, n_merges, prefix="", suffix=""):
    """Tiny BPE: words -> symbol lists (prefix on non-first, suffix on last)."""
    vocab = list(base)
    seen = set(vocab)
    seqs = []
    for w in words:
        chars = list(w)
        s = [c if i == 0 else prefix + c for i, c in enumerate(chars)]
        if suffix and s:
            s[-1] += suffix
        seqs.append(s)
        for t in s:
            if t not in seen:
                seen.add(t)
                vocab.append(t)
    merges = []
    for _ in range(n_merges):
        cnt = collections.Counter()
        for s in seqs:
            for a, b in zip(s, s[1:]):
                cnt[(a, b)] += 1
        if not cnt:
            break
        (a, b), c = max(cnt.items(), key=lambda kv: (kv[1], kv[0]))
        if c < 2:
            break
        new = a + (b[len(prefix):] if prefix and b.startswith(prefix) else b)
        merges.append((a, b))
        if new not in seen:
            seen.add(new)
            vocab.append(new)
        for i, s in enumerate(seqs):
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    out.append(new)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
    return vocab, merges


def added(id_, content, special=True, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return dict(id=id_, content=content, single_word=single_word, lstrip=lstrip, rstrip=rstrip,
                normalized=(not special) if normalized is None else normalized, special=special)


def bpe(vocab, merges, **kw):
    m = dict(type="BPE", dropout=None, unk_token=None, continuing_subword_prefix=None, end_of_word_suffix=None,
             fuse_unk=False, byte_fallback=False, ignore_merges=False, vocab=vocab, merges=merges)
    m.update(kw)
    return m


def tokenizer(model, added_tokens, normalizer=None, pre_tokenizer=None, post_processor=None, decoder=None):
    return dict(version="1.0", truncation=None, padding=None, added_tokens=added_tokens, normalizer=normalizer,
                pre_tokenizer=pre_tokenizer, post_processor=post_processor, decoder=decoder, model=model)


def vocab_ids(tokens, start=0):
    v = {}
    for t in tokens:
        if t not in v:
            v[t] = start + len(v)
    return v


def spm_bytefallback():
    """llama2/mistral style: Prepend+Replace normalizer, byte_fallback, fused unk, template."""
    words = ["\u2581" + w for w in CORPUS.lower().split()]
    base = sorted(set("".join(words)) - set("\u00e9\u00df"))  # those come back via byte fallback
    toks, merges = train(words, base, 120)
    specials = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    vocab = vocab_ids(specials + toks)
    mask_id = len(vocab)
    return tokenizer(
        bpe(vocab, [" ".join(m) for m in merges], unk_token="<unk>", fuse_unk=True, byte_fallback=True),
        [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"),
         added(mask_id, "<mask>", special=False, normalized=True, lstrip=True)],
        normalizer={"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        post_processor={"type": "TemplateProcessing",
                        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                   {"Sequence": {"id": "A", "type_id": 0}}],
                        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                 {"Sequence": {"id": "A", "type_id": 0}},
                                 {"Sequence": {"id": "B", "type_id": 1}}],
                        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        decoder={"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})


def metaspace_first():
    """Metaspace pre-tokenizer (prepend_scheme first), NFKC+Lowercase, unfused unk, Bert post."""
    words = ["\u2581" + w for w in CORPUS.lower().split()]
    toks, merges = train(words, sorted(set("".join(words))), 150)
    vocab = vocab_ids(["<unk>", "<pad>", "<cls>", "<sep>"] + toks)
    return tokenizer(
        bpe(vocab, [list(m) for m in merges], unk_token="<unk>"),
        [added(0, "<unk>"), added(1, "<pad>"), added(2, "<cls>"), added(3, "<sep>"),
         added(len(vocab), "[MASK]", special=False, normalized=False, single_word=True)],
        normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
        pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
        post_processor={"type": "BertProcessing", "sep": ["<sep>", 3], "cls": ["<cls>", 2]},
        decoder={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True})


def splits_affixes():
    """Split behaviours, Punctuation, Digits, NFD/Strip/Replace(regex); subword prefix and suffix."""
    words = [w for w in CORPUS.split() if w.isalpha()]
    toks, merges = train(words, [], 150, prefix="##", suffix="</w>")
    vocab = vocab_ids(["[UNK]"] + toks + list("0123456789-.,;!?'@"))
    return tokenizer(
        bpe(vocab, [" ".join(m) for m in merges], unk_token="[UNK]", fuse_unk=True,
            continuing_subword_prefix="##", end_of_word_suffix="</w>"),
        [added(0, "[UNK]")],
        normalizer={"type": "Sequence", "normalizers": [
            {"type": "NFD"}, {"type": "Strip", "strip_left": True, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}]},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"},
            {"type": "Punctuation", "behavior": "MergedWithNext"},
            {"type": "Split", "pattern": {"String": "e"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[aou]"}, "behavior": "Contiguous", "invert": True},
            {"type": "Digits", "individual_digits": True}]},
        decoder={"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "</w>"}, "content": " "},
            {"type": "Replace", "pattern": {"Regex": "##"}, "content": ""},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 0, "stop": 1}]})


def gpt2_bytelevel():
    """ByteLevel with the GPT-2 regex and add_prefix_space; added-token flags; Sequence post."""
    b2u = bytes_to_unicode()
    text = CORPUS + " \u4f60\u597d\u4e16\u754c \U0001F600"
    words = ["".join(b2u[b] for b in (" " + w).encode()) for w in text.split()]
    toks, merges = train(words, [b2u[b] for b in range(256)], 200)
    vocab = vocab_ids(toks)
    n = len(vocab)
    return tokenizer(
        bpe(vocab, [list(m) for m in merges]),
        [added(n, "<|endoftext|>"), added(n + 1, "<tool>", special=False, normalized=False, lstrip=True, rstrip=True),
         added(n + 2, "wow", special=False, normalized=True, single_word=True)],
        pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        post_processor={"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                                      {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [n],
                                                  "tokens": ["<|endoftext|>"]}}}]},
        decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True})


def whitespace_nodecoder():
    """Whitespace + Digits (grouped), NFKD, no decoder (tokens joined by spaces), Roberta post."""
    words = CORPUS.split()
    toks, merges = train(words, [], 100)
    vocab = vocab_ids(["<s>", "</s>", "<unk>"] + toks + list("0123456789"))
    return tokenizer(
        bpe(vocab, [" ".join(m) for m in merges], unk_token="<unk>"),
        [added(0, "<s>"), added(1, "</s>"), added(2, "<unk>")],
        normalizer={"type": "NFKD"},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Whitespace"}, {"type": "Digits", "individual_digits": False}]},
        post_processor={"type": "RobertaProcessing", "sep": ["</s>", 1], "cls": ["<s>", 0],
                        "trim_offsets": True, "add_prefix_space": False},
        decoder=None)


def bert_pre_lower():
    """BertPreTokenizer, Lowercase + NFC, legacy Metaspace-free char model with unk."""
    words = CORPUS.lower().split()
    toks, merges = train(words, [], 80)
    vocab = vocab_ids(["[UNK]", "[CLS]", "[SEP]"] + toks)
    return tokenizer(
        bpe(vocab, [" ".join(m) for m in merges], unk_token="[UNK]"),
        [added(0, "[UNK]"), added(1, "[CLS]"), added(2, "[SEP]")],
        normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
        pre_tokenizer={"type": "BertPreTokenizer"},
        post_processor={"type": "TemplateProcessing",
                        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                   {"Sequence": {"id": "A", "type_id": 0}},
                                   {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]},
                                           "[SEP]": {"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]}}},
        decoder={"type": "Sequence", "decoders": [{"type": "Fuse"},
                                                  {"type": "Strip", "content": "x", "start": 2, "stop": 2}]})


BUILDERS = dict(spm_bytefallback=spm_bytefallback, metaspace_first=metaspace_first, splits_affixes=splits_affixes,
                gpt2_bytelevel=gpt2_bytelevel, whitespace_nodecoder=whitespace_nodecoder,
                bert_pre_lower=bert_pre_lower)

STRINGS = [
    "", " ", "  ", "hello world", "Hello World!", " hello  world ", "the quick brown fox", "THE LAZY DOG",
    "don't stop, it's fine", "caf\u00e9 na\u00efve", "cafe\u0301", "\u00c5ngstr\u00f6m \u212b", "stra\u00dfe",
    "\ufb01ne \u2460 \uff21\uff22", "x\u00b2 + y\u00b2", "\u0130stanbul \u03a3\u039f\u03a3", "\u4f60\u597d\u4e16\u754c",
    "\U0001F600 smile", "numbers 123 4567 89012", "2024-11-29", "e-mail: someone@example.com",
    "tab\there\nnew line\r\nend", "a\u00a0b\u2003c", "hello<s>world", "<s> hello </s>", "<s><s>",
    "hi <mask> there", "hi<mask>there", "<mask>", "  <mask>  ", "[MASK]", "a [MASK] b", "a[MASK]b",
    "<tool>", "call <tool> now", "call  <tool>  now", "wow", "wow!", "awow", "wowa", "say wow now",
    "<|endoftext|>", "end<|endoftext|>start", "xxhixx", "xxxx", "x", "---", "...!!!", "1.5e-3",
    "\u2581\u2581hello\u2581", "\u2581", "##", "</w>", "mixed CASE with \u00c9t\u00e9 and \u1e9e",
    "the rain in spain stays mainly in the plain", "tokenizers split text into pieces",
]


EXTRA = [
    "a\u180eb c", "x\u0085y z", "p\u2028q\u2029r", "\u3000\u3000x", "tab\t\t\tx", "\r\r\n\n\r", " \n",
    "a \u00a0 b", "IT'\u017f fine", "it'S OK I'LL", "k\u212a", "\u0301\u0301start", "\u0300", "e\u0301\u0302",
    "\u1e9b\u0323", "\U0001FAE8 shaking", "\U00031350\U00031351 ext-h", "\u9fff\u9ffe\u9ffd", "\U0001F9CC",
    "\u0f00\u0f01", "a" * 5000 + " b", " " * 3000 + "x", "1" * 50, "\u0661\u0662\u0663\u0664", "\u216b\u2163",
    "x\u00b2\u00b3", "\U0001D7D9\U0001D7DA", "\ufeffBOM", "zero\u200bwidth", "\u200d", "\U000E0041 tag",
    "\ufffd replacement", "\x7f del \x01\x1f", "flag \U0001F3F3\uFE0F\u200D\u26A7\uFE0F",
    "<|im_start|>user\nhi<|im_end|>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>x", "<|begin_of_text|>hi",
    "<think>\n</think>", "a<\uff5ctool\u2581sep\uff5c>b", "<|EOT|><|EOT|>", "\uff28\uff45\uff4c\uff4c\uff4f",
    "\u01c5 \u01c8", "\ufb03", "\u2126\u212b", "A\u030a", "\u1100\u1161\u11a8", "\uac00\u11a8",
    "\u0915\u093c", "\u0e01\u0e48\u0e38", "\u05d0\u05b7", "\u0627\u0653", "'S's'T't'Re'rE'VE'M'LL'D'd",
    "\u2028\n", "  \n  \n", "\n\n\n\n\n", "x" * 300 + "\n" * 300,
]


def record(tk, text, ids=None):
    """One golden line; a step where HF itself fails (its Strip decoder panics on
    an empty token) is recorded as "<field>_error" instead of a value."""
    rec = {}
    if text is not None:
        rec["text"] = text
        ids = tk.encode(text, add_special_tokens=False).ids
        rec["ids_special"] = tk.encode(text, add_special_tokens=True).ids
    rec["ids"] = ids
    for key, skip in (("decoded", False), ("decoded_skip", True)):
        try:
            rec[key] = tk.decode(ids, skip_special_tokens=skip)
        except BaseException as e:  # pyo3 PanicException is not an Exception
            rec[key + "_error"] = f"{type(e).__name__}: {e}"
    return rec


def main():
    try:
        from tokenizers import Tokenizer
    except ImportError:
        Tokenizer = None
    for name, build in BUILDERS.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(build(), f, ensure_ascii=False, indent=1)
            f.write("\n")
        if Tokenizer is None:
            print("wrote", path, "(no HF tokenizers: goldens not written)")
            continue
        try:
            tk = Tokenizer.from_file(path)
        except Exception as e:  # keep the others; the test reports the refusal
            with open(os.path.join(d, "encode.jsonl"), "w", encoding="utf-8") as f:
                f.write(json.dumps(dict(error=f"{type(e).__name__}: {e}")) + "\n")
            print("HF refused", name, e)
            continue
        n_vocab = tk.get_vocab_size(with_added_tokens=True)
        rng = random.Random(len(name))
        with open(os.path.join(d, "encode.jsonl"), "w", encoding="utf-8") as f:
            for s in STRINGS:
                f.write(json.dumps(record(tk, s), ensure_ascii=False) + "\n")
            for _ in range(40):
                ids = [rng.randrange(n_vocab) for _ in range(rng.randint(1, 12))]
                f.write(json.dumps(record(tk, None, ids), ensure_ascii=False) + "\n")
        print("wrote", d)
    tokdir = sys.argv[2] if len(sys.argv) > 2 else None
    if Tokenizer is None or not tokdir:
        return
    for name in ("qwen3", "deepseek_v3", "llama3"):
        tk = Tokenizer.from_file(os.path.join(tokdir, name, "tokenizer.json"))
        d = os.path.join(OUT, "..", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "extra.jsonl"), "w", encoding="utf-8") as f:
            for s in EXTRA:
                f.write(json.dumps(record(tk, s), ensure_ascii=False) + "\n")
        print("wrote", d)


if __name__ == "__main__":
    main()
