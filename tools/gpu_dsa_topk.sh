#!/usr/bin/env bash
# gpu_dsa_topk.sh — on the GPU machine: a dsa_topk variant (build TOPK) against NEW at the long
# context where the top-k selection matters: TOPK's MLA op tests, then the GLM-5 slice (L1=2, L2=4)
# at batch 1 and BATCHES with the fp8 cache at 32768 random rows, each build, and one profiled
# batch-1 step of each (tools/profile_step.sh). A table last; logs in $OUT (one archive).
#
#   carry [".carry/ab", ".carry/lib"]    NEW=new TOPK=topk [BATCHES=1,64] tools/gpu_dsa_topk.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_dsa_topk}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
rows=()
for b in ${NEW:-new} ${TOPK:-topk}; do
    d=/tmp/abx-$b
    [ -x "$d/moeserve" ] || { rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/$b.tar.xz" -C "$d"; } || exit 2
done
dn=/tmp/abx-${NEW:-new} dt=/tmp/abx-${TOPK:-topk}
cp -n "$dn/make_synth_checkpoint" "$dt/" 2>/dev/null
t0=$SECONDS
MOESERVE_SRC="$src" TMPDIR="$dt" timeout 250 "$dt/tests/test_ops_mla_cuda" >"$out/ops_mla_topk.log" 2>&1
rows+=("$(printf '%-28s rc %-3s %4ss' "test_ops_mla_cuda (topk)" $? $((SECONDS - t0)))")
for b in ${NEW:-new} ${TOPK:-topk}; do
    t0=$SECONDS
    env KV_CACHE_DTYPE=fp8 DECODE_CONTEXT=32768 CONTEXT_FILL=random L1=2 L2=4 BATCHES=${BATCHES:-1,64} \
        DECODE_STEPS=16 TIME_BUDGET=150 OUT="$out/bench_$b" timeout 280 "$src/tools/bench_glm5_slice.sh" \
        "/tmp/abx-$b" >"$out/bench_$b.log" 2>&1
    rows+=("$(printf '%-28s rc %-3s %4ss' "bench fp8 32768 $b" $? $((SECONDS - t0)))")
    t0=$SECONDS
    PRESET=glm5-slice LAYERS=2 SYNTH_DIR=/tmp/glm5-2 BATCH=1 STEP=last \
        BENCH_ARGS="--decode-context 32768 --context-fill random --kv-cache-dtype fp8" SKIP_LAUNCHES=400 \
        LAUNCHES=300 DECODE=8 PROMPT_LEN=64 OUT="$out/profile_$b" timeout 200 "$src/tools/profile_step.sh" \
        "/tmp/abx-$b" >"$out/profile_$b.log" 2>&1
    rows+=("$(printf '%-28s rc %-3s %4ss' "profile b1 $b" $? $((SECONDS - t0)))")
done
for b in ${NEW:-new} ${TOPK:-topk}; do
    echo "-- $b" && grep -A4 "^GLM-5 slice" "$out/bench_$b.log" && grep -i "topk\|dsa" "$out/profile_$b/profile_step.txt"
done
grep -hE "PASSED|FAILED" "$out/ops_mla_topk.log" | tail -4
printf '%s\n' "${rows[@]}"
(cd "$out" && tar -czf /tmp/gpu_dsa_topk.tgz --exclude='*.csv' . && find . -mindepth 1 -delete && mv /tmp/gpu_dsa_topk.tgz .)
