#!/usr/bin/env bash
# bench_glm5_slice.sh — issue 7's benchmark on the GPU machine: per-layer decode time of a
# GLM-5-width slice (make_synth_checkpoint --preset glm5-slice, NVFP4, random weights) at batch
# 1 and 64 against the bytes a layer must read, and from it the estimate for the whole 78-layer
# model on 8x H200 and 8x RTX PRO 6000 that NOTES.md ("GLM-5 estimate (issue 7)") describes.
#
#   tools/bench_glm5_slice.sh [BUILD_DIR]      (default: build; needs BUILD_DIR/moeserve built
#                                               with CUDA and BUILD_DIR/make_synth_checkpoint)
#
# Method: two slices of L1 and L2 layers (1 dense + MoE layers each) run the same bench:
#   moeserve bench --backend cuda --batch 1,64 --prompt-len 256 --decode 32 --decode-context 2048
# per-layer decode time = (ms/step(L2) - ms/step(L1)) / (L2 - L1), which cancels embedding,
# lm_head, sampling, the dense layer and per-step launch overheads. Bytes one MoE layer reads per
# step = the difference of the bench's weight bytes per step (attention + indexer + router +
# shared expert + the routed experts touched: 8 at batch 1, 256 (1 - (1 - 8/256)^64) = 222.4
# expected at batch 64) divided the same way, plus the latent KV rows and indexer keys this
# engine reads (its cache is f32) for the timed steps' context, per sequence.
#
# Disk: only the L2 slice is written (42.9 GB for 8 layers: 5.56 GB per MoE layer, 3.8 GB of
# embedding + lm_head); the L1 slice is a directory with its own config.json and a link to the
# same model.safetensors (the loader reads layers 0..L-1 only). The write is skipped when
# $SLICE_DIR/L$L2 holds a complete one. Time: if the L1 bench took so long that L2 would end
# past TIME_BUDGET seconds since the start, L2 is lowered (a shorter link directory; at least
# L1 + 2) and the JSON records the layers used.
# Output: a table on stdout (tools/glm5_estimate.py); bench_L*.json/.log and glm5_slice.json (per-layer
# figures + the 8-GPU estimate) in $OUT when it is set (the device tool's folder), else in
# BUILD_DIR/bench_glm5/.
#
# Environment (defaults): L1 (4), L2 (8), BATCHES (1,64), PROMPT_LEN (256), DECODE_STEPS (32),
# DECODE_CONTEXT (2048), SLICE_DIR (/tmp/glm5-slice), BACKEND (cuda), KV_CACHE_DTYPE (unset: bf16;
# f32 for the reference cache), CONTEXT_FILL (unset: prefill; random: random cache rows, for
# 32768-token contexts without their prefill), SMEM_BUDGET (unset; e.g.
# 101376 plans an sm_120's tiles on the H200), TIME_BUDGET (220), STEP_TIMEOUT (200 s per step).
set -u
build=${1:-build}
build=$(cd "$build" && pwd) || exit 2
logs=${OUT:-$build/bench_glm5}
mkdir -p "$logs"
root=${SLICE_DIR:-/tmp/glm5-slice}
l1=${L1:-4}
l2=${L2:-8}
batches=${BATCHES:-1,64}
prompt_len=${PROMPT_LEN:-256}
steps=${DECODE_STEPS:-32}
context=${DECODE_CONTEXT:-2048}
backend=${BACKEND:-cuda}
budget=${TIME_BUDGET:-220}
step_timeout=${STEP_TIMEOUT:-200}
for bin in moeserve make_synth_checkpoint; do
    [ -x "$build/$bin" ] || { echo "bench_glm5_slice: $build/$bin is not built" >&2; exit 2; }
done
if ! [ "$l1" -ge 1 ] 2>/dev/null || ! [ "$l2" -gt "$l1" ] 2>/dev/null; then
    echo "bench_glm5_slice: need 1 <= L1 < L2 (got L1=$l1 L2=$l2)" >&2
    exit 2
fi
command -v python3 >/dev/null || { echo "bench_glm5_slice: python3 is needed for the analysis" >&2; exit 2; }
synth() { "$build/make_synth_checkpoint" --preset glm5-slice --format nvfp4 "$@"; }

t_all=$SECONDS
stamp() { echo "[$((SECONDS - t_all)) s] $*"; }
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv >"$logs/gpu.txt" 2>&1
    cat "$logs/gpu.txt"
fi

