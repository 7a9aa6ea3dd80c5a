#!/usr/bin/env bash
# ncu_stalls.sh — on the GPU machine: why one decode kernel is slow, from ncu's warp-state and
# instruction pages (stall reasons, issue rate, pipe use, the top stalling SASS lines), for a
# batch-1 bench on the synthetic Qwen3-30B-A3B NVFP4 checkpoint (tools/decode_iter.sh makes it),
# once per line of $VARIANTS ("name ENV=VALUE ..."), without graphs, clocks and caches left alone.
#
#   KERNELS='moe_gate_up|moe_down' VARIANTS=$'default\ncores MOESERVE_CUDA_FORCE=moe_experts@2-8:moe_pair_decode' tools/ncu_stalls.sh [BUILD_DIR]
#
# Prefill kernels: PROMPT_LEN=2048 DECODE=1 SKIP=0 COUNT=8 KERNELS='gemm_wgmma|attn_mma' (layer 0 of
# the bench's warm-up prefill: q, k, v, attention, o, gate, up, down).
# A model made on the device instead (no checkpoint): SYNTHETIC=glm5-slice LAYERS=2 BENCH_ARGS="--decode-context
# 2048 --context-fill random" KERNELS='moe_gate_up|moe_down|gemv_mma|mla_' SKIP=100 COUNT=20.
# Each variant's text report goes to $OUT/ncu_<name>.txt; a short table of the headline figures
# (duration, DRAM throughput, issued IPC, warps per scheduler, the largest stall reasons) is printed last.
set -u
build=$(cd "${1:-build-dev}" && pwd) || exit 2
out=${OUT:-/tmp/ncu_stalls}
mkdir -p "$out"
synth=${SYNTH_DIR:-/tmp/synth-30b-nvfp4}
model=(--model "$synth")
if [ -n "${SYNTHETIC:-}" ]; then
    model=(--synthetic "$SYNTHETIC" --synthetic-layers "${LAYERS:-2}")
else
    [ -f "$synth/.complete" ] || { echo "no synthetic checkpoint in $synth (tools/decode_iter.sh makes it)"; exit 2; }
fi
kernels=${KERNELS:-moe_gate_up|moe_down}
while IFS= read -r line; do
    [ -z "$line" ] && continue
    name=${line%% *}
    envs=""
    [ "$name" != "$line" ] && envs=${line#* }
    # shellcheck disable=SC2086
    env $envs MOESERVE_NO_GRAPHS=1 timeout 240 ncu --clock-control none --cache-control none \
        --kernel-name "regex:$kernels" --launch-skip "${SKIP:-200}" --launch-count "${COUNT:-4}" \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --section SourceCounters --print-units base \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
        "$build/moeserve" bench "${model[@]}" --backend cuda --batch "${BATCH:-1}" --prompt-len "${PROMPT_LEN:-128}" \
        --decode "${DECODE:-16}" ${BENCH_ARGS:-} >"$out/ncu_$name.txt" 2>"$out/ncu_$name.err"
    echo "== $name [$envs]"
    python3 - "$out/ncu_$name.txt" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
# one block per profiled kernel: "  kernel_name(...) (grid)x(block), Context 1, Stream ..., Device 0, CC 9.0"
parts = re.split(r"\n  (?=\S.*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", text)
for p in parts[1:]:
    head = p.split("\n", 1)[0]
    name = re.sub(r"<.*?>|\(anonymous namespace\)::", "", head.split("(")[0])[:40]
    grid = re.search(r"\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", head)
    def metric(label):
        m = re.search(r"\n\s+" + re.escape(label) + r"\s+(\S+)\s+([\d.,]+)", p)
        return m.group(2) if m else "-"
    print("%-40s %s dur %s ns, dram %s%%, IPC issued %s, warps/sched %s, eligible %s, regs %s" % (
        name, grid.group(0) if grid else "", metric("Duration"), metric("DRAM Throughput"), metric("Issued Ipc Active"),
        metric("Active Warps Per Scheduler"), metric("Eligible Warps Per Scheduler"),
        metric("Registers Per Thread")))
    st = re.findall(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio\s+\S*\s+([\d.]+)", p)
    st = sorted(((float(v), k) for k, v in st), reverse=True)[:6]
    print("    stalls per issue: " + ", ".join("%s %.2f" % (k, v) for v, k in st))
PY
done <<<"${VARIANTS:-default}"
