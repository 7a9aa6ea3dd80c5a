#!/usr/bin/env bash
# Bad checkpoints and bad arguments through the real binary: every case must
# exit with status 1 or 2 (never a signal, never 0) and print a message that
# names the problem. Usage: bad_input.sh MOESERVE SRC_DIR WORK_DIR
set -u
bin=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
good=$src/tests/golden/models/qwen3_basic
sharded=$src/tests/golden/models/qwen3_gqa6_bias_sharded
pass=0 fail=0

# expect NAME EXPECTED_SUBSTRING -- moeserve args...
expect() {
    local name=$1 want=$2
    shift 3
    local out rc
    out=$(timeout 60 "$bin" "$@" 2>&1 >/dev/null) # 124: it hung
    rc=$?
    if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
        echo "FAIL $name: exit status $rc (want 1 or 2): $out"
        fail=$((fail + 1))
    elif ! grep -qF -- "$want" <<<"$out"; then
        echo "FAIL $name: message lacks \"$want\": $out"
        fail=$((fail + 1))
    else
        echo "ok   $name: $out" | head -c 300
        echo
        pass=$((pass + 1))
    fi
}

# copy_model NAME [SRC]: a writable copy of a fixture
copy_model() {
    rm -rf "${work:?}/$1"
    cp -r "${2:-$good}" "$work/$1"
    echo "$work/$1"
}

