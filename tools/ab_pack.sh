#!/usr/bin/env bash
# ab_pack.sh — here (the build machine): builds of several commits for one A/B device call, where
# the difference cannot be switched by an environment variable (a kernel's code, its launch
# bounds). Each NAME=REF is checked out in a worktree /tmp/ab-NAME, built for one architecture
# (GENCODE, default sm_90a: the H200) and its binaries packed into .carry/ab/NAME.tar.xz;
# .carry/ab/index.txt lists name and commit. tools/ab_run.sh runs them on the GPU machine.
#
#   tools/ab_pack.sh main=HEAD xfrag=beb923e ks3=40103b6
#
# Carry [".carry/ab", ".carry/lib", ".carry/bin"] (64 MiB in all with the tree: ~4.7 MB a build at xz -9e; -3 gave ~14 MB and three builds passed the limit).
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
gencode=${GENCODE:--gencode=arch=compute_90a,code=sm_90a}
mkdir -p "$src/.carry/ab"
for arg in "$@"; do
    name=${arg%%=*}
    ref=${arg#*=}
    [ "$name" != "$arg" ] && [ -n "$name" ] || { echo "ab_pack: want NAME=REF, got '$arg'" >&2; exit 2; }
    wt=/tmp/ab-$name
    git -C "$src" worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
    git -C "$src" worktree prune
    git -C "$src" worktree add --detach "$wt" "$ref" >/dev/null
    cmake -S "$wt" -B "$wt/build" -DCMAKE_BUILD_TYPE=Release -DMOESERVE_CUDA_GENCODE="$gencode" >"$wt/cmake.log" 2>&1 ||
        { echo "ab_pack: cmake failed for $name (see $wt/cmake.log)" >&2; exit 1; }
    ops=$(cd "$wt/tests/unit" && ls test_ops*_cuda.c | sed 's/\.c$//' | tr '\n' ' ')
    cmake --build "$wt/build" -j2 --target moeserve make_synth_checkpoint $ops test_golden_cuda \
        >"$wt/build.log" 2>&1 || { echo "ab_pack: build failed for $name (see $wt/build.log)" >&2; exit 1; }
    (cd "$wt/build" && tar -cf - moeserve make_synth_checkpoint $(for t in $ops; do echo "tests/$t"; done) \
        tests/test_golden_cuda) |
        xz -9e -T2 >"$src/.carry/ab/$name.tar.xz"
    sed -i "/^$name /d" "$src/.carry/ab/index.txt" 2>/dev/null || true
    echo "$name $(git -C "$wt" rev-parse --short HEAD) $(git -C "$wt" log -1 --format=%s | cut -c1-80)" \
        >>"$src/.carry/ab/index.txt"
    echo "ab_pack: $name ($ref) -> .carry/ab/$name.tar.xz ($(du -h "$src/.carry/ab/$name.tar.xz" | cut -f1))"
done
