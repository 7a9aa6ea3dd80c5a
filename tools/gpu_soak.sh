#!/usr/bin/env bash
# gpu_soak.sh — issue 27's soak on the GPU, one call: `serve --backend cuda` on synthetic Qwen3-30B-A3B
# NVFP4 (the Qwen3 tokenizer from .carry/tok) under SOAK_S seconds (default 510: a call is at most 600)
# of mixed load: rounds of concurrency 1, 4, 16, 64 with prompts of 16, 256, 1024, 2048 tokens
# (`bench serve`, whose clients never cancel) while a third as many other clients open streams
# and drop them after 0.2-1 s. Checked: no failed bench request, every dropped stream freed (running
# 0 and KV usage 0 after the load), server RSS and GPU memory at the start and the end of the load.
# A table last; logs in $OUT.
#
# Every bench level adds a line (seconds, server RSS MiB, GPU MiB, running, KV usage) to series.txt.
#
#   carry [".carry/ab", ".carry/lib", ".carry/tok"]    NEW=new [SOAK_S=510] tools/gpu_soak.sh
# Longer than a call (the issue's 10 minutes: SOAK_S=600): DETACH=1 starts the soak in a process
# session of its own (it outlives the call while the machine stays held: the next call must come
# within the machine's idle release) writing to /tmp/soak-run, and returns; COLLECT=1 [WAIT_S=N]
# waits for it (at most N seconds, default 590), prints its table or, still running, the series so
# far, and copies its logs to $OUT. Other jobs may run meanwhile (checks, not timings: they share
# the GPU).
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
run=/tmp/soak-run
if [ "${DETACH:-0}" = 1 ]; then
    rm -rf "$run" && mkdir -p "$run"
    date +%s >"$run/start"
    DETACH=0 OUT="$run/out" setsid nohup bash "$0" >"$run/stdout.txt" 2>&1 </dev/null &
    echo "soak started in its own session (pid $!), SOAK_S=${SOAK_S:-510}; COLLECT=1 reads it"
    exit 0
fi
if [ "${COLLECT:-0}" = 1 ]; then
    out=${OUT:-/tmp/gpu_soak}
    mkdir -p "$out"
    [ -f "$run/start" ] || { echo "no soak started on this machine (a fresh one?)"; exit 2; }
    t_end=$((SECONDS + ${WAIT_S:-590}))
    while [ ! -f "$run/done" ] && [ $SECONDS -lt $t_end ]; do sleep 5; done
    echo "soak: $(( $(date +%s) - $(cat "$run/start") )) s since its start, $([ -f "$run/done" ] && echo finished || echo 'still running')"
    if [ -f "$run/done" ]; then
        cat "$run/stdout.txt"
        cp "$run/out/"* "$out/" 2>/dev/null
    else
        tail -5 "$run/stdout.txt"
        echo "series so far (s, RSS MiB, GPU MiB, running, KV usage):"
        cat "$run/out/series.txt" 2>/dev/null
        cp "$run/out/series.txt" "$out/" 2>/dev/null
    fi
    exit 0
fi
out=${OUT:-/tmp/gpu_soak}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}:/usr/lib/x86_64-linux-gnu"
# a copy of its own: other jobs of the call unpack /tmp/abx-NAME afresh while the soak's clients run
d=/tmp/soak-${NEW:-new}
[ -x "$d/moeserve" ] || { rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d"; } || exit 2
# SERVE_ARGS: another model or backend (a dry run on a CPU: SERVE_ARGS="--max-seqs 64" MODEL_ID=moeserve-tiny)
"$d/moeserve" serve ${SERVE_ARGS:---backend cuda --synthetic qwen3-30b-a3b --tokenizer $src/.carry/tok --max-seqs 64} \
    --port 0 >"$out/serve.out" 2>"$out/serve.err" &
sp=$!
for _ in $(seq 1 240); do grep -q listening "$out/serve.out" 2>/dev/null && break; sleep 0.5; done
url=$(grep -o 'http://[0-9.:]*' "$out/serve.out" | head -1)
[ -n "$url" ] || { echo "serve did not start: $(tail -3 "$out/serve.err")"; exit 1; }
rss() { awk '/VmRSS/ {print $2 / 1024}' /proc/$sp/status; }
gpu() { local m; m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1); echo "${m:--}"; }
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
t0=$SECONDS
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
            echo "$((SECONDS - t0)) $(rss) $(gpu) $(metric 'vllm:num_requests_running') $(metric 'vllm:kv_cache_usage_perc') c$c len$len" \
                >>"$out/series.txt"
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
# the series in thirds: RSS and GPU memory should not climb after the first levels have made their graphs
python3 - "$out/series.txt" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
if rows:
    n = len(rows)
    for name, part in (("first third", rows[: n // 3 or 1]), ("middle third", rows[n // 3: 2 * n // 3] or rows),
                       ("last third", rows[2 * n // 3:] or rows)):
        rss = [float(r[1]) for r in part]
        gpu = [float(r[2]) for r in part if r[2].replace('.', '', 1).isdigit()]
        print(f"{name:12s} ({part[0][0]}-{part[-1][0]} s): RSS {min(rss):.0f}-{max(rss):.0f} MiB"
              + (f", GPU {min(gpu):.0f}-{max(gpu):.0f} MiB" if gpu else ""))
PY
(cd "$out" && tar -czf /tmp/gpu_soak.tgz . && find . -mindepth 1 ! -name series.txt -delete && mv /tmp/gpu_soak.tgz .)
[ -d "$run" ] && touch "$run/done"
