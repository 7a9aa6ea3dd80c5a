#!/usr/bin/env bash
# decode_iter.sh — one device call of the decode-speed loop: correctness first, then speed.
#
#   tools/decode_iter.sh [BUILD_DIR]   (default build-dev; unpacks .carry/bin/dev.tar.xz first when
#                                       it exists: binaries packed here to fit the carry limit)
#
# 1. ctest -L gpu (op tests + golden fixtures on CUDA), failures listed;
# 2. moeserve bench at batch 1 and 8 on the synthetic Qwen3-30B-A3B NVFP4 checkpoint, once per
#    line of $VARIANTS ("name ENV=VALUE ..."), so that each knob is measured in the same call
#    (BATCHES=1,8; the prefill of PROMPT_LEN=128 tokens, PREFILL_REPS=1 timed passes, is
#    reported too; decode always runs at a 128-token context);
# 3. optional ncu per-kernel table ($NCU=1, tools/profile_decode.sh);
# a table last. Logs go to $OUT (the device tool's output folder) or BUILD_DIR/decode_iter.
set -u
build=${1:-build-dev}
src=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$src/.carry/bin/dev.tar.xz" ] && (cd "$src" && tar -xJf .carry/bin/dev.tar.xz)
build=$(cd "$build" && pwd) || exit 2
# everything is written to one folder and packed into $OUT/decode_iter.tgz at the end (the device
# tool returns at most 8 files)
logs=$build/decode_iter
rm -rf "$logs" && mkdir -p "$logs"
synth=${SYNTH_DIR:-/tmp/synth-30b-nvfp4}
summary=()
t0=$SECONDS
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    ctest --test-dir "$build" -L gpu --output-on-failure -V >"$logs/ctest_gpu.log" 2>&1
    rc=$?
    summary+=("ctest -L gpu: rc $rc ($((SECONDS - t0)) s); $(grep -cE '^\[  FAILED  \]|^\[  ERROR   \]' "$logs/ctest_gpu.log") failed cases")
    grep -E "FAILED|ERROR|not written|rel err [0-9.e+-]* > |mismatches [1-9]" "$logs/ctest_gpu.log" | head -30
fi
# SYNTH_ARGS: more make_synth_checkpoint options, e.g. "--embed-scale 200" (routing spread as a
# trained model's; give it its own SYNTH_DIR)
want="qwen3-30b-a3b nvfp4 layers=48${SYNTH_ARGS:+ $SYNTH_ARGS}"
if ! [ -f "$synth/.complete" ] || [ "$(cat "$synth/.complete")" != "$want" ]; then
    rm -rf "$synth" && mkdir -p "$synth"
    # shellcheck disable=SC2086
    "$build/make_synth_checkpoint" --out "$synth" --preset qwen3-30b-a3b --format nvfp4 ${SYNTH_ARGS:-} >"$logs/synth.log" 2>&1 &&
        echo "$want" >"$synth/.complete"
fi
variants=${VARIANTS:-"default"}
while IFS= read -r line; do
    [ -z "$line" ] && continue
    name=${line%% *}
    envs=""
    [ "$name" != "$line" ] && envs=${line#* }
    # shellcheck disable=SC2086
    env $envs "$build/moeserve" bench --model "$synth" --backend cuda --batch "${BATCHES:-1,8}" --prompt-len "${PROMPT_LEN:-128}" \
        --prefill-reps "${PREFILL_REPS:-1}" --decode-context 128 --decode 64 --json >"$logs/bench_$name.json" 2>"$logs/bench_$name.err"
    r=$(python3 - "$logs/bench_$name.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no json (%s)" % e); sys.exit(0)
out = []
for r in d.get("decode", []):
    out.append("b%s %.1f tok/s %.2f ms/step %.1f%% copy" % (r.get("batch"), r.get("tok_s") or 0, r.get("ms_per_step") or 0,
                                                          r.get("pct_of_copy") or 0))
p = d.get("prefill") or {}
if p.get("tok_s"):
    out.append("prefill %s tok %.1f tok/s" % (p.get("tokens"), p["tok_s"]))
print("; ".join(out) if out else json.dumps(d)[:300])
EOF
)
    summary+=("bench $name [$envs]: $r")
done <<<"$variants"
if [ "${NCU:-0}" = 1 ]; then
    LAUNCHES=${LAUNCHES:-16} "$src/tools/profile_decode.sh" "$build" >"$logs/profile.txt" 2>&1
    tail -25 "$logs/profile.txt"
fi
echo "---- summary ($((SECONDS - t0)) s)"
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
[ -n "${OUT:-}" ] && tar -czf "$OUT/decode_iter.tgz" -C "$logs" .