# write_st FILE HEADER_JSON DATA_BYTES [HEADER_LEN]: a hand-made safetensors file
write_st() {
    local file=$1 header=$2 nbytes=$3 hlen=${4:-${#2}}
    local le=""
    for i in 0 1 2 3 4 5 6 7; do le="$le$(printf '\\x%02x' $(((hlen >> (8 * i)) & 255)))"; done
    { printf "$le"; printf '%s' "$header"; head -c "$nbytes" /dev/zero; } >"$file"
}

logits() { echo logits --model "$1" --tokens 1,2,3 --out "$work/out.bin"; }

d=$(copy_model truncated)
truncate -s 100000 "$d/model.safetensors"
expect truncated "model.safetensors" -- $(logits "$d")

d=$(copy_model hdr_past_eof)
write_st "$d/model.safetensors" '{}' 0 4096
expect header_past_eof "model.safetensors" -- $(logits "$d")

d=$(copy_model offsets)
write_st "$d/model.safetensors" '{"model.norm.weight":{"dtype":"BF16","shape":[64],"data_offsets":[0,128]},"x":{"dtype":"F32","shape":[4],"data_offsets":[128,144]}}' 128
expect offsets_out_of_range "model.safetensors" -- $(logits "$d")

d=$(copy_model overlap)
write_st "$d/model.safetensors" '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}' 24
expect overlapping_tensors "overlap" -- $(logits "$d")

d=$(copy_model size_mismatch)
write_st "$d/model.safetensors" '{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}}' 16
expect dtype_size_mismatch "tensor a" -- $(logits "$d")

d=$(copy_model bad_config)
printf '{"model_type": "qwen3_moe", "hidden_size": 64,' >"$d/config.json"
expect malformed_config_json "config.json: malformed JSON" -- $(logits "$d")

d=$(copy_model bad_header_json)
write_st "$d/model.safetensors" '{"a":{"dtype":"F32","shape":[4],' 0
expect malformed_header_json "model.safetensors" -- $(logits "$d")

d=$(copy_model unknown_type)
sed -i 's/"model_type": "qwen3_moe"/"model_type": "llama4_text"/' "$d/config.json"
expect unknown_model_type 'model_type "llama4_text" is not supported' -- $(logits "$d")

d=$(copy_model missing_tensor)
sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 4/' "$d/config.json"
expect missing_tensor "model.layers.3.input_layernorm.weight" -- $(logits "$d")

d=$(copy_model missing_shard "$sharded")
rm "$d/model-00002-of-00004.safetensors"
expect shard_absent "model-00002-of-00004.safetensors" -- $(logits "$d")

d=$(copy_model no_weights)
rm "$d/model.safetensors"
expect no_weights "no model.safetensors" -- $(logits "$d")

expect bad_token_id "outside the vocabulary" -- logits --model "$good" --tokens 1,99999 --out "$work/o.bin"
expect bad_token_list "comma-separated" -- logits --model "$good" --tokens 1,x,3 --out "$work/o.bin"
expect unknown_option "unknown option" -- logits --model "$good" --bogus
expect missing_model_dir "cannot open" -- logits --model "$work/nope" --tokens 1 --out "$work/o.bin"
expect unknown_command "unknown command" -- frobnicate
expect bad_temperature "--temperature" -- generate --model "$good" --tokens 1 --temperature -1
expect context_overflow "exceeds the context" -- generate --model "$good" --tokens 1,2,3 -n 10 --max-context 8
expect bad_attention_precision "--attention-precision: expected hi_lo" -- logits --model "$good" --tokens 1 \
    --out "$work/o.bin" --attention-precision fp8
expect attention_precision_on_cpu "applies to the cuda backend" -- generate --model "$good" --tokens 1 -n 1 \
    --backend cpu --attention-precision bf16
expect serve_past_positions "past the model's max_position_embeddings (1024)" -- serve \
    --model "$src/models/moeserve-tiny" --max-context 2048
expect generate_past_positions "past the model's max_position_embeddings (256)" -- generate --model "$good" \
    --tokens 1,2 -n 300
expect empty_api_key "--api-key is empty" -- serve --model "$good" --api-key ""
expect bad_tool_parser "--tool-call-parser: expected auto, none, qwen3 or glm45" -- serve --model "$good" \
    --tool-call-parser hermes
MOESERVE_API_KEY= expect empty_api_key_env "MOESERVE_API_KEY is empty" -- serve --model "$good"
expect kv_dtype_gqa "only MLA latent caches" -- logits --model "$good" --tokens 1 --out "$work/o.bin" \
    --kv-cache-dtype bf16
expect kv_dtype_bogus "--kv-cache-dtype: expected f32, bf16 or fp8" -- logits --model "$good" --tokens 1 \
    --out "$work/o.bin" --kv-cache-dtype f16
expect context_fill_bogus "--context-fill: expected prefill or random" -- bench --model "$good" --context-fill x
# a FIFO in place of a shard: refused at once, never a blocked open
fifo=$(copy_model fifo)
rm -f "$fifo/model.safetensors" && mkfifo "$fifo/model.safetensors"
expect fifo_shard "not a regular file" -- info --model "$fifo"
# ... and in place of a text or template file (each opened before anything else blocks)
mkfifo "$work/fifo_file"
expect fifo_tokenize_file "not a regular file" -- tokenize --model "$src/models/moeserve-tiny" --file "$work/fifo_file"
expect fifo_perplexity_file "not a regular file" -- perplexity --model "$src/models/moeserve-tiny" \
    --file "$work/fifo_file"
expect fifo_chat_template "not a regular file" -- serve --model "$src/models/moeserve-tiny" --port 0 \
    --chat-template "$work/fifo_file"
# logits honours the model's positions as generate does (--allow-long-context to go past them)
expect logits_past_positions "past the model's max_position_embeddings (256)" -- logits --model "$good" \
    --tokens "$(seq -s, 1 300)" --out "$work/o.bin"
# bench serve --request-fields: an object, and never the fields the measurement rests on
expect bench_serve_fields_array "want a JSON object" -- bench serve --url http://127.0.0.1:9 --request-fields '[1]'
expect bench_serve_fields_json "--request-fields" -- bench serve --url http://127.0.0.1:9 --request-fields '{"a":'
expect bench_serve_fields_stream "'stream' is the benchmark's own field" -- bench serve --url http://127.0.0.1:9 \
    --request-fields '{"stream": false}'

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
