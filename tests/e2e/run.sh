#!/usr/bin/env bash
# Runs the e2e tests (node's test runner + the official openai client) against a freshly built server.
# Usage: run.sh MOESERVE SRC_DIR. Exit 77 (ctest: skipped) without node 20+ or the npm packages.
set -u
bin=$1 src=$2
command -v node >/dev/null || { echo "node not found: skipped"; exit 77; }
[ -d "$src/tests/npm/node_modules/openai" ] || { echo "tests/npm/node_modules/openai missing (make npm-deps): skipped"; exit 77; }
export MOESERVE_BIN=$bin MOESERVE_SRC=$src
exec node --test --test-concurrency=1 "$src"/tests/e2e/*.test.mjs
