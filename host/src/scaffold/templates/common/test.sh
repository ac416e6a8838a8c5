#!/usr/bin/env bash
# Builds the operator, runs job.toml on input.txt and checks that out/ holds the lines of
# expected/ (in any order). `WEIR=/path/to/weir bash test.sh` uses another weir binary.
set -euo pipefail
cd "$(dirname "$0")"
weir="${WEIR:-weir}"
"$weir" build
rm -rf out checkpoints
"$weir" run job.toml --progress 0 --quiet-guests
if diff <(cat expected/* | sort) <(find out -type f ! -name '.*' -exec cat {} + | sort); then
    echo "ok: out/ matches expected/"
else
    echo "FAILED: out/ differs from expected/ (< expected, > out)" >&2
    exit 1
fi
