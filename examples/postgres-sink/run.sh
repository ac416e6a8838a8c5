#!/usr/bin/env bash
# Word count into PostgreSQL, end to end: starts a throwaway PostgreSQL server (Debian's
# package, installed if missing) on 127.0.0.1:54329 in a temporary directory, creates the
# table, runs job.toml with the real `weir` binary, and checks the table against expected/
# (each word's final count, exactly once). Exits non-zero when the table is wrong.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
port=54329

rustup target add wasm32-unknown-unknown >/dev/null
# WEIR_BIN: an already built `weir` (the test suite passes its own).
if [ -z "${WEIR_BIN:-}" ]; then
    (cd "$root" && cargo build --release -p weir)
fi
weir="${WEIR_BIN:-$root/target/release/weir}"
(cd "$root" && cargo build --profile guest --target wasm32-unknown-unknown -p wordcount-tokenizer -p wordcount-counter)

if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends postgresql >/dev/null; }
fi
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

data=$(mktemp -d /tmp/weir-pg-example.XXXXXX)
chmod 755 "$data"
as_pg=()
if [ "$(id -u)" = 0 ]; then
    chown postgres: "$data"
    as_pg=(runuser -u postgres --)
fi
pid=""
cleanup() {
    # Signal the server itself (runuser, its parent when we are root, does not pass it on).
    if [ -n "$pid" ]; then
        kill -INT "$(head -1 "$data/db/postmaster.pid" 2>/dev/null)" 2>/dev/null || kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$data"
}
trap cleanup EXIT

"${as_pg[@]}" "$pgbin/initdb" -D "$data/db" --auth=trust -U postgres -E UTF8 --locale=C >/dev/null
"${as_pg[@]}" "$pgbin/postgres" -D "$data/db" -p "$port" -k "$data" -c listen_addresses=127.0.0.1 \
    -c max_prepared_transactions=8 >"$data/server.log" 2>&1 &
pid=$!
psql=("$pgbin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt)
for _ in $(seq 1 200); do "${psql[@]}" -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.1; done
"${psql[@]}" -c "SELECT 1" >/dev/null || { cat "$data/server.log" >&2; echo "PostgreSQL did not start on port $port" >&2; exit 1; }
"${psql[@]}" -c "CREATE TABLE word_counts (word text PRIMARY KEY, n bigint NOT NULL)"

rm -rf checkpoints out
"$weir" run job.toml --progress 0

mkdir -p out
"${psql[@]}" -c "SELECT word || ' ' || n FROM word_counts" | LC_ALL=C sort >out/word_counts.txt
if LC_ALL=C sort expected/word_counts.txt | cmp -s - out/word_counts.txt; then
    echo "postgres-sink: the table holds each word's final count ($(wc -l <out/word_counts.txt) words)"
else
    echo "postgres-sink: FAILED: the table differs from expected/word_counts.txt:" >&2
    LC_ALL=C sort expected/word_counts.txt | diff - out/word_counts.txt | head -20 >&2
    exit 1
fi
