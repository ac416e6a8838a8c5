#!/usr/bin/env bash
# Builds a Python operator module into a Weir component:
#   bash guest-sdk/python/build.sh path/to/app.py OUT.wasm
# Installs the pinned componentize-py (PyPI) into guest-sdk/python/.venv on first use. The
# component imports only Weir's interfaces: `--stub-wasi` replaces every WASI import with a trap.
set -euo pipefail
sdk="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$sdk/../.." && pwd)"
app_dir="$(cd "$(dirname "$1")" && pwd)"
module="$(basename "$1" .py)"
out="$2"
if [ ! -x "$sdk/.venv/bin/componentize-py" ]; then
    python3 -m venv "$sdk/.venv"
    "$sdk/.venv/bin/pip" install --quiet --disable-pip-version-check componentize-py==0.25.1
fi
mkdir -p "$(dirname "$out")"
"$sdk/.venv/bin/componentize-py" -d "$root/wit" -w operator componentize "$module" \
    -p "$app_dir" -p "$sdk/src" --stub-wasi -o "$out" >/dev/null
