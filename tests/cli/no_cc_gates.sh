#!/usr/bin/env bash
# No compute-capability comparisons in src/ outside plan/caps_table.c
# (STYLE.md rule 13, DESIGN.md decision 4): kernels and host code read the
# features and tiles of the plan, never the cc. Greps src/**/*.{c,h,cu,cuh}
# for comparisons of a major/minor/cc/sm-version value, first proving on
# sample lines that the patterns catch what they must and spare what they must.
# Compile-time target guards (__CUDA_ARCH__, __CUDA_ARCH_FEAT_SM*) are not
# runtime decisions and are not flagged: the fatbin needs them (decision 5).
# Usage: no_cc_gates.sh MOESERVE SRC_DIR WORK_DIR
set -u
src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
pass=0 fail=0

# a major/minor/cc value compared (either side), or a cc-like number compared
cmp='(==|!=|<=|>=|<|>)'
id='[A-Za-z_][A-Za-z0-9_]*'
pat_lhs="(major|minor)[A-Za-z0-9_]*[[:space:]]*\)?[[:space:]]*$cmp"
pat_rhs="([^-]|^)$cmp[[:space:]]*\(?[[:space:]]*($id(\.|->))*($id)?(major|minor)"
pat_num="\b(cc|sm|sm_version|arch|compute_capability|capability|ccver|cc_ver)[[:space:]]*$cmp[[:space:]]*[0-9]"
pat_attr='cudaDevAttrComputeCapability(Major|Minor)'

scan() { grep -nE -e "$pat_lhs" -e "$pat_rhs" -e "$pat_num" -e "$pat_attr" "$@"; }

# the patterns themselves
cat >"$work/must_flag.c" <<'EOF'
if (prop.major >= 9) use_wgmma();
if (caps->cc_major == 12 && caps->cc_minor == 0) tile = 64;
if (9 <= prop.major) x();
bool hopper = cc >= 90;
if (dev.minor != 0) y();
return (major < 8) ? 1 : 0;
cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0);
if (sm_version > 89) z();
EOF
cat >"$work/must_pass.c" <<'EOF'
caps->cc_major = prop.major;
caps->cc_minor = prop.minor;
snprintf(buf, n, "%d.%d", c->cc_major, c->cc_minor);
if (caps->wgmma && smem <= caps->smem_per_block_optin) pick();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
const char *major_version_name(void);
EOF
n=$(scan "$work/must_flag.c" | wc -l)
if [ "$n" -eq 8 ]; then
    echo "ok   patterns flag all 8 sample gates"
    pass=$((pass + 1))
else
    echo "FAIL patterns flag $n of 8 sample gates:"
    scan "$work/must_flag.c"
    fail=$((fail + 1))
fi
if scan "$work/must_pass.c" >"$work/false_hits"; then
    echo "FAIL patterns flag innocent lines:"
    cat "$work/false_hits"
    fail=$((fail + 1))
else
    echo "ok   patterns spare innocent lines"
    pass=$((pass + 1))
fi

# the tree
mapfile -t files < <(find "$src/src" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
    ! -path "*/src/plan/caps_table.c" | sort)
if [ "${#files[@]}" -eq 0 ]; then
    echo "FAIL no sources under $src/src"
    fail=$((fail + 1))
elif scan "${files[@]}" >"$work/hits"; then
    echo "FAIL compute-capability comparisons outside src/plan/caps_table.c (read the plan's features instead):"
    sed "s|^$src/||" "$work/hits"
    fail=$((fail + 1))
else
    echo "ok   ${#files[@]} source files, no cc comparisons outside src/plan/caps_table.c"
    pass=$((pass + 1))
fi
if [ -f "$src/src/plan/caps_table.c" ] && scan "$src/src/plan/caps_table.c" >/dev/null; then
    echo "ok   caps_table.c holds the comparisons (the scan sees them there)"
    pass=$((pass + 1))
else
    echo "FAIL caps_table.c: missing, or the scan cannot see its comparisons"
    fail=$((fail + 1))
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
