#!/usr/bin/env bash
# gpu_soak.sh — issue 27's soak on the GPU, one call: `serve --backend cuda` on synthetic Qwen3-30B-A3B
# NVFP4 (the Qwen3 tokenizer from .carry/tok) under SOAK_S seconds (default 510: a call is at most 600)
# of mixed load: rounds of concurrency 1, 4, 16, 64 with prompts of 16, 256, 1024, 2048 tokens
# (`bench serve`, whose clients never cancel) while a third as many other clients open streams
# and drop them after 0.2-1 s. Checked: no failed bench request, every dropped stream freed (running
# 0 and KV usage 0 after the load), server RSS and GPU memory at the start and the end of the load.
# A table last; logs in $OUT.
#
#   carry [".carry/ab", ".carry/lib", ".carry/tok"]    NEW=new [SOAK_S=510] tools/gpu_soak.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_soak}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}:/usr/lib/x86_64-linux-gnu"
d=/tmp/abx-${NEW:-new}
[ -x "$d/moeserve" ] || { rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d"; } || exit 2
# SERVE_ARGS: another model or backend (a dry run on a CPU: SERVE_ARGS="--max-seqs 64" MODEL_ID=moeserve-tiny)
"$d/moeserve" serve ${SERVE_ARGS:---backend cuda --synthetic qwen3-30b-a3b --tokenizer $src/.carry/tok --max-seqs 64} \
    --port 0 >"$out/serve.out" 2>"$out/serve.err" &
sp=$!
for _ in $(seq 1 240); do grep -q listening "$out/serve.out" 2>/dev/null && break; sleep 0.5; done
url=$(grep -o 'http://[0-9.:]*' "$out/serve.out" | head -1)
[ -n "$url" ] || { echo "serve did not start: $(tail -3 "$out/serve.err")"; exit 1; }
rss() { awk '/VmRSS/ {print $2 / 1024}' /proc/$sp/status; }
gpu() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }
metric() { curl -s "$url/metrics" | awk -v m="$1" 'index($1, m) == 1 {print $2; exit}'; }
dropper() { # n streams, each dropped after 0.2-1 s
    for i in $(seq 1 "$1"); do
        curl -sN --max-time "0.$((RANDOM % 9 + 2))$((RANDOM % 2))" "$url/v1/completions" -H 'content-type: application/json' \
            -d "{\"model\":\"${MODEL_ID:-qwen3-30b-a3b}\",\"prompt\":\"drop $i $RANDOM\",\"max_tokens\":${DROP_TOKENS:-2000},\"ignore_eos\":true,\"stream\":true}" \
            >/dev/null 2>&1 &
    done
    wait
}
# warm-up, then the baseline
"$d/moeserve" bench serve --url "$url" --concurrency 64 --requests 128 --input-len 512 --output-len 32 >/dev/null 2>&1
rss0=$(rss) gpu0=$(gpu)
t_end=$((SECONDS + ${SOAK_S:-510}))
rounds=0 reqs=0 failed=0 dropped=0
while [ $SECONDS -lt $t_end ]; do
    for c in 1 4 16 64; do
        for len in ${SOAK_LENS:-16 256 1024 2048}; do
            [ $SECONDS -lt $t_end ] || break 2
            nd=$(( (c + 2) / 3 ))
            dropper $nd &
            dp=$!
            "$d/moeserve" bench serve --url "$url" --concurrency $c --requests $((c * 2)) --input-len $len --output-len 64 \
                --json >"$out/r.json" 2>>"$out/bench.err"
            wait $dp
            read -r n ok < <(python3 -c "
import json
try:
    l = json.load(open('$out/r.json'))['levels'][0]; print(l['requests'], l['completed'])
except Exception:
    print(0, -1)")
            reqs=$((reqs + n)) failed=$((failed + n - ok)) dropped=$((dropped + nd))
        done
    done
    rounds=$((rounds + 1))
done
sleep 3
running=$(metric 'vllm:num_requests_running') usage=$(metric 'vllm:kv_cache_usage_perc')
rss1=$(rss) gpu1=$(gpu)
kill -TERM $sp
wait $sp
echo "soak ${SOAK_S:-510} s: $rounds rounds, $reqs bench requests, $failed failed, $dropped streams dropped by their clients"
echo "after the load: running $running, KV usage $usage; server RSS $rss0 -> $rss1 MiB, GPU memory $gpu0 -> $gpu1 MiB"
echo "server log: $(grep -c 'client gone' "$out/serve.err") cancelled by their clients, $(grep -ci 'error' "$out/serve.err") error lines"
# the decode graph cache (cuda_graphs.c logs every capture with the totals): how many, and what they hold
echo "decode graphs: $(grep -c 'decode graph of' "$out/serve.err") captured; last: $(grep 'decode graph of' "$out/serve.err" | tail -1 | sed 's/.*captured: //')"
(cd "$out" && tar -czf /tmp/gpu_soak.tgz . && find . -mindepth 1 -delete && mv /tmp/gpu_soak.tgz .)
