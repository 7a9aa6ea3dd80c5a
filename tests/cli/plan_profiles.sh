#!/usr/bin/env bash
# `moeserve plan` through the real binary: every profile plans every op within
# its shared-memory budget (also with --smem-budget 101376 on the H200), only
# kernels the CUDA backend has are planned (no native fp4 GEMM is dispatched yet,
# so the RTX PRO 6000 runs NVFP4 experts weight-only on bf16 mma), and bad input is
# refused with a message naming the problem.
# The JSON is read with grep/awk only (no python, no jq).
# Usage: plan_profiles.sh MOESERVE SRC_DIR WORK_DIR
set -u
bin=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
pass=0 fail=0
profiles="a100 rtx-a6000 l40s h100 h200 b200 rtx-pro-6000 rtx-5090 dgx-spark"

ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

# ops FILE: one line "op math smem_bytes" per op of a plan's JSON
ops() {
    grep -oE '"(op|math|smem_bytes)":[[:space:]]*("[^"]*"|[0-9]+)' "$1" |
        sed -E 's/^"[a-z_]+":[[:space:]]*//; s/"//g' |
        awk '{ v[n++ % 3] = $0; if (n % 3 == 0) print v[0], v[1], v[2] }'
}
budget() { grep -oE '"smem_budget":[[:space:]]*[0-9]+' "$1" | grep -oE '[0-9]+$'; }
math_of() { ops "$1" | awk -v op="$2" '$1 == op { print $2 }'; }

# check_plan NAME FILE [WANT_BUDGET]: at least 13 ops, each smem_bytes <= the budget
check_plan() {
    local name=$1 f=$2 want=${3:-} b n over
    b=$(budget "$f")
    n=$(ops "$f" | wc -l)
    if [ -z "$b" ] || [ "$n" -lt 13 ]; then
        bad "$name: no budget or too few ops ($n)"
        return
    fi
    if [ -n "$want" ] && [ "$b" != "$want" ]; then
        bad "$name: smem_budget $b, want $want"
        return
    fi
    over=$(ops "$f" | awk -v b="$b" '$3 + 0 > b + 0 { print $1 " " $3 }')
    if [ -n "$over" ]; then
        bad "$name: over the budget $b: $over"
    else
        ok "$name: $n ops within $b B"
    fi
}

for p in $profiles; do
    for w in bf16 fp8 nvfp4 nvfp4-w4a16; do
        f="$work/$p-$w.json"
        if ! "$bin" plan --profile "$p" --weights "$w" --json >"$f" 2>"$work/err"; then
            bad "$p $w: exit status $?: $(head -c 300 "$work/err")"
            continue
        fi
        check_plan "$p --weights $w" "$f"
    done
done

f="$work/h200-sm120.json"
"$bin" plan --profile h200 --smem-budget 101376 --weights nvfp4 --json >"$f" 2>/dev/null
check_plan "h200 --smem-budget 101376" "$f" 101376
"$bin" plan --profile h200 --smem-budget 101376 --json >"$work/h200-sm120-bf16.json" 2>/dev/null
check_plan "h200 --smem-budget 101376 (bf16)" "$work/h200-sm120-bf16.json" 101376

m=$(math_of "$work/rtx-pro-6000-nvfp4.json" moe_experts_gemm)
[ "$m" = bf16_mma ] && ok "rtx-pro-6000 nvfp4 experts: $m" || bad "rtx-pro-6000 nvfp4 experts: math \"$m\""
m=$(math_of "$work/h200-nvfp4.json" moe_experts_gemm)
[ -n "$m" ] && [ "$m" != fp4_block_scaled_mma ] && ok "h200 nvfp4 experts: $m" || bad "h200 nvfp4 experts: math \"$m\""
m=$(math_of "$work/h200-sm120.json" moe_experts_gemm)
[ -n "$m" ] && [ "$m" != fp4_block_scaled_mma ] && ok "h200 sm_120 budget experts: $m" ||
    bad "h200 sm_120 budget experts: math \"$m\""

