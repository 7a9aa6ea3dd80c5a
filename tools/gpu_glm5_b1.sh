#!/usr/bin/env bash
# gpu_glm5_b1.sh — on the GPU machine, one call: GLM-5 layer decode of packed builds side by side,
# weights made on the device (`bench --synthetic glm5-slice`: no checkpoint written, so a call
# spends its time on the runs). For each round and each pack of PACKS, the 2- and 4-layer slices
# at BATCHES with DECODE_CONTEXT random cache rows; a MoE layer = (ms(4) - ms(2)) / 2. Before the
# benches, the last pack's checks: TESTS (op test families, "moe" = test_ops_moe_cuda, "moe:NAME"
# with MOESERVE_OPS_FILTER=NAME), and the goldens at both budgets; then (PROFILE=1) a
# kernel-by-kernel profile of one step (PROFILE_BATCH, 1) of the last pack's 2-layer slice, in launch order.
# A table last; logs in $OUT.
#
#   carry [".carry/ab", ".carry/lib"]
#   PACKS="base new" [ROUNDS=2] [BATCHES=1,64] [DECODE_CONTEXT=2048] [KV=bf16] [SMEM=]
#   [TESTS="moe:test_moe_experts mla"] [GOLDENS=1] [BENCH=1] [PROFILE=1] [PROFILE_BATCH=1] [PACK_LOGS=1]
#   [FORCE_ALT="linear@33-64:gemm_nvfp4_wo_wgmma"] (each pack also run as NAME+f under that MOESERVE_CUDA_FORCE)
#   tools/gpu_glm5_b1.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_glm5_b1}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
packs=(${PACKS:-new})
for p in "${packs[@]}"; do
    d=/tmp/abx-$p
    rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/$p.tar.xz" -C "$d" || { echo "no pack $p"; exit 2; }
done
last=/tmp/abx-${packs[-1]}
rows=()
run() { # run NAME LOG ENV... COMMAND...
    local name=$1 log=$2 t0=$SECONDS
    shift 2
    env MOESERVE_SRC="$src" TMPDIR=/tmp "$@" >"$out/$log" 2>&1
    local rc=$?
    rows+=("$(printf '%-40s rc %-3s %4ss  %s failed' "$name" "$rc" $((SECONDS - t0)) "$(grep -cE '^\[  FAILED  \]' "$out/$log")")")
}
for tf in ${TESTS:-}; do # FAMILY or FAMILY:FILTER
    t=${tf%%:*} f=
    [ "$t" != "$tf" ] && f=${tf#*:}
    [ -x "$last/tests/test_ops_${t}_cuda" ] || { rows+=("no test_ops_${t}_cuda in the pack"); continue; }
    run "op tests $tf" "ops_$t.log" MOESERVE_OPS_FILTER="$f" timeout 300 "$last/tests/test_ops_${t}_cuda"
done
if [ "${GOLDENS:-1}" = 1 ] && [ -x "$last/tests/test_golden_cuda" ]; then
    run "goldens" golden.log timeout 150 "$last/tests/test_golden_cuda"
    run "goldens, smem 101376" golden_small.log MOESERVE_SMEM_BUDGET=101376 timeout 150 "$last/tests/test_golden_cuda"
fi
ctx=${DECODE_CONTEXT:-2048}
flags=(--backend cuda --synthetic glm5-slice --batch "${BATCHES:-1,64}" --prompt-len 64 --decode-context "$ctx"
    --context-fill random --decode "${DECODE_STEPS:-16}" --json)
[ -n "${KV:-}" ] && flags+=(--kv-cache-dtype "$KV")
[ -n "${SMEM:-}" ] && flags+=(--smem-budget "$SMEM")
[ "${BENCH:-1}" = 1 ] || ROUNDS=0 # checks only
variants=("${packs[@]}") # FORCE_ALT: each pack once more as NAME+f, under MOESERVE_CUDA_FORCE=$FORCE_ALT
[ -n "${FORCE_ALT:-}" ] && for p in "${packs[@]}"; do variants+=("$p+f"); done
for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in "${variants[@]}"; do
        p=${v%+f} force=
        [ "$p" != "$v" ] && force=$FORCE_ALT
        for L in 2 4; do
            MOESERVE_CUDA_FORCE="$force" timeout 240 "/tmp/abx-$p/moeserve" bench "${flags[@]}" --synthetic-layers "$L" \
                >"$out/bench_${v}_L${L}_r$r.json" 2>"$out/bench_${v}_L${L}_r$r.log"
        done
    done
done
if [ "${PROFILE:-1}" = 1 ]; then
    SYNTHETIC=1 PRESET=glm5-slice LAYERS=2 BATCH=${PROFILE_BATCH:-1} STEP=last IN_ORDER=1 SKIP_LAUNCHES=${PROFILE_SKIP:-200} \
        LAUNCHES=300 DECODE=6 PROMPT_LEN=64 \
        BENCH_ARGS="--decode-context $ctx --context-fill random ${KV:+--kv-cache-dtype $KV}" \
        OUT="$out/profile" timeout 240 "$src/tools/profile_step.sh" "$last" >"$out/profile.log" 2>&1
    rows+=("$(printf '%-40s rc %-3s' "profile b${PROFILE_BATCH:-1} (${packs[-1]})" $?)")
    head -45 "$out/profile/profile_step.txt" 2>/dev/null
fi
python3 - "$out" "${ROUNDS:-2}" "${variants[@]}" <<'PY'
import json, sys, os
out, rounds, packs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def steps(path):
    try:
        j = json.load(open(path))
    except Exception:
        return {}
    res = {}
    for d in j.get("decode", []):
        b = d.get("batch")
        ms = d.get("ms_per_step") or (1e3 * d["seconds"] / d["steps"] if "seconds" in d and d.get("steps") else None)
        if ms is None and d.get("tok_s"):
            ms = 1e3 * b / d["tok_s"]
        res[b] = ms
    return res
print("ms a MoE layer ((L4 - L2) / 2), per round:")
for p in packs:
    for r in range(1, rounds + 1):
        a = steps(os.path.join(out, f"bench_{p}_L2_r{r}.json"))
        b = steps(os.path.join(out, f"bench_{p}_L4_r{r}.json"))
        cells = []
        for bt in sorted(set(a) & set(b)):
            if a[bt] and b[bt]:
                cells.append(f"b{bt} {(b[bt] - a[bt]) / 2:.4f}")
        print(f"  {p:10s} r{r}: " + ("  ".join(cells) if cells else "no figures"))
PY
printf '%s\n' "${rows[@]}"
# the device tool brings back at most 8 files: the logs in one archive (PACK_LOGS=0: leave them, for a caller
# that packs its own)
. "$src/tools/pack_out.sh"
if [ "${PACK_LOGS:-1}" = 1 ] && [ -n "${OUT:-}" ]; then pack_out "$out" logs.tgz; fi
