#!/usr/bin/env bash
# sass_kernels.sh — on the GPU machine (this build machine has no CUDA 13 disassembler): the SASS
# of every kernel of BINARY whose name matches REGEX into $OUT/sass_<n>.txt, and per kernel the
# opcode histogram (how many of each instruction the code holds, not how many run), so that an
# inner loop's cost per weight can be counted.
#
#   tools/sass_kernels.sh build-dev/moeserve 'moe_gate_up_mma|moe_down_mma|gemv_mma'
set -u
bin=${1:?binary}
re=${2:?kernel regex}
out=${OUT:-/tmp/sass}
mkdir -p "$out"
cuobjdump -sass "$bin" >"$out/all.sass" 2>"$out/cuobjdump.err" || { echo "sass_kernels: cuobjdump failed"; cat "$out/cuobjdump.err"; exit 1; }
awk -v re="$re" -v out="$out" '
    /Function : / { keep = ($0 ~ re); if (keep) { n++; f = out "/sass_" n ".txt"; print > f; print n ": " $3 } next }
    keep { print > f }
' "$out/all.sass" >"$out/index.txt"
cat "$out/index.txt"
for f in "$out"/sass_*.txt; do
    [ -f "$f" ] || continue
    echo "---- $(head -1 "$f" | awk '{print $3}' | cut -c1-120)"
    grep -oE '^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_]+(\.[A-Z0-9_]+)*' "$f" |
        awk '{op=$NF; sub(/\..*/, "", op); c[op]++; t++} END {printf "total %d:", t; for (o in c) printf " %s %d", o, c[o]; printf "\n"}' |
        tr ' ' '\n' | paste -sd' ' | fold -w 160
done
