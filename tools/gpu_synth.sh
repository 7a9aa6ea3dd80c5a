#!/usr/bin/env bash
# gpu_synth.sh — on the GPU machine, one call: synthetic weights made on the device (bench
# --synthetic, format/weight_synth.h). test_weight_synth_cuda (kernel = host bytes, CUDA = CPU
# logits), test_allreduce_cuda (the P2P all-reduce kernels, two processes), then Qwen3-30B-A3B
# NVFP4 with weights made on the GPU against the same shapes read from a written checkpoint, and
# GLM-5's first LAYERS layers (default 20: 3 dense + 17 MoE, ~100 GB) made on the GPU: decode at
# batch 1/8/64 over random 2048-token contexts, prefill 4096, and the one-rank NCCL path. Table last.
#
#   carry [".carry/ab", ".carry/lib"]    NEW=new [LAYERS=20] tools/gpu_synth.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_synth}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}:/usr/lib/x86_64-linux-gnu"
export NCCL_NVLS_ENABLE=0
d=/tmp/abx-${NEW:-new}
rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d" || exit 2
rows=()
for t in test_weight_synth_cuda test_allreduce_cuda; do
    MOESERVE_SRC="$src" TMPDIR="$d" timeout 300 "$d/tests/$t" >"$out/$t.log" 2>&1
    rows+=("$t rc $? ($(grep -c '^\[       OK' "$out/$t.log") ok) $(grep -o 'rel [0-9.e+-]*' "$out/$t.log" | tr '\n' ' ')")
done
summ() { # a bench --json file: decode tok/s per batch, prefill tok/s, weights GB
    python3 -c "
import json, sys
try:
    d = json.load(open('$1'))
    print(' '.join('b%s %.1f' % (x['batch'], x['tok_s']) for x in d['decode']), '| prefill %.0f tok/s' % d['prefill']['tok_s'],
          '| weights %.1f GB' % (d.get('weights_bytes', 0) / 1e9))
except Exception as e:
    print('failed (%s)' % e)"
}
timed() { # runs the command; its wall seconds go to stderr last
    local t0=$SECONDS
    "$@"
    local rc=$?
    echo "rc $rc, $((SECONDS - t0)) s" >&2
    return $rc
}
made() { grep -o 'making synthetic weights: .*' "$1" | tail -1 | sed 's/.*, //'; }
q=/tmp/qwen3-30b-nvfp4
[ -f "$q/config.json" ] || "$d/make_synth_checkpoint" --out "$q" --preset qwen3-30b-a3b --format nvfp4 >"$out/make_q.log" 2>&1
for how in file synth; do
    src_flag="--model $q"
    [ $how = synth ] && src_flag="--synthetic qwen3-30b-a3b"
    timed "$d/moeserve" bench --backend cuda $src_flag --batch 1,8,64 --prompt-len 2048 \
        --decode-context 128 --decode 64 --json >"$out/qwen3_$how.json" 2>"$out/qwen3_$how.err"
    rows+=("qwen3-30b-a3b nvfp4 $how: $(summ "$out/qwen3_$how.json") | run $(tail -1 "$out/qwen3_$how.err") $(made "$out/qwen3_$how.err")")
done
L=${LAYERS:-20}
for tp in none 1; do
    flag=
    [ $tp = 1 ] && flag="--tensor-parallel 1"
    timed timeout 500 "$d/moeserve" bench --backend cuda --synthetic glm5 --synthetic-layers "$L" $flag \
        --batch 1,8,64 --prompt-len 4096 --decode-context 2048 --context-fill random --decode 32 --json \
        >"$out/glm5_$tp.json" 2>"$out/glm5_$tp.err"
    rows+=("glm5 $L layers nvfp4 synth tp $tp: $(summ "$out/glm5_$tp.json") | run $(tail -1 "$out/glm5_$tp.err") $(made "$out/glm5_$tp.err")")
    [ "${QUICK:-0}" = 1 ] && break
done
printf '%s\n' "${rows[@]}"
(cd "$out" && tar -czf /tmp/gpu_synth.tgz . && find . -mindepth 1 -delete && mv /tmp/gpu_synth.tgz .)
