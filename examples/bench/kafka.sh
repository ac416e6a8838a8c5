#!/usr/bin/env bash
# Kafka -> keyed count -> Kafka, measured in one run next to the broker's own limits: N records
# (key i mod 10 000, value i) produced into a 4-partition topic by kcat (librdkafka's CLI) — the
# broker's raw produce rate; read back by kcat with read_committed — its raw consume rate; then
# the job (Kafka source, bounded -> WASM keyed counter -> Kafka sink, exactly-once, checkpoints
# every 1 s) at parallelism 1 and 2, whole-process wall time. N=1000000 by default. Starts its
# own broker (noida-db, as the tests) on a free port; installs kcat from Debian if missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd); N=${N:-1000000}
(cd "$root" && cargo build --release -p weir -q && cargo build --profile guest --target wasm32-unknown-unknown -p wordcount-counter -q)
weir=$root/target/release/weir
command -v kcat >/dev/null || { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q kcat >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q kcat >/dev/null; }; }
venv="$root/target/kafka-broker/venv"; mkdir -p "$root/target/kafka-broker"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import noida_db' 2>/dev/null || "$venv/bin/pip" install -q 'noida-db==0.2.3'
"$venv/bin/python" -c 'import confluent_kafka' 2>/dev/null || "$venv/bin/pip" install -q 'confluent-kafka==2.12.1'
broker=$("$venv/bin/python" -c 'import noida_db,pathlib;print(pathlib.Path(noida_db.__file__).parent/"noida-db")')
work=$(mktemp -d /tmp/weir-kafka-bench.XXXXXX); cd "$work"
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
"$broker" start --data-dir "$work/broker" --host 127.0.0.1 --only kafka --kafka-port "$port" >broker.log 2>&1 &
bpid=$!
trap 'kill $bpid 2>/dev/null; wait $bpid 2>/dev/null; rm -rf "$work"' EXIT
B=127.0.0.1:$port
"$venv/bin/python" - "$B" <<'PY'
import sys, time
from confluent_kafka.admin import AdminClient, NewTopic
a = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0})
for _ in range(100):
    try: a.list_topics(timeout=1); break
    except Exception: time.sleep(0.1)
for f in a.create_topics([NewTopic(t, 4, 1) for t in ["in", "out1", "out2"]]).values(): f.result()
PY
python3 -c "
import sys
w = sys.stdout.write
for i in range($N): w(f'{i%10000}:{i}\n')" > records.txt
rate() { python3 -c "print(f'{$N/($2-$1):,.0f} records/s, {($2-$1):.2f} s')"; }
s0=$(date +%s.%N); kcat -P -b "$B" -t in -K: -X linger.ms=5 -X enable.idempotence=true -l records.txt; s1=$(date +%s.%N)
echo "broker raw produce (kcat, idempotent, one client): $(rate $s0 $s1)"
s0=$(date +%s.%N); got=$(kcat -C -b "$B" -t in -o beginning -e -q -X isolation.level=read_committed | wc -l); s1=$(date +%s.%N)
echo "broker raw consume (kcat, read_committed, one client): $(rate $s0 $s1) ($got records)"
comp=$root/target/wasm32-unknown-unknown/guest/wordcount_counter.wasm
for p in 1 2; do
cat > k$p.toml <<J
[job]
name = "kbench$p"
max_parallelism = 64
[checkpoint]
interval_ms = 1000
dir = "chk"
[restart]
strategy = "none"
[[source]]
id = "in"
type = "kafka"
bootstrap_servers = "$B"
topics = ["in"]
bounded = true
parallelism = $p
[[operator]]
id = "count"
component = "$comp"
parallelism = $p
inputs = [{ from = "in", partition = "hash" }]
[[sink]]
id = "out"
type = "kafka"
bootstrap_servers = "$B"
topic = "out$p"
delivery = "exactly-once"
parallelism = $p
inputs = [{ from = "count" }]
J
  s0=$(date +%s.%N); "$weir" run k$p.toml --progress 0 >/dev/null 2>k$p.log; s1=$(date +%s.%N)
  out=$(kcat -C -b "$B" -t out$p -o beginning -e -q -X isolation.level=read_committed | wc -l)
  echo "p=$p Kafka -> count -> Kafka, exactly-once: $(rate $s0 $s1) ($out records committed)"
done
