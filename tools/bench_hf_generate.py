#!/usr/bin/env python3
"""bench_hf_generate.py — transformers `generate` on the shapes of a synthetic checkpoint.

The peer that `moeserve bench` is compared with (issue 6, DESIGN.md "Benchmarks"): the same
qwen3_moe shapes in BF16 with random weights, on the GPU, through transformers' own generate().

    python3 tools/bench_hf_generate.py CONFIG [--batch 1,8,64] [--context 128] [--new-tokens 32]
                                              [--prompt-len 2048] [--layers N] [--out FILE]

CONFIG is a checkpoint directory or its config.json (tools/make_synth_checkpoint writes one; its
quantization_config is dropped: transformers runs the same shapes in BF16). Measured:
  prefill  generate(max_new_tokens=1) on one --prompt-len prompt: median of 3 after a warm-up;
  decode   per batch B, on B random prompts of --context tokens, greedy with eos disabled:
           t_N = generate(N new tokens), t_1 = generate(1 new token) (the prefill-only call);
           decode tok/s = B * (N - 1) / (t_N - t_1). One untimed generate(N) per batch first.
Every call is bracketed by torch.cuda.synchronize(). The experts implementation is transformers'
default (config._experts_implementation says which one ran). Prints one JSON object (also to --out).
A --max-seconds budget skips the batches that would not start in time, marked as skipped.

Weights: the model is built on the GPU in BF16 (torch.device("cuda") context, so no fp32 copy
ever exists), then every matrix is redrawn N(0, 1/fan_in) and every norm set to 1 in place, the
same statistics as the synthetic checkpoint, so routing spreads over the experts as in ours.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="checkpoint directory or config.json")
    ap.add_argument("--batch", default="1,8,64", help="decode batch sizes (default 1,8,64)")
    ap.add_argument("--context", type=int, default=128, help="prompt tokens per decoding sequence (default 128)")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens generated per sequence (default 32)")
    ap.add_argument("--prompt-len", type=int, default=2048, help="prefill prompt length (default 2048)")
    ap.add_argument("--layers", type=int, default=0, help="use only the first N layers (default: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-seconds", type=float, default=200.0,
                    help="skip measurements that would start after this many seconds (default 200)")
    ap.add_argument("--out", help="also write the JSON here")
    return ap.parse_args()


def load_config(path, layers):
    """config.json of the synthetic checkpoint -> kwargs for transformers' Qwen3MoeConfig."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    for k in ("quantization_config", "model_type", "architectures", "torch_dtype", "dtype",
              "transformers_version"):
        cfg.pop(k, None)
    if "rope_theta" in cfg and "rope_parameters" not in cfg:  # transformers 5 spells it this way
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": float(cfg.pop("rope_theta"))}
    if layers > 0:
        cfg["num_hidden_layers"] = min(layers, cfg["num_hidden_layers"])
    return path, cfg


def expected_params(c):
    """Parameters of a qwen3_moe model with every layer MoE and no biases (the synthetic shapes)."""
    D, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    hd, H, KV = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    E, I = c["num_experts"], c["moe_intermediate_size"]
    attn = D * H * hd * 2 + D * KV * hd * 2 + 2 * hd
    moe = E * D + E * 3 * D * I
    per_layer = attn + moe + 2 * D
    return V * D * (1 if c.get("tie_word_embeddings") else 2) + L * per_layer + D


def build_model(cfg, seed):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen3_moe", **cfg)
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # parameters are born BF16 on the GPU: 61 GB, never 122
    try:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    finally:
        torch.set_default_dtype(prev)
    devices = {p.device.type for p in model.parameters()}
    if devices != {"cuda"}:  # a transformers version that builds elsewhere first: move it (fails loudly on meta)
        model = model.to("cuda")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # nn.Linear [out, in], fused experts [E, out, in], embeddings: fan_in = last dim
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
            else:
                p.fill_(1.0)  # RMSNorm weights
    model.eval()
    return model, config


def main():
    args = parse_args()
    t_start = time.perf_counter()
    import torch
    import transformers
    from transformers import GenerationConfig

    batches = [int(b) for b in args.batch.split(",") if b]
    cfg_path, cfg = load_config(args.config, args.layers)
    model, config = build_model(cfg, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    want = expected_params(cfg)
    gen = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0, bos_token_id=None,
                           temperature=None, top_p=None, top_k=None)
    model.generation_config = gen
    V = cfg["vocab_size"]
    g = torch.Generator(device="cuda").manual_seed(args.seed)

    def prompts(b, n):
        ids = torch.randint(0, V, (b, n), device="cuda", generator=g)
        return ids, torch.ones_like(ids)

    def timed_generate(ids, mask, new):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                 generation_config=gen)
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
        if out.shape[1] != ids.shape[1] + new:
            raise RuntimeError(f"generate made {out.shape[1] - ids.shape[1]} tokens, wanted {new}")
        return t

    def over_budget():
        return time.perf_counter() - t_start > args.max_seconds

    result = {
        "config": cfg_path,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "dtype": "bfloat16",
        "experts_implementation": getattr(config, "_experts_implementation", None),
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "layers": cfg["num_hidden_layers"],
        "params": n_params,
        "params_expected": want,
        "init_seconds": time.perf_counter() - t_start,
    }
    if n_params != want:
        print(f"bench_hf_generate: warning: {n_params} parameters, the shapes say {want}", file=sys.stderr)

    # prefill: one long prompt, the last token's logits only (what generate's first step computes)
    ids, mask = prompts(1, args.prompt_len)
    timed_generate(ids, mask, 1)
    ts = [timed_generate(ids, mask, 1) for _ in range(3)]
    t = statistics.median(ts)
    result["prefill"] = {"tokens": args.prompt_len, "seconds": t, "tok_s": args.prompt_len / t, "runs": ts}
    print(f"prefill {args.prompt_len} tokens: {t:.3f} s, {args.prompt_len / t:.1f} tok/s", file=sys.stderr)

    rows = []
    n = args.new_tokens
    for b in batches:
        row = {"batch": b, "context": args.context, "new_tokens": n}
        if over_budget():
            row["skipped"] = f"time budget of {args.max_seconds:.0f} s spent"
            rows.append(row)
            continue
        try:
            ids, mask = prompts(b, args.context)
            timed_generate(ids, mask, n)  # warm-up at this shape
            t1 = statistics.median([timed_generate(ids, mask, 1) for _ in range(2)])
            tn = timed_generate(ids, mask, n)
            row.update({"t_generate_s": tn, "t_prefill_only_s": t1, "decode_seconds": tn - t1,
                        "tok_s": b * (n - 1) / (tn - t1) if tn > t1 else None,
                        "generate_tok_s": b * n / tn})
            print(f"decode batch {b}: {row['tok_s'] or 0:.2f} tok/s ({tn:.3f} s for {n} tokens, "
                  f"prefill-only {t1:.3f} s)", file=sys.stderr)
        except torch.cuda.OutOfMemoryError as e:  # report it, keep the other batch sizes
            row["error"] = f"CUDA out of memory: {e}".splitlines()[0]
            torch.cuda.empty_cache()
        rows.append(row)
    result["decode"] = rows
    result["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    result["total_seconds"] = time.perf_counter() - t_start
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
