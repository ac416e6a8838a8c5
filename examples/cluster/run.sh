#!/usr/bin/env bash
# The wordcount job over a cluster on this machine: a coordinator and two workers (one slot
# each, so the job's two slices run in different processes and the hash edge goes over the
# network), all on loopback with a fresh cluster secret. Checks out/ against expected/ and
# exits non-zero when it differs.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)

rustup target add wasm32-unknown-unknown >/dev/null
# WEIR_BIN: an already built `weir` (the test suite passes its own).
if [ -z "${WEIR_BIN:-}" ]; then
    (cd "$root" && cargo build --release -p weir)
fi
weir="${WEIR_BIN:-$root/target/release/weir}"
(cd "$root" && cargo build --profile guest --target wasm32-unknown-unknown -p wordcount-tokenizer -p wordcount-counter)

tmp=$(mktemp -d /tmp/weir-cluster-example.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tmp/secret"
export WEIR_HOME="$tmp/home"
rm -rf out checkpoints

# The coordinator prints `listening on ADDR` first; the workers connect there.
mkfifo "$tmp/addr"
"$weir" coordinator job.toml --listen 127.0.0.1:0 --workers 2 --secret-file "$tmp/secret" > "$tmp/addr" &
coordinator=$!
read -r _ _ addr < "$tmp/addr"
cat "$tmp/addr" > /dev/null &
for w in w1 w2; do
    "$weir" worker --coordinator "$addr" --name "$w" --slots 1 --secret-file "$tmp/secret" --dir "$tmp/$w" 2> "$tmp/$w.log" &
    pids+=($!)
done
wait "$coordinator"

if diff <(cat out/part-* | LC_ALL=C sort) <(LC_ALL=C sort expected/*) >/dev/null; then
    echo "cluster: out/ equals expected/ ($(cat out/part-* | wc -l) lines, over workers w1 and w2)"
else
    echo "cluster: out/ differs from expected/" >&2
    exit 1
fi
