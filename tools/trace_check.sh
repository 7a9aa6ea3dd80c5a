#!/usr/bin/env bash
# trace_check.sh — on the GPU machine: do the kernels a step launches agree with the plan?
#
#   tools/trace_check.sh [BUILD_DIR]   (the synthetic Qwen3-30B-A3B NVFP4 checkpoint in $SYNTH_DIR,
#                                       made when missing)
# For a batch-1 decode step, a batch-64 decode step and a 2048-token prefill, ncu lists the
# kernels launched (graphs off, durations only); the step is cut from one embedding launch to
# the next. Each launch is named by the kernel table's profiler names (`moeserve plan --kernels
# --json`, kernel_desc.symbols), and compared with `moeserve plan --device 0 --model` for that
# token count: the plan's first choice for the NVFP4 linears and the routed experts must be
# launched (and the routing's, the router's bf16 list), and every dispatched kernel launched must be one the plan lists for the step's token
# counts (the lm_head and router take the bf16 lists). A table last; logs in $OUT.
set -u
build=$(cd "${1:-build-dev}" && pwd) || exit 2
out=${OUT:-$build/trace_check}
mkdir -p "$out"
synth=${SYNTH_DIR:-/tmp/synth-30b-nvfp4}
want="qwen3-30b-a3b nvfp4 layers=48"
if ! [ -f "$synth/.complete" ] || [ "$(cat "$synth/.complete")" != "$want" ]; then
    rm -rf "$synth" && mkdir -p "$synth"
    "$build/make_synth_checkpoint" --out "$synth" --preset qwen3-30b-a3b --format nvfp4 >"$out/synth.log" 2>&1 ||
        { echo "trace_check: checkpoint failed"; exit 1; }
    echo "$want" >"$synth/.complete"
fi
"$build/moeserve" plan --kernels --json >"$out/kernels.json" || exit 1
"$build/moeserve" plan --device 0 --model "$synth" --json >"$out/plan.json" || exit 1
# name BATCH PROMPT CONTEXT DECODE SKIP COUNT TOKENS. Decode cases: 1-token prompts and contexts, so that every
# pass after the first two (bench's own 1-token prefill, warm-up and timed) has the batch's token count: the
# decode prompts of all sequences go in one pass, then the decode steps. The prefill case: the bench's
# warm-up prefill (its last row's logits: the lm_head at one row).
cases=("decode_b1 1 1 1 4 1200 1100 1" "decode_b8 8 1 1 3 2000 3300 8" "decode_b64 64 1 1 3 2000 3300 64" "prefill_2048 1 2048 1 1 0 1800 2048")
for c in "${cases[@]}"; do
    set -- $c
    MOESERVE_NO_GRAPHS=1 timeout 240 ncu --clock-control none --cache-control none --launch-skip "$6" \
        --launch-count "$7" --metrics gpu__time_duration.sum --csv "$build/moeserve" bench --model "$synth" \
        --backend cuda --batch "$2" --prompt-len "$3" --decode-context "$4" --decode "$5" \
        >"$out/ncu_$1.csv" 2>"$out/ncu_$1.err"
done
python3 - "$out" "${cases[@]}" <<'PY' | tee "$out/trace_check.txt"
import csv, json, re, sys
out, cases = sys.argv[1], [c.split() for c in sys.argv[2:]]
kern = json.load(open(out + "/kernels.json"))["kernels"]
plan = json.load(open(out + "/plan.json"))
sym = {k["name"]: re.compile(r"\b(%s)\b" % k["symbols"]) for k in kern if k["symbols"]}
def bucket(t):
    return "1" if t <= 1 else "2-8" if t <= 8 else "9-32" if t <= 32 else "33-64" if t <= 64 else "65+"
def lists(op, t, w):
    for d in plan["dispatch"]:
        if d["op"] == op and d["tokens"] == bucket(t) and d["weights"] == w:
            return d["kernels"]
    return []
fail = 0
for name, batch, prompt, ctx, dec, skip, count, tokens in cases:
    t = int(tokens)
    rows = [r for r in csv.reader(open("%s/ncu_%s.csv" % (out, name))) if len(r) > 10]
    if len(rows) < 2:
        print("%-14s no ncu rows (see ncu_%s.err)" % (name, name)); fail += 1; continue
    ix = {n: i for i, n in enumerate(rows[0])}
    seq = [r[ix["Kernel Name"]] for r in rows[1:] if r[ix["Metric Name"]] == "gpu__time_duration.sum"]
    starts = [i for i, n in enumerate(seq) if "embed_kernel" in n]
    if len(starts) < 2 and name.startswith("decode"):
        print("%-14s fewer than two steps in %d launches" % (name, len(seq))); fail += 1; continue
    # decode: the last complete pass; prefill: the first (the warm-up prefill)
    step = seq[starts[-2]:starts[-1]] if name.startswith("decode") else seq[starts[0]:starts[1]] if len(starts) >= 2 else seq[starts[0]:] if starts else seq
    seen = {k for k, rx in sym.items() if any(rx.search(n) for n in step)}
    heads = [lists("linear", t, "nvfp4")[0], lists("moe_experts", t, "nvfp4")[0], lists("moe_route", t, "bf16")[0]]
    allowed = set(lists("linear", t, "nvfp4")) | set(lists("moe_experts", t, "nvfp4")) | set(lists("linear", t, "bf16"))
    allowed |= set(lists("linear", 1 if name.startswith("prefill") else t, "bf16"))  # lm_head rows
    allowed |= set(lists("moe_route", t, "bf16"))
    allowed_syms = {sym[k].pattern for k in allowed if k in sym}
    missing = [h for h in heads if h not in seen]
    stray = sorted(k for k in seen if sym[k].pattern not in allowed_syms)
    ok = not missing and not stray
    fail += not ok
    print("%-14s %4d launches a step; plan's first: %s; launched: %s%s%s" % (
        name, len(step), ", ".join(heads), ", ".join(sorted(seen)),
        "; MISSING " + ", ".join(missing) if missing else "", "; NOT IN THE PLAN " + ", ".join(stray) if stray else ""))
print("trace_check: %s" % ("every step ran the plan's kernels" if not fail else "%d case(s) disagree" % fail))
sys.exit(1 if fail else 0)
PY
