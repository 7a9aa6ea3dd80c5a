#!/usr/bin/env bash
# trace_run.sh — on the GPU machine: the kernel-trace build (-DMOESERVE_KERNEL_TRACE=ON, packed
# here as .carry/bin/moeserve-kt.xz) over a batch-1 bench, once per line of $VARIANTS
# ("name ENV=VALUE ..."); each trace and its tools/ktrace_summary.py summary go to $OUT.
#
#   VARIANTS=$'default\ncc MOESERVE_CUDA_FORCE=linear@1:gemv_x_smem' tools/trace_run.sh [LAUNCHES]
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/trace_run}
mkdir -p "$out"
bin=/tmp/moeserve-kt
xz -dc "$src/.carry/bin/moeserve-kt.xz" >"$bin" && chmod +x "$bin" || exit 2
synth=${SYNTH_DIR:-/tmp/synth-30b-nvfp4}
[ -f "$synth/.complete" ] || { echo "no synthetic checkpoint in $synth (tools/decode_iter.sh makes it)"; exit 2; }
while IFS= read -r line; do
    [ -z "$line" ] && continue
    name=${line%% *}
    envs=""
    [ "$name" != "$line" ] && envs=${line#* }
    # shellcheck disable=SC2086
    env $envs MOESERVE_TRACE_OUT="$out/trace_$name.txt" "$bin" bench --model "$synth" --backend cuda --batch 1 \
        --prompt-len 128 --decode 16 --json >"$out/bench_kt_$name.json" 2>"$out/bench_kt_$name.err"
    python3 "$src/tools/ktrace_summary.py" "$out/trace_$name.txt" "${1:-24}" >"$out/sum_$name.txt" 2>&1
    gzip -f "$out/trace_$name.txt"
    echo "== $name [$envs]"
    cat "$out/sum_$name.txt"
done <<<"${VARIANTS:-default}"
