#!/usr/bin/env bash
# gpu_glm5_table.sh — on the GPU machine, one call: issue 25's GLM-5 table from weights made on the
# device (no checkpoint written): a MoE layer's decode at batch 1 and 64 for each CASE
# "dtype:context[:smem]" (tools/gpu_glm5_b1.sh, one pack, ROUNDS rounds; contexts past 4096 are
# random cache rows), then the prefill of one prompt of each PREFILL_LENS on the 2- and 4-layer
# slices (a MoE layer = the difference / 2), the plan's form of the dense MLA pass. A table last;
# logs in $OUT.
#
#   carry [".carry/ab", ".carry/lib"]
#   PACK=new [CASES="bf16:2048 fp8:2048 bf16:32768 fp8:32768 bf16:2048:101376"] [ROUNDS=1]
#   [PREFILL_LENS="4096"] tools/gpu_glm5_table.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_glm5_table}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
pack=${PACK:-new}
rows=()
for c in ${CASES:-bf16:2048 fp8:2048 bf16:32768 fp8:32768 bf16:2048:101376}; do
    IFS=: read -r dt ctx smem <<<"$c"
    name="${dt}_${ctx}${smem:+_$smem}"
    PACKS=$pack ROUNDS=${ROUNDS:-1} TESTS= GOLDENS=0 PROFILE=0 KV=$dt DECODE_CONTEXT=$ctx SMEM=${smem:-} \
        PACK_LOGS=0 OUT="$out/$name" timeout 280 "$src/tools/gpu_glm5_b1.sh" >"$out/$name.log" 2>&1
    rows+=("$(printf '%-22s %s' "$name" "$(grep -E "^  $pack +r" "$out/$name.log" | sed "s/^  $pack *//" | tr '\n' ' ')")")
done
d=/tmp/abx-$pack
for len in ${PREFILL_LENS:-4096}; do
    for L in 2 4; do
        timeout 200 "$d/moeserve" bench --backend cuda --synthetic glm5-slice --synthetic-layers "$L" \
            --prompt-len "$len" --batch 1 --decode 2 --json >"$out/prefill_${len}_L$L.json" \
            2>"$out/prefill_${len}_L$L.log"
    done
    rows+=("$(python3 - "$out/prefill_${len}_L2.json" "$out/prefill_${len}_L4.json" "$len" <<'PY'
import json, sys
try:
    a, b = (json.load(open(f))["prefill"]["seconds"] for f in sys.argv[1:3])
    n = int(sys.argv[3])
    print(f"prefill {n:>6d} tokens: {(b - a) / 2 * 1e3:8.2f} ms a MoE layer ({n / ((b - a) / 2):.0f} tok/s a layer; "
          f"2 layers {a * 1e3:.1f} ms, 4 layers {b * 1e3:.1f} ms)")
except Exception as e:
    print(f"prefill {sys.argv[3]}: no figure ({e})")
PY
)")
done
echo "ms a MoE layer ((L4 - L2) / 2) by cache dtype, context[, smem budget]:"
printf '%s\n' "${rows[@]}"
# at most 8 files come back from the device: everything in one archive
. "$src/tools/pack_out.sh"
if [ -n "${OUT:-}" ]; then pack_out "$out" logs.tgz; fi
