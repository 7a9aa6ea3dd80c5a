#!/usr/bin/env bash
# profile_glm5_metrics.sh — on the GPU machine: per kernel of a batch-1 decode window of a
# 2-layer GLM-5 slice (/tmp/glm5-2, made here when absent) at context 2048, its duration, DRAM
# throughput and bytes, warps active, registers, grid and occupancy limits (ncu, clocks and caches
# left alone, no graphs), in launch order. The packed build .carry/ab/$NEW.tar.xz is unpacked
# into /tmp/abx-$NEW when tools/gpu_glm5_check.sh has not done it. The default window skips the
# 2048-token prefill (~560 launches at batch 1) and takes two decode steps (62 launches each).
# Output: $OUT/glm5_metrics.txt.
#
#   NEW=new [BATCH=1] [SKIP_LAUNCHES=700] [LAUNCHES=124] tools/profile_glm5_metrics.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/profile_glm5_metrics}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
d=/tmp/abx-${NEW:-new}
if ! [ -x "$d/moeserve" ]; then
    mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d" || exit 2
fi
if ! [ -f /tmp/glm5-2/.complete ] || [ "$(cat /tmp/glm5-2/.complete)" != "glm5-slice nvfp4 layers=2" ]; then
    rm -rf /tmp/glm5-2 && mkdir -p /tmp/glm5-2
    "$d/make_synth_checkpoint" --out /tmp/glm5-2 --preset glm5-slice --layers 2 --format nvfp4 >"$out/synth.log" 2>&1 ||
        { echo "profile_glm5_metrics: checkpoint failed (see synth.log)"; exit 1; }
    echo "glm5-slice nvfp4 layers=2" >/tmp/glm5-2/.complete
fi
m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
m=$m,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size
m=$m,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
MOESERVE_NO_GRAPHS=1 timeout 300 ncu --clock-control none --cache-control none --launch-skip "${SKIP_LAUNCHES:-700}" \
    --launch-count "${LAUNCHES:-124}" --metrics "$m" --csv "$d/moeserve" bench --model /tmp/glm5-2 --backend cuda \
    --batch "${BATCH:-1}" --prompt-len 64 --decode 8 --decode-context 2048 >"$out/glm5_metrics.csv" 2>"$out/glm5_metrics.err"
python3 - "$out/glm5_metrics.csv" <<'PY' | tee "$out/glm5_metrics.txt"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ix = {n: i for i, n in enumerate(h)}
k = {}
order = []
for r in rows[1:]:
    key = (r[ix["ID"]], r[ix["Kernel Name"]][:44])
    if key not in k:
        k[key] = {}; order.append(key)
    unit = r[ix["Metric Unit"]] if "Metric Unit" in ix else ""
    val = r[ix["Metric Value"]].replace(",", "")
    scale = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "B": 1e-6, "KB": 1e-3, "MB": 1.0, "GB": 1e3,
             "nsecond": 1e-3, "usecond": 1.0, "ns": 1e-3, "us": 1.0, "ms": 1e3,
             "msecond": 1e3}.get(unit)
    try:
        k[key][r[ix["Metric Name"]]] = "%.1f" % (float(val) * scale) if scale else val
    except ValueError:
        k[key][r[ix["Metric Name"]]] = val
short = {"gpu__time_duration.sum": "us", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
         "dram__bytes_read.sum": "MB", "sm__warps_active.avg.pct_of_peak_sustained_active": "warps%",
         "launch__registers_per_thread": "regs", "launch__grid_size": "grid",
         "launch__occupancy_limit_registers": "lim_reg", "launch__occupancy_limit_shared_mem": "lim_smem"}
print("%-44s " % "kernel" + " ".join("%8s" % v for v in short.values()))
for key in order:
    v = k[key]
    def f(n):
        s = v.get(n, "").replace(",", "")
        try:
            x = float(s)
        except ValueError:
            return "%8s" % s[:8]
        return "%8.1f" % x
    print("%-44s " % key[1] + " ".join(f(n) for n in short))
PY
