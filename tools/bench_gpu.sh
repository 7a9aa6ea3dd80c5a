#!/usr/bin/env bash
# bench_gpu.sh — issue 6's benchmark on the GPU machine: moeserve on a synthetic Qwen3-30B-A3B in
# NVFP4 against transformers `generate` on the same shapes in BF16, in one run.
#
#   tools/bench_gpu.sh [BUILD_DIR] [checkpoint]   (default: build; needs BUILD_DIR/moeserve and
#                                                  BUILD_DIR/make_synth_checkpoint built with CUDA)
#
# With "checkpoint" only step 1 runs: the checkpoint can be made in one call of a time-limited
# runner and the benchmarks run in the next (it stays in $SYNTH_DIR while the machine is held).
#
# 1. the checkpoint: BUILD_DIR/make_synth_checkpoint --preset qwen3-30b-a3b --format nvfp4 into
#    $SYNTH_DIR (default /tmp/synth-30b-nvfp4, ~17 GB; kept and reused when complete);
# 2. moeserve bench --backend cuda: prefill of $PROMPT_LEN tokens, decode at $BATCHES, the
#    device-to-device copy bandwidth, NVML power, GPU memory (JSON);
#    Then, for the power figure only, batch 1 again over $POWER_STEPS decode steps (~1.2 s at
#    session 8's speed): the main run's 64 steps take 0.15 s, too short for NVML's energy
#    counter (its batch-1 power read 27%, 52% and 70% of the limit in three runs);
# 3. tools/bench_hf_generate.py on the checkpoint's config.json (BF16, random weights);
# 4. a comparison table: decode tok/s per batch and the speedup, prefill, batch-1 weight
#    bandwidth as % of the copy bandwidth (target >= 50%), power as % of the limit.
# Logs and JSON go to $OUT when it is set (the device tool's output folder), else to
# BUILD_DIR/bench_gpu/. A failed step is reported and the next one still runs; exit status 0
# when both benchmarks produced their JSON.
#
# Environment (defaults): SYNTH_DIR (/tmp/synth-30b-nvfp4), SYNTH_LAYERS (48, all), BATCHES (1,8,64),
# PROMPT_LEN (2048), DECODE_STEPS (64), DECODE_CONTEXT (128), PREFILL_REPS (3), POWER_STEPS (512; 0:
# no power run), HF_NEW_TOKENS (32),
# HF_MAX_SECONDS (200), STEP_TIMEOUT (270 s per step: two steps fit a 600 s runner), SKIP_HF=1.
set -u
build=${1:-build}
only=${2:-all}
build=$(cd "$build" && pwd) || exit 2
src=$(cd "$(dirname "$0")/.." && pwd)
logs=${OUT:-$build/bench_gpu}
mkdir -p "$logs"
synth=${SYNTH_DIR:-/tmp/synth-30b-nvfp4}
layers=${SYNTH_LAYERS:-48}
batches=${BATCHES:-1,8,64}
prompt_len=${PROMPT_LEN:-2048}
steps=${DECODE_STEPS:-64}
context=${DECODE_CONTEXT:-128}
reps=${PREFILL_REPS:-3}
hf_new=${HF_NEW_TOKENS:-32}
step_timeout=${STEP_TIMEOUT:-270}
for bin in moeserve make_synth_checkpoint; do
    [ -x "$build/$bin" ] || { echo "bench_gpu: $build/$bin is not built" >&2; exit 2; }
done

