#!/usr/bin/env bash
# Kafka -> word count -> PostgreSQL, end to end: starts a throwaway Kafka-protocol broker
# (noida-db from PyPI, installed into ../../target/kafka-broker) on 127.0.0.1:19092 and a
# throwaway PostgreSQL (Debian's package, installed if missing) on 127.0.0.1:54331, both in
# temporary directories; creates the topic and the table, loads the topic with load.toml, runs
# job.toml with the real `weir` binary, and checks the table against expected/ (each word's
# final count, exactly once). Exits non-zero when the table is wrong.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
pg_port=54331
kafka_port=19092

rustup target add wasm32-unknown-unknown >/dev/null
# WEIR_BIN: an already built `weir` (the test suite passes its own).
if [ -z "${WEIR_BIN:-}" ]; then
    (cd "$root" && cargo build --release -p weir)
fi
weir="${WEIR_BIN:-$root/target/release/weir}"
(cd "$root" && cargo build --profile guest --target wasm32-unknown-unknown -p wordcount-tokenizer -p wordcount-counter)

# The broker, and confluent-kafka (librdkafka for Python) to create the topic.
venv="$root/target/kafka-broker/venv"
mkdir -p "$root/target/kafka-broker"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import noida_db' 2>/dev/null || "$venv/bin/pip" install -q 'noida-db==0.2.3'
"$venv/bin/python" -c 'import confluent_kafka' 2>/dev/null || "$venv/bin/pip" install -q 'confluent-kafka==2.12.1'
broker=$("$venv/bin/python" -c 'import noida_db,pathlib;print(pathlib.Path(noida_db.__file__).parent/"noida-db")')

if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends postgresql >/dev/null; }
fi
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

data=$(mktemp -d /tmp/weir-kafka-example.XXXXXX)
chmod 755 "$data"
as_pg=()
if [ "$(id -u)" = 0 ]; then
    mkdir "$data/pg" && chown postgres: "$data/pg"
    as_pg=(runuser -u postgres --)
else
    mkdir "$data/pg"
fi
pg_pid="" kafka_pid=""
cleanup() {
    if [ -n "$kafka_pid" ]; then kill "$kafka_pid" 2>/dev/null || true; wait "$kafka_pid" 2>/dev/null || true; fi
    # Signal the server itself (runuser, its parent when we are root, does not pass it on).
    if [ -n "$pg_pid" ]; then
        kill -INT "$(head -1 "$data/pg/db/postmaster.pid" 2>/dev/null)" 2>/dev/null || kill "$pg_pid" 2>/dev/null || true
        wait "$pg_pid" 2>/dev/null || true
    fi
    rm -rf "$data"
}
trap cleanup EXIT

"$broker" start --data-dir "$data/kafka" --host 127.0.0.1 --only kafka --kafka-port "$kafka_port" \
    >"$data/kafka.log" 2>&1 &
kafka_pid=$!

"${as_pg[@]}" "$pgbin/initdb" -D "$data/pg/db" --auth=trust -U postgres -E UTF8 --locale=C >/dev/null
"${as_pg[@]}" "$pgbin/postgres" -D "$data/pg/db" -p "$pg_port" -k "$data/pg" -c listen_addresses=127.0.0.1 \
    -c max_prepared_transactions=8 >"$data/pg.log" 2>&1 &
pg_pid=$!
psql=("$pgbin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt)
for _ in $(seq 1 200); do "${psql[@]}" -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.1; done
"${psql[@]}" -c "SELECT 1" >/dev/null || { cat "$data/pg.log" >&2; echo "PostgreSQL did not start on port $pg_port" >&2; exit 1; }
"${psql[@]}" -c "CREATE TABLE word_counts (word text PRIMARY KEY, n bigint NOT NULL)"

"$venv/bin/python" - "$kafka_port" <<'PY'
import sys, time
from confluent_kafka.admin import AdminClient, NewTopic
admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{sys.argv[1]}", "log_level": 0})
for attempt in range(100):
    try:
        admin.list_topics(timeout=1)
        break
    except Exception:
        time.sleep(0.1)
for f in admin.create_topics([NewTopic("lines", 4, 1)]).values():
    f.result()
PY

rm -rf checkpoints out
"$weir" run load.toml --progress 0
"$weir" run job.toml --progress 0

mkdir -p out
"${psql[@]}" -c "SELECT word || ' ' || n FROM word_counts" | LC_ALL=C sort >out/word_counts.txt
if LC_ALL=C sort expected/word_counts.txt | cmp -s - out/word_counts.txt; then
    echo "kafka-to-postgres: the table holds each word's final count ($(wc -l <out/word_counts.txt) words)"
else
    echo "kafka-to-postgres: FAILED: the table differs from expected/word_counts.txt:" >&2
    LC_ALL=C sort expected/word_counts.txt | diff - out/word_counts.txt | head -20 >&2
    exit 1
fi
