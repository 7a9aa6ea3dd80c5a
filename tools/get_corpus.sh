#!/usr/bin/env bash
# The training corpus of models/moeserve-tiny: the King James Bible (public domain) from
# Debian's bible-kjv package. Usage: tools/get_corpus.sh OUT_FILE
set -euo pipefail
command -v bible >/dev/null || apt-get install -y -qq bible-kjv >/dev/null
bible gen1:1-rev22:21 >"$1"
echo "wrote $1: $(wc -c <"$1") bytes"
