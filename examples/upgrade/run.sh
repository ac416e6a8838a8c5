#!/usr/bin/env bash
# The upgrade story, end to end, with the real `weir` binary and its control API:
#   1. run the job with counter v1 (parallelism 2) and take a savepoint while it runs;
#   2. live-upgrade the counter to v2 (its state changes layout; v2 migrates it) — the job
#      keeps running, the other operators never stop;
#   3. try a live upgrade to v3, which cannot read schema-2 state: refused, job untouched;
#   4. stop the job with a savepoint (output committed up to it), move the savepoint away;
#   5. try to restore the moved savepoint into v3: refused before the job starts;
#   6. restore it into v2 at parallelism 3 and run to the end;
#   7. check the committed output against expected/ (exactly once across all of it).
# Works on a fresh machine with rustup (installs the WebAssembly target itself).
set -euo pipefail
cd "$(dirname "$0")"
here=$PWD
root=$(cd ../.. && pwd)

rustup target add wasm32-unknown-unknown >/dev/null
# WEIR_BIN: an already built `weir` (the test suite passes its own).
if [ -z "${WEIR_BIN:-}" ]; then
    (cd "$root" && cargo build --release -p weir)
fi
weir="${WEIR_BIN:-$root/target/release/weir}"
(cd "$root" && cargo build --profile guest --target wasm32-unknown-unknown \
    -p wordcount-tokenizer -p wordcount-counter -p wordcount-counter-v2 -p wordcount-counter-v3)
guest="$root/target/wasm32-unknown-unknown/guest"

export WEIR_HOME
WEIR_HOME=$(mktemp -d)
rm -rf out checkpoints savepoints moved
log=$(mktemp)
pid=""
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    rm -rf "$WEIR_HOME"
}
trap cleanup EXIT
fail() { echo "upgrade demo: FAILED: $*" >&2; echo "--- job log:" >&2; cat "$log" >&2; exit 1; }
step() { echo; echo "== $*"; }

wait_running() {
    for _ in $(seq 1 200); do
        "$weir" list 2>/dev/null | grep -q "^upgrade-demo .*RUNNING" && return 0
        sleep 0.05
    done
    fail "the job did not come up"
}

step "1. run with counter v1 (parallelism 2); savepoint while running"
"$weir" run job-v1.toml --progress 0 >"$log" 2>&1 &
pid=$!
wait_running
sleep 1
"$weir" savepoint upgrade-demo --dir savepoints/while-running
"$weir" checkpoints inspect savepoints/while-running | head -20
"$weir" list

step "2. live upgrade of operator count: v1 -> v2 (migrates schema 1 -> 2)"
"$weir" upgrade upgrade-demo --operator count --component "$guest/wordcount_counter_v2.wasm"
"$weir" list | grep -q "count=wordcount-counter 2.0.0 (schema 2)" || fail "the job does not report counter 2.0.0"

step "3. live upgrade to v3 (schema 3, migrates only from 1): must be refused"
if "$weir" upgrade upgrade-demo --operator count --component "$guest/wordcount_counter_v3.wasm" 2>v3.err; then
    fail "the v3 upgrade was accepted"
fi
cat v3.err
grep -q "holds state schema 2 written by \`wordcount-counter 2.0.0\`; \`wordcount-counter 3.0.0\` writes schema 3 and migrates only from \[1\]" v3.err \
    || fail "unexpected refusal message"
rm v3.err
"$weir" list | grep -q "count=wordcount-counter 2.0.0 (schema 2)" || fail "the refused upgrade changed the job"

step "4. stop with a savepoint; move the savepoint directory"
sleep 0.5
"$weir" stop upgrade-demo --savepoint savepoints/stop
wait "$pid" || fail "the stopped job exited with an error"
pid=""
grep -q "stopped with savepoint" "$log" || fail "the job did not report its stop"
mkdir -p moved && mv savepoints/stop moved/stop
committed_before=$(cat out/part-* | wc -l)
echo "committed before the restore: $committed_before lines"

step "5. restore into v3: must be refused before the job starts"
if "$weir" run job-v3.toml --from-savepoint moved/stop --progress 0 >"$log" 2>&1; then
    fail "restoring into v3 was accepted"
fi
grep "refused to start" "$log"
[ "$(cat out/part-* | wc -l)" = "$committed_before" ] || fail "the refused run changed the output"

step "6. restore into v2 at parallelism 3 (operators and sink rescaled 2 -> 3) and run to the end"
"$weir" run job-v2.toml --from-savepoint moved/stop --progress 0 >"$log" 2>&1 || fail "the restored run failed"
grep -E "restoring|finished" "$log"

step "7. check the output"
if diff <(cat out/part-* | LC_ALL=C sort) <(LC_ALL=C sort expected/counts.txt) >/dev/null; then
    echo "upgrade demo: out/ equals expected/ ($(cat out/part-* | wc -l) lines): no record lost or counted twice"
else
    fail "out/ differs from expected/"
fi
