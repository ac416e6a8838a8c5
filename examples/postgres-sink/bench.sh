#!/usr/bin/env bash
# Throughput of the PostgreSQL sink, measured in one run next to its references: the same job
# (generator -> test-oracle operator -> sink, checkpoints every 1 s) into a blackhole sink and
# into a table (CSV values, append, exactly-once), at parallelism 1 and 2, and PostgreSQL's own
# COPY of the same rows from one client (the fastest way in). N=1000000 by default. Needs the
# postgresql package (run.sh installs it); starts its own server on port 54339.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd); port=54339; N=${N:-1000000}
work=$(mktemp -d /tmp/weir-pg-bench.XXXXXX); chmod 755 "$work"; cd "$work"
(cd "$root" && cargo build --release -p weir -q && cargo build --profile guest --target wasm32-unknown-unknown -p test-oracle -q)
weir=$root/target/release/weir
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
data=$(mktemp -d /tmp/weir-pgb.XXXXXX); chmod 755 "$data"
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres: "$data"; as_pg=(runuser -u postgres --); fi
"${as_pg[@]}" "$pgbin/initdb" -D "$data/db" --auth=trust -U postgres -E UTF8 --locale=C >/dev/null
"${as_pg[@]}" "$pgbin/postgres" -D "$data/db" -p $port -k "$data" -c listen_addresses=127.0.0.1 \
  -c max_prepared_transactions=16 >"$data/log" 2>&1 &
trap 'kill -INT $(head -1 $data/db/postmaster.pid) 2>/dev/null; sleep 2; rm -rf $data $work' EXIT
psql=("$pgbin/psql" -h 127.0.0.1 -p $port -U postgres -qAt)
for _ in $(seq 100); do "${psql[@]}" -c "select 1" >/dev/null 2>&1 && break; sleep 0.1; done
comp=$root/target/wasm32-unknown-unknown/guest/test_oracle.wasm
job() { # name p sink
cat > $1.toml <<J
[job]
name = "$1"
max_parallelism = 64
[checkpoint]
interval_ms = 1000
dir = "chk-$1"
[[source]]
id = "gen"
type = "generator"
count = $N
keys = 1000
parallelism = $2
[[operator]]
id = "oracle"
component = "$comp"
parallelism = $2
config = { keys = "1000" }
inputs = [{ from = "gen", partition = "hash" }]
[[sink]]
id = "out"
parallelism = $2
inputs = [{ from = "oracle" }]
$3
J
}
for p in 1 2; do
  for kind in blackhole postgres; do
    t="t_${kind}_$p"
    "${psql[@]}" -c "SET client_min_messages = warning; DROP TABLE IF EXISTS $t; CREATE TABLE $t (k int NOT NULL, seq bigint NOT NULL)"
    if [ $kind = blackhole ]; then s='type = "blackhole"'; else
      s="type = \"postgres\"
url = \"host=127.0.0.1 port=$port user=postgres dbname=postgres\"
table = \"$t\"
format = \"csv\"
delimiter = \" \"
columns = [\"k\", \"seq\"]"; fi
    job $t $p "$s"
    s0=$(date +%s.%N); "$weir" run $t.toml --progress 0 >/dev/null 2>$t.log; s1=$(date +%s.%N)
    rows=$("${psql[@]}" -c "select count(*) from $t")
    echo "p=$p $kind: $(python3 -c "print(f'{$N/($s1-$s0):,.0f} records/s, {($s1-$s0):.2f} s')") rows=$rows"
  done
done
"${psql[@]}" -c "SET client_min_messages = warning; DROP TABLE IF EXISTS c; CREATE TABLE c (k int NOT NULL, seq bigint NOT NULL)"
python3 -c "
import sys
with open('rows.csv','w') as f:
    for i in range($N): f.write(f'{i%1000} {i//1000}\n')"
s0=$(date +%s.%N); "${psql[@]}" -c "\\copy c FROM 'rows.csv' (FORMAT csv, DELIMITER ' ')"; s1=$(date +%s.%N)
echo "COPY (one client, one transaction): $(python3 -c "print(f'{$N/($s1-$s0):,.0f} rows/s, {($s1-$s0):.2f} s')")"
