#!/usr/bin/env bash
# gpu_grammar_cost.sh — on the GPU machine: the constrained-decoding cost on its host CPU (the
# scheduler computes a step's grammar masks there, over OpenMP threads, beside the device's pass):
# tools/bench_grammar on the Qwen3 vocabulary at 1, 4 and 16 threads. The pack NEW must hold
# bench_grammar; carry [".carry/ab", ".carry/lib", ".carry/tok"].
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/gpu_grammar_cost}
mkdir -p "$out"
export LD_LIBRARY_PATH="$src/.carry/lib:${LD_LIBRARY_PATH:-}"
d=/tmp/abx-${NEW:-new}
[ -x "$d/bench_grammar" ] || { mkdir -p "$d" && tar -xJf "$src/.carry/ab/${NEW:-new}.tar.xz" -C "$d"; }
{ nproc; lscpu | grep 'Model name'; } | tee "$out/cpu.txt"
for t in ${THREADS:-1 4 16}; do
    echo "== OMP_NUM_THREADS=$t"
    OMP_NUM_THREADS=$t timeout 60 "$d/bench_grammar" "$src/.carry/tok/tokenizer.json" "${ROUNDS:-3}" 2>&1 | tail -${TAIL_LINES:-14}
done | tee "$out/bench_grammar.txt"
