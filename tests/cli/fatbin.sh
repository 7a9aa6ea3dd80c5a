#!/usr/bin/env bash
# A CUDA build must carry code for every GPU family we serve (DESIGN.md decision 5):
# sm_80, sm_90a, sm_100a, sm_120a. With cuobjdump (the GPU machine) the cubins are listed;
# without it (CI) the architecture list nvcc recorded in the binary is read
# (src/backend/cuda/common/cuda_build_info.cu). Skipped in a CPU-only build.
# Usage: fatbin.sh MOESERVE SRC_DIR WORK_DIR
set -u
bin=$1
pass=0 fail=0
cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null || true)
if [ -n "$cuobjdump" ]; then
    elfs=$("$cuobjdump" --list-elf "$bin" 2>/dev/null)
    for arch in sm_80 sm_90a sm_100a sm_120a; do
        if grep -q "\.$arch\.cubin" <<<"$elfs"; then echo "ok   cubin $arch"; pass=$((pass + 1)); else echo "FAIL no $arch cubin"; fail=$((fail + 1)); fi
    done
else
    list=$(grep -ao 'moeserve-cuda-archs: [0-9,]*' "$bin" | head -n 1)
    if [ -z "$list" ]; then echo "skip: $bin has no CUDA code (CPU-only build)"; echo "0 passed, 0 failed"; exit 0; fi
    for arch in 800 900 1000 1200; do
        if grep -qE "[ ,]$arch(,|$)" <<<"$list"; then echo "ok   arch $arch in \"$list\""; pass=$((pass + 1)); else echo "FAIL arch $arch missing: $list"; fail=$((fail + 1)); fi
    done
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
