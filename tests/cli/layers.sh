#!/usr/bin/env bash
# Every include in src/ points down the layers of ../shared/DESIGN.md: cli > server > engine > model
# > backend > plan > format, template > base (format and template beside each other: neither
# includes the other). A file may include its own layer. main.c may include anything.
# Usage: layers.sh MOESERVE SRC_DIR WORK_DIR
set -u
src=$2
rank() {
    case $1 in
    cli) echo 8 ;; server) echo 7 ;; engine) echo 6 ;; model) echo 5 ;; backend) echo 4 ;; plan) echo 3 ;;
    format | template) echo 2 ;; base) echo 1 ;; *) echo 0 ;;
    esac
}
pass=0 fail=0
bad=$(cd "$src" && grep -rnE '^#include "[a-z_]+/' src --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' |
    grep -v '^src/main\.c:' | while IFS= read -r line; do
        file=${line%%:*}
        from=$(echo "$file" | cut -d/ -f2)
        to=$(echo "$line" | sed -E 's/.*#include "([a-z_]+)\/.*/\1/')
        rf=$(rank "$from") rt=$(rank "$to")
        if [ "$from" != "$to" ] && { [ "$rt" -ge "$rf" ] || [ "$rt" = 0 ]; }; then echo "$line"; fi
    done)
if [ -z "$bad" ]; then
    echo "ok   every include in src/ points down the layers"
    pass=$((pass + 1))
else
    echo "FAIL includes that point up or sideways:"
    echo "$bad"
    fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
