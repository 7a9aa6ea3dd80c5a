#!/usr/bin/env bash
# gpu_session.sh — on the GPU machine: several of this folder's GPU scripts in one call, each with
# its own output folder under $OUT and a time limit, so that one device start serves them all.
#
#   carry [".carry/ab", ".carry/lib", ...]: JOBS="train_tiny glm5_b1" [their environment] tools/gpu_session.sh
#   (job J runs tools/gpu_J.sh with OUT=$OUT/J and the limit LIMIT_J seconds, default 300)
# A job J:TAG runs tools/gpu_J.sh with OUT=$OUT/TAG, the limit LIMIT_TAG and, on top of the
# session's environment, the assignments in ENV_TAG (shell words: ENV_ab="PACKS='base new' ROUNDS=2"),
# so one script can run twice with different settings:
#   JOBS="glm5_b1:chk glm5_b1:ab" ENV_chk="BENCH=0 TESTS=gemm" ENV_ab="PACKS='base new'" tools/gpu_session.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_session}
rows=()
for spec in ${JOBS:-}; do
    j=${spec%%:*} tag=${spec#*:}
    lim_var=LIMIT_$tag env_var=ENV_$tag
    lim=${!lim_var:-300}
    mkdir -p "$out/$tag"
    t0=$SECONDS
    ([ -z "${!env_var:-}" ] || eval "export ${!env_var}"; OUT="$out/$tag" timeout "$lim" bash "$src/tools/gpu_$j.sh") >"$out/$tag/stdout.txt" 2>&1
    rc=$?
    rows+=("$(printf '%-16s rc %-3s %4ss' "$tag" "$rc" $((SECONDS - t0)))")
    echo "== $spec (rc $rc)"
    tail -${TAIL:-40} "$out/$tag/stdout.txt"
done
printf '%s\n' "${rows[@]}"
# few files come back from a device call: the files named in KEEP (basenames) stay, the rest go into logs.tgz
keep=" ${KEEP:-tiny.tgz generate_tiny.json} "
(cd "$out" && find . -type f | while read -r f; do case "$keep" in *" $(basename "$f") "*) ;; *) echo "$f";; esac; done |
    tar -czf /tmp/gpu_session_logs.tgz -T - 2>/dev/null)
find "$out" -type f | while read -r f; do case "$keep" in *" $(basename "$f") "*) ;; *) rm -f "$f";; esac; done
mv /tmp/gpu_session_logs.tgz "$out/logs.tgz"