t_all=$SECONDS
stamp() { echo "[$((SECONDS - t_all)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv \
    >"$logs/gpu.txt" 2>&1 || true
cat "$logs/gpu.txt"

# 1. checkpoint: made once; .complete is written last, so an interrupted write is never reused
want="qwen3-30b-a3b nvfp4 layers=$layers"
if [ -f "$synth/.complete" ] && [ "$(cat "$synth/.complete")" = "$want" ]; then
    stamp "checkpoint: reusing $synth ($want)"
else
    rm -rf "$synth"
    mkdir -p "$synth"
    avail_kb=$(df -Pk "$synth" | awk 'NR == 2 {print $4}')
    need_kb=$((1500000 + layers * 370000)) # embed + lm_head 1.24 GB, 0.35 GB per NVFP4 layer, + margin
    if [ -n "$avail_kb" ] && [ "$avail_kb" -lt "$need_kb" ]; then
        echo "bench_gpu: $synth: $((avail_kb / 1000000)) GB free, the checkpoint needs ~$((need_kb / 1000000)) GB" >&2
        exit 1
    fi
    stamp "checkpoint: writing $synth ($want)"
    timeout "$step_timeout" "$build/make_synth_checkpoint" --out "$synth" --preset qwen3-30b-a3b \
        --format nvfp4 --layers "$layers" >"$logs/make_synth.log" 2>&1
    rc=$?
    tr '\r' '\n' <"$logs/make_synth.log" | tail -n 2
    if [ $rc != 0 ]; then
        echo "bench_gpu: make_synth_checkpoint failed with exit $rc (see $logs/make_synth.log)" >&2
        exit 1
    fi
    [ -f "$synth/config.json" ] || { echo "bench_gpu: no $synth/config.json" >&2; exit 1; }
    echo "$want" >"$synth/.complete"
fi
if [ "$only" = checkpoint ]; then
    stamp "checkpoint ready: $(du -sh "$synth" | cut -f1) in $synth"
    exit 0
fi

# 2. moeserve
stamp "moeserve bench --backend cuda"
timeout "$step_timeout" "$build/moeserve" bench --backend cuda --model "$synth" --batch "$batches" \
    --prompt-len "$prompt_len" --prefill-reps "$reps" --decode "$steps" --decode-context "$context" --json \
    >"$logs/moeserve_bench.json" 2>"$logs/moeserve_bench.log"
rc_ms=$?
stamp "moeserve bench: exit $rc_ms"
tail -n 5 "$logs/moeserve_bench.log"
power_steps=${POWER_STEPS:-512}
if [ "$power_steps" -gt 0 ]; then
    stamp "moeserve bench, batch 1 over $power_steps steps (power)"
    timeout "$step_timeout" "$build/moeserve" bench --backend cuda --model "$synth" --batch 1 --prompt-len "$context" \
        --decode "$power_steps" --decode-context "$context" --json \
        >"$logs/moeserve_power_b1.json" 2>"$logs/moeserve_power_b1.log"
    stamp "moeserve bench (power): exit $?"
fi

# 3. transformers
rc_hf=0
if [ "${SKIP_HF:-0}" = 1 ]; then
    stamp "transformers: skipped (SKIP_HF=1)"
    rc_hf=skipped
else
    stamp "transformers generate (BF16)"
    timeout "$step_timeout" python3 "$src/tools/bench_hf_generate.py" "$synth/config.json" --batch "$batches" \
        --context "$context" --new-tokens "$hf_new" --prompt-len "$prompt_len" --layers "$layers" \
        --max-seconds "${HF_MAX_SECONDS:-200}" --out "$logs/hf_generate.json" \
        >/dev/null 2>"$logs/hf_generate.log"
    rc_hf=$?
    stamp "transformers: exit $rc_hf"
    tail -n 5 "$logs/hf_generate.log"
fi

# 4. comparison
python3 - "$logs/moeserve_bench.json" "$logs/hf_generate.json" "$logs/bench_gpu.json" "$logs/moeserve_power_b1.json" \
    <<'PY' | tee "$logs/summary.txt"
import json, sys

def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"(no result in {p}: {e})")
        return None

ms, hf = load(sys.argv[1]), load(sys.argv[2])
try:  # the long batch-1 run for the power figure (absent with POWER_STEPS=0)
    with open(sys.argv[4]) as f:
        pw = json.load(f)
except (OSError, ValueError):
    pw = None
def fmt(v, spec=".1f"):
    return "n/a" if v is None else format(v, spec)
def ratio(a, b):
    return a / b if a and b else None
def times(v):
    return "n/a" if v is None else f"{v:.2f}x"

print()
print(f"moeserve: {ms.get('device') if ms else 'n/a'}, weights {fmt(ms and ms['weights_bytes'] / 1e9, '.2f')} GB "
      f"(NVFP4); transformers {hf.get('transformers') if hf else 'n/a'} BF16, experts "
      f"{hf.get('experts_implementation') if hf else 'n/a'}, attention {hf.get('attn_implementation') if hf else 'n/a'}")
