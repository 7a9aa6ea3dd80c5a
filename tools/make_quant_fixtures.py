#!/usr/bin/env python3
"""Reference logits for quantized checkpoints written by `moeserve quantize` (run on the GPU machine).

For each checkpoint directory under INDIR (made on the dev machine by our own
quantizer from the BF16 golden fixtures, each with a ref.json naming the
tokens), this script:
  1. dequantizes every quantized weight with its own PyTorch code, written
     from the format definitions (ModelOpt NVFP4: e2m1 * e4m3 block scale *
     weight_scale_2; compressed-tensors NVFP4: e2m1 * e4m3 / weight_global_scale;
     block FP8: e4m3 * weight_scale_inv per 128x128 block) — independent of
     moeserve's C code;
  2. loads the dequantized fp32 weights into the transformers model of the
     config (quantization section removed) and writes ref_logits.bin, fp32
     logits at every position of one forward pass;
  3. writes dequant_sha256.json: sha256 of each dequantized weight's fp32
     little-endian bytes, for the bit-exact round-trip test;
and it also derives a compressed-tensors copy of the first NVFP4 checkpoint
(names weight_packed / weight_global_scale = 1 / weight_scale_2).

Usage: python3 tools/make_quant_fixtures.py INDIR OUTDIR
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile
import traceback

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import dsa_selection_gap, fuse_experts, split_fused_experts  # noqa: E402

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def dequant_nvfp4(packed, scale, global_mul):
    n, half = packed.shape
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, half * 2).long()
    vals = E2M1[codes]
    sc = scale.to(torch.float32).repeat_interleave(16, dim=1)
    return vals * sc * global_mul


def dequant_nvfp4_ct(packed, scale, global_scale):
    n, half = packed.shape
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, half * 2).long()
    return E2M1[codes] * scale.to(torch.float32).repeat_interleave(16, dim=1) / global_scale


def dequant_fp8(w, scale_inv):
    n, k = w.shape
    s = scale_inv.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return w.to(torch.float32) * s


def read_dir(d):
    sd = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(d, f)))
    return sd


def dequantize_state(sd):
    """Returns (fp32 state dict with plain names, {weight name: sha256})."""
    out, shas = {}, {}
    for k, v in sd.items():
        if k.endswith(".weight_packed"):
            m = k[: -len(".weight_packed")]
            w = dequant_nvfp4_ct(v, sd[m + ".weight_scale"], sd[m + ".weight_global_scale"].float())
            out[m + ".weight"] = w
        elif k.endswith(".weight") and v.dtype == torch.uint8:
            m = k[: -len(".weight")]
            w = dequant_nvfp4(v, sd[m + ".weight_scale"], sd[m + ".weight_scale_2"].float())
            out[k] = w
            shas[k] = hashlib.sha256(w.contiguous().numpy().astype("<f4").tobytes()).hexdigest()
        elif k.endswith(".weight") and v.dtype == torch.float8_e4m3fn:
            m = k[: -len(".weight")]
            w = dequant_fp8(v, sd[m + ".weight_scale_inv"].float())
            out[k] = w
            shas[k] = hashlib.sha256(w.contiguous().numpy().astype("<f4").tobytes()).hexdigest()
        elif any(k.endswith(s) for s in (".weight_scale", ".weight_scale_2", ".input_scale", ".weight_scale_inv",
                                         ".weight_global_scale", ".input_global_scale")):
            continue
        else:
            out[k] = v.float()
    return out, shas


def reference_logits(d, sd32, tokens):
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.pop("quantization_config", None)
    with tempfile.TemporaryDirectory() as tmp:
        json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
        config = AutoConfig.from_pretrained(tmp)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config._attn_implementation = "eager"
    L = config.num_hidden_layers
    sd32 = {k: v for k, v in sd32.items() if not k.startswith(f"model.layers.{L}.")}
    sd32 = split_fused_experts(sd32, L)
    if not any(k.endswith("mlp.experts.0.gate_proj.weight") for k in model.state_dict()):
        sd32 = fuse_experts(sd32)
    if config.tie_word_embeddings:
        sd32.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(sd32, strict=False)
    missing = [k for k in missing if "inv_freq" not in k and not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"{d}: missing={missing[:6]} unexpected={unexpected[:6]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float().contiguous()
    return logits, model


def make_ct_copy(src, dst):
    shutil.copytree(src, dst)
    for f in os.listdir(dst):
        if f.endswith(".safetensors"):
            sd = load_file(os.path.join(dst, f))
            out = {}
            for k, v in sd.items():
                if k.endswith(".weight") and v.dtype == torch.uint8:
                    out[k[: -len(".weight")] + ".weight_packed"] = v
                elif k.endswith(".weight_scale_2"):
                    out[k[: -len(".weight_scale_2")] + ".weight_global_scale"] = (1.0 / v.float()).reshape(1)
                elif k.endswith(".input_scale"):
                    out[k[: -len(".input_scale")] + ".input_global_scale"] = (1.0 / v.float()).reshape(1)
                else:
                    out[k] = v
            save_file(out, os.path.join(dst, f), metadata={"format": "pt"})
    idx = os.path.join(dst, "model.safetensors.index.json")
    if os.path.exists(idx):
        os.remove(idx)  # the test fixture is single-file
    os.remove(os.path.join(dst, "hf_quant_config.json"))
    cfg = json.load(open(os.path.join(dst, "config.json")))
    ignore = cfg["quantization_config"].get("ignore", [])
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "format": "nvfp4-pack-quantized",
                                      "weights": {"num_bits": 4, "type": "float", "group_size": 16,
                                                  "strategy": "tensor_group", "symmetric": True, "dynamic": False}}},
        "ignore": ignore,
    }
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)


def main():
    indir, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    names = sorted(n for n in os.listdir(indir) if os.path.isdir(os.path.join(indir, n)))
    work = []
    for n in names:
        shutil.copytree(os.path.join(indir, n), os.path.join(outdir, n), dirs_exist_ok=True)
        work.append(n)
    nv = [n for n in names if "nvfp4" in n and "mixed" not in n and "excl" not in n]
    nv.sort(key=lambda n: (not n.startswith("qwen3"), n))  # the compressed-tensors copy stays qwen3's
    if nv:
        ct = nv[0] + "_ct"
        make_ct_copy(os.path.join(outdir, nv[0]), os.path.join(outdir, ct))
        work.append(ct)
    failed = []
    for n in work:
        d = os.path.join(outdir, n)
        try:
            meta = json.load(open(os.path.join(d, "ref.json")))
            sd32, shas = dequantize_state(read_dir(d))
            logits, model = reference_logits(d, sd32, meta["tokens"])
            if meta.get("family") == "glm_moe_dsa":
                meta["min_indexer_boundary_gap"] = dsa_selection_gap(model, torch.tensor(meta["tokens"]))
            logits.numpy().astype("<f4").tofile(os.path.join(d, "ref_logits.bin"))
            json.dump(shas, open(os.path.join(d, "dequant_sha256.json"), "w"), indent=1, sort_keys=True)
            top2 = logits.topk(2, dim=-1).values
            gap = float(((top2[:, 0] - top2[:, 1]) / logits.abs().max()).min())
            meta.update(quantized=True, max_abs_ref=float(logits.abs().max()), min_top2_gap_rel=gap,
                        n_dequant_checked=len(shas))
            json.dump(meta, open(os.path.join(d, "ref.json"), "w"), indent=1)
            print(f"[{n}] ok: {len(shas)} quantized weights, max|ref|={meta['max_abs_ref']:.3f}, min gap {gap:.2e}")
        except Exception:
            traceback.print_exc()
            failed.append(n)
    print(f"quant fixtures: {len(work) - len(failed)} ok, {len(failed)} failed {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
