#!/usr/bin/env bash
# gpu_ab_check.sh — on the GPU machine, one call: the builds tools/ab_pack.sh packed (old and new),
# through tools/ab_run.sh (op tests and golden fixtures of each, then `moeserve bench` on the
# synthetic Qwen3-30B-A3B NVFP4 checkpoint, the builds interleaved), then the new build's golden
# fixtures at the sm_120 budget (MOESERVE_SMEM_BUDGET=101376) and unsplit (MOESERVE_ATTN_SPLITS=none)
# at both budgets; with SANITIZE=1 also compute-sanitizer memcheck and racecheck of its op tests.
# A table last; logs in $OUT.
#
#   carry [".carry/ab", ".carry/lib"]
#   NEW=new BATCHES=1,8,64 PROMPT_LEN=2048 [TRACE=1] [SANITIZE=1] [SKIP_AB=1] tools/gpu_ab_check.sh
# TRACE=1: tools/trace_check.sh on the new build; SKIP_AB=1: no op tests, goldens or benches of
# ab_run (the sanitizers alone fit one call that way).
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_ab_check}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
new=${NEW:-new}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
d=/tmp/abx-$new
if [ "${SKIP_AB:-0}" = 1 ]; then # the sanitizers alone: unpack the new build only
    rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/$new.tar.xz" -C "$d" && ln -sfn "$src" "/tmp/ab-$new"
    echo "---- ab_run skipped" >"$out/ab_run.log"
else
    BATCHES=${BATCHES:-1,8,64} PROMPT_LEN=${PROMPT_LEN:-2048} PREFILL_REPS=${PREFILL_REPS:-2} ROUNDS=${ROUNDS:-2} \
        OUT="$out" timeout "${AB_TIMEOUT:-420}" "$src/tools/ab_run.sh" >"$out/ab_run.log" 2>&1
    echo "ab_run rc $?" >>"$out/ab_run.log"
fi
rows=()
run() { # run NAME LOG ENV... -- COMMAND...
    local name=$1 log=$2 t0=$SECONDS
    shift 2
    env MOESERVE_SRC="$src" TMPDIR="$d" "$@" >"$out/$log" 2>&1
    local rc=$?
    rows+=("$(printf '%-44s rc %-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(grep -cE '^\[  FAILED  \]' "$out/$log") failed")")
}
run "goldens, smem 101376" golden_small.log MOESERVE_SMEM_BUDGET=101376 "$d/tests/test_golden_cuda"
run "goldens, unsplit" golden_unsplit.log MOESERVE_ATTN_SPLITS=none "$d/tests/test_golden_cuda"
run "goldens, unsplit, smem 101376" golden_unsplit_small.log MOESERVE_ATTN_SPLITS=none MOESERVE_SMEM_BUDGET=101376 \
    "$d/tests/test_golden_cuda"
[ -d /tmp/synth-30b-nvfp4 ] && run "plan --device 0 (model)" plan.log "$d/moeserve" plan --device 0 --model /tmp/synth-30b-nvfp4
if [ "${TRACE:-0}" = 1 ]; then
    OUT="$out/trace" timeout 300 "$src/tools/trace_check.sh" "$d" >"$out/trace_check.log" 2>&1
    rows+=("$(printf '%-44s rc %-3s %s' "trace_check (launched kernels = plan)" "$?" "$(tail -n 1 "$out/trace_check.log")")")
fi
if [ "${SANITIZE:-0}" = 1 ]; then
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for t in "$d"/tests/test_ops_*_cuda; do
        n=$(basename "$t")
        run "memcheck $n" "memcheck_$n.log" MOESERVE_OPS_QUICK=1 timeout 300 "$cs" --tool memcheck \
            --error-exitcode 1 --leak-check full "$t"
        run "racecheck $n" "racecheck_$n.log" MOESERVE_OPS_QUICK=1 MOESERVE_OPS_NO_CUBLAS=1 timeout 330 "$cs" \
            --tool racecheck --error-exitcode 1 "$t"
    done
fi
{
    echo "==== $(cat "$out/gpu.txt")"
    sed -n '/^---- ab_run/,$p' "$out/ab_run.log"
    printf '%s\n' "${rows[@]}"
    [ -f "$out/trace/trace_check.txt" ] && cat "$out/trace/trace_check.txt"
    for l in "$out"/ops_*.log "$out"/golden*.log; do
        printf '%-28s %s\n' "$(basename "$l")" "$(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]' "$l" | tr '\n' ' ')"
    done
} | tee "$out/summary.txt"
# the device tool brings back at most 8 files: everything else in one archive
(cd "$out" && tar -czf /tmp/gpu_ab_logs.tgz --exclude=logs.tgz . && mv /tmp/gpu_ab_logs.tgz logs.tgz &&
    find . -maxdepth 1 -type f ! -name logs.tgz ! -name summary.txt -delete)
