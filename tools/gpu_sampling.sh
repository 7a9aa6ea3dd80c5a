#!/usr/bin/env bash
# gpu_sampling.sh — on the GPU machine, one call: the sample kernel's variants side by side. The pack
# .carry/sampling.tar.xz holds bench_sample_NAME and test_ops_common_cuda_NAME for each variant
# (built here from main and any branch with its own cuda_fused.cu; the radix cuts, 572aedf, won against
# the bisections and two other forms: docs/lab/experiments.md); for each NAME of NAMES its op tests (the
# sample cases) and then tools/bench_sample.c's
# table (the sample op on flat and peaked 152k rows, 1 and 64 rows). A table last; logs in $OUT.
#
#   carry [".carry/sampling.tar.xz", ".carry/lib"]    [NAMES="main"] [ITERS=30] tools/gpu_sampling.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_sampling}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
d=/tmp/abx-sampling
rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/sampling.tar.xz" -C "$d" || exit 2
rows=()
for n in ${NAMES:-main}; do
    [ -x "$d/bench_sample_$n" ] || { rows+=("$n: not in the pack"); continue; }
    MOESERVE_SRC="$src" timeout 120 "$d/test_ops_common_cuda_$n" >"$out/ops_$n.log" 2>&1
    rows+=("$(printf '%-8s op tests rc %s, %s failed' "$n" $? "$(grep -cE '^\[  FAILED  \]' "$out/ops_$n.log")")")
    timeout 200 "$d/bench_sample_$n" --iters "${ITERS:-30}" >"$out/bench_$n.txt" 2>&1
done
# us a call: one column a variant
python3 - "$out" ${NAMES:-main} <<'PY'
import os, sys
out, names = sys.argv[1], sys.argv[2:]
tables = {}
for n in names:
    try:
        for line in open(os.path.join(out, f"bench_{n}.txt")):
            p = line.split()
            if len(p) >= 4 and p[0].isdigit():
                tables.setdefault((p[0], p[1], " ".join(p[2:-1])), {})[n] = p[-1]
    except OSError:
        pass
print(f"{'rows':5s} {'kind':7s} {'parameters':28s} " + " ".join(f"{n:>9s}" for n in names))
for (r, k, par), v in tables.items():
    print(f"{r:5s} {k:7s} {par:28s} " + " ".join(f"{v.get(n, '-'):>9s}" for n in names))
PY
printf '%s\n' "${rows[@]}"