print(f"{'':28s} {'moeserve':>12s} {'transformers':>13s} {'speedup':>8s}")
rows = []
ms_dec = {r["batch"]: r for r in (ms or {}).get("decode", [])}
hf_dec = {r["batch"]: r for r in (hf or {}).get("decode", [])}
for b in sorted(set(ms_dec) | set(hf_dec)):
    a = ms_dec.get(b, {}).get("tok_s")
    h = hf_dec.get(b, {}).get("tok_s")
    note = ms_dec.get(b, {}).get("error") or hf_dec.get(b, {}).get("error") or hf_dec.get(b, {}).get("skipped") or ""
    print(f"{'decode tok/s, batch ' + str(b):28s} {fmt(a):>12s} {fmt(h):>13s} {times(ratio(a, h)):>8s} {note}")
    rows.append({"batch": b, "moeserve_tok_s": a, "transformers_tok_s": h, "speedup": ratio(a, h)})
pa = ms and ms.get("prefill", {}).get("tok_s")
ph = hf and hf.get("prefill", {}).get("tok_s")
plen = (ms or hf or {}).get("prefill", {}).get("tokens", "n/a")
print(f"{'prefill tok/s, ' + str(plen) + ' tokens':28s} {fmt(pa):>12s} {fmt(ph):>13s} {times(ratio(pa, ph)):>8s}")
b1 = ms_dec.get(1, {})
pct = b1.get("pct_of_copy")
print()
print(f"batch-1 decode: {fmt(b1.get('weight_gb_s'))} GB/s of weights = {fmt(pct)}% of the measured copy bandwidth "
      f"{fmt(ms and ms.get('copy_gb_s'))} GB/s (target >= 50%: {'met' if pct and pct >= 50 else 'NOT met'})")
sp1 = ratio(b1.get("tok_s"), hf_dec.get(1, {}).get("tok_s"))
print(f"batch-1 speedup over transformers: {times(sp1)} (target >= 5x: {'met' if sp1 and sp1 >= 5 else 'NOT met'})")
pw1 = next((r for r in (pw or {}).get("decode", []) if r.get("batch") == 1 and "tok_s" in r), None)
if pw1:
    print(f"power, decode batch 1 over {pw1.get('steps')} steps ({fmt(pw1.get('seconds'), '.2f')} s, "
          f"{fmt(pw1.get('tok_s'))} tok/s): {fmt(pw1.get('power_avg_w'))} W = {fmt(pw1.get('power_pct_of_limit'))}% "
          f"of the limit (sampled {fmt(pw1.get('power_sampled_avg_w'))} W, {pw1.get('power_samples')} samples)")
if ms:
    for r in ms.get("decode", []):
        if "tok_s" in r:
            short = " (the timed run's window)" if r["batch"] == 1 and pw1 else ""
            print(f"power, decode batch {r['batch']}{short}: {fmt(r.get('power_avg_w'))} W = "
                  f"{fmt(r.get('power_pct_of_limit'))}% of the {fmt(ms.get('power_limit_w'), '.0f')} W limit")
    p = ms.get("prefill", {})
    print(f"power, prefill: {fmt(p.get('power_avg_w'))} W = {fmt(p.get('power_pct_of_limit'))}% of the limit")
    print(f"GPU memory in use after load: {fmt(ms.get('gpu_mem_used_mib') and ms['gpu_mem_used_mib'] / 1024)} GiB; "
          f"moeserve peak RSS {fmt(ms.get('peak_rss_mib'), '.0f')} MiB; transformers peak allocated "
          f"{fmt(hf and hf.get('peak_mem_gib'))} GiB")
with open(sys.argv[3], "w") as f:
    json.dump({"moeserve": ms, "transformers": hf, "comparison": rows,
               "batch1_pct_of_copy": pct, "batch1_speedup": sp1, "power_batch1_long": pw1}, f, indent=2)
PY
stamp "done; logs in $logs"
# moeserve exits 1 when one batch size failed but still writes its JSON (the row says why)
[ -s "$logs/moeserve_bench.json" ] || exit 1
[ "$rc_hf" = 0 ] || [ "$rc_hf" = skipped ] || exit 1
exit 0
