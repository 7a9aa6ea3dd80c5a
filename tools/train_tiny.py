#!/usr/bin/env python3
"""Train the small MoE model shipped in models/moeserve-tiny (run on the GPU machine).

Corpus: the King James Bible (public domain), as printed by Debian's bible-kjv
package (`tools/get_corpus.sh` writes it). Chapters are cleaned (verse numbers
removed, verses joined into paragraphs); the last 5% of chapters are held out
for validation.

1. A byte-level BPE tokenizer (HF tokenizers, 4096 entries, Qwen-style split
   regex + ByteLevel) with special tokens <|endoftext|>, <|im_start|>, <|im_end|>.
2. A qwen3_moe model: hidden 256, 4 layers, 4 heads (2 KV, head_dim 64),
   16 experts top-2 of width 256, vocab 4096 (~16M parameters), trained with
   AdamW, bf16 autocast, cosine schedule, router load-balancing loss; fixed seed.
   A share of each batch (--chat-frac) is ChatML conversations made from the training chapters
   (a user greets, asks for a verse on a word, for a passage of a chapter or for a verse's
   continuation; the assistant answers in KJV text and ends with <|im_end|>), so that a chat
   request gets an answer instead of an immediate end of turn. The tokenizer is trained on the
   chapters alone, as before, so it does not change.
3. Saves the BF16 checkpoint (shards < 15 MB), tokenizer.json,
   tokenizer_config.json (ChatML chat template), generation_config.json,
   val.txt, and train_log.json with training and validation loss.

Usage: python3 tools/train_tiny.py KJV_TXT OUTDIR [--steps N] [--chat-frac F]
"""
import argparse
import json
import math
import os
import random
import re
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def read_verses(path):
    """`bible` output: 'Book N' headings, then '  V text' verses wrapped at 80 columns: [(title, verses)]."""
    chapters, cur, title = [], [], None
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        if re.match(r"^\S.* \d+$", line):
            if title is not None and cur:
                chapters.append((title, cur))
            title, cur = line, []
        elif re.match(r"^\s+\d+ ", line):
            cur.append(re.sub(r"^\s+\d+ ", "", line).strip())
        elif line.strip() and cur:
            cur[-1] += " " + line.strip()
    if title is not None and cur:
        chapters.append((title, cur))
    return chapters


def chapter_docs(chapters):
    docs = []
    for title, verses in chapters:
        paras = [" ".join(verses[i:i + 4]) for i in range(0, len(verses), 4)]
        docs.append(title + "\n\n" + "\n\n".join(paras) + "\n")
    return docs


GREETINGS = ["Hello", "Hello!", "Hi", "Hi there", "Hey", "Good morning", "Good evening", "Hello, who are you?",
             "Hi! How are you?", "Greetings", "Can you help me?", "Say something.", "Tell me something."]
SYSTEMS = ["You are a helpful assistant.", "You answer in the words of the King James Bible.",
           "You are a quiet scholar of scripture."]


def chat(rng, user, answer):
    """One ChatML conversation as the shipped template renders it, the answer closed by <|im_end|>."""
    sys_part = ""
    if rng.random() < 0.3:
        sys_part = "<|im_start|>system\n" + rng.choice(SYSTEMS) + "<|im_end|>\n"
    return (sys_part + "<|im_start|>user\n" + user.strip() + "<|im_end|>\n<|im_start|>assistant\n" + answer.strip() +
            "<|im_end|>\n")


