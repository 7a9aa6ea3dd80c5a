#!/usr/bin/env bash
# Quantized test checkpoints, written by our own `moeserve quantize` from the BF16 golden
# fixtures (dev machine). tools/make_quant_fixtures.py then computes their reference logits
# with independent PyTorch dequantization + transformers on the GPU machine.
# Usage: tools/make_quant_inputs.sh BUILD_DIR OUTDIR
# ONLY=NAME: just that quantized fixture; SRC_MODELS=DIR: the BF16 sources (default
# tests/golden/models; qwen3_hd128 is not committed in BF16: make it with make_fixtures.py first).
set -euo pipefail
bin=$1/moeserve out=$2
src=${SRC_MODELS:-tests/golden/models}
rm -rf "$out" && mkdir -p "$out"
q() { # name source format [args...]   (source under $src; dsa_* sources under tests/golden/dsa)
    local name=$1 from=$2 fmt=$3 dir=$src
    shift 3
    [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ] && return 0
    case $from in dsa_*) dir=tests/golden/dsa ;; esac
    "$bin" quantize --in "$dir/$from" --out "$out/$name" --format "$fmt" "$@"
    python3 - "$dir/$from/ref.json" "$out/$name/ref.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
json.dump(dict(name=sys.argv[3], family=r["family"], tokens=r["tokens"], n_tokens=r["n_tokens"],
               vocab_size=r["vocab_size"], source_fixture=r["name"]), open(sys.argv[2], "w"), indent=1)
PY
}
q qwen3_basic_nvfp4 qwen3_basic nvfp4
q qwen3_hd128_nvfp4 qwen3_hd128 nvfp4
q qwen3_basic_nvfp4_excl_layer2 qwen3_basic nvfp4 --exclude 'model.layers.2*'
q glm4_basic_nvfp4_mixed glm4_basic nvfp4 --exclude '*self_attn*' --exclude '*shared_experts*' --exclude 'model.layers.0.mlp*'
q glm4_basic_fp8 glm4_basic fp8
q qwen3_gqa6_bias_fp8_sharded qwen3_gqa6_bias_sharded fp8
q glm4_basic_w4a16 glm4_basic nvfp4 --calib-tokens 0
# glm_moe_dsa (MLA + DSA indexer): kv_b_proj is read by the absorbed MLA ops, not by linear
q dsa_basic_nvfp4 dsa_basic nvfp4
q dsa_shared_indexer_nvfp4_sharded dsa_shared_indexer nvfp4
q dsa_shared_indexer_fp8 dsa_shared_indexer fp8
[ -n "${ONLY:-}" ] && { du -sh "$out"; exit 0; }
# ModelOpt MIXED_PRECISION: the same tensors as glm4_basic_nvfp4_mixed, described per module.
cp -r "$out/glm4_basic_nvfp4_mixed" "$out/glm4_basic_mixed_precision"
python3 - "$out/glm4_basic_mixed_precision" <<'PY'
import json, os, sys
d = sys.argv[1]
hq = json.load(open(os.path.join(d, "hf_quant_config.json")))
idx = None
names = []
import struct
with open(os.path.join(d, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
layers = {k[: -len(".weight_scale_2")]: {"quant_algo": "NVFP4"} for k in hdr if k.endswith(".weight_scale_2")}
hq["quantization"] = {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "quantized_layers": layers}
json.dump(hq, open(os.path.join(d, "hf_quant_config.json"), "w"), indent=2)
cfg = json.load(open(os.path.join(d, "config.json")))
cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers}
json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
r = json.load(open(os.path.join(d, "ref.json")))
r["name"] = "glm4_basic_mixed_precision"
json.dump(r, open(os.path.join(d, "ref.json"), "w"), indent=1)
PY
du -sh "$out"
