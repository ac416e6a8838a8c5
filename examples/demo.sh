#!/usr/bin/env bash
# The Weir demo: builds the host and the wordcount components, runs the wordcount job, and
# checks its committed output against examples/wordcount/expected/.
# Works on a fresh machine with rustup: it installs the WebAssembly target itself.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup target add wasm32-unknown-unknown >/dev/null
bash tests/install-build-deps.sh   # protoc, for the etcd client's build
cargo build --release -p weir
cargo build --profile guest --target wasm32-unknown-unknown -p wordcount-tokenizer -p wordcount-counter -p enrich-enricher -p iterate-split -p iterate-components

target/release/weir run examples/wordcount/job.toml

if diff <(cat examples/wordcount/out/part-* | LC_ALL=C sort) <(LC_ALL=C sort examples/wordcount/expected/*) >/dev/null; then
    echo "demo: examples/wordcount/out/ equals examples/wordcount/expected/ ($(cat examples/wordcount/out/part-* | wc -l) lines)"
else
    echo "demo: examples/wordcount/out/ differs from expected/" >&2
    exit 1
fi
