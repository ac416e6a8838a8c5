#!/usr/bin/env bash
# End-to-end latency of J1 at parallelism 2 across two worker processes vs in one process
# (docs/benchmarks.md, issue #13): the latency job (examples/bench/latency.toml) at a fixed
# rate per source subtask, its hash edge crossing the workers over HTTP/2 in the cluster run.
# Prints each run's p50/p99/p99.9 as the sink measured them (first second not measured).
#
#   examples/bench/cluster_latency.sh [WEIR] [RATE_PER_SUBTASK] [SECONDS] [ROUNDS]
#
# Needs the wordcount_counter component built (examples/bench/run.sh builds it).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
weir="${1:-$root/target/release/weir}"
rate="${2:-1000000}"
secs="${3:-15}"
rounds="${4:-3}"
tmp="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tmp/secret"
sed -e "s|^count = .*|count = $((rate * secs * 2))|" -e "s|^rate = .*|rate = $rate|" \
    -e "s|^max_parallelism = 128|max_parallelism = 128\nparallelism = 2|" \
    -e "s|\.\./\.\./target|$root/target|" -e "s|^dir = \"checkpoints\"|dir = \"$tmp/chk\"|" \
    "$root/examples/bench/latency.toml" > "$tmp/job.toml"
grep -q "^parallelism = 2" "$tmp/job.toml"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
latency() { grep -o "latency p50 .*" "$1" | head -1; }
one_process() {
    rm -rf "$tmp/chk"
    "$weir" run "$tmp/job.toml" > "$tmp/run.out" 2> "$tmp/run.err"
    echo "one process:       $(latency "$tmp/run.err")"
}
cluster() {
    rm -rf "$tmp/chk"
    local port; port=$(free_port)
    "$weir" coordinator "$tmp/job.toml" --listen "127.0.0.1:$port" --workers 2 --secret-file "$tmp/secret" \
        > "$tmp/coord.out" 2> "$tmp/coord.err" &
    local coord=$!
    for w in w1 w2; do
        "$weir" worker --coordinator "127.0.0.1:$port" --name $w --slots 1 --secret-file "$tmp/secret" \
            --dir "$tmp/$w" > "$tmp/$w.out" 2>&1 &
    done
    wait $coord
    echo "cluster, 2 workers: $(latency "$tmp/coord.err")"
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
}
echo "J1 latency job at parallelism 2, $rate records/s per source subtask, $secs s, $rounds interleaved rounds"
for _ in $(seq "$rounds"); do
    one_process
    cluster
done
