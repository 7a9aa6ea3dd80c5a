#!/usr/bin/env bash
# tools/ktrace_summary.py on a trace it can check by construction: two kernels (one block and 40
# blocks), three launches each, every block's records written here with a known structure. The
# script must find 3 launches of each, 3 and 40 x 3 block records, the launch spans this file gives, the
# timeline in launch order with each launch's gap and what it adds to the critical path, and the
# end to end; without records it must say so and fail.
# Usage: ktrace_summary.sh MOESERVE SRC_DIR WORK_DIR
set -u
src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
command -v python3 >/dev/null || { echo "skip: no python3"; exit 0; }
trace=$work/trace.txt
echo "# module kernel t0_ns t1_ns smid block cycles..." >"$trace"
t=1000000
for _ in 0 1 2; do
    echo "norm add_rmsnorm_vec $t $((t + 1500)) 0 0 3000 5000" >>"$trace"
    t=$((t + 5000))
    for b in $(seq 0 39); do # blocks start within 390 ns, each runs 6000 ns
        echo "decode gemv1 $((t + 10 * b)) $((t + 10 * b + 6000)) $((b % 132)) $b 1000 4000 9000 11000" >>"$trace"
    done
    t=$((t + 20000))
done
out=$(python3 "$src/tools/ktrace_summary.py" "$trace" 6) || { echo "FAIL: exit status $?: $out"; exit 1; }
fail=0
check() { grep -qE -- "$2" <<<"$out" || { echo "FAIL $1: no line matching '$2' in:"; echo "$out"; fail=1; }; }
check "gemv1 counts" '^decode/gemv1 +120 +3 +6\.39 '
check "norm counts" '^norm/add_rmsnorm_vec +3 +3 +1\.50 '
check "gemv1 phases" '0:1000 1:3000 2:5000 3:2000'
check "timeline order" 'decode/gemv1 +40 +5\.00 +6\.39 +3\.50 +9\.89 '
check "timeline gap" 'norm/add_rmsnorm_vec +1 +25\.00 +1\.50 +13\.61 +15\.11 '
check "timeline first" 'norm/add_rmsnorm_vec +1 +0\.00 +1\.50 +1\.50 '
check "end to end" '^end to end: 61\.39 us over 6 launches$'
echo "# empty" >"$work/empty.txt"
if python3 "$src/tools/ktrace_summary.py" "$work/empty.txt" >/dev/null 2>&1; then
    echo "FAIL: a trace without records was accepted"
    fail=1
fi
[ $fail = 0 ] && echo "ok: ktrace_summary.py"
exit $fail
