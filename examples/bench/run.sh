#!/usr/bin/env bash
# The reference benchmarks (docs/benchmarks.md): builds the host and the benchmark
# components, then runs `weir bench` (J1 keyed count, J3 large state, end-to-end latency),
# each configuration in its own process, and prints the tables. Takes ~8 minutes with the
# default 3 rounds; pass arguments through, e.g. `bash examples/bench/run.sh j3 --runs 1`.
set -euo pipefail
cd "$(dirname "$0")/../.."

rustup target add wasm32-unknown-unknown >/dev/null
cargo build --release -p weir
cargo build --profile guest --target wasm32-unknown-unknown -p wordcount-counter -p bench-kv-store

if [ "$#" -eq 0 ]; then
    set -- all
fi
exec target/release/weir bench "$@"
