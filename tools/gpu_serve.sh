#!/usr/bin/env bash
# gpu_serve.sh — serving on the GPU against the engine (issue 27's table), one call: `serve --backend
# cuda` on synthetic Qwen3-30B-A3B NVFP4 (weights made on the GPU, the Qwen3 tokenizer from .carry/tok),
# `bench serve` at 16 + 128 tokens (concurrency 1/16/64) and 512 + 128 (16/64), failed requests
# counted (ROUNDS times), and `bench` (the engine) at the same batch sizes. A table last; logs in $OUT.
#
#   carry [".carry/ab", ".carry/lib", ".carry/tok"]    NEW=new tools/gpu_serve.sh
# RUNS="PROMPT:C1,C2 ..." other levels (default "16:1,16,64 512:16,64"); SERVE_FLAGS more serve options
# (the last of a repeated option wins: SERVE_FLAGS="--max-seqs 128" RUNS="16:100" for decode steps past 64).
# RESPONSE_FORMAT='{"type": "json_object"}' (any response_format JSON): every bench request is structured output.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_serve}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}:/usr/lib/x86_64-linux-gnu"
d=/tmp/abx-${NEW:-new}
[ -x "$d/moeserve" ] || { rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d"; } || exit 2
rows=()
"$d/moeserve" serve --backend cuda --synthetic qwen3-30b-a3b --tokenizer "$src/.carry/tok" --max-seqs 64 --port 0 \
    ${SERVE_FLAGS:-} >"$out/serve.out" 2>"$out/serve.err" &
sp=$!
for _ in $(seq 1 240); do grep -q listening "$out/serve.out" 2>/dev/null && break; sleep 0.5; done
url=$(grep -o 'http://[0-9.:]*' "$out/serve.out" | head -1)
[ -n "$url" ] || { echo "serve did not start: $(tail -3 "$out/serve.err")"; exit 1; }
for round in $(seq 1 "${ROUNDS:-1}"); do
for run in ${RUNS:-16:1,16,64 512:16,64}; do
    set -- ${run/:/ }
    "$d/moeserve" bench serve --url "$url" --concurrency "$2" --input-len "$1" --output-len 128 --json \
        ${RESPONSE_FORMAT:+--response-format "$RESPONSE_FORMAT"} >"$out/bs_$1_$round.json" 2>"$out/bs_$1_$round.err"
    rows+=("serve $1+128 (run $round): $(python3 -c "
import json
d = json.load(open('$out/bs_$1_$round.json'))
print('; '.join('c%d %.1f tok/s TPOT %.1f ms TTFT p99 %.0f ms ok %d/%d' % (l['concurrency'], l['output_tok_s'],
      l['tpot_ms']['mean'], l['ttft_ms']['p99'], l['completed'], l['requests']) for l in d['levels']))" 2>&1 | tail -1)")
done
done
# sampled on the device: the same seed gives the same text; log-probabilities (logits brought back) too
req() {
    curl -s "$url/v1/completions" -H 'content-type: application/json' -d "{\"model\":\"qwen3-30b-a3b\",\"prompt\":\"The\",
        \"max_tokens\":24,\"temperature\":0.8,\"top_p\":0.9,\"seed\":$1,\"ignore_eos\":true$2}"
}
a=$(req 7 "") b=$(req 7 "") c=$(req 8 "") l=$(req 7 ',"logprobs":2')
rows+=("sampled: $(python3 -c "
import json, sys
a, b, c, l = (json.loads(x) for x in sys.argv[1:5])
ta, tb, tc, tl = (x['choices'][0]['text'] for x in (a, b, c, l))
lp = l['choices'][0]['logprobs']
print('seed 7 twice %s, seed 8 %s, with logprobs %s (%d entries)' % ('same' if ta == tb else 'DIFFER', 'differs' if tc != ta else 'SAME',
      'same text' if tl == ta else 'other text', len(lp['token_logprobs'])))" "$a" "$b" "$c" "$l" 2>&1 | tail -1)")
# where the scheduler thread's steps go (issue 27's overlap): per step, in the forward and outside it, and
# the decode graphs the server captured (sizes padded up to plan_decode_graph_sizes)
metric() { curl -s "$url/metrics" | awk -v m="$1" '$1 == m {print $2; exit}'; }
for c in 1 16 64; do
    f0=$(metric moeserve_engine_forward_seconds_total) h0=$(metric moeserve_engine_host_seconds_total)
    s0=$(metric moeserve_engine_steps_total)
    "$d/moeserve" bench serve --url "$url" --concurrency $c --requests $((c * 4)) --input-len 16 --output-len 128 \
        >/dev/null 2>&1
    f1=$(metric moeserve_engine_forward_seconds_total) h1=$(metric moeserve_engine_host_seconds_total)
    s1=$(metric moeserve_engine_steps_total)
    rows+=("steps c$c: $(python3 -c "
f, h, s = $f1 - $f0, $h1 - $h0, max($s1 - $s0, 1)
print('%d steps, forward %.0f us, host %.0f us a step (host %.1f%%)' % (s, f / s * 1e6, h / s * 1e6, 100 * h / max(f + h, 1e-9)))")")
done
kill -TERM $sp
wait $sp
rows+=("decode graphs: $(grep -c 'decode graph of' "$out/serve.err") captured; last: $(grep 'decode graph of' "$out/serve.err" | tail -1 | sed 's/.*captured: //')")
rows+=("server log: $(grep -c 'cancelled' "$out/serve.err") cancelled, $(grep -ci 'error' "$out/serve.err") error lines")
"$d/moeserve" bench --backend cuda --synthetic qwen3-30b-a3b --batch 1,16,64 --prompt-len 512 --decode-context 16 \
    --decode 128 --json >"$out/engine.json" 2>"$out/engine.err"
rows+=("engine (bench): $(python3 -c "
import json
d = json.load(open('$out/engine.json'))
print(' '.join('b%s %.1f tok/s %.2f ms/step' % (x['batch'], x['tok_s'], x['ms_per_step']) for x in d['decode']))" 2>&1 | tail -1)")
printf '%s\n' "${rows[@]}"
(cd "$out" && tar -czf /tmp/gpu_serve.tgz . && find . -mindepth 1 -delete && mv /tmp/gpu_serve.tgz .)
