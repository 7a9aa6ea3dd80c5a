#!/usr/bin/env bash
# gpu_moe_grouped.sh — on the GPU machine: the grouped expert kernel (moe_grouped_mma_bf16) against
# the sorted wgmma GEMM it replaces at 9-64 tokens, in one call: the MoE op tests, the goldens, the
# GLM-5 slice (L1=2, L2=4, bf16 cache, context 2048) at BATCHES with the plan's choice and with
# moe_experts forced back to moe_gemm_nvfp4_wo_wgmma (and to the grouped kernel at 1 token), then synthetic Qwen3-30B-A3B NVFP4 decode at
# QWEN_BATCHES both ways. A table last; logs in $OUT.
#
#   carry [".carry/ab", ".carry/lib"]
#   NEW=new [BATCHES=1,32,64] [QWEN_BATCHES=16,32,48,64] [QWEN_ROUNDS=1]
#   [QWEN_FORMS="plan wgmma grouped"] [PROFILE_BATCHES="32 48"] [SKIP_GLM5=1] tools/gpu_moe_grouped.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_moe_grouped}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
d=/tmp/abx-${NEW:-new}
[ -x "$d/moeserve" ] || { rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d"; } || exit 2
rows=()
run() { # name, command...
    local name=$1 t0=$SECONDS
    shift
    "$@" >"$out/$name.log" 2>"$out/$name.err"
    local rc=$?
    rows+=("$(printf '%-28s rc %-3s %4ss' "$name" $rc $((SECONDS - t0)))")
    return $rc
}
run test_ops_moe_cuda env MOESERVE_SRC="$src" TMPDIR="$d" timeout 250 "$d/tests/test_ops_moe_cuda"
run test_golden_cuda env MOESERVE_SRC="$src" TMPDIR="$d" timeout 250 "$d/tests/test_golden_cuda"
wgmma="moe_experts@9-32:moe_gemm_nvfp4_wo_wgmma,moe_experts@33-64:moe_gemm_nvfp4_wo_wgmma"
# the other form: wgmma at 9-64 tokens, and the grouped kernel at 1 token (in place of the pair kernel)
other="$wgmma,moe_experts@1:moe_grouped_mma_bf16"
[ "${SKIP_GLM5:-0}" = 1 ] || for form in plan wgmma; do
    force=
    [ $form = wgmma ] && force=$other
    run "glm5_$form" env MOESERVE_CUDA_FORCE=$force L1=2 L2=4 BATCHES=${BATCHES:-1,32,64} DECODE_STEPS=16 \
        TIME_BUDGET=150 OUT="$out/glm5_$form" timeout 280 "$src/tools/bench_glm5_slice.sh" "$d"
done
q=/tmp/qwen3-30b-nvfp4
if ! [ -f "$q/.complete" ]; then # the marker tools/profile_step.sh and ab_run.sh check
    run make_qwen3 "$d/make_synth_checkpoint" --out "$q" --preset qwen3-30b-a3b --format nvfp4 &&
        echo "qwen3-30b-a3b nvfp4 layers=48" >"$q/.complete"
fi
# QWEN_FORMS: plan, wgmma (9-64 tokens), grouped (every bucket from 2 tokens)
grouped="moe_experts@2-8:moe_grouped_mma_bf16,moe_experts@9-32:moe_grouped_mma_bf16"
for round in $(seq 1 ${QWEN_ROUNDS:-1}); do
    for form in ${QWEN_FORMS:-plan wgmma}; do
        force=
        [ $form = wgmma ] && force=$wgmma
        [ $form = grouped ] && force=$grouped
        run "qwen3_${form}_$round" env MOESERVE_CUDA_FORCE=$force timeout 200 "$d/moeserve" bench --backend cuda \
            --model "$q" --batch ${QWEN_BATCHES:-16,32,48,64} --prompt-len 128 --decode-context 128 --decode 32 --json
    done
done
# PROFILE_BATCHES: a whole Qwen3 decode step kernel by kernel (tools/profile_step.sh) at each batch
for b in ${PROFILE_BATCHES:-}; do
    run "profile_qwen3_b$b" env SYNTH_DIR=$q BATCH=$b OUT="$out/profile_qwen3_b$b" timeout 200 \
        "$src/tools/profile_step.sh" "$d"
done
[ "${SKIP_GLM5:-0}" = 1 ] || for form in plan wgmma; do
    echo "-- GLM-5 $form"
    grep -A6 "^GLM-5 slice" "$out/glm5_$form.log" "$out/glm5_$form.err" | head -9
done
for f in "$out"/qwen3_*.log; do
    python3 - "$f" <<'PY'
import json, re, sys
t = open(sys.argv[1]).read()  # the bench JSON (stderr in .err)
try:
    j = json.loads(t[t.index("{"):])
    print(sys.argv[1].split("/")[-1], " ".join(f"b{r.get('batch')} {r.get('tok_s') or 0:.1f}" for r in j.get("decode", [])))
except Exception as e:
    print(sys.argv[1].split("/")[-1], "no figure:", e, t[-300:])
PY
done
for b in ${PROFILE_BATCHES:-}; do echo "-- profile b$b" && head -14 "$out/profile_qwen3_b$b/profile_step.txt"; done
grep -hE "PASSED|FAILED|SKIP" "$out"/test_*.log | tail -8
printf '%s\n' "${rows[@]}"
# everything in one archive (the device tool brings back a few files)
(cd "$out" && tar -czf /tmp/gpu_moe_grouped.tgz --exclude='*.csv' . && find . -mindepth 1 -delete && mv /tmp/gpu_moe_grouped.tgz .)
