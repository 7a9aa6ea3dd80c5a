#!/usr/bin/env bash
# Runs the e2e tests (node's test runner + the official openai client) against a freshly built server.
# Usage: run.sh MOESERVE SRC_DIR [TEST_FILE...] (default: every tests/e2e/*.test.mjs). Exit 77
# (ctest: skipped) without node 20+ or the npm packages. MOESERVE_E2E_RANKS=N runs the server as N
# CPU ranks under mpirun (helpers.mjs).
set -u
bin=$1 src=$2
command -v node >/dev/null || { echo "node not found: skipped"; exit 77; }
[ -d "$src/tests/npm/node_modules/openai" ] || { echo "tests/npm/node_modules/openai missing (make npm-deps): skipped"; exit 77; }
export MOESERVE_BIN=$bin MOESERVE_SRC=$src
shift 2
if [ $# -gt 0 ]; then
    exec node --test --test-concurrency=1 "${@/#/$src/tests/e2e/}"
fi
exec node --test --test-concurrency=1 "$src"/tests/e2e/*.test.mjs
