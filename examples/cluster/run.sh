#!/usr/bin/env bash
# The wordcount job over a highly-available cluster on this machine, with failures: starts etcd
# (Debian's etcd-server) and an S3-protocol server (moto, in a virtualenv), two coordinators of
# one cluster (a leader and a standby) and three one-slot workers that find the leader in etcd,
# all on loopback with a fresh cluster secret. Once a checkpoint is complete it kills a worker with SIGKILL (and starts a
# replacement); once the restarted job's next checkpoint is recorded in etcd it kills the leader
# with SIGKILL, so the standby takes the job over. Checks out/ against expected/ and exits
# non-zero when it differs or when the job ended before both kills.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)

rustup target add wasm32-unknown-unknown >/dev/null
# WEIR_BIN: an already built `weir` (the test suite passes its own).
if [ -z "${WEIR_BIN:-}" ]; then
    (cd "$root" && bash tests/install-build-deps.sh && cargo build --release -p weir)
fi
weir="${WEIR_BIN:-$root/target/release/weir}"
(cd "$root" && cargo build --profile guest --target wasm32-unknown-unknown -p wordcount-tokenizer -p wordcount-counter)

# The servers: etcd from Debian, moto (an S3-protocol server) in a virtualenv kept under target/.
command -v etcd >/dev/null || { export DEBIAN_FRONTEND=noninteractive;
    apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends etcd-server >/dev/null; }; }
# Installed under a lock: the test suite's S3 helper (tests/all/s3.rs) installs the same one.
venv="$root/target/tmp/moto-5.2.5"
mkdir -p "$root/target/tmp"
flock "$venv.lock" bash -c '
    v=$1
    [ -f "$v/installed" ] && exit 0
    python3 -m venv "$v" &&
    "$v/bin/pip" install --quiet --disable-pip-version-check "moto[s3]==5.2.5" flask flask-cors &&
    touch "$v/installed"' _ "$venv"

tmp=$(mktemp -d /tmp/weir-cluster-example.XXXXXX)
pids=()
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    if [ "$rc" != 0 ]; then
        for f in "$tmp"/c1.log "$tmp"/c2.log "$tmp"/w*.log; do
            [ -f "$f" ] && { echo "--- ${f##*/} (last lines)"; tail -n 15 "$f"; } >&2
        done
    fi
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Waits up to 120 s for `cmd` to succeed.
await() {
    local what=$1; shift
    for _ in $(seq 1 12000); do
        if "$@"; then return 0; fi
        sleep 0.01
    done
    echo "cluster: no $what within 120 s" >&2
    exit 1
}
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tmp/secret"
export WEIR_HOME="$tmp/home"
rm -rf out checkpoints

etcd_port=$(port)
peer="http://127.0.0.1:$(port)"
etcd --name example --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "$peer" \
    --initial-advertise-peer-urls "$peer" --initial-cluster "example=$peer" > "$tmp/etcd.log" 2>&1 &
pids+=($!)
await "healthy etcd" curl -sf "http://127.0.0.1:$etcd_port/health" -o /dev/null
s3_port=$(port)
"$venv/bin/python" -m moto.server -H 127.0.0.1 -p "$s3_port" > "$tmp/s3.log" 2>&1 &
pids+=($!)
await "S3 server" curl -sf -X PUT "http://127.0.0.1:$s3_port/weir" -o /dev/null
export AWS_ACCESS_KEY_ID=example AWS_SECRET_ACCESS_KEY=example AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="http://127.0.0.1:$s3_port" AWS_ALLOW_HTTP=true

# The newest checkpoint the leader recorded in etcd (read through etcd's JSON gateway).
recorded() {
    curl -sf "http://127.0.0.1:$etcd_port/v3/kv/range" \
        -d "{\"key\": \"$(printf '/weir/example/checkpoint/wordcount-cluster' | base64)\"}" |
        python3 -c 'import sys, json, base64; kvs = json.load(sys.stdin).get("kvs", []); print(base64.b64decode(kvs[0]["value"]).decode() if kvs else "")'
}

a=127.0.0.1:$(port)
b=127.0.0.1:$(port)
coordinator() {
    "$weir" coordinator job.toml --listen "$1" --workers 3 --secret-file "$tmp/secret" \
        --etcd "http://127.0.0.1:$etcd_port" --cluster example --lease-ttl-secs 5 > "$tmp/$2.log" 2>&1 &
    pids+=($!)
}
coordinator "$a" c1
c1=${pids[-1]}
await "leader" grep -q "listening on" "$tmp/c1.log"
coordinator "$b" c2
c2=${pids[-1]}
await "standby" grep -q "standby" "$tmp/c2.log"
worker() {
    "$weir" worker --etcd "http://127.0.0.1:$etcd_port" --cluster example --name "$1" --slots 1 --secret-file "$tmp/secret" --dir "$tmp/$1" \
        2>> "$tmp/$1.log" &
    pids+=($!)
}
for w in w1 w2 w3; do worker "$w"; done
w3=${pids[-1]}

# A worker dies once a checkpoint is complete; a replacement joins.
has_checkpoint() { test -n "$(recorded)"; }
await "complete checkpoint" has_checkpoint
alive() { kill -0 "$c1" 2>/dev/null || { echo "cluster: the job ended before the kills" >&2; exit 1; }; }
alive
first=$(recorded)
kill -9 "$w3"
wait "$w3" 2>/dev/null || true
echo "cluster: killed worker w3 after ${first##*/}"
worker w3
# The leader dies once the restarted job has recorded a newer checkpoint.
newer_checkpoint() { test "$(recorded)" != "$first"; }
await "checkpoint after the restart" newer_checkpoint
alive
kill -9 "$c1"
wait "$c1" 2>/dev/null || true
echo "cluster: killed the leader after $(recorded | sed 's|.*/||')"
wait "$c2" || { echo "cluster: the standby failed:" >&2; cat "$tmp/c2.log" >&2; exit 1; }
grep -q "taking over from checkpoint" "$tmp/c2.log" || { echo "cluster: the standby did not take over:" >&2; cat "$tmp/c2.log" >&2; exit 1; }

if diff <(cat out/part-* | LC_ALL=C sort) <(LC_ALL=C sort expected/*) >/dev/null; then
    echo "cluster: out/ equals expected/ ($(cat out/part-* | wc -l) lines; a worker and the leader killed, the standby took over)"
else
    echo "cluster: out/ differs from expected/" >&2
    exit 1
fi
