#!/usr/bin/env bash
# gpu_ranks.sh — on a GPU machine: GPU ranks (--backend cuda --tensor-parallel N, one process a GPU,
# NCCL), in one call. With one GPU (the lent H200): the one-rank NCCL tests (test_comm_cuda) and the
# refusal of more ranks than GPUs; with N >= 2 GPUs (issue 29's nvidia-h200-x2 / -x8): every golden
# fixture's logits with N ranks against one GPU, and synthetic Qwen3-30B-A3B NVFP4 decode and
# prefill at --tensor-parallel N against one GPU. A table last; logs in $OUT (one archive).
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
    q=/tmp/qwen3-30b-nvfp4
    [ -f "$q/config.json" ] || "$d/make_synth_checkpoint" --out "$q" --preset qwen3-30b-a3b --format nvfp4 >/dev/null 2>&1
    for tp in none 1; do
        flag=
        [ $tp = 1 ] && flag="--tensor-parallel 1"
        "$d/moeserve" bench --backend cuda --model "$q" --batch 1,8,64 --prompt-len 512 --decode-context 128 \
            --decode 64 $flag --json >"$out/bench_$tp.json" 2>"$out/bench_$tp.err"
        rows+=("qwen3 tp $tp: $(python3 -c "
import json
d = json.load(open('$out/bench_$tp.json'))
print(' '.join('b%s %.1f' % (x['batch'], x['tok_s']) for x in d['decode']), 'prefill %.0f' % d['prefill']['tok_s'])" 2>&1 | tail -1)")
    done
else
    for m in "$src"/tests/golden/models/* "$src"/tests/golden/quant/* "$src"/tests/golden/dsa/*; do
        name=$(basename "$m")
        "$d/moeserve" logits --backend cuda --model "$m" --tokens 1,5,9,33,2,7,100,3 --out "$out/$name.1.bin" \
            >"$out/$name.1.log" 2>&1 || { rows+=("$name: one GPU failed"); continue; }
        timeout 120 "$d/moeserve" logits --backend cuda --model "$m" --tokens 1,5,9,33,2,7,100,3 \
            --tensor-parallel "$n" --out "$out/$name.n.bin" >"$out/$name.n.log" 2>&1
        rc=$?
        r=$(compare "$out/$name.1.bin" "$out/$name.n.bin")
        rows+=("$name: $n ranks rc $rc, $r $(grep -m1 -o 'error:.*' "$out/$name.n.log" | cut -c1-100)")
    done
    # NCCL's all-reduce over the N GPUs, 256 B .. 16 MiB (issue 29's table; NCCL_P2P_DISABLE=1: the host path)
    for p2p in 0 1; do
        NCCL_P2P_DISABLE=$p2p "$d/moeserve" bench --backend cuda --allreduce --tensor-parallel "$n" \
            >"$out/allreduce_p2p_off$p2p.txt" 2>"$out/allreduce_p2p_off$p2p.err"
        rows+=("allreduce NCCL_P2P_DISABLE=$p2p rc $?: $(awk 'NR > 2 && ($1 == 256 || $1 == 1048576 || $1 == 16777216) {printf "%s B %s us %s GB/s; ", $1, $3, $5}' "$out/allreduce_p2p_off$p2p.txt")")
    done
    q=/tmp/qwen3-30b-nvfp4
    [ -f "$q/config.json" ] || "$d/make_synth_checkpoint" --out "$q" --preset qwen3-30b-a3b --format nvfp4 >/dev/null 2>&1
    for tp in 1 "$n"; do
        "$d/moeserve" bench --backend cuda --model "$q" --batch 1,8,64 --prompt-len 2048 --decode-context 128 \
            --decode 64 --tensor-parallel "$tp" --json >"$out/bench_tp$tp.json" 2>"$out/bench_tp$tp.err"
        rows+=("qwen3 tp $tp: $(python3 -c "
import json
d = json.load(open('$out/bench_tp$tp.json'))
print(' '.join('b%s %.1f' % (x['batch'], x['tok_s']) for x in d['decode']), 'prefill %.0f' % d['prefill']['tok_s'])" 2>&1 | tail -1)")
    done
fi
printf '%s\n' "${rows[@]}"
(cd "$out" && tar -czf /tmp/gpu_ranks.tgz --exclude='*.bin' . && find . -mindepth 1 -delete && mv /tmp/gpu_ranks.tgz .)
