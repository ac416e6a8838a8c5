#!/usr/bin/env bash
# Builds a JavaScript operator into a Weir component:
#   bash guest-sdk/js/build.sh OPERATOR.js OUT.wasm [MODULE_ROOT]
# Imports resolve inside MODULE_ROOT (default: this Weir checkout); `weir build` stages a
# project's .js files and weir.js into one directory and passes it.
# Installs the pinned componentizer (componentize-qjs, QuickJS) on first use. The component
# imports only Weir's interfaces: `--stub-wasi` replaces every WASI import with a trap.
set -euo pipefail
sdk="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$sdk/../.." && pwd)"
src="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
out="$2"
module_root="$(cd "${3:-$root}" && pwd)"
if [ ! -x "$sdk/node_modules/.bin/componentize-qjs" ]; then
    (cd "$sdk" && npm ci --no-audit --no-fund --loglevel=error)
fi
mkdir -p "$(dirname "$out")"
"$sdk/node_modules/.bin/componentize-qjs" --wit "$root/wit" --js "$src" --module-root "$module_root" \
    -n queryable-operator --sync --stub-wasi -o "$out" >/dev/null