def chat_samples(chapters, n, seed):
    """n conversations from these chapters: greetings, a verse on a word, a chapter's opening, a
    verse's continuation."""
    rng = random.Random(seed)
    verses = [(t, v) for t, vs in chapters for v in vs if len(v.split()) >= 8]
    by_word = {}
    for t, v in verses:
        for w in set(re.findall(r"[A-Za-z]{5,}", v)):
            by_word.setdefault(w.lower(), []).append(v)
    words = [w for w, vs in by_word.items() if len(vs) >= 3]
    out = []
    for _ in range(n):
        kind = rng.randrange(5)
        t, v = rng.choice(verses)
        if kind == 0:
            out.append(chat(rng, rng.choice(GREETINGS), v))
        elif kind == 1:
            w = rng.choice(words)
            ask = rng.choice(["Give me a verse about {}.", "What does the Bible say about {}?", "Tell me of {}.",
                              "A verse on {}, please."]).format(w)
            out.append(chat(rng, ask, rng.choice(by_word[w])))
        elif kind == 2:
            title, vs = rng.choice(chapters)
            ask = rng.choice(["Read me {}.", "Quote {}.", "How does {} begin?", "Recite {}."]).format(title)
            out.append(chat(rng, ask, " ".join(vs[:rng.randint(1, 3)])))
        else:
            ws = v.split()
            cut = rng.randint(3, len(ws) - 3)
            ask = (rng.choice(["Continue: ", "Finish this verse: ", "What comes next? ", ""]) + " ".join(ws[:cut]))
            out.append(chat(rng, ask, " ".join(ws[cut:])))
    return out


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("outdir")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--chat-frac", type=float, default=0.25, help="share of each batch's rows from conversations")
    args = ap.parse_args()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(args.outdir, exist_ok=True)
    chapters = read_verses(args.corpus)
    docs = chapter_docs(chapters)
    n_val = max(1, len(docs) // 20)
    train_docs, val_docs = docs[:-n_val], docs[-n_val:]
    with open(os.path.join(args.outdir, "val.txt"), "w") as f:
        f.write("".join(val_docs))

    tok = train_tokenizer(train_docs, 4096)
    tok.save(os.path.join(args.outdir, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    im_end = tok.token_to_id("<|im_end|>")

    def encode_docs(ds):
        ids = []
        for d in ds:
            ids.extend(tok.encode(d).ids)
            ids.append(eot)
        return torch.tensor(ids, dtype=torch.long)

    train_ids, val_ids = encode_docs(train_docs), encode_docs(val_docs)
    print(f"corpus: {len(docs)} chapters, train {len(train_ids)} tokens, val {len(val_ids)} tokens")
    convs = chat_samples(chapters[:-n_val], 40000, args.seed)
    chat_ids = torch.tensor([i for c in convs for i in tok.encode(c).ids + [eot]], dtype=torch.long)
    print(f"chat: {len(convs)} conversations, {len(chat_ids)} tokens; sample:\n{convs[0]}")

    cfg = AutoConfig.for_model(
        "qwen3_moe", vocab_size=tok.get_vocab_size(), hidden_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=768,
        moe_intermediate_size=256, num_experts=16, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=1024,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=eot, pad_token_id=eot,
        output_router_logits=True, router_aux_loss_coef=0.01)
    dev = "cuda"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    seq, batch, warm = 256, 32, 100

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    g = torch.Generator().manual_seed(args.seed)

    n_chat = int(round(batch * args.chat_frac))

    def get_batch(data):
        ix = torch.randint(0, len(data) - seq - 1, (batch - n_chat,), generator=g)
        iy = torch.randint(0, len(chat_ids) - seq - 1, (n_chat,), generator=g)
        rows = [data[i:i + seq] for i in ix] + [chat_ids[i:i + seq] for i in iy]
        return torch.stack(rows).to(dev)

    @torch.no_grad()
    def val_loss():
        model.eval()
        losses = []
        for i in range(0, len(val_ids) - seq - 1, seq):
            x = val_ids[i:i + seq + 1][None].to(dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(input_ids=x[:, :-1], labels=x[:, :-1].clone())
            losses.append(out.loss.float().item())
        model.train()
        return sum(losses) / len(losses)

    log = []
    best = None
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        x = get_batch(train_ids)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            vl = val_loss() if (step % 200 == 0 or step == args.steps - 1) else None
            rec = dict(step=step, train_loss=float(out.loss.item()), val_loss=vl, seconds=time.time() - t0)
            log.append(rec)
            print(json.dumps(rec), flush=True)
            # keep the weights of the best validation loss (a small corpus overfits)
            if vl is not None and (best is None or vl < best[0]):
                best = (vl, step, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})

    model.load_state_dict(best[2])
    print(f"best validation loss {best[0]:.4f} at step {best[1]}")
    model.config.output_router_logits = False
    model = model.to(torch.bfloat16)
    model.save_pretrained(args.outdir, max_shard_size="15MB")
    gen = {"eos_token_id": [eot, im_end], "pad_token_id": eot, "do_sample": False}
    json.dump(gen, open(os.path.join(args.outdir, "generation_config.json"), "w"), indent=2)
    tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 1024,
            "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
            "added_tokens_decoder": {str(tok.token_to_id(s)): {"content": s, "special": True, "lstrip": False,
                                                                "rstrip": False, "normalized": False,
                                                                "single_word": False} for s in SPECIALS}}
    json.dump(tcfg, open(os.path.join(args.outdir, "tokenizer_config.json"), "w"), indent=2)
    final = dict(params=n_params, steps=args.steps, batch=batch, seq=seq, train_tokens=len(train_ids),
                 chat_frac=args.chat_frac, chat_tokens=len(chat_ids),
                 val_tokens=len(val_ids), final_train_loss=log[-1]["train_loss"], best_val_loss=best[0], best_step=best[1],
                 val_ppl_bf16_autocast=math.exp(best[0]), seconds=time.time() - t0,
                 torch=torch.__version__, seed=args.seed, log=log)
    json.dump(final, open(os.path.join(args.outdir, "train_log.json"), "w"), indent=1)
    # a sample, greedy, from the trained model
    model.eval()
    ids = torch.tensor([tok.encode("And God said").ids], device=dev)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=40, do_sample=False)
    print("sample:", tok.decode(out[0].tolist()))
    for user in ["Hello", "Give me a verse about mercy."]:
        prompt = "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"
        ids = torch.tensor([tok.encode(prompt).ids], device=dev)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=[eot, im_end])
        print(f"chat {user!r}:", tok.decode(out[0, ids.shape[1]:].tolist()))


if __name__ == "__main__":
    main()
