#!/usr/bin/env bash
# Every environment read of src/ lives in src/base/options.c (and main.c's MOESERVE_LOG, read
# before anything runs): DESIGN.md decision 4. A getenv (or secure_getenv / environ walk) in
# any other file of src/ fails this test with the file and line. The pattern is proven on
# sample lines first.
# Usage: env_in_one_file.sh MOESERVE SRC_DIR WORK_DIR
set -u
src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
pass=0 fail=0
pat='\b(secure_)?getenv[[:space:]]*\(|\benviron\b'
printf '%s\n' 'const char *s = getenv("X");' 'v = secure_getenv ("Y");' 'for (char **e = environ; *e; e++)' >"$work/flag.c"
printf '%s\n' '/* see options.h */' 'int my_getenvironment_count;' 'options_read(&o, &err);' >"$work/spare.c"
if [ "$(grep -cE "$pat" "$work/flag.c")" = 3 ]; then echo "ok   pattern catches getenv, secure_getenv, environ"; pass=$((pass + 1)); else echo "FAIL pattern misses a sample"; fail=$((fail + 1)); fi
if ! grep -qE "$pat" "$work/spare.c"; then echo "ok   pattern spares other names"; pass=$((pass + 1)); else echo "FAIL pattern flags $(grep -E "$pat" "$work/spare.c")"; fail=$((fail + 1)); fi
hits=$(cd "$src" && grep -rnE "$pat" src --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' |
    grep -vE '^src/base/options\.c:|^src/main\.c:' | grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/?\*|//)')
if [ -z "$hits" ]; then
    echo "ok   no environment read outside src/base/options.c and src/main.c"
    pass=$((pass + 1))
else
    echo "FAIL environment read outside src/base/options.c:"
    echo "$hits"
    fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
