#!/usr/bin/env bash
# profile_step.sh — one whole batch-1 decode step, kernel by kernel (ncu durations only, clocks and
# caches left alone, no graphs), summed per kernel name: where a step's time goes, lm_head and
# sampling included (tools/profile_decode.sh looks at one layer with more metrics).
#
#   tools/profile_step.sh [BUILD_DIR]   (default build-dev; the synthetic Qwen3-30B-A3B NVFP4
#                                        checkpoint of tools/bench_gpu.sh in $SYNTH_DIR)
# Environment: SKIP_LAUNCHES (3000), LAUNCHES (700: more than a step), BATCH (1), PROMPT_LEN (128),
# DECODE (16), PRESET (qwen3-30b-a3b) and LAYERS (48) of the synthetic checkpoint, BENCH_ARGS (extra
# bench flags), SYNTHETIC=1 (the preset's weights made on the device, no checkpoint written), IN_ORDER=1 (the
# step's kernels listed as launched too). A GLM-5 layer: PRESET=glm5-slice LAYERS=2 BENCH_ARGS="--decode-context 2048"
# SKIP_LAUNCHES=200 (SYNTH_DIR=/tmp/glm5-2: one dense + one MoE layer, 9.4 GB). STEP=last: the
# window's last complete step instead of its first. Output: a table of kernel -> launches, total us, us per launch, sorted by total; to
# $OUT/profile_step.txt too. NCU_METRICS: more metrics (comma-separated) into ncu_step.csv beside the durations;
# NCU_KERNEL: a regex, only the kernels it matches (the skip and count then count those alone).
# "One step" is the kernels from one embedding launch to the next, so
# SKIP_LAUNCHES=0 PROMPT_LEN=2048 LAUNCHES=1800 profiles the bench's warm-up prefill of 2048 tokens.
set -u
build=$(cd "${1:-build-dev}" && pwd) || exit 2
logs=${OUT:-$build/profile_step}
mkdir -p "$logs"
synth=${SYNTH_DIR:-/tmp/synth-30b-nvfp4}
preset=${PRESET:-qwen3-30b-a3b}
layers=${LAYERS:-48}
want="$preset nvfp4 layers=$layers"
model=(--model "$synth")
only=()
if [ -n "${SYNTHETIC:-}" ]; then # weights made on the device: no checkpoint on disk
    model=(--synthetic "$preset" --synthetic-layers "$layers")
    # the weight synthesis launches a kernel a tensor (thousands for a GLM-5 layer): counted out of the
    # skip and the window, so both count the model's kernels alone
    only=(--kernel-name-base function --kernel-name 'regex:^(?!.*synth).*')
    [ -n "${NCU_KERNEL:-}" ] && only=(--kernel-name-base function --kernel-name "regex:${NCU_KERNEL}")
elif ! [ -f "$synth/.complete" ] || [ "$(cat "$synth/.complete")" != "$want" ]; then
    rm -rf "$synth" && mkdir -p "$synth"
    "$build/make_synth_checkpoint" --out "$synth" --preset "$preset" --layers "$layers" --format nvfp4 >"$logs/synth.log" 2>&1 ||
        { echo "profile_step: checkpoint failed"; exit 1; }
    echo "$want" >"$synth/.complete"
fi
MOESERVE_NO_GRAPHS=1 timeout 400 ncu --clock-control none --cache-control none "${only[@]}" --launch-skip "${SKIP_LAUNCHES:-3000}" \
    --launch-count "${LAUNCHES:-700}" --metrics "gpu__time_duration.sum${NCU_METRICS:+,$NCU_METRICS}" --csv \
    "$build/moeserve" bench "${model[@]}" --backend cuda --batch "${BATCH:-1}" --prompt-len "${PROMPT_LEN:-128}" --decode "${DECODE:-16}" ${BENCH_ARGS:-} \
    >"$logs/ncu_step.csv" 2>"$logs/ncu_step.err"
python3 - "$logs/ncu_step.csv" <<'PY' | tee "$logs/profile_step.txt"
import csv, os, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("profile_step: no ncu rows"); sys.exit(0)
h = rows[0]; ix = {n: i for i, n in enumerate(h)}
seq = []
for r in rows[1:]:
    if r[ix["Metric Name"]] != "gpu__time_duration.sum":
        continue
    seq.append((r[ix["Kernel Name"]][:70], float(r[ix["Metric Value"]].replace(",", "")) / 1000.0))
# one step: from an embedding kernel to the next one
starts = [i for i, (n, _) in enumerate(seq) if "embed" in n]
if len(starts) >= 2:
    # STEP=last: the last complete step of the window (past a prefill whose launch count is unknown)
    a, b = (starts[-2], starts[-1]) if os.environ.get("STEP") == "last" else (starts[0], starts[1])
    seq = seq[a:b]
    print("one step: %d kernels" % len(seq))
per = {}
for n, us in seq:
    c, t = per.get(n, (0, 0.0))
    per[n] = (c + 1, t + us)
tot = sum(t for _, t in per.values())
print("%-70s %6s %9s %8s %6s" % ("kernel", "count", "total us", "us each", "%"))
for n, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1]):
    print("%-70s %6d %9.1f %8.2f %6.1f" % (n, c, t, t / c, 100 * t / tot))
print("sum: %.1f us over %d kernels" % (tot, sum(c for c, _ in per.values())))
if os.environ.get("IN_ORDER"):  # the step's kernels as launched
    print("in launch order:")
    for n, us in seq:
        print("  %8.2f  %s" % (us, n))
PY
