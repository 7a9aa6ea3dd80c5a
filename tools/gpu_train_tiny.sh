#!/usr/bin/env bash
# gpu_train_tiny.sh — on the GPU machine, one call: retrain models/moeserve-tiny (tools/train_tiny.py,
# KJV chapters + ChatML conversations), quantize it to NVFP4 with the carried moeserve, and make
# the greedy-continuation reference of tests/cli/text_cli.sh with transformers
# (tools/eval_ppl_hf.py --generate). $OUT gets tiny.tgz (the NVFP4 model directory, to unpack over
# models/moeserve-tiny, whose README stays), generate_tiny.json and train.log.
#
#   here: tools/get_corpus.sh .carry/kjv.txt; pack a build with moeserve into .carry/ab/NAME.tar.xz
#   carry [".carry/ab", ".carry/lib", ".carry/kjv.txt"]: NEW=NAME [STEPS=1200] tools/gpu_train_tiny.sh
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_train_tiny}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
d=/tmp/abx-${NEW:-new}
rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d"
rm -rf /tmp/tiny-bf16 /tmp/tiny-nvfp4
python3 "$src/tools/train_tiny.py" "$src/.carry/kjv.txt" /tmp/tiny-bf16 --steps "${STEPS:-1200}" >"$out/train.log" 2>&1 ||
    { tail -30 "$out/train.log"; exit 1; }
"$d/moeserve" quantize --in /tmp/tiny-bf16 --out /tmp/tiny-nvfp4 --format nvfp4 >"$out/quantize.log" 2>&1 ||
    { tail -20 "$out/quantize.log"; exit 1; }
for f in val.txt train_log.json; do cp /tmp/tiny-bf16/$f /tmp/tiny-nvfp4/ 2>/dev/null || true; done
python3 "$src/tools/eval_ppl_hf.py" /tmp/tiny-nvfp4 /tmp/tiny-nvfp4/val.txt --generate "And God said" --new 40 \
    --gen-out "$out/generate_tiny.json" >"$out/eval.log" 2>&1 || { tail -20 "$out/eval.log"; exit 1; }
tar -czf "$out/tiny.tgz" -C /tmp/tiny-nvfp4 .
for s in 1 2 3; do
    "$d/moeserve" generate --model /tmp/tiny-nvfp4 --chat --prompt "Hello" -n 40 --temperature 1 --seed $s \
        2>/dev/null | tr '\n' ',' | head -c 300; echo
done >"$out/hello_ids.txt"
grep -E '^\{"step"|best validation|sample:|chat ' "$out/train.log" | tail -12
tail -3 "$out/eval.log"
ls -la "$out"
