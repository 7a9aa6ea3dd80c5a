#!/usr/bin/env bash
# ab_run.sh — on the GPU machine: every build that tools/ab_pack.sh packed (.carry/ab/NAME.tar.xz):
# its op tests and golden fixtures, then `moeserve bench` at $BATCHES (default 1,8) on the
# synthetic Qwen3-30B-A3B NVFP4 checkpoint, the builds interleaved over $ROUNDS rounds (default 2)
# so that the machine's drift hits them alike; a table last. Logs in $OUT (or /tmp/ab_run).
#
#   export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
#   ROUNDS=2 BATCHES=1,8 tools/ab_run.sh
#
# PROMPT_LEN (default 128) and PREFILL_REPS (1) set the prefill that is timed too (decode stays at
# a 128-token context). A build whose .carry/ab/NAME.env exists runs its benches with those
# VAR=VALUE words in the environment (pack one commit under two names to compare a switch).
#
# A build compiled in /tmp/ab-NAME (ab_pack.sh's worktree) looks for its sources, fixtures and
# the tiny model there: that path is linked to this checkout, whose tests/ and models/ are the
# same files.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/ab_run}
mkdir -p "$out"
synth=${SYNTH_DIR:-/tmp/synth-30b-nvfp4}
names=()
summary=()
for t in "$src"/.carry/ab/*.tar.xz; do
    [ -f "$t" ] || { echo "ab_run: nothing in .carry/ab (tools/ab_pack.sh packs builds)"; exit 2; }
    name=$(basename "$t" .tar.xz)
    d=/tmp/abx-$name
    rm -rf "$d" && mkdir -p "$d" && tar -xJf "$t" -C "$d" || { summary+=("$name: unpack failed"); continue; }
    ln -sfn "$src" "/tmp/ab-$name"
    names+=("$name")
    r1=0 # every op-test program of the build (one, or one a kernel family)
    : >"$out/ops_$name.log"
    for t in "$d"/tests/test_ops*_cuda; do
        MOESERVE_SRC="$src" TMPDIR="$d" "$t" >>"$out/ops_$name.log" 2>&1 || r1=$?
    done
    MOESERVE_SRC="$src" TMPDIR="$d" "$d/tests/test_golden_cuda" >"$out/golden_$name.log" 2>&1
    r2=$?
    summary+=("$name: op tests rc $r1 ($(grep -c '^\[  FAILED  \]' "$out/ops_$name.log") failed), goldens rc $r2")
done
[ ${#names[@]} -gt 0 ] || exit 2
if ! nvidia-smi -L >/dev/null 2>&1; then # no GPU: the tests above skipped; no 18 GB checkpoint here
    printf '%s\n' "${summary[@]}"
    echo "ab_run: no GPU on this machine: nothing benched"
    exit 2
fi
want="qwen3-30b-a3b nvfp4 layers=48"
if ! [ -f "$synth/.complete" ] || [ "$(cat "$synth/.complete")" != "$want" ]; then
    rm -rf "$synth" && mkdir -p "$synth"
    "/tmp/abx-${names[0]}/make_synth_checkpoint" --out "$synth" --preset qwen3-30b-a3b --format nvfp4 \
        >"$out/synth.log" 2>&1 && echo "$want" >"$synth/.complete"
fi
for round in $(seq 1 "${ROUNDS:-2}"); do
    for name in "${names[@]}"; do
        envs=$(cat "$src/.carry/ab/$name.env" 2>/dev/null)
        # shellcheck disable=SC2086
        env $envs "/tmp/abx-$name/moeserve" bench --model "$synth" --backend cuda --batch "${BATCHES:-1,8}" \
            --prompt-len "${PROMPT_LEN:-128}" --prefill-reps "${PREFILL_REPS:-1}" --decode-context 128 \
            --decode 64 --json >"$out/bench_${name}_$round.json" 2>"$out/bench_${name}_$round.err"
    done
done
echo "---- ab_run"
cat "$src/.carry/ab/index.txt" 2>/dev/null
printf '%s\n' "${summary[@]}"
python3 - "$out" "${ROUNDS:-2}" "${names[@]}" <<'PY'
import json, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for n in names:
    cells = []
    for r in range(1, rounds + 1):
        try:
            d = json.load(open("%s/bench_%s_%d.json" % (out, n, r)))
            c = " ".join("b%s %.1f" % (x.get("batch"), x.get("tok_s") or 0) for x in d.get("decode", []))
            pf = d.get("prefill") or {}
            cells.append(c + (" prefill%s %.1f" % (pf.get("tokens"), pf["tok_s"]) if pf.get("tok_s") else ""))
        except Exception as e:
            cells.append("no json (%s)" % e)
    print("%-12s %s" % (n, " | ".join(cells)))
PY
