#!/usr/bin/env bash
# gpu_glm5_kv.sh — on the GPU machine: GLM-5 slice decode per latent-cache dtype and context, in one
# call. Runs tools/bench_glm5_slice.sh (L1=2, L2=4) for each CASE "dtype:context[:smem]" (context
# 32768 fills the cache with random rows instead of a prefill), then, for each PROFILE case
# "dtype:context", a kernel-by-kernel profile of one batch-1 decode step (tools/profile_step.sh),
# and the prefill of one prompt per PREFILL_FORMS (plan, absorbed, expanded: MOESERVE_CUDA_FORCE of
# mla_prefill) x PREFILL_LENS (2048 4096) on the 2- and 4-layer slices. A table last; logs in $OUT.
#
#   carry [".carry/ab", ".carry/lib"]
#   NEW=new [CASES="bf16:2048 fp8:2048 bf16:32768 fp8:32768 fp8:2048:101376"] [PROFILE="bf16:32768 fp8:32768"]
#   [BATCHES=1,64] [DECODE_STEPS=16] tools/gpu_glm5_kv.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_glm5_kv}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
d=/tmp/abx-${NEW:-new}
[ -x "$d/moeserve" ] || { rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d"; } || exit 2
rows=()
for c in ${CASES:-bf16:2048 fp8:2048 bf16:32768 fp8:32768 fp8:2048:101376}; do
    IFS=: read -r dt ctx smem <<<"$c"
    name="bench_${dt}_${ctx}${smem:+_$smem}"
    fill=
    [ "$ctx" -gt 4096 ] && fill=random
    t0=$SECONDS
    env KV_CACHE_DTYPE=$dt DECODE_CONTEXT=$ctx ${fill:+CONTEXT_FILL=$fill} ${smem:+SMEM_BUDGET=$smem} L1=2 L2=4 \
        BATCHES=${BATCHES:-1,64} DECODE_STEPS=${DECODE_STEPS:-16} TIME_BUDGET=${TIME_BUDGET:-150} \
        OUT="$out/$name" timeout 300 "$src/tools/bench_glm5_slice.sh" "$d" >"$out/$name.log" 2>&1
    rows+=("$(printf '%-32s rc %-3s %4ss' "$name" $? $((SECONDS - t0)))")
done
for c in ${PROFILE:-bf16:32768 fp8:32768}; do
    IFS=: read -r dt ctx <<<"$c"
    fill=
    [ "$ctx" -gt 4096 ] && fill="--context-fill random"
    PRESET=glm5-slice LAYERS=2 SYNTH_DIR=/tmp/glm5-2 BATCH=1 STEP=last \
        BENCH_ARGS="--decode-context $ctx $fill --kv-cache-dtype $dt" SKIP_LAUNCHES=400 LAUNCHES=300 DECODE=8 \
        PROMPT_LEN=64 OUT="$out/profile_${dt}_$ctx" timeout 200 "$src/tools/profile_step.sh" "$d" \
        >"$out/profile_${dt}_$ctx.log" 2>&1
    rows+=("$(printf '%-32s rc %-3s' "profile b1 $dt $ctx" $?)")
done
# prefill of one prompt per form of the dense MLA pass and length, on the benches' 2- and 4-layer
# slices (their difference / 2 = one MoE layer), PREFILL_FORMS=plan,absorbed,expanded
slices=${SLICE_DIR:-/tmp/glm5-slice}
pre=()
for form in ${PREFILL_FORMS:-plan absorbed expanded}; do
    for len in ${PREFILL_LENS:-2048 4096}; do
        force=
        [ "$form" != plan ] && force="mla_prefill:mla_prefill_$form"
        for L in 2 4; do
            [ -d "$slices/L$L" ] || continue
            MOESERVE_CUDA_FORCE=$force timeout 200 "$d/moeserve" bench --backend cuda --model "$slices/L$L" \
                --prompt-len "$len" --batch 1 --decode 2 --json >"$out/prefill_${form}_${len}_L$L.json" \
                2>"$out/prefill_${form}_${len}_L$L.log"
        done
        pre+=("$(python3 - "$out/prefill_${form}_${len}_L2.json" "$out/prefill_${form}_${len}_L4.json" "$form" "$len" <<'PY'
import json, sys
try:
    a, b = (json.load(open(f))["prefill"]["seconds"] for f in sys.argv[1:3])
    print(f"prefill {sys.argv[3]:9s} {sys.argv[4]:>5s} tokens: {(b - a) / 2 * 1e3:8.2f} ms a MoE layer "
          f"(2 layers {a * 1e3:.1f} ms, 4 layers {b * 1e3:.1f} ms)")
except Exception as e:
    print(f"prefill {sys.argv[3]} {sys.argv[4]}: no figure ({e})")
PY
)")
    done
done
for c in ${PROFILE:-bf16:32768 fp8:32768}; do
    IFS=: read -r dt ctx <<<"$c"
    echo "-- profile b1 $dt $ctx"
    head -30 "$out/profile_${dt}_$ctx/profile_step.txt" 2>/dev/null
done
for f in "$out"/bench_*.log; do echo "-- $(basename "$f" .log)" && grep -A4 "^GLM-5 slice" "$f"; done
printf '%s\n' "${pre[@]}" "${rows[@]}"