# the shipped model is a W4A4 NVFP4 checkpoint: its quantization config decides the format
tiny=$src/models/moeserve-tiny
if [ -d "$tiny" ]; then
    f="$work/tiny-rtx.json"
    "$bin" plan --model "$tiny" --profile rtx-pro-6000 --json >"$f" 2>/dev/null
    check_plan "moeserve-tiny on rtx-pro-6000" "$f"
    m=$(math_of "$f" moe_experts_gemm)
    [ "$m" = bf16_mma ] && ok "moeserve-tiny experts on rtx-pro-6000: $m" ||
        bad "moeserve-tiny experts on rtx-pro-6000: math \"$m\""
fi

# the table names every op and the device
out=$("$bin" plan --profile rtx-pro-6000 --weights nvfp4 2>&1)
if grep -q "^moe_experts_gemm .*bf16_mma" <<<"$out" && grep -q "^device .*RTX PRO 6000" <<<"$out"; then
    ok "table output"
else
    bad "table output: $(head -c 400 <<<"$out")"
fi

# a tiny budget falls back to the portable path, loudly
out=$("$bin" plan --profile rtx-pro-6000 --weights nvfp4 --smem-budget 4096 2>&1)
if grep -q "PORTABLE FALLBACK" <<<"$out" && grep -q "WARNING: portable fallback" <<<"$out"; then
    ok "portable fallback is loud"
else
    bad "portable fallback: $(tail -c 400 <<<"$out")"
fi

