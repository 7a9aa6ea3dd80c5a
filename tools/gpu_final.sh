#!/usr/bin/env bash
# gpu_final.sh — a session's closing GPU run in one device call (10 minutes at most there):
# the figures first, then the checks, results packed after every stage so that a run cut short
# still returns what it finished.
#
#   tools/gpu_final.sh [BUILD_DIR]   (default build-dev; unpacks .carry/bin/dev.tar.xz first when
#                                     it exists: binaries packed here to fit the carry limit)
#
# 1. tools/bench_gpu.sh: issue 6's benchmark (moeserve vs transformers, NVFP4 Qwen3-30B-A3B);
# 2. tools/decode_iter.sh with $VARIANTS (default: none) for knobs measured in the same call;
# 3. tools/gpu_check.sh: ctest -L gpu at both shared-memory budgets, memcheck, racecheck.
# Everything lands in $OUT/final.tgz (the device tool returns at most 8 files).
set -u
build=${1:-build-dev}
src=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$src/.carry/bin/dev.tar.xz" ] && (cd "$src" && tar -xJf .carry/bin/dev.tar.xz)
build=$(cd "$build" && pwd) || exit 2
work=$(mktemp -d)
mkdir -p "$work/bench" "$work/check"
pack() { [ -n "${OUT:-}" ] && tar -czf "$OUT/final.tgz" -C "$work" . 2>/dev/null; }
t0=$SECONDS
OUT="$work/bench" timeout "${BENCH_TIMEOUT:-200}" "$src/tools/bench_gpu.sh" "$build" >"$work/bench.log" 2>&1
echo "bench_gpu: rc $? ($((SECONDS - t0)) s)"
tail -16 "$work/bench.log"
pack
if [ -n "${VARIANTS:-}" ]; then
    SKIP_TESTS=1 BATCHES=${VARIANT_BATCHES:-1} OUT="$work" "$src/tools/decode_iter.sh" "$build" >"$work/variants.log" 2>&1
    tail -${VARIANT_LINES:-6} "$work/variants.log"
    pack
fi
OUT="$work/check" GPU_CHECK_TIMEOUT=${GPU_CHECK_TIMEOUT:-320} "$src/tools/gpu_check.sh" "$build" >"$work/check.log" 2>&1
echo "gpu_check: rc $? ($((SECONDS - t0)) s)"
cat "$work/check/summary.txt" 2>/dev/null
pack
