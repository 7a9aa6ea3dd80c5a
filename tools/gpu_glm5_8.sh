#!/usr/bin/env bash
# gpu_glm5_8.sh — issue 29 on 8 GPUs (nvidia-h200-x8), one call: the whole 78-layer GLM-5 in NVFP4 with
# its weights made on the GPUs (bench --synthetic glm5 --tensor-parallel 8): the layout the planner
# chose and why, decode at batch 1/8/64 over 2048- and 32768-token contexts (random cache rows),
# prefill of a 4096-token prompt, per-GPU power (nvidia-smi sampled over the runs), the same at the
# sm_120 budget (--smem-budget 101376); serve --tensor-parallel 8 with bench serve at 1/16/64 (1024 +
# 256 tokens; the Qwen3 tokenizer in .carry/tok stands in for GLM-5's); the simulated two-node launch
# where mpirun exists. A table last; logs in $OUT (one archive).
#
#   carry [".carry/ab", ".carry/lib", ".carry/tok"]    NEW=new tools/gpu_glm5_8.sh
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_glm5_8}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}:/usr/lib/x86_64-linux-gnu"
export NCCL_NVLS_ENABLE=0 # KINDS.md: NVLink multicast stays off
d=/tmp/abx-${NEW:-new}
rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d" || exit 2
n=$(nvidia-smi -L | wc -l)
rows=("GPUs $n")
cfg=/tmp/glm5-config
"$d/make_synth_checkpoint" --out "$cfg" --preset glm5 --format nvfp4 --config-only >/dev/null 2>&1
"$d/moeserve" plan --model "$cfg" --device 0 --tensor-parallel "$n" >"$out/plan.txt" 2>&1
rows+=("plan: $(grep -A1 'routed experts  ' "$out/plan.txt" | head -1 | tr -s ' ') | $(grep 'routed experts:' "$out/plan.txt" | cut -c1-120)")
summ() {
    python3 -c "
import json
try:
    d = json.load(open('$1'))
    print(' '.join('b%s %.1f tok/s (%.2f ms, %.0f GB/s a GPU)' % (x['batch'], x['tok_s'], x['ms_per_step'],
          x['weight_gb_s']) for x in d['decode']), '| prefill %.0f tok/s' % d['prefill']['tok_s'],
          '| %.0f GB a GPU' % (d['weights_bytes'] / 1e9))
except Exception as e:
    print('failed (%s)' % e)"
}
nvidia-smi --query-gpu=index,power.draw --format=csv,noheader,nounits -lms 500 >"$out/power.csv" 2>/dev/null &
pw=$!
for run in "2048 0" "32768 0" "2048 101376"; do
    set -- $run
    bflag=
    [ "$2" != 0 ] && bflag="--smem-budget $2"
    timeout 580 "$d/moeserve" bench --backend cuda --synthetic glm5 --tensor-parallel "$n" $bflag --batch 1,8,64 \
        --decode-context "$1" --context-fill random --prompt-len 4096 --decode 32 --json \
        >"$out/glm5_$1_$2.json" 2>"$out/glm5_$1_$2.err"
    rows+=("glm5 tp $n ctx $1 smem $2 rc $?: $(summ "$out/glm5_$1_$2.json")")
done
kill $pw 2>/dev/null
rows+=("power W per GPU (max over the runs): $(awk -F', ' '{ if ($2 > m[$1]) m[$1] = $2 } END { for (g in m) printf "%s:%s ", g, m[g] }' "$out/power.csv")")
tok=$src/.carry/tok
if [ -f "$tok/tokenizer.json" ]; then
    "$d/moeserve" serve --backend cuda --synthetic glm5 --tokenizer "$tok" --tensor-parallel "$n" --max-seqs 64 \
        --port 0 >"$out/serve.out" 2>"$out/serve.err" &
    sp=$!
    for _ in $(seq 1 600); do grep -q listening "$out/serve.out" 2>/dev/null && break; sleep 0.5; done
    url=$(grep -o 'http://[0-9.:]*' "$out/serve.out" | head -1)
    timeout 500 "$d/moeserve" bench serve --url "$url" --concurrency 1,16,64 --input-len 1024 --output-len 256 --json \
        >"$out/bench_serve.json" 2>"$out/bench_serve.err"
    rows+=("serve glm5 tp $n: $(python3 -c "
import json
d = json.load(open('$out/bench_serve.json'))
print('; '.join('c%s %.1f tok/s TPOT %.1f ms TTFT p99 %.0f ms' % (l['concurrency'], l['output_tok_s'], l['tpot_ms']['mean'],
      l['ttft_ms']['p99']) for l in d['levels']))" 2>&1 | tail -1)")
    kill -TERM $sp
    wait $sp
fi
if command -v mpirun >/dev/null; then
    # two nodes of four simulated on one host: NCCL bootstrapped over MPI, each rank's GPU its local rank
    for m in "$src"/tests/golden/quant/dsa_basic_nvfp4 "$src"/tests/golden/models/qwen3_basic; do
        name=$(basename "$m")
        "$d/moeserve" logits --backend cuda --model "$m" --tokens 1,5,9,33,2,7,100,3 --tensor-parallel "$n" \
            --out "$out/$name.fork.bin" >/dev/null 2>&1
        mpirun --allow-run-as-root -np "$n" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x OMPI_COMM_WORLD_LOCAL_RANK \
            "$d/moeserve" logits --backend cuda --model "$m" --tokens 1,5,9,33,2,7,100,3 --tensor-parallel "$n" \
            --out "$out/$name.mpi.bin" >"$out/$name.mpi.log" 2>&1
        cmp -s "$out/$name.fork.bin" "$out/$name.mpi.bin" && rows+=("$name: mpirun -np $n = the forked ranks, bit for bit") ||
            rows+=("$name: mpirun -np $n differs or failed: $(tail -1 "$out/$name.mpi.log")")
    done
else
    rows+=("multi-node simulation: skipped (no mpirun on this machine)")
fi
printf '%s\n' "${rows[@]}"
(cd "$out" && tar -czf /tmp/gpu_glm5_8.tgz --exclude='*.bin' . && find . -mindepth 1 -delete && mv /tmp/gpu_glm5_8.tgz .)