# expect NAME WANT_SUBSTRING -- args: exits 1 or 2 with a message naming the problem
expect() {
    local name=$1 want=$2 out rc
    shift 3
    out=$("$bin" "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
        bad "$name: exit status $rc: $out"
    elif ! grep -qF -- "$want" <<<"$out"; then
        bad "$name: message lacks \"$want\": $out"
    else
        ok "$name"
    fi
}
expect unknown_profile "rtx-pro-6000, rtx-5090, dgx-spark" -- plan --profile rtx-9090
expect device_and_profile "exclude" -- plan --profile h200 --device 0
expect bad_budget "--smem-budget" -- plan --profile h200 --smem-budget lots
expect bad_weights "--weights" -- plan --profile h200 --weights int3

# the plan holds only kernels the CUDA backend has (wgmma only for the bf16 GEMMs; no tcgen05 /
# native fp4), stays within the budget, and still gives NVFP4 experts a tensor-core GEMM (bf16
# wgmma on the H200, bf16 mma elsewhere)
ks=$("$bin" plan --kernels --json 2>/dev/null)
for prof in h200 rtx-pro-6000 b200; do
    js=$("$bin" plan --profile "$prof" --weights nvfp4-w4a16 --json 2>/dev/null)
    if [ -z "$js" ]; then
        bad "runnable $prof: no JSON"
        continue
    fi
    msg=$(python3 -c '
import json, sys
d = json.loads(sys.argv[1]); budget = d["device"].get("smem_budget") or d["device"].get("smem_per_block_optin")
have = {x["name"] for x in json.loads(sys.argv[3])["kernels"]}
def lacks(k):  # a kernel the CUDA backend does not have
    return k not in have
errs = [o["op"] + ":" + o["kernel"] for o in d["ops"] if lacks(o["kernel"])]
errs += [o["op"] + " smem " + str(o["smem_bytes"]) for o in d["ops"] if budget and o["smem_bytes"] > budget]
moe = [o for o in d["ops"] if o["op"] == "moe_experts_gemm"]
want = "moe_gemm_nvfp4_wo_wgmma" if sys.argv[2] == "h200" else "moe_gemm_nvfp4_wo_mma"
if not moe or moe[0]["kernel"] != want:
    errs.append("moe_experts_gemm is " + (moe[0]["kernel"] if moe else "missing") + ", want " + want)
print("; ".join(errs))' "$js" "$prof" "$ks" 2>&1)
    if [ -z "$msg" ]; then ok "runnable $prof"; else bad "runnable $prof: $msg"; fi
done

# the dispatch table: what runs per op, token count and weights, only the backend's kernels
js=$("$bin" plan --profile h200 --weights nvfp4-w4a16 --json 2>/dev/null)
msg=$(python3 -c '
import json, sys
d = json.loads(sys.argv[1]); k = {x["name"] for x in json.loads(sys.argv[2])["kernels"]}
head = {(e["op"], e["tokens"], e["weights"]): e["kernels"][0] for e in d["dispatch"]}
errs = [e["op"] + "@" + e["tokens"] + ":" + x for e in d["dispatch"] for x in e["kernels"] if x not in k]
want = {("linear", "1", "nvfp4"): "gemv_decode_mma_bf16", ("linear", "65+", "nvfp4"): "cublas_dequant_bf16",
        ("moe_experts", "1", "nvfp4"): "moe_pair_decode_mma_bf16", ("moe_experts", "65+", "nvfp4"): "moe_gemm_nvfp4_wo_wgmma",
        ("linear", "1", "bf16"): "gemv_x_smem", ("linear", "65+", "bf16"): "cublaslt_bf16"}
errs += ["%s: %s, want %s" % (w, head.get(w), v) for w, v in want.items() if head.get(w) != v]
print("; ".join(errs))' "$js" "$ks" 2>&1)
if [ -z "$msg" ]; then ok "dispatch table (h200, nvfp4)"; else bad "dispatch table: $msg"; fi
out=$(MOESERVE_CUDA_FORCE=linear@1:nope "$bin" plan --profile h200 2>&1 >/dev/null)
if grep -q "MOESERVE_CUDA_FORCE: the cuda backend has no kernel \"nope\"" <<<"$out"; then ok "bad MOESERVE_CUDA_FORCE refused"; else bad "bad force: $out"; fi
out=$(MOESERVE_CUDA_FORCE=moe_experts@2-8:moe_pair_decode "$bin" plan --profile h200 --weights nvfp4 2>&1)
if grep -qE "^moe_experts +2-8 +nvfp4 +moe_pair_decode >" <<<"$out"; then ok "MOESERVE_CUDA_FORCE shows in the plan"; else bad "force not in the plan: $(grep '^moe_experts' <<<"$out" | head -3)"; fi

# the decode graph sizes a server of --max-seqs N captures (plan/plan_graphs.c), table and JSON
out=$("$bin" plan --profile h200 --max-seqs 128 2>&1)
want="decode graphs (--max-seqs 128): 15 batch sizes, 1 2 4 8 16 24 32 40 48 56 64 80 96 112 128;"
if grep -qF -- "$want" <<<"$out"; then ok "decode graph sizes for --max-seqs 128"; else bad "decode graph sizes: $(grep 'decode graphs' <<<"$out")"; fi
out=$("$bin" plan --profile h200 --json 2>&1)
if tr -d ' \n\t' <<<"$out" | grep -qF '"decode_graphs":{"max_seqs":64,"batch_sizes":[1,2,4,8,16,24,32,40,48,56,64]}'; then
    ok "decode graph sizes in the JSON (default --max-seqs 64)"
else
    bad "decode graph sizes in the JSON: $(tr -d ' \n\t' <<<"$out" | grep -oE '"decode_graphs":[^}]*}')"
fi
out=$("$bin" plan --profile h200 --max-seqs 0 2>&1 >/dev/null)
rc=$?
if [ $rc -eq 2 ] && grep -q -- "--max-seqs" <<<"$out"; then ok "plan --max-seqs 0 refused"; else bad "plan --max-seqs 0: exit $rc: $out"; fi

# no --device/--profile: a CUDA-less build says so and suggests --profile; a GPU machine plans
out=$("$bin" plan --json 2>&1 >/dev/null)
rc=$?
if [ $rc -eq 0 ]; then
    ok "plan without --profile probed a GPU"
elif [ $rc -eq 1 ] && grep -q -- "--profile" <<<"$out"; then
    ok "plan without --profile: $(head -c 160 <<<"$out")"
else
    bad "plan without --profile: exit $rc: $out"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
