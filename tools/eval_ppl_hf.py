#!/usr/bin/env python3
"""Validation perplexity with transformers (GPU machine), the protocol of `moeserve perplexity`.

tokens = tokenizer.encode(text, add_special_tokens=False); consecutive windows
of W tokens (the last one may be shorter, >= 2 tokens); in each window, from a
fresh context, the mean negative log-likelihood of tokens 1..n-1; perplexity =
exp(total NLL / predicted tokens). Quantized checkpoints are dequantized with
the independent PyTorch code of make_quant_fixtures.py and run in fp32.

With --generate PROMPT, also writes the greedy continuation (ids and text of
--new tokens, no special tokens added to the prompt) as JSON to --gen-out, the
reference for moeserve's end-to-end generate test.

Usage: python3 tools/eval_ppl_hf.py MODEL_DIR TEXT_FILE [--window 256]
                                    [--generate PROMPT --new N --gen-out FILE]
"""
import argparse
import json
import math
import os
import sys

import torch
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_quant_fixtures import dequantize_state, read_dir, reference_logits  # noqa: E402,F401
from make_quant_fixtures import AutoConfig, AutoModelForCausalLM, fuse_experts, split_fused_experts  # noqa: E402
import tempfile  # noqa: E402


def load_model(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.pop("quantization_config", None)
    with tempfile.TemporaryDirectory() as tmp:
        json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
        config = AutoConfig.from_pretrained(tmp)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    sd32, _ = dequantize_state(read_dir(d))
    sd32 = split_fused_experts(sd32, config.num_hidden_layers)
    if not any(k.endswith("mlp.experts.0.gate_proj.weight") for k in model.state_dict()):
        sd32 = fuse_experts(sd32)
    missing, unexpected = model.load_state_dict(sd32, strict=False)
    missing = [k for k in missing if "inv_freq" not in k]
    if missing or unexpected:
        raise RuntimeError(f"{d}: missing={missing[:6]} unexpected={unexpected[:6]}")
    return model.eval().to("cuda")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--generate")
    ap.add_argument("--new", type=int, default=40)
    ap.add_argument("--gen-out")
    a = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    ids = tok.encode(open(a.text, encoding="utf-8").read(), add_special_tokens=False).ids
    model = load_model(a.model)
    nll, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids), a.window):
            w = ids[i:i + a.window]
            if len(w) < 2:
                continue
            x = torch.tensor([w], device="cuda")
            logits = model(input_ids=x, use_cache=False).logits[0].float()
            lp = torch.log_softmax(logits[:-1], dim=-1)
            nll -= lp.gather(1, x[0, 1:, None]).sum().item()
            n += len(w) - 1
    print(json.dumps(dict(model=a.model, tokens=len(ids), predicted=n, window=a.window, nll=nll / n,
                          perplexity=math.exp(nll / n))))
    if a.generate:
        p = tok.encode(a.generate, add_special_tokens=False).ids
        x = torch.tensor([p], device="cuda")
        with torch.no_grad():
            for _ in range(a.new):  # greedy, full recompute: no cache subtleties
                nxt = model(input_ids=x, use_cache=False).logits[0, -1].argmax()
                x = torch.cat([x, nxt.view(1, 1)], dim=1)
        new = x[0, len(p):].tolist()
        rec = dict(prompt=a.generate, prompt_ids=p, ids=new, text=tok.decode(new, skip_special_tokens=True))
        json.dump(rec, open(a.gen_out, "w"), indent=1, ensure_ascii=False)
        print(json.dumps(rec, ensure_ascii=False))


if __name__ == "__main__":
    main()
