#!/usr/bin/env bash
# gpu_kernel_stalls.sh — on the GPU machine, one call: why a few GLM-5 decode kernels run below the copy
# rate. ncu on the kernels matching KERNELS (a regex) of one decode step of the 2-layer slice (device-made
# weights) at each batch of BATCHES: DRAM throughput and bytes, occupancy, issue activity, the main stall
# reasons per issue, L2 hit rate, instructions. A table per batch last; ncu's CSVs in $OUT.
#
#   carry [".carry/ab", ".carry/lib"]
#   PACK=main [BATCHES="1 64"] [KERNELS='moe_grouped|moe_gate_up|moe_down|gemv_mma'] [CONTEXT=2048]
#   [SKIP=N COUNT=N] tools/gpu_kernel_stalls.sh
# SKIP / COUNT count the matching launches only: by default at batch 1 the prompt's 2 grouped-expert launches
# and the first step's 11 are skipped and the next step's 11 taken; past batch 8 the first step's 2 experts
# launches skipped and 2 taken (the prompt's 64 x BATCH rows run the wgmma GEMMs).
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_kernel_stalls}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
pack=${PACK:-main}
d=/tmp/abx-$pack
rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/$pack.tar.xz" -C "$d" || { echo "no pack $pack"; exit 2; }
stalls=long_scoreboard,wait,barrier,math_pipe_throttle,mio_throttle,lg_throttle,short_scoreboard,not_selected
metrics=dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
metrics+=,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum
for s in ${stalls//,/ }; do metrics+=",smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"; done
for b in ${BATCHES:-1 64}; do
    skip=2 count=2
    [ "$b" -le 8 ] && skip=13 count=11
    NCU_METRICS=$metrics NCU_KERNEL="${KERNELS:-moe_grouped|moe_gate_up|moe_down|gemv_mma}" SYNTHETIC=1 \
        PRESET=glm5-slice LAYERS=2 BATCH=$b SKIP_LAUNCHES=${SKIP:-$skip} LAUNCHES=${COUNT:-$count} DECODE=4 PROMPT_LEN=64 \
        BENCH_ARGS="--decode-context ${CONTEXT:-2048} --context-fill random" OUT="$out/b$b" \
        timeout 400 "$src/tools/profile_step.sh" "$d" >"$out/b$b.log" 2>&1
    echo "== batch $b ($pack): one row a launch"
    python3 - "$out/b$b/ncu_step.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("  no ncu rows (see the .log)"); sys.exit(0)
h = rows[0]; ix = {n: i for i, n in enumerate(h)}
# ncu scales units per value (nsecond / usecond, byte / Kbyte / Mbyte ...): back to ns and bytes
SCALE = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6,
         "Gbyte": 1e9}
launches = {}
for r in rows[1:]:
    key = (r[ix["ID"]], r[ix["Kernel Name"]][:34])
    try:
        v = float(r[ix["Metric Value"]].replace(",", "")) * SCALE.get(r[ix["Metric Unit"]], 1)
    except ValueError:
        v = float("nan")
    launches.setdefault(key, {})[r[ix["Metric Name"]]] = v
def g(m, name):
    return m.get(name, float("nan"))
cols = [("us", "gpu__time_duration.sum", 1e-3), ("dram%", "dram__throughput.avg.pct_of_peak_sustained_elapsed", 1),
        ("MB", "dram__bytes_read.sum", 1e-6), ("warps%", "sm__warps_active.avg.pct_of_peak_sustained_active", 1),
        ("issue%", "smsp__issue_active.avg.pct_of_peak_sustained_active", 1), ("L2hit", "lts__t_sector_hit_rate.pct", 1)]
stalls = ["long_scoreboard", "wait", "barrier", "math_pipe_throttle", "mio_throttle", "lg_throttle",
          "short_scoreboard", "not_selected"]
print("  %-34s " % "kernel" + " ".join("%7s" % c for c, _, _ in cols) + "  stalls an issue: " +
      " ".join(s[:6] for s in stalls))
for (i, name), m in launches.items():
    vals = " ".join("%7.1f" % (g(m, k) * f) for _, k, f in cols)
    st = " ".join("%6.2f" % g(m, "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio" % s) for s in stalls)
    print("  %-34s %s  %s" % (name, vals, st))
PY
done
. "$src/tools/pack_out.sh"
if [ -n "${OUT:-}" ]; then pack_out "$out" logs.tgz; fi
