#!/usr/bin/env bash
# gpu_tool_fixtures.sh — on the GPU machine (transformers there): the tool-chat fixtures rendered by
# transformers itself, into $OUT/tool_chats.jsonl (copy to tests/golden/templates/tool_chats.jsonl).
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_tool_fixtures}
mkdir -p "$out"
python3 "$src/tools/make_tool_template_fixtures.py" "$out/tool_chats.jsonl"
wc -l "$out/tool_chats.jsonl"
