#!/usr/bin/env bash
# gpu_sampling_cost.sh — on the GPU machine, one call: what constrained decoding and the sampling
# parameters cost a served decode step (issue 28: target < 10% of a step at batch 64). For each
# server pack of PACKS (`serve --backend cuda --synthetic qwen3-30b-a3b`, the Qwen3 tokenizer from
# .carry/tok), `bench serve` (the last pack's client) at CONC with 16 + 128 tokens, one row per
# request kind: greedy, sampled (T 1, top_p 0.9), json_object, json_schema, penalties + logit_bias,
# min_p, top_k (50), min_tokens. A pack that draws on the host (before the device-side masks and edits) shows
# the old cost; TPOT against greedy's is the cost. A table last; logs in $OUT.
#
#   carry [".carry/ab", ".carry/lib", ".carry/tok"]   PACKS="base new" [CONC=1,64] tools/gpu_sampling_cost.sh
# KINDS="greedy json_object": only those kinds. (SERVE_ARGS replaces the model options: SERVE_ARGS="--model models/moeserve-tiny" tries it on a CPU.)
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_sampling_cost}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}:/usr/lib/x86_64-linux-gnu"
packs=(${PACKS:-new})
for p in "${packs[@]}"; do
    d=/tmp/abx-$p
    [ -x "$d/moeserve" ] || { rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/$p.tar.xz" -C "$d"; } || exit 2
done
client=/tmp/abx-${packs[-1]}/moeserve
schema='{"type":"json_schema","json_schema":{"name":"r","strict":true,"schema":{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","n","tags"],"additionalProperties":false}}}'
kinds=(
    "greedy||"
    "sampled|{\"temperature\":1,\"top_p\":0.9,\"seed\":1}|"
    "json_object|{\"temperature\":1,\"seed\":1}|{\"type\":\"json_object\"}"
    "json_schema|{\"temperature\":1,\"seed\":1}|$schema"
    "penalties|{\"temperature\":1,\"seed\":1,\"frequency_penalty\":0.5,\"presence_penalty\":0.3,\"repetition_penalty\":1.1,\"logit_bias\":{\"100\":2,\"200\":-5}}|"
    "min_p|{\"temperature\":1,\"seed\":1,\"min_p\":0.05}|"
    "top_k|{\"temperature\":1,\"seed\":1,\"top_k\":50}|"
    "min_tokens|{\"min_tokens\":100}|"
)
rows=()
for p in "${packs[@]}"; do
    d=/tmp/abx-$p
    "$d/moeserve" serve ${SERVE_ARGS:---backend cuda --synthetic qwen3-30b-a3b --tokenizer $src/.carry/tok} \
        --max-seqs 64 --port 0 >"$out/serve_$p.out" 2>"$out/serve_$p.err" &
    sp=$!
    for _ in $(seq 1 240); do grep -q listening "$out/serve_$p.out" 2>/dev/null && break; sleep 0.5; done
    url=$(grep -o 'http://[0-9.:]*' "$out/serve_$p.out" | head -1)
    [ -n "$url" ] || { rows+=("$p: serve did not start: $(tail -2 "$out/serve_$p.err")"); kill $sp; continue; }
    for k in "${kinds[@]}"; do
        IFS='|' read -r name fields rf <<<"$k"
        [ -z "${KINDS:-}" ] || [[ " $KINDS " == *" $name "* ]] || continue
        "$client" bench serve --url "$url" --concurrency "${CONC:-1,64}" --input-len 16 --output-len 128 --json \
            ${fields:+--request-fields "$fields"} ${rf:+--response-format "$rf"} \
            >"$out/bs_${p}_$name.json" 2>"$out/bs_${p}_$name.err"
        rows+=("$(printf '%-5s %-12s' "$p" "$name") $(python3 -c "
import json
d = json.load(open('$out/bs_${p}_$name.json'))
print('; '.join('c%d TPOT %.2f ms %.0f tok/s ok %d/%d' % (l['concurrency'], l['tpot_ms']['mean'], l['output_tok_s'],
      l['completed'], l['requests']) for l in d['levels']))" 2>/dev/null || echo "failed: $(tail -1 "$out/bs_${p}_$name.err")")")
    done
    kill -TERM $sp
    wait $sp
done
printf '%s\n' "${rows[@]}"
