#!/usr/bin/env bash
# Runs the e2e tests (node's test runner + the official openai client) against a freshly built server.
# Usage: run.sh MOESERVE SRC_DIR [TEST_FILE...] (default: every tests/e2e/*.test.mjs; the *.check.mjs
# files need more tools and run only when named). Exit 77 (ctest: skipped) without node 20+, the npm
# packages or the tools a named test needs (chromium, promtool). MOESERVE_E2E_RANKS=N runs the server as N
# CPU ranks under mpirun (helpers.mjs).
set -u
bin=$1 src=$2
command -v node >/dev/null || { echo "node not found: skipped"; exit 77; }
[ -d "$src/tests/npm/node_modules/openai" ] || { echo "tests/npm/node_modules/openai missing (make npm-deps): skipped"; exit 77; }
# what the tests named on the command line need besides node and the openai client
for f in "${@:3}"; do
    case $f in
    chat_page.check.mjs)
        command -v "${MOESERVE_CHROMIUM:-/usr/bin/chromium}" >/dev/null || { echo "chromium not found (apt-get install chromium): skipped"; exit 77; }
        [ -d "$src/tests/npm/node_modules/playwright-core" ] || { echo "tests/npm/node_modules/playwright-core missing (make npm-deps): skipped"; exit 77; } ;;
    promtool.check.mjs)
        command -v "${MOESERVE_PROMTOOL:-promtool}" >/dev/null || { echo "promtool not found (apt-get install prometheus): skipped"; exit 77; } ;;
    esac
done
export MOESERVE_BIN=$bin MOESERVE_SRC=$src
shift 2
if [ $# -gt 0 ]; then
    exec node --test --test-concurrency=1 "${@/#/$src/tests/e2e/}"
fi
exec node --test --test-concurrency=1 "$src"/tests/e2e/*.test.mjs
