#!/usr/bin/env bash
# gpu_session.sh — on the GPU machine: several of this folder's GPU scripts in one call, each with
# its own output folder under $OUT and a time limit, so that one device start serves them all.
#
#   carry [".carry/ab", ".carry/lib", ...]: JOBS="train_tiny glm5_b1" [their environment] tools/gpu_session.sh
#   (job J runs tools/gpu_J.sh with OUT=$OUT/J and the limit LIMIT_J seconds, default 300)
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_session}
rows=()
for j in ${JOBS:-}; do
    lim_var=LIMIT_$j
    lim=${!lim_var:-300}
    mkdir -p "$out/$j"
    t0=$SECONDS
    OUT="$out/$j" timeout "$lim" bash "$src/tools/gpu_$j.sh" >"$out/$j/stdout.txt" 2>&1
    rc=$?
    rows+=("$(printf '%-16s rc %-3s %4ss' "$j" "$rc" $((SECONDS - t0)))")
    echo "== $j (rc $rc)"
    tail -${TAIL:-40} "$out/$j/stdout.txt"
done
printf '%s\n' "${rows[@]}"
# few files come back from a device call: the files named in KEEP (basenames) stay, the rest go into logs.tgz
keep=" ${KEEP:-tiny.tgz generate_tiny.json} "
(cd "$out" && find . -type f | while read -r f; do case "$keep" in *" $(basename "$f") "*) ;; *) echo "$f";; esac; done |
    tar -czf /tmp/gpu_session_logs.tgz -T - 2>/dev/null)
find "$out" -type f | while read -r f; do case "$keep" in *" $(basename "$f") "*) ;; *) rm -f "$f";; esac; done
mv /tmp/gpu_session_logs.tgz "$out/logs.tgz"
