#!/usr/bin/env bash
# gpu_glm5_check.sh — on the GPU machine, one call for the GLM-5 kernels: the packed new build's
# MLA op tests (both budgets), the golden fixtures (default budget and 101376), a kernel-by-kernel
# profile of one batch-1 decode step of a 2-layer GLM-5 slice at context 2048, then (unless
# SKIP_BENCH=1) tools/bench_glm5_slice.sh with L1=2, L2=4. A table last; logs in $OUT.
#
#   carry [".carry/ab", ".carry/lib"]
#   NEW=new [SKIP_BENCH=1] [SMALL_BENCH=1] [ALL_OPS=1] [SANITIZE=1] [KV_CACHE_DTYPE=f32] [BATCHES=1,64]
#   [PROFILE_BATCHES=1,64] tools/gpu_glm5_check.sh
set -u
PROFILE_BATCHES=${PROFILE_BATCHES:-1,64}
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_glm5_check}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
d=/tmp/abx-${NEW:-new}
rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d" || exit 2
rows=()
run() { # run NAME LOG ENV... -- COMMAND...
    local name=$1 log=$2 t0=$SECONDS
    shift 2
    env MOESERVE_SRC="$src" TMPDIR="$d" "$@" >"$out/$log" 2>&1
    local rc=$?
    rows+=("$(printf '%-36s rc %-3s %4ss  %s failed' "$name" "$rc" $((SECONDS - t0)) "$(grep -cE '^\[  FAILED  \]' "$out/$log")")")
}
run "op tests mla" ops_mla.log timeout 240 "$d/tests/test_ops_mla_cuda"
if [ "${ALL_OPS:-0}" = 1 ]; then # the other families (shared launch rules: splits, the MoE range)
    for t in "$d"/tests/test_ops_*_cuda; do
        [ "$(basename "$t")" = test_ops_mla_cuda ] && continue
        run "op tests $(basename "$t" | sed 's/test_ops_//; s/_cuda//')" "$(basename "$t").log" timeout 240 "$t"
    done
fi
if [ "${SANITIZE:-0}" = 1 ]; then # the MLA kernels under compute-sanitizer
    run "memcheck mla" memcheck_mla.log MOESERVE_OPS_QUICK=1 timeout 200 compute-sanitizer --tool memcheck \
        --error-exitcode 9 "$d/tests/test_ops_mla_cuda"
    run "racecheck mla" racecheck_mla.log MOESERVE_OPS_QUICK=1 timeout 300 compute-sanitizer --tool racecheck \
        --error-exitcode 9 "$d/tests/test_ops_mla_cuda"
fi
run "goldens" golden.log timeout 120 "$d/tests/test_golden_cuda"
run "goldens, smem 101376" golden_small.log MOESERVE_SMEM_BUDGET=101376 timeout 120 "$d/tests/test_golden_cuda"
# every dense MLA pass in the expanded form (the fixtures' prompts are shorter than the plan's crossover)
run "goldens, mla expanded" golden_expanded.log MOESERVE_CUDA_FORCE=mla_prefill:mla_prefill_expanded \
    timeout 120 "$d/tests/test_golden_cuda"
"$d/moeserve" plan --device 0 >"$out/plan.txt" 2>&1
# one decode step per batch size of PROFILE_BATCHES (default 1,64): the window's last whole step
for pb in ${PROFILE_BATCHES//,/ }; do
    # past the bench's prefills: a 64-token warm-up, then one pass per 2048-token sequence (~156
    # launches each) and the untimed steps; batch 1 measured at 400
    skip=$((pb == 1 ? 400 : pb * 156 + 600))
    PRESET=glm5-slice LAYERS=2 SYNTH_DIR=/tmp/glm5-2 BATCH=$pb STEP=last \
        BENCH_ARGS="--decode-context 2048 ${KV_CACHE_DTYPE:+--kv-cache-dtype $KV_CACHE_DTYPE}" \
        SKIP_LAUNCHES=${PROFILE_SKIP:-$skip} LAUNCHES=${PROFILE_LAUNCHES:-300} DECODE=8 PROMPT_LEN=64 \
        OUT="$out/profile_b$pb" timeout 200 "$src/tools/profile_step.sh" "$d" >"$out/profile_b$pb.log" 2>&1
    rows+=("$(printf '%-36s rc %-3s' "profile glm5 b$pb step" $?)")
done
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    L1=2 L2=4 BATCHES=${BATCHES:-1,64} DECODE_STEPS=${DECODE_STEPS:-16} TIME_BUDGET=${TIME_BUDGET:-200} \
        OUT="$out/bench" timeout 330 "$src/tools/bench_glm5_slice.sh" "$d" >"$out/bench.log" 2>&1
    rows+=("$(printf '%-36s rc %-3s' "bench_glm5_slice L1=2 L2=4" $?)")
    if [ "${SMALL_BENCH:-0}" = 1 ]; then # the sm_120 budget's tiles
        SMEM_BUDGET=101376 L1=2 L2=4 BATCHES=${BATCHES:-1,64} DECODE_STEPS=${DECODE_STEPS:-16} \
            TIME_BUDGET=${TIME_BUDGET:-200} OUT="$out/bench_small" timeout 330 "$src/tools/bench_glm5_slice.sh" "$d" \
            >"$out/bench_small.log" 2>&1
        rows+=("$(printf '%-36s rc %-3s' "bench_glm5_slice, smem 101376" $?)")
    fi
fi
echo "==== $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
grep -E "rel err|identical|plan:" "$out/ops_mla.log" | sed 's/^ *//' | sort | uniq | tail -40
grep -E "mla_attention|dsa_index" "$out/plan.txt" | cut -c1-100
for pb in ${PROFILE_BATCHES//,/ }; do echo "-- b$pb"; head -36 "$out/profile_b$pb/profile_step.txt" 2>/dev/null; done
for f in bench.log bench_small.log; do [ -f "$out/$f" ] && echo "-- $f" && grep -A4 "^GLM-5 slice" "$out/$f"; done
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$out"/memcheck_mla.log "$out"/racecheck_mla.log 2>/dev/null
for f in golden.log golden_small.log golden_expanded.log; do echo "-- $f"; grep -E "dsa|PASSED|FAILED" "$out/$f" | head -30; done
printf '%s\n' "${rows[@]}"
