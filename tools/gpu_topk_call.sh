#!/usr/bin/env bash
# gpu_topk_call.sh — on the GPU machine, one call: DSA top-k variants packed against a baseline (the
# first of PACKS), checks first (CHECK_PACKS' MLA op tests and goldens at both budgets; the last pack's
# run inside gpu_glm5_b1.sh), then GLM-5 layer decode at 2048 and 32768 keys and a profile of one step
# at 32768 (PROFILE_BATCH, 1), NCU=1: ncu's stall reasons of mla_mma and dsa_score_mma at batch 1.
# Logs in one archive $OUT/all.tgz, a table last.
#   carry [".carry/ab", ".carry/lib"]
#   [PACKS="norms cb cbl"] [CHECK_PACKS="cb"] [ROUNDS_2K=3] [STEPS_2K=64] [ROUNDS_32K=2] [PROFILE_BATCH=1] [NCU=0]
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_topk_call}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
export MOESERVE_SRC="$src"
packs=${PACKS:-norms cb cbl}
PACKS="$packs" ROUNDS=${ROUNDS_2K:-3} BATCHES=1,64 DECODE_STEPS=${STEPS_2K:-64} TESTS="mla" GOLDENS=1 PROFILE=0 \
    OUT="$out/c2k" bash "$src/tools/gpu_glm5_b1.sh" >"$out/c2k.txt" 2>&1
checks=()
for p in ${CHECK_PACKS:-cb}; do
    timeout 200 "/tmp/abx-$p/tests/test_ops_mla_cuda" >"$out/mla_$p.log" 2>&1
    a=$?
    timeout 150 "/tmp/abx-$p/tests/test_golden_cuda" >"$out/golden_$p.log" 2>&1
    b=$?
    MOESERVE_SMEM_BUDGET=101376 timeout 150 "/tmp/abx-$p/tests/test_golden_cuda" >"$out/golden_small_$p.log" 2>&1
    checks+=("$p: op tests mla rc $a, goldens rc $b, goldens 101376 rc $?")
done
DECODE_CONTEXT=32768 PACKS="$packs" ROUNDS=${ROUNDS_32K:-2} DECODE_STEPS=32 TESTS= GOLDENS=0 PROFILE=1 \
    PROFILE_BATCH=${PROFILE_BATCH:-1} OUT="$out/c32k" bash "$src/tools/gpu_glm5_b1.sh" >"$out/c32k.txt" 2>&1
if [ "${NCU:-0}" = 1 ]; then
    SYNTHETIC=glm5-slice LAYERS=2 BENCH_ARGS="--decode-context 2048 --context-fill random" KERNELS='mla_mma|dsa_score_mma' \
        SKIP=10 COUNT=4 OUT="$out/ncu" timeout 200 bash "$src/tools/ncu_stalls.sh" "/tmp/abx-${packs##* }" >"$out/ncu.txt" 2>&1
fi
echo "== 2048"; grep -A30 "^ms a MoE" "$out/c2k.txt"
printf '%s\n' "${checks[@]}"
echo "== 32768"; grep -A12 "^ms a MoE" "$out/c32k.txt"; grep -A25 "one step" "$out/c32k.txt" | head -26
[ -f "$out/ncu.txt" ] && { echo "== ncu"; cat "$out/ncu.txt"; }
# the device tool brings back 8 files: everything in one archive
. "$src/tools/pack_out.sh"
pack_out "$out" all.tgz