# 1. the L2 slice, written once; .complete is written last, so a cut-off write is never reused
long=$root/L$l2
want="glm5-slice nvfp4 layers=$l2 seed=1"
mkdir -p "$root"
if [ -f "$long/.complete" ] && [ "$(cat "$long/.complete")" = "$want" ]; then
    stamp "checkpoint: reusing $long ($want)"
else
    rm -rf "$long"
    mkdir -p "$long"
    need=$(synth --out "$long" --layers "$l2" --config-only) ||
        { echo "bench_glm5_slice: cannot plan the slice" >&2; exit 1; }
    avail=$(df -PB1 "$long" | awk 'NR == 2 {print $4}')
    if [ -n "$avail" ] && [ "$avail" -lt "$need" ]; then
        echo "bench_glm5_slice: $long: $((avail / 1000000000)) GB free, the $l2-layer slice needs" \
            "$((need / 1000000000)) GB (set SLICE_DIR to a larger disk, or a smaller L2)" >&2
        exit 1
    fi
    stamp "checkpoint: writing $long ($want, $((need / 1000000)) MB)"
    timeout "$step_timeout" "$build/make_synth_checkpoint" --out "$long" --preset glm5-slice --format nvfp4 \
        --layers "$l2" >"$logs/make_synth.log" 2>&1
    rc=$?
    tr '\r' '\n' <"$logs/make_synth.log" | tail -n 1
    [ $rc = 0 ] || { echo "bench_glm5_slice: make_synth_checkpoint failed with exit $rc" >&2; exit 1; }
    echo "$want" >"$long/.complete"
fi

# A shorter slice: its own config.json, the long slice's weights through a link.
slice_dir() {
    local d=$root/L$1
    [ "$1" = "$l2" ] && { echo "$long"; return 0; }
    rm -rf "$d" && mkdir -p "$d" && synth --out "$d" --layers "$1" --config-only >/dev/null &&
        ln -s "$long/model.safetensors" "$d/model.safetensors" && echo "$d"
}

# 2. the two benches (L1 first: its time bounds L2's)
bench_slice() { # $1 = layers; sets bench_s
    local dir t0=$SECONDS
    dir=$(slice_dir "$1") || { echo "bench_glm5_slice: cannot make the $1-layer slice" >&2; return 1; }
    stamp "moeserve bench --backend $backend, $1 layers ($dir)"
    timeout "$step_timeout" "$build/moeserve" bench --backend "$backend" --model "$dir" --batch "$batches" \
        --prompt-len "$prompt_len" --decode "$steps" --decode-context "$context" \
        ${SMEM_BUDGET:+--smem-budget "$SMEM_BUDGET"} ${KV_CACHE_DTYPE:+--kv-cache-dtype "$KV_CACHE_DTYPE"} \
        ${CONTEXT_FILL:+--context-fill "$CONTEXT_FILL"} --json \
        >"$logs/bench_L$1.json" 2>"$logs/bench_L$1.log"
    local rc=$?
    bench_s=$((SECONDS - t0))
    stamp "bench of $1 layers: exit $rc, $bench_s s"
    # exit 1 with JSON: one batch size failed, its row says why
    [ -s "$logs/bench_L$1.json" ] || { tail -n 5 "$logs/bench_L$1.log" >&2; return 1; }
}
bench_slice "$l1" || exit 1
left=$((budget - (SECONDS - t_all)))
w1=$((bench_s > 0 ? bench_s : 1))
if [ $((w1 * l2 / l1)) -gt "$left" ]; then
    # a bench's time grows at most in proportion to the layers (lm_head, start-up do not)
    fit=$((left * l1 / w1))
    if [ "$fit" -lt $((l1 + 2)) ]; then
        echo "bench_glm5_slice: the $l1-layer bench took ${w1} s; $left s are left of TIME_BUDGET=$budget," \
            "too few for $((l1 + 2)) layers" >&2
        exit 1
    fi
    stamp "L2 lowered from $l2 to $fit layers to stay within TIME_BUDGET=$budget s"
    l2_run=$fit
else
    l2_run=$l2
fi
bench_slice "$l2_run" || exit 1

# 3. per-layer figures and the 8-GPU estimate
python3 "$(dirname "$0")/glm5_estimate.py" --l1-json "$logs/bench_L$l1.json" --l2-json "$logs/bench_L$l2_run.json" \
    --l1 "$l1" --l2 "$l2_run" --config "$long/config.json" --context "$context" --steps "$steps" \
    --kv-dtype "${KV_CACHE_DTYPE:-bf16}" --json-out "$logs/glm5_slice.json" | tee "$logs/summary.txt"
rc=${PIPESTATUS[0]}
stamp "done; logs in $logs"
exit "$rc"
