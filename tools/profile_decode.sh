#!/usr/bin/env bash
# profile_decode.sh — where a batch-1 decode step's time goes, kernel by kernel, on the GPU machine.
#
#   tools/profile_decode.sh [BUILD_DIR]   (default: build)
#
# 1. the synthetic Qwen3-30B-A3B NVFP4 checkpoint (as tools/bench_gpu.sh: kept in $SYNTH_DIR);
# 2. `moeserve bench` at batch 1 with CUDA graphs (the real speed, tok/s);
# 3. ncu over one decode layer's kernels without graphs, clocks and caches left alone (the
#    defaults lock base clocks and flush caches, which overstates every kernel's time): per
#    kernel its duration, DRAM throughput, SM throughput, warps active, registers, grid;
#    $NCU_SECTIONS=1 adds the full SpeedOfLight / Occupancy / MemoryWorkloadAnalysis pages;
# 4. a table of kernel name -> us, sorted as launched, and their sum.
# Logs go to $OUT when set (the device tool's output folder), else BUILD_DIR/profile_decode/.
# Environment: SYNTH_DIR (/tmp/synth-30b-nvfp4), SKIP_LAUNCHES (3000: past prefill and the first
# decode steps), LAUNCHES (24), BATCH (1), PROMPT_LEN (128), PRESET (qwen3-30b-a3b) and LAYERS (48)
# of the synthetic checkpoint, BENCH_ARGS (extra bench flags). Two decode steps of a 2-layer GLM-5
# slice at context 2048 (past its 2048-token prefill; ~62 launches a step): PRESET=glm5-slice
# LAYERS=2 SYNTH_DIR=/tmp/glm5-2 PROMPT_LEN=64 BENCH_ARGS="--decode-context 2048" SKIP_LAUNCHES=700
# LAUNCHES=124.
set -u
build=${1:-build}
build=$(cd "$build" && pwd) || exit 2
logs=${OUT:-$build/profile_decode}
mkdir -p "$logs"
synth=${SYNTH_DIR:-/tmp/synth-30b-nvfp4}
skip=${SKIP_LAUNCHES:-3000}
count=${LAUNCHES:-24}
batch=${BATCH:-1}
preset=${PRESET:-qwen3-30b-a3b}
layers=${LAYERS:-48}
want="$preset nvfp4 layers=$layers"
if ! [ -f "$synth/.complete" ] || [ "$(cat "$synth/.complete")" != "$want" ]; then
    rm -rf "$synth" && mkdir -p "$synth"
    "$build/make_synth_checkpoint" --out "$synth" --preset "$preset" --layers "$layers" --format nvfp4 \
        >"$logs/synth.log" 2>&1 || { echo "profile_decode: checkpoint failed (see synth.log)"; exit 1; }
    echo "$want" >"$synth/.complete"
fi
"$build/moeserve" bench --model "$synth" --backend cuda --batch "$batch" --prompt-len "${PROMPT_LEN:-128}" --decode 64 \
    --copy-mib 2048 ${BENCH_ARGS:-} >"$logs/bench.txt" 2>&1
grep -iE "decode|copy|batch" "$logs/bench.txt" | head -12
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
metrics=$metrics,launch__registers_per_thread,launch__grid_size,dram__bytes_read.sum
metrics=$metrics,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
sections=()
[ "${NCU_SECTIONS:-0}" = 1 ] && sections=(--section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis)
MOESERVE_NO_GRAPHS=1 timeout 300 ncu --clock-control none --cache-control none --launch-skip "$skip" \
    --launch-count "$count" --print-units base --metrics "$metrics" "${sections[@]}" --csv \
    "$build/moeserve" bench --model "$synth" --backend cuda --batch "$batch" --prompt-len "${PROMPT_LEN:-128}" --decode 8 \
    ${BENCH_ARGS:-} >"$logs/ncu.csv" 2>"$logs/ncu.err"
python3 - "$logs/ncu.csv" <<'EOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("profile_decode: no ncu rows"); sys.exit(0)
h = rows[0]; ix = {n: i for i, n in enumerate(h)}
per = {}
order = []
for r in rows[1:]:
    key = (r[ix["ID"]], r[ix["Kernel Name"]][:60])
    if key not in per:
        per[key] = {}; order.append(key)
    per[key][r[ix["Metric Name"]]] = r[ix["Metric Value"]]
tot = 0.0
print("%-60s %8s %6s %6s %6s %5s %7s %9s %7s" % ("kernel", "us", "dram%", "sm%", "warp%", "regs", "grid", "MB read",
      "blk/SM"))
for k in order:
    m = per[k]
    def g(n, d="-"):
        return m.get(n, d).replace(",", "")
    t = g("gpu__time_duration.sum", "0")
    try:
        us = float(t) / 1000.0
    except ValueError:
        us = 0.0
    tot += us
    mb = g("dram__bytes_read.sum", "0")
    try:
        mb = "%.2f" % (float(mb) / 1e6)
    except ValueError:
        pass
    # blocks an SM as registers / shared memory allow
    lim = "%s/%s" % (g("launch__occupancy_limit_registers"), g("launch__occupancy_limit_shared_mem"))
    print("%-60s %8.2f %6s %6s %6s %5s %7s %9s %7s" % (k[1], us, g("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
          g("sm__throughput.avg.pct_of_peak_sustained_elapsed"), g("sm__warps_active.avg.pct_of_peak_sustained_active"),
          g("launch__registers_per_thread"), g("launch__grid_size"), mb, lim))
print("sum of %d kernels: %.1f us" % (len(order), tot))
EOF
