#!/usr/bin/env bash
# Runs Weir's whole test suite on a fresh machine: installs the WebAssembly target, checks
# formatting and lints, then runs every test (the tests build the guest components they use;
# C, JavaScript and Python guests install their toolchains with apt-get / npm / pip on first use;
# servers (PostgreSQL, etcd, Chromium) are installed with apt-get on first use too).
set -euo pipefail
cd "$(dirname "$0")/.."

rustup target add wasm32-unknown-unknown wasm32-wasip2 >/dev/null
bash tests/install-build-deps.sh   # protoc, for the etcd client's build
rustup component add rustfmt clippy >/dev/null 2>&1 || true
export RUST_BACKTRACE=0

cargo fmt --all --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release -p weir -p weir-guest
